"""Rotary position embedding: the cos/sin table (rope_cos_sin_cache, with the linear and
Llama 3 scalings) and the rotary_embedding op.

rotary_embedding rotates, in float32, the first rotary_dim dims of each head of every token by
its position and rounds once to x's dtype: NeoX pairs (x[j], x[j + r/2]), GPT-J pairs
(x[2j], x[2j + 1]); dims past rotary_dim pass through. Its kernel (rotary_embedding_cuda_,
in place on q and k, which gpt_attention's CUDA implementation runs) computes the same.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..network import Tensor
from .launch import launch
from .op import REFERENCE, add_layer, check_int, check_shape, define


def rope_inv_freq(rotary_dim: int, theta: float = 10000.0, scaling: Optional[dict] = None) -> torch.Tensor:
    """Inverse frequencies [rotary_dim / 2] in float32 (Hugging Face's dtype), scaled."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    kind = (scaling or {}).get("type", (scaling or {}).get("rope_type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise ValueError(f"rope scaling type {kind!r} is not supported (None, 'linear' or 'llama3')")


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths slowed by `factor`, short ones kept, the band between
    the two cut-offs interpolated smoothly in 1/wavelength."""
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    long_cutoff, short_cutoff = original / low, original / high
    scaled = torch.where(wavelen > long_cutoff, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    interpolated = (1 - smooth) * scaled / factor + smooth * scaled
    in_between = (wavelen >= short_cutoff) & (wavelen <= long_cutoff)
    return torch.where(in_between, interpolated, scaled)


def rope_cos_sin_cache(max_positions: int, rotary_dim: int, theta: float = 10000.0,
                       scaling: Optional[dict] = None) -> torch.Tensor:
    """float32 [max_positions, rotary_dim]: row p is cat(cos(p * inv_freq), sin(p * inv_freq))."""
    if rotary_dim % 2:
        raise ValueError(f"rope_cos_sin_cache: rotary_dim must be even, got {rotary_dim}")
    inv_freq = rope_inv_freq(rotary_dim, theta, scaling).double()
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)  # exact products
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


@define
def rotary_embedding(x: Tensor, position_ids: Tensor, cos_sin_cache: Tensor, *, num_heads: int, head_dim: int,
                     rotary_dim: Optional[int] = None, is_neox: bool = True) -> Tensor:
    """Rotate the first `rotary_dim` dims of each head of x [T, num_heads * head_dim]."""
    op = "rotary_embedding"
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    if x.ndim != 2 or x.shape[1] not in (-1, num_heads * head_dim):
        raise ValueError(f"{op}: x must be [T, num_heads*head_dim = {num_heads * head_dim}], got {list(x.shape)}")
    check_int(op, position_ids, "position_ids")
    check_shape(op, position_ids, x.shape[:1], "position_ids")
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ValueError(f"{op}: rotary_dim {rotary_dim} must be even and in (0, head_dim={head_dim}]")
    if cos_sin_cache.dtype != "float32" or cos_sin_cache.ndim != 2 or cos_sin_cache.shape[1] not in (-1, rotary_dim):
        raise ValueError(f"{op}: cos_sin_cache must be float32 [max_positions, {rotary_dim}], "
                         f"got {cos_sin_cache.dtype} {list(cos_sin_cache.shape)}")
    return add_layer(op, [x, position_ids, cos_sin_cache], [(x.dtype, x.shape)], num_heads=int(num_heads),
                     head_dim=int(head_dim), rotary_dim=int(rotary_dim), is_neox=bool(is_neox))


@rotary_embedding.implementation(REFERENCE)
def rotary_embedding_reference(x, position_ids, cos_sin_cache, *, num_heads, head_dim, rotary_dim, is_neox):
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


def rotary_embedding_cuda_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                           is_neox: bool) -> None:
    """The kernel: in place on q [T, Hq, D] and k [T, KV, D] (strided views of a packed qkv are
    fine). Positions outside the table leave the token unchanged (the kernel cannot raise
    without a sync)."""
    launch("rotary_embedding", q, k, positions.contiguous(), cos_sin_cache.contiguous(), bool(is_neox))
