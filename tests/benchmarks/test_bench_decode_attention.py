"""bench_decode_attention.py as a user runs it: a bad --kv_cache_dtype or --cases is refused in
one line before any GPU work (CPU); on a GPU each (case, cache dtype) gets its row."""
import subprocess
import sys

import pytest
import torch

from .test_bench_multi_rank import ROOT, run


@pytest.mark.parametrize("args, named", [(["--kv_cache_dtype", "bf16,fp4"], "'fp4'"),
                                         (["--cases", "llama-8b b3 L7"], "'llama-8b b3 L7'")])
def test_bad_choices_are_refused_in_one_line(args, named):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_decode_attention.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert named in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_each_case_and_cache_dtype_gets_a_row():
    proc = run("bench_decode_attention.py", "--kv_cache_dtype", "bf16,fp8,int8", "--cases",
               "smollm2 b1 L150,llama-8b b1 L200", timeout=300)
    rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    assert [(r[0] + " " + r[1] + " " + r[2], r[3]) for r in rows] == [
        (case, kv) for case in ("smollm2 b1 L150", "llama-8b b1 L200") for kv in ("bf16", "fp8", "int8")]
    assert all(float(r[4]) > 0 and float(r[5]) > 0 for r in rows)
