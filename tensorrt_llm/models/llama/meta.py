"""Meta's own LLaMA checkpoints -> our checkpoint: `params.json` + `consolidated.NN.pth`.

The shards are read with `torch.load(weights_only=True, mmap=True)`: no pickled code runs
and a shard is mapped, not copied into memory. Each shard holds one model-parallel slice:
column-parallel weights (wq, wk, wv, w1, w3, output) are split by rows, row-parallel ones
(wo, w2) by columns, the norms are whole on every shard, and tok_embeddings is split by
columns (LLaMA 1/2's ParallelEmbedding) or by rows (LLaMA 3's VocabParallelEmbedding),
told apart by shape. Tensors are joined and renamed to Hugging Face names, with Q/K rows
moved from Meta's interleaved rotary order to Hugging Face's rotate-halves order, and then
go through the same tensor-parallel split as the other sources (`convert._rank_weights`).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..._utils import canonical_dtype
from ...errors import CheckpointError
from ...mapping import Mapping
from ..modeling_utils import PretrainedConfig
from .convert import ARCHITECTURE, _rank_weights, _unpermute_rotary_rows

# Meta module name -> the dim its shards are joined along (None: whole on every shard).
_SPLIT_DIM = {"attention.wq": 0, "attention.wk": 0, "attention.wv": 0, "attention.wo": 1,
              "feed_forward.w1": 0, "feed_forward.w3": 0, "feed_forward.w2": 1,
              "attention_norm": None, "ffn_norm": None, "norm": None, "output": 0}

# Hugging Face module name (in a layer) -> Meta's.
_LAYER_NAMES = {"input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm",
                "self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
                "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo",
                "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
                "mlp.down_proj": "feed_forward.w2"}

# params.json keys the converter needs (the others have Meta's defaults).
_REQUIRED_PARAMS = ("dim", "n_layers", "n_heads")

# Buffers some Meta checkpoints carry that are derived from params.json.
_IGNORED = {"rope.freqs"}


def _meta_name(hf_name: str) -> str:
    fixed = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
             "lm_head.weight": "output.weight"}
    if hf_name in fixed:
        return fixed[hf_name]
    layer, rest = hf_name.removeprefix("model.layers.").split(".", 1)
    module, kind = rest.rsplit(".", 1)
    return f"layers.{layer}.{_LAYER_NAMES[module]}.{kind}"


def ffn_hidden_dim(dim: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """The feed-forward width Meta's model code derives from params.json."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def _load_shard(path: Path) -> dict[str, torch.Tensor]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # UnpicklingError for anything but tensors; RuntimeError for a damaged zip
        raise CheckpointError(f"{path} is not a plain tensor file: {e}") from e


class MetaCheckpoint:
    """A Meta checkpoint folder, opened once for both the config and the weights."""

    def __init__(self, meta_dir):
        meta_dir = Path(meta_dir)
        params_path = meta_dir / "params.json"
        if not params_path.is_file():
            raise FileNotFoundError(f"no params.json in Meta checkpoint folder {meta_dir}")
        try:
            self.params = json.loads(params_path.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{params_path} is not valid JSON ({e})") from e
        if not isinstance(self.params, dict):
            raise CheckpointError(f"{params_path} is not a Meta params file (not a JSON object)")
        missing = [k for k in _REQUIRED_PARAMS if k not in self.params]
        if missing:
            raise CheckpointError(f"{params_path} has no {', '.join(missing)}: the converter needs "
                                  f"{'them' if len(missing) > 1 else 'it'} and does not guess defaults")
        paths = sorted(meta_dir.glob("consolidated.*.pth"), key=lambda p: int(p.suffixes[0][1:]))
        if not paths:
            raise FileNotFoundError(f"no consolidated.NN.pth shards in {meta_dir}")
        if [int(p.suffixes[0][1:]) for p in paths] != list(range(len(paths))):
            raise CheckpointError(f"Meta shards of {meta_dir} are not numbered 00..{len(paths) - 1:02d}: "
                                  f"{[p.name for p in paths]}")
        self.shards = [_load_shard(p) for p in paths]
        keys = set(self.shards[0]) - _IGNORED
        for path, shard in zip(paths[1:], self.shards[1:]):
            if set(shard) - _IGNORED != keys:
                raise CheckpointError(f"{path.name} holds other tensors than {paths[0].name}")
        self.keys = keys
        for name in ("tok_embeddings.weight", "layers.0.feed_forward.w1.weight"):
            if name not in keys:
                raise CheckpointError(f"{paths[0]} has no tensor {name!r}: not a Meta LLaMA checkpoint")

    def _joined(self, name: str) -> torch.Tensor:
        """One Meta tensor, its shards joined; a new tensor, never a view of a mapped file."""
        parts = [shard[name] for shard in self.shards]
        if len(parts) == 1 or parts[0].dim() == 1:
            return parts[0].clone()
        if name == "tok_embeddings.weight":
            # Rows of the whole vocabulary on each shard: the hidden dim was split.
            dim = 1 if parts[0].shape[0] == self.vocab_size else 0
        else:
            module = name.rsplit(".", 1)[0]
            dim = _SPLIT_DIM[module.split(".", 2)[2] if module.startswith("layers.") else module]
        return torch.cat(parts, dim=dim)

    @property
    def vocab_size(self) -> int:
        # LLaMA 1/2 write vocab_size -1 (the tokenizer decides): the output rows tell.
        if self.params.get("vocab_size", -1) > 0:
            return int(self.params["vocab_size"])
        if "output.weight" not in self.keys:
            raise CheckpointError("params.json gives no vocab_size and the checkpoint has no "
                                  "output.weight to tell it")
        return sum(shard["output.weight"].shape[0] for shard in self.shards)

    def config(self, dtype: str | None = None, mapping: Mapping | None = None) -> PretrainedConfig:
        """Our config from params.json; dtype None keeps the shards' dtype."""
        p = self.params
        dim, heads = p["dim"], p["n_heads"]
        kv_heads = p.get("n_kv_heads") or heads
        ffn = ffn_hidden_dim(dim, p.get("multiple_of", 256), p.get("ffn_dim_multiplier"))
        w1_rows = sum(shard["layers.0.feed_forward.w1.weight"].shape[0] for shard in self.shards)
        if w1_rows != ffn:
            raise CheckpointError(f"params.json gives a feed-forward width of {ffn} (dim {dim}, multiple_of "
                                  f"{p.get('multiple_of')}, ffn_dim_multiplier {p.get('ffn_dim_multiplier')}) "
                                  f"but layers.0.feed_forward.w1 has {w1_rows} rows")
        rope_theta = float(p.get("rope_theta", 10000.0))
        scaling = None
        if p.get("use_scaled_rope"):
            # Meta's apply_scaling constants (factor and high_freq_factor may be given).
            scaling = {"type": "llama3", "factor": float(p.get("rope_scaling_factor", 8.0)),
                       "low_freq_factor": 1.0, "high_freq_factor": float(p.get("rope_high_freq_factor", 4.0)),
                       "original_max_position_embeddings": 8192}
        # params.json rarely records the context length: use the family's (3.1+, 3, 2).
        max_positions = p.get("max_seq_len") or (131072 if scaling else 8192 if rope_theta >= 500000 else 4096)
        source_dtype = canonical_dtype(self.shards[0]["tok_embeddings.weight"].dtype)
        config = PretrainedConfig(
            architecture=ARCHITECTURE,
            dtype=dtype or source_dtype,
            num_hidden_layers=p["n_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            hidden_size=dim,
            intermediate_size=ffn,
            vocab_size=self.vocab_size,
            position_embedding_type="rope_gpt_neox",  # after undoing Meta's Q/K interleaving
            max_position_embeddings=max_positions,
            hidden_act="silu",
            norm_epsilon=float(p.get("norm_eps", 1e-5)),
            rotary_base=rope_theta,
            rotary_scaling=scaling,
            mapping=mapping or Mapping(),
            share_embedding_table="output.weight" not in self.keys,
        )
        expected = {_meta_name(n) for n in self._hf_names(config)}
        if self.keys != expected:
            raise CheckpointError(f"unexpected Meta tensors {sorted(self.keys - expected)}, "
                                  f"missing {sorted(expected - self.keys)}")
        return config

    @staticmethod
    def _hf_names(config: PretrainedConfig) -> list[str]:
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        if not config.share_embedding_table:
            names.append("lm_head.weight")
        for i in range(config.num_hidden_layers):
            names += [f"model.layers.{i}.{module}.weight" for module in _LAYER_NAMES]
        return names

    def rank_weights(self, config: PretrainedConfig, mapping: Mapping | None = None) -> dict[str, torch.Tensor]:
        """One rank's weights (our names, config.dtype)."""

        def get(hf_name: str) -> torch.Tensor:
            t = self._joined(_meta_name(hf_name))
            if ".self_attn.q_proj." in hf_name:
                t = _unpermute_rotary_rows(t, config.num_attention_heads)
            elif ".self_attn.k_proj." in hf_name:
                t = _unpermute_rotary_rows(t, config.num_key_value_heads)
            return t.contiguous()

        return _rank_weights(get, lambda hf_name: _meta_name(hf_name) in self.keys, config,
                             mapping or config.mapping)
