"""LLaMA-family checkpoint converters: Hugging Face or GGUF -> our checkpoint (config + rank weights).

Both sources are read through one getter keyed by Hugging Face tensor names, so the
tensor-parallel split (`_rank_weights`) is written once. Tensors are read, converted and
split one at a time: peak memory is the output weights plus a few source tensors.

Tensor-parallel layout of a rank's weights (see docs/architecture.md for the names):
- qkv: the rank's slice of q heads, then of kv heads, then of v heads, concatenated by rows;
- dense (o_proj) and mlp.proj (down_proj): split by columns, bias (if any) kept whole;
- mlp.gate / mlp.fc: split by rows;
- vocab_embedding and the norms: whole on every rank;
- lm_head: split by vocab rows. When tp_size does not divide vocab_size, the vocabulary is
  padded with zero rows to `config.vocab_size_padded`; a model must drop logits past
  `config.vocab_size`. Absent when `share_embedding_table`.
"""
import json
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from ..._utils import canonical_dtype
from ...errors import CheckpointError, ConfigError
from ...mapping import Mapping
from ..modeling_utils import MODEL_DTYPES, PretrainedConfig, check_safetensors_file, hf_config_from_dir

ARCHITECTURE = "LlamaForCausalLM"

# Keys a Hugging Face config.json must give: the model's shape, its context length and its
# norm epsilon (transformers' class defaults describe some other model).
HF_REQUIRED_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                    "vocab_size", "max_position_embeddings", "rms_norm_eps")

# Hugging Face hidden_act names -> ours.
_HIDDEN_ACTS = {"silu": "silu", "swish": "silu", "relu": "relu", "gelu": "gelu",
                "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


# ---------------------------------------------------------------------------- configs

def _rotary_scaling_from_hf(params: dict | None) -> dict | None:
    """A transformers rope_scaling / rope_parameters dict -> our rotary_scaling form."""
    if not params:
        return None
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type == "linear":
        return {"type": "linear", "factor": float(params["factor"])}
    if rope_type == "llama3":
        return {"type": "llama3", "factor": float(params["factor"]),
                "low_freq_factor": float(params["low_freq_factor"]),
                "high_freq_factor": float(params["high_freq_factor"]),
                "original_max_position_embeddings": int(params["original_max_position_embeddings"])}
    raise CheckpointError(f"unsupported rope scaling type {rope_type!r} (supported: linear, llama3)")


def _dtype_name(dtype) -> str | None:
    """A torch dtype or its name (transformers writes either) -> our dtype name."""
    if dtype is None:
        return None
    name = canonical_dtype(dtype)
    if name not in MODEL_DTYPES:
        raise CheckpointError(f"unsupported source dtype {dtype!r}")
    return name


def config_from_hf(hf_config_or_dir, dtype: str | None = None,
                   mapping: Mapping | None = None) -> PretrainedConfig:
    """Our config from a transformers LlamaConfig or a Hugging Face model folder.

    A folder's config.json must give HF_REQUIRED_KEYS (CheckpointError naming the missing
    ones). dtype None follows the source's recorded dtype, float32 where it records none.
    """
    hf = hf_config_or_dir
    if isinstance(hf, (str, Path)):
        hf = hf_config_from_dir(hf, "llama", HF_REQUIRED_KEYS)
    if hf.model_type != "llama":
        raise CheckpointError(f"unsupported architecture {getattr(hf, 'architectures', None)} "
                              f"(model_type {hf.model_type!r}); this converter handles model_type 'llama'")
    if hf.hidden_act not in _HIDDEN_ACTS:
        raise CheckpointError(f"unsupported hidden_act {hf.hidden_act!r}")
    # transformers >= 5 keeps rope_theta and the scaling in rope_parameters; older configs
    # have rope_theta and rope_scaling attributes.
    rope = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}
    rope_theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    source_dtype = getattr(hf, "dtype", None) or getattr(hf, "torch_dtype", None)
    return PretrainedConfig(
        architecture=ARCHITECTURE,
        dtype=dtype or _dtype_name(source_dtype) or "float32",
        num_hidden_layers=hf.num_hidden_layers,
        num_attention_heads=hf.num_attention_heads,
        num_key_value_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size,
        vocab_size=hf.vocab_size,
        position_embedding_type="rope_gpt_neox",
        max_position_embeddings=hf.max_position_embeddings,
        hidden_act=_HIDDEN_ACTS[hf.hidden_act],
        norm_epsilon=hf.rms_norm_eps,
        rotary_base=float(rope_theta),
        rotary_scaling=_rotary_scaling_from_hf(rope),
        rotary_pct=float(rope.get("partial_rotary_factor", 1.0)),
        head_size=getattr(hf, "head_dim", None),
        mapping=mapping or Mapping(),
        share_embedding_table=bool(getattr(hf, "tie_word_embeddings", False)),
        attn_bias=bool(getattr(hf, "attention_bias", False)),
        mlp_bias=bool(getattr(hf, "mlp_bias", False)),
    )


def open_gguf(path):
    """A gguf.GGUFReader (parsing the metadata takes seconds; pass it to both loaders).

    The file's size is checked against what its header describes before any tensor is read:
    a cut-off file is a CheckpointError "... is truncated: expected N bytes, file has M"; a
    file that is not GGUF at all is a CheckpointError too."""
    import gguf
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    size = path.stat().st_size

    class Reader(gguf.GGUFReader):

        def _get(self, offset, dtype, count=1, *args, **kwargs):
            # Every read of the header goes through here: one past the end of the file
            # means the file was cut inside its metadata.
            end = int(offset) + np.dtype(dtype).itemsize * int(count)
            if end > size:
                raise CheckpointError(f"{path} is truncated: expected at least {end} bytes, "
                                      f"file has {size}")
            return super()._get(offset, dtype, count, *args, **kwargs)

        def _build_tensors(self, start_offs, fields):
            expected = int(start_offs)
            for field in fields:
                _, _, _, dims, raw_dtype, offset_tensor = field.parts
                block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(raw_dtype[0])]
                n_bytes = int(np.prod(dims)) * type_size // block_size
                expected = max(expected, int(start_offs) + int(offset_tensor[0]) + n_bytes)
            if expected > size:
                raise CheckpointError(f"{path} is truncated: expected {expected} bytes, "
                                      f"file has {size}")
            super()._build_tensors(start_offs, fields)

    try:
        return Reader(str(path))
    except CheckpointError:
        raise
    except (ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError) as e:
        raise CheckpointError(f"{path} is not a readable GGUF file ({' '.join(str(e).split())})") from e


def _gguf_value(reader, key: str, default=None, kind: type = str):
    """The metadata value `key` as `kind` (str, a positive int, or a finite float); a value
    missing without a default, or of another type, is a CheckpointError naming the key."""
    field = reader.get_field(key)
    if field is None:
        if default is None:
            raise CheckpointError(f"GGUF metadata has no {key!r}")
        value = default  # derived from other values: checked like them
    else:
        try:
            value = field.contents()
        except (ValueError, IndexError, TypeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"GGUF metadata {key!r} is unreadable ({e})") from None
    if kind is int:
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 < value < 2**31
    elif kind is float:
        ok = isinstance(value, (int, float, np.number)) and np.isfinite(value)
    else:
        ok = isinstance(value, str)
    if not ok:
        want = {int: "a positive integer", float: "a finite number", str: "a string"}[kind]
        raise CheckpointError(f"GGUF metadata {key!r} must be {want}, got {str(value)[:60]!r}")
    return kind(value)


def _gguf_vocab_size(reader) -> int:
    field = reader.get_field("tokenizer.ggml.tokens")
    if field is None or not field.data:
        raise CheckpointError("GGUF metadata has no tokenizer.ggml.tokens (the vocabulary)")
    return len(field.data)


def config_from_gguf(path, dtype: str = "float32", mapping: Mapping | None = None,
                     reader=None) -> PretrainedConfig:
    """Our config from a llama.cpp GGUF file's metadata.

    The weights are dequantised to float32, so float32 keeps them exact; float16/bfloat16
    round them once more.
    """
    reader = reader or open_gguf(path)
    arch = _gguf_value(reader, "general.architecture")
    if arch != "llama":
        raise CheckpointError(f"unsupported GGUF architecture {arch!r}; this converter handles 'llama'")
    tensor_names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in tensor_names:
        # llama.cpp stores Llama-3.1 rope scaling as a table of per-frequency factors, not
        # the parameters our rotary_scaling needs.
        raise CheckpointError("GGUF rope_freqs (llama3 rope scaling) is not supported")
    scaling_type = _gguf_value(reader, "llama.rope.scaling.type", "none")
    if scaling_type == "none":
        rotary_scaling = None
    elif scaling_type == "linear":
        rotary_scaling = {"type": "linear",
                          "factor": _gguf_value(reader, "llama.rope.scaling.factor", kind=float)}
    else:
        raise CheckpointError(f"unsupported GGUF rope scaling type {scaling_type!r}")

    hidden = _gguf_value(reader, "llama.embedding_length", kind=int)
    heads = _gguf_value(reader, "llama.attention.head_count", kind=int)
    head_size = _gguf_value(reader, "llama.attention.key_length", hidden // heads, kind=int)
    rotary_dim = _gguf_value(reader, "llama.rope.dimension_count", head_size, kind=int)
    return PretrainedConfig(
        architecture=ARCHITECTURE,
        dtype=dtype,
        num_hidden_layers=_gguf_value(reader, "llama.block_count", kind=int),
        num_attention_heads=heads,
        num_key_value_heads=_gguf_value(reader, "llama.attention.head_count_kv", heads, kind=int),
        hidden_size=hidden,
        intermediate_size=_gguf_value(reader, "llama.feed_forward_length", kind=int),
        vocab_size=_gguf_vocab_size(reader),
        position_embedding_type="rope_gpt_neox",  # after undoing llama.cpp's Q/K permutation
        max_position_embeddings=_gguf_value(reader, "llama.context_length", kind=int),
        hidden_act="silu",
        norm_epsilon=_gguf_value(reader, "llama.attention.layer_norm_rms_epsilon", kind=float),
        rotary_base=_gguf_value(reader, "llama.rope.freq_base", 10000.0, kind=float),
        rotary_scaling=rotary_scaling,
        rotary_pct=rotary_dim / head_size,
        head_size=head_size,
        mapping=mapping or Mapping(),
        share_embedding_table="output.weight" not in tensor_names,
        attn_bias="blk.0.attn_q.bias" in tensor_names,
        mlp_bias="blk.0.ffn_gate.bias" in tensor_names,
    )


# ---------------------------------------------------------------------------- weights

# Returns the named tensor in Hugging Face row order; the caller owns it (no alias of a
# model's parameters), so converting it in place of copying is safe.
Getter = Callable[[str], torch.Tensor]


def _narrow(t: torch.Tensor, dim: int, tp_size: int, tp_rank: int) -> torch.Tensor:
    size = t.shape[dim] // tp_size
    return t.narrow(dim, tp_rank * size, size)


def _hf_shape(name: str, config: PretrainedConfig) -> tuple[int, ...]:
    """The shape a Hugging Face Llama tensor must have under `config` (sources may lie)."""
    hidden, inter, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    q, kv = config.num_attention_heads * config.head_size, config.num_key_value_heads * config.head_size
    module, kind = name.split(".")[-2:]
    if module in ("embed_tokens", "lm_head"):
        return (vocab, hidden)
    if module in ("input_layernorm", "post_attention_layernorm", "norm"):
        return (hidden,)
    rows, cols = {"q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden),
                  "o_proj": (hidden, q), "gate_proj": (inter, hidden), "up_proj": (inter, hidden),
                  "down_proj": (hidden, inter)}[module]
    return (rows, cols) if kind == "weight" else (rows,)


def _check_hf_shape(name: str, shape, config: PretrainedConfig) -> None:
    if tuple(shape) != _hf_shape(name, config):
        raise CheckpointError(f"{name} has shape {list(shape)}, the config implies {list(_hf_shape(name, config))}")


def _rank_weights(get: Getter, has: Callable[[str], bool], config: PretrainedConfig,
                  mapping: Mapping) -> dict[str, torch.Tensor]:
    """One rank's weights from a getter of Hugging Face-named tensors (HF row order)."""
    if mapping.pp_size != 1:
        raise ConfigError("pipeline-parallel checkpoints are not supported (pp_size must be 1)")
    if (mapping.world_size, mapping.tp_size) != (config.mapping.world_size, config.mapping.tp_size):
        raise ConfigError(f"mapping {mapping} does not match the config's {config.mapping}")
    tp, rank = mapping.tp_size, mapping.tp_rank

    def take(name: str, dim: int | None = None, rows: int | None = None) -> torch.Tensor:
        t = get(name)
        _check_hf_shape(name, t.shape, config)
        if rows is not None and rows > t.shape[0]:
            t = torch.nn.functional.pad(t, (0, 0, 0, rows - t.shape[0]))
        if dim is not None:
            t = _narrow(t, dim, tp, rank)
        t = t.to(config.torch_dtype)
        if t.untyped_storage().nbytes() > t.numel() * t.element_size():
            # a narrowed view would keep the whole source tensor alive
            t = t.clone(memory_format=torch.contiguous_format)
        return t

    out = {"transformer.vocab_embedding.weight": take("model.embed_tokens.weight")}
    layers = range(config.num_hidden_layers)
    for i in tqdm(layers, desc=f"converting rank {mapping.rank}", unit="layer", disable=None):
        hf, ours = f"model.layers.{i}.", f"transformer.layers.{i}."
        out[ours + "input_layernorm.weight"] = take(hf + "input_layernorm.weight")
        for kind in ("weight", "bias") if config.attn_bias else ("weight",):
            out[ours + f"attention.qkv.{kind}"] = torch.cat(
                [take(hf + f"self_attn.{p}_proj.{kind}", 0) for p in "qkv"])
        out[ours + "attention.dense.weight"] = take(hf + "self_attn.o_proj.weight", 1)
        if config.attn_bias:
            out[ours + "attention.dense.bias"] = take(hf + "self_attn.o_proj.bias")
        out[ours + "post_layernorm.weight"] = take(hf + "post_attention_layernorm.weight")
        for ours_name, hf_name in (("gate", "gate_proj"), ("fc", "up_proj")):
            out[ours + f"mlp.{ours_name}.weight"] = take(hf + f"mlp.{hf_name}.weight", 0)
            if config.mlp_bias:
                out[ours + f"mlp.{ours_name}.bias"] = take(hf + f"mlp.{hf_name}.bias", 0)
        out[ours + "mlp.proj.weight"] = take(hf + "mlp.down_proj.weight", 1)
        if config.mlp_bias:
            out[ours + "mlp.proj.bias"] = take(hf + "mlp.down_proj.bias")
    out["transformer.ln_f.weight"] = take("model.norm.weight")

    if not config.share_embedding_table:
        if not has("lm_head.weight"):
            raise CheckpointError("the source has no lm_head.weight but its config does not tie "
                                  "the embeddings")
        out["lm_head.weight"] = take("lm_head.weight", 0, rows=config.vocab_size_padded)
    return out


class _HFTensors:
    """Tensors of a Hugging Face model folder, read one at a time.

    safetensors files are opened per tensor, so no mapping of a whole (multi-GB) file stays
    resident while the converted weights accumulate.
    """

    def __init__(self, model_dir):
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise FileNotFoundError(f"Hugging Face model folder not found: {model_dir}")
        self._bin_cache: tuple[Path, dict] | None = None
        for index_name, single_name in (("model.safetensors.index.json", "model.safetensors"),
                                        ("pytorch_model.bin.index.json", "pytorch_model.bin")):
            index = model_dir / index_name
            if index.is_file():
                try:
                    weight_map = json.loads(index.read_text())["weight_map"]
                    self._files = {k: model_dir / v for k, v in weight_map.items()}
                except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
                    raise CheckpointError(f"{index} is not a weight index ({type(e).__name__}: "
                                          f"{e})") from e
                for path in set(self._files.values()):
                    if not path.is_file():
                        raise CheckpointError(f"{index} names {path.name}, which is not in {model_dir}")
                    self._check(path)
                return
            single = model_dir / single_name
            if single.is_file():
                self._check(single)
                self._files = {k: single for k in self._keys(single)}
                return
        raise FileNotFoundError(f"no model.safetensors[.index.json] or pytorch_model.bin"
                                f"[.index.json] in {model_dir}")

    @staticmethod
    def _check(path: Path) -> None:
        """A truncated safetensors file is refused before any tensor is read."""
        if path.suffix == ".safetensors":
            check_safetensors_file(path)

    @staticmethod
    def _keys(path: Path) -> list[str]:
        if path.suffix == ".safetensors":
            from safetensors import safe_open
            with safe_open(path, framework="pt") as f:
                return list(f.keys())
        return list(_load_bin(path))

    def has(self, name: str) -> bool:
        return name in self._files

    def get(self, name: str) -> torch.Tensor:
        if name not in self._files:
            raise CheckpointError(f"tensor {name!r} not in the Hugging Face checkpoint")
        path = self._files[name]
        if path.suffix == ".safetensors":
            from safetensors import safe_open
            with safe_open(path, framework="pt") as f:
                return f.get_tensor(name)
        # .bin shards are pickles: load (memory-mapped) once per shard, keep the current one.
        if self._bin_cache is None or self._bin_cache[0] != path:
            self._bin_cache = (path, _load_bin(path))
        if name not in self._bin_cache[1]:
            raise CheckpointError(f"tensor {name!r} is not in {path}, though the index names it")
        return self._bin_cache[1][name].clone()  # not a view of the file mapping


def _load_bin(path: Path) -> dict:
    """A pytorch_model.bin shard, memory-mapped; no pickled code runs."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # UnpicklingError for anything but tensors; RuntimeError for a damaged zip
        raise CheckpointError(f"{path} is not a readable tensor file: {' '.join(str(e).split())}") from e


def load_weights_from_hf(model_dir_or_model, config: PretrainedConfig,
                         mapping: Mapping | None = None) -> dict[str, torch.Tensor]:
    """One rank's weights (our names, config.dtype) from a Hugging Face folder or a
    transformers model object. mapping defaults to config.mapping (its rank)."""
    mapping = mapping or config.mapping
    if isinstance(model_dir_or_model, (str, Path)):
        source = _HFTensors(model_dir_or_model)
        return _rank_weights(source.get, source.has, config, mapping)
    state = model_dir_or_model.state_dict()
    return _rank_weights(lambda name: state[name].clone(), state.__contains__, config, mapping)


def _unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undoes llama.cpp's Q/K permutation, back to Hugging Face's rotate-halves row order.

    llama.cpp stores each head's rows interleaved as pairs (x0, x_{d/2}), (x1, x_{d/2+1}), ...
    for GPT-J-style rotation: rows viewed [head, d/2, 2] in the file are [head, 2, d/2] in HF.
    """
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf_name: str) -> str:
    """Hugging Face tensor name -> llama.cpp's."""
    fixed = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf_name in fixed:
        return fixed[hf_name]
    layer, rest = hf_name.removeprefix("model.layers.").split(".", 1)
    module, kind = rest.rsplit(".", 1)
    module = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
              "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}[module]
    return f"blk.{layer}.{module}.{kind}"


def load_weights_from_gguf(path, config: PretrainedConfig, mapping: Mapping | None = None,
                           reader=None) -> dict[str, torch.Tensor]:
    """One rank's weights (our names, config.dtype) from a llama.cpp GGUF file, dequantised."""
    import gguf
    mapping = mapping or config.mapping
    reader = reader or open_gguf(path)
    tensors = {t.name: t for t in reader.tensors}

    def get(hf_name: str) -> torch.Tensor:
        if _gguf_name(hf_name) not in tensors:
            raise CheckpointError(f"{path} has no tensor {_gguf_name(hf_name)!r} "
                                  f"({hf_name} in Hugging Face names)")
        t = tensors[_gguf_name(hf_name)]
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
            w = w.reshape(tuple(reversed(t.shape.tolist())))  # GGUF lists dims innermost first
        except (ValueError, TypeError, NotImplementedError, KeyError, IndexError) as e:
            raise CheckpointError(f"{path}: tensor {t.name!r} is unreadable ({' '.join(str(e).split())[:200]})") \
                from None
        _check_hf_shape(hf_name, w.shape, config)  # before the row permutation reads it by heads
        if ".self_attn.q_proj." in hf_name:
            w = _unpermute_rotary_rows(w, config.num_attention_heads)
        elif ".self_attn.k_proj." in hf_name:
            w = _unpermute_rotary_rows(w, config.num_key_value_heads)
        # F32 tensors are read-only views of the file: copy those (only)
        return torch.from_numpy(np.require(w, np.float32, ["C_CONTIGUOUS", "WRITEABLE"]))

    return _rank_weights(get, lambda hf_name: _gguf_name(hf_name) in tensors, config, mapping)
