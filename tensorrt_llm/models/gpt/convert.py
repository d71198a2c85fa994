"""GPT-2 checkpoint converter: Hugging Face (GPT2LMHeadModel) -> our checkpoint.

GPT-2's linears are `Conv1D`s, whose weights are stored [in, out]: transposed here to our
[out, in]. c_attn's output columns are q, then k, then v, as our qkv rows are.
"""
from ...errors import CheckpointError
from ...mapping import Mapping
from ..convert_utils import HIDDEN_ACTS, config_dtype, hf_config, load_weights
from ..modeling_utils import PretrainedConfig

ARCHITECTURE = "GPTForCausalLM"

# Keys a Hugging Face config.json must give (a tuple: any one of these names); the
# converter does not take transformers' defaults for them.
HF_REQUIRED_KEYS = (("n_embd", "hidden_size"), ("n_layer", "num_hidden_layers"),
                    ("n_head", "num_attention_heads"), "vocab_size",
                    ("n_positions", "max_position_embeddings"), "layer_norm_epsilon")


def config_from_hf(hf_config_or_dir, dtype: str | None = None,
                   mapping: Mapping | None = None) -> PretrainedConfig:
    """Our config from a transformers GPT2Config or a Hugging Face model folder."""
    hf = hf_config(hf_config_or_dir, "gpt2", HF_REQUIRED_KEYS)
    if hf.scale_attn_by_inverse_layer_idx or not hf.scale_attn_weights or hf.add_cross_attention:
        raise CheckpointError("GPT-2 variants with scale_attn_by_inverse_layer_idx, without "
                              "scale_attn_weights or with cross-attention are not supported")
    if hf.activation_function not in HIDDEN_ACTS:
        raise CheckpointError(f"unsupported activation_function {hf.activation_function!r}")
    return PretrainedConfig(
        architecture=ARCHITECTURE,
        dtype=config_dtype(hf, dtype),
        num_hidden_layers=hf.n_layer,
        num_attention_heads=hf.n_head,
        hidden_size=hf.n_embd,
        intermediate_size=hf.n_inner or 4 * hf.n_embd,
        vocab_size=hf.vocab_size,
        position_embedding_type="learned_absolute",
        max_position_embeddings=hf.n_positions,
        hidden_act=HIDDEN_ACTS[hf.activation_function],
        norm_epsilon=hf.layer_norm_epsilon,
        mapping=mapping or Mapping(),
        share_embedding_table=bool(hf.tie_word_embeddings),
        attn_bias=True,
        mlp_bias=True,
    )


def _weights(get, has, config: PretrainedConfig):
    yield "transformer.vocab_embedding.weight", get("transformer.wte.weight")
    yield "transformer.position_embedding.weight", get("transformer.wpe.weight")
    for i in range(config.num_hidden_layers):
        hf, ours = f"transformer.h.{i}.", f"transformer.layers.{i}."
        for hf_name, our_name in (("ln_1", "input_layernorm"), ("attn.c_attn", "attention.qkv"),
                                  ("attn.c_proj", "attention.dense"), ("ln_2", "post_layernorm"),
                                  ("mlp.c_fc", "mlp.fc"), ("mlp.c_proj", "mlp.proj")):
            weight = get(hf + hf_name + ".weight")
            yield ours + our_name + ".weight", weight if hf_name.startswith("ln_") else weight.t()
            yield ours + our_name + ".bias", get(hf + hf_name + ".bias")
    yield "transformer.ln_f.weight", get("transformer.ln_f.weight")
    yield "transformer.ln_f.bias", get("transformer.ln_f.bias")
    if not config.share_embedding_table:
        yield "lm_head.weight", get("lm_head.weight")


def load_weights_from_hf(model_dir_or_model, config: PretrainedConfig,
                         mapping: Mapping | None = None):
    """One rank's weights (our names, config.dtype) from a Hugging Face folder or model."""
    return load_weights(model_dir_or_model, config, mapping, _weights)
