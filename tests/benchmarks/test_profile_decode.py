"""profile_decode.py as a user runs it: a bad --kv_cache_dtype is refused in one line (CPU); on a
GPU, with the KV cache in FP8 codes, it prints the replayed graph, its kernels and the eager
step's kernel table."""
import subprocess
import sys

import pytest
import torch

from .test_bench_multi_rank import ROOT, run


def test_bad_kv_cache_dtype_is_refused_in_one_line():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_decode.py"), "--kv_cache_dtype", "fp4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "'fp4'" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_dtype_spellings():
    """--dtype takes bf16 / fp16 / fp32 as bench_generation.py does (it was passed on as is, and
    the model config refused 'bf16' with a traceback); anything else in one line."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_decode.py"), "--dtype", "bf17"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "invalid choice: 'bf17'" in proc.stderr and "Traceback" not in proc.stderr
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_generation import dtype_arg
    assert [dtype_arg(s) for s in ("bf16", "fp16", "fp32", "bfloat16")] == ["bfloat16", "float16", "float32",
                                                                            "bfloat16"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp8_kv_cache_step_is_profiled():
    proc = run("profile_decode.py", "--model", "smollm2-135m", "--dtype", "bf16", "--kv_cache_dtype", "fp8",
               "--batch", "4", "--input_len", "48", "--steps", "8", timeout=600)
    out = proc.stdout
    assert "graph replay" in out and "step without graphs" in out
    # whole steps against their graph: with 8 steps there are steady steps between the first and last
    assert "decode step with graphs (" in out and "GPU work outside the graph" in out
    assert "GPU time of one decode step (eager, 4 rows)" in out
    assert "decode_attention" in out.lower() or "decodeattention" in out.lower()
