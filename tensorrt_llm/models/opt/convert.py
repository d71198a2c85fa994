"""OPT checkpoint converter: Hugging Face (OPTForCausalLM) -> our checkpoint.

OPT's position table has two leading rows that no position uses (OPTLearnedPositionalEmbedding
adds 2 to every position): they are dropped, so row p is position p. Only configs whose
word_embed_proj_dim equals hidden_size (no project_in/out) are supported, which excludes
opt-350m; post-norm layers (do_layer_norm_before False, as in opt-350m) are supported.
"""
import torch

from ...errors import CheckpointError
from ...mapping import Mapping
from ..convert_utils import HIDDEN_ACTS, config_dtype, hf_config, load_weights
from ..modeling_utils import PretrainedConfig

ARCHITECTURE = "OPTForCausalLM"

# Keys a Hugging Face config.json must give; the converter does not take transformers'
# defaults for them.
HF_REQUIRED_KEYS = ("hidden_size", "ffn_dim", "num_attention_heads", "num_hidden_layers",
                    "vocab_size", "max_position_embeddings")

_POSITION_OFFSET = 2
_LAYER_NORM_EPS = 1e-5  # OPT uses torch's LayerNorm default


def config_from_hf(hf_config_or_dir, dtype: str | None = None,
                   mapping: Mapping | None = None) -> PretrainedConfig:
    """Our config from a transformers OPTConfig or a Hugging Face model folder."""
    hf = hf_config(hf_config_or_dir, "opt", HF_REQUIRED_KEYS)
    if hf.word_embed_proj_dim != hf.hidden_size:
        raise CheckpointError(f"OPT with word_embed_proj_dim ({hf.word_embed_proj_dim}) != hidden_size "
                              f"({hf.hidden_size}) (project_in/out) is not supported")
    if not hf.layer_norm_elementwise_affine:
        raise CheckpointError("OPT without layer_norm_elementwise_affine is not supported")
    if hf.do_layer_norm_before and getattr(hf, "_remove_final_layer_norm", False):
        raise CheckpointError("OPT with _remove_final_layer_norm is not supported")
    if hf.activation_function not in HIDDEN_ACTS:
        raise CheckpointError(f"unsupported activation_function {hf.activation_function!r}")
    return PretrainedConfig(
        architecture=ARCHITECTURE,
        dtype=config_dtype(hf, dtype),
        num_hidden_layers=hf.num_hidden_layers,
        num_attention_heads=hf.num_attention_heads,
        hidden_size=hf.hidden_size,
        intermediate_size=hf.ffn_dim,
        vocab_size=hf.vocab_size,
        position_embedding_type="learned_absolute",
        max_position_embeddings=hf.max_position_embeddings,
        hidden_act=HIDDEN_ACTS[hf.activation_function],
        norm_epsilon=_LAYER_NORM_EPS,
        mapping=mapping or Mapping(),
        share_embedding_table=bool(hf.tie_word_embeddings),
        attn_bias=bool(hf.enable_bias),
        mlp_bias=bool(hf.enable_bias),
        do_layer_norm_before=bool(hf.do_layer_norm_before),
    )


def _weights(get, has, config: PretrainedConfig):
    decoder = "model.decoder."
    yield "transformer.vocab_embedding.weight", get(decoder + "embed_tokens.weight")
    yield "transformer.position_embedding.weight", get(decoder + "embed_positions.weight")[_POSITION_OFFSET:]
    biases = ("weight", "bias") if config.attn_bias else ("weight",)
    for i in range(config.num_hidden_layers):
        hf, ours = f"{decoder}layers.{i}.", f"transformer.layers.{i}."
        for kind in ("weight", "bias"):
            yield ours + f"input_layernorm.{kind}", get(hf + f"self_attn_layer_norm.{kind}")
            yield ours + f"post_layernorm.{kind}", get(hf + f"final_layer_norm.{kind}")
        for kind in biases:
            yield ours + f"attention.qkv.{kind}", torch.cat([get(hf + f"self_attn.{p}_proj.{kind}") for p in "qkv"])
            yield ours + f"attention.dense.{kind}", get(hf + f"self_attn.out_proj.{kind}")
            yield ours + f"mlp.fc.{kind}", get(hf + f"fc1.{kind}")
            yield ours + f"mlp.proj.{kind}", get(hf + f"fc2.{kind}")
    if config.do_layer_norm_before:
        for kind in ("weight", "bias"):
            yield f"transformer.ln_f.{kind}", get(decoder + f"final_layer_norm.{kind}")
    if not config.share_embedding_table:
        yield "lm_head.weight", get("lm_head.weight")


def load_weights_from_hf(model_dir_or_model, config: PretrainedConfig,
                         mapping: Mapping | None = None):
    """One rank's weights (our names, config.dtype) from a Hugging Face folder or model."""
    return load_weights(model_dir_or_model, config, mapping, _weights)
