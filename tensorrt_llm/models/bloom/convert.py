"""Bloom checkpoint converter: Hugging Face (BloomForCausalLM) -> our checkpoint.

Bloom's fused query_key_value rows are interleaved per head, [heads, 3 (q, k, v), head_dim];
they are regrouped into our q-then-k-then-v rows. Positions are ALiBi biases (no table), and
the embeddings go through a LayerNorm (`transformer.ln_embed`).
"""
from ...errors import CheckpointError
from ...mapping import Mapping
from ..convert_utils import config_dtype, hf_config, load_weights
from ..modeling_utils import PretrainedConfig

ARCHITECTURE = "BloomForCausalLM"

# Keys a Hugging Face config.json must give (a tuple: any one of these names); the
# converter does not take transformers' defaults for them.
HF_REQUIRED_KEYS = (("hidden_size", "n_embed"), ("n_layer", "num_hidden_layers"),
                    ("n_head", "num_attention_heads"), "vocab_size", "layer_norm_epsilon")

# ALiBi has no position table; Bloom was trained on 2048-token sequences.
_MAX_POSITIONS = 2048


def config_from_hf(hf_config_or_dir, dtype: str | None = None,
                   mapping: Mapping | None = None) -> PretrainedConfig:
    """Our config from a transformers BloomConfig or a Hugging Face model folder."""
    hf = hf_config(hf_config_or_dir, "bloom", HF_REQUIRED_KEYS)
    if hf.apply_residual_connection_post_layernorm:
        raise CheckpointError("Bloom with apply_residual_connection_post_layernorm is not supported")
    return PretrainedConfig(
        architecture=ARCHITECTURE,
        dtype=config_dtype(hf, dtype),
        num_hidden_layers=hf.n_layer,
        num_attention_heads=hf.n_head,
        hidden_size=hf.hidden_size,
        intermediate_size=4 * hf.hidden_size,
        vocab_size=hf.vocab_size,
        position_embedding_type="alibi",
        max_position_embeddings=getattr(hf, "seq_length", None) or _MAX_POSITIONS,
        hidden_act="gelu_tanh",  # BloomGelu is the tanh approximation
        norm_epsilon=hf.layer_norm_epsilon,
        mapping=mapping or Mapping(),
        share_embedding_table=bool(hf.tie_word_embeddings),
        attn_bias=True,
        mlp_bias=True,
        embedding_layernorm=True,
    )


def _deinterleave_qkv(t, num_heads: int):
    """[heads * 3 * D, ...] rows ordered (head, q/k/v, d) -> (q/k/v, head, d)."""
    return t.reshape(num_heads, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def _weights(get, has, config: PretrainedConfig):
    yield "transformer.vocab_embedding.weight", get("transformer.word_embeddings.weight")
    for kind in ("weight", "bias"):
        yield f"transformer.ln_embed.{kind}", get(f"transformer.word_embeddings_layernorm.{kind}")
    for i in range(config.num_hidden_layers):
        hf, ours = f"transformer.h.{i}.", f"transformer.layers.{i}."
        for kind in ("weight", "bias"):
            yield ours + f"input_layernorm.{kind}", get(hf + f"input_layernorm.{kind}")
            yield ours + f"attention.qkv.{kind}", _deinterleave_qkv(
                get(hf + f"self_attention.query_key_value.{kind}"), config.num_attention_heads)
            yield ours + f"attention.dense.{kind}", get(hf + f"self_attention.dense.{kind}")
            yield ours + f"post_layernorm.{kind}", get(hf + f"post_attention_layernorm.{kind}")
            yield ours + f"mlp.fc.{kind}", get(hf + f"mlp.dense_h_to_4h.{kind}")
            yield ours + f"mlp.proj.{kind}", get(hf + f"mlp.dense_4h_to_h.{kind}")
    for kind in ("weight", "bias"):
        yield f"transformer.ln_f.{kind}", get(f"transformer.ln_f.{kind}")
    if not config.share_embedding_table:
        yield "lm_head.weight", get("lm_head.weight")


def load_weights_from_hf(model_dir_or_model, config: PretrainedConfig,
                         mapping: Mapping | None = None):
    """One rank's weights (our names, config.dtype) from a Hugging Face folder or model."""
    return load_weights(model_dir_or_model, config, mapping, _weights)
