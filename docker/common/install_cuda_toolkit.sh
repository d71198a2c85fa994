#!/usr/bin/env bash
# The CUDA compiler, only where the base image has none (e.g. the Debian base of
# `make base_local_build`); an official CUDA devel image already has nvcc and this is a no-op.
#
#   install_cuda_toolkit.sh [--version V] [--cccl_version V] [--prefix DIR] [--force]
#
# Installs the Python package index's nvidia-cuda-nvcc, -runtime, -crt and nvidia-nvvm wheels
# (version V, default below) and nvidia-cuda-cccl into --prefix (default /opt/cuda-wheels) with
# `pip install --target`, then makes /usr/local/cuda a link to their CUDA tree
# (nvidia/cu13: bin/nvcc, nvvm/, include/, lib/) so nvcc, CMake's FindCUDAToolkit and
# build_wheel.py find it where a CUDA toolkit normally lives. The runtime wheel ships
# libcudart_static.a (what tensorrt_llm.bindings links) and libcudart.so.13 only: the
# unversioned libcudart.so that FindCUDAToolkit requires is added as a link.
set -euo pipefail

CUDA_VERSION=13.5.37
CCCL_VERSION=13.3.5.0.6
PREFIX=/opt/cuda-wheels
FORCE=0
PYTHON=/opt/venv/bin/python

while [[ $# -gt 0 ]]; do
    case "$1" in
        --version) CUDA_VERSION="$2"; shift 2 ;;
        --cccl_version) CCCL_VERSION="$2"; shift 2 ;;
        --prefix) PREFIX="$2"; shift 2 ;;
        --python) PYTHON="$2"; shift 2 ;;
        --force) FORCE=1; shift ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install_cuda_toolkit.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

existing=""
for candidate in "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then
        existing="$candidate"
        break
    fi
done
if [[ -n "$existing" && "$FORCE" == 0 ]]; then
    echo "install_cuda_toolkit.sh: the base image already has nvcc ($existing): skipping"
    "$existing" --version | tail -n 2
    exit 0
fi

major="${CUDA_VERSION%%.*}"
"$PYTHON" -m pip install --no-cache-dir --no-deps --target "$PREFIX" \
    "nvidia-cuda-nvcc==${CUDA_VERSION}" "nvidia-cuda-runtime==${CUDA_VERSION}" \
    "nvidia-cuda-crt==${CUDA_VERSION}" "nvidia-nvvm==${CUDA_VERSION}" \
    "nvidia-cuda-cccl==${CCCL_VERSION}"

root="$PREFIX/nvidia/cu${major}"
if [[ ! -x "$root/bin/nvcc" ]]; then
    echo "install_cuda_toolkit.sh: $root/bin/nvcc is missing after the install" >&2
    exit 1
fi
if [[ ! -e "$root/lib/libcudart.so" ]]; then
    ln -s "libcudart.so.${major}" "$root/lib/libcudart.so"
fi
for lib in libcudart_static.a libcudadevrt.a; do
    if [[ ! -f "$root/lib/$lib" ]]; then
        echo "install_cuda_toolkit.sh: $root/lib/$lib is missing (needed to link the kernels)" >&2
        exit 1
    fi
done

rm -rf /root/.cache /tmp/pip-*
rm -rf /usr/local/cuda
ln -s "$root" /usr/local/cuda
ln -sf /usr/local/cuda/bin/nvcc /usr/local/bin/nvcc
nvcc --version | tail -n 2
