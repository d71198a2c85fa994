"""The CPU implementation of the trtllm:: ops (the op references, and the oracles of kernels.reference)
against independent formulas."""
import math

import pytest
import torch

from tensorrt_llm import kernels
from tensorrt_llm.ops.norm import rms_norm_reference

from .utils import DTYPES, assert_close, make_paged_metadata


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---- rms_norm ----

@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_row_by_row_formula(dtype):
    g = _gen(1)
    x = torch.randn(7, 33, generator=g).to(dtype)
    w = torch.randn(33, generator=g).to(dtype)
    eps = 1e-5
    expected = torch.empty(7, 33, dtype=torch.float64)
    for r in range(7):
        row = [float(v) for v in x[r].double()]
        inv = 1.0 / math.sqrt(sum(v * v for v in row) / len(row) + eps)
        for c in range(33):
            expected[r, c] = row[c] * inv * float(w[c])
    out = kernels.rms_norm(x, w, eps)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close(out, expected.to(dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_returns_norm_of_rounded_sum(dtype):
    g = _gen(2)
    x = torch.randn(3, 5, 40, generator=g).to(dtype)
    res = torch.randn(3, 5, 40, generator=g).to(dtype)
    w = torch.rand(40, generator=g).to(dtype)
    out, summed = kernels.rms_norm(x, w, 1e-6, residual=res)
    assert torch.equal(summed, x + res)
    assert torch.equal(out, rms_norm_reference(x + res, w, eps=1e-6))


# ---- rotary ----

def test_cos_sin_cache_rows():
    cache = kernels.rope_cos_sin_cache(50, 16, 10000.0)
    assert cache.dtype == torch.float32 and cache.shape == (50, 16)
    for p in (0, 1, 17, 49):
        for j in range(8):
            angle = p * 10000.0 ** (-2 * j / 16)
            assert cache[p, j].item() == pytest.approx(math.cos(angle), abs=1e-6)
            assert cache[p, 8 + j].item() == pytest.approx(math.sin(angle), abs=1e-6)


def _rope_complex(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float, is_neox: bool):
    """Rotary embedding as complex multiplication: pair j is a complex number times e^(i p theta_j)."""
    half = rotary_dim // 2
    xd = x.double()
    if is_neox:
        z = torch.complex(xd[..., :half], xd[..., half:rotary_dim])
    else:
        z = torch.view_as_complex(xd[..., :rotary_dim].reshape(*x.shape[:-1], half, 2).contiguous())
    freqs = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / rotary_dim)
    phase = torch.polar(torch.ones(len(positions), half, dtype=torch.float64),
                        positions.double()[:, None] * freqs[None, :])
    z = z * phase[:, None, :]
    out = xd.clone()
    if is_neox:
        out[..., :half], out[..., half:rotary_dim] = z.real, z.imag
    else:
        out[..., :rotary_dim] = torch.view_as_real(z).reshape(*x.shape[:-1], rotary_dim)
    return out


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("head_dim,rotary_dim", [(16, 16), (20, 8)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_matches_complex_formulation(is_neox, head_dim, rotary_dim, dtype):
    g = _gen(3)
    theta = 500000.0 if is_neox else 10000.0
    T, Hq, KV = 9, 3, 2
    q = torch.randn(T, Hq, head_dim, generator=g).to(dtype)
    k = torch.randn(T, KV, head_dim, generator=g).to(dtype)
    positions = torch.randint(0, 100, (T,), generator=g, dtype=torch.int64)
    cache = kernels.rope_cos_sin_cache(100, rotary_dim, theta)
    q_expected = _rope_complex(q, positions, rotary_dim, theta, is_neox)
    k_expected = _rope_complex(k, positions, rotary_dim, theta, is_neox)
    q0, k0 = q.clone(), k.clone()
    kernels.rotary_embedding_(q, k, positions.to(torch.int32), cache, is_neox)
    assert_close(q, q_expected.to(dtype), dtype)
    assert_close(k, k_expected.to(dtype), dtype)
    assert torch.equal(q[..., rotary_dim:], q0[..., rotary_dim:])  # pass-through dims untouched
    assert torch.equal(k[..., rotary_dim:], k0[..., rotary_dim:])


def test_rotary_in_place_on_packed_qkv_views():
    g = _gen(4)
    T, Hq, KV, D = 5, 4, 2, 8
    qkv = torch.randn(T, (Hq + 2 * KV) * D, generator=g)
    original = qkv.clone()
    q = qkv[:, :Hq * D].view(T, Hq, D)
    k = qkv[:, Hq * D:(Hq + KV) * D].view(T, KV, D)
    assert q.stride(0) > Hq * D  # a real strided view
    positions = torch.arange(T)
    cache = kernels.rope_cos_sin_cache(16, D)
    kernels.rotary_embedding_(q, k, positions, cache, True)
    q_expected = _rope_complex(original[:, :Hq * D].view(T, Hq, D), positions, D, 10000.0, True).float()
    k_expected = _rope_complex(original[:, Hq * D:(Hq + KV) * D].view(T, KV, D), positions, D, 10000.0, True)
    assert_close(qkv[:, :Hq * D].view(T, Hq, D), q_expected)
    assert_close(qkv[:, Hq * D:(Hq + KV) * D].view(T, KV, D), k_expected.float())
    assert torch.equal(qkv[:, (Hq + KV) * D:], original[:, (Hq + KV) * D:])  # v untouched


def test_rotary_position_zero_is_identity():
    q = torch.randn(1, 2, 8)
    k = torch.randn(1, 1, 8)
    q0, k0 = q.clone(), k.clone()
    kernels.rotary_embedding_(q, k, torch.zeros(1, dtype=torch.int32), kernels.rope_cos_sin_cache(4, 8), False)
    assert torch.equal(q, q0) and torch.equal(k, k0)


def test_rotary_reference_rejects_out_of_range_positions():
    q, k = torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    with pytest.raises(ValueError, match=r"positions span \[0, 4\].*4 rows"):
        kernels.rotary_embedding_(q, k, torch.tensor([0, 4]), kernels.rope_cos_sin_cache(4, 8), True)


# ---- gated activations ----

@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_formula(dtype):
    x = torch.randn(2, 3, 2 * 11, generator=_gen(5)).to(dtype)
    out = kernels.silu_and_mul(x)
    assert out.shape == (2, 3, 11) and out.dtype == dtype
    xd = x.double()
    a, b = xd[..., :11], xd[..., 11:]
    expected = a / (1 + torch.exp(-a)) * b
    assert_close(out, expected.to(dtype), dtype)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_and_mul_formula(approximate, dtype):
    x = torch.randn(4, 2 * 13, generator=_gen(6)).to(dtype)
    out = kernels.gelu_and_mul(x, approximate)
    expected = torch.empty(4, 13, dtype=torch.float64)
    for r in range(4):
        for c in range(13):
            a, b = float(x[r, c]), float(x[r, 13 + c])
            if approximate == "none":
                gelu = 0.5 * a * (1 + math.erf(a / math.sqrt(2)))
            else:
                gelu = 0.5 * a * (1 + math.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))
            expected[r, c] = gelu * b
    assert_close(out, expected.to(dtype), dtype)


# ---- paged kv write ----

def _paged_write_loop(key, value, cache, tables, cu, past):
    tpb = cache.shape[3]
    for b in range(tables.shape[0]):
        for t in range(int(cu[b]), int(cu[b + 1])):
            p = int(past[b]) + t - int(cu[b])
            block = int(tables[b, p // tpb])
            for h in range(key.shape[1]):
                cache[block, 0, h, p % tpb, :] = key[t, h]
                cache[block, 1, h, p % tpb, :] = value[t, h]


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_kv_write_matches_python_loop(dtype):
    g = _gen(7)
    seq_new, past, tpb, num_blocks, KV, D = [5, 0, 1, 12], [3, 9, 0, 17], 4, 20, 3, 6
    tables, cu, past_t = make_paged_metadata(seq_new, past, tpb, num_blocks, g)
    T = sum(seq_new)
    key = torch.randn(T, KV, D, generator=g).to(dtype)
    value = torch.randn(T, KV, D, generator=g).to(dtype)
    cache = torch.randn(num_blocks, 2, KV, tpb, D, generator=g).to(dtype)
    expected = cache.clone()
    _paged_write_loop(key, value, expected, tables, cu, past_t)
    kernels.paged_kv_write_(key, value, cache, tables, cu, past_t)
    assert torch.equal(cache, expected)


def test_paged_kv_write_reference_rejects_bad_metadata():
    g = _gen(8)
    tables, cu, past = make_paged_metadata([3, 2], [0, 1], 4, 6, g)
    key = torch.randn(5, 1, 4)
    cache = torch.zeros(6, 2, 1, 4, 4)
    bad = tables.clone()
    bad[0, 0] = 6
    with pytest.raises(ValueError, match=r"block_tables\[0\] holds block ids .* outside \[0, 6\)"):
        kernels.paged_kv_write_(key, key, cache, bad, cu, past)
    with pytest.raises(ValueError, match="cu_seqlens"):
        kernels.paged_kv_write_(key, key, cache, tables, torch.tensor([0, 3, 4], dtype=torch.int32), past)
    with pytest.raises(ValueError, match="past its 1 blocks"):
        kernels.paged_kv_write_(key, key, cache, tables, cu, torch.tensor([2, 1], dtype=torch.int32))
    assert torch.count_nonzero(cache) == 0  # nothing written by the refused calls
