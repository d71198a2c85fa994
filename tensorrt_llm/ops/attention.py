"""gpt_attention: causal attention over a paged KV cache, which it fills (docs/architecture.md).

Its reference reads the cache through the block tables in plain PyTorch (softmax in float32);
it is also the CPU runtime of prompt steps, so the decode path avoids needless copies. CPU decode
steps in float32 run the host kernel (kernels/host_decode_attention.cpp: rotation, the K/V write
and the attention of each sequence in one loop). The CUDA implementation (paged decode-attention
kernel, varlen flash attention) is in attention_cuda.py.

A quantized KV cache (an int8 or uint8 pool with `kv_cache_scale`, quantization/formats.py):
the new rows are written as codes, and every row attention reads is dequantized to float32
(code * scale) first, this step's rows included.
"""
from __future__ import annotations

import builtins
import math
from typing import Optional

import torch
import torch.nn.functional as F

from .._utils import is_floating
from ..network import Tensor, shapes_compatible
from ..quantization.formats import dequantize_kv, kv_cache_algo_of, quantize_kv
from .launch import bindings_available, launch
from .op import CPU, REFERENCE, add_layer, check_int, check_same_dtype, check_shape, define
from .rotary import rotary_embedding_reference

KV_CODE_DTYPES = ("int8", "uint8")  # a quantized pool's dtypes (INT8 codes, FP8 bytes)


@define(side_effects=True)
def gpt_attention(q: Tensor, k: Tensor, v: Tensor, kv_cache_pool: Tensor, block_tables: Tensor,
                  sequence_lengths: Tensor, context_lengths: Tensor, host_context_lengths: Tensor,
                  alibi_slopes: Optional[Tensor] = None, position_ids: Optional[Tensor] = None,
                  rotary_cos_sin: Optional[Tensor] = None, host_sequence_lengths: Optional[Tensor] = None,
                  kv_cache_scale: Optional[Tensor] = None, *,
                  layer_idx: int, num_heads: int, num_kv_heads: int,
                  head_dim: int, tokens_per_block: int, scale: Optional[float] = None,
                  sliding_window: Optional[int] = None, rotary_dim: int = 0, rotary_is_neox: bool = True) -> Tensor:
    """Causal attention over a paged KV cache; writes this step's K/V into
    kv_cache_pool[layer_idx] first (see docs/architecture.md). With `rotary_cos_sin` (and
    `position_ids`), q and k are first rotated as `rotary_embedding` would (the fused form
    the builder's fuse_rope_attention pass makes, so a kernel can rotate in the same pass).
    `host_sequence_lengths` (CPU) lets an implementation see, without a device sync, which
    sequences have no cached past (a prompt's first step). `kv_cache_scale` (float32 [2], the K
    and V scales) goes with a pool of 1-byte codes: int8 (INT8) or uint8 (FP8 E4M3 bytes)."""
    dtype, num_tokens, attrs = check_attention(
        "gpt_attention", q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths, host_context_lengths,
        alibi_slopes, position_ids, rotary_cos_sin, host_sequence_lengths, kv_cache_scale, layer_idx=layer_idx,
        num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, tokens_per_block=tokens_per_block,
        scale=scale, sliding_window=sliding_window, rotary_dim=rotary_dim, rotary_is_neox=rotary_is_neox)
    inputs = [q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths, host_context_lengths,
              alibi_slopes, position_ids, rotary_cos_sin]
    if host_sequence_lengths is not None or kv_cache_scale is not None:
        inputs.append(host_sequence_lengths)
    if kv_cache_scale is not None:
        inputs.append(kv_cache_scale)
    return add_layer("gpt_attention", inputs, [(dtype, (num_tokens, num_heads * head_dim))], **attrs)


def check_attention(op, q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths, host_context_lengths,
                    alibi_slopes, position_ids, rotary_cos_sin, host_sequence_lengths, kv_cache_scale, *, layer_idx,
                    num_heads, num_kv_heads, head_dim, tokens_per_block, scale, sliding_window, rotary_dim,
                    rotary_is_neox) -> tuple[str, int, dict]:
    """gpt_attention's checks of its operands (graph tensors), for it and for the ops with an
    attention in front (`op` names the op in the messages): -> (dtype, number of tokens, the
    layer's attrs)."""
    if num_heads % num_kv_heads:
        raise ValueError(f"{op}: num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if kv_cache_scale is None:
        dtype = check_same_dtype(op, q, k, v, kv_cache_pool)
    else:
        dtype = check_same_dtype(op, q, k, v)
        if kv_cache_pool.dtype not in KV_CODE_DTYPES:
            raise ValueError(f"{op}: with kv_cache_scale the pool holds 1-byte codes (int8, or uint8 FP8 bytes), "
                             f"got {kv_cache_pool.dtype}")
        if kv_cache_scale.dtype != "float32" or tuple(kv_cache_scale.shape) != (2,):
            raise ValueError(f"{op}: kv_cache_scale must be float32 [2] (K and V scales), got "
                             f"{kv_cache_scale.dtype} {list(kv_cache_scale.shape)}")
    num_tokens = q.shape[0] if q.ndim == 2 else -1
    check_shape(op, q, (num_tokens, num_heads * head_dim), "q")
    check_shape(op, k, (num_tokens, num_kv_heads * head_dim), "k")
    check_shape(op, v, (num_tokens, num_kv_heads * head_dim), "v")
    pool = kv_cache_pool.shape
    if len(pool) != 6 or not shapes_compatible(pool[2:], (2, num_kv_heads, tokens_per_block, head_dim)):
        raise ValueError(f"{op}: kv_cache_pool must be [num_layers, num_blocks, 2, {num_kv_heads}, "
                         f"{tokens_per_block}, {head_dim}], got {list(pool)}")
    if pool[0] != -1 and not 0 <= layer_idx < pool[0]:
        raise ValueError(f"{op}: layer_idx {layer_idx} out of range for a pool of {pool[0]} layers")
    for t, rank in ((block_tables, 2), (sequence_lengths, 1), (context_lengths, 1), (host_context_lengths, 1)):
        if t.dtype != "int32" or t.ndim != rank:
            raise ValueError(f"{op}: {t.name} must be int32 of rank {rank}, got {t.dtype} {list(t.shape)}")
    batch = block_tables.shape[:1]
    for t in (sequence_lengths, context_lengths, host_context_lengths):
        check_shape(op, t, batch, t.name)
    if alibi_slopes is not None:
        if not is_floating(alibi_slopes.dtype):
            raise ValueError(f"{op}: alibi_slopes must be floating, got {alibi_slopes.dtype}")
        check_shape(op, alibi_slopes, (num_heads,), "alibi_slopes")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"{op}: sliding_window must be >= 1, got {sliding_window}")
    rotary = {}
    if (position_ids is None) != (rotary_cos_sin is None):
        raise ValueError(f"{op}: position_ids and rotary_cos_sin are given together or not at all")
    if rotary_cos_sin is not None:
        check_int(op, position_ids, "position_ids")
        check_shape(op, position_ids, (num_tokens,), "position_ids")
        if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(f"{op}: rotary_dim must be even and in (0, {head_dim}], got {rotary_dim}")
        check_shape(op, rotary_cos_sin, (-1, rotary_dim), "rotary_cos_sin")
        rotary = dict(rotary_dim=int(rotary_dim), rotary_is_neox=bool(rotary_is_neox))
    if host_sequence_lengths is not None:
        if host_sequence_lengths.dtype != "int32" or host_sequence_lengths.ndim != 1:
            raise ValueError(f"{op}: host_sequence_lengths must be int32 of rank 1, got "
                             f"{host_sequence_lengths.dtype} {list(host_sequence_lengths.shape)}")
        check_shape(op, host_sequence_lengths, batch, "host_sequence_lengths")
    attrs = dict(layer_idx=int(layer_idx), num_heads=int(num_heads), num_kv_heads=int(num_kv_heads),
                 head_dim=int(head_dim), tokens_per_block=int(tokens_per_block),
                 scale=None if scale is None else float(scale),
                 sliding_window=None if sliding_window is None else int(sliding_window), **rotary)
    return dtype, num_tokens, attrs


def _codes(x, pool_dtype, kv_scale, which):
    """K (which 0) or V (1) rows as the pool stores them: themselves, or the bytes of their
    codes under kv_scale[which]."""
    if kv_scale is None:
        return x
    return quantize_kv(x, kv_scale[which], kv_cache_algo_of(pool_dtype)).view(pool_dtype)


def _values(kv, kv_scale):
    """Gathered rows [2, ...] as float32 values: codes dequantized, K by the K scale, V by the V scale."""
    if kv_scale is None:
        return kv.float()
    return dequantize_kv(kv, kv_scale.float().view(2, *([1] * (kv.dim() - 1))))


def _write_kv(cache, k, v, block_tables, sequence_lengths, context_lengths, tokens_per_block, decode):
    """Token t of sequence b goes to position p = past_b + i: block block_tables[b, p // tpb],
    slot p % tpb of cache [num_blocks, 2, KV, tpb, D]."""
    num_tokens = k.shape[0]
    device = k.device
    if decode:  # one new token per sequence: token b is sequence b's last position
        seq_of_token = torch.arange(num_tokens, device=device)
        positions = sequence_lengths - 1
    else:
        seq_of_token = torch.repeat_interleave(torch.arange(context_lengths.shape[0], device=device),
                                               context_lengths, output_size=num_tokens)
        first_token = torch.cumsum(context_lengths, 0) - context_lengths
        past = sequence_lengths - context_lengths
        positions = (past - first_token)[seq_of_token] + torch.arange(num_tokens, device=device)
    blocks = block_tables[seq_of_token, positions // tokens_per_block]
    kv_heads, head_dim = cache.shape[2], cache.shape[4]
    rows = torch.stack((k.reshape(num_tokens, kv_heads, head_dim), v.reshape(num_tokens, kv_heads, head_dim)), 1)
    cache.permute(0, 3, 1, 2, 4)[blocks, positions % tokens_per_block] = rows  # [block, slot] -> [2, KV, D]


def _write_kv_decode_host(cache, k, v, block_tables, lengths, tokens_per_block):
    """The decode write on the CPU, where lengths are host values: one row per sequence
    by plain indexing, far fewer ops than the general scatter."""
    kv_heads, head_dim = cache.shape[2], cache.shape[4]
    k = k.reshape(-1, kv_heads, head_dim)
    v = v.reshape(-1, kv_heads, head_dim)
    for b, n in enumerate(lengths):
        block, slot = int(block_tables[b, (n - 1) // tokens_per_block]), (n - 1) % tokens_per_block
        cache[block, 0, :, slot] = k[b]
        cache[block, 1, :, slot] = v[b]


def _gather_kv(cache, block_tables):
    """Keys and values [2, KV, B, nb * tpb, D] of the blocks in block_tables [B, nb], in one
    gather straight into the layout the attention reads."""
    batch, num_blocks = block_tables.shape
    _, _, kv_heads, tpb, head_dim = cache.shape
    kv = cache.permute(1, 2, 0, 3, 4).index_select(2, block_tables.reshape(-1))  # [2, KV, B * nb, tpb, D]
    return kv.view(2, kv_heads, batch, num_blocks * tpb, head_dim)


def _clear_past_end(kv, lengths):
    """Zero gathered slots at or past each sequence's length: they hold whatever the pool
    held (uninitialised memory may be NaN), and a zero probability times NaN is NaN.
    `lengths`: a host list (slice fills) or a device tensor (a mask, no sync)."""
    if isinstance(lengths, list):
        for b, n in enumerate(lengths):
            kv[:, :, b, n:] = 0
    else:
        past_end = torch.arange(kv.shape[3], device=kv.device) >= lengths.unsqueeze(1)
        kv.masked_fill_(past_end.view(1, 1, kv.shape[2], -1, 1), 0.0)
    return kv


def _group_queries(q, kv_heads):
    """q [B, Tq, Hq, D] -> [KV, B, G * Tq, D] in float32: query heads h = kv * G + g read KV
    head kv, so KV heads become the batch dim and each group's queries the rows, ordered (g, t)."""
    batch, num_q, num_heads, head_dim = q.shape
    group = num_heads // kv_heads
    qf = q.float().view(batch, num_q, kv_heads, group, head_dim).permute(2, 0, 3, 1, 4)
    return qf.reshape(kv_heads, batch, group * num_q, head_dim)


def _ungroup(out, num_q, dtype):
    """[KV, B, G * Tq, D] -> [B, Tq, Hq * D]."""
    kv_heads, batch, rows, head_dim = out.shape
    group = rows // num_q
    out = out.view(kv_heads, batch, group, num_q, head_dim).permute(1, 3, 0, 2, 4)
    return out.reshape(batch, num_q, kv_heads * group * head_dim).to(dtype)


def _attend(q, kv, q_positions, scale, alibi_slopes, sliding_window):
    """q [B, Tq, Hq, D] at absolute positions q_positions [B, Tq] over kv [2, KV, B, S, D]
    (float32) holding positions 0..S-1 (finite everywhere). Key j is visible to a query at p when
    p - window < j <= p. Returns [B, Tq, Hq * D], computed in float32."""
    batch, num_q, num_heads, _ = q.shape
    kv_heads, num_keys = kv.shape[1], kv.shape[3]
    group = num_heads // kv_heads
    distance = torch.arange(num_keys, device=q.device) - q_positions.unsqueeze(-1)  # j - p, [B, Tq, S]
    visible = distance <= 0
    if sliding_window is not None:
        visible &= distance > -sliding_window
    if alibi_slopes is None:
        mask = visible.unsqueeze(1).expand(batch, group, num_q, num_keys) if num_q > 1 else visible
        mask = mask.reshape(1, batch, -1, num_keys)
    else:
        bias = alibi_slopes.float().view(kv_heads, 1, group, 1, 1) * distance.unsqueeze(1)  # [KV, B, G, Tq, S]
        mask = bias.masked_fill_(~visible.unsqueeze(1), float("-inf")).view(kv_heads, batch, group * num_q, num_keys)
    out = F.scaled_dot_product_attention(_group_queries(q, kv_heads), kv[0], kv[1], attn_mask=mask, scale=scale)
    return _ungroup(out, num_q, q.dtype)


def _attend_decode_same_length(q, cache, kv_scale, block_tables, length, scale, sliding_window):
    """Decode where every sequence holds `length` tokens: each query sees exactly positions
    [length - window, length), so reading just those needs neither a mask nor clearing."""
    tpb = cache.shape[3]
    start = 0 if sliding_window is None else max(0, length - sliding_window)
    first_block = start // tpb
    kv = _gather_kv(cache, block_tables[:, first_block:-(-length // tpb)])
    kv = _values(kv[:, :, :, start - first_block * tpb:length - first_block * tpb], kv_scale)
    out = F.scaled_dot_product_attention(_group_queries(q, kv.shape[1]), kv[0], kv[1], scale=scale)
    return _ungroup(out, 1, q.dtype)


def _rotate_q_and_k(q, k, position_ids, cos_sin, num_heads, num_kv_heads, head_dim, rotary_dim, is_neox):
    """rotary_embedding of q and of k; one call when k's columns follow q's in one buffer (the
    fused QKV projection's layout), which halves the small ops of a CPU decode step."""
    q_cols = num_heads * head_dim
    adjacent = (q.dim() == 2 and k.dim() == 2 and q.stride() == k.stride() and q.stride(1) == 1
                and q.dtype == k.dtype and q.device == k.device
                and k.data_ptr() == q.data_ptr() + q_cols * q.element_size())
    if not adjacent:
        return (rotary_embedding_reference(q, position_ids, cos_sin, num_heads=num_heads, head_dim=head_dim,
                                           rotary_dim=rotary_dim, is_neox=is_neox),
                rotary_embedding_reference(k, position_ids, cos_sin, num_heads=num_kv_heads, head_dim=head_dim,
                                           rotary_dim=rotary_dim, is_neox=is_neox))
    qk = q.as_strided((q.shape[0], q_cols + k.shape[1]), q.stride())
    rotated = rotary_embedding_reference(qk, position_ids, cos_sin, num_heads=num_heads + num_kv_heads,
                                         head_dim=head_dim, rotary_dim=rotary_dim, is_neox=is_neox)
    return rotated[:, :q_cols], rotated[:, q_cols:]


@gpt_attention.implementation(REFERENCE)
def gpt_attention_reference(q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths,
                            host_context_lengths, alibi_slopes=None, position_ids=None, rotary_cos_sin=None,
                            host_sequence_lengths=None, kv_cache_scale=None, *, layer_idx, num_heads, num_kv_heads,
                            head_dim, tokens_per_block, scale=None, sliding_window=None, rotary_dim=0,
                            rotary_is_neox=True):
    if rotary_cos_sin is not None:
        q, k = _rotate_q_and_k(q, k, position_ids, rotary_cos_sin, num_heads, num_kv_heads, head_dim, rotary_dim,
                               rotary_is_neox)
    num_tokens = q.shape[0]
    cache = kv_cache_pool[layer_idx]
    new_tokens = host_context_lengths.tolist()
    decode = all(n == 1 for n in new_tokens)
    # On the CPU the lengths are free to read: write by plain indexing, gather only the
    # blocks in use. On a GPU reading them would sync, so every block-table column is
    # read and masks do the rest.
    lengths = sequence_lengths.tolist() if sequence_lengths.device.type == "cpu" else None
    k, v = _codes(k, cache.dtype, kv_cache_scale, 0), _codes(v, cache.dtype, kv_cache_scale, 1)
    if decode and lengths is not None:
        _write_kv_decode_host(cache, k, v, block_tables, lengths, tokens_per_block)
    else:
        _write_kv(cache, k, v, block_tables, sequence_lengths, context_lengths, tokens_per_block, decode)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    queries = q.reshape(num_tokens, 1, num_heads, head_dim)

    def gathered(rows: builtins.slice):
        if lengths is None:
            kv = _clear_past_end(_gather_kv(cache, block_tables[rows]), sequence_lengths[rows])
        else:
            used = lengths[rows]
            kv = _clear_past_end(_gather_kv(cache, block_tables[rows, :-(-max(used) // tokens_per_block)]), used)
        return _values(kv, kv_cache_scale)

    if decode:  # all sequences at once, each query at its sequence's last position
        if lengths is not None and alibi_slopes is None and len(set(lengths)) == 1:
            out = _attend_decode_same_length(queries, cache, kv_cache_scale, block_tables, lengths[0], scale,
                                             sliding_window)
        else:
            positions = (sequence_lengths - 1).unsqueeze(1)
            out = _attend(queries, gathered(builtins.slice(None)), positions, scale, alibi_slopes, sliding_window)
        return out.view(num_tokens, num_heads * head_dim)

    outs = []
    start = 0
    for b, n in enumerate(new_tokens):  # host lengths: slicing the packed tokens needs no sync
        positions = (sequence_lengths[b:b + 1] - n + torch.arange(n, device=q.device)).unsqueeze(0)
        out = _attend(queries[start:start + n].view(1, n, num_heads, head_dim), gathered(builtins.slice(b, b + 1)),
                      positions, scale, alibi_slopes, sliding_window)
        outs.append(out.view(n, num_heads * head_dim))
        start += n
    return torch.cat(outs) if outs else q.new_empty(0, num_heads * head_dim)


@gpt_attention.implementation(CPU)
def gpt_attention_cpu(q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths, host_context_lengths,
                      alibi_slopes=None, position_ids=None, rotary_cos_sin=None, host_sequence_lengths=None,
                      kv_cache_scale=None, *, layer_idx, num_heads, num_kv_heads, head_dim, tokens_per_block,
                      scale=None, sliding_window=None, rotary_dim=0, rotary_is_neox=True):
    """Decode steps (one new token per sequence) of a float32 engine in the host kernel, which
    rotates q and k at position sequence_lengths - 1 (as the runtime feeds decode positions),
    writes the step's K/V rows and attends; anything else in the reference."""
    num_tokens = q.shape[0]
    cache = kv_cache_pool[layer_idx]
    if (num_tokens != block_tables.shape[0] or q.dtype != torch.float32 or cache.dtype != torch.float32
            or kv_cache_scale is not None or not bindings_available()
            or (rotary_cos_sin is not None and rotary_cos_sin.shape[1] != rotary_dim)):
        return gpt_attention_reference(
            q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths, host_context_lengths,
            alibi_slopes, position_ids, rotary_cos_sin, host_sequence_lengths, kv_cache_scale, layer_idx=layer_idx,
            num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, tokens_per_block=tokens_per_block,
            scale=scale, sliding_window=sliding_window, rotary_dim=rotary_dim, rotary_is_neox=rotary_is_neox)
    # Every sequence has at least one new token, so as many tokens as sequences is one each.
    qh = q.view(num_tokens, num_heads, head_dim)  # column slices of the packed QKV: views, no copies
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype)
    launch("host_decode_attention", out, qh, cache, block_tables, sequence_lengths,
           None if alibi_slopes is None else alibi_slopes.float().contiguous(),
           1.0 / math.sqrt(head_dim) if scale is None else float(scale), int(sliding_window or 0),
           k.view(num_tokens, num_kv_heads, head_dim), v.view(num_tokens, num_kv_heads, head_dim), rotary_cos_sin,
           bool(rotary_is_neox), torch.get_num_threads())
    return out.view(num_tokens, num_heads * head_dim)
