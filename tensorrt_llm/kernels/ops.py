"""The compiled kernels as `torch.library` custom ops (`torch.ops.trtllm.*`): one kernel by
name, usable under torch.compile, in CUDA-graph capture and with torch.library.opcheck.

Each kernel computes an op of tensorrt_llm.ops, or a part of one, and has no code of its own
here: its CPU implementation is the op's reference (the kernels that compute no op of their
own, such as sampling, have their oracle in reference.py) and its CUDA implementation the op's
CUDA code, which launches the compiled kernel. Nothing is checked here: the compiled module
checks every argument of a launch (cpp/bindings). Fake (meta) implementations give the shapes.

When CUDA tensors arrive but the compiled module lacks CUDA kernels (a CPU-only build), the
reference runs on the GPU instead, after a one-line warning.
"""
from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch

from ..ops import activation, attention_cuda, linear, norm, rotary
from ..ops.launch import cuda_kernels_available, get_bindings, launch
from . import reference

_warned_fallback = False


def _compiled(cuda_fn: Callable, reference_fn: Callable, *args, **kwargs):
    """cuda_fn(*args, **kwargs), or reference_fn on the GPU when there are no compiled kernels."""
    global _warned_fallback
    if cuda_kernels_available():
        return cuda_fn(*args, **kwargs)
    if not _warned_fallback:
        _warned_fallback = True
        warnings.warn("tensorrt_llm.kernels: compiled CUDA kernels are not available (CPU-only or missing "
                      "tensorrt_llm.bindings); running the PyTorch reference on the GPU", RuntimeWarning,
                      stacklevel=3)
    return reference_fn(*args, **kwargs)


# ---- rms_norm: the rms_norm and fused_add_rms_norm ops ------------------------------------------

@torch.library.custom_op("trtllm::rms_norm", mutates_args=())
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return norm.rms_norm_reference(x, weight, eps=eps)


@_rms_norm.register_kernel("cuda")
def _(x, weight, eps):
    return _compiled(norm.rms_norm_cuda, norm.rms_norm_reference, x, weight, eps=eps)


@_rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("trtllm::fused_add_rms_norm", mutates_args=())
def _fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return norm.fused_add_rms_norm_reference(x, residual, weight, eps=eps)


@_fused_add_rms_norm.register_kernel("cuda")
def _(x, residual, weight, eps):
    return _compiled(norm.fused_add_rms_norm_cuda, norm.fused_add_rms_norm_reference, x, residual, weight, eps=eps)


@_fused_add_rms_norm.register_fake
def _(x, residual, weight, eps):
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(x.shape, dtype=x.dtype, device=x.device))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
             residual: Optional[torch.Tensor] = None):
    """RMSNorm over the last dimension: `out`, or `(out, x + residual)` when a residual is given."""
    if residual is None:
        return torch.ops.trtllm.rms_norm(x, weight, eps)
    return torch.ops.trtllm.fused_add_rms_norm(x, residual, weight, eps)


# ---- silu_and_mul / gelu_and_mul ----------------------------------------------------------------

@torch.library.custom_op("trtllm::silu_and_mul", mutates_args=())
def _silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return activation.silu_and_mul_reference(x)


@_silu_and_mul.register_kernel("cuda")
def _(x):
    return _compiled(activation.silu_and_mul_cuda, activation.silu_and_mul_reference, x)


@torch.library.custom_op("trtllm::gelu_and_mul", mutates_args=())
def _gelu_and_mul(x: torch.Tensor, approximate: str) -> torch.Tensor:
    return activation.gelu_and_mul_reference(x, approximate=approximate)


@_gelu_and_mul.register_kernel("cuda")
def _(x, approximate):
    return _compiled(activation.gelu_and_mul_cuda, activation.gelu_and_mul_reference, x, approximate=approximate)


@_silu_and_mul.register_fake
def _(x):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@_gelu_and_mul.register_fake
def _(x, approximate):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:] for x [..., 2I]."""
    return torch.ops.trtllm.silu_and_mul(x)


def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(x[..., :I]) * x[..., I:] for x [..., 2I]; approximate is "none" (erf) or "tanh"."""
    return torch.ops.trtllm.gelu_and_mul(x, approximate)


# ---- rotary_embedding_ ------------------------------------------------------------------------

@torch.library.custom_op("trtllm::rotary_embedding_", mutates_args=("q", "k"))
def _rotary_embedding_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                       is_neox: bool) -> None:
    reference.rotary_embedding_(q, k, positions, cos_sin_cache, is_neox)


@_rotary_embedding_.register_kernel("cuda")
def _(q, k, positions, cos_sin_cache, is_neox):
    _compiled(rotary.rotary_embedding_cuda_, reference.rotary_embedding_, q, k, positions, cos_sin_cache, is_neox)


@_rotary_embedding_.register_fake
def _(q, k, positions, cos_sin_cache, is_neox):
    return None


def rotary_embedding_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                      is_neox: bool = True) -> None:
    """Rotary embedding in place on q [T, Hq, D] and k [T, KV, D] (strided views of a packed QKV are fine).

    cos_sin_cache float32 [max_positions, rotary_dim] (see rope_cos_sin_cache); dims past rotary_dim
    pass through. Positions outside the table raise on the CPU and leave the token unchanged on CUDA.
    """
    torch.ops.trtllm.rotary_embedding_(q, k, positions, cos_sin_cache, is_neox)


# ---- paged_kv_write_ --------------------------------------------------------------------------

@torch.library.custom_op("trtllm::paged_kv_write_", mutates_args=("kv_cache",))
def _paged_kv_write_(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                     cu_seqlens: torch.Tensor, past_lengths: torch.Tensor) -> None:
    reference.paged_kv_write_(key, value, kv_cache, block_tables, cu_seqlens, past_lengths)


@_paged_kv_write_.register_kernel("cuda")
def _(key, value, kv_cache, block_tables, cu_seqlens, past_lengths):
    _compiled(attention_cuda.paged_kv_write_cuda_, reference.paged_kv_write_, key, value, kv_cache, block_tables,
              cu_seqlens, past_lengths)


@_paged_kv_write_.register_fake
def _(key, value, kv_cache, block_tables, cu_seqlens, past_lengths):
    return None


def _float_cache(op: str, kv_cache: torch.Tensor) -> None:
    """These ops take a cache of K/V values; a quantized cache (int8 / uint8 codes) needs its
    scales, which gpt_attention (functional) passes."""
    if not kv_cache.is_floating_point():
        raise TypeError(f"{op}: kv_cache holds {kv_cache.dtype} codes (a quantized KV cache); this op takes "
                        f"float K/V values: use tensorrt_llm.functional.gpt_attention, which takes the KV scales")


def paged_kv_write_(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                    cu_seqlens: torch.Tensor, past_lengths: torch.Tensor) -> None:
    """Scatter key/value [T, KV, D] into kv_cache [num_blocks, 2, KV, tpb, D] through block_tables.

    Token t of sequence b (cu_seqlens[b] <= t < cu_seqlens[b+1]) goes to position
    p = past_lengths[b] + t - cu_seqlens[b]: block block_tables[b, p // tpb], slot p % tpb.
    Bad block ids or positions raise on the CPU; on CUDA those tokens are skipped (never written
    out of bounds), since checking would need a device sync.
    """
    _float_cache("paged_kv_write_", kv_cache)
    torch.ops.trtllm.paged_kv_write_(key, value, kv_cache, block_tables, cu_seqlens, past_lengths)


# ---- top_k_top_p_sample -------------------------------------------------------------------------

def _top_k_top_p_sample_cuda(logits, temperature, top_k, top_p, uniform):
    out = torch.empty(logits.shape[0], dtype=torch.int32, device=logits.device)
    if out.numel():
        rows = logits if logits.shape[1] == 1 or logits.stride(1) == 1 else logits.contiguous()
        launch("top_k_top_p_sample", out, rows, temperature.contiguous(), top_k.contiguous(), top_p.contiguous(),
               uniform.contiguous())
    return out


@torch.library.custom_op("trtllm::top_k_top_p_sample", mutates_args=())
def _top_k_top_p_sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                        uniform: torch.Tensor) -> torch.Tensor:
    return reference.top_k_top_p_sample(logits, temperature, top_k, top_p, uniform)


@_top_k_top_p_sample.register_kernel("cuda")
def _(logits, temperature, top_k, top_p, uniform):
    return _compiled(_top_k_top_p_sample_cuda, reference.top_k_top_p_sample, logits, temperature, top_k, top_p,
                     uniform)


@_top_k_top_p_sample.register_fake
def _(logits, temperature, top_k, top_p, uniform):
    return torch.empty(logits.shape[0], dtype=torch.int32, device=logits.device)


def top_k_top_p_sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                       uniform: torch.Tensor) -> torch.Tensor:
    """The token each row of logits [B, V] (float32/16, bfloat16; any row stride) draws: int32 [B].

    Per-row tensors [B] on the logits' device: temperature float32 (<= 0: greedy), top_k int32 (0 or
    >= V: no limit, 1: greedy), top_p float32 (outside (0, 1): no limit) and uniform float32 in [0, 1),
    e.g. torch.rand(B, generator=...). Tokens tied at the top-k or top-p threshold are all kept.
    The rule, exactly (integer masses, so the CUDA kernel draws the same token on every run):
    reference.top_k_top_p_masses and reference.top_k_top_p_sample. One kernel launch that reads no
    host value, so it can be captured in a CUDA graph."""
    return torch.ops.trtllm.top_k_top_p_sample(logits, temperature, top_k, top_p, uniform)


# ---- argmax_rows ---------------------------------------------------------------------------------

def _argmax_rows_cuda(logits, out=None, advance=None, host_out=None, host_slot=None):
    b, v = logits.shape
    if out is None:
        out = torch.empty(b, dtype=torch.int32, device=logits.device)
    if b:
        # One entry per block of the binding's ARGMAX_CHUNK logits of a row (it checks the size).
        workspace = torch.empty(b * -(-v // get_bindings().ARGMAX_CHUNK), dtype=torch.int64, device=logits.device)
        launch("argmax_rows", out, logits if v == 1 or logits.stride(1) == 1 else logits.contiguous(), workspace,
               advance=advance, host_out=host_out, host_slot=host_slot)
    return out


def _argmax_rows_into_reference(out, logits, advance, host_out=None, host_slot=None):
    out.copy_(reference.argmax_rows(logits))
    if advance is not None:
        advance.add_(1)
    if host_out is not None:  # the slot read back: a reference, not the kernel's copy-free path
        slot = int(host_slot.item()) % 2
        host_out[slot, :out.shape[0]].copy_(out)
        host_slot.add_(1)


@torch.library.custom_op("trtllm::argmax_rows", mutates_args=())
def _argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    return reference.argmax_rows(logits)


@_argmax_rows.register_kernel("cuda")
def _(logits):
    return _compiled(_argmax_rows_cuda, reference.argmax_rows, logits)


@_argmax_rows.register_fake
def _(logits):
    return torch.empty(logits.shape[0], dtype=torch.int32, device=logits.device)


@torch.library.custom_op("trtllm::argmax_rows_into", mutates_args=("out", "advance", "host_out", "host_slot"))
def _argmax_rows_into(out: torch.Tensor, logits: torch.Tensor, advance: Optional[torch.Tensor],
                      host_out: Optional[torch.Tensor], host_slot: Optional[torch.Tensor]) -> None:
    _argmax_rows_into_reference(out, logits, advance, host_out, host_slot)


@_argmax_rows_into.register_kernel("cuda")
def _(out, logits, advance, host_out, host_slot):
    _compiled(lambda o, x, a, h, s: _argmax_rows_cuda(x, o, a, h, s), _argmax_rows_into_reference, out, logits,
              advance, host_out, host_slot)


def argmax_rows(logits: torch.Tensor, out: Optional[torch.Tensor] = None,
                advance: Optional[torch.Tensor] = None, host_out: Optional[torch.Tensor] = None,
                host_slot: Optional[torch.Tensor] = None) -> torch.Tensor:
    """int32 [B]: the index of each row's first largest logit (logits [B, V], float32/16 or
    bfloat16, any row stride), torch.argmax's answer (NaN counts as the largest). With `out`
    (int32 [B]) written there; with `advance` (int32 [B]) each of its entries + 1 in the same
    launch, so that a greedy decode step in a CUDA graph leaves the next step's sequence
    lengths in place. With `host_out` (int32 [2, W >= B], pinned host memory) and `host_slot`
    (int32 [1] on the GPU) the tokens are also written to host_out[host_slot % 2] and host_slot
    + 1, by the same launch: a graph's tokens reach the host with no copy queued after it
    (successive launches alternate between the two rows). Returns the tokens."""
    if (host_out is None) != (host_slot is None):
        raise ValueError("argmax_rows: host_out and host_slot go together")
    if host_out is not None and (host_out.is_cuda or not host_out.is_pinned()):
        raise ValueError("argmax_rows: host_out must be pinned host memory (tensor.pin_memory())")
    if out is None and advance is None and host_out is None:
        return torch.ops.trtllm.argmax_rows(logits)
    if out is None:
        out = torch.empty(logits.shape[0], dtype=torch.int32, device=logits.device)
    torch.ops.trtllm.argmax_rows_into(out, logits, advance, host_out, host_slot)
    return out


# ---- decode_attention ---------------------------------------------------------------------------

@torch.library.custom_op("trtllm::decode_attention", mutates_args=("kv_cache",))
def _decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                      sequence_lengths: torch.Tensor, scale: float, alibi_slopes: Optional[torch.Tensor],
                      sliding_window: int, k_new: Optional[torch.Tensor], v_new: Optional[torch.Tensor],
                      rotary_cos_sin: Optional[torch.Tensor], is_neox: bool) -> torch.Tensor:
    return reference.decode_attention(q, kv_cache, block_tables, sequence_lengths, scale, alibi_slopes,
                                      sliding_window, k_new, v_new, rotary_cos_sin, is_neox)


@_decode_attention.register_kernel("cuda")
def _(q, kv_cache, block_tables, sequence_lengths, scale, alibi_slopes, sliding_window, k_new, v_new, rotary_cos_sin,
      is_neox):
    return _compiled(attention_cuda.decode_attention_cuda, reference.decode_attention, q, kv_cache, block_tables,
                     sequence_lengths, scale, alibi_slopes, sliding_window, k_new, v_new, rotary_cos_sin, is_neox)


@_decode_attention.register_fake
def _(q, kv_cache, block_tables, sequence_lengths, scale, alibi_slopes, sliding_window, k_new, v_new,
      rotary_cos_sin, is_neox):
    return torch.empty_like(q)


def decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                     sequence_lengths: torch.Tensor, scale: float, alibi_slopes: Optional[torch.Tensor] = None,
                     sliding_window: int = 0, k_new: Optional[torch.Tensor] = None,
                     v_new: Optional[torch.Tensor] = None, rotary_cos_sin: Optional[torch.Tensor] = None,
                     is_neox: bool = True) -> torch.Tensor:
    """Attention of one query token per sequence, q [B, H, D] at position sequence_lengths[b] - 1,
    over its cached K/V in kv_cache [num_blocks, 2, KV, tpb, D]; -> [B, H, D].

    Without k_new/v_new the cache must already hold this step's rows. With them ([B, KV, D]),
    the same launch writes them at position L - 1, after rotating k and q by rotary_cos_sin
    (float32 [max_positions, rotary_dim]) when given; the caller's q/k stay unrotated."""
    _float_cache("decode_attention", kv_cache)
    return torch.ops.trtllm.decode_attention(q, kv_cache, block_tables, sequence_lengths, scale, alibi_slopes,
                                             sliding_window, k_new, v_new, rotary_cos_sin, is_neox)


# ---- gemv: the linear, rms_norm_linear, add_rms_norm_linear and silu_and_mul_linear ops ---------

def _gemv_or(reference_fn: Callable, x, weight, bias, prologue="none", residual=None, norm_weight=None, eps=0.0):
    """The compiled GEMV where it serves the shapes (linear.gemv_fits), else reference_fn()."""
    if not (cuda_kernels_available() and linear.gemv_fits(x, weight, bias, norm_weight, residual)):
        return reference_fn()
    out, total = linear.gemv(x, weight, bias, prologue, residual, norm_weight, eps)
    return out if residual is None else (out, total)


@torch.library.custom_op("trtllm::gemv", mutates_args=())
def _gemv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return linear.linear_reference(x, weight, bias)


@torch.library.custom_op("trtllm::rms_norm_gemv", mutates_args=())
def _rms_norm_gemv(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   eps: float) -> torch.Tensor:
    return linear.rms_norm_linear_reference(x, norm_weight, weight, bias, eps=eps)


@torch.library.custom_op("trtllm::add_rms_norm_gemv", mutates_args=())
def _add_rms_norm_gemv(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                       bias: Optional[torch.Tensor], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return linear.add_rms_norm_linear_reference(x, residual, norm_weight, weight, bias, eps=eps)


@torch.library.custom_op("trtllm::silu_and_mul_gemv", mutates_args=())
def _silu_and_mul_gemv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return linear.silu_and_mul_linear_reference(x, weight, bias)


@_gemv.register_kernel("cuda")
def _(x, weight, bias):
    return _gemv_or(lambda: linear.linear_reference(x, weight, bias), x, weight, bias)


@_rms_norm_gemv.register_kernel("cuda")
def _(x, norm_weight, weight, bias, eps):
    return _gemv_or(lambda: linear.rms_norm_linear_reference(x, norm_weight, weight, bias, eps=eps), x, weight, bias,
                    "rms_norm", norm_weight=norm_weight, eps=eps)


@_add_rms_norm_gemv.register_kernel("cuda")
def _(x, residual, norm_weight, weight, bias, eps):
    return _gemv_or(lambda: linear.add_rms_norm_linear_reference(x, residual, norm_weight, weight, bias, eps=eps), x,
                    weight, bias, "rms_norm", residual, norm_weight, eps)


@_silu_and_mul_gemv.register_kernel("cuda")
def _(x, weight, bias):
    return _gemv_or(lambda: linear.silu_and_mul_linear_reference(x, weight, bias), x, weight, bias, "silu_and_mul")


@_gemv.register_fake
def _(x, weight, bias):
    return x.new_empty(x.shape[0], weight.shape[0])


@_rms_norm_gemv.register_fake
def _(x, norm_weight, weight, bias, eps):
    return x.new_empty(x.shape[0], weight.shape[0])


@_add_rms_norm_gemv.register_fake
def _(x, residual, norm_weight, weight, bias, eps):
    return x.new_empty(x.shape[0], weight.shape[0]), torch.empty_like(residual)


@_silu_and_mul_gemv.register_fake
def _(x, weight, bias):
    return x.new_empty(x.shape[0], weight.shape[0])


gemv_supported = linear.gemv_supported


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [rows, k] @ weight[n, k].T (+ bias): the compiled GEMV where gemv_supported, else F.linear."""
    return torch.ops.trtllm.gemv(x, weight, bias)


def rms_norm_gemv(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                  bias: Optional[torch.Tensor] = None, eps: float = 1e-6, residual: Optional[torch.Tensor] = None):
    """linear(rms_norm(x [+ residual]), weight, bias) in one pass: `out`, or `(out, x + residual)`."""
    if residual is None:
        return torch.ops.trtllm.rms_norm_gemv(x, norm_weight, weight, bias, eps)
    return torch.ops.trtllm.add_rms_norm_gemv(x, residual, norm_weight, weight, bias, eps)


def silu_and_mul_gemv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """linear(silu(x[:, :k]) * x[:, k:], weight, bias) in one pass."""
    return torch.ops.trtllm.silu_and_mul_gemv(x, weight, bias)
