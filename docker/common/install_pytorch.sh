#!/usr/bin/env bash
# PyTorch, into the venv.
#
#   install_pytorch.sh [--install_type pypi|skip|/path/to/torch-*.whl] [--version V] [--venv DIR]
#
# pypi (default): torch==V from the Python package index, the CUDA build on Linux x86_64
#   (about 5.6 GB with its nvidia-* libraries): what a GPU user wants.
# skip: install nothing; a torch already in the base image (seen through the venv's
#   --system-site-packages) is used. With none, installing the tensorrt_llm wheel pulls
#   the index's newest torch as a dependency.
# a wheel file: install that wheel (e.g. a CPU build, about 0.7 GB installed, for CI and
#   machines without a GPU); its dependencies come from the index.
set -euo pipefail

INSTALL_TYPE=pypi
TORCH_VERSION=2.15.0
VENV=/opt/venv

while [[ $# -gt 0 ]]; do
    case "$1" in
        --install_type) INSTALL_TYPE="$2"; shift 2 ;;
        --version) TORCH_VERSION="$2"; shift 2 ;;
        --venv) VENV="$2"; shift 2 ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install_pytorch.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

PY="$VENV/bin/python"
case "$INSTALL_TYPE" in
    skip)
        if "$PY" -c 'import torch' 2>/dev/null; then
            echo "install_pytorch.sh: skip: using torch $("$PY" -c 'import torch; print(torch.__version__)') from the base image"
        else
            echo "install_pytorch.sh: skip: no torch in the base image; installing the tensorrt_llm" \
                 "wheel will pull one from the index"
        fi
        exit 0
        ;;
    pypi)
        "$PY" -m pip install --no-cache-dir "torch==${TORCH_VERSION}"
        ;;
    *.whl)
        if [[ ! -f "$INSTALL_TYPE" ]]; then
            echo "install_pytorch.sh: $INSTALL_TYPE does not exist" >&2
            exit 1
        fi
        "$PY" -m pip install --no-cache-dir "$INSTALL_TYPE"
        ;;
    *)
        echo "install_pytorch.sh: --install_type must be pypi, skip or a .whl file, got '$INSTALL_TYPE'" >&2
        exit 2
        ;;
esac
rm -rf /root/.cache /tmp/pip-*
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
