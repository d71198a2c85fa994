"""Weight-only quantized linear: `weight_only_linear`, x @ W^T (+ bias) with an INT8 or INT4
weight (tensorrt_llm/quantization/formats.py holds the layouts; W8A16 / W4A16).

    weight_only_linear(x, qweight, scales, zeros, bias, perm, weight_format="int8"|"int4", group_size=G)

- INT8: qweight int8 [N, K], scales [N] (group_size 0: per output channel) or [N, K / G];
  zeros None.
- INT4: qweight uint8 [N, K / 2] (two codes a byte, even inputs in the low nibble), scales
  and zeros [N, K / G] of one float dtype (W = code * scale + zero); perm (GPTQ act-order)
  int64 [K] or None: the weight's stored input j is x's input perm[j] (x[..., perm] @ W^T).

x is float32 / float16 / bfloat16 [..., K]; the output has x's dtype and shape [..., N].

`tiled=True`: qweight holds the same bytes in tile order (`tile_codes`), the order the GPU
kernels read them in. A step of the GEMV reads, per tile of 16 output features and k-step of 4
16-byte packs, 16 rows x 64 bytes; in row order those are 16 pieces 2-28 KB apart, in tile
order one contiguous 1 KB, and a tile's whole row block is one stream (H100, batch 1, each
layer alone, INT4 group 128: gate_up 33.9 -> 29.6 us, lm_head 162 -> 138; INT8 gate_up 47.2
-> 43.3). The builder writes row order; `tile_weight_only_codes` (graph_rewriting.py) reorders
a network's codes in place when a runner loads it onto a GPU. Every implementation reads both
orders (the reference and the CPU pack restore row order first).

Implementations:
- reference: `quantized_linear_reference` (dequantize to float32, x @ W^T in float32, back to
  x's dtype): the meaning of the op, on every device.
- cuda: the compiled kernels (cpp/kernels/weight_only_gemv.cuh), through
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
- cpu: decode rows (up to HOST_GEMV_MAX_ROWS where the CPU has AVX2 + FMA, and PyTorch no
  AVX-512 kernels or our kernel AVX-512 VNNI too; else one row: host_gemv_rows), when the groups
  are whole blocks of 32 inputs, our host kernel (cpp/kernels/host_weight_only_gemv.cpp): x
  quantized per block of 32 inputs to int8 as llama.cpp does, integer dot products, float32
  scales (a relative error of at most 1/254 of a block's largest |x| per input). Otherwise,
  and for prompt rows, torch's `_weight_int8pack_mm` / `_weight_int4pack_mm_for_cpu` through
  quantization/cpu.py (vectorized for AVX-512 only: on an AVX2 CPU slower than float32). Both
  packs are made once per weight tensor (at its first call of that kind) and kept while the
  tensor lives. torch's kernels take bfloat16 activations, scales and zeros and round the output
  to bfloat16: against the reference a relative error of a few 2^-9 per output (cpu.py's
  docstring). INT8 group 16 (GGUF Q6_K) is requantized per row there.

`gated=True` (made by graph_rewriting's fuse_gated_linear from this op and the silu_and_mul
reading it): the output is silu_and_mul of the product, [..., N / 2]. Up to 8 rows the CUDA GEMV
applies it in its epilogue (each 16-row tile holds 8 gate rows and their 8 up rows), bit for bit
the GEMV then silu_and_mul's kernel, one kernel and its wait fewer a decode layer; elsewhere
the product, then silu_and_mul. Of the other fusions, fuse_gate_up makes this op's gate_up, and
fuse_norm_linear puts the RMSNorm in front of it: rms_norm_weight_only_linear and
add_rms_norm_weight_only_linear (below).
"""
from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ..network import Tensor
from ..quantization import cpu as qcpu
from ..quantization.formats import Int4Weight, Int8Weight, quantized_linear_reference
from ..quantization.mode import INT4_GROUP_SIZES, INT8_GROUP_SIZES
from .activation import gated_shape, silu_and_mul_cpu, silu_and_mul_cuda, silu_and_mul_reference
from .launch import bindings_available, cuda_kernels_available, get_bindings, launch, rows, tensor_arg
from .linear import linear_shape
from .norm import (
    check_norm_params,
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

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
WEIGHT_FORMATS = ("int8", "int4")


# Tile order: a tile of 16 rows (output features), a k-step of 4 packs of 16 bytes.
TILE_ROWS = 16
TILE_STEP_BYTES = 64
_PACK_BYTES = 16  # the kernels' loads
# A tile in row order as [half (rows g, g + 8 of the mma), row in the half, k-step, pack, byte].
_ROW_ORDER = (2, TILE_ROWS // 2, -1, TILE_STEP_BYTES // _PACK_BYTES, _PACK_BYTES)


def tileable(n: int, row_bytes: int) -> bool:
    """Whether a weight of n rows of row_bytes code bytes has a tile order: whole tiles and k-steps."""
    return n % TILE_ROWS == 0 and row_bytes % TILE_STEP_BYTES == 0


def tile_codes(qweight: torch.Tensor) -> torch.Tensor:
    """qweight [N, B] (int8 / uint8 codes, row order) in tile order, same dtype and shape: its
    16-byte packs as [N / 16][B / 64][2][8][4], i.e. (tile, k-step, half of the tile, row in the
    half, pack in the k-step) = row 16 tile + 8 half + r, pack 4 step + p (packIndex in
    cpp/kernels/weight_only_gemv.cuh)."""
    n, b = qweight.shape
    if not tileable(n, b):
        raise ValueError(f"tile_codes: a [{n}, {b}] weight has no tile order (rows a multiple of {TILE_ROWS}, "
                         f"row bytes of {TILE_STEP_BYTES})")
    u = qweight.contiguous().view(torch.uint8)
    tiles = u.view(n // TILE_ROWS, *_ROW_ORDER).permute(0, 3, 1, 2, 4, 5).contiguous()
    return tiles.view(n, b).view(qweight.dtype)


def untile_codes(qweight: torch.Tensor) -> torch.Tensor:
    """tile_codes' inverse: the codes in row order."""
    n, b = qweight.shape
    u = qweight.contiguous().view(torch.uint8)
    half, row, _, packs, pack_bytes = _ROW_ORDER
    rows_ = u.view(n // TILE_ROWS, -1, half, row, packs, pack_bytes).permute(0, 2, 3, 1, 4, 5).contiguous()
    return rows_.view(n, b).view(qweight.dtype)


def _weight(qweight: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor], weight_format: str,
            group_size: int):
    """The formats.py weight of the op's tensors (validated there)."""
    if weight_format == "int8":
        return Int8Weight(qweight, scales, group_size or None)
    return Int4Weight(qweight, scales, zeros, group_size)


@define
def weight_only_linear(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Optional[Tensor] = None,
                       bias: Optional[Tensor] = None, perm: Optional[Tensor] = None, *, weight_format: str,
                       group_size: int = 0, tiled: bool = False, gated: bool = False) -> Tensor:
    """x @ W^T + bias with W the INT8 / INT4 weight of qweight, scales (and zeros); `perm` (INT4
    act-order, int64 [in]): W's stored input j is x's input perm[j], x[..., perm] @ W^T; `tiled`:
    qweight's codes in tile order (tile_codes); `gated`: silu_and_mul of that."""
    op = "weight_only_linear"
    shape, attrs = _check_weight_only(op, x, qweight, scales, zeros, bias, weight_format, group_size, tiled, gated,
                                      perm)
    return add_layer(op, [x, qweight, scales, zeros, bias, perm], [(x.dtype, shape)], **attrs)


def _check_weight_only(op: str, x: Tensor, qweight: Tensor, scales: Tensor, zeros: Optional[Tensor],
                       bias: Optional[Tensor], weight_format: str, group_size: int, tiled: bool,
                       gated: bool, perm: Optional[Tensor] = None) -> tuple[tuple, dict]:
    """A weight-only linear's arguments checked: (its output shape, its layer's attrs)."""
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"{op}: weight_format {weight_format!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ValueError(f"{op}: group_size must be an integer, got {group_size!r}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{op}: x must be {' / '.join(FLOAT_DTYPES)}, got {x.dtype}")
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
    if not isinstance(tiled, bool):
        raise ValueError(f"{op}: tiled must be true or false, got {tiled!r}")
    if tiled and not tileable(n, qweight.shape[1]):
        raise ValueError(f"{op}: a [{n}, {qweight.shape[1]}] qweight has no tile order (out_features a multiple "
                         f"of {TILE_ROWS}, rows of a multiple of {TILE_STEP_BYTES} bytes)")
    if not isinstance(gated, bool):
        raise ValueError(f"{op}: gated must be true or false, got {gated!r}")
    if perm is not None:
        if weight_format != "int4" or perm.dtype != "int64":
            raise ValueError(f"{op}: perm (act-order) is an INT4 weight's int64 input order, got {perm.dtype} "
                             f"with {weight_format}")
        check_shape(op, perm, (k,), "perm")
    shape = linear_shape(op, x.shape, (n, k), bias, dtype=x.dtype)
    if gated:
        shape = gated_shape(op, shape)
    return shape, {"weight_format": weight_format, "group_size": int(group_size),
                   **({"tiled": True} if tiled else {}), **({"gated": True} if gated else {})}


def gather_inputs(x: torch.Tensor, perm: Optional[torch.Tensor]) -> torch.Tensor:
    """x[..., perm]: an act-order weight's inputs in its stored order (perm None: x)."""
    return x if perm is None else x.index_select(-1, perm.to(device=x.device, dtype=torch.long))


@weight_only_linear.implementation(REFERENCE)
def weight_only_linear_reference(x, qweight, scales, zeros=None, bias=None, perm=None, *, weight_format,
                                 group_size=0, tiled=False, gated=False):
    x = gather_inputs(x, perm)
    if tiled:
        qweight = untile_codes(qweight)
    y = quantized_linear_reference(x, _weight(qweight, scales, zeros, weight_format, group_size), bias)
    return silu_and_mul_reference(y) if gated else y


# ---- CPU: torch's int8pack / int4pack kernels, each weight packed once ------------------------

# id(qweight) -> (weakref to qweight, its data_ptr and version, the pack). A weight tensor of
# an engine lives as long as its session; the entry goes with it.
_PACKS: dict[int, tuple] = {}


def _forget(key: int, packs: dict = _PACKS) -> None:
    entry = packs.get(key)
    if entry is not None and entry[0]() is None:  # not a newer tensor's entry under a reused id
        del packs[key]


# Rows of x the host GEMV takes (decode) where PyTorch has no AVX-512 int kernels; more run
# torch's kernels.
HOST_GEMV_MAX_ROWS = 8


@functools.lru_cache(maxsize=None)
def host_gemv_rows(weight_format: str, in_features: int, group_size: int) -> int:
    """The most rows of x the host kernel takes for this weight here (0: never): it needs the
    bindings, a CPU with AVX2 + FMA and groups of whole 32-input blocks. Where PyTorch has AVX-512
    int kernels and our kernel has no AVX-512 VNNI to match them, it takes one row only: on an
    Intel Xeon (2 threads) its AVX2 form ran SmolLM2's batch-1 decode step in 23-25 ms against
    PyTorch's 31-43 (INT8) and 11-17 against 19-26 (INT4), while at 4 and 8 rows PyTorch's were
    as fast or faster. With VNNI, ours was faster at 1 to 8 rows (benchmarks/README.md)."""
    if not bindings_available():
        return 0
    b = get_bindings()
    if not (b.host_weight_only_gemv_available()
            and b.host_weight_only_gemv_serves(4 if weight_format == "int4" else 8, in_features, group_size)):
        return 0
    if torch.backends.cpu.get_cpu_capability().startswith("AVX512") and not b.host_weight_only_gemv_vnni():
        return 1
    return HOST_GEMV_MAX_ROWS


@dataclass
class HostPack:
    """The host kernel's operands of a weight: row-order codes, float32 scales (and zeros),
    contiguous, and their binding argument tuples, made once (a tuple per tensor per call cost
    about 2 us of a decode linear's ~20 us of Python)."""
    out_features: int
    tensors: tuple  # keeps args' memory alive
    args: tuple


def _host_pack(w) -> HostPack:
    zeros = getattr(w, "zeros", None)
    tensors = (w.qweight.contiguous(), w.scales.float().contiguous(),
               None if zeros is None else zeros.float().contiguous())
    return HostPack(w.qweight.shape[0], tensors, tuple(None if t is None else tensor_arg(t) for t in tensors))


def cpu_pack(qweight: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor], weight_format: str,
             group_size: int, tiled: bool = False, host: bool = False):
    """The CPU kernel's layout of this weight (host: the host GEMV's operands, else torch's pack;
    tiled: from codes in tile order), made at the first call of its kind and reused while the
    qweight tensor lives unchanged (a refit writes new tensors or bumps their version)."""
    key = id(qweight)
    stamp = (qweight.data_ptr(), qweight._version, scales.data_ptr(), scales._version)
    entry = _PACKS.get(key)
    if entry is None or entry[0]() is not qweight or entry[1] != stamp:
        entry = (weakref.ref(qweight, lambda _ref, key=key, forget=_forget: forget(key)), stamp, {})
        _PACKS[key] = entry
    packs = entry[2]
    if host not in packs:
        w = _weight(untile_codes(qweight) if tiled else qweight, scales, zeros, weight_format, group_size)
        packs[host] = (_host_pack(w) if host else qcpu.pack_int8_for_cpu(w) if weight_format == "int8"
                       else qcpu.pack_int4_for_cpu(w))
    return packs[host]


@weight_only_linear.implementation(CPU)
def weight_only_linear_cpu(x, qweight, scales, zeros=None, bias=None, perm=None, *, weight_format, group_size=0,
                           tiled=False, gated=False):
    x = gather_inputs(x, perm)
    if gated:  # silu_and_mul as the unfused graph computes it on the CPU
        return silu_and_mul_cpu(weight_only_linear_cpu(x, qweight, scales, zeros, bias,
                                                             weight_format=weight_format, group_size=group_size,
                                                             tiled=tiled))
    k = x.shape[-1]
    m = x.numel() // k if k else 0
    if 0 < m <= host_gemv_rows(weight_format, k, group_size):
        pack = cpu_pack(qweight, scales, zeros, weight_format, group_size, tiled, host=True)
        # A float32 engine's decode rows are the kernel's layout already: no reshapes, no casts
        # (each a few us of a decode linear's Python).
        plain = x.dim() == 2 and x.dtype == torch.float32 and x.stride(1) == 1
        x2 = x if plain else x.reshape(m, k).float().contiguous()
        out = torch.empty(m, pack.out_features)
        launch("host_weight_only_gemv", out, x2, *pack.args, None if bias is None else bias.float().contiguous(),
               weight_format, int(group_size), torch.get_num_threads())
        return out if plain else out.to(x.dtype).reshape(*x.shape[:-1], pack.out_features)
    pack = cpu_pack(qweight, scales, zeros, weight_format, group_size, tiled)
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
# The pipelined kernel's x, which its fused forms (`gated`, the RMSNorm in front) need: rows and bytes.
PIPELINED_GEMV_MAX_ROWS = 8
PIPELINED_GEMV_MAX_X_BYTES = 64 * 1024


def _codes_per_pack(weight_format: str) -> int:
    return 16 if weight_format == "int8" else 32


def cuda_serves(x: torch.Tensor, qweight: torch.Tensor, weight_format: str) -> bool:
    """Whether the compiled kernels serve this call: CUDA tensors, in_features a multiple of a
    16-byte pack's codes (16 INT8 / 32 INT4: always true of INT4 and of group-wise INT8), and a
    contiguous qweight on a 16-byte boundary."""
    k = x.shape[-1]
    return (x.is_cuda and cuda_kernels_available() and k % _codes_per_pack(weight_format) == 0
            and qweight.is_contiguous() and qweight.data_ptr() % 16 == 0)


def pipelined_takes_x(x2: torch.Tensor) -> bool:
    """What the pipelined GEMV's fused forms take of x [m, k] (the bindings' pipelinedTakesX): at
    most 8 rows of float16 / bfloat16 on 16-byte boundaries within 64 KB."""
    m, k = x2.shape
    return (m <= PIPELINED_GEMV_MAX_ROWS and x2.dtype in (torch.float16, torch.bfloat16)
            and m * k * x2.element_size() <= PIPELINED_GEMV_MAX_X_BYTES and x2.data_ptr() % 16 == 0
            and (x2.stride(0) * x2.element_size()) % 16 == 0)


def pipelined_groups(scales: torch.Tensor, weight_format: str, group_size: int) -> bool:
    """Whether the pipelined GEMV reads these scales: float32, in groups of whole k-steps (4 packs)
    or one a row."""
    bits = 8 if weight_format == "int8" else 4
    return scales.dtype == torch.float32 and (group_size == 0 or group_size >= 512 // bits)


def perm_gemv_serves(x2: torch.Tensor, scales: torch.Tensor, weight_format: str, group_size: int) -> bool:
    """Whether the GEMV gathers an act-order x itself (the bindings' check of perm): INT4,
    pipelined_takes_x (at least one row) and pipelined_groups."""
    return (weight_format == "int4" and x2.shape[0] > 0 and pipelined_takes_x(x2)
            and pipelined_groups(scales, weight_format, group_size))


def gated_epilogue_takes(x2: torch.Tensor, n: int) -> bool:
    """What every GEMV's `gated` needs (the bindings' checkGated): pipelined_takes_x and
    out_features a multiple of 16."""
    return n % 16 == 0 and pipelined_takes_x(x2)


def gated_gemv_serves(x2: torch.Tensor, n: int, scales: torch.Tensor, weight_format: str, group_size: int) -> bool:
    """Whether the GEMV applies silu_and_mul in its epilogue (`gated`): gated_epilogue_takes and
    pipelined_groups."""
    return gated_epilogue_takes(x2, n) and pipelined_groups(scales, weight_format, group_size)


def weight_only_matmul_cuda(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                            zeros: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, *,
                            weight_format: str, group_size: int = 0,
                            perm: Optional[torch.Tensor] = None, tiled: bool = False,
                            gated: bool = False) -> torch.Tensor:
    """x[..., perm] @ W^T (+ bias) with the compiled kernels, for a call `cuda_serves`; perm is
    INT4's act-order input permutation (formats.py): the pipelined GEMV gathers x as it stages it
    (perm_gemv_serves), other calls gather x first; tiled: qweight in tile order; gated:
    silu_and_mul of that (in the GEMV's epilogue where it serves)."""
    if perm is not None and not perm_gemv_serves(rows(x), scales, weight_format, group_size):
        x, perm = gather_inputs(x, perm), None
    x2 = rows(x)
    m, k = x2.shape
    n = qweight.shape[0]
    words = qweight.view(torch.int32)  # the kernels read the bytes as int32 words, in 16-byte packs
    scales = scales.contiguous()
    zeros = None if zeros is None else zeros.contiguous()
    bias = None if bias is None else bias.contiguous()
    extra = {} if perm is None else {"perm": perm.contiguous()}
    if gated and 0 < m and gated_gemv_serves(x2, n, scales, weight_format, group_size):
        out = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
        launch("weight_only_gemv", out, x2, words, scales, zeros, bias, weight_format, int(group_size), tiled, True,
               0.0, **extra)
        return out.reshape(*x.shape[:-1], n // 2)
    if m <= GEMV_MAX_ROWS and k <= GEMV_MAX_K:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        if m:
            launch("weight_only_gemv", out, x2, words, scales, zeros, bias, weight_format, int(group_size), tiled,
                   False, 0.0, **extra)
    else:
        # Prompt steps are bound by arithmetic, not by the weight's bytes: a scratch copy of W in
        # x's dtype for cuBLAS's tensor cores costs one more pass over N * K elements.
        w = torch.empty(n, k, dtype=x.dtype, device=x.device)
        launch("weight_only_dequantize", w, words, scales, zeros, weight_format, int(group_size), tiled)
        out = F.linear(x2, w, bias)
    out = out.reshape(*x.shape[:-1], n)
    return silu_and_mul_cuda(out) if gated else out


@weight_only_linear.implementation(CUDA)
def weight_only_linear_cuda(x, qweight, scales, zeros=None, bias=None, perm=None, *, weight_format, group_size=0,
                            tiled=False, gated=False):
    if not cuda_serves(x, qweight, weight_format):
        return weight_only_linear_reference(x, qweight, scales, zeros, bias, perm, weight_format=weight_format,
                                            group_size=group_size, tiled=tiled, gated=gated)
    return weight_only_matmul_cuda(x, qweight, scales, zeros, bias, weight_format=weight_format,
                                   group_size=group_size, perm=perm, tiled=tiled, gated=gated)


# ---- the RMSNorm in front: rms_norm_weight_only_linear, add_rms_norm_weight_only_linear ---------
# Made by graph_rewriting's fuse_norm_linear from a norm whose only reader is a weight-only
# linear. Up to 8 rows of bfloat16 x with INT4 weights, the CUDA GEMV computes the norm itself
# (kernels.h's WeightOnlyNorm): out = inv * (W (s * norm_weight)) + bias, inv = rsqrt(mean(s^2) +
# eps), each warp scaling only the x it stages, so no kernel and no pass over the whole row
# stands between the previous kernel and the first product. That rounds s * norm_weight to
# bfloat16 where the norm kernel rounds s * inv * norm_weight: the same size of error, other bits
# (tests/kernels/test_weight_only_gemv.py measures both against float64). Elsewhere (INT8, float16,
# more rows, the CPU and the reference) the norm's own implementation, then weight_only_linear:
# the unfused graph's bits.

# The ops that read a weight-only qweight, and its place among their inputs (tile_weight_only_codes).
WEIGHT_ONLY_OPS = {"weight_only_linear": 1, "rms_norm_weight_only_linear": 2, "add_rms_norm_weight_only_linear": 3}


@define
def rms_norm_weight_only_linear(x: Tensor, norm_weight: Tensor, qweight: Tensor, scales: Tensor,
                                zeros: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                                perm: Optional[Tensor] = None, *, eps: float, weight_format: str, group_size: int = 0,
                                tiled: bool = False, gated: bool = False) -> Tensor:
    """weight_only_linear(rms_norm(x, norm_weight, eps), qweight, scales, zeros, bias, perm, ...)."""
    op = "rms_norm_weight_only_linear"
    check_norm_params(op, x, norm_weight)
    shape, attrs = _check_weight_only(op, x, qweight, scales, zeros, bias, weight_format, group_size, tiled, gated,
                                      perm)
    return add_layer(op, [x, norm_weight, qweight, scales, zeros, bias, perm], [(x.dtype, shape)],
                     eps=norm_eps(op, eps), **attrs)


@define
def add_rms_norm_weight_only_linear(x: Tensor, residual: Tensor, norm_weight: Tensor, qweight: Tensor,
                                    scales: Tensor, zeros: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                                    perm: Optional[Tensor] = None, *, eps: float, weight_format: str,
                                    group_size: int = 0, tiled: bool = False,
                                    gated: bool = False) -> tuple[Tensor, Tensor]:
    """(weight_only_linear(rms_norm(x + residual, norm_weight, eps), qweight, ..., perm), x + residual)."""
    op = "add_rms_norm_weight_only_linear"
    check_norm_params(op, x, norm_weight)
    check_same_dtype(op, x, residual)
    total = residual_sum_shape(op, x, residual)
    shape, attrs = _check_weight_only(op, x, qweight, scales, zeros, bias, weight_format, group_size, tiled, gated,
                                      perm)
    return add_layer(op, [x, residual, norm_weight, qweight, scales, zeros, bias, perm],
                     [(x.dtype, shape), (x.dtype, total)], eps=norm_eps(op, eps), **attrs)


def _norm_then_linear(norm, linear, x, norm_weight, qweight, scales, zeros, bias, perm, eps, attrs):
    """linear(norm(x)): the unfused graph's two implementations, one after the other."""
    return linear(norm(x, norm_weight, eps=eps), qweight, scales, zeros, bias, perm, **attrs)


def _add_norm_then_linear(add_norm, linear, x, residual, norm_weight, qweight, scales, zeros, bias, perm, eps, attrs):
    """(linear(norm(x + residual)), x + residual): the unfused graph's two implementations."""
    normed, total = add_norm(x, residual, norm_weight, eps=eps)
    return linear(normed, qweight, scales, zeros, bias, perm, **attrs), total


@rms_norm_weight_only_linear.implementation(REFERENCE)
def rms_norm_weight_only_linear_reference(x, norm_weight, qweight, scales, zeros=None, bias=None, perm=None, *,
                                          eps, weight_format, group_size=0, tiled=False, gated=False):
    attrs = dict(weight_format=weight_format, group_size=group_size, tiled=tiled, gated=gated)
    return _norm_then_linear(rms_norm_reference, weight_only_linear_reference, x, norm_weight, qweight, scales,
                             zeros, bias, perm, eps, attrs)


@rms_norm_weight_only_linear.implementation(CPU)
def rms_norm_weight_only_linear_cpu(x, norm_weight, qweight, scales, zeros=None, bias=None, perm=None, *, eps,
                                    weight_format, group_size=0, tiled=False, gated=False):
    attrs = dict(weight_format=weight_format, group_size=group_size, tiled=tiled, gated=gated)
    return _norm_then_linear(rms_norm_cpu, weight_only_linear_cpu, x, norm_weight, qweight, scales, zeros, bias,
                             perm, eps, attrs)


@rms_norm_weight_only_linear.implementation(CUDA)
def rms_norm_weight_only_linear_cuda(x, norm_weight, qweight, scales, zeros=None, bias=None, perm=None, *, eps,
                                     weight_format, group_size=0, tiled=False, gated=False):
    attrs = dict(weight_format=weight_format, group_size=group_size, tiled=tiled, gated=gated)
    if norm_gemv_serves(x, None, norm_weight, qweight, scales, **attrs):
        return _norm_gemv(x, None, norm_weight, qweight, scales, zeros, bias, perm, eps, **attrs)[0]
    return _norm_then_linear(rms_norm_cuda, weight_only_linear_cuda, x, norm_weight, qweight, scales, zeros, bias,
                             perm, eps, attrs)


@add_rms_norm_weight_only_linear.implementation(REFERENCE)
def add_rms_norm_weight_only_linear_reference(x, residual, norm_weight, qweight, scales, zeros=None, bias=None,
                                              perm=None, *, eps, weight_format, group_size=0, tiled=False,
                                              gated=False):
    attrs = dict(weight_format=weight_format, group_size=group_size, tiled=tiled, gated=gated)
    return _add_norm_then_linear(fused_add_rms_norm_reference, weight_only_linear_reference, x, residual,
                                 norm_weight, qweight, scales, zeros, bias, perm, eps, attrs)


@add_rms_norm_weight_only_linear.implementation(CPU)
def add_rms_norm_weight_only_linear_cpu(x, residual, norm_weight, qweight, scales, zeros=None, bias=None, perm=None,
                                        *, eps, weight_format, group_size=0, tiled=False, gated=False):
    attrs = dict(weight_format=weight_format, group_size=group_size, tiled=tiled, gated=gated)
    return _add_norm_then_linear(fused_add_rms_norm_cpu, weight_only_linear_cpu, x, residual, norm_weight, qweight,
                                 scales, zeros, bias, perm, eps, attrs)


@add_rms_norm_weight_only_linear.implementation(CUDA)
def add_rms_norm_weight_only_linear_cuda(x, residual, norm_weight, qweight, scales, zeros=None, bias=None,
                                         perm=None, *, eps, weight_format, group_size=0, tiled=False, gated=False):
    attrs = dict(weight_format=weight_format, group_size=group_size, tiled=tiled, gated=gated)
    if norm_gemv_serves(x, residual, norm_weight, qweight, scales, **attrs):
        return _norm_gemv(x, residual, norm_weight, qweight, scales, zeros, bias, perm, eps, **attrs)
    return _add_norm_then_linear(fused_add_rms_norm_cuda, weight_only_linear_cuda, x, residual, norm_weight, qweight,
                                 scales, zeros, bias, perm, eps, attrs)


def norm_gemv_serves(x: torch.Tensor, residual: Optional[torch.Tensor], norm_weight: torch.Tensor,
                     qweight: torch.Tensor, scales: torch.Tensor, *, weight_format: str, group_size: int = 0,
                     tiled: bool = False, gated: bool = False) -> bool:
    """Whether the CUDA GEMV computes the RMSNorm in front (the bindings' check): INT4 codes the kernels
    read, bfloat16 x, norm weight and residual on 16-byte packs, x and residual as pipelined_takes_x,
    scales as pipelined_groups."""
    if weight_format != "int4" or x.dtype != torch.bfloat16 or not cuda_serves(x, qweight, weight_format):
        return False
    x2 = rows(x)
    return (pipelined_takes_x(x2) and pipelined_groups(scales, weight_format, group_size) and x2.shape[0] > 0
            and (not gated or qweight.shape[0] % 16 == 0)
            and norm_weight.dtype == torch.bfloat16 and norm_weight.is_contiguous() and norm_weight.data_ptr() % 16 == 0
            and (residual is None or (residual.shape == x.shape and pipelined_takes_x(rows(residual)))))


def _norm_gemv(x, residual, norm_weight, qweight, scales, zeros, bias, perm, eps, *, weight_format, group_size=0,
               tiled=False, gated=False):
    """(out, x + residual or None): one launch of the GEMV with the RMSNorm in front (norm_gemv_serves),
    gathering an act-order x as it stages it (perm)."""
    x2 = rows(x)
    m, k = x2.shape
    n = qweight.shape[0] // 2 if gated else qweight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    total = None if residual is None else torch.empty(m, k, dtype=x.dtype, device=x.device)
    extra = {} if residual is None else {"residual": rows(residual), "residual_out": total}
    if perm is not None:
        extra["perm"] = perm.contiguous()
    launch("weight_only_gemv", out, x2, qweight.view(torch.int32), scales.contiguous(), zeros.contiguous(),
           None if bias is None else bias.contiguous(), weight_format, int(group_size), tiled, gated, float(eps),
           norm_weight=norm_weight, **extra)
    return out.reshape(*x.shape[:-1], n), None if total is None else total.view(x.shape)
