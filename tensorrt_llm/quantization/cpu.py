"""Weight-only INT8 and INT4 linears on the CPU, through PyTorch's own CPU kernels.

- INT4: `torch.ops.aten._weight_int4pack_mm_for_cpu` (TinyGemm's CPU port). At load,
  `pack_int4_for_cpu` gives `_convert_weight_to_int4pack_for_cpu` the codes as int32 [N, K]
  and builds the bfloat16 [K / G, N, 2] scale-and-zero table it reads, with
  zero' = zeros + 8 * scale because it computes (code - 8) * scale + zero'.
  Constraints (torch 2.13): G in 32, 64, 128, 256 (our INT4 groups are 32/64/128), K % G == 0,
  N % 16 == 0 (other N are padded with zero rows here and the output cut back).
- INT8, per channel: `torch.ops.aten._weight_int8pack_mm` (int8 [N, K] weight, one scale
  per row).
- INT8, group-wise with G in 32, 64, 128 (GGUF Q8_0): no INT8 kernel takes group scales, so
  each code q (-128..127) is split into two 4-bit codes, q + 128 = 16 * h + l, and one INT4
  kernel call runs on the [2N, K] weight [h; l] with scales [16 * s; s] and zeros'
  [0; 8 * s]: (h - 8) * 16s + (l - 8) * s + 8s = s * q, so the two halves of the output add up
  to x @ W^T with the weight exact (bfloat16 s aside: 16s and 8s round as s does).
- INT8, group-wise with G = 16 (GGUF Q6_K), below the INT4 kernel's smallest group:
  requantized at load to one scale per row (scale = the row's largest |w| / 127, codes
  round(w / scale)); that adds at most half a per-row step per weight, the one lossy step of
  these paths.

Both kernels are vectorized (AVX512 / AVX2) only for bfloat16 activations; with float32 or
float16 ones they take a scalar path that is slower than float32 `F.linear`. So activations
are rounded to bfloat16, the scales and zeros are bfloat16, the kernels accumulate in float32
and round the result to bfloat16, and the result is returned in x's dtype. Against
`quantized_linear_reference` (float32 throughout) that costs a relative error of a few times
2^-9 per output (the tests bound it at 2% of the output's largest magnitude).

Prefill-sized inputs: the INT4 kernel's time grows with the rows (it dequantizes per row
block); benchmarks/bench_quant_linear_cpu.py shows where float32 overtakes it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .formats import Int4Weight, Int8Weight, _per_input, unpack_int4

_INT4_CPU_GROUP_SIZES = (32, 64, 128, 256)
_N_MULTIPLE = 16
ACT_DTYPE = torch.bfloat16


@dataclass
class CpuInt4Pack:
    """An INT4 weight in the CPU kernel's layout (made once, at load)."""
    packed: torch.Tensor             # uint8, _convert_weight_to_int4pack_for_cpu's layout
    scales_and_zeros: torch.Tensor   # bfloat16 [K / G, N_padded, 2]
    group_size: int
    out_features: int
    in_features: int
    perm: torch.Tensor | None = None


@dataclass
class CpuInt8Pack:
    """An INT8 weight with one bfloat16 scale per output row (made once, at load)."""
    qweight: torch.Tensor   # int8 [N, K]
    scales: torch.Tensor    # bfloat16 [N]


@dataclass
class CpuInt8SplitPack:
    """A group-wise INT8 weight as one INT4 pack of 2N rows (high and low nibbles of q + 128)."""
    halves: CpuInt4Pack
    out_features: int


def _int4_pack(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
               perm: torch.Tensor | None) -> CpuInt4Pack:
    """codes int32 [N, K] (0..15), float32 scales and kernel zeros [N, K / G] -> CpuInt4Pack."""
    n, k = codes.shape
    pad = (-n) % _N_MULTIPLE
    if pad:
        codes = torch.cat([codes, codes.new_zeros(pad, k)])
        scales = torch.cat([scales, scales.new_zeros(pad, scales.shape[1])])
        zeros = torch.cat([zeros, zeros.new_zeros(pad, zeros.shape[1])])
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 1)
    table = torch.stack([scales, zeros], dim=-1).transpose(0, 1)  # [K / G, N, 2]
    return CpuInt4Pack(packed, table.to(ACT_DTYPE).contiguous(), group_size, n, k,
                       None if perm is None else perm.cpu().long())


def pack_int4_for_cpu(w: Int4Weight) -> CpuInt4Pack:
    n, k = w.shape
    if w.group_size not in _INT4_CPU_GROUP_SIZES or k % w.group_size:
        raise ValueError(f"the CPU INT4 kernel needs a group size of {_INT4_CPU_GROUP_SIZES} dividing "
                         f"in_features; got group {w.group_size}, in_features {k}")
    scales, zeros = w.scales.cpu().float(), w.zeros.cpu().float()
    return _int4_pack(unpack_int4(w.qweight.cpu()).to(torch.int32), scales, zeros + 8 * scales, w.group_size, w.perm)


def pack_int8_for_cpu(w: Int8Weight) -> CpuInt8Pack | CpuInt8SplitPack:
    """Per-channel INT8 as it is; group-wise INT8 split into two INT4 halves (exact), or for
    G = 16 requantized to one scale per row (lossy); see the module docstring."""
    if w.group_size is None:
        return CpuInt8Pack(_aligned(w.qweight.cpu()), _aligned(w.scales.cpu().to(ACT_DTYPE)))
    if w.group_size in _INT4_CPU_GROUP_SIZES:
        u = w.qweight.cpu().to(torch.int32) + 128
        s = w.scales.cpu().float()
        codes = torch.cat([u >> 4, u & 15])
        halves = _int4_pack(codes, torch.cat([16 * s, s]), torch.cat([torch.zeros_like(s), 8 * s]), w.group_size, None)
        return CpuInt8SplitPack(halves, w.shape[0])
    deq = w.qweight.cpu().float() * _per_input(w.scales.cpu(), w.group_size)
    scale = deq.abs().amax(dim=1) / 127
    scale_bf16 = scale.to(ACT_DTYPE)
    divisor = torch.where(scale_bf16 == 0, torch.ones_like(scale), scale_bf16.float())
    q = torch.round(deq / divisor[:, None]).clamp(-127, 127).to(torch.int8)
    return CpuInt8Pack(q, scale_bf16)


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """`t` contiguous at a 64-byte boundary (a copy if needed): `_weight_int8pack_mm` crashes
    (SIGSEGV, torch 2.13) on an operand that is not, such as a tensor read from a
    safetensors file at an odd offset, once it has more than one row."""
    t = t.contiguous()
    return t if t.data_ptr() % 64 == 0 else t.clone()


def _rows(x: torch.Tensor, k: int) -> torch.Tensor:
    if x.shape[-1] != k:
        raise ValueError(f"input has {x.shape[-1]} features; the weight takes {k}")
    return _aligned(x.reshape(-1, k).to(ACT_DTYPE))


def int4_weight_only_linear(x: torch.Tensor, w: Int4Weight | CpuInt4Pack,
                            bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W^T (+ bias) with an INT4 weight, on the CPU; x [..., K] of any float dtype. Pass
    a CpuInt4Pack (pack_int4_for_cpu, once) on hot paths: an Int4Weight is packed per call."""
    if isinstance(w, Int4Weight):
        w = pack_int4_for_cpu(w)
    x2 = _rows(x, w.in_features)
    if w.perm is not None:
        x2 = x2[:, w.perm]
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2.contiguous(), w.packed, w.group_size, w.scales_and_zeros)
    if y.shape[1] != w.out_features:
        y = y[:, :w.out_features]
    y = y.to(x.dtype)
    if bias is not None:
        y = y + bias.to(x.dtype)
    return y.reshape(*x.shape[:-1], w.out_features)


def int8_weight_only_linear(x: torch.Tensor, w: Int8Weight | CpuInt8Pack | CpuInt8SplitPack,
                            bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W^T (+ bias) with an INT8 weight, on the CPU; x [..., K] of any float dtype. Pass
    the pack_int8_for_cpu result (made once) on hot paths."""
    if isinstance(w, Int8Weight):
        w = pack_int8_for_cpu(w)
    if isinstance(w, CpuInt8SplitPack):
        h = w.halves
        y2 = torch.ops.aten._weight_int4pack_mm_for_cpu(_rows(x, h.in_features).contiguous(), h.packed,
                                                        h.group_size, h.scales_and_zeros)
        n = w.out_features
        y = (y2[:, :n].float() + y2[:, n:2 * n].float()).to(x.dtype)
    else:
        n, k = w.qweight.shape
        y = torch.ops.aten._weight_int8pack_mm(_rows(x, k), w.qweight, w.scales).to(x.dtype)
    if bias is not None:
        y = y + bias.to(x.dtype)
    return y.reshape(*x.shape[:-1], n)
