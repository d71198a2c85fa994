"""gpt_attention's CUDA implementation. Shapes the kernels do not cover go to the reference,
on the GPU. Its paths:
- decode (one new token per sequence, known from shapes alone so it can be captured in a
  CUDA graph): rotate q/k in place, write K/V into the paged cache, one decode-attention
  kernel that reads each K/V row once per query-head group (`decode_step_cuda`; given an FP8
  linear's static input scale, the kernel writes that linear's E4M3 codes instead:
  fp8_linear.py's gpt_attention_fp8_linear);
- any other step in float16/bfloat16 (in-flight batching: decode rows beside prompts and
  prompt chunks that continue a cached past; or prompts alone): rotate every token and write
  every new K/V row (one launch each), the decode rows (one new token) through the same
  decode-attention kernel, all other sequences through ONE varlen flash-attention call over
  their whole [0, L) K/V (gathered from the paged cache when a sequence has a past), causal
  aligned bottom-right. Host lengths say which row is which, so nothing syncs;
- float32 (or no host_sequence_lengths, or no flash on this GPU): fused SDPA on prompts
  that have no cached past; alibi and anything else take the reference path.
A quantized cache (int8 / uint8 FP8 codes, kv_cache_scale): the write kernels quantize, the
decode kernel dequantizes in registers (float16 / bfloat16, head dims 64 and 128, sm_80+;
other shapes run the reference), and the varlen path reads every sequence's rows, its own
new ones included, from the cache, dequantized, as the reference does.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ..quantization.formats import dequantize_kv
from .attention import gpt_attention, gpt_attention_reference
from .launch import cuda_capability, cuda_kernels_available, get_bindings, launch
from .op import CUDA
from .rotary import rotary_embedding_cuda_

# ---- the kernels ---------------------------------------------------------------------------------


def paged_kv_write_cuda_(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                         cu_seqlens: torch.Tensor, past_lengths: torch.Tensor,
                         kv_scale: Optional[torch.Tensor] = None) -> None:
    """Scatter key/value [T, KV, D] into kv_cache [num_blocks, 2, KV, tpb, D] through block_tables:
    token t of sequence b (cu_seqlens[b] <= t < cu_seqlens[b+1]) goes to position
    p = past_lengths[b] + t - cu_seqlens[b], block block_tables[b, p // tpb], slot p % tpb. Bad
    block ids or positions are skipped (never written out of bounds): checking them would sync.
    An int8 / uint8 cache takes codes under kv_scale (float32 [2], K and V scales)."""
    launch("paged_kv_write", key, value, kv_cache, block_tables.contiguous(), cu_seqlens.contiguous(),
           past_lengths.contiguous(), kv_scale)


@functools.lru_cache(maxsize=None)
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _decode_splits(batch: int, kv_heads: int, max_positions: int, multiprocessors: int,
                   tokens_per_block: int, max_chunk_blocks: int) -> tuple[int, int]:
    """(num_splits, split_size): the grid's splits per (sequence, KV head), the most any
    sequence may use, and the most positions one block may walk. The kernel gives each sequence
    the splits its actual length is worth (decode_attention.cuh's splitsFor: one block up to 768
    positions, then one per 384) up to num_splits, so num_splits only bounds them: about one
    block per multiprocessor when batch x KV heads is small, none when it already fills the GPU
    (each block has a fixed cost, and a split costs a merge). split_size is the whole table
    (any chunk may be the whole sequence) unless a block cannot stage that many block ids
    (max_chunk_blocks, the binding's DECODE_ATTENTION_MAX_CHUNK_BLOCKS, which counts the 2 ids a
    chunk may straddle); then enough splits to cover it. Depends on shapes only, so graphs can
    capture it."""
    blocks = max(1, batch * kv_heads)
    split_size = min(max_positions, (max_chunk_blocks - 2) * tokens_per_block)
    splits = max(1, min(-(-multiprocessors // blocks), -(-max_positions // 64)))
    return max(splits, -(-max_positions // split_size)), split_size


_counters: dict[torch.device, list[torch.Tensor]] = {}


def _split_counters(device: torch.device, n: int) -> torch.Tensor:
    """n zeroed int32 counters on `device` for the splits' last-block merge; every launch leaves
    them zero, so one buffer serves all launches on the device (launches run in stream order).
    A larger request adds a larger buffer; the old ones stay alive for the CUDA graphs that
    captured them."""
    buffers = _counters.setdefault(device, [])
    if not buffers or buffers[-1].numel() < n:
        buffers.append(torch.zeros(max(n, 1024), dtype=torch.int32, device=device))
    return buffers[-1]


# Whether a decode step being captured now is a CUDA graph of its own (DecodeGraphs): every cached
# position before each query was then written by earlier launches, which end before the graph's
# first kernel starts, so decode_step_cuda lets the kernel load them before its predecessor ends
# (DecodeAttentionParams::earlyCacheLoads). Set only through cache_written_before_launch.
_cache_written_before_launch = False


@contextlib.contextmanager
def cache_written_before_launch():
    """While it is open, decode steps are captured as graphs of one step each (see above)."""
    global _cache_written_before_launch
    before, _cache_written_before_launch = _cache_written_before_launch, True
    try:
        yield
    finally:
        _cache_written_before_launch = before


def decode_attention_cuda(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                          sequence_lengths: torch.Tensor, scale: float, alibi_slopes: Optional[torch.Tensor] = None,
                          sliding_window: int = 0, k_new: Optional[torch.Tensor] = None,
                          v_new: Optional[torch.Tensor] = None, rotary_cos_sin: Optional[torch.Tensor] = None,
                          is_neox: bool = True, kv_scale: Optional[torch.Tensor] = None,
                          input_scale: Optional[torch.Tensor] = None, early_cache_loads: bool = False) -> torch.Tensor:
    """Attention of one query token per sequence, q [B, H, D] at position sequence_lengths[b] - 1,
    over its cached K/V in kv_cache [num_blocks, 2, KV, tpb, D]; -> [B, H, D]. With k_new/v_new
    ([B, KV, D]) the same launch writes them at position L - 1 first, after rotating k and q by
    rotary_cos_sin when given (the caller's q/k stay unrotated). An int8 / uint8 cache holds codes
    under kv_scale (float32 [2]), written and read as such. With input_scale (float32 [1], the
    static input scale of the FP8 linear that reads the output): -> uint8 [B, H * D], the E4M3
    codes fp8_quantize would make of the [B, H * D] output, written by the same launch.
    early_cache_loads: the caller's promise that every cached position before each query was
    written before this launch's stream work began (one decode step a CUDA graph); the kernel
    then reads them before the previous kernel ends."""
    batch, num_heads, head_dim = q.shape
    if input_scale is None:
        out = torch.empty_like(q)
    else:
        out = torch.empty(batch, num_heads * head_dim, dtype=torch.uint8, device=q.device)
    max_positions = block_tables.shape[1] * kv_cache.shape[3]
    num_splits, split_size = _decode_splits(batch, kv_cache.shape[2], max_positions,
                                            _multiprocessors(q.device.index), kv_cache.shape[3],
                                            get_bindings().DECODE_ATTENTION_MAX_CHUNK_BLOCKS)
    workspace = counters = None
    if num_splits > 1:
        workspace = torch.empty(batch * num_heads * num_splits * (head_dim + 2), dtype=torch.float32,
                                device=q.device)
        counters = _split_counters(q.device, batch * kv_cache.shape[2])

    operands = (q, kv_cache, block_tables, sequence_lengths, alibi_slopes, workspace, counters, num_splits, split_size,
                float(scale), int(sliding_window), k_new, v_new, rotary_cos_sin, bool(is_neox), kv_scale,
                bool(early_cache_loads))
    if input_scale is None:
        launch("decode_attention", out, *operands)
    else:
        launch("decode_attention_fp8", out.view(torch.int32), *operands, input_scale)
    return out


# ---- gpt_attention ------------------------------------------------------------------------------

def _kernel_covers(q, num_heads, num_kv_heads, head_dim, quantized) -> bool:
    """Whether the decode kernel takes these heads (a quantized cache: its tensor-core form only)."""
    if not (cuda_kernels_available() and head_dim in (64, 128, 256) and num_heads // num_kv_heads <= 8):
        return False
    return not quantized or (q.dtype in (torch.float16, torch.bfloat16) and head_dim in (64, 128)
                             and cuda_capability(q.device)[0] >= 8)


@functools.lru_cache(maxsize=None)
def _flash_schema() -> str:
    """The schema of PyTorch's flash-attention forward ('' when this torch has none)."""
    try:
        return str(torch.ops.aten._flash_attention_forward.default._schema)
    except (AttributeError, RuntimeError):
        return ""


def _flash_on(device: torch.device) -> bool:
    """Whether PyTorch's flash attention runs on this GPU (compiled in, sm80 or newer)."""
    available = getattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)()
    return bool(_flash_schema()) and available and cuda_capability(device)[0] >= 8


def _varlen_ready(q: torch.Tensor) -> bool:
    """Whether the mixed-step path (decode kernel + one varlen flash call) serves q."""
    return (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
            and _flash_on(q.device))


def _flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale, window_left):
    """Causal attention of packed queries q [Tq, H, D] over packed keys/values [Tk, KV, D]
    (any row and head strides), sequence b holding rows cu[b]:cu[b+1]. The causal mask is
    aligned bottom-right, as flash attention does: query i of n over m keys sees keys
    [0, m - n + i]; window_left >= 0 also hides keys more than window_left before that."""
    extra = {} if window_left < 0 else {"window_size_left": window_left, "window_size_right": 0}
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False,
                                                   scale=scale, **extra)[0]


def _upload(device, *host: torch.Tensor) -> list[torch.Tensor]:
    """Host int64 index tensors on the device, in one (pinned, asynchronous) copy."""
    if not host:
        return []
    flat = torch.cat(host)
    if device.type == "cuda":
        flat = flat.pin_memory().to(device, non_blocking=True)
    else:
        flat = flat.to(device)
    return list(flat.split([t.numel() for t in host]))


def _row_group(mask: torch.Tensor, new: torch.Tensor, starts: torch.Tensor):
    """The sequences of a host bool mask [B] and their tokens: (seqs, tokens) as slices when
    they are one run of sequences (then their tokens are one run too), else None for the
    caller to upload host index tensors (returned third: sequence ids, token ids)."""
    seqs = mask.nonzero().flatten()
    first, last = int(seqs[0]), int(seqs[-1])
    if last - first + 1 == seqs.numel():
        return slice(first, last + 1), slice(int(starts[first]), int(starts[last] + new[last])), None
    tokens = torch.repeat_interleave(mask, new).nonzero().flatten()
    return None, None, (seqs, tokens)


def _past_rows(block_tables, host_lengths, tpb, device):
    """Where each sequence's K/V rows [0, L) lie in a layer's paged cache, for `_gather`:
    (ids of the blocks to copy, in order; the rows of the copy to keep, None when all are;
    cu_k int32 [n + 1]). Whole blocks are copied first (one index_select of contiguous
    blocks), turned into rows in one transposing copy, and only then are the rows past each
    length dropped: a gather of single positions from the strided cache moved 16 pieces of
    256 bytes per position."""
    count = host_lengths.shape[0]
    nblk = (host_lengths + tpb - 1) // tpb
    first_block = torch.cumsum(nblk, 0) - nblk
    seq_of_block = torch.repeat_interleave(torch.arange(count), nblk)
    column = torch.arange(int(nblk.sum())) - first_block[seq_of_block]
    ends = torch.cumsum(host_lengths, 0)
    host = [seq_of_block, column, torch.cat([ends.new_zeros(1), ends])]
    whole_blocks = bool((host_lengths % tpb == 0).all())
    if not whole_blocks:  # row r < L of sequence i is row first_block[i] * tpb + r of the copy
        host.append(torch.arange(int(ends[-1])) + (first_block * tpb - (ends - host_lengths))
                    .repeat_interleave(host_lengths))
    uploaded = _upload(device, *host)
    ids = block_tables[uploaded[0], uploaded[1]].long()
    return ids, (None if whole_blocks else uploaded[3]), uploaded[2].to(torch.int32)


def _gather(cache, ids, rows, kv_scale=None, dtype=None):
    """The K/V rows `_past_rows` located, packed: (keys, values [sum L, KV, D] views); codes
    (kv_scale given) are dequantized in float32, as the reference does, then rounded once to `dtype`."""
    copy = cache.index_select(0, ids).permute(0, 3, 1, 2, 4).reshape(-1, 2, cache.shape[2], cache.shape[4])
    if rows is not None:
        copy = copy.index_select(0, rows)
    if kv_scale is not None:
        copy = dequantize_kv(copy, kv_scale.view(1, 2, 1, 1), dtype)
    return copy[:, 0], copy[:, 1]


@dataclass
class _StepPlan:
    """Everything a mixed step's attention derives from the step's lengths and block tables,
    the same in every layer: built by the first layer's call and reused by the others (an 8B
    model paid this host bookkeeping and its uploads 32 times a step)."""
    cu_seqlens: torch.Tensor              # int32 [B + 1]: each sequence's new tokens
    past: torch.Tensor                    # int32 [B]: tokens cached before this step
    decode: Optional[tuple]               # (tokens, block tables, lengths) of the decode rows
    other: Optional[tuple]                # (tokens, cu_q, max_q, max_k, fresh, past rows, window_left)
    decode_first: bool                    # decode rows' tokens, then the others', in one run each


_plan: Optional[tuple[tuple, _StepPlan]] = None  # ((the step's inputs, host copies), its plan)


def _step_plan(block_tables, sequence_lengths, context_lengths, host_new, host_lengths, tpb, sliding_window,
               device, quantized) -> _StepPlan:
    # The layers of one step get the very same tensors; a later step new ones (the step runner
    # makes them per step). The host lengths are compared by value as well, so a caller that
    # refills its tensors in place cannot be handed a stale plan.
    global _plan
    key = (host_new, host_lengths, block_tables, sequence_lengths, context_lengths, tpb, sliding_window, quantized)
    if _plan is not None:
        (old, new_copy, lengths_copy), plan = _plan
        if (all(a is b for a, b in zip(old, key)) and torch.equal(new_copy, host_new)
                and torch.equal(lengths_copy, host_lengths)):
            return plan
    batch = host_new.shape[0]
    cu_seqlens = torch.zeros(batch + 1, dtype=torch.int32, device=device)
    torch.cumsum(context_lengths, 0, dtype=torch.int32, out=cu_seqlens[1:])
    past = sequence_lengths - context_lengths

    # Host bookkeeping (CPU tensors, no sync): which sequences are decode rows.
    new = host_new.to(torch.int64)
    lengths = host_lengths.to(torch.int64)
    starts = torch.cumsum(new, 0) - new
    decode_rows = new == 1
    if tpb & (tpb - 1):  # the decode kernel takes power-of-two blocks only: all go the varlen way
        decode_rows = torch.zeros_like(decode_rows)
    others = (new > 0) & ~decode_rows
    groups, to_upload = [], []
    for mask in (decode_rows, others):
        if not bool(mask.any()):
            groups.append(None)
            continue
        seqs, tokens, host_index = _row_group(mask, new, starts)
        groups.append([seqs, tokens, mask])
        if host_index is not None:
            to_upload.extend(host_index)
    uploaded = iter(_upload(device, *to_upload))
    for group in groups:
        if group is not None and group[0] is None:
            group[0], group[1] = next(uploaded), next(uploaded)

    decode = other = None
    if groups[0] is not None:
        seqs, tokens, _ = groups[0]
        decode = (tokens, block_tables[seqs].contiguous(), sequence_lengths[seqs].contiguous())
    if groups[1] is not None:
        seqs, tokens, mask = groups[1]
        group_new, group_lengths = new[mask], lengths[mask]
        cu_q = torch.zeros(group_new.shape[0] + 1, dtype=torch.int32, device=device)
        torch.cumsum(context_lengths[seqs], 0, dtype=torch.int32, out=cu_q[1:])
        max_q, max_k = int(group_new.max()), int(group_lengths.max())
        # Prompts only: their own k/v (a quantized cache's prompts read their rows' codes back).
        fresh = not quantized and torch.equal(group_new, group_lengths)
        rows = None if fresh else _past_rows(block_tables[seqs], group_lengths, tpb, device)
        window_left = -1 if sliding_window is None or max_k <= sliding_window else sliding_window - 1
        other = (tokens, cu_q, max_q, max_k, fresh, rows, window_left)
    decode_first = (decode is not None and other is not None and isinstance(decode[0], slice)
                    and isinstance(other[0], slice) and decode[0].start == 0 and decode[0].stop == other[0].start)
    plan = _StepPlan(cu_seqlens, past, decode, other, decode_first)
    _plan = ((key, host_new.clone(), host_lengths.clone()), plan)
    return plan


def _mixed_step(qh, kh, vh, cache, kv_scale, block_tables, sequence_lengths, context_lengths, position_ids,
                rotary_cos_sin, rotary_is_neox, host_new, host_lengths, scale, sliding_window):
    """A step of any mix of decode rows (one new token) and prompts or prompt chunks (several,
    maybe over a cached past), with no per-sequence loop: rotate every token and write every
    new K/V row (one launch each); the decode rows through the decode-attention kernel; the
    other sequences through one varlen flash-attention call over their whole [0, L) K/V (a
    prompt's own k/v when no sequence has a past, else gathered from the paged cache)."""
    num_tokens, num_heads, head_dim = qh.shape
    plan = _step_plan(block_tables, sequence_lengths, context_lengths, host_new, host_lengths, cache.shape[3],
                      sliding_window, qh.device, kv_scale is not None)
    if rotary_cos_sin is not None:
        rotary_embedding_cuda_(qh, kh, position_ids, rotary_cos_sin, rotary_is_neox)
    paged_kv_write_cuda_(kh, vh, cache, block_tables, plan.cu_seqlens, plan.past, kv_scale)

    outs = []
    if plan.decode is not None:  # decode rows: the cache already holds their K/V rows
        tokens, tables, lengths = plan.decode
        outs.append((tokens, decode_attention_cuda(qh[tokens], cache, tables, lengths, scale, None,
                                                   sliding_window or 0, kv_scale=kv_scale)))
    if plan.other is not None:
        tokens, cu_q, max_q, max_k, fresh, rows, window_left = plan.other
        if fresh:
            keys, values, cu_k = kh[tokens], vh[tokens], cu_q
        else:  # every sequence's [0, L) rows, gathered through its block table (this step's included)
            ids, keep, cu_k = rows
            keys, values = _gather(cache, ids, keep, kv_scale, qh.dtype)
        outs.append((tokens, _flash_varlen(qh[tokens], keys, values, cu_q, cu_k, max_q, max_k, scale,
                                           window_left)))

    if len(outs) == 1:  # one group holds every token
        return outs[0][1].reshape(num_tokens, num_heads * head_dim)
    (dec_tokens, dec_out), (other_tokens, other_out) = outs
    if plan.decode_first:  # (the executor's order)
        return torch.cat((dec_out, other_out)).view(num_tokens, num_heads * head_dim)
    out = qh.new_empty(num_tokens, num_heads, head_dim)
    out[dec_tokens] = dec_out
    out[other_tokens] = other_out
    return out.view(num_tokens, num_heads * head_dim)


def decode_step_serves(q, block_tables, num_heads, num_kv_heads, head_dim, quantized) -> bool:
    """Whether gpt_attention_cuda runs a step of q [tokens, H * D] as one decode-attention launch
    (decode_step_cuda): the kernel covers the heads and every sequence has one new token."""
    return (_kernel_covers(q, num_heads, num_kv_heads, head_dim, quantized)
            and q.shape[0] == block_tables.shape[0])


def decode_step_cuda(q, k, v, kv_cache_pool, block_tables, sequence_lengths, alibi_slopes, rotary_cos_sin,
                     kv_cache_scale, *, layer_idx, num_heads, num_kv_heads, head_dim, scale, sliding_window,
                     rotary_is_neox, input_scale=None):
    """gpt_attention's decode step (a call decode_step_serves) as one launch: rotate q / k (decode
    positions are sequence_lengths - 1, as the runtime feeds them), write the new K/V rows,
    attend. -> [tokens, H * D] in q's dtype, or (input_scale given) its E4M3 codes (uint8) for
    the FP8 linear that reads them."""
    tokens = q.shape[0]
    out = decode_attention_cuda(q.view(tokens, num_heads, head_dim), kv_cache_pool[layer_idx], block_tables,
                                sequence_lengths, 1.0 / math.sqrt(head_dim) if scale is None else scale, alibi_slopes,
                                sliding_window or 0, k.view(tokens, num_kv_heads, head_dim),
                                v.view(tokens, num_kv_heads, head_dim), rotary_cos_sin, rotary_is_neox, kv_cache_scale,
                                input_scale,
                                _cache_written_before_launch and torch.cuda.is_current_stream_capturing())
    return out.view(tokens, num_heads * head_dim)


@gpt_attention.implementation(CUDA)
def gpt_attention_cuda(q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths, host_context_lengths,
                       alibi_slopes=None, position_ids=None, rotary_cos_sin=None, host_sequence_lengths=None,
                       kv_cache_scale=None, *, layer_idx, num_heads, num_kv_heads, head_dim, tokens_per_block,
                       scale=None, sliding_window=None, rotary_dim=0, rotary_is_neox=True):
    def on_reference():
        return gpt_attention_reference(
            q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths, host_context_lengths,
            alibi_slopes, position_ids, rotary_cos_sin, host_sequence_lengths, kv_cache_scale, layer_idx=layer_idx,
            num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, tokens_per_block=tokens_per_block,
            scale=scale, sliding_window=sliding_window, rotary_dim=rotary_dim, rotary_is_neox=rotary_is_neox)

    quantized = kv_cache_scale is not None
    if not _kernel_covers(q, num_heads, num_kv_heads, head_dim, quantized):
        return on_reference()
    num_tokens, batch = q.shape[0], block_tables.shape[0]
    # q, k, v are column slices of the packed QKV projection: head views, no copies.
    qh = q.view(num_tokens, num_heads, head_dim)
    kh = k.view(num_tokens, num_kv_heads, head_dim)
    vh = v.view(num_tokens, num_kv_heads, head_dim)
    cache = kv_cache_pool[layer_idx]
    softmax_scale = 1.0 / math.sqrt(head_dim) if scale is None else scale

    if num_tokens == batch:  # every sequence has >= 1 new token, so this is one each: decode
        return decode_step_cuda(q, k, v, kv_cache_pool, block_tables, sequence_lengths, alibi_slopes, rotary_cos_sin,
                                kv_cache_scale, layer_idx=layer_idx, num_heads=num_heads, num_kv_heads=num_kv_heads,
                                head_dim=head_dim, scale=scale, sliding_window=sliding_window,
                                rotary_is_neox=rotary_is_neox)

    # Mixed steps (decode rows beside prompts or prompt chunks over a cached past) and prompt
    # steps: the host lengths say which rows are which without a sync.
    if (host_sequence_lengths is not None and alibi_slopes is None and _varlen_ready(q)
            and (sliding_window is None
                 or (sliding_window > 0 and (int(host_sequence_lengths.max()) <= sliding_window
                                             or "window_size_left" in _flash_schema())))):
        return _mixed_step(qh, kh, vh, cache, kv_cache_scale, block_tables, sequence_lengths, context_lengths,
                           position_ids, rotary_cos_sin, rotary_is_neox, host_context_lengths,
                           host_sequence_lengths, softmax_scale, sliding_window)

    new = host_context_lengths.tolist()
    fresh = (host_sequence_lengths is not None and host_sequence_lengths.tolist() == new
             and alibi_slopes is None and (sliding_window is None or max(new) <= sliding_window))
    if not fresh or quantized:  # some prompt reads cached rows (codes read back): the reference does it
        return on_reference()
    if rotary_cos_sin is not None:
        rotary_embedding_cuda_(qh, kh, position_ids, rotary_cos_sin, rotary_is_neox)
    cu_seqlens = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    torch.cumsum(context_lengths, 0, out=cu_seqlens[1:])
    paged_kv_write_cuda_(kh, vh, cache, block_tables, cu_seqlens, sequence_lengths - context_lengths)
    gqa = num_heads != num_kv_heads
    if len(set(new)) == 1:  # prompts of one length: one batched call
        n = new[0]

        def heads(t):
            return t.view(batch, n, t.shape[1], head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(heads(qh), heads(kh), heads(vh), is_causal=True, scale=softmax_scale,
                                           enable_gqa=gqa)
        return o.transpose(1, 2).reshape(num_tokens, num_heads * head_dim)
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    start = 0
    for n in new:  # each prompt attends to itself only: causal SDPA on its rows
        rows = slice(start, start + n)
        o = F.scaled_dot_product_attention(qh[rows].transpose(0, 1), kh[rows].transpose(0, 1),
                                           vh[rows].transpose(0, 1), is_causal=True, scale=softmax_scale,
                                           enable_gqa=gqa)
        out[rows] = o.transpose(0, 1)
        start += n
    return out.view(num_tokens, num_heads * head_dim)
