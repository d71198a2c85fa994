"""llama.cpp GGUF quantized tensors -> the INT8 / INT4 formats, from the raw blocks, exactly.

A GGUF 2-D tensor of shape [N, K] (GGUF lists it innermost first, [K, N]) is N rows of K / B
blocks; each block covers B consecutive inputs of one row, so a block is a group of our
formats. The mapping keeps every block's integers and its float16 numbers (no float round
trip of the weights), and our dequantization reproduces the `gguf` package's bit for bit:

- Q8_0, blocks of 32 (34 bytes: d f16, q int8[32]), value d * q
  -> INT8, group 32, scales d (float16).
- Q4_0, blocks of 32 (18 bytes: d f16, q 4-bit[32]), value (q - 8) * d
  -> INT4, group 32, scales d, zeros -8 * d (float16; float32 where -8 * d overflows it).
- Q4_1, blocks of 32 (20 bytes: d f16, m f16, q 4-bit[32]), value q * d + m
  -> INT4, group 32, scales d, zeros m (float16).
- Q4_K, blocks of 256 (144 bytes: d, dmin f16, 8 x 6-bit (sc, m), q 4-bit[256]), value
  q * (d * sc) - dmin * m per 32 -> INT4, group 32, scales d * sc, zeros -(dmin * m) (float32).
- Q6_K, blocks of 256 (210 bytes: q low 4 bits [128], high 2 bits [64], int8 sc[16], d f16),
  value (q - 32) * (d * sc) per 16 -> INT8 (q - 32), group 16, scales d * sc (float32).

Q8_0 maps to group-wise INT8 rather than per-channel INT8: its 32-input blocks each have their
own scale, and one scale per row would need new codes (a float round trip). Q4_* blocks hold
4-bit codes, in llama.cpp's nibble order (inputs 0..15 of a block in the low nibbles of
bytes 0..15, inputs 16..31 in the high nibbles), which are repacked into ours: integers only.
The products d * sc, dmin * m of the K-quants are exact in float32 (11-bit by 6- or 8-bit
significands), so they are stored as float32. Other types (F32, F16, Q5_*, Q2_K, ...) are
not converted here: the caller dequantizes them to float.
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import CheckpointError
from .formats import Int4Weight, Int8Weight, pack_int4
from .mode import LayerQuant, QuantAlgo

# GGMLQuantizationType values (gguf.GGMLQuantizationType), so that importing needs no gguf.
Q4_0, Q4_1, Q8_0, Q4_K, Q6_K = 2, 3, 8, 12, 14
_NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K"}
# elements per block, bytes per block
_BLOCKS = {Q8_0: (32, 34), Q4_0: (32, 18), Q4_1: (32, 20), Q4_K: (256, 144), Q6_K: (256, 210)}
GGUF_LAYER_QUANT = {
    Q8_0: LayerQuant(QuantAlgo.W8A16, 32),
    Q4_0: LayerQuant(QuantAlgo.W4A16, 32),
    Q4_1: LayerQuant(QuantAlgo.W4A16, 32),
    Q4_K: LayerQuant(QuantAlgo.W4A16, 32),
    Q6_K: LayerQuant(QuantAlgo.W8A16, 16),
}


def gguf_layer_quant(qtype) -> LayerQuant | None:
    """The per-layer quantization a GGUF tensor type converts to exactly, or None."""
    return GGUF_LAYER_QUANT.get(int(qtype))


def _f16(b: np.ndarray) -> torch.Tensor:
    """uint8 [..., 2] little-endian float16 -> float16 tensor [...]."""
    return torch.from_numpy(np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float16))


def _nibbles_block32(qs: np.ndarray) -> np.ndarray:
    """uint8 [..., 16] llama.cpp 32-element nibble blocks -> codes [..., 32] in input order."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _min16(scale32: torch.Tensor, zero32: torch.Tensor):
    """float16 scales and zeros when both are exact in float16, else float32."""
    s16, z16 = scale32.to(torch.float16), zero32.to(torch.float16)
    if torch.equal(s16.float(), scale32) and torch.equal(z16.float(), zero32):
        return s16, z16
    return scale32, zero32


def gguf_to_quantized(raw: np.ndarray, qtype, shape: tuple[int, int], name: str = "tensor") -> Int8Weight | Int4Weight:
    """A GGUF tensor's raw bytes (`ReaderTensor.data`: uint8 [N, bytes per row]) of type
    `qtype` and our shape (N, K) -> Int8Weight / Int4Weight, exactly (see the module docstring)."""
    qtype = int(qtype)
    if qtype not in _BLOCKS:
        raise CheckpointError(f"{name}: GGUF type {qtype} has no exact INT8/INT4 form here; "
                              f"converted types: {', '.join(_NAMES.values())}")
    n, k = shape
    per_block, block_bytes = _BLOCKS[qtype]
    if k % per_block:
        raise CheckpointError(f"{name}: in_features {k} is not a multiple of {_NAMES[qtype]}'s block of {per_block}")
    blocks = k // per_block
    raw = np.asarray(raw)
    if raw.dtype != np.uint8 or raw.size != n * blocks * block_bytes:
        raise CheckpointError(f"{name}: {raw.size} bytes of {raw.dtype} for a {_NAMES[qtype]} [{n}, {k}] tensor; "
                              f"expected {n * blocks * block_bytes} uint8")
    b = raw.reshape(n, blocks, block_bytes)

    if qtype == Q8_0:
        d = _f16(b[..., 0:2])
        q = torch.from_numpy(np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(n, k).copy())
        return Int8Weight(q, d, 32)

    if qtype in (Q4_0, Q4_1):
        d = _f16(b[..., 0:2])
        codes = _nibbles_block32(b[..., 2:18] if qtype == Q4_0 else b[..., 4:20]).reshape(n, k)
        if qtype == Q4_0:
            scales, zeros = _min16(d.float(), -8 * d.float())
        else:
            scales, zeros = d, _f16(b[..., 2:4])
        return Int4Weight(pack_int4(torch.from_numpy(codes)), scales, zeros, 32)

    if qtype == Q4_K:
        d, dmin = _f16(b[..., 0:2]).float(), _f16(b[..., 2:4]).float()
        sc, m = _q4k_scales_mins(b[..., 4:16])                       # [n, blocks, 8] each
        qs = b[..., 16:144].reshape(n, blocks, 4, 32)                 # 4 chunks of 32 bytes
        codes = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(n, k)  # chunk c: sub-blocks 2c, 2c + 1
        scales = (d[..., None] * torch.from_numpy(sc).float()).reshape(n, blocks * 8)
        zeros = (-(dmin[..., None] * torch.from_numpy(m).float())).reshape(n, blocks * 8)
        return Int4Weight(pack_int4(torch.from_numpy(codes)), scales, zeros, 32)

    # Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 sc[16], d f16
    ql, qh = b[..., 0:128].reshape(n, blocks, 2, 64), b[..., 128:192].reshape(n, blocks, 2, 32)
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8)
    d = _f16(b[..., 208:210]).float()
    low = np.stack([ql & 0x0F, ql >> 4], axis=3).reshape(n, blocks, 2, 128)        # half, 2 x 64
    high = np.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=3).reshape(n, blocks, 2, 128)  # half, 4 x 32
    q = ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8).reshape(n, k)
    scales = (d[..., None] * torch.from_numpy(sc.astype(np.float32))).reshape(n, blocks * 16)
    return Int8Weight(torch.from_numpy(q), scales, 16)


def _q4k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes -> the 6-bit scale and min of its 8 sub-blocks. Sub-block j < 4: scale
    in bits 0-5 of byte j, min in bits 0-5 of byte j + 4; j >= 4: low 4 bits in byte j + 4
    (scale: bits 0-3, min: bits 4-7), high 2 bits in bits 6-7 of byte j - 4 (scale) and
    byte j (min)."""
    s = s.astype(np.uint8)
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([a & 63, (c & 0x0F) | ((a >> 6) << 4)], axis=-1)
    m = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return sc, m


def convert_gguf_tensor(tensor, name: str | None = None) -> Int8Weight | Int4Weight:
    """A `gguf.GGUFReader` tensor (2-D, of a type in the table) -> Int8Weight / Int4Weight."""
    dims = [int(x) for x in tensor.shape]
    name = name or tensor.name
    if len(dims) != 2:
        raise CheckpointError(f"{name}: a {len(dims)}-D GGUF tensor is not a linear weight")
    return gguf_to_quantized(tensor.data, int(tensor.tensor_type), (dims[1], dims[0]), name)
