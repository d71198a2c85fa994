"""Quantization of a float checkpoint (issue #17): the `quantization` section of a weight-only
(W8A16 / W4A16) or FP8 (W8A8) checkpoint, and its linears' weights quantized with
quantization/formats.py's quantizers into the tensors a quantized linear reads (`P.weight`,
`P.weight_scale`, `P.weight_zero`, `P.input_scale`; scales and zeros float32, FP8 codes
float8_e4m3fn).

Which linears: those the model quantizes for the section (`quantize_linears`: attention qkv and
dense, mlp gate / fc / proj, lm_head), minus `exclude_modules`. Like TensorRT-LLM, the LM head
stays float unless exclude_modules is given without it: on SmolLM2 an INT8 head alone costs
about half a percent of perplexity. A quantized tied LM head (share_embedding_table) is untied
first: lm_head gets the embedding's rows, quantized, and the embedding stays float.

FP8 with static activation scales (`FP8`) needs each linear's calibrated input |x| max
(models/calibrate.py); per-token scales (`FP8_PER_CHANNEL_PER_TOKEN`) need none. Both
take per-tensor or per-channel weight scales. A gated MLP's gate and fc (up) linears read one
x, and the builder runs them as one GEMM (graph_rewriting.FuseGateUp), which needs one input
scale and keeps a per-tensor weight scale only where theirs are equal (per-channel scales take
cuBLASLt's slower row-wise FP8 GEMM): so per tensor they share one weight scale, the larger of
their two amax / 448, and they always share one input scale, the larger calibrated amax of the
two (calibration gives them the same one, as they read the same x).

A quantized KV cache (`kv_cache_quant_algo` INT8 / FP8, with any weight format or none,
`kv_cache_config`) gives each attention layer `A` the tensor `A.kv_cache_scale`, float32 [2]:
the K and V scales from the calibrated maxima (amax / 448 or amax / 127), or, for FP8 without
calibration, 1.0 (E4M3 covers +-448 at 3 mantissa bits, ample for unscaled K/V); INT8 has no
such default (a unit step would round every K/V element to an integer).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import torch

from ..layers.attention import Attention
from ..layers.linear import QUANT_SCALE_DTYPE, Linear
from ..layers.mlp import GatedMLP
from ..quantization.formats import fp8_scale_from_amax, kv_cache_scale_from_amax, quantize, quantize_fp8, to_state_dict
from ..quantization.gptq import quantize_gptq
from ..quantization.mode import QuantAlgo, QuantConfig
from .modeling_utils import PretrainedConfig

PRECISIONS = {"int8": QuantAlgo.W8A16, "int4": QuantAlgo.W4A16}
KV_CACHE_DTYPES = {"fp8": QuantAlgo.FP8, "int8": QuantAlgo.INT8}  # --kv_cache_dtype -> kv_cache_quant_algo
# What stays float when no exclude_modules are given (TensorRT-LLM's default excludes it too).
DEFAULT_EXCLUDED = ["lm_head"]


def weight_only_section(precision: str, group_size: int | None = None,
                        exclude_modules: list[str] | None = None) -> dict:
    """The `quantization` section of a weight-only checkpoint: INT8 per output channel unless a
    group size is given, INT4 in groups of `group_size` (128 when None)."""
    if precision not in PRECISIONS:
        raise ValueError(f"weight-only precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return QuantConfig(quant_algo=PRECISIONS[precision], group_size=group_size,
                       exclude_modules=DEFAULT_EXCLUDED if exclude_modules is None else exclude_modules).to_dict()


def fp8_section(dynamic_activations: bool = False, exclude_modules: list[str] | None = None) -> dict:
    """The `quantization` section of an FP8 checkpoint: `FP8` (static, calibrated activation
    scales) or `FP8_PER_CHANNEL_PER_TOKEN` (each token's own scale)."""
    algo = QuantAlgo.FP8_PER_CHANNEL_PER_TOKEN if dynamic_activations else QuantAlgo.FP8
    return QuantConfig(quant_algo=algo,
                       exclude_modules=DEFAULT_EXCLUDED if exclude_modules is None else exclude_modules).to_dict()


def quantized_config(config: PretrainedConfig, section: dict) -> PretrainedConfig:
    """`config` with the `quantization` section; a tied LM head the section quantizes is
    untied (one rank only: a split head would need the padded rows)."""
    config = dataclasses.replace(config, quantization=section)
    if (config.share_embedding_table and config.quant_config.layer("lm_head") is not None
            and config.mapping.tp_size == 1):
        config = dataclasses.replace(config, share_embedding_table=False)
    return config


def weight_only_config(config: PretrainedConfig, precision: str, group_size: int | None = None,
                       exclude_modules: list[str] | None = None) -> PretrainedConfig:
    """`config` with a weight-only section (weight_only_section)."""
    return quantized_config(config, weight_only_section(precision, group_size, exclude_modules))


def fp8_config(config: PretrainedConfig, dynamic_activations: bool = False,
               exclude_modules: list[str] | None = None) -> PretrainedConfig:
    """`config` with an FP8 section (fp8_section)."""
    return quantized_config(config, fp8_section(dynamic_activations, exclude_modules))


def kv_cache_config(config: PretrainedConfig, kv_cache_dtype: str | None) -> PretrainedConfig:
    """`config` with its KV cache in `kv_cache_dtype` ("fp8", "int8"; None: as it is)."""
    if kv_cache_dtype is None:
        return config
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"KV cache dtype {kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
    section = dict(config.quantization or {}, kv_cache_quant_algo=KV_CACHE_DTYPES[kv_cache_dtype].value)
    return dataclasses.replace(config, quantization=QuantConfig.from_dict(section).to_dict())


def set_quantized(weights: dict[str, torch.Tensor], name: str, w) -> None:
    """Put linear `name`'s quantized weight (formats.py) into `weights` as a quantized Linear
    reads it: the codes (and an INT4 act-order perm) as they are, scales and zeros float32 (exact
    from float16 / bfloat16)."""
    weights.pop(f"{name}.weight", None)
    for key, t in to_state_dict(w, name).items():
        scale = not key.endswith(".weight") and t.is_floating_point()
        weights[key] = t.to(getattr(torch, QUANT_SCALE_DTYPE)).contiguous() if scale else t


def quantize_checkpoint(model_cls, config: PretrainedConfig, weights: dict[str, torch.Tensor], *,
                        per_channel: bool = False,
                        input_amax: Mapping[str, torch.Tensor | float] | None = None,
                        kv_cache_amax: Mapping[str, torch.Tensor] | None = None,
                        hessians: Mapping[str, torch.Tensor] | None = None,
                        gptq_damp: float = 0.01, gptq_act_order: bool = False) -> dict[str, torch.Tensor]:
    """One rank's weights with every linear the config's `quantization` section quantizes
    replaced by its quantized tensors (the config of weight_only_config / fp8_config; the
    weights as the float converter wrote them, an untied head taking the embedding's rows).

    FP8 layers: `per_channel` gives one weight scale per output channel (else one per tensor);
    static activation scales come from `input_amax`, linear name -> the calibrated max |x| of
    its input (a ValueError names a linear without one). A quantized KV cache: each attention
    layer's scales from `kv_cache_amax` (attention name -> float32 [2], K and V maxima), or
    1.0 for FP8 when it is None (INT8 needs it).

    `hessians` (linear name -> [K, K], quantization/gptq.py's 2 X^T X / n of its calibration
    inputs): those linears are rounded by GPTQ (damping `gptq_damp`) onto the same grid and
    scales that round-to-nearest uses (`gptq_act_order`: inputs in decreasing H[k, k] order,
    gptq.gptq_act_order); the others (and all when None) round to nearest."""
    out = dict(weights)
    if not config.share_embedding_table and "lm_head.weight" not in out:
        out["lm_head.weight"] = out["transformer.vocab_embedding.weight"].clone()
    model = model_cls(config)
    out = add_kv_cache_scales(model_cls, config, out, kv_cache_amax)
    linears = {name: config.quant_config.layer(name) for name, module in model.named_modules()
               if isinstance(module, Linear) and module.weight_format is not None}
    fp8 = [name for name, layer in linears.items() if layer.weight_format == "fp8"]
    hessians = hessians or {}
    for name, layer in linears.items():
        if layer.weight_format != "fp8":
            w = out[f"{name}.weight"].float()
            set_quantized(out, name, quantize_gptq(w, hessians[name], layer, damp=gptq_damp,
                                                   act_order=gptq_act_order) if name in hessians
                          else quantize(w, layer))
    static = [name for name in fp8 if linears[name].static_activation_scale]
    missing = [name for name in static if input_amax is None or name not in input_amax]
    if missing:
        raise ValueError(f"{linears[missing[0]].quant_algo} needs the calibrated input amax of {missing[0]}; "
                         f"none was given")
    weight_amax = {name: out[f"{name}.weight"].float().abs().amax().reshape(1) for name in fp8}
    act_amax = {name: torch.as_tensor(input_amax[name], dtype=torch.float32).reshape(1) for name in static}
    for amax in (weight_amax, act_amax):
        for pair in gate_up_pairs(model, list(amax)):
            amax.update(dict.fromkeys(pair, torch.maximum(*(amax[name] for name in pair))))
    for name in fp8:
        input_scale = fp8_scale_from_amax(act_amax[name]) if name in act_amax else None
        w, amax = out[f"{name}.weight"].float(), None if per_channel else weight_amax[name]
        if name in hessians:
            set_quantized(out, name, quantize_gptq(w, hessians[name], linears[name], per_channel=per_channel,
                                                   fp8_amax=amax, input_scale=input_scale, damp=gptq_damp))
        else:
            set_quantized(out, name, quantize_fp8(w, per_channel=per_channel, input_scale=input_scale, amax=amax))
    return out


def gate_up_pairs(model, linears: list[str]) -> list[tuple[str, str]]:
    """(gate, fc) of each gated MLP of `model` whose two linears are both among `linears`:
    the pairs the builder fuses into one GEMM (graph_rewriting.FuseGateUp)."""
    chosen = set(linears)
    pairs = [(f"{name}.gate", f"{name}.fc") for name, module in model.named_modules() if isinstance(module, GatedMLP)]
    return [pair for pair in pairs if chosen.issuperset(pair)]


def add_kv_cache_scales(model_cls, config: PretrainedConfig, weights: dict[str, torch.Tensor],
                        kv_cache_amax: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """`weights` with each attention layer's `kv_cache_scale` when the config quantizes the KV
    cache (see the module docstring; the weights may be quantized already, e.g. a GGUF file's)."""
    algo = config.quant_config.kv_cache_quant_algo
    if algo is None:
        return weights
    scales = {f"{name}.kv_cache_scale": kv_cache_scales(name, algo, kv_cache_amax)
              for name, module in model_cls(config).named_modules() if isinstance(module, Attention)}
    return {**weights, **scales}


def kv_cache_scales(attention: str, algo: QuantAlgo,
                    kv_cache_amax: Mapping[str, torch.Tensor] | None) -> torch.Tensor:
    """float32 [2]: attention layer `attention`'s K and V scales (see the module docstring)."""
    if kv_cache_amax is None:
        if algo == QuantAlgo.INT8:
            raise ValueError("an INT8 KV cache needs calibrated K/V maxima (examples/quantization/quantize.py "
                             "--kv_cache_dtype int8); none were given")
        return torch.ones(2, dtype=torch.float32)
    if attention not in kv_cache_amax:
        raise ValueError(f"{algo} KV cache needs the calibrated K/V maxima of {attention}; none were given")
    return kv_cache_scale_from_amax(torch.as_tensor(kv_cache_amax[attention]).reshape(2), algo)


def add_kv_cache_argument(parser, calibrated: bool) -> None:
    """--kv_cache_dtype of the converters (`calibrated`: they calibrate its scales)."""
    how = ("scales from each layer's calibrated K/V maxima (amax / 448 for fp8, amax / 127 for int8)" if calibrated
           else "fp8 with scales 1.0 (no calibration; E4M3 covers +-448); int8 needs calibrated scales, which "
                "examples/quantization/quantize.py --kv_cache_dtype int8 makes")
    parser.add_argument("--kv_cache_dtype", choices=list(KV_CACHE_DTYPES), default=None,
                        help=f"store the KV cache as 1-byte codes: {how}. Combines with any weight format")


def add_weight_only_arguments(parser) -> None:
    """--use_weight_only, --weight_only_precision, --group_size of the converters."""
    parser.add_argument("--use_weight_only", action="store_true",
                        help="quantize the linear weights (weight-only; a GGUF file keeps its Q4_0 / Q4_1 / "
                             "Q8_0 blocks as INT4 / INT8); the LM head stays float unless --quantize_lm_head")
    parser.add_argument("--weight_only_precision", choices=list(PRECISIONS), default=None,
                        help="with --use_weight_only (not for GGUF files): int8 (W8A16, per output channel "
                             "unless --group_size) or int4 (W4A16, groups of --group_size, 128 by default)")
    parser.add_argument("--group_size", type=int, choices=[32, 64, 128], default=None,
                        help="inputs per quantization group (--use_weight_only)")
    add_quantize_lm_head_argument(parser)


def add_quantize_lm_head_argument(parser) -> None:
    """--quantize_lm_head (TensorRT-LLM's flag): the LM head in the linears' format too."""
    parser.add_argument("--quantize_lm_head", action="store_true",
                        help="quantize the LM head like the other linears (by default it stays float: it is "
                             "the most sensitive linear, and on an 8B model 1 GB of a 4-bit step's reads)")


def excluded_modules(quantize_lm_head: bool) -> list[str] | None:
    """exclude_modules for a --quantize_lm_head flag: none, or the default (None: DEFAULT_EXCLUDED)."""
    return [] if quantize_lm_head else None
