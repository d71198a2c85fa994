"""stage_x.cu as a user builds and runs it: nvcc for sm_90a, a bad argument refused in one line
before any CUDA call, and on a GPU one line per way of staging x, each after the check that the
chain of kernels carried x unchanged (a way that lost or garbled it exits 1 saying so)."""
import subprocess

import pytest
import torch

from .test_launch_chain import NVCC, ROOT

pytestmark = pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit)")
WAYS = ["plain loads, each warp", "one bulk copy a block", "multicast, cluster of 2", "multicast, cluster of 4"]


@pytest.fixture(scope="module")
def stage_x(tmp_path_factory):
    exe = tmp_path_factory.mktemp("stage_x") / "stage_x"
    proc = subprocess.run([NVCC, "-O3", "-gencode", "arch=compute_90a,code=sm_90a", "-o", str(exe),
                           str(ROOT / "benchmarks" / "stage_x.cu")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return exe


@pytest.mark.parametrize("args", [["100", "4", "10"], ["4096", "6", "70"], ["16448", "4", "100"], ["4096", "4", "4"]])
def test_bad_arguments_are_refused_in_one_line(stage_x, args):
    proc = subprocess.run([str(stage_x), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stdout == ("k: a multiple of 64 up to 16384; blocks: a multiple of 4; "
                           "shared memory: x's 2k bytes to 200 KB\n")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs a Hopper GPU (sm_90a)")
@pytest.mark.parametrize("k, blocks, smem_kb", [(4096, 396, 70), (14336, 256, 100)])
def test_one_line_per_way(stage_x, k, blocks, smem_kb):
    proc = subprocess.run([str(stage_x), str(k), str(blocks), str(smem_kb)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(WAYS)
    for line, way in zip(lines, WAYS):
        assert line.startswith(f"k {k:5d}, {blocks:3d} blocks, shared memory {smem_kb:3d} KB a block, {way:<24}")
        assert line.endswith("us a kernel") and float(line.split()[-4]) > 0
