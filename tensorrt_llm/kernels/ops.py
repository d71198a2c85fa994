"""The compiled kernels as `torch.library` custom ops (`torch.ops.trtllm.*`).

Each op's default implementation (CPU and any device without a kernel) is the reference in
reference.py; the CUDA implementation calls tensorrt_llm.bindings with data pointers, shapes,
strides, a dtype code and the current CUDA stream. Fake (meta) implementations make the ops
usable under torch.compile and CUDA-graph capture. Arguments are checked (checks.py) before
either implementation runs, and the bindings check them again in C++.

When CUDA tensors arrive but the compiled module lacks CUDA kernels (a CPU-only build), the
reference runs on the GPU instead, after a one-line warning.
"""
from __future__ import annotations

import functools
import warnings
from typing import Optional

import torch

from . import checks, reference
from ._bindings import _TORCH_DTYPE_NAMES, cuda_kernels_available, get_bindings, stream_of, tensor_arg

_warned_fallback = False


def _use_compiled() -> bool:
    global _warned_fallback
    if cuda_kernels_available():
        return True
    if not _warned_fallback:
        _warned_fallback = True
        warnings.warn("tensorrt_llm.kernels: compiled CUDA kernels are not available (CPU-only or missing "
                      "tensorrt_llm.bindings); running the PyTorch reference on the GPU", RuntimeWarning,
                      stacklevel=3)
    return False


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t viewed as [rows, last] with a unit last stride (copied only when no such view exists)."""
    t2 = t.reshape(-1, t.shape[-1])
    if t2.shape[-1] > 1 and t2.stride(-1) != 1:
        t2 = t2.contiguous()
    return t2


# ---- rms_norm ------------------------------------------------------------------------------

@torch.library.custom_op("trtllm::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    checks.rms_norm(x, weight, None, eps)
    return reference.rms_norm(x, weight, eps)


@_rms_norm_op.register_kernel("cuda")
def _rms_norm_cuda(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    checks.rms_norm(x, weight, None, eps)
    if not _use_compiled():
        return reference.rms_norm(x, weight, eps)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel():
        get_bindings().rms_norm(tensor_arg(out.view(-1, x.shape[-1])), tensor_arg(_rows(x)), tensor_arg(weight),
                                float(eps), stream_of(x))
    return out


@_rms_norm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("trtllm::fused_add_rms_norm", mutates_args=())
def _fused_add_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    checks.rms_norm(x, weight, residual, eps)
    return reference.fused_add_rms_norm(x, residual, weight, eps)


@_fused_add_rms_norm_op.register_kernel("cuda")
def _fused_add_rms_norm_cuda(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    checks.rms_norm(x, weight, residual, eps)
    if not _use_compiled():
        return reference.fused_add_rms_norm(x, residual, weight, eps)
    hidden = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    summed = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel():
        get_bindings().rms_norm(tensor_arg(out.view(-1, hidden)), tensor_arg(_rows(x)), tensor_arg(weight),
                                float(eps), stream_of(x), tensor_arg(_rows(residual)),
                                tensor_arg(summed.view(-1, hidden)))
    return out, summed


@_fused_add_rms_norm_op.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(x.shape, dtype=x.dtype, device=x.device))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
             residual: Optional[torch.Tensor] = None):
    """RMSNorm over the last dimension: `out`, or `(out, x + residual)` when a residual is given."""
    if residual is None:
        return torch.ops.trtllm.rms_norm(x, weight, eps)
    return torch.ops.trtllm.fused_add_rms_norm(x, residual, weight, eps)


# ---- rotary_embedding_ ---------------------------------------------------------------------

@torch.library.custom_op("trtllm::rotary_embedding_", mutates_args=("q", "k"))
def _rotary_op(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
               is_neox: bool) -> None:
    checks.rotary_embedding(q, k, positions, cos_sin_cache)
    reference.rotary_embedding_(q, k, positions, cos_sin_cache, is_neox)


@_rotary_op.register_kernel("cuda")
def _rotary_cuda(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                 is_neox: bool) -> None:
    checks.rotary_embedding(q, k, positions, cos_sin_cache)
    if not _use_compiled():
        reference.rotary_embedding_(q, k, positions, cos_sin_cache, is_neox)
        return
    get_bindings().rotary_embedding(tensor_arg(q), tensor_arg(k), tensor_arg(positions.contiguous()),
                                    tensor_arg(cos_sin_cache.contiguous()), bool(is_neox), stream_of(q))


@_rotary_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
      is_neox: bool) -> None:
    return None


def rotary_embedding_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                      is_neox: bool = True) -> None:
    """Rotary embedding in place on q [T, Hq, D] and k [T, KV, D] (strided views of a packed QKV are fine).

    cos_sin_cache float32 [max_positions, rotary_dim] (see rope_cos_sin_cache); dims past rotary_dim
    pass through. Positions outside the table raise on the CPU and leave the token unchanged on CUDA.
    """
    torch.ops.trtllm.rotary_embedding_(q, k, positions, cos_sin_cache, is_neox)


# ---- silu_and_mul / gelu_and_mul -----------------------------------------------------------

def _act_and_mul_cuda(name: str, x: torch.Tensor, *extra) -> torch.Tensor:
    inter = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    if out.numel():
        getattr(get_bindings(), name)(tensor_arg(out.view(-1, inter)), tensor_arg(_rows(x)), *extra, stream_of(x))
    return out


@torch.library.custom_op("trtllm::silu_and_mul", mutates_args=())
def _silu_and_mul_op(x: torch.Tensor) -> torch.Tensor:
    checks.act_and_mul("silu_and_mul", x)
    return reference.silu_and_mul(x)


@_silu_and_mul_op.register_kernel("cuda")
def _silu_and_mul_cuda(x: torch.Tensor) -> torch.Tensor:
    checks.act_and_mul("silu_and_mul", x)
    if not _use_compiled():
        return reference.silu_and_mul(x)
    return _act_and_mul_cuda("silu_and_mul", x)


@_silu_and_mul_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@torch.library.custom_op("trtllm::gelu_and_mul", mutates_args=())
def _gelu_and_mul_op(x: torch.Tensor, approximate: str) -> torch.Tensor:
    checks.act_and_mul("gelu_and_mul", x)
    checks.gelu_approximate(approximate)
    return reference.gelu_and_mul(x, approximate)


@_gelu_and_mul_op.register_kernel("cuda")
def _gelu_and_mul_cuda(x: torch.Tensor, approximate: str) -> torch.Tensor:
    checks.act_and_mul("gelu_and_mul", x)
    checks.gelu_approximate(approximate)
    if not _use_compiled():
        return reference.gelu_and_mul(x, approximate)
    return _act_and_mul_cuda("gelu_and_mul", x, approximate)


@_gelu_and_mul_op.register_fake
def _(x: torch.Tensor, approximate: str) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:] for x [..., 2I]."""
    return torch.ops.trtllm.silu_and_mul(x)


def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(x[..., :I]) * x[..., I:] for x [..., 2I]; approximate is "none" (erf) or "tanh"."""
    return torch.ops.trtllm.gelu_and_mul(x, approximate)


# ---- paged_kv_write_ -----------------------------------------------------------------------

@torch.library.custom_op("trtllm::paged_kv_write_", mutates_args=("kv_cache",))
def _paged_kv_write_op(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                       cu_seqlens: torch.Tensor, past_lengths: torch.Tensor) -> None:
    checks.paged_kv_write(key, value, kv_cache, block_tables, cu_seqlens, past_lengths)
    reference.paged_kv_write_(key, value, kv_cache, block_tables, cu_seqlens, past_lengths)


@_paged_kv_write_op.register_kernel("cuda")
def _paged_kv_write_cuda(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                         cu_seqlens: torch.Tensor, past_lengths: torch.Tensor) -> None:
    checks.paged_kv_write(key, value, kv_cache, block_tables, cu_seqlens, past_lengths)
    if not _use_compiled():
        reference.paged_kv_write_(key, value, kv_cache, block_tables, cu_seqlens, past_lengths)
        return
    get_bindings().paged_kv_write(tensor_arg(key), tensor_arg(value), tensor_arg(kv_cache),
                                  tensor_arg(block_tables.contiguous()), tensor_arg(cu_seqlens.contiguous()),
                                  tensor_arg(past_lengths.contiguous()), stream_of(kv_cache))


@_paged_kv_write_op.register_fake
def _(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
      cu_seqlens: torch.Tensor, past_lengths: torch.Tensor) -> None:
    return None


def paged_kv_write_(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                    cu_seqlens: torch.Tensor, past_lengths: torch.Tensor) -> None:
    """Scatter key/value [T, KV, D] into kv_cache [num_blocks, 2, KV, tpb, D] through block_tables.

    Token t of sequence b (cu_seqlens[b] <= t < cu_seqlens[b+1]) goes to position
    p = past_lengths[b] + t - cu_seqlens[b]: block block_tables[b, p // tpb], slot p % tpb.
    Bad block ids or positions raise on the CPU; on CUDA those tokens are skipped (never written
    out of bounds), since checking would need a device sync.
    """
    torch.ops.trtllm.paged_kv_write_(key, value, kv_cache, block_tables, cu_seqlens, past_lengths)


# ---- top_k_top_p_sample -------------------------------------------------------------------

@torch.library.custom_op("trtllm::top_k_top_p_sample", mutates_args=())
def _top_k_top_p_sample_op(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                           uniform: torch.Tensor) -> torch.Tensor:
    checks.top_k_top_p_sample(logits, temperature, top_k, top_p, uniform)
    return reference.top_k_top_p_sample(logits, temperature, top_k, top_p, uniform)


@_top_k_top_p_sample_op.register_kernel("cuda")
def _top_k_top_p_sample_cuda(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                             top_p: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    checks.top_k_top_p_sample(logits, temperature, top_k, top_p, uniform)
    if not _use_compiled():
        return reference.top_k_top_p_sample(logits, temperature, top_k, top_p, uniform)
    out = torch.empty(logits.shape[0], dtype=torch.int32, device=logits.device)
    if out.numel():
        rows = logits if logits.shape[1] == 1 or logits.stride(1) == 1 else logits.contiguous()
        get_bindings().top_k_top_p_sample(tensor_arg(out), tensor_arg(rows), tensor_arg(temperature.contiguous()),
                                          tensor_arg(top_k.contiguous()), tensor_arg(top_p.contiguous()),
                                          tensor_arg(uniform.contiguous()), stream_of(logits))
    return out


@_top_k_top_p_sample_op.register_fake
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


# ---- decode_attention ----------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _decode_splits(batch: int, kv_heads: int, max_positions: int, multiprocessors: int,
                   tokens_per_block: int, max_chunk_blocks: int) -> tuple[int, int]:
    """(num_splits, split_size). The kernel's blocks (KV head x sequence x split) share each
    sequence's actual length evenly, so splits only add blocks: enough for about one block per
    multiprocessor when batch x KV heads is small, none when it already fills the GPU (each
    block has a fixed cost, and a split costs a merge); never chunks under 64 positions, and
    never more block ids per chunk than a block stages (max_chunk_blocks, the binding's
    DECODE_ATTENTION_MAX_CHUNK_BLOCKS, which counts the 2 ids a chunk may straddle). Depends
    on shapes only, so graphs can capture it."""
    blocks = max(1, batch * kv_heads)
    splits = max(1, min(-(-multiprocessors // blocks), -(-max_positions // 64)))
    splits = max(splits, -(-max_positions // ((max_chunk_blocks - 2) * tokens_per_block)))
    split = -(-max_positions // splits)
    return -(-max_positions // split), split


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


@torch.library.custom_op("trtllm::decode_attention", mutates_args=("kv_cache",))
def _decode_attention_op(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                         sequence_lengths: torch.Tensor, scale: float, alibi_slopes: Optional[torch.Tensor],
                         sliding_window: int, k_new: Optional[torch.Tensor], v_new: Optional[torch.Tensor],
                         rotary_cos_sin: Optional[torch.Tensor], is_neox: bool) -> torch.Tensor:
    checks.decode_attention(q, kv_cache, block_tables, sequence_lengths, alibi_slopes, k_new, v_new, rotary_cos_sin)
    return reference.decode_attention(q, kv_cache, block_tables, sequence_lengths, scale, alibi_slopes,
                                      sliding_window, k_new, v_new, rotary_cos_sin, is_neox)


@_decode_attention_op.register_kernel("cuda")
def _decode_attention_cuda(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                           sequence_lengths: torch.Tensor, scale: float, alibi_slopes: Optional[torch.Tensor],
                           sliding_window: int, k_new: Optional[torch.Tensor], v_new: Optional[torch.Tensor],
                           rotary_cos_sin: Optional[torch.Tensor], is_neox: bool) -> torch.Tensor:
    checks.decode_attention(q, kv_cache, block_tables, sequence_lengths, alibi_slopes, k_new, v_new, rotary_cos_sin)
    if not _use_compiled():
        return reference.decode_attention(q, kv_cache, block_tables, sequence_lengths, scale, alibi_slopes,
                                          sliding_window, k_new, v_new, rotary_cos_sin, is_neox)
    batch, num_heads, head_dim = q.shape
    out = torch.empty_like(q)
    max_positions = block_tables.shape[1] * kv_cache.shape[3]
    num_splits, split_size = _decode_splits(batch, kv_cache.shape[2], max_positions,
                                            _multiprocessors(q.device.index), kv_cache.shape[3],
                                            get_bindings().DECODE_ATTENTION_MAX_CHUNK_BLOCKS)
    workspace = counters = None
    if num_splits > 1:
        workspace = torch.empty(batch * num_heads * num_splits * (head_dim + 2), dtype=torch.float32,
                                device=q.device)
        counters = _split_counters(q.device, batch * kv_cache.shape[2])

    def arg(t):
        return None if t is None else tensor_arg(t)
    get_bindings().decode_attention(
        tensor_arg(out), tensor_arg(q), tensor_arg(kv_cache), tensor_arg(block_tables),
        tensor_arg(sequence_lengths), arg(alibi_slopes), arg(workspace), arg(counters), num_splits, split_size,
        float(scale),
        int(sliding_window), arg(k_new), arg(v_new), arg(rotary_cos_sin), bool(is_neox), stream_of(q))
    return out


@_decode_attention_op.register_fake
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
    return torch.ops.trtllm.decode_attention(q, kv_cache, block_tables, sequence_lengths, scale, alibi_slopes,
                                             sliding_window, k_new, v_new, rotary_cos_sin, is_neox)


# ---- gemv: a linear layer of a few rows, with its input's producer fused in front ----------

_GEMV_PROLOGUE = {"none": 0, "rms_norm": 1, "silu_and_mul": 2}


def gemv_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the compiled GEMV serves this linear layer: CUDA tensors, 1..4 rows, a weight
    [n, k] with contiguous rows, and every operand on 16-byte packs (so the caller can pick
    it for decode steps of small batches and cuBLAS otherwise)."""
    if not (x.is_cuda and cuda_kernels_available() and x.dim() == 2 and weight.dim() == 2):
        return False
    name = _TORCH_DTYPE_NAMES.get(weight.dtype)
    code = get_bindings().DTYPES[name] if name is not None else None
    per_pack = 16 // weight.element_size()
    return (code is not None and weight.is_contiguous() and weight.data_ptr() % 16 == 0
            and x.stride(-1) == 1 and x.stride(0) % per_pack == 0 and x.data_ptr() % 16 == 0
            and get_bindings().gemv_supports(x.shape[0], weight.shape[1], code))


def _gemv_cuda(prologue: str, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
               residual: Optional[torch.Tensor] = None, norm_weight: Optional[torch.Tensor] = None,
               eps: float = 0.0) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    summed = torch.empty_like(residual, memory_format=torch.contiguous_format) if residual is not None else None

    def arg(t):
        return None if t is None else tensor_arg(t)
    get_bindings().gemv(tensor_arg(out), tensor_arg(x), tensor_arg(weight), arg(bias), _GEMV_PROLOGUE[prologue],
                        arg(residual), arg(summed), arg(norm_weight), float(eps), stream_of(x))
    return out, summed


def _fits_gemv(x: torch.Tensor, weight: torch.Tensor, *others: Optional[torch.Tensor]) -> bool:
    return _use_compiled() and gemv_supported(x, weight) and all(
        t is None or (t.data_ptr() % 16 == 0 and t.stride(-1) == 1) for t in others)


@torch.library.custom_op("trtllm::gemv", mutates_args=())
def _gemv_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    checks.gemv("gemv", x, weight, bias)
    return reference.gemv(x, weight, bias)


@_gemv_op.register_kernel("cuda")
def _gemv_op_cuda(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    checks.gemv("gemv", x, weight, bias)
    if not _fits_gemv(x, weight, bias):
        return reference.gemv(x, weight, bias)
    return _gemv_cuda("none", x, weight, bias)[0]


@_gemv_op.register_fake
def _(x, weight, bias):
    return x.new_empty(x.shape[0], weight.shape[0])


@torch.library.custom_op("trtllm::rms_norm_gemv", mutates_args=())
def _rms_norm_gemv_op(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                      bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    checks.gemv("rms_norm_gemv", x, weight, bias, norm_weight=norm_weight)
    return reference.rms_norm_gemv(x, norm_weight, weight, bias, eps)


@_rms_norm_gemv_op.register_kernel("cuda")
def _rms_norm_gemv_cuda(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                        bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    checks.gemv("rms_norm_gemv", x, weight, bias, norm_weight=norm_weight)
    if not _fits_gemv(x, weight, bias, norm_weight):
        return reference.rms_norm_gemv(x, norm_weight, weight, bias, eps)
    return _gemv_cuda("rms_norm", x, weight, bias, norm_weight=norm_weight, eps=eps)[0]


@_rms_norm_gemv_op.register_fake
def _(x, norm_weight, weight, bias, eps):
    return x.new_empty(x.shape[0], weight.shape[0])


@torch.library.custom_op("trtllm::add_rms_norm_gemv", mutates_args=())
def _add_rms_norm_gemv_op(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                          bias: Optional[torch.Tensor], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    checks.gemv("add_rms_norm_gemv", x, weight, bias, residual=residual, norm_weight=norm_weight)
    return reference.add_rms_norm_gemv(x, residual, norm_weight, weight, bias, eps)


@_add_rms_norm_gemv_op.register_kernel("cuda")
def _add_rms_norm_gemv_cuda(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                            bias: Optional[torch.Tensor], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    checks.gemv("add_rms_norm_gemv", x, weight, bias, residual=residual, norm_weight=norm_weight)
    if not _fits_gemv(x, weight, bias, norm_weight, residual) or residual.stride(0) % (16 // x.element_size()):
        return reference.add_rms_norm_gemv(x, residual, norm_weight, weight, bias, eps)
    return _gemv_cuda("rms_norm", x, weight, bias, residual=residual, norm_weight=norm_weight, eps=eps)


@_add_rms_norm_gemv_op.register_fake
def _(x, residual, norm_weight, weight, bias, eps):
    return x.new_empty(x.shape[0], weight.shape[0]), torch.empty_like(residual)


@torch.library.custom_op("trtllm::silu_and_mul_gemv", mutates_args=())
def _silu_and_mul_gemv_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    checks.gemv("silu_and_mul_gemv", x, weight, bias, gated=True)
    return reference.silu_and_mul_gemv(x, weight, bias)


@_silu_and_mul_gemv_op.register_kernel("cuda")
def _silu_and_mul_gemv_cuda(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    checks.gemv("silu_and_mul_gemv", x, weight, bias, gated=True)
    if not _fits_gemv(x, weight, bias):
        return reference.silu_and_mul_gemv(x, weight, bias)
    return _gemv_cuda("silu_and_mul", x, weight, bias)[0]


@_silu_and_mul_gemv_op.register_fake
def _(x, weight, bias):
    return x.new_empty(x.shape[0], weight.shape[0])


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
