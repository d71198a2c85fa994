"""profile_prompt.py as a user runs it: on a GPU, for a small random model in bf16 and FP8, the
wall / GPU times of a prompt's first token, the host phases of the call (the plan starts after
the call does, is enqueued before it returns, and its GPU time is within the call's wall time)
and the kernel table."""
import re

import pytest
import torch

from .test_bench_multi_rank import run


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_prompt_is_profiled_with_its_host_phases():
    proc = run("profile_prompt.py", "--model", "smollm2-135m", "--quant", "none,fp8", "--prompt_len", "256",
               "--repeats", "2", timeout=600)
    out = proc.stdout
    for quant in ("none", "fp8"):
        assert f"smollm2-135m {quant}, a 256-token prompt's first token: wall" in out
    phases = re.findall(r"plan start ([\d.]+), plan enqueued ([\d.]+), plan on the GPU ([\d.]+), returned ([\d.]+)",
                        out)
    assert len(phases) == 2, out
    for start, enqueued, gpu, returned in ((float(v) for v in p) for p in phases):
        assert 0 < start < enqueued < returned and 0 < gpu < returned
    assert "kernels, first to last" in out
