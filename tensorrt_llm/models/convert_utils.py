"""What every model's checkpoint converter shares: the config helpers, the Hugging Face folder
reader, and the one tensor-parallel split, by our weight names.

A converter (models/<family>/convert.py) reads its source through a getter of tensors by
their Hugging Face names and yields each of our weights whole, in our layout
(docs/architecture.md, "Checkpoint weight names"); `rank_weights` cuts each for one
tensor-parallel rank by its name (`shard`):
- attention.qkv: the q, k and v row blocks, each split by rows;
- attention.dense.weight, mlp.proj.weight: split by columns (their biases whole);
- mlp.gate, mlp.fc: split by rows;
- lm_head: rows padded with zeros to `config.vocab_size_padded`, then split by rows (a model
  drops the logits past `config.vocab_size`);
- everything else (embeddings, norms): whole on every rank.
Tensors are read, converted and split one at a time: peak memory is the output weights plus
a few source tensors.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import torch
from tqdm import tqdm

from .._utils import canonical_dtype
from ..errors import CheckpointError, ConfigError
from ..mapping import Mapping
from .modeling_utils import MODEL_DTYPES, PretrainedConfig, check_safetensors_file, hf_config_from_dir

# A source tensor by its Hugging Face name, in Hugging Face row order; the caller owns it (no
# alias of a model's parameters).
Getter = Callable[[str], torch.Tensor]
Has = Callable[[str], bool]
# (get, has, config) -> (our name, whole tensor in our layout) pairs: a converter's weights.
WeightSource = Callable[[Getter, Has, PretrainedConfig], Iterator[tuple[str, torch.Tensor]]]

# Hugging Face hidden_act / activation_function names -> ours.
HIDDEN_ACTS = {"silu": "silu", "swish": "silu", "relu": "relu", "gelu": "gelu",
               "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


# ---------------------------------------------------------------------------- configs

def hf_config(hf_config_or_dir, model_type: str, required=()):
    """A transformers config of `model_type`, given as one or as a model folder. A folder's
    config.json must give every key of `required` (see modeling_utils.hf_config_from_dir)."""
    hf = hf_config_or_dir
    if isinstance(hf, (str, Path)):
        hf = hf_config_from_dir(hf, model_type, required)
    if hf.model_type != model_type:
        raise CheckpointError(f"unsupported architecture {getattr(hf, 'architectures', None)} "
                              f"(model_type {hf.model_type!r}); this converter handles model_type {model_type!r}")
    return hf


def dtype_name(dtype) -> str | None:
    """A torch dtype or its name (transformers writes either) -> our dtype name."""
    if dtype is None:
        return None
    name = canonical_dtype(dtype)
    if name not in MODEL_DTYPES:
        raise CheckpointError(f"unsupported source dtype {dtype!r}")
    return name


def config_dtype(hf, dtype: str | None) -> str:
    """dtype, or the source's recorded dtype, or float32."""
    return dtype or dtype_name(getattr(hf, "dtype", None) or getattr(hf, "torch_dtype", None)) or "float32"


def rotary_scaling_from_hf(params: dict | None) -> dict | None:
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


# ---------------------------------------------------------------------------- sources

class HFTensors:
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
        return list(load_tensor_file(path))

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
            self._bin_cache = (path, load_tensor_file(path))
        if name not in self._bin_cache[1]:
            raise CheckpointError(f"tensor {name!r} is not in {path}, though the index names it")
        return self._bin_cache[1][name].clone()  # not a view of the file mapping


def load_tensor_file(path: Path) -> dict[str, torch.Tensor]:
    """A torch.save file of tensors (pytorch_model.bin, Meta's consolidated.NN.pth), memory-mapped;
    no pickled code runs."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # UnpicklingError for anything but tensors; RuntimeError for a damaged zip
        raise CheckpointError(f"{path} is not a plain tensor file: {' '.join(str(e).split())}") from e


# ---------------------------------------------------------------------------- the split

def _narrow(t: torch.Tensor, dim: int, mapping: Mapping) -> torch.Tensor:
    size = t.shape[dim] // mapping.tp_size
    return t.narrow(dim, mapping.tp_rank * size, size)


def _kv_rows(t: torch.Tensor, config: PretrainedConfig, mapping: Mapping) -> torch.Tensor:
    """This rank's rows of a K or V projection: its share of the KV heads, or, when tp_size
    exceeds them, the one KV head its query heads read (replicated on tp / KV ranks)."""
    kv_heads = config.num_key_value_heads
    if kv_heads % mapping.tp_size == 0:
        return _narrow(t, 0, mapping)
    head = mapping.tp_rank // (mapping.tp_size // kv_heads)
    return t.narrow(0, head * config.head_size, config.head_size)


def shard(name: str, t: torch.Tensor, config: PretrainedConfig, mapping: Mapping) -> torch.Tensor:
    """The part of our weight `name` (whole tensor `t`) that mapping's rank holds, in config.dtype.
    With tp_size > 1 the token embedding is vocabulary-parallel: padded like lm_head, split by rows."""
    vocab_table = name.startswith("lm_head.") or (name == "transformer.vocab_embedding.weight"
                                                  and mapping.tp_size > 1)
    if vocab_table and t.shape[0] < config.vocab_size_padded:
        t = torch.nn.functional.pad(t, (0, 0) * (t.dim() - 1) + (0, config.vocab_size_padded - t.shape[0]))
    if mapping.tp_size > 1:
        if ".attention.qkv." in name:
            q = config.num_attention_heads * config.head_size
            kv = config.num_key_value_heads * config.head_size
            q, k, v = t.split([q, kv, kv])
            t = torch.cat([_narrow(q, 0, mapping), _kv_rows(k, config, mapping), _kv_rows(v, config, mapping)])
        elif vocab_table:
            t = _narrow(t, 0, mapping)
        elif name.endswith((".attention.dense.weight", ".mlp.proj.weight")):
            t = _narrow(t, 1, mapping)
        elif ".mlp.gate." in name or ".mlp.fc." in name or name.startswith("lm_head."):
            t = _narrow(t, 0, mapping)
    t = t.to(config.torch_dtype).contiguous()
    if t.untyped_storage().nbytes() > t.numel() * t.element_size():
        t = t.clone(memory_format=torch.contiguous_format)  # a view would keep its source alive
    return t


_LAYER = re.compile(r"transformer\.layers\.(\d+)\.")


def stage_name(name: str, config: PretrainedConfig, mapping: Mapping) -> Optional[str]:
    """The name weight `name` has on mapping's pipeline stage, or None when the stage does not
    hold it: a stage holds its layers (renumbered from 0), the first the token embedding (and
    position embedding), the last ln_f and lm_head, and also the token embedding when the LM
    head reads it (share_embedding_table)."""
    if mapping.pp_size == 1:
        return name
    m = _LAYER.match(name)
    if m is not None:
        layers = mapping.pp_layers(config.num_hidden_layers)
        i = int(m.group(1))
        return f"transformer.layers.{i - layers[0]}.{name[m.end():]}" if i in layers else None
    if name.startswith("transformer.vocab_embedding."):
        keep = mapping.is_first_pp_rank() or (mapping.is_last_pp_rank() and config.share_embedding_table)
    elif name.startswith(("transformer.position_embedding.", "transformer.ln_embed.")):
        keep = mapping.is_first_pp_rank()
    else:  # ln_f, lm_head
        keep = mapping.is_last_pp_rank()
    return name if keep else None


def rank_weights(weights: Iterable[tuple[str, torch.Tensor]], config: PretrainedConfig,
                 mapping: Mapping) -> dict[str, torch.Tensor]:
    """One rank's weights (our names, config.dtype) from a converter's whole weights: its
    tensor-parallel slice of each weight its pipeline stage holds (stage_name)."""
    if (mapping.world_size, mapping.tp_size, mapping.pp_size) != (
            config.mapping.world_size, config.mapping.tp_size, config.mapping.pp_size) or (
            mapping.stage_layer_counts(config.num_hidden_layers)
            != config.mapping.stage_layer_counts(config.num_hidden_layers)):
        raise ConfigError(f"mapping {mapping} does not match the config's {config.mapping}")
    progress = tqdm(weights, desc=f"converting rank {mapping.rank}", unit="tensor", disable=None)
    out = {}
    for name, t in progress:
        local = stage_name(name, config, mapping)
        if local is not None:
            out[local] = shard(name, t, config, mapping)
    return out


def load_weights(source, config: PretrainedConfig, mapping: Mapping | None,
                 weights: WeightSource) -> dict[str, torch.Tensor]:
    """One rank's weights (our names, config.dtype) from a Hugging Face folder or a
    transformers model object (whose tensors are copied, never aliased). mapping defaults to
    config.mapping (its rank)."""
    mapping = mapping or config.mapping
    if isinstance(source, (str, Path)):
        tensors = HFTensors(source)
        get, has = tensors.get, tensors.has
    else:
        state = source.state_dict()
        get, has = (lambda name: state[name].clone()), state.__contains__
    return rank_weights(weights(get, has, config), config, mapping)
