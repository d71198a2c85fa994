"""`REFERENCE_OPS`: the meaning of every graph op in plain PyTorch.

`REFERENCE_OPS[op](*inputs, **attrs)` returns a tensor, or a tuple with one tensor per
layer output. They run on CPU and CUDA in float32/float16/bfloat16; norms, softmax and
rotary embedding compute in float32 and return the input dtype. They are also the CPU
runtime, so the hot ones (attention, rotary, norms, linear, embedding) avoid needless
copies. `constant` layers have no entry: executors read `network.weights` directly.
"""
from __future__ import annotations

import builtins
import math
from typing import Callable

import torch
import torch.nn.functional as F

from ._utils import keep_freed_host_memory, str_dtype_to_torch

# These ops are the CPU runtime: their large temporaries must not page-fault on every call.
keep_freed_host_memory()


def embedding(ids, weight):
    return weight.index_select(0, ids.reshape(-1)).view(*ids.shape, weight.shape[1])


def matmul(a, b, *, transa=False, transb=False):
    return torch.matmul(a.mT if transa else a, b.mT if transb else b)


def linear(x, weight, bias=None):
    return F.linear(x, weight, bias)


def rms_norm(x, weight=None, *, eps):
    if x.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    # Half precision: normalise in float32, round, then scale (Hugging Face's order).
    xf = x.float()
    out = (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).to(x.dtype)
    return out if weight is None else out * weight


def fused_add_rms_norm(x, residual, weight=None, *, eps):
    total = x + residual
    return rms_norm(total, weight, eps=eps), total


def layer_norm(x, weight=None, bias=None, *, eps):
    h = x.shape[-1:]
    w = None if weight is None else weight.float()
    b = None if bias is None else bias.float()
    return F.layer_norm(x.float(), h, w, b, eps).to(x.dtype)


def softmax(x, *, dim):
    return torch.softmax(x, dim, dtype=torch.float32).to(x.dtype)


def silu_and_mul(x):
    half = x.shape[-1] // 2
    return F.silu(x[..., :half]) * x[..., half:]


def gelu_and_mul(x, *, approximate="none"):
    half = x.shape[-1] // 2
    return F.gelu(x[..., :half], approximate=approximate) * x[..., half:]


# A norm or gated activation and the linear reading it: the unfused ops composed, so the
# fused graph gives the unfused graph's numbers bit for bit.


def rms_norm_linear(x, norm_weight, weight, bias=None, *, eps):
    return linear(rms_norm(x, norm_weight, eps=eps), weight, bias)


def add_rms_norm_linear(x, residual, norm_weight, weight, bias=None, *, eps):
    normed, total = fused_add_rms_norm(x, residual, norm_weight, eps=eps)
    return linear(normed, weight, bias), total


def silu_and_mul_linear(x, weight, bias=None):
    return linear(silu_and_mul(x), weight, bias)


def rotary_embedding(x, position_ids, cos_sin_cache, *, num_heads, head_dim, rotary_dim, is_neox):
    """Rotate each head's first rotary_dim dims by its token's position (in float32)."""
    num_tokens = x.shape[0]
    heads = x.reshape(num_tokens, num_heads, head_dim)
    cos, sin = cos_sin_cache.index_select(0, position_ids).unsqueeze(1).chunk(2, dim=-1)  # [T, 1, r/2]
    rot = heads[..., :rotary_dim].float()
    if is_neox:  # halves
        x1, x2 = rot.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:  # interleaved pairs
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    out = out.to(x.dtype)
    if rotary_dim < head_dim:
        out = torch.cat((out, heads[..., rotary_dim:]), dim=-1)
    return out.view(num_tokens, num_heads * head_dim)


# ---- paged attention ---------------------------------------------------------------------


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
    holding positions 0..S-1 (finite everywhere). Key j is visible to a query at p when
    p - window < j <= p. Returns [B, Tq, Hq * D], computed in float32."""
    batch, num_q, num_heads, _ = q.shape
    kv_heads, num_keys = kv.shape[1], kv.shape[3]
    group = num_heads // kv_heads
    kv = kv.float()
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


def _attend_decode_same_length(q, cache, block_tables, length, scale, sliding_window):
    """Decode where every sequence holds `length` tokens: each query sees exactly positions
    [length - window, length), so reading just those needs neither a mask nor clearing."""
    tpb = cache.shape[3]
    start = 0 if sliding_window is None else max(0, length - sliding_window)
    first_block = start // tpb
    kv = _gather_kv(cache, block_tables[:, first_block:-(-length // tpb)])
    kv = kv[:, :, :, start - first_block * tpb:length - first_block * tpb].float()
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
        return (rotary_embedding(q, position_ids, cos_sin, num_heads=num_heads, head_dim=head_dim,
                                 rotary_dim=rotary_dim, is_neox=is_neox),
                rotary_embedding(k, position_ids, cos_sin, num_heads=num_kv_heads, head_dim=head_dim,
                                 rotary_dim=rotary_dim, is_neox=is_neox))
    qk = q.as_strided((q.shape[0], q_cols + k.shape[1]), q.stride())
    rotated = rotary_embedding(qk, position_ids, cos_sin, num_heads=num_heads + num_kv_heads, head_dim=head_dim,
                               rotary_dim=rotary_dim, is_neox=is_neox)
    return rotated[:, :q_cols], rotated[:, q_cols:]


def gpt_attention(q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths, host_context_lengths,
                  alibi_slopes=None, position_ids=None, rotary_cos_sin=None, host_sequence_lengths=None, *,
                  layer_idx, num_heads, num_kv_heads,
                  head_dim, tokens_per_block, scale=None, sliding_window=None, rotary_dim=0, rotary_is_neox=True):
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
    if decode and lengths is not None:
        _write_kv_decode_host(cache, k, v, block_tables, lengths, tokens_per_block)
    else:
        _write_kv(cache, k, v, block_tables, sequence_lengths, context_lengths, tokens_per_block, decode)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    queries = q.reshape(num_tokens, 1, num_heads, head_dim)

    def gathered(rows: builtins.slice):
        if lengths is None:
            return _clear_past_end(_gather_kv(cache, block_tables[rows]), sequence_lengths[rows])
        used = lengths[rows]
        return _clear_past_end(_gather_kv(cache, block_tables[rows, :-(-max(used) // tokens_per_block)]), used)

    if decode:  # all sequences at once, each query at its sequence's last position
        if lengths is not None and alibi_slopes is None and len(set(lengths)) == 1:
            out = _attend_decode_same_length(queries, cache, block_tables, lengths[0], scale, sliding_window)
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


# ---- shape manipulation -------------------------------------------------------------------


def concat(*xs, dim):
    return torch.cat(xs, dim)


def split(x, *, sizes, dim):
    return tuple(torch.split(x, sizes, dim))


def slice_(x, *, dim, start, end=None):
    return x[(builtins.slice(None),) * dim + (builtins.slice(start, end),)]


def view(x, *, shape):
    return x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(shape)])


def squeeze(x, *, dim):
    if x.shape[dim] != 1:
        raise ValueError(f"squeeze: dim {dim} of {list(x.shape)} is not 1")
    return x.squeeze(dim)


def allreduce(x):
    """Sum over the default process group once torch.distributed runs with > 1 ranks."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return x
    out = x.clone()
    dist.all_reduce(out)
    return out


REFERENCE_OPS: dict[str, Callable] = {
    "embedding": embedding,
    "matmul": matmul,
    "linear": linear,
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "pow": lambda x, *, exponent: torch.pow(x, exponent),
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "softmax": softmax,
    "layer_norm": layer_norm,
    "rms_norm": rms_norm,
    "fused_add_rms_norm": fused_add_rms_norm,
    "silu_and_mul": silu_and_mul,
    "gelu_and_mul": gelu_and_mul,
    "rms_norm_linear": rms_norm_linear,
    "add_rms_norm_linear": add_rms_norm_linear,
    "silu_and_mul_linear": silu_and_mul_linear,
    "rotary_embedding": rotary_embedding,
    "gpt_attention": gpt_attention,
    "concat": concat,
    "split": split,
    "slice": slice_,
    "view": view,
    "transpose": lambda x, *, dim0, dim1: x.transpose(dim0, dim1),
    "permute": lambda x, *, dims: x.permute(dims),
    "unsqueeze": lambda x, *, dim: x.unsqueeze(dim),
    "squeeze": squeeze,
    "gather": lambda x, index, *, dim: torch.gather(x, dim, index.long()),
    "index_select": lambda x, index, *, dim: torch.index_select(x, dim, index),
    "cast": lambda x, *, dtype: x.to(str_dtype_to_torch(dtype)),
    "where": torch.where,
    "argmax": lambda x, *, dim, keepdim=False: torch.argmax(x, dim, keepdim),
    "allreduce": allreduce,
}
