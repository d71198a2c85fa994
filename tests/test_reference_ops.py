"""The reference ops against straightforward formulations: dense causal attention over
whole sequences, rotary embedding as complex multiplication, Hugging Face rope init."""
import math
import time

import pytest
import torch

from tensorrt_llm.functional import rope_cos_sin_cache, rope_inv_freq
from tensorrt_llm.ops import references

REFERENCES = references()
gpt_attention = REFERENCES["gpt_attention"]


def dense_attention(q, k, v, scale, slopes=None, window=None):
    """q [L, Hq, D], k/v [L, KV, D]: causal attention over the full sequence, float64."""
    length, num_heads, _ = q.shape
    group = num_heads // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("ihd,jhd->hij", q.double(), k) * scale
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    if slopes is not None:
        scores = scores + slopes.double()[:, None, None] * (j - i)
    visible = j <= i
    if window is not None:
        visible &= j > i - window
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hij,jhd->ihd", scores.softmax(-1), v)


class PagedRun:
    """Sequences of given total lengths fed through gpt_attention step by step, with their
    blocks scattered over the pool in shuffled order."""

    def __init__(self, lengths, num_heads, num_kv_heads, head_dim=16, tokens_per_block=4, num_layers=2,
                 layer_idx=1, dtype=torch.float32, slopes=None, window=None, seed=0, device="cpu"):
        g = torch.Generator().manual_seed(seed)
        self.lengths = lengths
        self.kw = dict(layer_idx=layer_idx, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                       tokens_per_block=tokens_per_block, sliding_window=window)
        self.q = [torch.randn(n, num_heads, head_dim, generator=g).to(dtype) for n in lengths]
        self.k = [torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype) for n in lengths]
        self.v = [torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype) for n in lengths]
        max_blocks = max(-(-n // tokens_per_block) for n in lengths) + 1  # a spare column
        num_blocks = len(lengths) * max_blocks + 3
        ids = torch.randperm(num_blocks, generator=g)
        self.block_tables = ids[:len(lengths) * max_blocks].view(len(lengths), max_blocks).int()
        # Unwritten slots hold NaN, as uninitialised memory may: they must never leak into results.
        self.pool = torch.full((num_layers, num_blocks, 2, num_kv_heads, tokens_per_block, head_dim), float("nan"),
                               dtype=dtype, device=device)
        self.block_tables = self.block_tables.to(device)
        self.device = device
        self.slopes = slopes
        self.done = [0] * len(lengths)

    def step(self, new_tokens):
        """Feed new_tokens[b] more tokens of each sequence; returns per-sequence outputs."""
        past = self.done
        cat = lambda xs: torch.cat([x[p:p + n] for x, p, n in zip(xs, past, new_tokens)]).flatten(1).to(self.device)
        host_ctx = torch.tensor(new_tokens, dtype=torch.int32)
        seq = torch.tensor([p + n for p, n in zip(past, new_tokens)], dtype=torch.int32)
        slopes = None if self.slopes is None else self.slopes.to(self.device)
        out = gpt_attention(cat(self.q), cat(self.k), cat(self.v), self.pool, self.block_tables, seq.to(self.device),
                            host_ctx.to(self.device), host_ctx, slopes, **self.kw)
        self.done = seq.tolist()
        return out.cpu().split(new_tokens)

    def expected(self, b, start, end):
        d = self.kw["head_dim"]
        ref = dense_attention(self.q[b], self.k[b], self.v[b], 1 / math.sqrt(d), self.slopes, self.kw["sliding_window"])
        return ref[start:end].flatten(1)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2), (4, 1)])
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("window", [None, 5])
def test_gpt_attention_context_then_decode(num_heads, num_kv_heads, alibi, window):
    lengths = [9, 3, 14]
    prompt = [6, 1, 11]
    slopes = torch.tensor([2 ** (-8 * (h + 1) / num_heads) for h in range(num_heads)]) if alibi else None
    run = PagedRun(lengths, num_heads, num_kv_heads, slopes=slopes, window=window)
    outs = run.step(prompt)
    for b, out in enumerate(outs):
        torch.testing.assert_close(out.double(), run.expected(b, 0, prompt[b]), atol=1e-5, rtol=1e-5)
    for step in range(2):  # decode: one token per sequence
        positions = list(run.done)
        outs = run.step([1] * len(lengths))
        for b, out in enumerate(outs):
            torch.testing.assert_close(out.double(), run.expected(b, positions[b], positions[b] + 1),
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lengths", [[13], [9, 9, 9]])
@pytest.mark.parametrize("window", [None, 6])
def test_gpt_attention_decode_equal_lengths(lengths, window):
    """Sequences of one length take a mask-free decode path; it must agree too."""
    run = PagedRun([n + 3 for n in lengths], num_heads=6, num_kv_heads=2, window=window)
    run.step(lengths)
    for _ in range(3):
        positions = list(run.done)
        outs = run.step([1] * len(lengths))
        for b, out in enumerate(outs):
            torch.testing.assert_close(out.double(), run.expected(b, positions[b], positions[b] + 1),
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("alibi,window", [(False, None), (True, 4)])
def test_gpt_attention_on_cuda(alibi, window):
    """On a GPU the op reads every block-table column and masks (no host syncs)."""
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]) if alibi else None
    run = PagedRun([10, 5, 9], num_heads=4, num_kv_heads=2, slopes=slopes, window=window, device="cuda")
    for new in ([6, 2, 7], [1, 1, 1], [1, 1, 1]):
        past = list(run.done)
        outs = run.step(new)
        for b, out in enumerate(outs):
            torch.testing.assert_close(out.double(), run.expected(b, past[b], past[b] + new[b]), atol=1e-5,
                                       rtol=1e-5)


def test_gpt_attention_chunked_context_and_mixed_batch():
    """Chunks of several tokens on top of a cached past, mixed with single-token steps."""
    run = PagedRun([12, 10], num_heads=4, num_kv_heads=2, window=None)
    plans = [[4, 3], [5, 1], [3, 6]]
    for new in plans:
        past = list(run.done)
        outs = run.step(new)
        for b, out in enumerate(outs):
            torch.testing.assert_close(out.double(), run.expected(b, past[b], past[b] + new[b]), atol=1e-5, rtol=1e-5)


def test_gpt_attention_writes_cache_through_block_table():
    run = PagedRun([7], num_heads=2, num_kv_heads=2, tokens_per_block=4)
    run.pool[0].normal_()
    other_layer = run.pool[0].clone()
    run.step([7])
    tpb = 4
    for p in range(7):
        block = run.block_tables[0, p // tpb]
        torch.testing.assert_close(run.pool[1, block, 0, :, p % tpb], run.k[0][p])
        torch.testing.assert_close(run.pool[1, block, 1, :, p % tpb], run.v[0][p])
    assert torch.equal(run.pool[0], other_layer)  # only kv_cache_pool[layer_idx] is written


def test_gpt_attention_scale_attr():
    run = PagedRun([5], num_heads=2, num_kv_heads=1)
    run.kw["scale"] = 0.3
    out = run.step([5])[0]
    ref = dense_attention(run.q[0], run.k[0], run.v[0], 0.3)
    torch.testing.assert_close(out.double(), ref.flatten(1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpt_attention_half_precision(dtype):
    run = PagedRun([6, 4], num_heads=4, num_kv_heads=2, dtype=dtype)
    outs = run.step([6, 4])
    assert outs[0].dtype == dtype
    for b, out in enumerate(outs):
        torch.testing.assert_close(out.double(), run.expected(b, 0, run.lengths[b]), atol=2e-2, rtol=2e-2)


def test_gpt_attention_decode_speed_smollm2_shape():
    """A SmolLM2-135M decode step's attention (30 layers, 9 heads, 3 KV heads, head_dim 64),
    one sequence 100 tokens in, costs a few ms of CPU. Timed as this thread's CPU time on one
    thread, so other processes on the machine do not make it flaky."""
    torch.manual_seed(0)
    layers, heads, kv_heads, d, tpb, max_blocks = 30, 9, 3, 64, 32, 64
    pool = torch.randn(layers, max_blocks, 2, kv_heads, tpb, d)
    tables = torch.randperm(max_blocks).int().view(1, max_blocks)
    seq = torch.tensor([101], dtype=torch.int32)
    ctx = torch.ones(1, dtype=torch.int32)
    q, k, v = torch.randn(1, heads * d), torch.randn(1, kv_heads * d), torch.randn(1, kv_heads * d)
    kw = dict(num_heads=heads, num_kv_heads=kv_heads, head_dim=d, tokens_per_block=tpb)

    def decode_step():
        t0 = time.thread_time()
        for layer in range(layers):
            gpt_attention(q, k, v, pool, tables, seq, ctx, ctx, layer_idx=layer, **kw)
        return time.thread_time() - t0

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        decode_step()
        best = min(decode_step() for _ in range(5))
    finally:
        torch.set_num_threads(threads)
    assert best < 0.010, f"attention of one decode step took {best * 1e3:.1f} ms of CPU"


# ---- rotary embedding -------------------------------------------------------------------


def rope_complex(x, positions, inv_freq, rotary_dim, is_neox):
    """x [T, H, D]: rotate pairs as complex numbers by exp(i * p * inv_freq)."""
    rot = x[..., :rotary_dim].double()
    half = rotary_dim // 2
    if is_neox:
        z = torch.complex(rot[..., :half], rot[..., half:])
    else:
        z = torch.complex(rot[..., 0::2], rot[..., 1::2])
    angles = positions.double()[:, None] * inv_freq.double()
    z = z * torch.polar(torch.ones((), dtype=torch.float64), angles)[:, None, :]
    out = torch.cat([z.real, z.imag], -1) if is_neox else torch.stack([z.real, z.imag], -1).flatten(-2)
    return torch.cat([out, x[..., rotary_dim:].double()], -1)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_rotary_embedding_matches_complex_rotation(is_neox, rotary_dim):
    torch.manual_seed(0)
    heads, d = 3, 16
    x = torch.randn(5, heads * d)
    positions = torch.tensor([0, 7, 3, 100, 2047], dtype=torch.int32)
    cache = rope_cos_sin_cache(2048, rotary_dim, theta=10000.0)
    out = REFERENCES["rotary_embedding"](x, positions, cache, num_heads=heads, head_dim=d, rotary_dim=rotary_dim,
                                            is_neox=is_neox)
    ref = rope_complex(x.view(5, heads, d), positions, rope_inv_freq(rotary_dim), rotary_dim, is_neox)
    torch.testing.assert_close(out.double(), ref.flatten(1), atol=1e-5, rtol=1e-5)


def test_rotary_embedding_on_strided_view_and_bf16():
    torch.manual_seed(0)
    qkv = torch.randn(4, 3 * 32).to(torch.bfloat16)
    q = qkv[:, :32]  # a view with row stride 96, like a split of a fused qkv
    positions = torch.arange(4, dtype=torch.int32)
    cache = rope_cos_sin_cache(16, 16)
    out = REFERENCES["rotary_embedding"](q, positions, cache, num_heads=2, head_dim=16, rotary_dim=16, is_neox=True)
    ref = rope_complex(q.view(4, 2, 16), positions, rope_inv_freq(16), 16, True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref.flatten(1), atol=2e-2, rtol=2e-2)


def test_rope_cache_layout_and_linear_scaling():
    cache = rope_cos_sin_cache(10, 8, theta=100.0, scaling={"type": "linear", "factor": 4.0})
    inv = 1.0 / (100.0 ** (torch.arange(0, 8, 2).double() / 8)) / 4.0
    angles = torch.arange(10).double()[:, None] * inv
    torch.testing.assert_close(cache.double(), torch.cat([angles.cos(), angles.sin()], -1), atol=1e-6, rtol=1e-6)
    assert cache.dtype == torch.float32 and cache.shape == (10, 8)


def _hf_llama3_inv_freq(head_dim, theta, params):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    config = transformers.LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim)
    full = {"rope_type": "llama3", "rope_theta": theta, **params}
    if hasattr(config, "rope_parameters"):
        config.rope_parameters = full
    else:
        config.rope_theta = theta
        config.rope_scaling = full
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    return inv_freq


def test_llama3_scaling_matches_transformers():
    params = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    ours = rope_inv_freq(64, 500000.0, {"type": "llama3", **params})
    theirs = _hf_llama3_inv_freq(64, 500000.0, params)
    torch.testing.assert_close(ours, theirs, atol=0, rtol=1e-6)
    plain = rope_inv_freq(64, 500000.0)
    assert (ours < plain).any() and (ours == plain).any()  # both scaled and untouched bands exist


def test_llama3_scaling_independent_formula():
    """Hand-written piecewise form of the Llama 3.1 rule."""
    params = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    ours = rope_inv_freq(128, 500000.0, params)
    for f, got in zip(rope_inv_freq(128, 500000.0).tolist(), ours.tolist()):
        wavelen = 2 * math.pi / f
        if wavelen < 8192 / 4:
            want = f
        elif wavelen > 8192 / 1:
            want = f / 8
        else:
            s = (8192 / wavelen - 1) / (4 - 1)
            want = (1 - s) * f / 8 + s * f
        assert got == pytest.approx(want, rel=1e-5)


# ---- the small ops ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_norms_compute_in_float32_and_return_input_dtype(dtype):
    torch.manual_seed(0)
    x = (torch.randn(3, 64) * 30).to(dtype)
    w = torch.randn(64).to(dtype)
    out = REFERENCES["rms_norm"](x, w, eps=1e-6)
    xf = x.double()
    ref = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    normed, total = REFERENCES["fused_add_rms_norm"](x, x, w, eps=1e-6)
    torch.testing.assert_close(total, x + x)
    torch.testing.assert_close(normed, REFERENCES["rms_norm"](x + x, w, eps=1e-6))
    sm = REFERENCES["softmax"](x, dim=-1)
    assert sm.dtype == dtype
    torch.testing.assert_close(sm.double(), xf.softmax(-1), atol=tol, rtol=tol)


def test_gated_activations():
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(REFERENCES["silu_and_mul"](x), torch.nn.functional.silu(x[..., :4]) * x[..., 4:])
    torch.testing.assert_close(REFERENCES["gelu_and_mul"](x, approximate="tanh"),
                               torch.nn.functional.gelu(x[..., :4], approximate="tanh") * x[..., 4:])


def test_allreduce_is_identity_without_process_group():
    x = torch.randn(3)
    assert REFERENCES["allreduce"](x) is x


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_norm_and_gated_activations_mean_what_transformers_computes(dtype):
    """The one meaning of rms_norm, fused_add_rms_norm, silu_and_mul and gelu_and_mul: transformers'
    order of rounding (LlamaRMSNorm: normalise in float32, round, scale; LlamaMLP: act(gate) * up
    in the dtype), bit for bit in half precision."""
    pytest.importorskip("transformers")
    from transformers.activations import ACT2FN
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 96, generator=gen) * 3).to(dtype)
    residual = torch.randn(5, 96, generator=gen).to(dtype)
    hf_norm = LlamaRMSNorm(96, eps=1e-5).to(dtype)
    with torch.no_grad():
        hf_norm.weight.copy_(1 + 0.1 * torch.randn(96, generator=gen))
        w = hf_norm.weight.detach()
        assert torch.equal(REFERENCES["rms_norm"](x, w, eps=1e-5), hf_norm(x))
        normed, total = REFERENCES["fused_add_rms_norm"](x, residual, w, eps=1e-5)
        assert torch.equal(total, x + residual) and torch.equal(normed, hf_norm(x + residual))
        gate, up = x[:, :48], x[:, 48:]
        assert torch.equal(REFERENCES["silu_and_mul"](x), ACT2FN["silu"](gate) * up)
        assert torch.equal(REFERENCES["gelu_and_mul"](x, approximate="tanh"), ACT2FN["gelu_pytorch_tanh"](gate) * up)
        assert torch.equal(REFERENCES["gelu_and_mul"](x, approximate="none"), ACT2FN["gelu"](gate) * up)
