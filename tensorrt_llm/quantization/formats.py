"""The internal quantized-weight formats, their quantizers, dequantizers and reference op.

Every quantized linear weight is one of three formats. `N` is the layer's output features
(rows of the [out, in] weight), `K` its input features, `G` the group size; a group is `G`
consecutive inputs of one output row. Dequantization is always done in float32, and
`quantized_linear_reference(x, w)` (dequantize to float32, `x @ W^T`, back to `x`'s dtype) is
what every kernel must compute.

INT8 (`Int8Weight`, `W8A16`), symmetric:
    qweight   int8 [N, K] (row-major; any value -128..127; our quantizer writes -127..127)
    scales    float16 / bfloat16 / float32, [N] (per output channel) or [N, K / G] (G in 16, 32,
              64, 128: GGUF Q8_0 is exactly G = 32, Q6_K G = 16)
    W[n, k] = float(qweight[n, k]) * float(scales[n])            (per channel)
    W[n, k] = float(qweight[n, k]) * float(scales[n, k // G])    (group-wise)

INT4 (`Int4Weight`, `W4A16*`), asymmetric, per group, G in 32, 64, 128, K % G == 0:
    qweight   uint8 [N, K / 2], row-major: byte qweight[n, j] holds the 4-bit code of input
              2j in bits 0-3 and of input 2j + 1 in bits 4-7. Read as little-endian int32
              words (`qweight.view(torch.int32)`, [N, K / 8]), word w of row n holds inputs
              8w .. 8w + 7 in nibbles 0 .. 7 (bits 4i .. 4i + 3 hold input 8w + i): a GPU
              kernel loads 8 (32-bit) or 32 (128-bit; rows start 16-byte aligned because
              K % 32 == 0) consecutive inputs of one row and unpacks them in registers.
    scales    float16 / bfloat16 / float32 [N, K / G]
    zeros     same dtype and shape as scales: the value code 0 stands for (a float zero, not
              an integer zero point: an integer zero point z is zeros = -z * scale, exact in
              float32 for float16 scales).
    perm      None, or int64 [K]: stored column j holds the layer's input perm[j] (GPTQ
              act-order, sorted so that groups are contiguous); kernels compute
              y = x[..., perm] @ W_stored^T.
    W_stored[n, k] = float(code[n, k]) * float(scales[n, k // G]) + float(zeros[n, k // G])
    (two float32 operations, in that order, without a fused multiply-add: with float16 scales
    and zeros this is bit-for-bit llama.cpp's Q4_0 / Q4_1 dequantization, and with
    zeros = -z * scale it is exactly (code - z) * scale, AWQ's and GPTQ's.)
    The CPU path (cpu.py) hands torch's `_convert_weight_to_int4pack_for_cpu` the codes as
    int32 [N, K] and `_weight_int4pack_mm_for_cpu` the scales and zeros as bfloat16
    [K / G, N, 2] with zero' = zeros + 8 * scale (its formula is (code - 8) * scale + zero').

FP8 (`Fp8Weight`, `FP8` / `FP8_PER_CHANNEL_PER_TOKEN`), E4M3 (torch.float8_e4m3fn, max 448):
    qweight      float8_e4m3fn [N, K]
    scale        float32 [1] (per tensor) or [N] (per output channel); W = float(q) * scale
    input_scale  float32 [1] (static, calibrated: x is quantized as x * (1 / input_scale)) or None
                 (dynamic: each token's row is quantized with its own amax / 448)
    An MLP's gate and up linears read one x and run as one GEMM (graph_rewriting.FuseGateUp),
    whose input scale is theirs (they must be equal) and whose weight scale stays per tensor
    when theirs are equal, else becomes per channel (cuBLASLt's slower row-wise FP8 GEMM). Our
    quantizer (models/quantize.py) therefore gives them one per-tensor scale, the larger amax
    of the two / 448, and one input scale.

KV cache (`kv_cache_quant_algo` INT8 / FP8): each attention layer has float32 [2] scales,
(K scale, V scale); the paged pool (kv_cache_layout.py) holds 1-byte codes, stored value =
code * scale:
    INT8  pool int8:  code = round(x / scale) (half to even), clamped to -127..127
    FP8   pool uint8: the bits of code = x / scale clamped to +-448, rounded to E4M3 (nearest
          even), as torch.float8_e4m3fn; graphs have no FP8 dtype, so like FP8 weights the
          pool travels as its bytes and is viewed as float8_e4m3fn where it is read.
Attention writes this step's rows quantized and reads every row it attends to (this step's
included) dequantized, so a prompt attends to the same values its later steps read.

In a checkpoint (safetensors, our names), a quantized linear `P` (e.g.
`transformer.layers.0.attention.qkv`) is the tensors `P.weight` (qweight), `P.weight_scale`,
`P.weight_zero` (INT4), `P.weight_perm` (INT4 act-order, int64), `P.input_scale` (FP8 static);
an attention layer `A`'s KV cache scales are `A.kv_cache_scale` (float32 [2]: K, V). `to_state_dict`
and `from_state_dict` write and read them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union

import torch

from .._utils import canonical_dtype
from ..errors import CheckpointError
from .mode import INT4_GROUP_SIZES, INT8_GROUP_SIZES, LayerQuant, QuantAlgo

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
INT8_MAX = 127
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _dtype(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _check(name: str, t, dtypes, shape: tuple | None, what: str = "") -> None:
    """One line naming the tensor when it is missing, of another dtype, or mis-shaped."""
    if t is None:
        raise CheckpointError(f"{name} is missing{what}")
    if not isinstance(t, torch.Tensor):
        raise CheckpointError(f"{name} is a {type(t).__name__}, not a tensor")
    if t.dtype not in dtypes:
        raise CheckpointError(f"{name} has dtype {_dtype(t.dtype)}; expected "
                              f"{' or '.join(_dtype(d) for d in dtypes)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise CheckpointError(f"{name} has shape {_shape(t)}; expected [{', '.join(map(str, shape))}]{what}")


def _safe(scale: torch.Tensor) -> torch.Tensor:
    """A divisor: zero scales (all-zero rows or groups) become 1 (their codes are 0 anyway)."""
    return torch.where(scale == 0, torch.ones_like(scale), scale)


def _over_fp8_max(amax: torch.Tensor) -> torch.Tensor:
    """amax / 448, correctly rounded on every device: PyTorch's CUDA division by a Python number
    multiplies by the number's float32 reciprocal (1 / 448 is not exact), so the divisor is a
    tensor; the CUDA kernels divide the same way (fp8_quantize)."""
    return amax / torch.full_like(amax, FP8_MAX)


def _per_input(t: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N, K / G] -> float32 [N, K], each group's value repeated over its G inputs."""
    return t.float().repeat_interleave(group_size, dim=1)


# ------------------------------------------------------------------------------ INT4 packing

def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Codes 0..15, [N, K] (any integer dtype, K even) -> uint8 [N, K / 2], even inputs in the
    low nibble."""
    if codes.dim() != 2 or codes.shape[1] % 2:
        raise ValueError(f"pack_int4 takes [N, K] codes with K even, got {_shape(codes)}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError("pack_int4 takes codes 0..15")
    c = codes.to(torch.uint8)
    return c[:, 0::2] | (c[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K / 2] -> uint8 codes [N, K] (the inverse of pack_int4)."""
    return torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


# ------------------------------------------------------------------------------ formats

@dataclass
class Int8Weight:
    """INT8 weight, per-channel ([N] scales, group_size None) or group-wise ([N, K / G])."""
    qweight: torch.Tensor
    scales: torch.Tensor
    group_size: int | None = None

    def __post_init__(self):
        self.validate()

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.qweight.shape)

    def validate(self, name: str = "weight") -> None:
        _check(name, self.qweight, (torch.int8,), None)
        if self.qweight.dim() != 2:
            raise CheckpointError(f"{name} has shape {_shape(self.qweight)}; expected [out_features, in_features]")
        n, k = self.qweight.shape
        if self.group_size is None:
            _check(f"{name}_scale", self.scales, SCALE_DTYPES, (n,), " (one scale per output channel)")
        else:
            if self.group_size not in INT8_GROUP_SIZES:
                raise CheckpointError(f"{name}: INT8 group size {self.group_size} is not one of "
                                      f"{', '.join(map(str, INT8_GROUP_SIZES))}")
            if k % self.group_size:
                raise CheckpointError(f"{name}: in_features {k} is not a multiple of the group size {self.group_size}")
            _check(f"{name}_scale", self.scales, SCALE_DTYPES, (n, k // self.group_size),
                   f" (in_features {k} / group {self.group_size})")


@dataclass
class Int4Weight:
    """INT4 weight, group-wise asymmetric with float zeros; see the module docstring."""
    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int
    perm: torch.Tensor | None = None

    def __post_init__(self):
        self.validate()

    @property
    def shape(self) -> tuple[int, int]:
        return (self.qweight.shape[0], self.qweight.shape[1] * 2)

    def validate(self, name: str = "weight") -> None:
        _check(name, self.qweight, (torch.uint8,), None)
        if self.qweight.dim() != 2:
            raise CheckpointError(f"{name} has shape {_shape(self.qweight)}; expected [out_features, in_features / 2]")
        n, k = self.shape
        if self.group_size not in INT4_GROUP_SIZES:
            raise CheckpointError(f"{name}: INT4 group size {self.group_size} is not one of "
                                  f"{', '.join(map(str, INT4_GROUP_SIZES))}")
        if k % self.group_size:
            raise CheckpointError(f"{name}: in_features {k} is not a multiple of the group size {self.group_size}")
        what = f" (in_features {k} / group {self.group_size})"
        _check(f"{name}_scale", self.scales, SCALE_DTYPES, (n, k // self.group_size), what)
        _check(f"{name}_zero", self.zeros, (self.scales.dtype,), (n, k // self.group_size), what)
        if self.perm is not None:
            _check(f"{name}_perm", self.perm, (torch.int64, torch.int32), (k,))
            if not torch.equal(torch.sort(self.perm.long()).values,
                               torch.arange(k, device=self.perm.device)):
                raise CheckpointError(f"{name}_perm is not a permutation of 0..{k - 1}")


@dataclass
class Fp8Weight:
    """FP8 E4M3 weight with a per-tensor ([1]) or per-channel ([N]) float32 scale, and the
    static activation scale ([1]) or None for dynamic per-token activation scales."""
    qweight: torch.Tensor
    scale: torch.Tensor
    input_scale: torch.Tensor | None = None

    def __post_init__(self):
        self.validate()

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.qweight.shape)

    @property
    def per_channel(self) -> bool:
        return self.scale.numel() != 1

    def validate(self, name: str = "weight") -> None:
        _check(name, self.qweight, (FP8_DTYPE,), None)
        if self.qweight.dim() != 2:
            raise CheckpointError(f"{name} has shape {_shape(self.qweight)}; expected [out_features, in_features]")
        n = self.qweight.shape[0]
        _check(f"{name}_scale", self.scale, (torch.float32,), None)
        if tuple(self.scale.shape) not in ((1,), (n,)):
            raise CheckpointError(f"{name}_scale has shape {_shape(self.scale)}; expected [1] (per tensor) "
                                  f"or [{n}] (per output channel)")
        if self.input_scale is not None:
            base = name[:-len("weight")] if name.endswith("weight") else name + "."
            _check(f"{base}input_scale", self.input_scale, (torch.float32,), (1,))


QuantizedWeight = Union[Int8Weight, Int4Weight, Fp8Weight]


# ------------------------------------------------------------------------------ quantizers

def _as_matrix(w: torch.Tensor) -> torch.Tensor:
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"expected a float [out_features, in_features] weight, got {w.dtype} {_shape(w)}")
    return w.float()


def _groups(w: torch.Tensor, group_size: int, allowed) -> torch.Tensor:
    n, k = w.shape
    if group_size not in allowed:
        raise ValueError(f"group size {group_size} is not one of {', '.join(map(str, allowed))}")
    if k % group_size:
        raise ValueError(f"in_features {k} is not a multiple of the group size {group_size}")
    return w.reshape(n, k // group_size, group_size)


def _finite_in(t: torch.Tensor, dtype: torch.dtype, what: str) -> torch.Tensor:
    out = t.to(dtype)
    if not torch.isfinite(out).all():
        raise ValueError(f"{what} overflow {_dtype(dtype)}; quantize with scale_dtype=torch.float32")
    return out


# The grids' arithmetic, one home for round-to-nearest (below) and GPTQ (gptq.py): scales from a
# weight's extremes, codes from a weight and its scales.

def int8_scale(amax: torch.Tensor) -> torch.Tensor:
    """Symmetric INT8: the scale that maps |w| max to 127."""
    return amax / INT8_MAX


def int8_codes(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """round(w / scale) in -127..127 (round half to even), as floats; scale broadcast to w."""
    return torch.round(w / _safe(scale)).clamp(-INT8_MAX, INT8_MAX)


def int4_scale_zero(lo: torch.Tensor, hi: torch.Tensor, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric INT4 of a group with minimum lo and maximum hi: (scale, zero) = ((hi - lo) / 15,
    lo), each rounded to scale_dtype (a ValueError when that overflows it)."""
    return _finite_in((hi - lo) / 15, scale_dtype, "INT4 scales"), _finite_in(lo, scale_dtype, "INT4 zeros")


def int4_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """round((w - zero) / scale) in 0..15, as floats; scale and zero (float32) broadcast to w."""
    return torch.round((w - zero) / _safe(scale)).clamp(0, 15)


def fp8_weight_scale(w: torch.Tensor, per_channel: bool = False,
                     amax: torch.Tensor | float | None = None) -> torch.Tensor:
    """FP8 E4M3 weight scale, float32: amax / 448 per tensor [1] or per output channel [N]; a
    given `amax` (per tensor) is used instead of w's own, which it must not be below."""
    if amax is not None:
        if per_channel:
            raise ValueError("quantize_fp8: a given amax is per tensor; per-channel scales come from the weight")
        amax = torch.as_tensor(amax, dtype=torch.float32).reshape(1)
        if amax < w.abs().amax():
            raise ValueError(f"quantize_fp8: amax {float(amax)} is below the weight's own {float(w.abs().amax())}")
    elif per_channel:
        amax = w.abs().amax(dim=1)
    else:
        amax = w.abs().amax().reshape(1)
    return _over_fp8_max(amax.float())


def fp8_codes(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w / scale rounded to E4M3 (saturating at +-448); scale broadcast to w."""
    return (w / _safe(scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_int8(w: torch.Tensor, group_size: int | None = None,
                  scale_dtype: torch.dtype = torch.float32) -> Int8Weight:
    """Symmetric INT8: scale = amax / 127 per output channel (or per group), codes
    round(w / scale) in -127..127 (round half to even)."""
    w = _as_matrix(w)
    blocks = w[:, None, :] if group_size is None else _groups(w, group_size, INT8_GROUP_SIZES)
    scale = _finite_in(int8_scale(blocks.abs().amax(dim=-1)), scale_dtype, "INT8 scales")
    q = int8_codes(blocks, scale.float()[..., None]).reshape(w.shape).to(torch.int8)
    return Int8Weight(q, scale[:, 0] if group_size is None else scale, group_size)


def quantize_int4(w: torch.Tensor, group_size: int = 128,
                  scale_dtype: torch.dtype = torch.float16) -> Int4Weight:
    """Asymmetric INT4 per group of `group_size` inputs: zero = the group's minimum, scale =
    (max - min) / 15 (both rounded to `scale_dtype` first), code = round((w - zero) / scale)
    in 0..15. Rows and groups of equal values get scale 0 and code 0 (exact)."""
    w = _as_matrix(w)
    blocks = _groups(w, group_size, INT4_GROUP_SIZES)
    scale, zero = int4_scale_zero(blocks.amin(dim=-1), blocks.amax(dim=-1), scale_dtype)
    codes = int4_codes(blocks, scale.float()[..., None], zero.float()[..., None])
    return Int4Weight(pack_int4(codes.reshape(w.shape).to(torch.uint8)), scale, zero, group_size)


def quantize_fp8(w: torch.Tensor, per_channel: bool = False,
                 input_scale: torch.Tensor | float | None = None,
                 amax: torch.Tensor | float | None = None) -> Fp8Weight:
    """FP8 E4M3: scale = amax / 448 per tensor (or per output channel), codes w / scale
    rounded to E4M3. `input_scale` is a calibrated static activation scale (see
    `fp8_scale_from_amax`) or None for dynamic per-token scales. `amax` (per tensor only) is
    the |w| max to scale by instead of w's own: a larger one shared with linears that run as
    one GEMM, so that they keep one per-tensor scale."""
    w = _as_matrix(w)
    scale = fp8_weight_scale(w, per_channel, amax)
    q = fp8_codes(w, scale[:, None] if per_channel else scale)
    if input_scale is not None:
        input_scale = torch.as_tensor(input_scale, dtype=torch.float32).reshape(1)
    return Fp8Weight(q, scale, input_scale)


def fp8_scale_from_amax(amax: torch.Tensor | float) -> torch.Tensor:
    """The static FP8 activation (or KV cache) scale that maps a calibrated |x| max to 448."""
    amax = torch.as_tensor(amax, dtype=torch.float32).reshape(1)
    return _safe(_over_fp8_max(amax))


def quantize(w: torch.Tensor, layer: LayerQuant, **kwargs) -> QuantizedWeight:
    """Quantize a float weight as `layer` (a QuantConfig.layer(...) result) says."""
    if layer.weight_format == "int8":
        return quantize_int8(w, layer.group_size, **kwargs)
    if layer.weight_format == "int4":
        return quantize_int4(w, layer.group_size, **kwargs)
    return quantize_fp8(w, per_channel=layer.quant_algo == QuantAlgo.FP8_PER_CHANNEL_PER_TOKEN, **kwargs)


# ------------------------------------------------------------------------------ dequantizers

def dequantize(w: QuantizedWeight) -> torch.Tensor:
    """The float32 [N, K] weight, in the layer's input order (INT4's perm undone)."""
    if isinstance(w, Int8Weight):
        q = w.qweight.float()
        if w.group_size is None:
            return q * w.scales.float()[:, None]
        return q * _per_input(w.scales, w.group_size)
    if isinstance(w, Int4Weight):
        stored = unpack_int4(w.qweight).float() * _per_input(w.scales, w.group_size)
        stored = stored + _per_input(w.zeros, w.group_size)
        if w.perm is None:
            return stored
        out = torch.empty_like(stored)
        out[:, w.perm.long()] = stored
        return out
    if isinstance(w, Fp8Weight):
        scale = w.scale.float()
        return w.qweight.float() * (scale[:, None] if w.per_channel else scale)
    raise TypeError(f"not a quantized weight: {type(w).__name__}")


def dequantize_rows(w: Int8Weight | Int4Weight, index: torch.Tensor) -> torch.Tensor:
    """float32 rows `index` of the weight (an embedding lookup in a quantized table, e.g. a
    GGUF Q8_0 `token_embd` tied with the LM head), without dequantizing the others."""
    return dequantize(select_rows(w, index))


def quantize_fp8_activation(x: torch.Tensor, input_scale: torch.Tensor | None = None):
    """(codes float8_e4m3fn, float32 scale) of an activation: with `input_scale` (static) every
    element is x times the float32 reciprocal of input_scale; without it each row (token) uses
    its own amax / 448, the scale broadcasting as [..., 1]. The reciprocal (correctly rounded,
    once per scale) and one float32 multiply per element, not a division: the kernels that
    quantize x as they read it (the FP8 GEMV) would spend most of their time dividing."""
    xf = x.float()
    if input_scale is None:
        scale = _safe(_over_fp8_max(xf.abs().amax(dim=-1, keepdim=True)))
    else:
        scale = input_scale.float().reshape(1)
    return (xf * torch.reciprocal(scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def quantized_linear_reference(x: torch.Tensor, w: QuantizedWeight,
                               bias: torch.Tensor | None = None) -> torch.Tensor:
    """The meaning of a quantized linear: y = x @ W^T (+ bias) in float32, in x's dtype.

    For FP8 the activation is quantized first (static or dynamic per-token scale, as the
    weight says) and both operands are dequantized: y = (q_x * s_x) @ (q_w * s_w)^T."""
    if isinstance(w, Fp8Weight):
        qx, sx = quantize_fp8_activation(x, w.input_scale)
        xf = qx.float() * sx
    else:
        xf = x.float()
    y = xf @ dequantize(w).t().to(xf.device)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


# ------------------------------------------------------------------------------ KV cache

KV_CACHE_STORAGE = {QuantAlgo.INT8: torch.int8, QuantAlgo.FP8: torch.uint8}  # the pool's dtype


def _kv_algo(algo: QuantAlgo | str) -> QuantAlgo:
    algo = QuantAlgo(str(algo))
    if algo not in KV_CACHE_STORAGE:
        raise ValueError(f"KV cache quantization is INT8 or FP8, not {algo}")
    return algo


def kv_cache_dtype_name(dtype: str, kv_cache_quant_algo) -> str:
    """The KV pool's dtype name: the model's `dtype`, or the codes' (KV_CACHE_STORAGE) when
    `kv_cache_quant_algo` (a QuantAlgo, its name, or None) quantizes the KV cache."""
    algo = None if kv_cache_quant_algo is None else str(kv_cache_quant_algo).upper()
    storage = {a.value: t for a, t in KV_CACHE_STORAGE.items()}.get(algo)
    return canonical_dtype(dtype) if storage is None else str(storage).removeprefix("torch.")


def kv_cache_algo_of(pool_dtype: torch.dtype) -> QuantAlgo | None:
    """The KV cache quantization a pool of `pool_dtype` holds (None: float values)."""
    return {storage: algo for algo, storage in KV_CACHE_STORAGE.items()}.get(pool_dtype)


def kv_cache_scale_from_amax(amax: torch.Tensor | float, algo: QuantAlgo | str) -> torch.Tensor:
    """float32, amax's shape ([1] for a number; [2] for a layer's (K, V) maxima): the KV cache
    scales mapping a calibrated |k|, |v| max to 127 (INT8) or 448 (FP8)."""
    top = float(INT8_MAX) if _kv_algo(algo) == QuantAlgo.INT8 else FP8_MAX
    return _safe(torch.as_tensor(amax, dtype=torch.float32).reshape(-1) / top)


def quantize_kv(x: torch.Tensor, scale: torch.Tensor, algo: QuantAlgo | str) -> torch.Tensor:
    """K or V values as codes: int8 round(x / scale) in -127..127, or float8_e4m3fn x / scale
    clamped to +-448 (the pool stores the latter's bytes: `.view(torch.uint8)`)."""
    y = x.float() / scale.float()
    if _kv_algo(algo) == QuantAlgo.INT8:
        return torch.round(y).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return y.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """code * scale in float32 (then `dtype`); uint8 codes are FP8 bytes."""
    if q.dtype == torch.uint8:
        q = q.view(FP8_DTYPE)
    return (q.float() * scale.float()).to(dtype)


# ------------------------------------------------------------------------------ row / column ops

def select_rows(w: QuantizedWeight, index: torch.Tensor) -> QuantizedWeight:
    """The output rows `index` (a tensor-parallel column split, llama.cpp's Q/K row order):
    exact, every format keeps its rows' codes and scales."""
    index = torch.as_tensor(index, dtype=torch.long, device=w.qweight.device)
    if isinstance(w, Int8Weight):
        return Int8Weight(w.qweight[index], w.scales[index], w.group_size)
    if isinstance(w, Int4Weight):
        return Int4Weight(w.qweight[index], w.scales[index], w.zeros[index], w.group_size, w.perm)
    return Fp8Weight(w.qweight[index], w.scale[index] if w.per_channel else w.scale, w.input_scale)


def _common_scale_dtype(dtypes) -> torch.dtype:
    dtypes = set(dtypes)
    return dtypes.pop() if len(dtypes) == 1 else torch.float32  # float16/bfloat16 -> float32 is exact


def cat_rows(ws: list[QuantizedWeight]) -> QuantizedWeight:
    """Weights stacked along the output dimension (fused QKV, gate/up), exactly: the same
    format, in_features, group size and perm are required; mixed scale dtypes become float32.
    FP8 weights with different per-tensor scales become per-channel; their static input
    scales (one input, so one scale) become the largest of them."""
    first = ws[0]
    if any(type(w) is not type(first) or w.shape[1] != first.shape[1] for w in ws):
        raise ValueError("cat_rows takes weights of one format and one in_features")
    if isinstance(first, Int8Weight):
        if any(w.group_size != first.group_size for w in ws):
            raise ValueError("cat_rows: INT8 weights of different group sizes")
        dt = _common_scale_dtype(w.scales.dtype for w in ws)
        return Int8Weight(torch.cat([w.qweight for w in ws]), torch.cat([w.scales.to(dt) for w in ws]),
                          first.group_size)
    if isinstance(first, Int4Weight):
        if any(w.group_size != first.group_size for w in ws):
            raise ValueError("cat_rows: INT4 weights of different group sizes")
        if any((w.perm is None) != (first.perm is None) or (w.perm is not None and not torch.equal(w.perm, first.perm))
               for w in ws):
            raise ValueError("cat_rows: INT4 weights with different input permutations (GPTQ act-order) "
                             "cannot share one input")
        dt = _common_scale_dtype(w.scales.dtype for w in ws)
        return Int4Weight(torch.cat([w.qweight for w in ws]), torch.cat([w.scales.to(dt) for w in ws]),
                          torch.cat([w.zeros.to(dt) for w in ws]), first.group_size, first.perm)
    if any(w.input_scale is None for w in ws) != all(w.input_scale is None for w in ws):
        raise ValueError("cat_rows: FP8 weights mixing static and dynamic activation scales")
    input_scale = None if first.input_scale is None else torch.stack([w.input_scale for w in ws]).amax(0)
    same = all(not w.per_channel for w in ws) and all(torch.equal(w.scale, first.scale) for w in ws)
    scale = first.scale if same else torch.cat([w.scale.expand(w.shape[0]) for w in ws])
    return Fp8Weight(torch.cat([w.qweight for w in ws]), scale, input_scale)


def narrow_columns(w: QuantizedWeight, start: int, length: int) -> QuantizedWeight:
    """Inputs start .. start + length (a tensor-parallel row split). Group-wise formats need
    start and length on group boundaries; an INT4 weight with a perm cannot be split."""
    n, k = w.shape
    if start < 0 or length <= 0 or start + length > k:
        raise ValueError(f"narrow_columns: {start}..{start + length} is outside in_features {k}")
    if isinstance(w, Fp8Weight):
        return Fp8Weight(w.qweight[:, start:start + length], w.scale, w.input_scale)
    group = w.group_size
    if group is not None and (start % group or length % group):
        raise ValueError(f"narrow_columns: {start}..{start + length} does not fall on groups of {group}")
    if isinstance(w, Int8Weight):
        scales = w.scales if group is None else w.scales[:, start // group:(start + length) // group]
        return Int8Weight(w.qweight[:, start:start + length], scales, group)
    if w.perm is not None:
        raise ValueError("narrow_columns: an INT4 weight with an input permutation (GPTQ act-order) cannot be split")
    g0, g1 = start // group, (start + length) // group
    return Int4Weight(w.qweight[:, start // 2:(start + length) // 2], w.scales[:, g0:g1], w.zeros[:, g0:g1], group)


# ------------------------------------------------------------------------------ checkpoint tensors

def to_state_dict(w: QuantizedWeight, prefix: str) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of a quantized linear `prefix` (names in the module docstring)."""
    out = {f"{prefix}.weight": w.qweight}
    if isinstance(w, Int8Weight):
        out[f"{prefix}.weight_scale"] = w.scales
    elif isinstance(w, Int4Weight):
        out[f"{prefix}.weight_scale"] = w.scales
        out[f"{prefix}.weight_zero"] = w.zeros
        if w.perm is not None:
            out[f"{prefix}.weight_perm"] = w.perm.long()
    else:
        out[f"{prefix}.weight_scale"] = w.scale
        if w.input_scale is not None:
            out[f"{prefix}.input_scale"] = w.input_scale
    return {name: t.contiguous() for name, t in out.items()}


def from_state_dict(tensors: Mapping[str, torch.Tensor], prefix: str, layer: LayerQuant,
                    source: str = "checkpoint") -> QuantizedWeight:
    """The quantized weight of linear `prefix` from checkpoint tensors, as `layer` says it is
    quantized; a missing, mis-typed or mis-shaped tensor is a one-line CheckpointError naming
    it and `source` (the file or folder)."""
    name = f"{prefix}.weight"
    fmt = layer.weight_format
    needed = {"int8": "weight and weight_scale", "int4": "weight, weight_scale and weight_zero",
              "fp8": "weight and weight_scale" + (" and input_scale" if layer.static_activation_scale else "")}[fmt]
    for suffix in ["weight", "weight_scale"] + (["weight_zero"] if fmt == "int4" else []) + \
            (["input_scale"] if layer.static_activation_scale else []):
        if f"{prefix}.{suffix}" not in tensors:
            raise CheckpointError(f"{source}: {prefix}.{suffix} is missing ({layer.quant_algo} layer {prefix} "
                                  f"needs {needed})")
    get = tensors.get
    try:
        if fmt == "int8":
            scale = get(f"{name}_scale")
            group = layer.group_size
            if group is None and isinstance(scale, torch.Tensor) and scale.dim() == 2:
                raise CheckpointError(f"{name}_scale has shape {_shape(scale)}, group-wise scales, but the "
                                      f"quantization config says per channel (group_size null)")
            w = Int8Weight.__new__(Int8Weight)
            w.qweight, w.scales, w.group_size = get(name), scale, group
        elif fmt == "int4":
            w = Int4Weight.__new__(Int4Weight)
            w.qweight, w.scales, w.zeros = get(name), get(f"{name}_scale"), get(f"{name}_zero")
            w.group_size, w.perm = layer.group_size, get(f"{name}_perm")
        else:
            w = Fp8Weight.__new__(Fp8Weight)
            w.qweight, w.scale, w.input_scale = get(name), get(f"{name}_scale"), get(f"{prefix}.input_scale")
            if layer.quant_algo == QuantAlgo.FP8_PER_CHANNEL_PER_TOKEN and w.input_scale is not None:
                raise CheckpointError(f"{prefix}.input_scale is given but {layer.quant_algo} uses dynamic "
                                      f"per-token activation scales")
        w.validate(name)
    except CheckpointError as e:
        raise CheckpointError(f"{source}: {e}") from None
    return w
