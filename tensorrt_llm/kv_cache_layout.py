"""The layout of an engine's paged KV-cache pool, and how many blocks a budget holds.

The pool holds the model's dtype, or 1-byte codes (int8, or FP8 E4M3 bytes as uint8) when the
config's quantization.kv_cache_quant_algo is INT8 / FP8 (quantization/formats.py): a byte per
element, so twice (bfloat16) the blocks fit in the same memory.

The engine format (engine_check: the graph must agree with the pool it will index), the
build command (the pool must fit) and the runtime (it allocates the pool) all size blocks
the same way, from here. The pool itself and its bookkeeping are runtime/kv_cache_manager.py.
"""
from dataclasses import dataclass
from typing import Optional

import torch

from ._utils import str_dtype_to_torch
from .mapping import Mapping
from .quantization.formats import kv_cache_dtype_name


def as_torch_dtype(dtype) -> torch.dtype:
    """A dtype given by name or as a torch.dtype, as a torch.dtype."""
    return str_dtype_to_torch(dtype) if isinstance(dtype, str) else dtype


def bytes_per_block(num_layers: int, num_kv_heads: int, head_dim: int, tokens_per_block: int,
                    dtype) -> int:
    """Bytes one block index takes in the pool, over all layers and both K and V."""
    element_size = torch.empty((), dtype=as_torch_dtype(dtype)).element_size()
    return num_layers * 2 * num_kv_heads * tokens_per_block * head_dim * element_size


def blocks_for_tokens_of(max_sequences: int, max_seq_len: int, tokens_per_block: int) -> int:
    """The most blocks an engine can use at once: `max_sequences` sequences (every beam of
    every request) of `max_seq_len` tokens, each rounded up to whole blocks."""
    return max_sequences * blocks_for_tokens(max_seq_len, tokens_per_block)


@dataclass(frozen=True)
class KVCacheLayout:
    """The per-block layout of an engine's pool, from its model config: the one place that
    says how many layers, KV heads, head dims and bytes a block has (ModelRunner sizes the
    pool with it, trtllm-build checks that the pool fits, the engine loader checks the graph
    against it)."""
    num_layers: int
    num_kv_heads: int
    head_dim: int
    tokens_per_block: int
    dtype_name: str

    @classmethod
    def of_engine(cls, pretrained_config: dict, tokens_per_block: int,
                  rank: Optional[int] = None) -> "KVCacheLayout":
        """The pool of `rank` (its pipeline stage caches its own layers only: the mapping's
        pp_layers); rank None: of the stage with the most layers (the largest pool any rank
        allocates)."""
        cfg = pretrained_config
        mapping = Mapping.from_dict(dict(cfg["mapping"], rank=0))
        counts = mapping.stage_layer_counts(cfg["num_hidden_layers"])
        num_layers = max(counts) if rank is None else counts[mapping.with_rank(rank).pp_rank]
        return cls(num_layers=num_layers,
                   num_kv_heads=max(1, cfg["num_key_value_heads"] // cfg["mapping"]["tp_size"]),
                   head_dim=cfg.get("head_size") or cfg["hidden_size"] // cfg["num_attention_heads"],
                   tokens_per_block=tokens_per_block,
                   dtype_name=kv_cache_dtype_name(cfg["dtype"], (cfg.get("quantization") or {}).get(
                       "kv_cache_quant_algo")))

    @property
    def dtype(self) -> torch.dtype:
        return str_dtype_to_torch(self.dtype_name)

    @property
    def bytes_per_block(self) -> int:
        return bytes_per_block(self.num_layers, self.num_kv_heads, self.head_dim, self.tokens_per_block,
                               self.dtype)

    def max_pool_bytes(self, max_sequences: int, max_seq_len: int) -> int:
        """Bytes of the pool when it holds all an engine can use at once (see
        `blocks_for_tokens_of`): what the runtime allocates unless memory or
        `max_tokens_in_paged_kv_cache` bound it."""
        return blocks_for_tokens_of(max_sequences, max_seq_len, self.tokens_per_block) * self.bytes_per_block


def blocks_for_memory(free_bytes: int, fraction: float, num_layers: int, num_kv_heads: int,
                      head_dim: int, tokens_per_block: int, dtype) -> int:
    """How many blocks fit in `fraction` of `free_bytes`."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"kv_cache_free_gpu_mem_fraction must be in (0, 1], got {fraction}")
    per_block = bytes_per_block(num_layers, num_kv_heads, head_dim, tokens_per_block, dtype)
    return int(free_bytes * fraction) // per_block


def blocks_for_tokens(max_tokens: int, tokens_per_block: int) -> int:
    """How many blocks hold `max_tokens` tokens (rounded up to whole blocks)."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens_in_paged_kv_cache must be positive, got {max_tokens}")
    return -(-max_tokens // tokens_per_block)
