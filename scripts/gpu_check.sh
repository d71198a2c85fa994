#!/usr/bin/env bash
# On a GPU machine (offline): build the module for this GPU, install this checkout editable,
# run the GPU kernel tests, and the attention and sampling tests again under compute-sanitizer's
# memcheck. Logs go to $OUT when it is set (else ./gpu_check_logs).
#
#   bash scripts/gpu_check.sh            # or: invoke gpu
#
# Needs: nvcc (and compute-sanitizer beside it), cmake, ninja (or make), pybind11, torch with CUDA,
# pytest. Nothing is downloaded: build_wheel.py runs CMake itself and pip runs with --no-index
# --no-build-isolation --no-deps.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
PYTHON="${PYTHON:-python3}"
LOGS="${OUT:-gpu_check_logs}"
mkdir -p "$LOGS"

{
  echo "== machine"; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv 2>&1
  "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
} 2>&1 | tee "$LOGS/machine.txt"

# The tests import the checkout (the module is copied into tensorrt_llm/); the editable install
# (-i) needs setuptools, which a bare Python 3.12 venv may lack: then it is left out.
INSTALL=""
"$PYTHON" -c "import setuptools" 2>/dev/null && INSTALL="-i"
echo "== build (-a native -s $INSTALL)"
# shellcheck disable=SC2086  # $INSTALL and $BUILD_ARGS are lists of flags
"$PYTHON" build_wheel.py -a native -s $INSTALL ${BUILD_ARGS:-} 2>&1 | tee "$LOGS/build.txt"
build_rc=${PIPESTATUS[0]}
if [ "$build_rc" -ne 0 ]; then
  echo "gpu_check: build failed (exit $build_rc); see $LOGS/build.txt"
  exit "$build_rc"
fi

echo "== GPU tests"
# shellcheck disable=SC2086  # $PYTEST_ARGS is a list of flags
"$PYTHON" -m pytest -m gpu tests/kernels -q -rfEs --junitxml="$LOGS/gpu_tests.xml" ${PYTEST_ARGS:-} 2>&1 \
  | tee "$LOGS/gpu_tests.txt"
test_rc=${PIPESTATUS[0]}

# Memory errors of the kernels with the most index arithmetic (paged attention, top-k/top-p
# sampling). PyTorch's caching allocator is off so that every tensor is an allocation of its own
# and an access past its end is caught; that rules out CUDA-graph capture (it would cudaMalloc
# inside the capture) and the host-sync test (cudaFree synchronises), so those are left out.
echo "== compute-sanitizer memcheck: attention and sampling tests"
SANITIZER="$(command -v compute-sanitizer || echo "$(dirname "$(command -v nvcc)")/compute-sanitizer")"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SANITIZER" --tool memcheck --error-exitcode 86 \
  "$PYTHON" -m pytest -m gpu tests/kernels/test_decode_attention.py tests/kernels/test_sampling_kernel.py \
  -k "not graph and not host_syncs" -q -rfEs 2>&1 | tee "$LOGS/memcheck.txt"
memcheck_rc=${PIPESTATUS[0]}

echo "== CPU kernel tests against the same build"
"$PYTHON" -m pytest tests/kernels -q -m "not gpu" 2>&1 | tee "$LOGS/cpu_tests.txt"
cpu_rc=${PIPESTATUS[0]}

echo "gpu_check: gpu tests exit $test_rc, memcheck exit $memcheck_rc, cpu kernel tests exit $cpu_rc; logs in $LOGS"
[ "$test_rc" -eq 0 ] && [ "$memcheck_rc" -eq 0 ] && [ "$cpu_rc" -eq 0 ]
