"""The GPT-family decoder: LayerNorm, biased linears and a plain MLP, one class for GPT-2,
OPT, Phi and Bloom. The config picks the variant:

- position_embedding_type: `learned_absolute` (a position table added to the token
  embeddings; GPT-2, OPT), `rope_gpt_neox` with `rotary_pct` < 1 (Phi's partial rotary) or
  `alibi` (Bloom; the slopes come from DecoderModelForCausalLM);
- embedding_layernorm: a LayerNorm over the embeddings (Bloom);
- parallel_attention: attention and MLP read the same normed input and both add to the
  residual (Phi);
- do_layer_norm_before False: each sub-block's norm follows its residual add, and there is
  no ln_f (OPT-350m style);
- lm_head_bias: Phi's lm_head.
"""
from __future__ import annotations

from ...errors import ConfigError
from ...layers import MLP, Attention, AttentionInputs, Embedding, LayerNorm
from ...layers.linear import ColumnLinear
from ...module import Module, ModuleList
from ..decoder import DecoderModelForCausalLM
from ..modeling_utils import PretrainedConfig


class GPTDecoderLayer(Module):

    def __init__(self, config: PretrainedConfig, layer_idx: int):
        super().__init__()
        c = config
        tp = c.mapping.tp_size
        self.parallel_attention = c.parallel_attention
        self.pre_norm = c.do_layer_norm_before
        self.input_layernorm = LayerNorm(c.hidden_size, c.norm_epsilon, dtype=c.dtype)
        self.attention = Attention(layer_idx, c.hidden_size, c.num_attention_heads,
                                   c.num_key_value_heads, c.head_size,
                                   bias=c.attn_bias, dense_bias=c.attn_bias,
                                   position_embedding_type=c.position_embedding_type,
                                   rotary_dim=c.rotary_dim, dtype=c.dtype, tp_size=tp)
        self.post_layernorm = (None if c.parallel_attention
                               else LayerNorm(c.hidden_size, c.norm_epsilon, dtype=c.dtype))
        self.mlp = MLP(c.hidden_size, c.intermediate_size, c.hidden_act, c.mlp_bias, c.dtype, tp)

    def forward(self, hidden, attn: AttentionInputs):
        if self.parallel_attention:
            normed = self.input_layernorm(hidden)
            return hidden + self.attention(normed, attn) + self.mlp(normed)
        if self.pre_norm:
            hidden = hidden + self.attention(self.input_layernorm(hidden), attn)
            return hidden + self.mlp(self.post_layernorm(hidden))
        hidden = self.input_layernorm(hidden + self.attention(hidden, attn))
        return self.post_layernorm(hidden + self.mlp(hidden))


class GPTModel(Module):

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        c = config
        if c.mapping.pp_size > 1:
            raise ConfigError(f"{c.architecture}: pipeline parallelism is supported for the LLaMA family "
                              f"only (pp_size must be 1, got {c.mapping.pp_size})")
        self.vocab_embedding = Embedding(c.vocab_size, c.hidden_size, c.dtype, c.mapping.tp_size,
                                         c.mapping.tp_rank)
        self.position_embedding = (Embedding(c.max_position_embeddings, c.hidden_size, c.dtype)
                                   if c.position_embedding_type == "learned_absolute" else None)
        self.ln_embed = (LayerNorm(c.hidden_size, c.norm_epsilon, dtype=c.dtype)
                         if c.embedding_layernorm else None)
        self.layers = ModuleList([GPTDecoderLayer(c, i) for i in range(c.num_hidden_layers)])
        self.ln_f = LayerNorm(c.hidden_size, c.norm_epsilon, dtype=c.dtype) if c.do_layer_norm_before else None

    def forward(self, input_ids, attn: AttentionInputs):
        hidden = self.vocab_embedding(input_ids)
        if self.position_embedding is not None:
            hidden = hidden + self.position_embedding(attn.position_ids)
        if self.ln_embed is not None:
            hidden = self.ln_embed(hidden)
        for layer in self.layers:
            hidden = layer(hidden, attn)
        return hidden


class GPTForCausalLM(DecoderModelForCausalLM):

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        self.transformer = GPTModel(config)
        if not config.share_embedding_table:
            self.lm_head = ColumnLinear(config.hidden_size, config.vocab_size_padded, config.lm_head_bias,
                                        config.dtype, config.mapping.tp_size)
