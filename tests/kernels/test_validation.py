"""Bad arguments raise Python exceptions naming the tensors, in Python and in the compiled module.

Runs on the CPU: the C++ checks come before any CUDA call, so fake device numbers and pointers
are never dereferenced.
"""
import pytest
import torch

from tensorrt_llm import kernels
from tensorrt_llm.kernels import checks
from tensorrt_llm.kernels._bindings import tensor_arg
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


# ---- Python-side checks ----

def test_python_rms_norm_errors():
    x = torch.randn(4, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"rms_norm: weight has shape \[9\] but x has shape \[4, 8\]"):
        kernels.rms_norm(x, torch.ones(9, dtype=torch.float16))
    with pytest.raises(TypeError, match="rms_norm: weight is float32 but x is float16"):
        kernels.rms_norm(x, torch.ones(8))
    with pytest.raises(ValueError, match=r"rms_norm: residual has shape \[4, 7\]"):
        kernels.rms_norm(x, torch.ones(8, dtype=torch.float16), 1e-6, torch.ones(4, 7, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"rms_norm: x must be one of \{float32, float16, bfloat16\}, got int32"):
        kernels.rms_norm(torch.ones(2, 2, dtype=torch.int32), torch.ones(2, dtype=torch.int32))


def test_python_device_mismatch_is_named():
    x = torch.randn(4, 8)
    w = torch.ones(8, device="meta")
    with pytest.raises(ValueError, match=r"rms_norm: weight \(float32 \[8\] on meta\) and x \(float32 \[4, 8\] "
                                         r"on cpu\) are on different devices"):
        checks.rms_norm(x, w)


def test_python_rotary_errors():
    q, k = torch.randn(3, 2, 8), torch.randn(3, 1, 8)
    cache = kernels.rope_cos_sin_cache(10, 8)
    with pytest.raises(ValueError, match="token counts differ"):
        kernels.rotary_embedding_(q, torch.randn(4, 1, 8), torch.arange(3), cache)
    with pytest.raises(TypeError, match="positions must be one of {int32, int64}, got float32"):
        kernels.rotary_embedding_(q, k, torch.zeros(3), cache)
    with pytest.raises(ValueError, match=r"needs an even rotary_dim <= head_dim 8"):
        kernels.rotary_embedding_(q, k, torch.arange(3), kernels.rope_cos_sin_cache(10, 10))
    with pytest.raises(TypeError, match="cos_sin_cache must be one of {float32}, got float16"):
        kernels.rotary_embedding_(q, k, torch.arange(3), cache.half())
    with pytest.raises(ValueError, match="q must be contiguous in its last dimension"):
        kernels.rotary_embedding_(torch.randn(3, 8, 2).transpose(1, 2), k, torch.arange(3), cache)


def test_python_act_and_paged_errors():
    with pytest.raises(ValueError, match=r"silu_and_mul: x must be \[..., 2 \* intermediate\]"):
        kernels.silu_and_mul(torch.randn(2, 7))
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got 'erf'"):
        kernels.gelu_and_mul(torch.randn(2, 8), "erf")
    key = torch.randn(3, 2, 4)
    tables = torch.zeros(2, 1, dtype=torch.int32)
    cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    past = torch.zeros(2, dtype=torch.int32)
    cache = torch.zeros(4, 2, 2, 4, 4)
    with pytest.raises(ValueError, match=r"kv_cache \[4, 2, 3, 4, 4\] must be \[num_blocks, 2, 2"):
        kernels.paged_kv_write_(key, key, torch.zeros(4, 2, 3, 4, 4), tables, cu, past)
    with pytest.raises(TypeError, match="block_tables must be one of {int32}, got int64"):
        kernels.paged_kv_write_(key, key, cache, tables.long(), cu, past)
    with pytest.raises(ValueError, match=r"cu_seqlens has shape \[2\], expected \[3\]"):
        kernels.paged_kv_write_(key, key, cache, tables, cu[:2], past)
    with pytest.raises(TypeError, match="kv_cache is float16 but key is float32"):
        kernels.paged_kv_write_(key, key, cache.half(), tables, cu, past)


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
                         on(0, torch.zeros(3, dtype=torch.int32)), 0)
    with pytest.raises(ValueError, match="kv_cache must be contiguous"):
        b.paged_kv_write(on(0, key), on(0, key), on(0, torch.zeros(4, 4, 2, 2, 4).transpose(1, 3)),
                         on(0, tables), on(0, cu), on(0, past), 0)


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
