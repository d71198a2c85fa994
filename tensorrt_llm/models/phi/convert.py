"""Phi checkpoint converter: Hugging Face (PhiForCausalLM, Phi-1/1.5/2) -> our checkpoint.

Phi's layers run attention and MLP side by side on one input LayerNorm; rotary covers the
first partial_rotary_factor of each head (NeoX halves), and its lm_head has a bias.
"""
import torch

from ...errors import CheckpointError
from ...mapping import Mapping
from ..convert_utils import HIDDEN_ACTS, config_dtype, hf_config, load_weights, rotary_scaling_from_hf
from ..modeling_utils import PretrainedConfig

ARCHITECTURE = "PhiForCausalLM"

# Keys a Hugging Face config.json must give; the converter does not take transformers'
# defaults for them.
HF_REQUIRED_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                    "vocab_size", "max_position_embeddings", "layer_norm_eps")


def config_from_hf(hf_config_or_dir, dtype: str | None = None,
                   mapping: Mapping | None = None) -> PretrainedConfig:
    """Our config from a transformers PhiConfig or a Hugging Face model folder."""
    hf = hf_config(hf_config_or_dir, "phi", HF_REQUIRED_KEYS)
    if hf.qk_layernorm:
        raise CheckpointError("Phi with qk_layernorm is not supported")
    if hf.hidden_act not in HIDDEN_ACTS:
        raise CheckpointError(f"unsupported hidden_act {hf.hidden_act!r}")
    # transformers >= 5 keeps rope_theta and partial_rotary_factor in rope_parameters.
    rope = getattr(hf, "rope_parameters", None) or {}
    return PretrainedConfig(
        architecture=ARCHITECTURE,
        dtype=config_dtype(hf, dtype),
        num_hidden_layers=hf.num_hidden_layers,
        num_attention_heads=hf.num_attention_heads,
        num_key_value_heads=hf.num_key_value_heads,
        hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size,
        vocab_size=hf.vocab_size,
        position_embedding_type="rope_gpt_neox",
        max_position_embeddings=hf.max_position_embeddings,
        hidden_act=HIDDEN_ACTS[hf.hidden_act],
        norm_epsilon=hf.layer_norm_eps,
        rotary_base=float(rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))),
        rotary_scaling=rotary_scaling_from_hf(rope),
        rotary_pct=float(rope.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", 0.5))),
        mapping=mapping or Mapping(),
        attn_bias=True,
        mlp_bias=True,
        lm_head_bias=True,
        parallel_attention=True,
    )


def _weights(get, has, config: PretrainedConfig):
    yield "transformer.vocab_embedding.weight", get("model.embed_tokens.weight")
    for i in range(config.num_hidden_layers):
        hf, ours = f"model.layers.{i}.", f"transformer.layers.{i}."
        for kind in ("weight", "bias"):
            yield ours + f"input_layernorm.{kind}", get(hf + f"input_layernorm.{kind}")
            yield ours + f"attention.qkv.{kind}", torch.cat([get(hf + f"self_attn.{p}_proj.{kind}") for p in "qkv"])
            yield ours + f"attention.dense.{kind}", get(hf + f"self_attn.dense.{kind}")
            yield ours + f"mlp.fc.{kind}", get(hf + f"mlp.fc1.{kind}")
            yield ours + f"mlp.proj.{kind}", get(hf + f"mlp.fc2.{kind}")
    for kind in ("weight", "bias"):
        yield f"transformer.ln_f.{kind}", get(f"model.final_layernorm.{kind}")
    # A tied lm_head (saved without lm_head.weight) is the embedding; the bias is its own.
    yield "lm_head.weight", get("lm_head.weight" if has("lm_head.weight") else "model.embed_tokens.weight")
    yield "lm_head.bias", get("lm_head.bias")


def load_weights_from_hf(model_dir_or_model, config: PretrainedConfig,
                         mapping: Mapping | None = None):
    """One rank's weights (our names, config.dtype) from a Hugging Face folder or model."""
    return load_weights(model_dir_or_model, config, mapping, _weights)
