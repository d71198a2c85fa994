"""Weight-only quantization of a float checkpoint (issue #17): the `quantization` section of a
W8A16 / W4A16 checkpoint, and its linears' weights quantized with quantization/formats.py's
quantizers into the tensors a quantized `Linear` reads (`P.weight`, `P.weight_scale`,
`P.weight_zero`; scales and zeros float32).

Which linears: those the model quantizes for the section (`quantize_linears`: attention qkv and
dense, mlp gate / fc / proj, lm_head), minus `exclude_modules`. A tied LM head
(share_embedding_table) is untied first: lm_head gets the embedding's rows, quantized, and the
embedding stays float.
"""
from __future__ import annotations

import dataclasses

import torch

from ..layers.linear import QUANT_SCALE_DTYPE, Linear
from ..quantization.formats import quantize, to_state_dict
from ..quantization.mode import QuantAlgo, QuantConfig
from .modeling_utils import PretrainedConfig

PRECISIONS = {"int8": QuantAlgo.W8A16, "int4": QuantAlgo.W4A16}


def weight_only_section(precision: str, group_size: int | None = None,
                        exclude_modules: list[str] | None = None) -> dict:
    """The `quantization` section of a weight-only checkpoint: INT8 per output channel unless a
    group size is given, INT4 in groups of `group_size` (128 when None)."""
    if precision not in PRECISIONS:
        raise ValueError(f"weight-only precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return QuantConfig(quant_algo=PRECISIONS[precision], group_size=group_size,
                       exclude_modules=exclude_modules).to_dict()


def weight_only_config(config: PretrainedConfig, precision: str, group_size: int | None = None,
                       exclude_modules: list[str] | None = None) -> PretrainedConfig:
    """`config` with a weight-only `quantization` section; a tied LM head the section
    quantizes is untied (one rank only: a split head would need the padded rows)."""
    config = dataclasses.replace(config, quantization=weight_only_section(precision, group_size, exclude_modules))
    if (config.share_embedding_table and config.quant_config.layer("lm_head") is not None
            and config.mapping.tp_size == 1):
        config = dataclasses.replace(config, share_embedding_table=False)
    return config


def set_quantized(weights: dict[str, torch.Tensor], name: str, w) -> None:
    """Put linear `name`'s quantized weight (formats.py) into `weights` as a quantized Linear
    reads it: the codes as they are, scales and zeros float32 (exact from float16 / bfloat16)."""
    weights.pop(f"{name}.weight", None)
    for key, t in to_state_dict(w, name).items():
        weights[key] = t if key.endswith(".weight") else t.to(getattr(torch, QUANT_SCALE_DTYPE)).contiguous()


def quantize_checkpoint(model_cls, config: PretrainedConfig,
                        weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One rank's weights with every linear the config's `quantization` section quantizes
    replaced by its quantized tensors (weight_only_config's config; the weights as the float
    converter wrote them, an untied head taking the embedding's rows)."""
    out = dict(weights)
    if not config.share_embedding_table and "lm_head.weight" not in out:
        out["lm_head.weight"] = out["transformer.vocab_embedding.weight"].clone()
    model = model_cls(config)
    for name, module in model.named_modules():
        if isinstance(module, Linear) and module.weight_format is not None:
            set_quantized(out, name, quantize(out[f"{name}.weight"].float(), config.quant_config.layer(name)))
    return out


def add_weight_only_arguments(parser) -> None:
    """--use_weight_only, --weight_only_precision, --group_size of the converters."""
    parser.add_argument("--use_weight_only", action="store_true",
                        help="quantize the linear weights (weight-only; a GGUF file keeps its Q4_0 / Q4_1 / "
                             "Q8_0 blocks as INT4 / INT8)")
    parser.add_argument("--weight_only_precision", choices=list(PRECISIONS), default=None,
                        help="with --use_weight_only (not for GGUF files): int8 (W8A16, per output channel "
                             "unless --group_size) or int4 (W4A16, groups of --group_size, 128 by default)")
    parser.add_argument("--group_size", type=int, choices=[32, 64, 128], default=None,
                        help="inputs per quantization group (--use_weight_only)")
