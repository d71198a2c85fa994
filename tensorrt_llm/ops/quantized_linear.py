"""Weight-only quantized linear: `weight_only_linear`, x @ W^T (+ bias) with an INT8 or INT4
weight (tensorrt_llm/quantization/formats.py holds the layouts; W8A16 / W4A16).

    weight_only_linear(x, qweight, scales, zeros, bias, weight_format="int8"|"int4", group_size=G)

- INT8: qweight int8 [N, K], scales [N] (group_size 0: per output channel) or [N, K / G];
  zeros None.
- INT4: qweight uint8 [N, K / 2] (two codes a byte, even inputs in the low nibble), scales
  and zeros [N, K / G] of one float dtype (W = code * scale + zero).

x is float32 / float16 / bfloat16 [..., K]; the output has x's dtype and shape [..., N].

Implementations:
- reference: `quantized_linear_reference` (dequantize to float32, x @ W^T in float32, back to
  x's dtype): the meaning of the op, on every device.
- cuda: the compiled kernels (cpp/kernels/weight_only_gemv.cu), through
  `weight_only_matmul_cuda`. Up to GEMV_MAX_ROWS rows (decode) the weight-only GEMV reads the
  weight once per tile of rows, turning the codes into exact small integers in registers (float16 / bfloat16 x:
  tensor-core products summed in float32; float32 x: float FMAs), with the group's scale and
  zero applied once per group's part of a 4-pack step (128 INT4 / 64 INT8 codes; float32 x: per
  pack), which differs from the reference by float32 roundings only, then rounds once to x's
  dtype. More rows (prompt steps) dequantize the weight to x's dtype
  (W = code * scale + zero in float32 exactly as formats.py, rounded once) and multiply with
  cuBLAS: the weight's rounding to float16 / bfloat16 is that path's extra error. A call the
  kernels' 16-byte packs cannot read (an INT8 in_features not a multiple of 16, a weight not on
  a 16-byte boundary) runs the reference instead, deliberately.
- cpu: torch's `_weight_int8pack_mm` / `_weight_int4pack_mm_for_cpu` through
  quantization/cpu.py, the weight packed once per weight tensor (at the first call) and kept
  while that tensor lives. The kernels take bfloat16 activations, scales and zeros and round
  the output to bfloat16: against the reference that is a relative error of a few 2^-9 per
  output (cpu.py's docstring). INT8 group 16 (GGUF Q6_K) is requantized per row there.

rms_norm_weight_only_linear, add_rms_norm_weight_only_linear and silu_and_mul_weight_only_linear
are the op with the RMSNorm (after a residual add) or SiLU-and-mul that produces its x fused in
front (graph_rewriting's fuse_norm_linear and fuse_act_linear make them, as for linear and
fp8_linear): one pipelined GEMV kernel on a GPU where it serves (the section at the end).
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch
import torch.nn.functional as F

from ..network import Tensor
from ..quantization import cpu as qcpu
from ..quantization.formats import Int4Weight, Int8Weight, quantized_linear_reference
from ..quantization.mode import INT4_GROUP_SIZES, INT8_GROUP_SIZES
from .activation import gated_shape, silu_and_mul_cuda, silu_and_mul_reference
from .launch import cuda_kernels_available, dtype_code, get_bindings, launch, rows
from .linear import GEMV_PROLOGUES, linear_shape, on_16_byte_packs
from .norm import (
    fused_add_rms_norm_cuda,
    fused_add_rms_norm_reference,
    residual_sum_shape,
    rms_norm_cuda,
    rms_norm_reference,
)
from .op import CPU, CUDA, REFERENCE, add_layer, check_same_dtype, check_shape, define

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
WEIGHT_FORMATS = ("int8", "int4")


def _weight(qweight: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor], weight_format: str,
            group_size: int):
    """The formats.py weight of the op's tensors (validated there)."""
    if weight_format == "int8":
        return Int8Weight(qweight, scales, group_size or None)
    return Int4Weight(qweight, scales, zeros, group_size)


def _weight_only_shape(op: str, x_shape, x_dtype: str, qweight: Tensor, scales: Tensor, zeros: Optional[Tensor],
                       bias: Optional[Tensor], weight_format: str, group_size: int, what: str = "input"):
    """The output shape of a weight-only linear over an input of x_shape, its weight checked."""
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"{op}: weight_format {weight_format!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ValueError(f"{op}: group_size must be an integer, got {group_size!r}")
    if x_dtype not in FLOAT_DTYPES:
        raise ValueError(f"{op}: x must be {' / '.join(FLOAT_DTYPES)}, got {x_dtype}")
    if qweight.ndim != 2 or any(d < 1 for d in qweight.shape):
        raise ValueError(f"{op}: qweight must be a static [out, in] matrix, got {list(qweight.shape)}")
    if scales.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{op}: scales must be {' / '.join(FLOAT_DTYPES)}, got {scales.dtype}")
    n = qweight.shape[0]
    if weight_format == "int8":
        if qweight.dtype != "int8":
            raise ValueError(f"{op}: an INT8 qweight is int8, got {qweight.dtype}")
        k = qweight.shape[1]
        if zeros is not None:
            raise ValueError(f"{op}: INT8 weights are symmetric: no zeros")
        if group_size == 0:
            check_shape(op, scales, (n,), "scales (per output channel)")
        else:
            if group_size not in INT8_GROUP_SIZES or k % group_size:
                raise ValueError(f"{op}: INT8 group size {group_size} is not one of "
                                 f"{INT8_GROUP_SIZES} dividing in_features {k}")
            check_shape(op, scales, (n, k // group_size), "scales")
    else:
        if qweight.dtype != "uint8":
            raise ValueError(f"{op}: an INT4 qweight is uint8 (two codes a byte), got {qweight.dtype}")
        k = 2 * qweight.shape[1]
        if group_size not in INT4_GROUP_SIZES or k % group_size:
            raise ValueError(f"{op}: INT4 group size {group_size} is not one of "
                             f"{INT4_GROUP_SIZES} dividing in_features {k}")
        check_shape(op, scales, (n, k // group_size), "scales")
        if zeros is None or zeros.dtype != scales.dtype:
            raise ValueError(f"{op}: INT4 needs zeros of the scales' dtype {scales.dtype}, got "
                             f"{'none' if zeros is None else zeros.dtype}")
        check_shape(op, zeros, (n, k // group_size), "zeros")
    return linear_shape(op, x_shape, (n, k), bias, dtype=x_dtype, what=what)


@define
def weight_only_linear(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Optional[Tensor] = None,
                       bias: Optional[Tensor] = None, *, weight_format: str, group_size: int = 0) -> Tensor:
    """x @ W^T + bias with W the INT8 / INT4 weight of qweight, scales (and zeros)."""
    shape = _weight_only_shape("weight_only_linear", x.shape, x.dtype, qweight, scales, zeros, bias, weight_format,
                               group_size)
    return add_layer("weight_only_linear", [x, qweight, scales, zeros, bias], [(x.dtype, shape)],
                     weight_format=weight_format, group_size=int(group_size))


@weight_only_linear.implementation(REFERENCE)
def weight_only_linear_reference(x, qweight, scales, zeros=None, bias=None, *, weight_format, group_size=0):
    return quantized_linear_reference(x, _weight(qweight, scales, zeros, weight_format, group_size), bias)


# ---- CPU: torch's int8pack / int4pack kernels, each weight packed once ------------------------

# id(qweight) -> (weakref to qweight, its data_ptr and version, the pack). A weight tensor of
# an engine lives as long as its session; the entry goes with it.
_PACKS: dict[int, tuple] = {}


def _forget(key: int, packs: dict = _PACKS) -> None:
    entry = packs.get(key)
    if entry is not None and entry[0]() is None:  # not a newer tensor's entry under a reused id
        del packs[key]


def cpu_pack(qweight: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor], weight_format: str,
             group_size: int):
    """The CPU kernel's layout of this weight, made at the first call and reused while the
    qweight tensor lives unchanged (a refit writes new tensors or bumps their version)."""
    key = id(qweight)
    stamp = (qweight.data_ptr(), qweight._version, scales.data_ptr(), scales._version)
    entry = _PACKS.get(key)
    if entry is not None and entry[0]() is qweight and entry[1] == stamp:
        return entry[2]
    w = _weight(qweight, scales, zeros, weight_format, group_size)
    pack = qcpu.pack_int8_for_cpu(w) if weight_format == "int8" else qcpu.pack_int4_for_cpu(w)
    _PACKS[key] = (weakref.ref(qweight, lambda _ref, key=key, forget=_forget: forget(key)), stamp, pack)
    return pack


@weight_only_linear.implementation(CPU)
def weight_only_linear_cpu(x, qweight, scales, zeros=None, bias=None, *, weight_format, group_size=0):
    pack = cpu_pack(qweight, scales, zeros, weight_format, group_size)
    if weight_format == "int8":
        return qcpu.int8_weight_only_linear(x, pack, bias)
    return qcpu.int4_weight_only_linear(x, pack, bias)


# ---- CUDA: the weight-only GEMV (decode) or dequantization + cuBLAS (prompt steps) ------------

# Rows the GEMV serves; more run as dequantization + cuBLAS. The GEMV reads the weight once per
# 32 rows of x (INT4: 16, float32 x: 8): up to 64 rows its passes over the codes still read fewer
# bytes than the dequantization's write and cuBLAS's read of a float16 / bfloat16 copy.
GEMV_MAX_ROWS = 64
# The binding's limit on in_features for the GEMV (the float32-activation kernel keeps a row of
# x as float32 in shared memory).
GEMV_MAX_K = 32768


def _codes_per_pack(weight_format: str) -> int:
    return 16 if weight_format == "int8" else 32


def cuda_serves(x: torch.Tensor, qweight: torch.Tensor, weight_format: str) -> bool:
    """Whether the compiled kernels serve this call: CUDA tensors, in_features a multiple of a
    16-byte pack's codes (16 INT8 / 32 INT4: always true of INT4 and of group-wise INT8), and a
    contiguous qweight on a 16-byte boundary."""
    k = x.shape[-1]
    return (x.is_cuda and cuda_kernels_available() and k % _codes_per_pack(weight_format) == 0
            and qweight.is_contiguous() and qweight.data_ptr() % 16 == 0)


def _gemv_launch(out, x2, qweight, scales, zeros, bias, weight_format, group_size, prologue="none",
                 residual=None, residual_out=None, norm_weight=None, eps=0.0) -> None:
    words = qweight.view(torch.int32)  # the kernels read the bytes as int32 words, in 16-byte packs
    launch("weight_only_gemv", out, x2, words, scales, zeros, bias, weight_format, int(group_size),
           GEMV_PROLOGUES[prologue], residual, residual_out, norm_weight, float(eps))


def weight_only_matmul_cuda(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                            zeros: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, *,
                            weight_format: str, group_size: int = 0,
                            perm: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x[..., perm] @ W^T (+ bias) with the compiled kernels, for a call `cuda_serves`; perm is
    INT4's act-order input permutation (formats.py), applied to x by a gather first."""
    if perm is not None:
        x = x.index_select(-1, perm.to(device=x.device, dtype=torch.long))
    x2 = rows(x)
    m, k = x2.shape
    n = qweight.shape[0]
    scales = scales.contiguous()
    zeros = None if zeros is None else zeros.contiguous()
    bias = None if bias is None else bias.contiguous()
    if m <= GEMV_MAX_ROWS and k <= GEMV_MAX_K:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        if m:
            _gemv_launch(out, x2, qweight, scales, zeros, bias, weight_format, group_size)
    else:
        # Prompt steps are bound by arithmetic, not by the weight's bytes: a scratch copy of W in
        # x's dtype for cuBLAS's tensor cores costs one more pass over N * K elements.
        w = torch.empty(n, k, dtype=x.dtype, device=x.device)
        launch("weight_only_dequantize", w, qweight.view(torch.int32), scales, zeros, weight_format, int(group_size))
        out = F.linear(x2, w, bias)
    return out.reshape(*x.shape[:-1], n)


@weight_only_linear.implementation(CUDA)
def weight_only_linear_cuda(x, qweight, scales, zeros=None, bias=None, *, weight_format, group_size=0):
    if not cuda_serves(x, qweight, weight_format):
        return weight_only_linear_reference(x, qweight, scales, zeros, bias, weight_format=weight_format,
                                            group_size=group_size)
    return weight_only_matmul_cuda(x, qweight, scales, zeros, bias, weight_format=weight_format,
                                   group_size=group_size)


# ---- the linear with the RMSNorm / SiLU-and-mul that makes its x fused in front ---------------
# rms_norm_weight_only_linear, add_rms_norm_weight_only_linear and silu_and_mul_weight_only_linear
# are weight_only_linear after that op, as linear.py's rms_norm_linear family is for a float
# linear (made by the same fusion passes, graph_rewriting). The reference and the CPU run the two
# ops one after the other (the CPU's weight-only kernels keep serving the linear); on a GPU, a
# call weight_only_gemv_prologue_serves runs as one weight-only GEMV that computes its x in front
# (cpp/kernels/weight_only_gemv.cu, the pipelined kernel: rounded as the rms_norm / silu_and_mul
# kernels round, so it equals those kernels then the GEMV), else the unfused CUDA ops.

def weight_only_gemv_prologue_serves(prologue: str, x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                                     weight_format: str, group_size: int, *operands: Optional[torch.Tensor]) -> bool:
    """Whether the weight-only GEMV serves x2 ([M, K]; SiLU-and-mul [M, 2K]) with `prologue` in
    front: the compiled kernels, the binding's weight_only_gemv_prologue_supports (the pipelined
    kernel's formats, 1..8 rows that fit its staged x), every operand on 16-byte packs."""
    if not (x2.is_cuda and cuda_kernels_available() and qweight.is_contiguous() and qweight.data_ptr() % 16 == 0):
        return False
    bits = 8 if weight_format == "int8" else 4
    k = qweight.shape[1] * 8 // bits
    code, scale_code = dtype_code(x2.dtype), dtype_code(scales.dtype)
    return (code is not None and scale_code is not None and all(on_16_byte_packs(t) for t in (x2, *operands))
            and get_bindings().weight_only_gemv_prologue_supports(GEMV_PROLOGUES[prologue], x2.shape[0], k, bits,
                                                                  int(group_size), code, scale_code))


def _fused_gemv(prologue, x2, qweight, scales, zeros, bias, weight_format, group_size, residual=None,
                norm_weight=None, eps=0.0):
    """(out [M, N], x2 + residual or None): the weight-only GEMV with `prologue` in front."""
    out = torch.empty(x2.shape[0], qweight.shape[0], dtype=x2.dtype, device=x2.device)
    total = None if residual is None else torch.empty_like(residual, memory_format=torch.contiguous_format)
    _gemv_launch(out, x2, qweight, scales.contiguous(), None if zeros is None else zeros.contiguous(),
                 None if bias is None else bias.contiguous(), weight_format, group_size, prologue, residual, total,
                 norm_weight, eps)
    return out, total


@define
def rms_norm_weight_only_linear(x: Tensor, norm_weight: Tensor, qweight: Tensor, scales: Tensor,
                                zeros: Optional[Tensor] = None, bias: Optional[Tensor] = None, *, eps: float,
                                weight_format: str, group_size: int = 0) -> Tensor:
    """weight_only_linear(rms_norm(x, norm_weight, eps), qweight, scales, zeros, bias, ...)."""
    op = "rms_norm_weight_only_linear"
    check_same_dtype(op, x, norm_weight)
    check_shape(op, norm_weight, x.shape[-1:], "norm_weight")
    shape = _weight_only_shape(op, x.shape, x.dtype, qweight, scales, zeros, bias, weight_format, group_size)
    return add_layer(op, [x, norm_weight, qweight, scales, zeros, bias], [(x.dtype, shape)], eps=float(eps),
                     weight_format=weight_format, group_size=int(group_size))


@rms_norm_weight_only_linear.implementation(REFERENCE)
def rms_norm_weight_only_linear_reference(x, norm_weight, qweight, scales, zeros=None, bias=None, *, eps,
                                          weight_format, group_size=0):
    return weight_only_linear_reference(rms_norm_reference(x, norm_weight, eps=eps), qweight, scales, zeros, bias,
                                        weight_format=weight_format, group_size=group_size)


@rms_norm_weight_only_linear.implementation(CPU)
def rms_norm_weight_only_linear_cpu(x, norm_weight, qweight, scales, zeros=None, bias=None, *, eps,
                                    weight_format, group_size=0):
    return weight_only_linear_cpu(rms_norm_reference(x, norm_weight, eps=eps), qweight, scales, zeros, bias,
                                  weight_format=weight_format, group_size=group_size)


@rms_norm_weight_only_linear.implementation(CUDA)
def rms_norm_weight_only_linear_cuda(x, norm_weight, qweight, scales, zeros=None, bias=None, *, eps,
                                     weight_format, group_size=0):
    x2 = rows(x)
    if weight_only_gemv_prologue_serves("rms_norm", x2, qweight, scales, weight_format, group_size, norm_weight,
                                        bias):
        out, _ = _fused_gemv("rms_norm", x2, qweight, scales, zeros, bias, weight_format, group_size,
                             norm_weight=norm_weight, eps=eps)
        return out.reshape(*x.shape[:-1], qweight.shape[0])
    return weight_only_linear_cuda(rms_norm_cuda(x, norm_weight, eps=eps), qweight, scales, zeros, bias,
                                   weight_format=weight_format, group_size=group_size)


@define
def add_rms_norm_weight_only_linear(x: Tensor, residual: Tensor, norm_weight: Tensor, qweight: Tensor, scales: Tensor,
                                    zeros: Optional[Tensor] = None, bias: Optional[Tensor] = None, *, eps: float,
                                    weight_format: str, group_size: int = 0) -> tuple[Tensor, Tensor]:
    """(weight_only_linear(rms_norm(x + residual, norm_weight, eps), qweight, ...), x + residual)."""
    op = "add_rms_norm_weight_only_linear"
    check_same_dtype(op, x, residual, norm_weight)
    total = residual_sum_shape(op, x, residual)
    check_shape(op, norm_weight, total[-1:], "norm_weight")
    shape = _weight_only_shape(op, total, x.dtype, qweight, scales, zeros, bias, weight_format, group_size)
    return add_layer(op, [x, residual, norm_weight, qweight, scales, zeros, bias], [(x.dtype, shape), (x.dtype, total)],
                     eps=float(eps), weight_format=weight_format, group_size=int(group_size))


@add_rms_norm_weight_only_linear.implementation(REFERENCE)
def add_rms_norm_weight_only_linear_reference(x, residual, norm_weight, qweight, scales, zeros=None, bias=None, *,
                                              eps, weight_format, group_size=0):
    normed, total = fused_add_rms_norm_reference(x, residual, norm_weight, eps=eps)
    return weight_only_linear_reference(normed, qweight, scales, zeros, bias, weight_format=weight_format,
                                        group_size=group_size), total


@add_rms_norm_weight_only_linear.implementation(CPU)
def add_rms_norm_weight_only_linear_cpu(x, residual, norm_weight, qweight, scales, zeros=None, bias=None, *,
                                        eps, weight_format, group_size=0):
    normed, total = fused_add_rms_norm_reference(x, residual, norm_weight, eps=eps)
    return weight_only_linear_cpu(normed, qweight, scales, zeros, bias, weight_format=weight_format,
                                  group_size=group_size), total


@add_rms_norm_weight_only_linear.implementation(CUDA)
def add_rms_norm_weight_only_linear_cuda(x, residual, norm_weight, qweight, scales, zeros=None, bias=None, *,
                                         eps, weight_format, group_size=0):
    x2, r2 = rows(x), rows(residual)
    if x.shape == residual.shape and weight_only_gemv_prologue_serves(
            "rms_norm", x2, qweight, scales, weight_format, group_size, r2, norm_weight, bias):
        out, total = _fused_gemv("rms_norm", x2, qweight, scales, zeros, bias, weight_format, group_size, r2,
                                 norm_weight, eps)
        return out.reshape(*x.shape[:-1], qweight.shape[0]), total.reshape(x.shape)
    normed, total = fused_add_rms_norm_cuda(x, residual, norm_weight, eps=eps)
    return weight_only_linear_cuda(normed, qweight, scales, zeros, bias, weight_format=weight_format,
                                   group_size=group_size), total


@define
def silu_and_mul_weight_only_linear(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Optional[Tensor] = None,
                                    bias: Optional[Tensor] = None, *, weight_format: str,
                                    group_size: int = 0) -> Tensor:
    """weight_only_linear(silu_and_mul(x), qweight, ...) for x [..., 2K], the weight [N, K]."""
    op = "silu_and_mul_weight_only_linear"
    gated = gated_shape(op, x.shape)
    shape = _weight_only_shape(op, gated, x.dtype, qweight, scales, zeros, bias, weight_format, group_size,
                               what=f"input {list(x.shape)} gated to")
    return add_layer(op, [x, qweight, scales, zeros, bias], [(x.dtype, shape)], weight_format=weight_format,
                     group_size=int(group_size))


@silu_and_mul_weight_only_linear.implementation(REFERENCE)
def silu_and_mul_weight_only_linear_reference(x, qweight, scales, zeros=None, bias=None, *, weight_format,
                                              group_size=0):
    return weight_only_linear_reference(silu_and_mul_reference(x), qweight, scales, zeros, bias,
                                        weight_format=weight_format, group_size=group_size)


@silu_and_mul_weight_only_linear.implementation(CPU)
def silu_and_mul_weight_only_linear_cpu(x, qweight, scales, zeros=None, bias=None, *, weight_format, group_size=0):
    return weight_only_linear_cpu(silu_and_mul_reference(x), qweight, scales, zeros, bias,
                                  weight_format=weight_format, group_size=group_size)


@silu_and_mul_weight_only_linear.implementation(CUDA)
def silu_and_mul_weight_only_linear_cuda(x, qweight, scales, zeros=None, bias=None, *, weight_format, group_size=0):
    x2 = rows(x)
    if weight_only_gemv_prologue_serves("silu_and_mul", x2, qweight, scales, weight_format, group_size, bias):
        out, _ = _fused_gemv("silu_and_mul", x2, qweight, scales, zeros, bias, weight_format, group_size)
        return out.reshape(*x.shape[:-1], qweight.shape[0])
    return weight_only_linear_cuda(silu_and_mul_cuda(x), qweight, scales, zeros, bias, weight_format=weight_format,
                                   group_size=group_size)
