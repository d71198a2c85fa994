"""AutoAWQ and AutoGPTQ checkpoints (their published safetensors layouts) -> INT4 exactly.

Per quantized linear `P` (Hugging Face names, e.g. `model.layers.0.self_attn.q_proj`), with
K = in_features, N = out_features, G = group size, codes q and zero points z in 0..15:

AutoAWQ, GEMM version (`quant_method: awq`, `version: gemm`):
    P.qweight  int32 [K, N / 8]: word [k, j] holds columns 8j .. 8j + 7 of input k, column
               8j + ORDER[i] in bits 4i .. 4i + 3, ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
    P.qzeros   int32 [K / G, N / 8], packed the same way
    P.scales   float16 [K / G, N]
    W[n, k] = (q[k, n] - z[k // G, n]) * scales[k // G, n]

AutoGPTQ (`quant_method: gptq`):
    P.qweight  int32 [K / 8, N]: word [r, n] holds inputs 8r .. 8r + 7 of column n, input
               8r + i in bits 4i .. 4i + 3
    P.qzeros   int32 [ceil(K / G), N / 8]: word [g, j] holds column 8j + i in bits 4i .. 4i + 3;
               the stored value is z - 1 (`checkpoint_format: gptq`, AutoGPTQ's), or z itself
               (`gptq_v2`, GPTQModel's)
    P.scales   float16 [ceil(K / G), N]
    P.g_idx    int32 [K] (optional; k // G when absent): the group of each input. With
               `desc_act` (act-order) the groups are not contiguous; the loader sorts the
               inputs by group (a stable sort) and records the order as the INT4 `perm`.
    W[n, k] = (q[k, n] - z[g_idx[k], n]) * scales[g_idx[k], n]
    (as the exllama / vLLM kernels read it: z = stored + 1 with no wrap, so a stored 15 is 16.)

The INT4 format stores zeros as the float value of code 0, -z * scale, and scales and zeros in
float32 (the float16 scales exactly; -z * scale is exact in float32), so q * scale + zero is
exactly (q - z) * scale. Group sizes other than 32/64/128 (256, per-channel -1, a K that is
not a multiple of G) become the largest of 128/64/32 that divides both G and K, each scale and
zero repeated: also exact. Only 4-bit weights are read: AWQ's GEMV layout and 8-bit GPTQ are
refused with the reason.

`pack_awq` / `pack_gptq` write the layouts above from codes, zero points and scales (tests,
exporters); `load_awq_gptq(folder)` reads a whole checkpoint folder, `awq_gptq_method(folder)`
tells such a folder from a float one (the LLaMA converter's load_weight_only_from_awq_gptq
turns it into our checkpoint).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import CheckpointError
from .formats import Int4Weight, _shape, pack_int4
from .mode import INT4_GROUP_SIZES, QuantAlgo, QuantConfig

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)            # nibble i holds column 8j + AWQ_ORDER[i]
AWQ_NIBBLE_OF_COLUMN = (0, 4, 1, 5, 2, 6, 3, 7)  # column c is in nibble AWQ_NIBBLE_OF_COLUMN[c]
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def _unpack_words(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] -> int32 [..., W, 8]: nibble i of each word (bits 4i .. 4i + 3)."""
    return (words.to(torch.int32)[..., None] >> _SHIFTS.to(words.device)) & 15


def _pack_words(nibbles: torch.Tensor) -> torch.Tensor:
    """int [..., W, 8] values 0..15 -> int32 [..., W] (nibble i in bits 4i .. 4i + 3)."""
    if nibbles.numel() and (int(nibbles.min()) < 0 or int(nibbles.max()) > 15):
        raise ValueError("4-bit values must be 0..15")
    words = (nibbles.to(torch.int64) << _SHIFTS.to(torch.int64).to(nibbles.device)).sum(dim=-1)
    return words.to(torch.int64).where(words < 2 ** 31, words - 2 ** 32).to(torch.int32)


def _storage_group(group_size: int, k: int, name: str) -> int:
    g = math.gcd(group_size, k)
    for size in sorted(INT4_GROUP_SIZES, reverse=True):
        if g % size == 0:
            return size
    raise CheckpointError(f"{name}: its groups (runs of {group_size} inputs by g_idx, in_features {k}) do not "
                          f"split into INT4 groups of {', '.join(map(str, INT4_GROUP_SIZES))}")


def _to_int4(codes_nk: torch.Tensor, z_gn: torch.Tensor, s_gn: torch.Tensor, group_of_input: torch.Tensor,
             name: str) -> Int4Weight:
    """codes [N, K] (0..15), zero points and scales [groups, N], the group of each input [K]
    -> an exact Int4Weight (inputs sorted by group when the groups are not contiguous)."""
    n, k = codes_nk.shape
    group_of_input = group_of_input.long()
    perm = None
    if bool((group_of_input[1:] < group_of_input[:-1]).any()):
        perm = torch.sort(group_of_input, stable=True).indices
        group_of_input = group_of_input[perm]
        codes_nk = codes_nk[:, perm]
    # Contiguous groups; each one's run must cut into equal storage groups.
    starts = torch.nonzero(torch.diff(group_of_input, prepend=group_of_input[:1] - 1)).flatten()
    runs = torch.diff(starts, append=torch.tensor([k], device=starts.device))
    g = _storage_group(math.gcd(*[int(r) for r in runs.tolist()]), k, name)
    stored_group = group_of_input[::g]  # the source group of each storage group
    if not torch.equal(group_of_input.reshape(-1, g), stored_group[:, None].expand(-1, g)):
        raise CheckpointError(f"{name}: its groups are not runs of {g} inputs")
    scales = s_gn.float()[stored_group].t().contiguous()
    zeros = (-(z_gn.float()[stored_group] * s_gn.float()[stored_group])).t().contiguous()
    return Int4Weight(pack_int4(codes_nk.to(torch.uint8)), scales, zeros, g, perm)


def _expect(t, name: str, dtypes, shape, layout: str) -> None:
    if t is None:
        raise CheckpointError(f"{name} is missing")
    if t.dtype not in dtypes:
        raise CheckpointError(f"{name} has dtype {str(t.dtype).removeprefix('torch.')}; expected "
                              f"{' or '.join(str(d).removeprefix('torch.') for d in dtypes)}")
    if tuple(t.shape) != tuple(shape):
        raise CheckpointError(f"{name} has shape {_shape(t)}; expected [{', '.join(map(str, shape))}] ({layout})")


def _expect_matrix(t, name: str, layout: str) -> None:
    if t is None:
        raise CheckpointError(f"{name} is missing")
    if t.dtype != torch.int32:
        raise CheckpointError(f"{name} has dtype {str(t.dtype).removeprefix('torch.')}; expected int32")
    if t.dim() != 2:
        raise CheckpointError(f"{name} has shape {_shape(t)}; expected 2 dimensions ({layout})")


# ------------------------------------------------------------------------------ AWQ

def awq_to_int4(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                name: str = "layer") -> Int4Weight:
    """One AutoAWQ GEMM linear's tensors -> Int4Weight (exact)."""
    _expect_matrix(qweight, f"{name}.qweight", "AWQ: [in_features, out_features / 8]")
    k, n = qweight.shape[0], qweight.shape[1] * 8
    if k % group_size:
        raise CheckpointError(f"{name}.qweight: in_features {k} is not a multiple of the AWQ group size {group_size}")
    groups = k // group_size
    _expect(qzeros, f"{name}.qzeros", (torch.int32,), (groups, n // 8),
            f"AWQ: [in_features / group_size, out_features / 8] for in {k}, out {n}, group {group_size}")
    _expect(scales, f"{name}.scales", (torch.float16, torch.bfloat16, torch.float32), (groups, n),
            f"AWQ: [in_features / group_size, out_features] for in {k}, out {n}, group {group_size}")
    column_nibble = list(AWQ_NIBBLE_OF_COLUMN)
    codes = _unpack_words(qweight)[..., column_nibble].reshape(k, n)
    zeros = _unpack_words(qzeros)[..., column_nibble].reshape(groups, n)
    group_of_input = torch.arange(k, device=qweight.device) // group_size
    return _to_int4(codes.t(), zeros, scales, group_of_input, name)


def pack_awq(codes_kn: torch.Tensor, zeros_gn: torch.Tensor, scales_gn: torch.Tensor) -> dict[str, torch.Tensor]:
    """AutoAWQ GEMM tensors from codes [K, N], zero points [K / G, N] (0..15) and scales."""
    k, n = codes_kn.shape
    if n % 8:
        raise ValueError(f"AWQ packs out_features in words of 8; got {n}")
    order = list(AWQ_ORDER)
    return {"qweight": _pack_words(codes_kn.reshape(k, n // 8, 8)[..., order]),
            "qzeros": _pack_words(zeros_gn.reshape(zeros_gn.shape[0], n // 8, 8)[..., order]),
            "scales": scales_gn.to(torch.float16)}


# ------------------------------------------------------------------------------ GPTQ

def gptq_to_int4(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                 g_idx: torch.Tensor | None = None, checkpoint_format: str = "gptq",
                 name: str = "layer") -> Int4Weight:
    """One AutoGPTQ linear's tensors -> Int4Weight (exact); group_size -1 is per channel."""
    _expect_matrix(qweight, f"{name}.qweight", "GPTQ: [in_features / 8, out_features]")
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise CheckpointError(f"{name}: GPTQ checkpoint_format {checkpoint_format!r} is not gptq or gptq_v2")
    if n % 8:
        raise CheckpointError(f"{name}.scales: out_features {n} is not a multiple of 8, as GPTQ's qzeros needs")
    group = k if group_size in (-1, None) else group_size
    groups = -(-k // group)
    if g_idx is not None:
        _expect(g_idx, f"{name}.g_idx", (torch.int32, torch.int64), (k,), f"GPTQ: [in_features] = [{k}]")
        groups = max(groups, int(g_idx.max()) + 1) if g_idx.numel() else groups
        if int(g_idx.min()) < 0:
            raise CheckpointError(f"{name}.g_idx holds a negative group")
    _expect(qzeros, f"{name}.qzeros", (torch.int32,), (groups, n // 8),
            f"GPTQ: [groups, out_features / 8] for in {k}, out {n}, group {group}")
    _expect(scales, f"{name}.scales", (torch.float16, torch.bfloat16, torch.float32), (groups, n),
            f"GPTQ: [groups, out_features] for in {k}, out {n}, group {group}")
    codes = _unpack_words(qweight.t()).reshape(n, k)  # [N, K / 8, 8] -> [N, K]
    zeros = _unpack_words(qzeros).reshape(groups, n)
    if checkpoint_format == "gptq":
        zeros = zeros + 1
    group_of_input = torch.arange(k, device=qweight.device) // group if g_idx is None else g_idx.long()
    return _to_int4(codes, zeros, scales, group_of_input, name)


def round_to_nearest_awq(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float weight [N, K] rounded to nearest onto 4-bit codes with an integer zero point and a
    float16 scale per group of `group_size` inputs, as AutoAWQ / AutoGPTQ store them: (codes
    [K, N], zero points [K / G, N] in 1..15, scales [K / G, N]) for pack_awq / pack_gptq, meaning
    (codes - zero) * scale. (AWQ's activation-aware scale search is not run: it changes which
    values are stored, not their format.)"""
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"in_features {k} is not a multiple of the group size {group_size}")
    g = w.float().reshape(n, k // group_size, group_size)
    lo, hi = g.amin(-1), g.amax(-1)
    scales = ((hi - lo) / 15).clamp(min=1e-4).half()
    s = scales.float()
    zeros = (-lo / s).round().clamp(1, 15)  # from 1: AutoGPTQ stores z - 1
    codes = ((g / s[..., None]).round() + zeros[..., None]).clamp(0, 15)
    return codes.reshape(n, k).t().long(), zeros.t().long(), scales.t().contiguous()


def pack_gptq(codes_kn: torch.Tensor, zeros_gn: torch.Tensor, scales_gn: torch.Tensor,
              g_idx: torch.Tensor | None = None, checkpoint_format: str = "gptq") -> dict[str, torch.Tensor]:
    """AutoGPTQ tensors from codes [K, N], zero points [groups, N] (1..15 for `gptq`, whose
    stored value is z - 1; 0..15 for `gptq_v2`), scales and g_idx."""
    k, n = codes_kn.shape
    if k % 8 or n % 8:
        raise ValueError(f"GPTQ packs in words of 8; got in {k}, out {n}")
    stored = zeros_gn - 1 if checkpoint_format == "gptq" else zeros_gn
    out = {"qweight": _pack_words(codes_kn.t().reshape(n, k // 8, 8)).t().contiguous(),
           "qzeros": _pack_words(stored.reshape(stored.shape[0], n // 8, 8)),
           "scales": scales_gn.to(torch.float16)}
    if g_idx is not None:
        out["g_idx"] = g_idx.to(torch.int32)
    return out


# ------------------------------------------------------------------------------ folders

@dataclass
class QuantizedCheckpoint:
    """An AWQ or GPTQ folder: its INT4 linears by module name (Hugging Face names), every
    other tensor as stored (embeddings, norms, biases, an unquantized lm_head), the
    quantization section our checkpoints get, and the source's own settings."""
    method: str
    layers: dict[str, Int4Weight] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    quant_config: QuantConfig | None = None
    source_config: dict = field(default_factory=dict)


def read_quantization_config(folder: Path) -> dict:
    """The folder's quantization settings: config.json's `quantization_config`, else
    quantize_config.json (AutoGPTQ) or quant_config.json (AutoAWQ)."""
    cfg = folder / "config.json"
    if cfg.is_file():
        try:
            qc = json.loads(cfg.read_text()).get("quantization_config")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise CheckpointError(f"{cfg} is not a JSON object ({e})") from None
        if isinstance(qc, dict):
            return qc
    for fname, method in (("quantize_config.json", "gptq"), ("quant_config.json", "awq")):
        f = folder / fname
        if f.is_file():
            try:
                qc = json.loads(f.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise CheckpointError(f"{f} is not JSON ({e})") from None
            if not isinstance(qc, dict):
                raise CheckpointError(f"{f} is not a JSON object")
            qc.setdefault("quant_method", method)
            return qc
    raise CheckpointError(f"{folder} has no quantization settings (config.json quantization_config, "
                          "quantize_config.json or quant_config.json)")


def awq_gptq_method(folder) -> str | None:
    """'awq' or 'gptq' when a Hugging Face folder holds an AutoAWQ / AutoGPTQ checkpoint (its
    config.json's quantization_config, or quant_config.json / quantize_config.json, says so),
    else None (a float folder, or another method: the float converters read those)."""
    try:
        qc = read_quantization_config(Path(folder))
    except CheckpointError:
        return None
    return _method(qc)


def _method(qc: dict) -> str | None:
    """The settings' quant_method when it is awq or gptq (lower case), else None."""
    method = str(qc.get("quant_method", "")).lower()
    return method if method in ("awq", "gptq") else None


def _settings(qc: dict, folder: Path) -> tuple[str, int, str]:
    method = _method(qc)
    if method is None:
        raise CheckpointError(f"{folder}: quant_method {qc.get('quant_method')!r} is not awq or gptq")
    bits = qc.get("bits", qc.get("w_bit", 4))
    if bits != 4:
        raise CheckpointError(f"{folder}: {bits}-bit {method.upper()} is not supported: only 4-bit weights "
                              "map onto the INT4 format (8-bit GPTQ's zero points do not fit symmetric INT8)")
    group = qc.get("group_size", qc.get("q_group_size", 128))
    if not isinstance(group, int) or isinstance(group, bool) or not (group == -1 or group > 0):
        raise CheckpointError(f"{folder}: group_size {group!r} is not a positive integer or -1")
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise CheckpointError(f"{folder}: AWQ version {version!r} is not supported; only the GEMM layout "
                                  "(qweight [in, out / 8]) is read")
        if qc.get("zero_point", True) is False:
            raise CheckpointError(f"{folder}: AWQ without zero points is not supported")
        if group == -1:
            raise CheckpointError(f"{folder}: AWQ group_size -1 is not supported")
        fmt = "awq"
    else:
        fmt = str(qc.get("checkpoint_format", "gptq")).lower()
    return method, group, fmt


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no .safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{f} is not a readable safetensors file ({' '.join(str(e).split())[:200]})") \
                from None
    return tensors


def load_awq_gptq(folder) -> QuantizedCheckpoint:
    """Every quantized linear of an AutoAWQ (GEMM) or AutoGPTQ safetensors folder, exactly.

    A layer is every `P` with a `P.qweight`; it must have `P.qzeros` and `P.scales` (and may
    have `P.g_idx`, GPTQ); a missing or mis-shaped one is a CheckpointError naming it."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder")
    qc = read_quantization_config(folder)
    method, group, fmt = _settings(qc, folder)
    tensors = _read_safetensors(folder)
    prefixes = sorted(name[:-len(".qweight")] for name in tensors if name.endswith(".qweight"))
    if not prefixes:
        raise CheckpointError(f"{folder}: no quantized layer (no tensor named *.qweight)")
    out = QuantizedCheckpoint(method, source_config=qc)
    used = set()
    needed = "qweight, qzeros and scales" + (" (g_idx optional)" if method == "gptq" else "")
    for p in prefixes:
        for part in ("qzeros", "scales"):
            if f"{p}.{part}" not in tensors:
                raise CheckpointError(f"{folder}: {p}.{part} is missing (a {method.upper()} layer needs {needed})")
        try:
            if method == "awq":
                w = awq_to_int4(tensors[f"{p}.qweight"], tensors[f"{p}.qzeros"], tensors[f"{p}.scales"], group, p)
            else:
                w = gptq_to_int4(tensors[f"{p}.qweight"], tensors[f"{p}.qzeros"], tensors[f"{p}.scales"], group,
                                 tensors.get(f"{p}.g_idx"), fmt, p)
        except CheckpointError as e:
            raise CheckpointError(f"{folder}: {e}") from None
        out.layers[p] = w
        used.update(f"{p}.{part}" for part in ("qweight", "qzeros", "scales", "g_idx"))
    out.tensors = {name: t for name, t in tensors.items() if name not in used}
    algo = QuantAlgo.W4A16_AWQ if method == "awq" else QuantAlgo.W4A16_GPTQ
    sizes = {w.group_size for w in out.layers.values()}
    if len(sizes) == 1:
        out.quant_config = QuantConfig(algo, group_size=sizes.pop(), has_zero_point=True)
    else:  # e.g. group 128 but one layer's in_features only a multiple of 64
        out.quant_config = QuantConfig(QuantAlgo.MIXED_PRECISION, quantized_layers={
            p: {"quant_algo": algo.value, "group_size": w.group_size} for p, w in out.layers.items()})
    return out
