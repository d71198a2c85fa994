"""Graph ops on a GPU through the compiled kernels (tensorrt_llm.kernels), same signatures
as reference_ops. Shapes the kernels do not cover go to the reference, on the GPU.

gpt_attention's two phases:
- decode (one new token per sequence, known from shapes alone so it can be captured in a
  CUDA graph): rotate q/k in place, write K/V into the paged cache, one decode-attention
  kernel that reads each K/V row once per query-head group;
- context: rotate and write the same way, then PyTorch's fused SDPA (flash) on each
  prompt that has no cached past; anything else takes the reference path.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import kernels
from ..reference_ops import REFERENCE_OPS


def rms_norm(x, weight=None, *, eps):
    if weight is None:
        return REFERENCE_OPS["rms_norm"](x, weight, eps=eps)
    return kernels.rms_norm(x, weight, eps)


def fused_add_rms_norm(x, residual, weight=None, *, eps):
    if weight is None:
        return REFERENCE_OPS["fused_add_rms_norm"](x, residual, weight, eps=eps)
    return kernels.rms_norm(x, weight, eps, residual)


def silu_and_mul(x):
    return kernels.silu_and_mul(x)


def gelu_and_mul(x, *, approximate="none"):
    return kernels.gelu_and_mul(x, approximate)


# ---- norm / activation + linear ----------------------------------------------------------
# One row (a batch-1 decode step): one compiled GEMV launch computes the norm or activation
# into shared memory and streams the weights (see use_gemv below). Otherwise the norm or
# activation kernel, then cuBLAS through F.linear.

def rms_norm_linear(x, norm_weight, weight, bias=None, *, eps):
    if use_gemv(x, weight):
        return kernels.rms_norm_gemv(x, norm_weight, weight, bias, eps)
    return F.linear(kernels.rms_norm(x, norm_weight, eps), weight, bias)


def add_rms_norm_linear(x, residual, norm_weight, weight, bias=None, *, eps):
    if use_gemv(x, weight) and residual.stride(-1) == 1:
        return kernels.rms_norm_gemv(x, norm_weight, weight, bias, eps, residual=residual)
    normed, total = kernels.rms_norm(x, norm_weight, eps, residual)
    return F.linear(normed, weight, bias), total


def silu_and_mul_linear(x, weight, bias=None):
    if use_gemv(x, weight):
        return kernels.silu_and_mul_gemv(x, weight, bias)
    return F.linear(kernels.silu_and_mul(x), weight, bias)


# ---- gpt_attention -----------------------------------------------------------------------

def _kernel_covers(num_heads, num_kv_heads, head_dim) -> bool:
    return (kernels.cuda_kernels_available() and head_dim in (64, 128, 256)
            and num_heads // num_kv_heads <= 8)


def gpt_attention(q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths, host_context_lengths,
                  alibi_slopes=None, position_ids=None, rotary_cos_sin=None, host_sequence_lengths=None, *,
                  layer_idx, num_heads, num_kv_heads, head_dim, tokens_per_block, scale=None, sliding_window=None,
                  rotary_dim=0, rotary_is_neox=True):
    def on_reference():
        return REFERENCE_OPS["gpt_attention"](
            q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths, host_context_lengths,
            alibi_slopes, position_ids, rotary_cos_sin, host_sequence_lengths, layer_idx=layer_idx,
            num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, tokens_per_block=tokens_per_block,
            scale=scale, sliding_window=sliding_window, rotary_dim=rotary_dim, rotary_is_neox=rotary_is_neox)

    if not _kernel_covers(num_heads, num_kv_heads, head_dim):
        return on_reference()
    num_tokens, batch = q.shape[0], block_tables.shape[0]
    # q, k, v are column slices of the packed QKV projection: head views, no copies.
    qh = q.view(num_tokens, num_heads, head_dim)
    kh = k.view(num_tokens, num_kv_heads, head_dim)
    vh = v.view(num_tokens, num_kv_heads, head_dim)
    cache = kv_cache_pool[layer_idx]
    softmax_scale = 1.0 / math.sqrt(head_dim) if scale is None else scale

    if num_tokens == batch:  # every sequence has >= 1 new token, so this is one each: decode
        # One launch rotates q/k (decode positions are sequence_lengths - 1, as the runtime
        # feeds them), writes the new K/V rows and attends.
        out = kernels.decode_attention(qh, cache, block_tables, sequence_lengths, softmax_scale, alibi_slopes,
                                       sliding_window or 0, kh, vh, rotary_cos_sin, rotary_is_neox)
        return out.view(num_tokens, num_heads * head_dim)

    new = host_context_lengths.tolist()
    fresh = (host_sequence_lengths is not None and host_sequence_lengths.tolist() == new
             and alibi_slopes is None and (sliding_window is None or max(new) <= sliding_window))
    if not fresh:  # some prompt continues a cached past: the reference reads it from the cache
        return on_reference()
    if rotary_cos_sin is not None:
        kernels.rotary_embedding_(qh, kh, position_ids, rotary_cos_sin, rotary_is_neox)
    cu_seqlens = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    torch.cumsum(context_lengths, 0, out=cu_seqlens[1:])
    kernels.paged_kv_write_(kh, vh, cache, block_tables, cu_seqlens, sequence_lengths - context_lengths)
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


# ---- linear layers of one row (batch-1 decode steps): the compiled GEMV --------------------
# Measured on an H200 (benchmarks/bench_gemv.py): for one row it beats cuBLAS, alone or after a
# separate norm or activation kernel, except for wide layers with a short k (a small model's
# LM head), where cuBLAS spreads the work better; with 2 or more rows cuBLAS wins.

def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a linear layer (weight [n, k]) on x runs as the compiled GEMV."""
    n, k = weight.shape
    return x.dim() == 2 and x.shape[0] == 1 and (k >= 2048 or n <= 16384) and kernels.gemv_supported(x, weight)


def linear(x, weight, bias=None):
    if use_gemv(x, weight):
        return kernels.gemv(x, weight, bias)
    return F.linear(x, weight, bias)


CUDA_OPS = {
    "rms_norm": rms_norm,
    "fused_add_rms_norm": fused_add_rms_norm,
    "silu_and_mul": silu_and_mul,
    "gelu_and_mul": gelu_and_mul,
    "rms_norm_linear": rms_norm_linear,
    "add_rms_norm_linear": add_rms_norm_linear,
    "silu_and_mul_linear": silu_and_mul_linear,
    "gpt_attention": gpt_attention,
    "linear": linear,
}
