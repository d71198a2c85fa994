"""Argument checks of the kernel ops, shared by the CPU (reference) and CUDA implementations.

Shapes, strides and devices raise ValueError, dtypes TypeError; each message names the op and
the tensors. The compiled module checks the same again in C++ before any launch.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def _desc(name: str, t: torch.Tensor) -> str:
    return f"{name} ({str(t.dtype).replace('torch.', '')} {list(t.shape)} on {t.device})"


def check_tensors(op: str, **tensors: Optional[torch.Tensor]) -> None:
    """Every argument is a tensor (or None) and all tensors are on one device."""
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if first is None:
            first = (name, t)
        elif t.device != first[1].device:
            raise ValueError(f"{op}: {_desc(name, t)} and {_desc(*first)} are on different devices")


def check_dtype(op: str, name: str, t: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{op}: {name} must be one of {{{names}}}, got {str(t.dtype).replace('torch.', '')}")


def check_same_dtype(op: str, ref_name: str, ref: torch.Tensor, name: str, t: torch.Tensor) -> None:
    if t.dtype != ref.dtype:
        raise TypeError(f"{op}: {name} is {str(t.dtype).replace('torch.', '')} but {ref_name} is "
                        f"{str(ref.dtype).replace('torch.', '')}")


def check_dim(op: str, name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    if t.dim() != ndim:
        raise ValueError(f"{op}: {name} must be {layout}, got shape {list(t.shape)}")


def check_last_dim_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{op}: {name} must be contiguous in its last dimension, got strides {list(t.stride())}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor] = None,
             eps: float = 1e-6) -> None:
    op = "rms_norm"
    check_tensors(op, x=x, weight=weight, residual=residual)
    check_dtype(op, "x", x, FLOAT_DTYPES)
    check_same_dtype(op, "x", x, "weight", weight)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"{op}: x must be [..., hidden] with hidden > 0, got shape {list(x.shape)}")
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"{op}: weight has shape {list(weight.shape)} but x has shape {list(x.shape)} "
                         f"(expected weight [{x.shape[-1]}])")
    if residual is not None:
        check_same_dtype(op, "x", x, "residual", residual)
        if residual.shape != x.shape:
            raise ValueError(f"{op}: residual has shape {list(residual.shape)} but x has shape {list(x.shape)}")
    if not eps >= 0.0 or eps == float("inf"):
        raise ValueError(f"{op}: eps must be finite and >= 0, got {eps}")


def rotary_embedding(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                     cos_sin_cache: torch.Tensor) -> None:
    op = "rotary_embedding"
    check_tensors(op, q=q, k=k, positions=positions, cos_sin_cache=cos_sin_cache)
    check_dtype(op, "q", q, FLOAT_DTYPES)
    check_same_dtype(op, "q", q, "k", k)
    check_dtype(op, "positions", positions, INDEX_DTYPES)
    check_dtype(op, "cos_sin_cache", cos_sin_cache, (torch.float32,))
    check_dim(op, "q", q, 3, "[num_tokens, num_heads, head_dim]")
    check_dim(op, "k", k, 3, "[num_tokens, num_kv_heads, head_dim]")
    check_dim(op, "positions", positions, 1, "[num_tokens]")
    check_dim(op, "cos_sin_cache", cos_sin_cache, 2, "[max_positions, rotary_dim]")
    if k.shape[0] != q.shape[0] or positions.shape[0] != q.shape[0]:
        raise ValueError(f"{op}: token counts differ: q {list(q.shape)}, k {list(k.shape)}, "
                         f"positions {list(positions.shape)}")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"{op}: head sizes differ: q {list(q.shape)}, k {list(k.shape)}")
    rot = cos_sin_cache.shape[1]
    if rot % 2 or rot > q.shape[2]:
        raise ValueError(f"{op}: cos_sin_cache {list(cos_sin_cache.shape)} needs an even rotary_dim <= "
                         f"head_dim {q.shape[2]}")
    check_last_dim_contiguous(op, "q", q)
    check_last_dim_contiguous(op, "k", k)


def act_and_mul(op: str, x: torch.Tensor) -> None:
    check_tensors(op, x=x)
    check_dtype(op, "x", x, FLOAT_DTYPES)
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"{op}: x must be [..., 2 * intermediate] (even last dimension), got {list(x.shape)}")


def gelu_approximate(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu_and_mul: approximate must be 'none' or 'tanh', got {approximate!r}")


def paged_kv_write(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                   cu_seqlens: torch.Tensor, past_lengths: torch.Tensor) -> None:
    op = "paged_kv_write"
    check_tensors(op, key=key, value=value, kv_cache=kv_cache, block_tables=block_tables,
                  cu_seqlens=cu_seqlens, past_lengths=past_lengths)
    check_dtype(op, "key", key, FLOAT_DTYPES)
    check_same_dtype(op, "key", key, "value", value)
    check_same_dtype(op, "key", key, "kv_cache", kv_cache)
    for name, t in (("block_tables", block_tables), ("cu_seqlens", cu_seqlens), ("past_lengths", past_lengths)):
        check_dtype(op, name, t, (torch.int32,))
    check_dim(op, "key", key, 3, "[num_tokens, num_kv_heads, head_dim]")
    if value.shape != key.shape:
        raise ValueError(f"{op}: value has shape {list(value.shape)} but key has shape {list(key.shape)}")
    check_dim(op, "kv_cache", kv_cache, 5, "[num_blocks, 2, num_kv_heads, tokens_per_block, head_dim]")
    _, kv_heads, head_dim = key.shape
    if kv_cache.shape[1] != 2 or kv_cache.shape[2] != kv_heads or kv_cache.shape[4] != head_dim:
        raise ValueError(f"{op}: kv_cache {list(kv_cache.shape)} must be [num_blocks, 2, {kv_heads}, "
                         f"tokens_per_block, {head_dim}] for key {list(key.shape)}")
    if kv_cache.shape[3] == 0:
        raise ValueError(f"{op}: kv_cache has tokens_per_block = 0")
    check_dim(op, "block_tables", block_tables, 2, "[batch, max_blocks_per_seq]")
    batch = block_tables.shape[0]
    if cu_seqlens.shape != (batch + 1,):
        raise ValueError(f"{op}: cu_seqlens has shape {list(cu_seqlens.shape)}, expected [{batch + 1}] for "
                         f"block_tables {list(block_tables.shape)}")
    if past_lengths.shape != (batch,):
        raise ValueError(f"{op}: past_lengths has shape {list(past_lengths.shape)}, expected [{batch}] for "
                         f"block_tables {list(block_tables.shape)}")
    if not kv_cache.is_contiguous():
        raise ValueError(f"{op}: kv_cache must be contiguous")
    check_last_dim_contiguous(op, "key", key)
    check_last_dim_contiguous(op, "value", value)


SAMPLING_MAX_VOCAB = 2**23 - 1  # token masses are 2**40 fixed point; a row's sum stays below 2**63


def top_k_top_p_sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                       uniform: torch.Tensor) -> None:
    op = "top_k_top_p_sample"
    check_tensors(op, logits=logits, temperature=temperature, top_k=top_k, top_p=top_p, uniform=uniform)
    check_dtype(op, "logits", logits, FLOAT_DTYPES)
    check_dim(op, "logits", logits, 2, "[batch, vocab_size]")
    batch, vocab = logits.shape
    if not 0 < vocab <= SAMPLING_MAX_VOCAB:
        raise ValueError(f"{op}: {_desc('logits', logits)} must have 1..{SAMPLING_MAX_VOCAB} tokens per row")
    for name, t, dtype in (("temperature", temperature, torch.float32), ("top_k", top_k, torch.int32),
                           ("top_p", top_p, torch.float32), ("uniform", uniform, torch.float32)):
        check_dtype(op, name, t, (dtype,))
        if tuple(t.shape) != (batch,):
            raise ValueError(f"{op}: {_desc(name, t)} must be [{batch}] for {_desc('logits', logits)}")


def decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                     sequence_lengths: torch.Tensor, alibi_slopes: Optional[torch.Tensor],
                     k_new: Optional[torch.Tensor] = None, v_new: Optional[torch.Tensor] = None,
                     rotary_cos_sin: Optional[torch.Tensor] = None) -> None:
    op = "decode_attention"
    check_tensors(op, q=q, kv_cache=kv_cache, block_tables=block_tables, sequence_lengths=sequence_lengths,
                  alibi_slopes=alibi_slopes, k_new=k_new, v_new=v_new, rotary_cos_sin=rotary_cos_sin)
    if (k_new is None) != (v_new is None):
        raise ValueError(f"{op}: k_new and v_new are given together")
    if rotary_cos_sin is not None and k_new is None:
        raise ValueError(f"{op}: rotary_cos_sin needs k_new and v_new")
    check_dtype(op, "q", q, FLOAT_DTYPES)
    check_same_dtype(op, "q", q, "kv_cache", kv_cache)
    check_dim(op, "q", q, 3, "[batch, num_heads, head_dim]")
    check_dim(op, "kv_cache", kv_cache, 5, "[num_blocks, 2, num_kv_heads, tokens_per_block, head_dim]")
    batch, num_heads, head_dim = q.shape
    kv_heads = kv_cache.shape[2]
    if kv_cache.shape[1] != 2 or kv_cache.shape[4] != head_dim or kv_heads == 0 or num_heads % kv_heads:
        raise ValueError(f"{op}: kv_cache {list(kv_cache.shape)} does not fit q {list(q.shape)}: need "
                         f"[num_blocks, 2, KV, tokens_per_block, {head_dim}] with KV dividing {num_heads}")
    check_dtype(op, "block_tables", block_tables, (torch.int32,))
    check_dtype(op, "sequence_lengths", sequence_lengths, (torch.int32,))
    check_dim(op, "block_tables", block_tables, 2, "[batch, max_blocks_per_seq]")
    if block_tables.shape[0] != batch or sequence_lengths.shape != (batch,):
        raise ValueError(f"{op}: block_tables {list(block_tables.shape)} and sequence_lengths "
                         f"{list(sequence_lengths.shape)} must have batch {batch} (q {list(q.shape)})")
    if alibi_slopes is not None:
        check_dtype(op, "alibi_slopes", alibi_slopes, (torch.float32,))
        if alibi_slopes.shape != (num_heads,):
            raise ValueError(f"{op}: alibi_slopes {list(alibi_slopes.shape)} must be [{num_heads}]")
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if t is not None:
            check_same_dtype(op, "q", q, name, t)
            if t.shape != (batch, kv_heads, head_dim):
                raise ValueError(f"{op}: {name} {list(t.shape)} must be [{batch}, {kv_heads}, {head_dim}]")
    if rotary_cos_sin is not None:
        check_dtype(op, "rotary_cos_sin", rotary_cos_sin, (torch.float32,))
        check_dim(op, "rotary_cos_sin", rotary_cos_sin, 2, "[max_positions, rotary_dim]")


def gemv(op: str, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], gated: bool = False,
         residual: Optional[torch.Tensor] = None, norm_weight: Optional[torch.Tensor] = None) -> None:
    """x [rows, k] ([rows, 2k] when gated), weight [n, k], bias [n], residual like x, norm_weight [k]."""
    check_tensors(op, x=x, weight=weight, bias=bias, residual=residual, norm_weight=norm_weight)
    check_dtype(op, "x", x, FLOAT_DTYPES)
    for name, t in (("weight", weight), ("bias", bias), ("residual", residual), ("norm_weight", norm_weight)):
        if t is not None:
            check_same_dtype(op, "x", x, name, t)
    check_dim(op, "x", x, 2, "[rows, 2 * k]" if gated else "[rows, k]")
    check_dim(op, "weight", weight, 2, "[n, k]")
    n, k = weight.shape
    if x.shape[1] != (2 * k if gated else k):
        raise ValueError(f"{op}: {_desc('x', x)} does not match {_desc('weight', weight)}"
                         + (" (x must be [rows, 2 * k])" if gated else ""))
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"{op}: {_desc('bias', bias)} must be [{n}]")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"{op}: {_desc('residual', residual)} must have the shape of {_desc('x', x)}")
    if norm_weight is not None and tuple(norm_weight.shape) != (k,):
        raise ValueError(f"{op}: {_desc('norm_weight', norm_weight)} must be [{k}]")
