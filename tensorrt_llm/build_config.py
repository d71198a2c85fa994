"""`BuildConfig`: the limits and options an engine is built with (trtllm-build's flags).

It sits below the engine format, which records it, and the checks of engines from files
(engine_check.py), which refuse a malformed one.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import torch

from .errors import ConfigError


@dataclass
class BuildConfig:
    max_batch_size: int = 8
    max_input_len: int = 1024
    max_seq_len: Optional[int] = None  # default: max_input_len + 1024, capped by the model
    max_num_tokens: Optional[int] = None  # default: max_batch_size * max_input_len
    max_beam_width: int = 1
    kv_cache_type: str = "paged"
    tokens_per_block: int = 32
    # "auto": the GPU of the building machine if there is one, else "any" (runs anywhere).
    target_device: str = "auto"
    # Graph-rewriting passes to run; names are those of graph_rewriting.optimize().
    optimizations: list = field(default_factory=lambda: ["fuse_add_rms_norm", "fuse_gate_up",
                                                                   "fuse_rope_attention", "fuse_attention_fp8_linear",
                                                                   "fuse_gated_linear", "fuse_norm_linear",
                                                                   "fuse_act_linear", "fuse_fp8_gated_mlp"])

    def __post_init__(self):
        """Raises ConfigError (a ValueError) naming the first field out of range."""
        if self.kv_cache_type != "paged":
            raise ConfigError(f"kv_cache_type must be 'paged', got {self.kv_cache_type!r}")
        for name in ("max_batch_size", "max_input_len", "max_beam_width", "tokens_per_block",
                     "max_seq_len", "max_num_tokens"):
            value = getattr(self, name)
            if value is None and name in ("max_seq_len", "max_num_tokens"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"BuildConfig.{name} must be an integer >= 1, got {value!r}")
        if self.tokens_per_block & (self.tokens_per_block - 1):
            raise ConfigError(f"tokens_per_block must be a power of two, got {self.tokens_per_block}")

    def resolve(self, max_position_embeddings: int) -> "BuildConfig":
        """Fill the derived defaults against a model's limits; checks consistency."""
        cfg = dataclasses.replace(self)
        if cfg.max_seq_len is None:
            cfg.max_seq_len = min(cfg.max_input_len + 1024, max_position_embeddings)
        if cfg.max_seq_len > max_position_embeddings:
            raise ConfigError(f"max_seq_len {cfg.max_seq_len} exceeds the model's "
                              f"max_position_embeddings {max_position_embeddings}")
        if cfg.max_input_len > cfg.max_seq_len:
            raise ConfigError(f"max_input_len {cfg.max_input_len} exceeds max_seq_len {cfg.max_seq_len}")
        if cfg.max_num_tokens is None:
            cfg.max_num_tokens = cfg.max_batch_size * cfg.max_input_len
        if cfg.target_device == "auto":
            cfg.target_device = current_device_target() if torch.cuda.is_available() else "any"
        return cfg

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "BuildConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown BuildConfig fields: {sorted(unknown)}")
        return cls(**d)


def current_device_target() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"cuda:sm_{major}{minor}"
