#!/usr/bin/env bash
# TensorRT, optional: this project's engines run on its own backend (PyTorch + its CUDA
# kernels) and never need TensorRT. It is installed only when a version is given, for users
# who want TensorRT beside it in the same image.
#
#   install_tensorrt.sh [--version V] [--cuda_major N] [--venv DIR]
#
# An empty --version (the default; Makefile's TRT_VERSION) skips this stage and says so.
# Otherwise installs the index's tensorrt-cu<N> wheel (N: --cuda_major, default 13) ==V into
# the venv and checks that it imports.
set -euo pipefail

TRT_VERSION=""
CUDA_MAJOR=13
VENV=/opt/venv

while [[ $# -gt 0 ]]; do
    case "$1" in
        --version) TRT_VERSION="$2"; shift 2 ;;
        --cuda_major) CUDA_MAJOR="$2"; shift 2 ;;
        --venv) VENV="$2"; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install_tensorrt.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

if [[ -z "$TRT_VERSION" ]]; then
    echo "install_tensorrt.sh: TRT_VERSION is empty: skipping the TensorRT stage" \
         "(tensorrt_llm does not need TensorRT; set TRT_VERSION=<version> to add it)"
    exit 0
fi

"$VENV/bin/python" -m pip install --no-cache-dir "tensorrt-cu${CUDA_MAJOR}==${TRT_VERSION}"
rm -rf /root/.cache /tmp/pip-*
"$VENV/bin/python" -c 'import tensorrt; print("TensorRT", tensorrt.__version__)'
