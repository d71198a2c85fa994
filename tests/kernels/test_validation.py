"""Bad arguments of a kernel raise Python exceptions naming the tensors, in the compiled module
(each binding entry's argument spec, checked before any launch). On the Python side an op's
arguments are checked once, by its shape rule (tests/test_functional.py).

Runs on the CPU: the C++ checks come before any CUDA call, so fake device numbers and pointers
are never dereferenced.
"""
import pytest
import torch

from tensorrt_llm import kernels
from tensorrt_llm.ops.launch import tensor_arg
from tensorrt_llm.version import __version__


@pytest.fixture(scope="module")
def b():
    """The compiled module; these tests fail (not skip) when it is missing."""
    if not kernels.bindings_available():
        pytest.fail("tensorrt_llm.bindings is not built: run `python build_wheel.py` (or `make wheel`) first")
    return kernels.get_bindings()


def on(device: int, t: torch.Tensor) -> tuple:
    """t's argument tuple, claiming it lives on CUDA device `device` (never dereferenced here)."""
    return tensor_arg(t)[:4] + (device,)


# ---- C++ checks in the compiled module ----

def test_binding_rms_norm_errors(b):
    x = torch.randn(5, 8, dtype=torch.float16)
    w = torch.randn(8, dtype=torch.float16)
    out = torch.empty_like(x)
    with pytest.raises(ValueError, match=r"^rms_norm: weight must have shape \[8\], got \[7\]$"):
        b.rms_norm(on(0, out), on(0, x), on(0, w[:7]), 1e-6, 0)
    with pytest.raises(TypeError, match=r"^rms_norm: weight is float32 but x is float16$"):
        b.rms_norm(on(0, out), on(0, x), on(0, w.float()), 1e-6, 0)
    with pytest.raises(ValueError, match=r"rms_norm: out \(float16 \[5, 8\] on cpu\) must be a CUDA tensor"):
        b.rms_norm(tensor_arg(out), tensor_arg(x), tensor_arg(w), 1e-6, 0)
    with pytest.raises(ValueError, match=r"weight \(float16 \[8\] on cuda:1\) and out \(float16 \[5, 8\] on "
                                         r"cuda:0\) are on different devices"):
        b.rms_norm(on(0, out), on(0, x), on(1, w), 1e-6, 0)
    with pytest.raises(TypeError, match="weight must be a tuple"):
        b.rms_norm(on(0, out), on(0, x), (1, 2, 3), 1e-6, 0)
    with pytest.raises(ValueError, match="residual and residual_out must be given together"):
        b.rms_norm(on(0, out), on(0, x), on(0, w), 1e-6, 0, on(0, x))
    with pytest.raises(ValueError, match="eps must be finite"):
        b.rms_norm(on(0, out), on(0, x), on(0, w), float("nan"), 0)
    overlapping = (out.data_ptr(), b.DTYPES["float16"], (5, 8), (0, 1), 0)  # every row the same memory
    with pytest.raises(ValueError, match="out has overlapping elements"):
        b.rms_norm(overlapping, on(0, x), on(0, w), 1e-6, 0)
    with pytest.raises(ValueError, match="negative stride"):
        b.rms_norm((out.data_ptr(), 1, (5, 8), (-8, 1), 0), on(0, x), on(0, w), 1e-6, 0)
    with pytest.raises(ValueError, match="null data pointer"):
        b.rms_norm((0, 1, (5, 8), (8, 1), 0), on(0, x), on(0, w), 1e-6, 0)
    with pytest.raises(TypeError, match="unknown dtype code 9"):
        b.rms_norm((out.data_ptr(), 9, (5, 8), (8, 1), 0), on(0, x), on(0, w), 1e-6, 0)


def test_binding_norm_and_activation_codes_errors(b):
    """rms_norm_fp8 / silu_and_mul_fp8 (the kernels writing an FP8 linear's input codes): the
    codes' words, the static scale, the width in whole words."""
    x = torch.randn(5, 8, dtype=torch.bfloat16)
    w = torch.randn(8, dtype=torch.bfloat16)
    codes = torch.empty(5, 2, dtype=torch.int32)
    scale = torch.ones(1)
    with pytest.raises(ValueError, match=r"^rms_norm_fp8: codes must have shape \[5, 2\], got \[5, 1\]$"):
        b.rms_norm_fp8(on(0, torch.empty(5, 1, dtype=torch.int32)), on(0, x), on(0, w), on(0, scale), 1e-6, 0)
    with pytest.raises(ValueError, match=r"^rms_norm_fp8: input_scale must have shape \[1\], got \[2\]$"):
        b.rms_norm_fp8(on(0, codes), on(0, x), on(0, w), on(0, torch.ones(2)), 1e-6, 0)
    with pytest.raises(TypeError, match=r"^rms_norm_fp8: codes must be one of \{int32\}, got float32$"):
        b.rms_norm_fp8(on(0, codes.float()), on(0, x), on(0, w), on(0, scale), 1e-6, 0)
    with pytest.raises(ValueError, match=r"^rms_norm_fp8: the output width 6 must be a multiple of 4$"):
        b.rms_norm_fp8(on(0, codes), on(0, x[:, :6]), on(0, w[:6]), on(0, scale), 1e-6, 0)
    with pytest.raises(ValueError, match="residual and residual_out must be given together"):
        b.rms_norm_fp8(on(0, codes), on(0, x), on(0, w), on(0, scale), 1e-6, 0, on(0, x))
    gate_up = torch.randn(5, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^silu_and_mul_fp8: codes must have shape \[5, 2\], got \[5, 1\]$"):
        b.silu_and_mul_fp8(on(0, torch.empty(5, 1, dtype=torch.int32)), on(0, gate_up), on(0, scale), 0)
    with pytest.raises(ValueError, match=r"^silu_and_mul_fp8: the last dimension of x \[5, 15\] must be even$"):
        b.silu_and_mul_fp8(on(0, codes), on(0, gate_up[:, :15]), on(0, scale), 0)
    with pytest.raises(ValueError, match=r"^silu_and_mul_fp8: the output width 6 must be a multiple of 4$"):
        b.silu_and_mul_fp8(on(0, codes), on(0, gate_up[:, :12]), on(0, scale), 0)


def test_binding_decode_attention_codes_errors(b):
    """decode_attention_fp8 (the attention writing an FP8 linear's input codes): the codes' words
    [B, H * D / 4], the static scale."""
    q = torch.randn(2, 4, 64, dtype=torch.bfloat16)
    cache = torch.randn(6, 2, 2, 16, 64, dtype=torch.bfloat16)
    tables = torch.zeros(2, 3, dtype=torch.int32)
    lengths = torch.ones(2, dtype=torch.int32)

    def call(codes, scale):
        b.decode_attention_fp8(on(0, codes), on(0, q), on(0, cache), on(0, tables), on(0, lengths), None, None, None,
                               1, 48, 0.125, 0, None, None, None, True, None, False, on(0, scale), 0)
    with pytest.raises(ValueError, match=r"^decode_attention_fp8: codes must have shape \[2, 64\], got \[2, 32\]$"):
        call(torch.empty(2, 32, dtype=torch.int32), torch.ones(1))
    with pytest.raises(ValueError, match=r"^decode_attention_fp8: input_scale must have shape \[1\], got \[2\]$"):
        call(torch.empty(2, 64, dtype=torch.int32), torch.ones(2))
    with pytest.raises(TypeError, match=r"^decode_attention_fp8: codes must be one of \{int32\}, got uint8$"):
        call(torch.empty(2, 256, dtype=torch.uint8), torch.ones(1))
    with pytest.raises(ValueError, match="decode_attention_fp8: .*must have batch"):
        b.decode_attention_fp8(on(0, torch.empty(2, 64, dtype=torch.int32)), on(0, q), on(0, cache),
                               on(0, tables[:1]), on(0, lengths), None, None, None, 1, 48, 0.125, 0, None, None, None,
                               True, None, False, on(0, torch.ones(1)), 0)


def test_binding_other_kernels_errors(b):
    q, k = torch.randn(3, 2, 8), torch.randn(3, 1, 8)
    cache = torch.ones(10, 8)
    with pytest.raises(ValueError, match=r"rotary_embedding: token counts differ: q \[3, 2, 8\], k \[4, 1, 8\]"):
        b.rotary_embedding(on(0, q), on(0, torch.randn(4, 1, 8)), on(0, torch.arange(3)), on(0, cache), True, 0)
    with pytest.raises(ValueError, match="rotary_embedding: cos_sin_cache .* needs an even rotary_dim"):
        b.rotary_embedding(on(0, q), on(0, k), on(0, torch.arange(3)), on(0, torch.ones(10, 7)), True, 0)
    with pytest.raises(TypeError, match="positions must be one of {int32, int64}, got float32"):
        b.rotary_embedding(on(0, q), on(0, k), on(0, torch.ones(3)), on(0, cache), True, 0)
    x = torch.randn(4, 10)
    with pytest.raises(ValueError, match=r"silu_and_mul: out must have shape \[4, 5\], got \[4, 6\]"):
        b.silu_and_mul(on(0, torch.empty(4, 6)), on(0, x), 0)
    with pytest.raises(ValueError, match="gelu_and_mul: approximate must be 'none' or 'tanh', got 'fast'"):
        b.gelu_and_mul(on(0, torch.empty(4, 5)), on(0, x), "fast", 0)
    key = torch.randn(3, 2, 4)
    tables = torch.zeros(2, 1, dtype=torch.int32)
    cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    past = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"paged_kv_write: past_lengths must have shape \[2\], got \[3\]"):
        b.paged_kv_write(on(0, key), on(0, key), on(0, torch.zeros(4, 2, 2, 4, 4)), on(0, tables), on(0, cu),
                         on(0, torch.zeros(3, dtype=torch.int32)), None, 0)
    with pytest.raises(ValueError, match="kv_cache must be contiguous"):
        b.paged_kv_write(on(0, key), on(0, key), on(0, torch.zeros(4, 4, 2, 2, 4).transpose(1, 3)),
                         on(0, tables), on(0, cu), on(0, past), None, 0)


def test_binding_refuses_without_a_usable_gpu(b):
    """Valid arguments on a machine with no GPU (or a CPU-only build): RuntimeError, no crash."""
    if torch.cuda.is_available() and b.cuda_kernels_compiled:
        pytest.skip("a GPU is usable here; tests/kernels/test_kernels_gpu.py covers the launches")
    x = torch.randn(5, 8)
    w = torch.randn(8)
    with pytest.raises(RuntimeError, match="rms_norm: .*(CUDA|built without CUDA kernels)"):
        b.rms_norm(on(0, torch.empty_like(x)), on(0, x), on(0, w), 1e-6, 0)


def test_build_info(b):
    info = b.build_info()
    assert info["version"] == __version__ == b.__version__
    assert len(info["git_commit"]) >= 7
    assert info["cuda"] is b.cuda_kernels_compiled
    if info["cuda"]:
        assert info["cuda_version"].split(".")[0].isdigit()
        assert info["cuda_architectures"], "a CUDA build must list its architectures"
        assert all(a.startswith(("sm_", "compute_")) for a in info["cuda_architectures"])
    else:
        assert info["cuda_version"] is None and info["cuda_architectures"] == []
    assert kernels.build_info() == info
