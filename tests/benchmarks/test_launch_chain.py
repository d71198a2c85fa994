"""launch_chain.cu as a user builds and runs it: nvcc for sm_90 (wherever nvcc is), a bad
argument refused in one line before any CUDA call, and on a GPU one line per launch mode (the
persistent kernel's skipped, in words, where its blocks cannot all be resident)."""
import importlib.util
import subprocess

import pytest
import torch

from .test_bench_multi_rank import ROOT

_spec = importlib.util.spec_from_file_location("build_wheel", ROOT / "build_wheel.py")
_build_wheel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_build_wheel)
NVCC = _build_wheel.find_nvcc()  # where build_wheel.py looks for it
pytestmark = pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit)")
MODES = ["ordinary", "allowed at start", "counters", "allowed after wait", "never allowed", "one kernel"]


@pytest.fixture(scope="module")
def launch_chain(tmp_path_factory):
    exe = tmp_path_factory.mktemp("launch_chain") / "launch_chain"
    proc = subprocess.run([NVCC, "-O3", "-arch=sm_90", "-o", str(exe), str(ROOT / "benchmarks" / "launch_chain.cu")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return exe


def test_too_many_weight_loads_are_refused_in_one_line(launch_chain):
    proc = subprocess.run([str(launch_chain), "9", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == "weight loads a thread: 0 to 8\n"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("loads, smem_kb, persistent_fits", [(0, 0, True), (8, 200, False)])
def test_one_line_per_mode(launch_chain, loads, smem_kb, persistent_fits):
    # 200 KB a block: one block an SM, fewer slots than the chain's 256 blocks.
    proc = subprocess.run([str(launch_chain), str(loads), str(smem_kb)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(MODES)
    for line, mode in zip(lines, MODES):
        assert f"shared memory {smem_kb:3d} KB a block, {mode:<18}" in line
        if mode != "one kernel" or persistent_fits:
            assert line.endswith("us a kernel") and float(line.split()[-4]) > 0
        else:
            assert line.endswith("skipped: 256 blocks do not fit at once")
