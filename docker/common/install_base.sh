#!/usr/bin/env bash
# OS packages and the Python virtual environment every stage uses.
#
#   install_base.sh [--venv DIR] [--devel] [--pybind11_version V] [--setuptools_version V]
#
# Always: ca-certificates (plus /usr/local/share/ca-certificates/*.crt, e.g. the EXTRA_CA_CERT
# of docker/Makefile, trusted system-wide), Python 3 with venv, and a venv at --venv
# (default /opt/venv, created with --system-site-packages so a torch in the base image is seen).
# --devel adds what building the wheel needs: C/C++ compilers, Python headers, Ninja, git,
# and in the venv pybind11 and setuptools at pinned versions.
# Works on Debian and Ubuntu bases; apt lists and caches are removed before it exits.
set -euo pipefail

VENV=/opt/venv
DEVEL=0
PYBIND11_VERSION=3.1.0
SETUPTOOLS_VERSION=84.2.1

while [[ $# -gt 0 ]]; do
    case "$1" in
        --venv) VENV="$2"; shift 2 ;;
        --devel) DEVEL=1; shift ;;
        --pybind11_version) PYBIND11_VERSION="$2"; shift 2 ;;
        --setuptools_version) SETUPTOOLS_VERSION="$2"; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install_base.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

if ! command -v apt-get >/dev/null; then
    echo "install_base.sh: needs a Debian or Ubuntu base image (no apt-get)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive

packages=(ca-certificates python3 python3-venv python3-pip libgomp1 procps)
if [[ "$DEVEL" == 1 ]]; then
    packages+=(build-essential python3-dev ninja-build git pkg-config)
fi

apt-get update
apt-get install -y --no-install-recommends "${packages[@]}"

# Extra CA bundle (Makefile's EXTRA_CA_CERT): update-ca-certificates adds it to
# /etc/ssl/certs/ca-certificates.crt, which PIP_CERT / SSL_CERT_FILE point at (Dockerfile).
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    for f in /usr/local/share/ca-certificates/*.crt; do
        [[ -s "$f" ]] || rm -f "$f"   # an empty placeholder: nothing to trust
    done
fi
update-ca-certificates

if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv --system-site-packages "$VENV"
fi
if [[ "$DEVEL" == 1 ]]; then
    "$VENV/bin/python" -m pip install --no-cache-dir \
        "pybind11==${PYBIND11_VERSION}" "setuptools==${SETUPTOOLS_VERSION}"
fi

apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /root/.cache /tmp/pip-*
"$VENV/bin/python" --version
