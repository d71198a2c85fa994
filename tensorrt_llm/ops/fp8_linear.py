"""FP8 linear (W8A8): `fp8_linear`, x @ W^T (+ bias) with FP8 E4M3 weights and activations
(tensorrt_llm/quantization/formats.py, `Fp8Weight`, holds the layout).

    fp8_linear(x, qweight, weight_scale, input_scale=None, bias=None)

- qweight: uint8 [N, K], the E4M3 codes' bytes. Graphs and engines spell dtypes from
  _utils's table, which has no FP8 dtype, so the codes travel as their bit patterns and the
  implementations view them as torch.float8_e4m3fn (free: same bytes).
- weight_scale: float32 [1] (per tensor) or [N] (per output channel): W = float(q) * scale.
- input_scale: float32 [1], the calibrated static activation scale (x is quantized as
  x times its float32 reciprocal), or None: each token's row is quantized with its own amax / 448.
- bias: x's dtype [N], added after the product.

x is float32 / float16 / bfloat16 [..., K]; the output has x's dtype and shape [..., N]. The
activation's quantization (times its scale's reciprocal, clamp to +-448, round to E4M3) is part of the op.

rms_norm_fp8_linear, add_rms_norm_fp8_linear and silu_and_mul_fp8_linear are the op with the
RMSNorm (after a residual add) or SiLU-and-mul that produces its x fused in front, as
linear.py's rms_norm_linear family is for a float linear (made by the same fusion passes).
add_rms_norm_fp8_gated_mlp is the last two in a row (a LLaMA MLP: gate_up, then down), so that
within the GEMV's rows silu_and_mul runs in gate_up's epilogue (fp8_gemv's `gated`).
gpt_attention_fp8_linear is gpt_attention and the fp8_linear reading it (the o projection), so
that a decode step's attention kernel writes the linear's codes (the fuse_attention_fp8_linear pass).

Implementations:
- reference: quantize x as the format says, dequantize both operands to float32, matmul in
  float32, back to x's dtype (formats.quantized_linear_reference): the meaning, on every
  device.
- cpu, few rows (decode, up to HOST_FP8_GEMV_MAX_ROWS, K a multiple of 8, a CPU with AVX2 and
  FMA): x quantized as the reference does, then our host kernel (`host_fp8_gemv`,
  cpp/kernels/host_fp8_gemv.cpp) turns each weight code into its exact value in registers and
  sums the exact products in float32, the scales once per output: the reference's result up to
  float32 roundings, without converting the whole weight to float32 on every call (the
  reference's cost: SmolLM2's FP8 engine decoded at 0.68 s a token on one thread). More rows
  (prompt steps), and CPUs without AVX2, run the reference.
- cuda, few rows (decode): with a static input scale, float16 / bfloat16 x and at most
  FP8_GEMV_MAX_ROWS rows, the FP8 GEMV (`fp8_gemv`, cpp/kernels/weight_only_gemv.cuh: the
  weight-only tensor-core GEMV with E4M3 codes) reads the weight once for all the rows: E4M3 weight
  bytes to exact float16 in registers, x quantized in the kernel exactly as
  formats.quantize_fp8_activation does (x times input_scale's float32 reciprocal, clamped to
  +-448, rounded to nearest E4M3), the exact products summed in float32 by mma.sync, times
  input_scale x weight_scale (per tensor or per channel) and plus bias in float32, rounded once
  to x's dtype: the reference's result up to float32 summation order. One kernel, where the
  path below takes several small ones (quantize x) and a cuBLASLt GEMM far from the weight's
  bytes bound at so few rows. in_features must be a multiple of 16 (16-byte packs), x rows on
  16-byte boundaries; other calls take the paths below.
- cuda, 9-32 rows on Hopper (a static input scale, N a multiple of 64, K of 128): x's codes (written
  by fp8_quantize, or by the norm / activation / attention kernel in front), then
  `fp8_gemm_wgmma` (cpp/kernels/sm90a/fp8_gemm_wgmma.cu): the tensor memory accelerator streams
  64 weight rows a block into shared memory, wgmma multiplies the E4M3 codes with float32
  accumulators, times input_scale x weight_scale, plus bias, rounded once. Its blocks request
  their first weight bytes while the previous kernel ends (programmatic dependent launch), where
  cuBLASLt's GEMM starts after it; a CUDA build that does not target sm_90 has no such kernel.
- cuda, otherwise: `torch._scaled_mm` (cuBLASLt FP8 GEMM, sm_89+; the builder refuses FP8 for older
  GPUs). Its second operand must be column-major, which W^T of a row-major [N, K] weight is,
  and K and N multiples of 16: other shapes run the reference. Any M (tokens) is taken as it
  is (torch 2.11 and 2.13 accept M = 1; releases that wanted M % 16 == 0 are older than the
  ones this project supports). Both scales per tensor: one tensor-wise GEMM in x's dtype.
  Otherwise the scales are row-wise ([M, 1] and [1, N]): cuBLASLt's row-wise FP8 GEMM writes
  bfloat16 only, so a bfloat16 x uses it, and float16 / float32 x take the unscaled product in
  float32 and scale it there. x is quantized with the reference's arithmetic (bit-identical
  codes) in one kernel (fp8_quantize, cpp/kernels/fp8_quantize.cu). Fast accumulation
  (SCALED_MM_FAST_ACCUM): Hopper's FP8 tensor cores keep their narrower accumulator over the
  whole K instead of cuBLASLt adding it into float32 every few products. The prompt's GEMMs run
  4-9% faster (an H200, LLaMA-8B's shapes at 2,048 tokens; nothing changes at 32 rows); on random
  data the output's error grows from 0.17% RMS (the rounding to bfloat16 alone) to 0.2-0.3%, a
  tenth of what the E4M3 rounding of x and W costs (about 3.7%). tests/ops/test_fp8_linear.py
  bounds it as losses of 2^-13 of the sum per addition adding up as a random walk.
  Speed on an H100 (CUDA graph, bfloat16 x, LLaMA-8B's shapes, 1 to 64 tokens): per-tensor
  scales (FP8, static) take 0.6-0.8x the time of the bfloat16 GEMM; row-wise scales (per
  channel or per token) take 1.05-1.95x, cuBLASLt's row-wise FP8 kernel being slow at so few
  rows. For speed, FP8 checkpoints should use per-tensor weight and static input scales.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from ..network import Tensor
from ..quantization.formats import FP8_DTYPE, Fp8Weight, quantize_fp8_activation, quantized_linear_reference
from .activation import gated_shape, silu_and_mul_cpu, silu_and_mul_cuda, silu_and_mul_reference
from .attention import check_attention, gpt_attention_cpu, gpt_attention_reference
from .attention_cuda import decode_step_cuda, decode_step_serves, gpt_attention_cuda
from .launch import bindings_available, cuda_capability, cuda_kernels_available, get_bindings, launch, rows
from .linear import linear_shape
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
from .op import CPU, CUDA, REFERENCE, add_layer, check_same_dtype, check_shape, define
from .quantized_linear import gated_epilogue_takes

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
# cuBLASLt's FP8 GEMM needs K and N multiples of this.
SCALED_MM_ALIGNMENT = 16
# Rows the FP8 GEMV serves (static input scale, float16 / bfloat16 x); more take the codes path
# (fp8_gemm_of_codes: Hopper's wgmma kernel up to 32 rows, else cuBLASLt). Up to
# 8 rows it is the pipelined kernel; at 9-32 rows its register kernel re-reads x from L2 for every
# 16 features and loses to cuBLASLt (H200, each layer alone, 16 rows, us: qkv 17.3 against 11.1,
# o 10.8 / 8.9, gate_up 55.6 / 33.4, down 31.3 / 22.3; 32 rows: 21.7 / 11.5, 14.5 / 8.9, 83.5 /
# 34.2, 47.2 / 21.4).
FP8_GEMV_MAX_ROWS = 8
# torch._scaled_mm's use_fast_accum for every FP8 GEMM (the module docstring says what it costs).
SCALED_MM_FAST_ACCUM = True


@define
def fp8_linear(x: Tensor, qweight: Tensor, weight_scale: Tensor, input_scale: Optional[Tensor] = None,
               bias: Optional[Tensor] = None) -> Tensor:
    """x @ W^T + bias with W the FP8 weight of qweight (E4M3 bytes) and weight_scale, x
    quantized to FP8 with input_scale (static) or per token (input_scale None)."""
    shape = _fp8_linear_shape("fp8_linear", x.shape, x.dtype, qweight, weight_scale, input_scale, bias)
    return add_layer("fp8_linear", [x, qweight, weight_scale, input_scale, bias], [(x.dtype, shape)])


def _fp8_linear_shape(op: str, x_shape, x_dtype: str, qweight: Tensor, weight_scale: Tensor,
                      input_scale: Optional[Tensor], bias: Optional[Tensor], what: str = "input"):
    """fp8_linear's operand rules for an input (`what`) of x_shape and x_dtype; its output shape."""
    if x_dtype not in FLOAT_DTYPES:
        raise ValueError(f"{op}: x must be {' / '.join(FLOAT_DTYPES)}, got {x_dtype}")
    if qweight.dtype != "uint8" or qweight.ndim != 2 or any(d < 1 for d in qweight.shape):
        raise ValueError(f"{op}: qweight must be the E4M3 codes' bytes, a static uint8 [out, in] matrix, "
                         f"got {qweight.dtype} {list(qweight.shape)}")
    n, k = qweight.shape
    if weight_scale.dtype != "float32" or tuple(weight_scale.shape) not in ((1,), (n,)):
        raise ValueError(f"{op}: weight_scale must be float32 [1] (per tensor) or [{n}] (per output channel), "
                         f"got {weight_scale.dtype} {list(weight_scale.shape)}")
    if input_scale is not None and (input_scale.dtype != "float32" or tuple(input_scale.shape) != (1,)):
        raise ValueError(f"{op}: input_scale must be float32 [1] (static) or absent (per token), "
                         f"got {input_scale.dtype} {list(input_scale.shape)}")
    return linear_shape(op, x_shape, (n, k), bias, what=what, dtype=x_dtype)


def _weight(qweight: torch.Tensor, weight_scale: torch.Tensor, input_scale: Optional[torch.Tensor]) -> Fp8Weight:
    return Fp8Weight(qweight.view(FP8_DTYPE), weight_scale, input_scale)


@fp8_linear.implementation(REFERENCE)
def fp8_linear_reference(x, qweight, weight_scale, input_scale=None, bias=None):
    return quantized_linear_reference(x, _weight(qweight, weight_scale, input_scale), bias)


# Rows of x the host kernel takes (decode); more (prompt steps) run the reference, whose conversion
# of the weight to float32 the rows then share.
HOST_FP8_GEMV_MAX_ROWS = 8


@functools.lru_cache(maxsize=None)
def _host_fp8_gemv_serves(k: int) -> bool:
    """Whether host_fp8_gemv takes in_features k here: the bindings, AVX2 + FMA, k % 8 == 0."""
    if not bindings_available():
        return False
    b = get_bindings()
    return bool(b.host_fp8_gemv_available() and b.host_fp8_gemv_serves(k))


@fp8_linear.implementation(CPU)
def fp8_linear_cpu(x, qweight, weight_scale, input_scale=None, bias=None):
    k = x.shape[-1]
    m = x.numel() // k if k else 0
    if not (0 < m <= HOST_FP8_GEMV_MAX_ROWS and _host_fp8_gemv_serves(k)):
        return fp8_linear_reference(x, qweight, weight_scale, input_scale, bias)
    codes, scale = quantize_fp8_activation(x.reshape(m, k), input_scale)
    n = qweight.shape[0]
    out = torch.empty(m, n)
    launch("host_fp8_gemv", out, codes.float(), qweight.contiguous(), weight_scale.float().contiguous(),
           scale.reshape(-1).contiguous(), None if bias is None else bias.float().contiguous(),
           torch.get_num_threads())
    return out.to(x.dtype).reshape(*x.shape[:-1], n)


# ---- CUDA: torch._scaled_mm ---------------------------------------------------------------------


def _static_scale(input_scale: torch.Tensor) -> torch.Tensor:
    """A static input scale as the kernels take it: float32 [1], contiguous."""
    return input_scale.float().reshape(1).contiguous()


def _quantize_activation_cuda(x2: torch.Tensor, input_scale: Optional[torch.Tensor]):
    """formats.quantize_fp8_activation's codes and scale ([1] static, [M, 1] per row) of x2 [M, K],
    bit for bit, by the fp8_quantize kernel: one pass over x, where PyTorch's ops take four through
    a float32 copy and cost more than the FP8 GEMM saves (the format's own code without the
    compiled kernels)."""
    if not (x2.is_cuda and cuda_kernels_available()):
        return quantize_fp8_activation(x2, input_scale)
    m, k = x2.shape
    codes = torch.empty(m, k, dtype=torch.uint8, device=x2.device)
    if input_scale is None:
        scale = torch.empty(m, dtype=torch.float32, device=x2.device)
        launch("fp8_quantize", codes.view(torch.int32), x2, None, scale)
        return codes.view(FP8_DTYPE), scale.reshape(m, 1)
    scale = _static_scale(input_scale)
    launch("fp8_quantize", codes.view(torch.int32), x2, scale, None)
    return codes.view(FP8_DTYPE), scale


def fp8_gemv_serves(x2: torch.Tensor, qweight: torch.Tensor, input_scale: Optional[torch.Tensor]) -> bool:
    """Whether the FP8 GEMV serves x2 [M, K]: rows it takes (fp8_gemv_takes) on 16-byte boundaries."""
    return (fp8_gemv_takes(x2.shape[0], x2.dtype, x2.device, qweight, input_scale) and x2.data_ptr() % 16 == 0
            and (x2.stride(0) * x2.element_size()) % 16 == 0)


def fp8_gemv_takes(m: int, dtype: torch.dtype, device: torch.device, qweight: torch.Tensor,
                   input_scale: Optional[torch.Tensor]) -> bool:
    """Whether the FP8 GEMV takes m rows of x in dtype on device (aligned as a fresh tensor is): a
    static input scale, float16 / bfloat16 x of at most FP8_GEMV_MAX_ROWS rows, K a multiple of
    16, a contiguous weight on a 16-byte boundary, the compiled kernels."""
    return (input_scale is not None and dtype in (torch.float16, torch.bfloat16) and m <= FP8_GEMV_MAX_ROWS
            and qweight.shape[1] % 16 == 0 and device.type == "cuda" and cuda_kernels_available()
            and qweight.is_contiguous() and qweight.data_ptr() % 16 == 0)


def fp8_gemv(x2: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor,
             bias: Optional[torch.Tensor] = None, gated: bool = False) -> torch.Tensor:
    """out [M, N] in x2's dtype: the FP8 GEMV on x2 [M, K] (a call fp8_gemv_serves). gated (a
    call fp8_gated_gemv_serves): out [M, N / 2] = silu_and_mul of that, in the GEMV's epilogue."""
    n = qweight.shape[0] // 2 if gated else qweight.shape[0]
    out = torch.empty(x2.shape[0], n, dtype=x2.dtype, device=x2.device)
    if x2.shape[0]:
        launch("fp8_gemv", out, x2, qweight.view(torch.int32), weight_scale.contiguous(),
               _static_scale(input_scale), None if bias is None else bias.contiguous(), gated=gated)
    return out


def fp8_gated_gemv_serves(x2: torch.Tensor, qweight: torch.Tensor, input_scale: Optional[torch.Tensor]) -> bool:
    """Whether the FP8 GEMV takes a gated MLP's gate_up [2I, K] with silu_and_mul in its epilogue:
    a call fp8_gemv_serves that gated_epilogue_takes."""
    return fp8_gemv_serves(x2, qweight, input_scale) and gated_epilogue_takes(x2, qweight.shape[0])


@fp8_linear.implementation(CUDA)
def fp8_linear_cuda(x, qweight, weight_scale, input_scale=None, bias=None):
    n, k = qweight.shape
    x2 = rows(x)
    if fp8_gemv_serves(x2, qweight, input_scale):
        return fp8_gemv(x2, qweight, weight_scale, input_scale, bias).reshape(*x.shape[:-1], n)
    return fp8_linear_scaled_mm(x, qweight, weight_scale, input_scale, bias)


def scaled_mm_serves(qweight: torch.Tensor) -> bool:
    """Whether cuBLASLt's FP8 GEMM takes the weight's shape (K and N multiples of 16)."""
    n, k = qweight.shape
    return k % SCALED_MM_ALIGNMENT == 0 and n % SCALED_MM_ALIGNMENT == 0


def fp8_linear_scaled_mm(x, qweight, weight_scale, input_scale=None, bias=None):
    """The codes path (any M): x quantized by fp8_quantize, then fp8_gemm_of_codes; or the
    reference for shapes cuBLASLt refuses."""
    if not scaled_mm_serves(qweight):
        return fp8_linear_reference(x, qweight, weight_scale, input_scale, bias)
    qx, x_scale = _quantize_activation_cuda(rows(x), input_scale)
    return fp8_gemm_of_codes(qx, x_scale, qweight, weight_scale, bias, x.dtype).reshape(*x.shape[:-1], -1)


def fp8_gemm_wgmma_takes(qx: torch.Tensor, x_scale: torch.Tensor, qweight: torch.Tensor,
                         out_dtype: torch.dtype) -> bool:
    """Whether Hopper's FP8 GEMM of few rows (fp8_gemm_wgmma) takes x's codes qx [M, K]: 1 to 32
    rows under one static scale, a float16 / bfloat16 output, N a multiple of 64 and K of 128,
    contiguous codes and weight on 16-byte boundaries, a build targeting sm_90 and a compute
    capability 9.0 GPU."""
    n, k = qweight.shape
    return (qx.device.type == "cuda" and cuda_kernels_available() and get_bindings().fp8_gemm_wgmma_compiled
            and 1 <= qx.shape[0] <= get_bindings().FP8_GEMM_WGMMA_MAX_ROWS and x_scale.numel() == 1
            and out_dtype in (torch.float16, torch.bfloat16) and n % 64 == 0 and k % 128 == 0
            and cuda_capability(qx.device) == (9, 0) and qx.is_contiguous() and qweight.is_contiguous()
            and qx.data_ptr() % 16 == 0 and qweight.data_ptr() % 16 == 0)


def fp8_gemm_of_codes(qx, x_scale, qweight, weight_scale, bias, out_dtype):
    """[M, N] in out_dtype: x @ W^T from x's E4M3 codes qx [M, K] and their scale ([1] static or
    [M, 1] per row). Up to 32 rows on Hopper, the TMA + wgmma kernel (an H200, the FP8 8B engine's
    batch-32 decode graph: 3.241 ms with cuBLASLt, 3.081 with it), else cuBLASLt's FP8 GEMM (a
    weight scaled_mm_serves)."""
    if fp8_gemm_wgmma_takes(qx, x_scale, qweight, out_dtype):
        out = torch.empty(qx.shape[0], qweight.shape[0], dtype=out_dtype, device=qx.device)
        launch("fp8_gemm_wgmma", out, qx.view(torch.int32), qweight.view(torch.int32), weight_scale.contiguous(),
               _static_scale(x_scale), None if bias is None else bias.contiguous())
        return out
    return scaled_mm_of_codes(qx, x_scale, qweight, weight_scale, bias, out_dtype)


def scaled_mm_of_codes(qx, x_scale, qweight, weight_scale, bias, out_dtype):
    """[M, N] in out_dtype: x @ W^T from x's E4M3 codes qx [M, K] and their scale ([1] static or
    [M, 1] per row) by cuBLASLt's FP8 GEMM (a weight scaled_mm_serves)."""
    n = qweight.shape[0]
    m = qx.shape[0]
    w_t = qweight.view(FP8_DTYPE).t()  # [K, N], column-major
    if x_scale.numel() == 1 and weight_scale.numel() == 1:
        y = torch._scaled_mm(qx, w_t, scale_a=x_scale.reshape(()), scale_b=weight_scale.reshape(()),
                             out_dtype=out_dtype, use_fast_accum=SCALED_MM_FAST_ACCUM)
    else:
        x_rows = x_scale.expand(m, 1).contiguous()  # a static scale repeated per token
        w_cols = weight_scale.reshape(1, -1).expand(1, n).contiguous()  # a per-tensor scale per channel
        if out_dtype == torch.bfloat16:
            y = torch._scaled_mm(qx, w_t, scale_a=x_rows, scale_b=w_cols, out_dtype=torch.bfloat16,
                                 use_fast_accum=SCALED_MM_FAST_ACCUM)
        else:
            one = torch.ones((), dtype=torch.float32, device=qx.device)
            y = torch._scaled_mm(qx, w_t, scale_a=one, scale_b=one, out_dtype=torch.float32,
                                 use_fast_accum=SCALED_MM_FAST_ACCUM)
            y = (y * x_rows * w_cols).to(out_dtype)
    if bias is not None:
        y = y + bias
    return y


# ---- a norm or gated activation fused in front (the fuse_norm_linear / fuse_act_linear passes) ----
# As linear.py's rms_norm_linear family: the references compose the unfused references, and the
# CPU implementations the unfused CPU ones (the fused graph gives the unfused graph's numbers bit
# for bit). On a GPU, many rows with a static input scale: the norm / activation kernel writes the
# E4M3 codes that the FP8 GEMM of codes reads (fp8_gemm_of_codes); a few rows (the FP8 GEMV's): the norm / activation
# kernel, then the GEMV. The pipelined FP8 GEMV computing the norm in front in every block cost
# more than the norm's own kernel (an H200, LLaMA-8B's gate_up at 1 row: 44.3 us fused, 36.8
# apart; the FP8 engine's batch-1 step 3.13 -> 2.87 ms without it; benchmarks/README.md).


@define
def rms_norm_fp8_linear(x: Tensor, norm_weight: Tensor, qweight: Tensor, weight_scale: Tensor,
                        input_scale: Optional[Tensor] = None, bias: Optional[Tensor] = None, *,
                        eps: float) -> Tensor:
    """fp8_linear(rms_norm(x, norm_weight, eps), qweight, weight_scale, input_scale, bias)."""
    op = "rms_norm_fp8_linear"
    check_same_dtype(op, x, norm_weight)
    check_shape(op, norm_weight, x.shape[-1:], "norm_weight")
    shape = _fp8_linear_shape(op, x.shape, x.dtype, qweight, weight_scale, input_scale, bias)
    return add_layer(op, [x, norm_weight, qweight, weight_scale, input_scale, bias], [(x.dtype, shape)],
                     eps=norm_eps(op, eps))


@rms_norm_fp8_linear.implementation(REFERENCE)
def rms_norm_fp8_linear_reference(x, norm_weight, qweight, weight_scale, input_scale=None, bias=None, *, eps):
    return fp8_linear_reference(rms_norm_reference(x, norm_weight, eps=eps), qweight, weight_scale, input_scale, bias)


@rms_norm_fp8_linear.implementation(CPU)
def rms_norm_fp8_linear_cpu(x, norm_weight, qweight, weight_scale, input_scale=None, bias=None, *, eps):
    return fp8_linear_cpu(rms_norm_cpu(x, norm_weight, eps=eps), qweight, weight_scale, input_scale, bias)


def _codes_prologue_serves(x2: torch.Tensor, qweight: torch.Tensor, input_scale: Optional[torch.Tensor],
                           width: int) -> bool:
    """Whether the norm / activation kernel writes the codes of an FP8 linear's input of `width`
    for the codes path: many rows (not the GEMV's), a static input scale, a weight
    scaled_mm_serves, the compiled kernels, a width of whole int32 words."""
    return _codes_take(x2.device, qweight, input_scale, width) and not fp8_gemv_serves(x2, qweight, input_scale)


def _codes_take(device: torch.device, qweight: torch.Tensor, input_scale: Optional[torch.Tensor], width: int) -> bool:
    """What a kernel writing the codes of the codes path needs, whatever the rows."""
    return (input_scale is not None and device.type == "cuda" and cuda_kernels_available() and width % 4 == 0
            and scaled_mm_serves(qweight))


def _gemm_after_codes(kernel: str, x2: torch.Tensor, qweight, weight_scale, input_scale, bias, *args,
                      **kwargs) -> torch.Tensor:
    """[M, N] in x2's dtype: `kernel` (rms_norm_fp8, silu_and_mul_fp8; its other operands args
    and kwargs) writes the E4M3 codes of the layer's input from x2 under the static input scale,
    then fp8_gemm_of_codes reads them (a call _codes_prologue_serves)."""
    codes = torch.empty(x2.shape[0], qweight.shape[1], dtype=torch.uint8, device=x2.device)
    scale = _static_scale(input_scale)
    launch(kernel, codes.view(torch.int32), x2, *args, input_scale=scale, **kwargs)
    return fp8_gemm_of_codes(codes.view(FP8_DTYPE), scale, qweight, weight_scale, bias, x2.dtype)


@rms_norm_fp8_linear.implementation(CUDA)
def rms_norm_fp8_linear_cuda(x, norm_weight, qweight, weight_scale, input_scale=None, bias=None, *, eps):
    x2 = rows(x)
    n, k = qweight.shape
    if _codes_prologue_serves(x2, qweight, input_scale, k):  # the norm kernel writes the GEMM's codes
        y = _gemm_after_codes("rms_norm_fp8", x2, qweight, weight_scale, input_scale, bias, norm_weight,
                              eps=float(eps))
        return y.reshape(*x.shape[:-1], n)
    return fp8_linear_cuda(rms_norm_cuda(x, norm_weight, eps=eps), qweight, weight_scale, input_scale, bias)


@define
def add_rms_norm_fp8_linear(x: Tensor, residual: Tensor, norm_weight: Tensor, qweight: Tensor, weight_scale: Tensor,
                            input_scale: Optional[Tensor] = None, bias: Optional[Tensor] = None, *,
                            eps: float) -> tuple[Tensor, Tensor]:
    """(fp8_linear(rms_norm(x + residual, norm_weight, eps), qweight, ...), x + residual)."""
    op = "add_rms_norm_fp8_linear"
    check_same_dtype(op, x, residual, norm_weight)
    total = residual_sum_shape(op, x, residual)
    check_shape(op, norm_weight, total[-1:], "norm_weight")
    shape = _fp8_linear_shape(op, total, x.dtype, qweight, weight_scale, input_scale, bias)
    return add_layer(op, [x, residual, norm_weight, qweight, weight_scale, input_scale, bias],
                     [(x.dtype, shape), (x.dtype, total)], eps=norm_eps(op, eps))


@add_rms_norm_fp8_linear.implementation(REFERENCE)
def add_rms_norm_fp8_linear_reference(x, residual, norm_weight, qweight, weight_scale, input_scale=None, bias=None,
                                      *, eps):
    normed, total = fused_add_rms_norm_reference(x, residual, norm_weight, eps=eps)
    return fp8_linear_reference(normed, qweight, weight_scale, input_scale, bias), total


@add_rms_norm_fp8_linear.implementation(CPU)
def add_rms_norm_fp8_linear_cpu(x, residual, norm_weight, qweight, weight_scale, input_scale=None, bias=None, *, eps):
    normed, total = fused_add_rms_norm_cpu(x, residual, norm_weight, eps=eps)
    return fp8_linear_cpu(normed, qweight, weight_scale, input_scale, bias), total


@add_rms_norm_fp8_linear.implementation(CUDA)
def add_rms_norm_fp8_linear_cuda(x, residual, norm_weight, qweight, weight_scale, input_scale=None, bias=None, *,
                                 eps):
    x2, r2 = rows(x), rows(residual)
    n, k = qweight.shape
    if x.shape == residual.shape and _codes_prologue_serves(x2, qweight, input_scale, k):
        total = torch.empty_like(residual, memory_format=torch.contiguous_format)
        y = _gemm_after_codes("rms_norm_fp8", x2, qweight, weight_scale, input_scale, bias, norm_weight,
                              eps=float(eps), residual=r2, residual_out=total.view(-1, k))
        return y.reshape(*x.shape[:-1], n), total
    normed, total = fused_add_rms_norm_cuda(x, residual, norm_weight, eps=eps)
    return fp8_linear_cuda(normed, qweight, weight_scale, input_scale, bias), total


@define
def silu_and_mul_fp8_linear(x: Tensor, qweight: Tensor, weight_scale: Tensor, input_scale: Optional[Tensor] = None,
                            bias: Optional[Tensor] = None) -> Tensor:
    """fp8_linear(silu_and_mul(x), qweight, ...) for x [..., 2K], qweight [N, K]."""
    op = "silu_and_mul_fp8_linear"
    gated = gated_shape(op, x.shape)
    shape = _fp8_linear_shape(op, gated, x.dtype, qweight, weight_scale, input_scale, bias,
                              what=f"input {list(x.shape)} gated to")
    return add_layer(op, [x, qweight, weight_scale, input_scale, bias], [(x.dtype, shape)])


@silu_and_mul_fp8_linear.implementation(REFERENCE)
def silu_and_mul_fp8_linear_reference(x, qweight, weight_scale, input_scale=None, bias=None):
    return fp8_linear_reference(silu_and_mul_reference(x), qweight, weight_scale, input_scale, bias)


@silu_and_mul_fp8_linear.implementation(CPU)
def silu_and_mul_fp8_linear_cpu(x, qweight, weight_scale, input_scale=None, bias=None):
    return fp8_linear_cpu(silu_and_mul_cpu(x), qweight, weight_scale, input_scale, bias)


@silu_and_mul_fp8_linear.implementation(CUDA)
def silu_and_mul_fp8_linear_cuda(x, qweight, weight_scale, input_scale=None, bias=None):
    x2 = rows(x)
    n, k = qweight.shape
    if _codes_prologue_serves(x2, qweight, input_scale, k):  # the activation kernel writes the GEMM's codes
        y = _gemm_after_codes("silu_and_mul_fp8", x2, qweight, weight_scale, input_scale, bias)
        return y.reshape(*x.shape[:-1], n)
    return fp8_linear_cuda(silu_and_mul_cuda(x), qweight, weight_scale, input_scale, bias)


@define
def add_rms_norm_fp8_gated_mlp(x: Tensor, residual: Tensor, norm_weight: Tensor, gate_up_qweight: Tensor,
                               gate_up_scale: Tensor, gate_up_input_scale: Optional[Tensor],
                               gate_up_bias: Optional[Tensor], down_qweight: Tensor, down_scale: Tensor,
                               down_input_scale: Optional[Tensor] = None, down_bias: Optional[Tensor] = None, *,
                               eps: float) -> tuple[Tensor, Tensor]:
    """A gated MLP after the residual add and RMSNorm, both linears FP8:
    (silu_and_mul_fp8_linear(h, down...), x + residual) for h, the add_rms_norm_fp8_linear of gate_up.
    The fusion of those two ops lets the GEMV path apply silu_and_mul in gate_up's epilogue."""
    op = "add_rms_norm_fp8_gated_mlp"
    check_same_dtype(op, x, residual, norm_weight)
    total = residual_sum_shape(op, x, residual)
    check_shape(op, norm_weight, total[-1:], "norm_weight")
    h = _fp8_linear_shape(op, total, x.dtype, gate_up_qweight, gate_up_scale, gate_up_input_scale, gate_up_bias)
    gated = gated_shape(op, h)
    shape = _fp8_linear_shape(op, gated, x.dtype, down_qweight, down_scale, down_input_scale, down_bias,
                              what=f"gate_up's output {list(h)} gated to")
    return add_layer(op, [x, residual, norm_weight, gate_up_qweight, gate_up_scale, gate_up_input_scale, gate_up_bias,
                          down_qweight, down_scale, down_input_scale, down_bias],
                     [(x.dtype, shape), (x.dtype, total)], eps=norm_eps(op, eps))


@add_rms_norm_fp8_gated_mlp.implementation(REFERENCE)
def add_rms_norm_fp8_gated_mlp_reference(x, residual, norm_weight, gate_up_qweight, gate_up_scale,
                                         gate_up_input_scale, gate_up_bias, down_qweight, down_scale,
                                         down_input_scale=None, down_bias=None, *, eps):
    h, total = add_rms_norm_fp8_linear_reference(x, residual, norm_weight, gate_up_qweight, gate_up_scale,
                                                 gate_up_input_scale, gate_up_bias, eps=eps)
    return silu_and_mul_fp8_linear_reference(h, down_qweight, down_scale, down_input_scale, down_bias), total


@add_rms_norm_fp8_gated_mlp.implementation(CPU)
def add_rms_norm_fp8_gated_mlp_cpu(x, residual, norm_weight, gate_up_qweight, gate_up_scale, gate_up_input_scale,
                                   gate_up_bias, down_qweight, down_scale, down_input_scale=None, down_bias=None, *,
                                   eps):
    h, total = add_rms_norm_fp8_linear_cpu(x, residual, norm_weight, gate_up_qweight, gate_up_scale,
                                           gate_up_input_scale, gate_up_bias, eps=eps)
    return silu_and_mul_fp8_linear_cpu(h, down_qweight, down_scale, down_input_scale, down_bias), total


@add_rms_norm_fp8_gated_mlp.implementation(CUDA)
def add_rms_norm_fp8_gated_mlp_cuda(x, residual, norm_weight, gate_up_qweight, gate_up_scale, gate_up_input_scale,
                                    gate_up_bias, down_qweight, down_scale, down_input_scale=None, down_bias=None,
                                    *, eps):
    # Within the GEMV's rows, silu_and_mul runs in gate_up's epilogue: one kernel and one wait
    # fewer a layer, the same bits (H200, the FP8 8B engine at batch 1: the step without the
    # activation's kernel took 0.136 ms less). Beyond them, the two fused ops as they are (the
    # activation kernel writes the down GEMM's E4M3 codes).
    x2 = rows(x)
    if x.shape == residual.shape and fp8_gated_gemv_serves(x2, gate_up_qweight, gate_up_input_scale):
        normed, total = fused_add_rms_norm_cuda(x, residual, norm_weight, eps=eps)
        h = fp8_gemv(rows(normed), gate_up_qweight, gate_up_scale, gate_up_input_scale, gate_up_bias, gated=True)
        y = fp8_linear_cuda(h, down_qweight, down_scale, down_input_scale, down_bias)
        return y.reshape(*x.shape[:-1], down_qweight.shape[0]), total
    h, total = add_rms_norm_fp8_linear_cuda(x, residual, norm_weight, gate_up_qweight, gate_up_scale,
                                            gate_up_input_scale, gate_up_bias, eps=eps)
    return silu_and_mul_fp8_linear_cuda(h, down_qweight, down_scale, down_input_scale, down_bias), total


# ---- the attention in front (the fuse_attention_fp8_linear pass) ---------------------------------


@define(side_effects=True)
def gpt_attention_fp8_linear(q: Tensor, k: Tensor, v: Tensor, kv_cache_pool: Tensor, block_tables: Tensor,
                             sequence_lengths: Tensor, context_lengths: Tensor, host_context_lengths: Tensor,
                             alibi_slopes: Optional[Tensor], position_ids: Optional[Tensor],
                             rotary_cos_sin: Optional[Tensor], host_sequence_lengths: Optional[Tensor],
                             kv_cache_scale: Optional[Tensor], qweight: Tensor, weight_scale: Tensor,
                             input_scale: Optional[Tensor], bias: Optional[Tensor], *, layer_idx: int, num_heads: int,
                             num_kv_heads: int, head_dim: int, tokens_per_block: int, scale: Optional[float] = None,
                             sliding_window: Optional[int] = None, rotary_dim: int = 0,
                             rotary_is_neox: bool = True) -> Tensor:
    """fp8_linear(gpt_attention(q, ..., kv_cache_scale, layer_idx=..., ...), qweight, weight_scale,
    input_scale, bias): an attention and the FP8 linear that reads it (the o projection), so
    that a decode step's attention kernel can write the linear's E4M3 codes. Its inputs are
    gpt_attention's, in its order, then the linear's."""
    op = "gpt_attention_fp8_linear"
    dtype, num_tokens, attrs = check_attention(
        op, q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths, host_context_lengths,
        alibi_slopes, position_ids, rotary_cos_sin, host_sequence_lengths, kv_cache_scale, layer_idx=layer_idx,
        num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, tokens_per_block=tokens_per_block,
        scale=scale, sliding_window=sliding_window, rotary_dim=rotary_dim, rotary_is_neox=rotary_is_neox)
    shape = _fp8_linear_shape(op, (num_tokens, num_heads * head_dim), dtype, qweight, weight_scale, input_scale, bias,
                              what="attention output")
    return add_layer(op, [q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths,
                          host_context_lengths, alibi_slopes, position_ids, rotary_cos_sin, host_sequence_lengths,
                          kv_cache_scale, qweight, weight_scale, input_scale, bias], [(dtype, shape)], **attrs)


# The fused op's implementations compose the two ops' implementations of the same device, so that a
# fused graph gives the unfused graph's numbers bit for bit.
_ATTENTION_INPUTS = ("q", "k", "v", "kv_cache_pool", "block_tables", "sequence_lengths", "context_lengths",
                     "host_context_lengths", "alibi_slopes", "position_ids", "rotary_cos_sin", "host_sequence_lengths",
                     "kv_cache_scale")
_ATTENTION_ATTRS = ("layer_idx", "num_heads", "num_kv_heads", "head_dim", "tokens_per_block", "scale",
                    "sliding_window", "rotary_dim", "rotary_is_neox")


def _split_arguments(args: dict) -> tuple[list, dict, list]:
    """An implementation's arguments (its locals()) as (gpt_attention's inputs, its attrs, the
    linear's operands)."""
    return ([args[name] for name in _ATTENTION_INPUTS], {name: args[name] for name in _ATTENTION_ATTRS},
            [args[name] for name in ("qweight", "weight_scale", "input_scale", "bias")])


@gpt_attention_fp8_linear.implementation(REFERENCE)
def gpt_attention_fp8_linear_reference(q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths,
                                       host_context_lengths, alibi_slopes, position_ids, rotary_cos_sin,
                                       host_sequence_lengths, kv_cache_scale, qweight, weight_scale, input_scale, bias,
                                       *, layer_idx, num_heads, num_kv_heads, head_dim, tokens_per_block, scale=None,
                                       sliding_window=None, rotary_dim=0, rotary_is_neox=True):
    attention, attrs, dense = _split_arguments(locals())
    return fp8_linear_reference(gpt_attention_reference(*attention, **attrs), *dense)


@gpt_attention_fp8_linear.implementation(CPU)
def gpt_attention_fp8_linear_cpu(q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths,
                                 host_context_lengths, alibi_slopes, position_ids, rotary_cos_sin,
                                 host_sequence_lengths, kv_cache_scale, qweight, weight_scale, input_scale, bias,
                                 *, layer_idx, num_heads, num_kv_heads, head_dim, tokens_per_block, scale=None,
                                 sliding_window=None, rotary_dim=0, rotary_is_neox=True):
    attention, attrs, dense = _split_arguments(locals())
    return fp8_linear_cpu(gpt_attention_cpu(*attention, **attrs), *dense)


@gpt_attention_fp8_linear.implementation(CUDA)
def gpt_attention_fp8_linear_cuda(q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths,
                                  host_context_lengths, alibi_slopes, position_ids, rotary_cos_sin,
                                  host_sequence_lengths, kv_cache_scale, qweight, weight_scale, input_scale, bias,
                                  *, layer_idx, num_heads, num_kv_heads, head_dim, tokens_per_block, scale=None,
                                  sliding_window=None, rotary_dim=0, rotary_is_neox=True):
    # A decode step of more rows than the FP8 GEMV takes: the decode-attention kernel writes the
    # codes that fp8_quantize would make of its output, and fp8_gemm_of_codes reads them (an
    # H200, the FP8 8B engine at batch 32, its decode graph built without and with the pass: 3.371
    # -> 3.293 ms). Otherwise the attention, then the linear (the GEMV quantizes x itself).
    attention, attrs, dense = _split_arguments(locals())
    if (_codes_take(q.device, qweight, input_scale, qweight.shape[1])
            and not fp8_gemv_takes(q.shape[0], q.dtype, q.device, qweight, input_scale)
            and decode_step_serves(q, block_tables, num_heads, num_kv_heads, head_dim, kv_cache_scale is not None)):
        codes_scale = _static_scale(input_scale)
        codes = decode_step_cuda(q, k, v, kv_cache_pool, block_tables, sequence_lengths, alibi_slopes, rotary_cos_sin,
                                 kv_cache_scale, layer_idx=layer_idx, num_heads=num_heads, num_kv_heads=num_kv_heads,
                                 head_dim=head_dim, scale=scale, sliding_window=sliding_window,
                                 rotary_is_neox=rotary_is_neox, input_scale=codes_scale)
        return fp8_gemm_of_codes(codes.view(FP8_DTYPE), codes_scale, qweight, weight_scale, bias, q.dtype)
    return fp8_linear_cuda(gpt_attention_cuda(*attention, **attrs), *dense)
