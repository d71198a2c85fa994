"""Normalisations over the last dim: layer_norm, rms_norm and fused_add_rms_norm (a residual
add and the rms_norm of the sum, made by the fuse_add_rms_norm pass).

rms_norm means what transformers computes (LlamaRMSNorm): the mean square and the
normalisation in float32, the normalised value rounded to x's dtype, then scaled by the
weight in that dtype (rounded again). The CUDA kernel scales in float32 and rounds once, so it
may differ from the reference by a unit in the last place of the dtype; the host kernel (the CPU's
float32 rows, kernels/host_rms_norm.cpp) sums the squares in another order than PyTorch, within
float32 rounding. The residual sum of fused_add_rms_norm is one add in x's dtype everywhere:
bit-exact.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from ..network import Tensor, shapes_compatible
from .launch import bindings_available, launch, rows
from .op import CPU, CUDA, REFERENCE, Shape, add_layer, broadcast, check_same_dtype, check_shape, define


def check_norm_params(op: str, x: Tensor, *params: Optional[Tensor]) -> None:
    check_same_dtype(op, x, *params)
    for p in params:
        if p is not None:
            check_shape(op, p, x.shape[-1:], p.name)


def norm_eps(op: str, eps) -> float:
    """A norm's epsilon as its op records it: a finite float >= 0, what every kernel takes (an
    engine file's other value is refused at load by the replay of its ops, engine_check)."""
    value = float(eps)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{op}: eps must be finite and >= 0, got {eps}")
    return value


def residual_sum_shape(op: str, x: Tensor, residual: Tensor) -> Shape:
    """x + residual without broadcasting (fused kernels add row by row)."""
    if not shapes_compatible(x.shape, residual.shape):
        raise ValueError(f"{op}: x {list(x.shape)} and residual {list(residual.shape)} differ")
    return broadcast(op, x.shape, residual.shape)


@define
def layer_norm(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """Normalises over the last dim; statistics in float32."""
    check_norm_params("layer_norm", x, weight, bias)
    return add_layer("layer_norm", [x, weight, bias], [(x.dtype, x.shape)], eps=norm_eps("layer_norm", eps))


@layer_norm.implementation(REFERENCE)
def layer_norm_reference(x, weight=None, bias=None, *, eps):
    h = x.shape[-1:]
    w = None if weight is None else weight.float()
    b = None if bias is None else bias.float()
    return F.layer_norm(x.float(), h, w, b, eps).to(x.dtype)


@define
def rms_norm(x: Tensor, weight: Optional[Tensor] = None, eps: float = 1e-6) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim; statistics in float32."""
    check_norm_params("rms_norm", x, weight)
    return add_layer("rms_norm", [x, weight], [(x.dtype, x.shape)], eps=norm_eps("rms_norm", eps))


@rms_norm.implementation(REFERENCE)
def rms_norm_reference(x, weight=None, *, eps):
    if x.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    # Half precision: normalise in float32, round, then scale (transformers' order).
    xf = x.float()
    out = (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).to(x.dtype)
    return out if weight is None else out * weight


def _norm_kernel(kernel: str, x, weight, eps, residual=None):
    """The compiled RMSNorm (`rms_norm` on a GPU, `host_rms_norm` on the CPU): out, or (out,
    x + residual) with a residual. Lean on purpose: a CPU decode step makes about 60 of these
    calls, where each reshape or view costs 2-4 us against the kernel's 10-us call."""
    x2 = rows(x)
    out = torch.empty_like(x2, memory_format=torch.contiguous_format)
    total = None if residual is None else torch.empty_like(out)
    if out.numel():
        if residual is None:
            launch(kernel, out, x2, weight.contiguous(), float(eps))
        else:
            launch(kernel, out, x2, weight.contiguous(), float(eps), residual=rows(residual), residual_out=total)
    if x.dim() != 2:
        out = out.view(x.shape)
        total = None if total is None else total.view(x.shape)
    return out if residual is None else (out, total)


def host_norm_serves(x, weight) -> bool:
    """Whether host_rms_norm takes this call: float32 rows and weight, the bindings built."""
    return weight is not None and x.dtype == torch.float32 and weight.dtype == torch.float32 and bindings_available()


@rms_norm.implementation(CUDA)
def rms_norm_cuda(x, weight=None, *, eps):
    if weight is None:  # the kernel takes a weight
        return rms_norm_reference(x, weight, eps=eps)
    return _norm_kernel("rms_norm", x, weight, eps)


# The fused norm + linear ops (linear.py, fp8_linear.py) normalise with these on the CPU too, so
# that the builder's fusions keep a CPU engine's logits bit for bit (tests/test_builder.py).
@rms_norm.implementation(CPU)
def rms_norm_cpu(x, weight=None, *, eps):
    if not host_norm_serves(x, weight):
        return rms_norm_reference(x, weight, eps=eps)
    return _norm_kernel("host_rms_norm", x, weight, eps)


@define
def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Optional[Tensor] = None, eps: float = 1e-6):
    """(rms_norm(x + residual) * weight, x + residual)."""
    check_norm_params("fused_add_rms_norm", x, weight)
    check_same_dtype("fused_add_rms_norm", x, residual)
    shape = residual_sum_shape("fused_add_rms_norm", x, residual)
    return add_layer("fused_add_rms_norm", [x, residual, weight], [(x.dtype, shape), (x.dtype, shape)],
                     eps=norm_eps("fused_add_rms_norm", eps))


@fused_add_rms_norm.implementation(REFERENCE)
def fused_add_rms_norm_reference(x, residual, weight=None, *, eps):
    total = x + residual
    return rms_norm_reference(total, weight, eps=eps), total


@fused_add_rms_norm.implementation(CUDA)
def fused_add_rms_norm_cuda(x, residual, weight=None, *, eps):
    if weight is None:
        return fused_add_rms_norm_reference(x, residual, weight, eps=eps)
    return _norm_kernel("rms_norm", x, weight, eps, residual)


@fused_add_rms_norm.implementation(CPU)
def fused_add_rms_norm_cpu(x, residual, weight=None, *, eps):
    if not host_norm_serves(x, weight) or residual.dtype != x.dtype or residual.shape != x.shape:
        return fused_add_rms_norm_reference(x, residual, weight, eps=eps)
    return _norm_kernel("host_rms_norm", x, weight, eps, residual)
