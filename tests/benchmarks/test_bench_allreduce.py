"""bench_allreduce.py as a user runs it: two ranks over gloo on the CPU (the sum is checked by
the script itself before timing), a bad --rows refused in one line; on two GPUs, NCCL inside a
CUDA graph."""
import json
import subprocess
import sys

import pytest
import torch

from .test_bench_multi_rank import ROOT, run


def test_two_cpu_ranks_time_the_engines_allreduce(tmp_path):
    out = tmp_path / "ar.json"
    proc = run("bench_allreduce.py", "--device", "cpu", "--dtype", "float32", "--hidden", "64", "--rows", "1,3",
               "--repeats", "2", "--json", str(out))
    result = json.loads(out.read_text())
    assert (result["tp_size"], result["hidden"]) == (2, 64)
    assert [r["rows"] for r in result["rows"]] == [1, 3]
    assert [r["bytes"] for r in result["rows"]] == [64 * 4, 3 * 64 * 4]
    assert all(r["us_per_call"] > 0 and r["us_per_8b_step"] == pytest.approx(64 * r["us_per_call"])
               for r in result["rows"])
    assert proc.stdout.count("allreduce over 2 ranks") == 1  # rank 0 alone prints


def test_bad_rows_are_refused_in_one_line():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_allreduce.py"), "--rows", "1,x"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--rows must be comma-separated integers" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_time_nccl_in_a_cuda_graph(tmp_path):
    out = tmp_path / "ar.json"
    proc = run("bench_allreduce.py", "--rows", "1,32", "--repeats", "3", "--json", str(out))
    assert "in a CUDA graph" in proc.stdout
    assert len(json.loads(out.read_text())["rows"]) == 2
