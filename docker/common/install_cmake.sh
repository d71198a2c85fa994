#!/usr/bin/env bash
# CMake (and Ninja) at pinned versions, from the Python package index's `cmake` and `ninja`
# wheels: the same binaries Kitware publishes, reachable wherever pip is (no GitHub download).
#
#   install_cmake.sh [--version V] [--ninja_version V] [--venv DIR]
#
# Installed into the venv (default /opt/venv, on PATH in every stage) and linked into
# /usr/local/bin so `cmake` works for any user and shell.
set -euo pipefail

CMAKE_VERSION=4.4.4
NINJA_VERSION=1.13.2
VENV=/opt/venv

while [[ $# -gt 0 ]]; do
    case "$1" in
        --version) CMAKE_VERSION="$2"; shift 2 ;;
        --ninja_version) NINJA_VERSION="$2"; shift 2 ;;
        --venv) VENV="$2"; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install_cmake.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "install_cmake.sh: no venv at $VENV (run install.sh --base first)" >&2
    exit 1
fi

"$VENV/bin/python" -m pip install --no-cache-dir "cmake==${CMAKE_VERSION}" "ninja==${NINJA_VERSION}"
for tool in cmake ctest cpack ninja; do
    ln -sf "$VENV/bin/$tool" "/usr/local/bin/$tool"
done
rm -rf /root/.cache /tmp/pip-*
cmake --version | head -n 1
echo "ninja $(ninja --version)"
