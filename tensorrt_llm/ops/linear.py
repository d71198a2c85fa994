"""Matrix products: matmul, linear, and a norm or gated activation fused with the linear
reading it (rms_norm_linear, add_rms_norm_linear, silu_and_mul_linear: made by the
fuse_norm_linear / fuse_act_linear passes so that a small-batch decode step can run each pair
as one kernel).

The fused ops mean the unfused pair: their references compose the unfused references, and their
CPU implementations the unfused CPU ones (the host RMSNorm), so the fused graph gives the
unfused graph's numbers bit for bit. On a GPU, a linear of one row runs
as the compiled GEMV (one pass over the weights, the norm or activation computed in front of
it in float32: see norm.py and activation.py for how that rounds); otherwise the norm or
activation kernel runs, then cuBLAS through F.linear.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F

from ..network import Tensor, shapes_compatible
from .activation import gated_shape, silu_and_mul_cpu, silu_and_mul_cuda, silu_and_mul_reference
from .launch import cuda_kernels_available, dtype_code, get_bindings, launch
from .norm import (
    fused_add_rms_norm_cpu,
    fused_add_rms_norm_cuda,
    fused_add_rms_norm_reference,
    norm_eps,
    residual_sum_shape,
    rms_norm_cpu,
    rms_norm_cuda,
    rms_norm_reference,
)
from .op import CPU, CUDA, REFERENCE, Shape, add_layer, broadcast, check_same_dtype, check_shape, define


def linear_shape(op: str, x_shape: Shape, weight: Union[Tensor, tuple[int, int]], bias: Optional[Tensor],
                 what: str = "input", dtype: Optional[str] = None) -> Shape:
    """The shape of x @ W.T + bias for x of `x_shape` ([..., in]), W [out, in], bias [out];
    `what` names x in the error. `weight` is W's tensor, or (out_features, in_features) for a
    quantized weight whose tensor is not W's shape (INT4 codes: two a byte). With `dtype`, the
    bias must have it."""
    if isinstance(weight, Tensor):
        if weight.ndim != 2 or len(x_shape) < 1 or not shapes_compatible(x_shape[-1:], weight.shape[1:]):
            raise ValueError(f"{op}: {what} {list(x_shape)} does not match weight [out, in] {list(weight.shape)}")
        out = weight.shape[:1]
    else:
        out, k = weight[:1], weight[1]
        if len(x_shape) < 1 or x_shape[-1] not in (k, -1):
            raise ValueError(f"{op}: {what} {list(x_shape)} does not match in_features {k}")
    if bias is not None:
        if dtype is not None and bias.dtype != dtype:
            raise ValueError(f"{op}: bias dtype {bias.dtype} is not x's {dtype}")
        check_shape(op, bias, out, "bias")
    return tuple(x_shape[:-1]) + tuple(out)


# ---- the compiled GEMV: a linear layer of 1..4 rows with its input's op fused in front --------
# Measured on an H200 (benchmarks/bench_gemv.py): for one row it beats cuBLAS, alone or after a
# separate norm or activation kernel, except for wide layers with a short k (a small model's
# LM head), where cuBLAS spreads the work better; with 2 or more rows cuBLAS wins.

GEMV_PROLOGUES = {"none": 0, "rms_norm": 1, "silu_and_mul": 2}


def gemv_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the compiled GEMV serves this linear layer: CUDA tensors, 1..4 rows, a weight
    [n, k] with contiguous rows, and every operand on 16-byte packs (so the caller can pick
    it for decode steps of small batches and cuBLAS otherwise)."""
    if not (x.is_cuda and cuda_kernels_available() and x.dim() == 2 and weight.dim() == 2):
        return False
    code = dtype_code(weight.dtype)
    per_pack = 16 // weight.element_size()
    return (code is not None and weight.is_contiguous() and weight.data_ptr() % 16 == 0
            and x.stride(-1) == 1 and x.stride(0) % per_pack == 0 and x.data_ptr() % 16 == 0
            and get_bindings().gemv_supports(x.shape[0], weight.shape[1], code))


def on_16_byte_packs(t: Optional[torch.Tensor]) -> bool:
    """An optional operand of the compiled GEMVs' prologues (bias, norm weight, residual) that they
    can read 16 bytes at a time: absent, or starting on a 16-byte boundary with a unit last stride
    and, for rows, whole 16-byte packs between rows."""
    return t is None or (t.data_ptr() % 16 == 0 and t.stride(-1) == 1
                         and (t.dim() == 1 or (t.stride(0) * t.element_size()) % 16 == 0))


def gemv_fits(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
              norm_weight: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None) -> bool:
    """gemv_supported, and the other operands on 16-byte packs (a residual's rows too)."""
    return gemv_supported(x, weight) and all(on_16_byte_packs(t) for t in (bias, norm_weight, residual))


def use_gemv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
             norm_weight: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None) -> bool:
    """Whether a linear layer (weight [n, k]) on x runs as the compiled GEMV: one row."""
    n, k = weight.shape
    return (x.dim() == 2 and x.shape[0] == 1 and (k >= 2048 or n <= 16384)
            and gemv_fits(x, weight, bias, norm_weight, residual))


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, prologue: str = "none",
         residual: Optional[torch.Tensor] = None, norm_weight: Optional[torch.Tensor] = None,
         eps: float = 0.0) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(out, x + residual or None): one launch of the compiled GEMV, prologue "none",
    "rms_norm" (of x + residual when given) or "silu_and_mul" (x [rows, 2k])."""
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    total = torch.empty_like(residual, memory_format=torch.contiguous_format) if residual is not None else None
    launch("gemv", out, x, weight, bias, GEMV_PROLOGUES[prologue], residual, total, norm_weight, float(eps))
    return out, total


# ---- the ops -------------------------------------------------------------------------------------


@define
def matmul(a: Tensor, b: Tensor, transa: bool = False, transb: bool = False) -> Tensor:
    dtype = check_same_dtype("matmul", a, b)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul: operands need rank >= 2, got {list(a.shape)} and {list(b.shape)}")
    m, ka = (a.shape[-1], a.shape[-2]) if transa else (a.shape[-2], a.shape[-1])
    kb, n = (b.shape[-1], b.shape[-2]) if transb else (b.shape[-2], b.shape[-1])
    if ka != kb and -1 not in (ka, kb):
        raise ValueError(f"matmul: inner dims differ: {list(a.shape)}{' (transposed)' if transa else ''} x "
                         f"{list(b.shape)}{' (transposed)' if transb else ''}")
    batch = broadcast("matmul", a.shape[:-2], b.shape[:-2])
    return add_layer("matmul", [a, b], [(dtype, batch + (m, n))], transa=bool(transa), transb=bool(transb))


@matmul.implementation(REFERENCE)
def matmul_reference(a, b, *, transa=False, transb=False):
    return torch.matmul(a.mT if transa else a, b.mT if transb else b)


@define
def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """x @ weight.T + bias, weight [out, in]."""
    dtype = check_same_dtype("linear", x, weight, bias)
    return add_layer("linear", [x, weight, bias], [(dtype, linear_shape("linear", x.shape, weight, bias))])


@linear.implementation(REFERENCE)
def linear_reference(x, weight, bias=None):
    return F.linear(x, weight, bias)


@linear.implementation(CUDA)
def linear_cuda(x, weight, bias=None):
    if use_gemv(x, weight, bias):
        return gemv(x, weight, bias)[0]
    return F.linear(x, weight, bias)


@define
def rms_norm_linear(x: Tensor, norm_weight: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *,
                    eps: float) -> Tensor:
    """linear(rms_norm(x, norm_weight, eps), weight, bias)."""
    op = "rms_norm_linear"
    dtype = check_same_dtype(op, x, norm_weight, weight, bias)
    check_shape(op, norm_weight, x.shape[-1:], "norm_weight")
    return add_layer(op, [x, norm_weight, weight, bias], [(dtype, linear_shape(op, x.shape, weight, bias))],
                     eps=norm_eps(op, eps))


@rms_norm_linear.implementation(REFERENCE)
def rms_norm_linear_reference(x, norm_weight, weight, bias=None, *, eps):
    return linear_reference(rms_norm_reference(x, norm_weight, eps=eps), weight, bias)


@rms_norm_linear.implementation(CPU)
def rms_norm_linear_cpu(x, norm_weight, weight, bias=None, *, eps):
    return linear_reference(rms_norm_cpu(x, norm_weight, eps=eps), weight, bias)


@rms_norm_linear.implementation(CUDA)
def rms_norm_linear_cuda(x, norm_weight, weight, bias=None, *, eps):
    if use_gemv(x, weight, bias, norm_weight):
        return gemv(x, weight, bias, "rms_norm", norm_weight=norm_weight, eps=eps)[0]
    return F.linear(rms_norm_cuda(x, norm_weight, eps=eps), weight, bias)


@define
def add_rms_norm_linear(x: Tensor, residual: Tensor, norm_weight: Tensor, weight: Tensor,
                        bias: Optional[Tensor] = None, *, eps: float) -> tuple[Tensor, Tensor]:
    """(linear(rms_norm(x + residual, norm_weight, eps), weight, bias), x + residual)."""
    op = "add_rms_norm_linear"
    dtype = check_same_dtype(op, x, residual, norm_weight, weight, bias)
    total = residual_sum_shape(op, x, residual)
    check_shape(op, norm_weight, total[-1:], "norm_weight")
    return add_layer(op, [x, residual, norm_weight, weight, bias],
                     [(dtype, linear_shape(op, total, weight, bias)), (dtype, total)], eps=norm_eps(op, eps))


@add_rms_norm_linear.implementation(REFERENCE)
def add_rms_norm_linear_reference(x, residual, norm_weight, weight, bias=None, *, eps):
    normed, total = fused_add_rms_norm_reference(x, residual, norm_weight, eps=eps)
    return linear_reference(normed, weight, bias), total


@add_rms_norm_linear.implementation(CPU)
def add_rms_norm_linear_cpu(x, residual, norm_weight, weight, bias=None, *, eps):
    normed, total = fused_add_rms_norm_cpu(x, residual, norm_weight, eps=eps)
    return linear_reference(normed, weight, bias), total


@add_rms_norm_linear.implementation(CUDA)
def add_rms_norm_linear_cuda(x, residual, norm_weight, weight, bias=None, *, eps):
    if use_gemv(x, weight, bias, norm_weight, residual):
        return gemv(x, weight, bias, "rms_norm", residual, norm_weight, eps)
    normed, total = fused_add_rms_norm_cuda(x, residual, norm_weight, eps=eps)
    return F.linear(normed, weight, bias), total


@define
def silu_and_mul_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """linear(silu_and_mul(x), weight, bias) for x [..., 2K], weight [N, K]."""
    op = "silu_and_mul_linear"
    dtype = check_same_dtype(op, x, weight, bias)
    gated = gated_shape(op, x.shape)
    shape = linear_shape(op, gated, weight, bias, what=f"input {list(x.shape)} gated to")
    return add_layer(op, [x, weight, bias], [(dtype, shape)])


@silu_and_mul_linear.implementation(REFERENCE)
def silu_and_mul_linear_reference(x, weight, bias=None):
    return linear_reference(silu_and_mul_reference(x), weight, bias)


@silu_and_mul_linear.implementation(CPU)
def silu_and_mul_linear_cpu(x, weight, bias=None):
    return linear_reference(silu_and_mul_cpu(x), weight, bias)


@silu_and_mul_linear.implementation(CUDA)
def silu_and_mul_linear_cuda(x, weight, bias=None):
    if use_gemv(x, weight, bias):
        return gemv(x, weight, bias, "silu_and_mul")[0]
    return F.linear(silu_and_mul_cuda(x), weight, bias)
