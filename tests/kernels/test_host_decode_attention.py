"""The host (CPU) decode attention, cpp/kernels/host_decode_attention.cpp, through gpt_attention's
CPU implementation, against the op's PyTorch reference on random data: the output and every row
of the pool after the step (the new K/V rows written, rotated as the reference rotates them)."""
import math

import pytest
import torch

from tensorrt_llm.functional import rope_cos_sin_cache
from tensorrt_llm.ops.attention import gpt_attention_cpu, gpt_attention_reference
from tensorrt_llm.ops.launch import bindings_available, launch

pytestmark = pytest.mark.skipif(not bindings_available(), reason="needs the compiled bindings")

TPB = 16


def step_inputs(lengths, heads, kv_heads, head_dim, seed):
    """A pool with random rows, shuffled block tables, and this step's packed qkv [B, (H + 2 KV) D]."""
    gen = torch.Generator().manual_seed(seed)
    batch, max_blocks = len(lengths), -(-max(lengths) // TPB) + 1
    num_blocks = batch * max_blocks + 3
    pool = torch.randn(2, num_blocks, 2, kv_heads, TPB, head_dim, generator=gen)  # 2 layers: layer 1 is used
    tables = torch.randperm(num_blocks, generator=gen)[:batch * max_blocks].view(batch, max_blocks).int()
    qkv = torch.randn(batch, (heads + 2 * kv_heads) * head_dim, generator=gen)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)
    return pool, tables.contiguous(), q, k, v


@pytest.mark.parametrize("heads", [(9, 3, 64), (4, 4, 32), (8, 1, 128)], ids=lambda h: "h{}kv{}d{}".format(*h))
@pytest.mark.parametrize("rotary", ["none", "neox", "gptj", "neox_partial"])
@pytest.mark.parametrize("lengths", [[1], [16, 17, 5], [40, 1, 33, 64], [65, 200, 128, 129]],
                         ids=["one", "edges", "mixed", "chunks"])
@pytest.mark.parametrize("extra", ["plain", "alibi", "window"])
def test_cpu_decode_matches_the_reference(heads, rotary, lengths, extra):
    num_heads, kv_heads, head_dim = heads
    pool, tables, q, k, v = step_inputs(lengths, num_heads, kv_heads, head_dim, seed=len(lengths) * 31 + head_dim)
    lengths_t = torch.tensor(lengths, dtype=torch.int32)
    ones = torch.ones(len(lengths), dtype=torch.int32)
    rotary_dim = {"none": 0, "neox": head_dim, "gptj": head_dim, "neox_partial": head_dim // 2}[rotary]
    cos_sin = rope_cos_sin_cache(256, rotary_dim) if rotary_dim else None
    positions = (lengths_t - 1) if rotary_dim else None
    alibi = torch.linspace(0.1, 1.0, num_heads) if extra == "alibi" else None
    kwargs = dict(layer_idx=1, num_heads=num_heads, num_kv_heads=kv_heads, head_dim=head_dim, tokens_per_block=TPB,
                  scale=None, sliding_window=7 if extra == "window" else None, rotary_dim=rotary_dim,
                  rotary_is_neox=rotary != "gptj")
    args = (tables, lengths_t, ones, ones, alibi, positions, cos_sin, lengths_t)
    ref_pool = pool.clone()
    expected = gpt_attention_reference(q, k, v, ref_pool, *args, **kwargs)
    out = gpt_attention_cpu(q, k, v, pool, *args, **kwargs)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool, ref_pool, rtol=1e-6, atol=1e-6)


def launch_step(pool, tables, lengths, q, k, v, heads, kv_heads, head_dim, threads):
    """The kernel on layer 0 of the pool with rotation (NeoX), `threads` threads; -> out."""
    batch = len(lengths)
    cos_sin = rope_cos_sin_cache(max(lengths) + 1, head_dim)
    out = torch.empty(batch, heads, head_dim)
    launch("host_decode_attention", out, q.reshape(batch, heads, head_dim), pool[0], tables,
           torch.tensor(lengths, dtype=torch.int32), None, 1 / math.sqrt(head_dim), 0,
           k.reshape(batch, kv_heads, head_dim), v.reshape(batch, kv_heads, head_dim), cos_sin, True, threads)
    return out


def test_the_same_bits_for_any_threads_and_any_batch():
    """Chunks of positions are merged in a fixed order: a sequence's output does not depend on the
    threads nor on the sequences beside it (the executor's "each request as alone")."""
    lengths, heads, kv_heads, head_dim = [300, 7, 129, 64], 9, 3, 64
    pool, tables, q, k, v = step_inputs(lengths, heads, kv_heads, head_dim, seed=11)
    outs = {}
    for threads in (1, 2, 3):
        p = pool.clone()
        outs[threads] = launch_step(p, tables, lengths, q, k, v, heads, kv_heads, head_dim, threads)
        if threads == 1:
            pool_after = p
        assert torch.equal(p, pool_after)
    assert torch.equal(outs[1], outs[2]) and torch.equal(outs[1], outs[3])
    for b in range(len(lengths)):
        p = pool.clone()
        alone = launch_step(p, tables[b:b + 1], lengths[b:b + 1], q[b:b + 1], k[b:b + 1], v[b:b + 1],
                            heads, kv_heads, head_dim, threads=2)
        assert torch.equal(alone[0], outs[1][b])


def test_prompt_steps_and_other_dtypes_keep_the_reference():
    """A prompt step (more tokens than sequences) and a bfloat16 engine are not the kernel's."""
    pool, tables, q, k, v = step_inputs([5], 4, 2, 32, seed=3)
    lengths = torch.tensor([5], dtype=torch.int32)
    kwargs = dict(layer_idx=0, num_heads=4, num_kv_heads=2, head_dim=32, tokens_per_block=TPB)
    qs, ks, vs = (t.repeat(5, 1) for t in (q, k, v))
    five = torch.tensor([5], dtype=torch.int32)
    ref_pool = pool.clone()
    torch.testing.assert_close(gpt_attention_cpu(qs, ks, vs, pool, tables, lengths, five, five, **kwargs),
                               gpt_attention_reference(qs, ks, vs, ref_pool, tables, lengths, five, five, **kwargs))
    ones = torch.ones(1, dtype=torch.int32)
    bf = [t.bfloat16() for t in (q, k, v)]
    pool_bf, ref_bf = pool.bfloat16(), pool.bfloat16()
    assert torch.equal(gpt_attention_cpu(*bf, pool_bf, tables, lengths, ones, ones, **kwargs),
                       gpt_attention_reference(*bf, ref_bf, tables, lengths, ones, ones, **kwargs))


@pytest.mark.parametrize("bad, message", [
    ("length", "outside \\[1, "),
    ("block", "outside the cache's"),
    ("dtype", "kv_cache"),
    ("group", "whole number"),
    ("threads", "threads must be"),
])
def test_the_kernel_refuses_what_it_cannot_read(bad, message):
    """A hostile block table or length is refused before any row is read or written."""
    pool, tables, q, k, v = step_inputs([3, 9], 4, 2, 32, seed=5)
    cache = pool[0]
    lengths = torch.tensor([3, 9], dtype=torch.int32)
    if bad == "length":
        lengths[1] = tables.shape[1] * TPB + 1
    if bad == "block":
        tables[1, 0] = cache.shape[0]
    if bad == "dtype":
        cache = cache.half()
    qh = q.view(2, 4, 32)
    if bad == "group":
        qh = torch.randn(2, 3, 32)
    new_rows = k.view(2, 2, 32), v.view(2, 2, 32)
    before = cache.clone()
    with pytest.raises((ValueError, TypeError), match=message):
        launch("host_decode_attention", torch.empty_like(qh), qh, cache, tables, lengths, None, 1 / math.sqrt(32), 0,
               *new_rows, None, False, 0 if bad == "threads" else 1)
    assert torch.equal(cache, before)


def test_a_prepared_call_checks_the_lengths_and_block_ids_at_every_run():
    """A prepared call (a CPU decode step's tape) reads lengths and block ids again at every run:
    values made hostile after the call was checked are refused, and nothing is written."""
    from tensorrt_llm.ops.launch import get_bindings, tensor_arg
    pool, tables, q, k, v = step_inputs([3, 9], 4, 2, 32, seed=7)
    cache, lengths = pool[0], torch.tensor([3, 9], dtype=torch.int32)
    qh, out = q.view(2, 4, 32), torch.empty(2, 4, 32)
    args = tuple(tensor_arg(t) for t in (out, qh, cache, tables, lengths)) + (None, 1 / math.sqrt(32), 0) \
        + (tensor_arg(k.view(2, 2, 32)), tensor_arg(v.view(2, 2, 32)), None, False, 2)
    prepared = get_bindings().prepare_host_calls([("host_decode_attention", args, {})])
    prepared()
    for hostile in ("length", "block"):
        before = cache.clone()
        if hostile == "length":
            lengths[1] = tables.shape[1] * TPB + 1
        else:
            lengths[1] = 9
            tables[1, 0] = cache.shape[0]
        with pytest.raises(ValueError, match="host_decode_attention: .*outside"):
            prepared()
        assert torch.equal(cache, before)
