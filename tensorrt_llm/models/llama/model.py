"""LLaMA: RMSNorm, rotary attention with grouped-query heads, SiLU-gated MLP."""
from __future__ import annotations

from ...layers import Attention, AttentionInputs, Embedding, GatedMLP, RmsNorm
from ...layers.linear import ColumnLinear, Linear
from ...module import Module, ModuleList
from ..decoder import DecoderModelForCausalLM
from ..modeling_utils import PretrainedConfig


class LLaMADecoderLayer(Module):

    def __init__(self, config: PretrainedConfig, layer_idx: int):
        super().__init__()
        c = config
        tp = c.mapping.tp_size
        self.input_layernorm = RmsNorm(c.hidden_size, c.norm_epsilon, c.dtype)
        self.attention = Attention(layer_idx, c.hidden_size, c.num_attention_heads,
                                   c.num_key_value_heads, c.head_size,
                                   bias=c.attn_bias, dense_bias=c.attn_bias,
                                   position_embedding_type=c.position_embedding_type,
                                   rotary_dim=c.rotary_dim, dtype=c.dtype, tp_size=tp)
        self.post_layernorm = RmsNorm(c.hidden_size, c.norm_epsilon, c.dtype)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size, c.hidden_act, c.mlp_bias, c.dtype, tp)

    def forward(self, hidden, attn: AttentionInputs):
        hidden = hidden + self.attention(self.input_layernorm(hidden), attn)
        return hidden + self.mlp(self.post_layernorm(hidden))


class LLaMAModel(Module):
    """The decoder layers of this rank's pipeline stage (numbered from 0 in its KV cache and
    weight names), with the token embedding on the first stage (and on the last when the LM
    head reads it) and ln_f on the last."""

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        m = config.mapping
        first, last = m.is_first_pp_rank(), m.is_last_pp_rank()
        self.vocab_embedding = (Embedding(config.vocab_size, config.hidden_size, config.dtype, m.tp_size,
                                          m.tp_rank)
                                if first or (last and config.share_embedding_table) else None)
        self.layers = ModuleList([LLaMADecoderLayer(config, i)
                                  for i in range(len(m.pp_layers(config.num_hidden_layers)))])
        self.ln_f = RmsNorm(config.hidden_size, config.norm_epsilon, config.dtype) if last else None

    def forward(self, input_ids, attn: AttentionInputs, hidden=None):
        """`hidden`: the previous pipeline stage's output (None on the first stage)."""
        if hidden is None:
            hidden = self.vocab_embedding(input_ids)
        for layer in self.layers:
            hidden = layer(hidden, attn)
        return hidden


class LLaMAForCausalLM(DecoderModelForCausalLM):

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        self.transformer = LLaMAModel(config)
        if not config.share_embedding_table and config.mapping.is_last_pp_rank():
            self.lm_head = ColumnLinear(config.hidden_size, config.vocab_size_padded, False,
                                        config.dtype, config.mapping.tp_size)
        quantize_linears(self, config)


def quantize_linears(model, config: PretrainedConfig) -> None:
    """Make each linear the checkpoint's `quantization` section quantizes (attention qkv and
    dense, mlp gate / fc / proj, lm_head; exclude_modules and MIXED_PRECISION per module name)
    weight-only INT8 / INT4, or FP8 (W8A8). A tied LM head (share_embedding_table) reads the
    float embedding. With a kv_cache_quant_algo, each attention layer gets its KV cache scales."""
    qc = config.quant_config
    for name, module in list(model.named_modules()):
        if isinstance(module, Linear) and (layer := qc.layer(name)) is not None:
            module.quantize_weight(layer)
        elif isinstance(module, Attention) and qc.quantizes_kv_cache:
            module.quantize_kv_cache()
