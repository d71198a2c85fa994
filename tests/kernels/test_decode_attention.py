"""Paged decode attention: CUDA kernel against the reference, and its argument checks."""
import math
import os

import pytest
import torch

from tensorrt_llm import kernels
from tensorrt_llm.kernels import reference

from .utils import DTYPES, assert_close

CASES = [  # (batch, heads, kv_heads, head_dim, tokens_per_block, max_len)
    (5, 8, 8, 64, 16, 70),       # MHA
    (3, 9, 3, 64, 32, 257),      # SmolLM2's heads, group 3
    (7, 32, 8, 128, 32, 600),    # Llama-3 8B's heads, splits
    (2, 8, 1, 128, 8, 33),       # MQA, group 8
    (4, 4, 2, 256, 16, 100),     # head_dim 256
    (1, 32, 8, 128, 32, 2100),   # one long sequence, many splits
    (3, 32, 8, 128, 16, 3000),   # one batch's sequences use different numbers of splits
    (160, 32, 8, 128, 16, 150),  # many waves of blocks: the large-batch instance
    (400, 9, 3, 64, 32, 90),     # the same, group 3, head size 64
]


def make_inputs(batch, heads, kv_heads, head_dim, tpb, max_len, dtype, device, gen):
    lengths = torch.randint(1, max_len + 1, (batch,), generator=gen)
    lengths[0] = max_len  # one sequence fills its table
    max_blocks = -(-max_len // tpb) + 1  # one spare column, unused
    num_blocks = batch * max_blocks + 3
    cache = torch.randn(num_blocks, 2, kv_heads, tpb, head_dim, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen)[:batch * max_blocks]
    tables = perm.view(batch, max_blocks).to(torch.int32)
    q = torch.randn(batch, heads, head_dim, generator=gen).to(dtype)
    return [t.to(device) for t in (q, cache, tables, lengths.to(torch.int32))]


def test_reference_equals_dense_attention_over_gathered_rows():
    gen = torch.Generator().manual_seed(0)
    q, cache, tables, lengths = make_inputs(3, 6, 2, 64, 8, 30, torch.float32, "cpu", gen)
    out = reference.decode_attention(q, cache, tables, lengths, 0.125)
    for b in range(3):
        n = int(lengths[b])
        rows = [(int(tables[b, p // 8]), p % 8) for p in range(n)]
        k = torch.stack([cache[blk, 0, :, s] for blk, s in rows])  # [n, KV, D]
        v = torch.stack([cache[blk, 1, :, s] for blk, s in rows])
        for h in range(6):
            w = torch.softmax(k[:, h // 3] @ q[b, h] * 0.125, dim=0)
            torch.testing.assert_close(out[b, h], w @ v[:, h // 3], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_split_merge_leaves_its_counters_zero_and_repeats_exactly():
    # Long sequences split across blocks; the last block of each (sequence, KV head) merges
    # the partials and resets its counter, so back-to-back launches agree bit for bit.
    from tensorrt_llm.ops.attention_cuda import _counters
    gen = torch.Generator().manual_seed(1)
    q, cache, tables, lengths = make_inputs(3, 32, 8, 128, 32, 2100, torch.bfloat16, "cuda", gen)
    first = kernels.decode_attention(q, cache, tables, lengths, 0.1)
    for _ in range(3):
        assert torch.equal(kernels.decode_attention(q, cache, tables, lengths, 0.1), first)
    assert all(int(c.abs().sum()) == 0 for c in _counters[q.device])
    ref = reference.decode_attention(q.float(), cache.float(), tables, lengths, 0.1)
    assert_close(first, ref.to(torch.bfloat16), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_reference(case, dtype):
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    q, cache, tables, lengths = make_inputs(*case, dtype, "cuda", gen)
    scale = 1 / math.sqrt(case[3])
    out = kernels.decode_attention(q, cache, tables, lengths, scale)
    ref = reference.decode_attention(q.float(), cache.float(), tables, lengths, scale)
    assert_close(out, ref.to(dtype), dtype, msg=f"seed={seed} case={case}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_sm", [2.5, 3.5])
def test_kernel_grids_of_two_to_four_blocks_an_sm(per_sm, dtype):
    """Llama-3 8B's heads at batches whose (sequence, KV head) blocks number 2.5 and 3.5 a
    multiprocessor: the four-warp kernel's instance of three blocks an SM (the first) and its usual
    one (the second), against the reference."""
    batch = int(per_sm * torch.cuda.get_device_properties(0).multi_processor_count) // 8
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    q, cache, tables, lengths = make_inputs(batch, 32, 8, 128, 32, 300, dtype, "cuda", gen)
    out = kernels.decode_attention(q, cache, tables, lengths, 0.088)
    ref = reference.decode_attention(q.float(), cache.float(), tables, lengths, 0.088)
    assert_close(out, ref.to(dtype), dtype, msg=f"seed={seed} batch={batch}")


@pytest.mark.gpu
@pytest.mark.parametrize("window", [0, 1, 17])
def test_kernel_alibi_and_sliding_window(window):
    gen = torch.Generator().manual_seed(window)
    q, cache, tables, lengths = make_inputs(4, 8, 2, 64, 16, 90, torch.float32, "cuda", gen)
    slopes = torch.rand(8, generator=gen).cuda()
    out = kernels.decode_attention(q, cache, tables, lengths, 0.125, slopes, window)
    ref = reference.decode_attention(q, cache, tables, lengths, 0.125, slopes, window)
    assert_close(out, ref, torch.float32)


@pytest.mark.gpu
def test_kernel_in_a_cuda_graph_replays_with_new_lengths():
    gen = torch.Generator().manual_seed(1)
    q, cache, tables, lengths = make_inputs(3, 9, 3, 64, 32, 200, torch.bfloat16, "cuda", gen)
    kernels.decode_attention(q, cache, tables, lengths, 0.125)  # warm-up outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.decode_attention(q, cache, tables, lengths, 0.125)
    for new in ([1, 200, 64], [33, 2, 199]):
        lengths.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        assert_close(out, reference.decode_attention(q, cache, tables, lengths, 0.125), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("bad, message", [
    ("group", "a KV head: the kernel takes <= 8"),
    ("head_dim", "head_dim 80 is not supported"),
    ("dtype", "kv_cache"),
    ("batch", "must have batch"),
])
def test_kernel_refuses_bad_arguments(bad, message):
    gen = torch.Generator().manual_seed(2)
    heads, kv, dim = (16, 1, 64) if bad == "group" else (4, 2, 80 if bad == "head_dim" else 64)
    q, cache, tables, lengths = make_inputs(2, heads, kv, dim, 16, 40, torch.float16, "cuda", gen)
    if bad == "dtype":
        cache = cache.float()
    if bad == "batch":
        lengths = lengths[:1]
    with pytest.raises((ValueError, TypeError), match=message):
        kernels.decode_attention(q, cache, tables, lengths, 0.125)
    torch.cuda.synchronize()  # nothing was launched that could fault


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotary", ["none", "neox", "gptj", "neox_partial"])
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[3], CASES[6]])
def test_fused_write_and_rotation_match_reference(case, rotary, dtype):
    from tensorrt_llm.functional import rope_cos_sin_cache
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    batch, heads, kv_heads, head_dim = case[:4]
    q, cache, tables, lengths = make_inputs(*case, dtype, "cuda", gen)
    # k/v as strided column slices of one packed row, like the runtime's qkv projection
    packed = torch.randn(batch, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype).cuda()
    k_new = packed[:, heads * head_dim:(heads + kv_heads) * head_dim].view(batch, kv_heads, head_dim)
    v_new = packed[:, (heads + kv_heads) * head_dim:].view(batch, kv_heads, head_dim)
    rotary_dim = head_dim // 2 if rotary == "neox_partial" else head_dim
    cos_sin = None if rotary == "none" else rope_cos_sin_cache(case[5] + 8, rotary_dim, 10000.0).cuda()
    is_neox = rotary != "gptj"
    ours, theirs = cache.clone(), cache.float().clone()
    out = kernels.decode_attention(q, ours, tables, lengths, 0.1, None, 0, k_new, v_new, cos_sin, is_neox)
    ref = reference.decode_attention(q.float(), theirs, tables, lengths, 0.1, None, 0, k_new.float(),
                                     v_new.float(), cos_sin, is_neox)
    assert_close(out, ref.to(dtype), dtype, msg=f"seed={seed} case={case} rotary={rotary}")
    assert_close(ours, theirs.to(dtype), dtype, msg=f"cache, seed={seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", [CASES[2], CASES[6]])
def test_rows_not_16_byte_aligned_are_read_element_by_element(case):
    # q, k_new and v_new as views one element into their storage: the staging cannot use
    # 16-byte loads there and must still read them right.
    gen = torch.Generator().manual_seed(7)
    batch, heads, kv_heads, head_dim = case[:4]
    q, cache, tables, lengths = make_inputs(*case, torch.bfloat16, "cuda", gen)
    width = (heads + 2 * kv_heads) * head_dim
    packed = torch.randn(batch, width + 1, generator=gen).to(torch.bfloat16).cuda()[:, 1:]
    q = packed[:, :heads * head_dim].view(batch, heads, head_dim)
    k_new = packed[:, heads * head_dim:(heads + kv_heads) * head_dim].view(batch, kv_heads, head_dim)
    v_new = packed[:, (heads + kv_heads) * head_dim:].view(batch, kv_heads, head_dim)
    ours, theirs = cache.clone(), cache.float().clone()
    out = kernels.decode_attention(q, ours, tables, lengths, 0.1, None, 0, k_new, v_new, None, True)
    ref = reference.decode_attention(q.float(), theirs, tables, lengths, 0.1, None, 0, k_new.float(),
                                     v_new.float(), None, True)
    assert_close(out, ref.to(torch.bfloat16), torch.bfloat16, msg=f"case={case}")
    assert_close(ours, theirs.to(torch.bfloat16), torch.bfloat16, msg="cache")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["cached", "fused_write", "fp8_cache"])
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[6], CASES[7]])
def test_codes_are_the_output_then_the_quantize(case, form, dtype):
    """decode_attention_fp8 (an FP8 linear's static input scale given) writes the E4M3 codes that
    fp8_quantize makes of decode_attention's output, bit for bit: one split and several, the
    large-batch instance, the step's rows written and rotated by the same launch, a cache of
    codes, outputs beyond the scale's range (saturated)."""
    from tensorrt_llm.functional import rope_cos_sin_cache
    from tensorrt_llm.ops.attention_cuda import decode_attention_cuda
    from tensorrt_llm.ops.fp8_linear import _quantize_activation_cuda
    from tensorrt_llm.quantization.formats import FP8_MAX, KV_CACHE_STORAGE, quantize_kv
    if form == "fp8_cache" and dtype == torch.float32:
        pytest.skip("a cache of codes is read by the half-precision kernel only")
    gen = torch.Generator().manual_seed(case[0] + case[5])
    batch, heads, kv_heads, head_dim = case[:4]
    q, cache, tables, lengths = make_inputs(*case, dtype, "cuda", gen)
    q = q * 4  # sharper softmax: outputs nearer single V rows, some beyond the codes' range below
    kv_scale = None
    if form == "fp8_cache":
        kv_scale = torch.tensor([0.02, 0.015], device="cuda")
        cache = quantize_kv(cache.float(), kv_scale.view(2, 1, 1, 1), "FP8").view(KV_CACHE_STORAGE["FP8"])
    step = {}
    if form != "cached":
        packed = torch.randn(batch, 2 * kv_heads * head_dim, generator=gen).to(dtype).cuda()
        step = dict(k_new=packed[:, :kv_heads * head_dim].view(batch, kv_heads, head_dim),
                    v_new=packed[:, kv_heads * head_dim:].view(batch, kv_heads, head_dim),
                    rotary_cos_sin=rope_cos_sin_cache(case[5] + 8, head_dim, 10000.0).cuda())
    out = decode_attention_cuda(q, cache, tables, lengths, 0.1, kv_scale=kv_scale, **step)
    scale = (out.float().abs().amax() / FP8_MAX / 2).reshape(1)  # the largest outputs saturate
    codes = decode_attention_cuda(q, cache, tables, lengths, 0.1, kv_scale=kv_scale, input_scale=scale, **step)
    want, _ = _quantize_activation_cuda(out.view(batch, heads * head_dim), scale)
    assert codes.shape == (batch, heads * head_dim) and codes.dtype == torch.uint8
    assert torch.equal(codes, want.view(torch.uint8))
    assert (codes.view(want.dtype).float().abs() == FP8_MAX).any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", [
    (1, 32, 8, 128, 32, 300),    # eight-warp blocks (few pairs), Llama-3 8B's heads
    (7, 32, 8, 128, 32, 600),    # four-warp blocks
    (160, 32, 8, 128, 16, 150),  # one-warp blocks (many waves)
    (3, 9, 3, 64, 32, 257),      # head size 64, group 3
])
def test_early_cache_loads_in_a_graph_give_the_same_bits(case, dtype):
    """early_cache_loads (one decode step a graph, DecodeGraphs): the kernel loads its first K/V
    tiles before the previous kernel ends, then patches in this step's row as the fused write
    stores it. Bit for bit the launch without it, at lengths that put the new row at every place
    of a tile, in the cache too."""
    from tensorrt_llm.functional import rope_cos_sin_cache
    from tensorrt_llm.ops.attention_cuda import decode_attention_cuda
    gen = torch.Generator().manual_seed(7)
    batch, heads, kv_heads, head_dim, tpb, max_len = case
    q, cache, tables, lengths = make_inputs(*case, dtype, "cuda", gen)
    k_new, v_new = (torch.randn(batch, kv_heads, head_dim, generator=gen).to(dtype).cuda() for _ in range(2))
    cos_sin = rope_cos_sin_cache(max_len + 8, head_dim, 10000.0).cuda()
    base = cache.clone()

    def attend(kv, early):
        return decode_attention_cuda(q, kv, tables, lengths, 0.1, None, 0, k_new, v_new, cos_sin, True, None, None,
                                     early)

    attend(cache, True)  # warm-up outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attend(cache, True)
    picks = [1, 2, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 128, 129, max_len]
    for i in range(len(picks)):
        new = [picks[(i + r) % len(picks)] for r in range(batch)]
        lengths.copy_(torch.tensor(new, dtype=torch.int32))
        cache.copy_(base)
        graph.replay()
        want_cache = base.clone()
        want = attend(want_cache, False)
        assert torch.equal(out, want), f"lengths {new[:4]}"
        assert torch.equal(cache, want_cache), f"cache, lengths {new[:4]}"
