"""What the GPT-family converters (gpt, opt, phi, bloom) share.

A converter names its source tensors by their Hugging Face names and yields each of our
weights whole, in our layout (docs/architecture.md, "Checkpoint weight names"). This module
reads the source one tensor at a time and cuts each weight for one tensor-parallel rank by
its name:
- attention.qkv: the q, k and v row blocks, each split by rows;
- attention.dense.weight, mlp.proj.weight: split by columns (their biases whole);
- mlp.fc: split by rows;
- lm_head: rows padded with zeros to `config.vocab_size_padded`, then split by rows;
- everything else (embeddings, norms): whole on every rank.
"""
from pathlib import Path
from typing import Callable, Iterator

import torch

from ...errors import CheckpointError
from ...mapping import Mapping
from ..llama.convert import _dtype_name, _HFTensors  # LLaMA's Hugging Face folder reader
from ..modeling_utils import PretrainedConfig, hf_config_from_dir

Getter = Callable[[str], torch.Tensor]
Has = Callable[[str], bool]
# (get, has, config) -> (our name, whole tensor in our layout) pairs
WeightSource = Callable[[Getter, Has, PretrainedConfig], Iterator[tuple[str, torch.Tensor]]]


def hf_config(hf_config_or_dir, model_type: str, required=()):
    """A transformers config of `model_type`, given as one or as a model folder. A folder's
    config.json must give every key of `required` (see modeling_utils.hf_config_from_dir)."""
    hf = hf_config_or_dir
    if isinstance(hf, (str, Path)):
        hf = hf_config_from_dir(hf, model_type, required)
    if hf.model_type != model_type:
        raise CheckpointError(f"unsupported architecture {getattr(hf, 'architectures', None)} "
                              f"(model_type {hf.model_type!r}); this converter handles {model_type!r}")
    return hf


def config_dtype(hf, dtype: str | None) -> str:
    """dtype, or the source's recorded dtype, or float32."""
    return dtype or _dtype_name(getattr(hf, "dtype", None) or getattr(hf, "torch_dtype", None)) or "float32"


def _narrow(t: torch.Tensor, dim: int, mapping: Mapping) -> torch.Tensor:
    size = t.shape[dim] // mapping.tp_size
    return t.narrow(dim, mapping.tp_rank * size, size)


def shard(name: str, t: torch.Tensor, config: PretrainedConfig, mapping: Mapping) -> torch.Tensor:
    """The part of our weight `name` (whole tensor `t`) that mapping's rank holds."""
    if name.startswith("lm_head.") and t.shape[0] < config.vocab_size_padded:
        t = torch.nn.functional.pad(t, (0, 0) * (t.dim() - 1) + (0, config.vocab_size_padded - t.shape[0]))
    if mapping.tp_size > 1:
        if ".attention.qkv." in name:
            q = config.num_attention_heads * config.head_size
            kv = config.num_key_value_heads * config.head_size
            t = torch.cat([_narrow(part, 0, mapping) for part in t.split([q, kv, kv])])
        elif name.endswith((".attention.dense.weight", ".mlp.proj.weight")):
            t = _narrow(t, 1, mapping)
        elif ".mlp.fc." in name or name.startswith("lm_head."):
            t = _narrow(t, 0, mapping)
    t = t.to(config.torch_dtype).contiguous()
    if t.untyped_storage().nbytes() > t.numel() * t.element_size():
        t = t.clone(memory_format=torch.contiguous_format)  # a view would keep its source alive
    return t


def load_weights(source, config: PretrainedConfig, mapping: Mapping | None,
                 weights: WeightSource) -> dict[str, torch.Tensor]:
    """One rank's weights (our names, config.dtype) from a Hugging Face folder or a
    transformers model object. mapping defaults to config.mapping (its rank)."""
    mapping = mapping or config.mapping
    if mapping.pp_size != 1:
        raise ValueError("pipeline-parallel checkpoints are not supported (pp_size must be 1)")
    if (mapping.world_size, mapping.tp_size) != (config.mapping.world_size, config.mapping.tp_size):
        raise ValueError(f"mapping {mapping} does not match the config's {config.mapping}")
    if isinstance(source, (str, Path)):
        tensors = _HFTensors(source)
        get, has = tensors.get, tensors.has
    else:
        state = source.state_dict()
        get, has = state.__getitem__, state.__contains__
    return {name: shard(name, t, config, mapping) for name, t in weights(get, has, config)}
