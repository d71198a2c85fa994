"""Self-attention over the paged KV cache: fused QKV projection, RoPE, gpt_attention, dense."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .. import functional as F
from ..functional import Tensor
from ..module import Module
from ..parameter import Parameter
from .linear import ColumnLinear, RowLinear


@dataclass
class AttentionInputs:
    """The runtime inputs every attention layer of a network shares."""
    position_ids: Tensor
    kv_cache_pool: Tensor
    block_tables: Tensor
    sequence_lengths: Tensor
    context_lengths: Tensor
    host_context_lengths: Tensor
    host_sequence_lengths: Optional[Tensor] = None
    rotary_cos_sin: Optional[Tensor] = None  # [max_positions, rotary_dim] table
    alibi_slopes: Optional[Tensor] = None


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi head slopes, float32 [num_heads] (Press et al.; Bloom's values).

    For the largest power of two n <= num_heads, head h (1-based) gets 2^(-8h/n); further
    heads take the odd-numbered slopes of the 2n-head sequence, 2^(-4h'/n) for h' = 1, 3, ...
    """
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]
    slopes += [2.0 ** (-4.0 * h / n) for h in range(1, 2 * (num_heads - n), 2)]
    return torch.tensor(slopes, dtype=torch.float32)


class Attention(Module):

    def __init__(self, layer_idx: int, hidden_size: int, num_attention_heads: int,
                 num_kv_heads: int, head_size: int, bias: bool = False,
                 dense_bias: bool = False, position_embedding_type: str = "rope_gpt_neox",
                 rotary_dim: int = 0, sliding_window: Optional[int] = None,
                 dtype: str = "float32", tp_size: int = 1):
        super().__init__()
        # KV heads split across ranks, or, when tp_size exceeds them, each replicated on
        # tp_size / num_kv_heads ranks (one per rank).
        if num_attention_heads % tp_size or (num_kv_heads % tp_size and tp_size % num_kv_heads):
            raise ValueError(f"{num_attention_heads} heads / {num_kv_heads} KV heads are not divisible "
                             f"by tp_size {tp_size}")
        self.layer_idx = layer_idx
        self.num_heads = num_attention_heads // tp_size
        self.num_kv_heads = max(1, num_kv_heads // tp_size)
        self.head_size = head_size
        self.position_embedding_type = position_embedding_type
        self.rotary_dim = rotary_dim or head_size
        self.sliding_window = sliding_window
        q, kv = num_attention_heads * head_size, self.num_kv_heads * tp_size * head_size
        self.qkv = ColumnLinear(hidden_size, q + 2 * kv, bias, dtype, tp_size)
        self.dense = RowLinear(q, hidden_size, dense_bias, dtype, tp_size)
        self.kv_cache_scale = None  # float32 [2] (K, V) once quantize_kv_cache made the cache 1-byte codes

    def quantize_kv_cache(self) -> None:
        """The KV cache holds INT8 / FP8 codes (quantization/formats.py): this layer's K and V
        scales become a weight, `kv_cache_scale`."""
        self.kv_cache_scale = Parameter(shape=(2,), dtype="float32")

    def forward(self, hidden: Tensor, inputs: AttentionInputs) -> Tensor:
        qkv = self.qkv(hidden)
        q_size, kv_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        q, k, v = F.split(qkv, [q_size, kv_size, kv_size], dim=-1)
        if self.position_embedding_type in ("rope_gpt_neox", "rope_gptj"):
            is_neox = self.position_embedding_type == "rope_gpt_neox"
            q = F.rotary_embedding(q, inputs.position_ids, inputs.rotary_cos_sin, num_heads=self.num_heads,
                                   head_dim=self.head_size, rotary_dim=self.rotary_dim, is_neox=is_neox)
            k = F.rotary_embedding(k, inputs.position_ids, inputs.rotary_cos_sin,
                                   num_heads=self.num_kv_heads, head_dim=self.head_size,
                                   rotary_dim=self.rotary_dim, is_neox=is_neox)
        context = F.gpt_attention(q, k, v, inputs.kv_cache_pool, inputs.block_tables,
                                  inputs.sequence_lengths, inputs.context_lengths,
                                  inputs.host_context_lengths, inputs.alibi_slopes,
                                  host_sequence_lengths=inputs.host_sequence_lengths,
                                  layer_idx=self.layer_idx, num_heads=self.num_heads,
                                  num_kv_heads=self.num_kv_heads, head_dim=self.head_size,
                                  tokens_per_block=inputs.kv_cache_pool.shape[4],
                                  sliding_window=self.sliding_window,
                                  kv_cache_scale=None if self.kv_cache_scale is None else self.kv_cache_scale.tensor)
        return self.dense(context)
