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


def untie_lm_head(config: PretrainedConfig, weights: dict[str, torch.Tensor]) -> PretrainedConfig:
    """A tied LM head that the section quantizes gets its own `lm_head.weight` (the embedding's
    rows); returns the config to write (share_embedding_table False then)."""
    if not config.share_embedding_table or config.quant_config.layer("lm_head") is None:
        return config
    if config.mapping.tp_size != 1:
        return config  # the head would need the padded, split rows: left tied (float)
    weights["lm_head.weight"] = weights["transformer.vocab_embedding.weight"].clone()
    return dataclasses.replace(config, share_embedding_table=False)


def quantize_checkpoint(model_cls, config: PretrainedConfig,
                        weights: dict[str, torch.Tensor]) -> tuple[PretrainedConfig, dict[str, torch.Tensor]]:
    """(config, weights) of one rank with every linear the config's `quantization` section
    quantizes replaced by its quantized tensors; other weights are kept as they are."""
    config = untie_lm_head(config, weights)
    model = model_cls(config)
    out = dict(weights)
    for name, module in model.named_modules():
        if not (isinstance(module, Linear) and module.weight_format is not None):
            continue
        layer = config.quant_config.layer(name)
        w = out.pop(f"{name}.weight")
        tensors = to_state_dict(quantize(w.float(), layer), name)
        for key, t in tensors.items():
            out[key] = t if key.endswith(".weight") else t.to(getattr(torch, QUANT_SCALE_DTYPE))
    return config, out
