"""The torch.library registration of the trtllm:: ops (CPU): schemas, fake kernels, dispatch."""
import pytest
import torch

from tensorrt_llm import kernels
from tensorrt_llm.ops.activation import silu_and_mul_reference
from tensorrt_llm.ops.norm import rms_norm_reference

from .utils import make_paged_metadata


def _samples():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 24, generator=g)
    w = torch.randn(24, generator=g)
    q = torch.randn(5, 3, 16, generator=g)
    k = torch.randn(5, 1, 16, generator=g)
    tables, cu, past = make_paged_metadata([2, 3], [1, 0], 4, 5, g)
    cache = torch.zeros(5, 2, 1, 4, 16)
    return {
        "rms_norm": (torch.ops.trtllm.rms_norm.default, (x, w, 1e-6)),
        "fused_add_rms_norm": (torch.ops.trtllm.fused_add_rms_norm.default, (x, x.clone(), w, 1e-6)),
        "rotary_embedding_": (torch.ops.trtllm.rotary_embedding_.default,
                              (q, k, torch.arange(5), kernels.rope_cos_sin_cache(8, 12), True)),
        "silu_and_mul": (torch.ops.trtllm.silu_and_mul.default, (x,)),
        "gelu_and_mul": (torch.ops.trtllm.gelu_and_mul.default, (x, "tanh")),
        "paged_kv_write_": (torch.ops.trtllm.paged_kv_write_.default,
                            (k, k.clone(), cache, tables, cu, past)),
    }


@pytest.mark.parametrize("name", list(_samples()))
def test_opcheck(name):
    op, args = _samples()[name]
    # schema (mutations declared), fake kernel vs real, autograd registration, AOT dispatch
    torch.library.opcheck(op, args)


def test_ops_on_meta_tensors_give_shapes():
    x = torch.empty(3, 7, 10, device="meta", dtype=torch.float16)
    assert kernels.silu_and_mul(x).shape == (3, 7, 5)
    assert kernels.gelu_and_mul(x, "none").shape == (3, 7, 5)
    w = torch.empty(10, device="meta", dtype=torch.float16)
    out, summed = kernels.rms_norm(x, w, 1e-5, residual=x)
    assert out.shape == summed.shape == x.shape and out.device.type == "meta"


def test_cpu_dispatch_is_the_reference():
    x = torch.randn(4, 6, dtype=torch.bfloat16)
    w = torch.randn(6, dtype=torch.bfloat16)
    assert torch.equal(torch.ops.trtllm.rms_norm(x, w, 1e-6), rms_norm_reference(x, w, eps=1e-6))
    assert torch.equal(torch.ops.trtllm.silu_and_mul(x), silu_and_mul_reference(x))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
def test_quantized_caches_are_refused_with_the_way_to_read_them(dtype):
    """The trtllm:: attention ops take float K/V; a cache of codes needs gpt_attention's scales."""
    _, (k, v, cache, tables, cu, past) = _samples()["paged_kv_write_"]
    codes = cache.to(dtype)
    with pytest.raises(TypeError, match="paged_kv_write_: kv_cache holds .* codes.*gpt_attention"):
        kernels.paged_kv_write_(k, v, codes, tables, cu, past)
    q = torch.randn(2, 3, 16)
    with pytest.raises(TypeError, match="decode_attention: kv_cache holds .* codes.*gpt_attention"):
        kernels.decode_attention(q, codes, tables, torch.tensor([2, 3], dtype=torch.int32), 0.25)
