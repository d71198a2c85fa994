"""gpt_attention's CUDA implementation on mixed steps (in-flight batching) against its reference.

A mixed step packs decode rows (one new token over a cached past) beside prompts and prompt
chunks (several new tokens, maybe over a cached past: chunked prefill). The CUDA op runs the
decode rows through the decode-attention kernel and every other sequence through one varlen
flash-attention call; these tests check its outputs and the paged caches it writes against the
reference on random data, and that the reference path is not taken.

Needs a GPU and the compiled CUDA kernels (python build_wheel.py -a native -s -i). Timing of one
Llama-8B-shaped mixed step, new path against the reference:
    python -m tests.runtime.test_mixed_attention
"""
import os

import pytest
import torch

from tensorrt_llm import kernels
from tensorrt_llm.ops import attention_cuda
from tensorrt_llm.ops.attention import gpt_attention_reference
from tensorrt_llm.ops.attention_cuda import gpt_attention_cuda

from ..kernels.utils import assert_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not kernels.cuda_kernels_available(),
                       reason="tensorrt_llm.bindings has no CUDA kernels: build with "
                              "`python build_wheel.py -a native -s -i`"),
]

# Sequences as (cached past, new tokens). new == 1 is a decode row; (0, 1) is a one-token prompt.
SCENARIOS = {
    "decode+fresh": [(37, 1), (5, 1), (64, 1), (0, 1), (0, 23), (0, 7), (0, 64), (0, 2)],
    # pasts ending at, and crossing, block boundaries of 16 and 64 tokens
    "decode+chunks": [(15, 1), (100, 1), (16, 1), (63, 1), (16, 9), (13, 40), (130, 17), (63, 2), (64, 65),
                      (0, 30)],
    "chunks": [(13, 40), (70, 33), (0, 19), (128, 64), (1, 3)],
}
HEADS = [(32, 8, 128), (32, 8, 64), (4, 1, 64), (4, 1, 128)]  # (num_heads, num_kv_heads, head_dim)
LAYERS, LAYER = 2, 1  # the op works on kv_cache_pool[LAYER]; the other layer must stay untouched


def ordered(specs, order, gen):
    """The sequences in the executor's order (decode rows first), decode rows last, or interleaved."""
    decode = [s for s in specs if s[1] == 1]
    others = [s for s in specs if s[1] != 1]
    if order == "decode_first":
        return decode + others
    if order == "decode_last":
        return others + decode
    mixed = []  # one of each in turn: neither group is one run of sequences
    for i in range(max(len(decode), len(others))):
        mixed += others[i:i + 1] + decode[i:i + 1]
    if not decode:
        mixed = [others[i] for i in torch.randperm(len(others), generator=gen).tolist()]
    return mixed


DEVICE = "cuda"


def make_step(specs, num_heads, num_kv_heads, head_dim, tpb, dtype, gen):
    """Inputs of one step: block tables of distinct random blocks (spare columns point at blocks
    no sequence uses), a random cache pool, packed QKV rows and the per-token positions."""
    lengths = [p + n for p, n in specs]
    needed = [-(-n // tpb) for n in lengths]
    max_blocks = max(needed) + 1
    num_blocks = sum(needed) + 4
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    spare = perm[sum(needed):]
    tables = spare[torch.randint(spare.numel(), (len(specs), max_blocks), generator=gen)]
    used = 0
    for b, n in enumerate(needed):
        tables[b, :n] = perm[used:used + n]
        used += n
    new = torch.tensor([n for _, n in specs], dtype=torch.int32)
    seq_lengths = torch.tensor(lengths, dtype=torch.int32)
    width = (num_heads + 2 * num_kv_heads) * head_dim
    device = DEVICE
    return {
        "pool": torch.randn(LAYERS, num_blocks, 2, num_kv_heads, tpb, head_dim, generator=gen).to(dtype).to(device),
        "qkv": torch.randn(int(new.sum()), width, generator=gen).to(dtype).to(device),
        "block_tables": tables.to(device),
        "sequence_lengths": seq_lengths.to(device),
        "context_lengths": new.to(device),
        "host_context_lengths": new,
        "host_sequence_lengths": seq_lengths,
        "position_ids": torch.cat([torch.arange(p, p + n) for p, n in specs]).to(torch.int32).to(device),
    }


def attend(op, step, num_heads, num_kv_heads, head_dim, tpb, cos_sin=None, rotary_dim=0, is_neox=True,
           sliding_window=None, copy=True):
    """op on its own copies (copy=True) of the QKV rows and the pool: (output, pool after the step)."""
    qkv, pool = (step["qkv"].clone(), step["pool"].clone()) if copy else (step["qkv"], step["pool"])
    q_cols, kv_cols = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv[:, :q_cols], qkv[:, q_cols:q_cols + kv_cols], qkv[:, q_cols + kv_cols:]
    out = op(q, k, v, pool, step["block_tables"], step["sequence_lengths"], step["context_lengths"],
             step["host_context_lengths"], None, step["position_ids"], cos_sin, step["host_sequence_lengths"],
             layer_idx=LAYER, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
             tokens_per_block=tpb, sliding_window=sliding_window, rotary_dim=rotary_dim, rotary_is_neox=is_neox)
    return out, pool


@pytest.fixture
def fast_path_only(monkeypatch):
    """gpt_attention's CUDA implementation must not fall back to the reference in these tests."""
    def reference_taken(*args, **kwargs):
        raise AssertionError("gpt_attention_cuda took the reference path")
    monkeypatch.setattr(attention_cuda, "gpt_attention_reference", reference_taken)


def check(specs, num_heads, num_kv_heads, head_dim, tpb, dtype, rotary="none", sliding_window=None, seed=None):
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    step = make_step(specs, num_heads, num_kv_heads, head_dim, tpb, dtype, gen)
    rotary_dim = head_dim // 2 if rotary.endswith("partial") else head_dim
    max_position = max(p + n for p, n in specs)
    cos_sin = None if rotary == "none" else kernels.rope_cos_sin_cache(max_position + 8, rotary_dim, 10000.0).to(DEVICE)
    kw = dict(cos_sin=cos_sin, rotary_dim=rotary_dim if cos_sin is not None else 0,
              is_neox=not rotary.startswith("gptj"), sliding_window=sliding_window)
    out, pool = attend(gpt_attention_cuda, step, num_heads, num_kv_heads, head_dim, tpb, **kw)
    ref, ref_pool = attend(gpt_attention_reference, step, num_heads, num_kv_heads, head_dim, tpb, **kw)
    msg = f"seed={seed} specs={specs}"
    assert out.shape == ref.shape == (step["qkv"].shape[0], num_heads * head_dim)
    assert torch.isfinite(out).all(), msg
    assert_close(out, ref, dtype, msg=msg)
    assert_close(pool[LAYER], ref_pool[LAYER], dtype, msg=f"cache, {msg}")
    assert torch.equal(pool[1 - LAYER], step["pool"][1 - LAYER]), msg


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("rotary", ["none", "neox"])
@pytest.mark.parametrize("tpb", [16, 64])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: "h{}kv{}d{}".format(*h))
@pytest.mark.parametrize("order", ["decode_first", "decode_last", "shuffled"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_mixed_step_matches_reference(scenario, order, heads, tpb, rotary, dtype, fast_path_only):
    seed = int.from_bytes(os.urandom(4), "little")
    specs = ordered(SCENARIOS[scenario], order, torch.Generator().manual_seed(seed))
    check(specs, *heads, tpb, dtype, rotary, seed=seed)


@pytest.mark.parametrize("rotary", ["gptj", "neox_partial", "gptj_partial"])
def test_mixed_step_other_rotary_layouts(rotary, fast_path_only):
    check(SCENARIOS["decode+chunks"], 32, 8, 128, 16, torch.bfloat16, rotary)


@pytest.mark.parametrize("window", [24, 200])
def test_mixed_step_sliding_window(window, fast_path_only):
    # 24: shorter than most sequences (decode kernel's window, flash's left window); 200: longer than all
    check(SCENARIOS["decode+chunks"], 32, 8, 128, 16, torch.float16, "neox", sliding_window=window)


@pytest.mark.parametrize("order", ["decode_first", "shuffled"])
def test_blocks_of_odd_size_send_decode_rows_through_varlen(order, fast_path_only):
    # the decode kernel takes power-of-two blocks only: the one-token rows join the varlen call
    specs = ordered(SCENARIOS["decode+chunks"], order, torch.Generator().manual_seed(0))
    check(specs, 4, 1, 64, 24, torch.bfloat16, "neox")


def test_one_long_chunk_over_a_long_past(fast_path_only):
    check([(1500, 1), (3, 1), (1024, 512), (777, 300)], 32, 8, 128, 64, torch.bfloat16, "neox")


def test_float32_mixed_step_still_matches_reference():
    check(SCENARIOS["decode+chunks"], 4, 1, 64, 16, torch.float32, "neox")


# ---- timing: one mixed step of Llama-3-8B attention ------------------------------------------

def _time_ms(fn, iters):
    for _ in range(2):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _gpu_ms(fn):
    """Sum of the GPU kernels' times of one call (torch.profiler), None where it cannot tell."""
    try:
        from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(e.self_device_time_total for e in prof.key_averages()) / 1000
    except Exception:  # noqa: BLE001  (timing extras only)
        return None


def _host_ms(fn, iters):
    """Host time of one call (launches only, no sync inside the loop)."""
    import time  # noqa: PLC0415
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - start) * 1000 / iters
    torch.cuda.synchronize()
    return host


def bench(decode_rows=200, chunks=2, chunk=512, past=1024):
    """200 decode rows at context ~200 then 2 chunks of 512 tokens over a past of 1024: 32 heads,
    8 KV heads, head_dim 128, bfloat16, 64 tokens per block, NeoX rotary. Also the decode rows
    alone (the decode path) and the chunks alone, for scale."""
    gen = torch.Generator().manual_seed(0)
    contexts = torch.randint(150, 251, (decode_rows,), generator=gen).tolist()
    decode_specs = [(c - 1, 1) for c in contexts]
    chunk_specs = [(past, chunk)] * chunks
    heads, kv_heads, head_dim, tpb = 32, 8, 128, 64
    cos_sin = kernels.rope_cos_sin_cache(max(past + chunk, 250) + 8, head_dim, 500000.0).to(DEVICE)
    kw = dict(cos_sin=cos_sin, rotary_dim=head_dim)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"{heads} heads, {kv_heads} KV heads, head_dim {head_dim}, bf16, {tpb} tokens per block; "
          f"decode rows at context 150..250, chunks of {chunk} over a past of {past}")
    for label, specs in ((f"mixed: {decode_rows} decode rows + {chunks} chunks", decode_specs + chunk_specs),
                         (f"{decode_rows} decode rows alone (decode path)", decode_specs),
                         (f"{chunks} chunks alone", chunk_specs)):
        step = make_step(specs, heads, kv_heads, head_dim, tpb, torch.bfloat16, gen)
        out, pool = attend(gpt_attention_cuda, step, heads, kv_heads, head_dim, tpb, **kw)
        ref, ref_pool = attend(gpt_attention_reference, step, heads, kv_heads, head_dim, tpb, **kw)
        err = (out.float() - ref.float()).abs().max().item()
        cache_err = (pool.float() - ref_pool.float()).abs().max().item()
        print(f"{label}: max |new - reference| output {err:.4g}, cache {cache_err:.4g}")
        # on the same buffers: rotating q/k again in place and rewriting the same cache rows cost the same
        for name, op, iters in (("new", gpt_attention_cuda, 50), ("reference", gpt_attention_reference, 5)):
            def one_step(op=op):
                attend(op, step, heads, kv_heads, head_dim, tpb, copy=False, **kw)
            wall = _time_ms(one_step, iters)
            host, gpu = _host_ms(one_step, iters), _gpu_ms(one_step)
            gpu_text = "?" if gpu is None else f"{gpu:.3f}"
            print(f"  {name:>9}: {wall:.3f} ms per call (CUDA events); host {host:.3f} ms, GPU kernels {gpu_text} ms")


if __name__ == "__main__":
    bench()
