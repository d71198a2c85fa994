"""LLaMA-family checkpoint converters: a Hugging Face folder or model, a llama.cpp GGUF file, or a
Meta checkpoint (`params.json` + `consolidated.NN.pth`) -> our checkpoint (config + rank weights).

Every source is read through one getter keyed by Hugging Face tensor names; `_weights` maps
those onto our names and layout, and convert_utils.rank_weights cuts them for a
tensor-parallel rank (the split every model shares, docs/architecture.md for the names).
When tp_size does not divide vocab_size, lm_head's vocabulary is padded with zero rows to
`config.vocab_size_padded`; a model must drop logits past `config.vocab_size`.

Meta's shards are read with `torch.load(weights_only=True, mmap=True)`: no pickled code runs
and a shard is mapped, not copied into memory. Each shard holds one model-parallel slice:
column-parallel weights (wq, wk, wv, w1, w3, output) are split by rows, row-parallel ones
(wo, w2) by columns, the norms are whole on every shard, and tok_embeddings is split by
columns (LLaMA 1/2's ParallelEmbedding) or by rows (LLaMA 3's VocabParallelEmbedding), told
apart by shape. Tensors are joined and renamed to Hugging Face names, with Q/K rows moved
from Meta's interleaved rotary order to Hugging Face's rotate-halves order.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from ..._utils import canonical_dtype
from ...errors import CheckpointError, ConfigError
from ...mapping import Mapping
from ..convert_utils import (
    HIDDEN_ACTS,
    Getter,
    Has,
    config_dtype,
    hf_config,
    load_tensor_file,
    load_weights,
    rank_weights,
    rotary_scaling_from_hf,
)
from ..modeling_utils import PretrainedConfig

ARCHITECTURE = "LlamaForCausalLM"

# Keys a Hugging Face config.json must give: the model's shape, its context length and its
# norm epsilon (transformers' class defaults describe some other model).
HF_REQUIRED_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                    "vocab_size", "max_position_embeddings", "rms_norm_eps")

# ---------------------------------------------------------------------------- configs

def config_from_hf(hf_config_or_dir, dtype: str | None = None,
                   mapping: Mapping | None = None) -> PretrainedConfig:
    """Our config from a transformers LlamaConfig or a Hugging Face model folder.

    A folder's config.json must give HF_REQUIRED_KEYS (CheckpointError naming the missing
    ones). dtype None follows the source's recorded dtype, float32 where it records none.
    """
    hf = hf_config(hf_config_or_dir, "llama", HF_REQUIRED_KEYS)
    if hf.hidden_act not in HIDDEN_ACTS:
        raise CheckpointError(f"unsupported hidden_act {hf.hidden_act!r}")
    # transformers >= 5 keeps rope_theta and the scaling in rope_parameters; older configs
    # have rope_theta and rope_scaling attributes.
    rope = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}
    rope_theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    return PretrainedConfig(
        architecture=ARCHITECTURE,
        dtype=config_dtype(hf, dtype),
        num_hidden_layers=hf.num_hidden_layers,
        num_attention_heads=hf.num_attention_heads,
        num_key_value_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size,
        vocab_size=hf.vocab_size,
        position_embedding_type="rope_gpt_neox",
        max_position_embeddings=hf.max_position_embeddings,
        hidden_act=HIDDEN_ACTS[hf.hidden_act],
        norm_epsilon=hf.rms_norm_eps,
        rotary_base=float(rope_theta),
        rotary_scaling=rotary_scaling_from_hf(rope),
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


def _weights(get: Getter, has: Has, config: PretrainedConfig, quantized: frozenset = frozenset()):
    """Our weights, whole, from a getter of Hugging Face-named tensors (HF row order).
    `quantized`: Hugging Face linears (e.g. `model.layers.0.self_attn.q_proj`, `lm_head`) whose
    weights the caller supplies in a quantized form: theirs are not read (their biases are)."""

    def take(name: str) -> torch.Tensor:
        t = get(name)
        _check_hf_shape(name, t.shape, config)
        return t

    def weight(ours: str, hf_linear: str):
        if hf_linear not in quantized:
            yield ours, take(hf_linear + ".weight")

    yield "transformer.vocab_embedding.weight", take("model.embed_tokens.weight")
    for i in range(config.num_hidden_layers):
        hf, ours = f"model.layers.{i}.", f"transformer.layers.{i}."
        yield ours + "input_layernorm.weight", take(hf + "input_layernorm.weight")
        if hf + "self_attn.q_proj" not in quantized:  # q, k and v are quantized together or not at all
            yield ours + "attention.qkv.weight", torch.cat([take(hf + f"self_attn.{p}_proj.weight") for p in "qkv"])
        if config.attn_bias:
            yield ours + "attention.qkv.bias", torch.cat([take(hf + f"self_attn.{p}_proj.bias") for p in "qkv"])
        yield from weight(ours + "attention.dense.weight", hf + "self_attn.o_proj")
        if config.attn_bias:
            yield ours + "attention.dense.bias", take(hf + "self_attn.o_proj.bias")
        yield ours + "post_layernorm.weight", take(hf + "post_attention_layernorm.weight")
        for ours_name, hf_name in (("gate", "gate_proj"), ("fc", "up_proj")):
            yield from weight(ours + f"mlp.{ours_name}.weight", hf + f"mlp.{hf_name}")
            if config.mlp_bias:
                yield ours + f"mlp.{ours_name}.bias", take(hf + f"mlp.{hf_name}.bias")
        yield from weight(ours + "mlp.proj.weight", hf + "mlp.down_proj")
        if config.mlp_bias:
            yield ours + "mlp.proj.bias", take(hf + "mlp.down_proj.bias")
    yield "transformer.ln_f.weight", take("model.norm.weight")
    if not config.share_embedding_table and "lm_head" not in quantized:
        if not has("lm_head.weight"):
            raise CheckpointError("the source has no lm_head.weight but its config does not tie "
                                  "the embeddings")
        yield "lm_head.weight", take("lm_head.weight")


def load_weights_from_hf(model_dir_or_model, config: PretrainedConfig,
                         mapping: Mapping | None = None) -> dict[str, torch.Tensor]:
    """One rank's weights (our names, config.dtype) from a Hugging Face folder or a
    transformers model object. mapping defaults to config.mapping (its rank)."""
    return load_weights(model_dir_or_model, config, mapping, _weights)


def _unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undoes llama.cpp's Q/K permutation, back to Hugging Face's rotate-halves row order.

    llama.cpp stores each head's rows interleaved as pairs (x0, x_{d/2}), (x1, x_{d/2+1}), ...
    for GPT-J-style rotation: rows viewed [head, d/2, 2] in the file are [head, 2, d/2] in HF.
    """
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _in_hf_rotary_order(hf_name: str, w, config: PretrainedConfig):
    """Q and K rows (interleaved pairs in llama.cpp and Meta files) in Hugging Face's order;
    any other tensor as it is."""
    if ".self_attn.q_proj." in hf_name:
        return _unpermute_rotary_rows(w, config.num_attention_heads)
    if ".self_attn.k_proj." in hf_name:
        return _unpermute_rotary_rows(w, config.num_key_value_heads)
    return w


def _renamed(hf_name: str, whole: dict[str, str], layer_prefix: str, modules: dict[str, str]) -> str:
    """A Hugging Face Llama tensor name in another format's names: `whole` names the tensors
    outside the layers, a layer's is `{layer_prefix}{i}.{modules[module]}.{weight or bias}`."""
    if hf_name in whole:
        return whole[hf_name]
    layer, rest = hf_name.removeprefix("model.layers.").split(".", 1)
    module, kind = rest.rsplit(".", 1)
    return f"{layer_prefix}{layer}.{modules[module]}.{kind}"


# Hugging Face names -> llama.cpp's.
_GGUF_WHOLE = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
               "lm_head.weight": "output.weight"}
_GGUF_MODULES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}


def _gguf_name(hf_name: str) -> str:
    return _renamed(hf_name, _GGUF_WHOLE, "blk.", _GGUF_MODULES)


def load_weights_from_gguf(path, config: PretrainedConfig, mapping: Mapping | None = None,
                           reader=None, placeholders=frozenset()) -> dict[str, torch.Tensor]:
    """One rank's weights (our names, config.dtype) from a llama.cpp GGUF file, dequantised.
    Tensors named (Hugging Face names) in `placeholders` are not read: uninitialized tensors of
    their shape stand for them (the caller replaces them: load_weight_only_from_gguf)."""
    import gguf
    mapping = mapping or config.mapping
    reader = reader or open_gguf(path)
    tensors = {t.name: t for t in reader.tensors}

    def get(hf_name: str) -> torch.Tensor:
        if _gguf_name(hf_name) not in tensors:
            raise CheckpointError(f"{path} has no tensor {_gguf_name(hf_name)!r} "
                                  f"({hf_name} in Hugging Face names)")
        t = tensors[_gguf_name(hf_name)]
        if hf_name in placeholders:
            return torch.empty(tuple(reversed(t.shape.tolist())), dtype=torch.float32)
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
            w = w.reshape(tuple(reversed(t.shape.tolist())))  # GGUF lists dims innermost first
        except (ValueError, TypeError, NotImplementedError, KeyError, IndexError) as e:
            raise CheckpointError(f"{path}: tensor {t.name!r} is unreadable ({' '.join(str(e).split())[:200]})") \
                from None
        _check_hf_shape(hf_name, w.shape, config)  # before the row permutation reads it by heads
        w = _in_hf_rotary_order(hf_name, w, config)
        # F32 tensors are read-only views of the file: copy those (only)
        return torch.from_numpy(np.require(w, np.float32, ["C_CONTIGUOUS", "WRITEABLE"]))

    return rank_weights(_weights(get, lambda hf_name: _gguf_name(hf_name) in tensors, config), config, mapping)


def _rows_in_hf_rotary_order(hf_name: str, t: torch.Tensor, config: PretrainedConfig) -> torch.Tensor:
    """_in_hf_rotary_order on the rows of a quantized weight's codes, scales or zeros."""
    heads = (config.num_attention_heads if ".self_attn.q_proj." in hf_name
             else config.num_key_value_heads if ".self_attn.k_proj." in hf_name else None)
    if heads is None:
        return t
    half = t.shape[0] // heads // 2
    return t.reshape(heads, half, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape).contiguous()


def load_weight_only_from_gguf(path, config: PretrainedConfig, reader=None):
    """(config, weights) of a weight-only checkpoint of a GGUF file (one rank): each linear
    whose GGUF blocks have an exact INT8 / INT4 form (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K:
    quantization/gguf_quant.py) keeps its integers and scales (no float round trip), Q and K
    rows put back in Hugging Face's order like the float converter does; the other tensors are
    dequantized as load_weights_from_gguf does. The `quantization` section names each
    quantized linear's algorithm and group (MIXED_PRECISION when they differ); a tied
    embedding gives the LM head its own quantized copy."""
    from ...quantization.formats import cat_rows
    from ...quantization.gguf_quant import convert_gguf_tensor, gguf_layer_quant
    from ..quantize import set_quantized
    if config.mapping.tp_size != 1:
        raise ConfigError("a weight-only checkpoint of a GGUF file has one rank (--tp_size 1)")
    reader = reader or open_gguf(path)
    tensors = {t.name: t for t in reader.tensors}
    read = set()  # Hugging Face names of the linears taken as they are (not dequantized below)

    def quantized(hf_name: str):
        t = tensors.get(_gguf_name(hf_name))
        if t is None or gguf_layer_quant(t.tensor_type) is None or len(t.shape) != 2:
            return None
        w = convert_gguf_tensor(t)
        _check_hf_shape(hf_name, w.shape, config)
        w.qweight = _rows_in_hf_rotary_order(hf_name, w.qweight, config)
        w.scales = _rows_in_hf_rotary_order(hf_name, w.scales, config)
        if getattr(w, "zeros", None) is not None:
            w.zeros = _rows_in_hf_rotary_order(hf_name, w.zeros, config)
        read.add(hf_name)
        return w, gguf_layer_quant(t.tensor_type)

    modules = {}  # our module name -> (weight, LayerQuant)
    for i in range(config.num_hidden_layers):
        hf, ours = f"model.layers.{i}.", f"transformer.layers.{i}."
        qkv = [quantized(hf + f"self_attn.{p}_proj.weight") for p in "qkv"]
        if all(qkv) and len({q[1] for q in qkv}) == 1:
            modules[ours + "attention.qkv"] = (cat_rows([q[0] for q in qkv]), qkv[0][1])
        else:  # the three of one type only: otherwise qkv is float (dequantized)
            read.difference_update(hf + f"self_attn.{p}_proj.weight" for p in "qkv")
        for name, hf_name in (("attention.dense", "self_attn.o_proj"), ("mlp.gate", "mlp.gate_proj"),
                              ("mlp.fc", "mlp.up_proj"), ("mlp.proj", "mlp.down_proj")):
            if (q := quantized(hf + hf_name + ".weight")) is not None:
                modules[ours + name] = q
    head = quantized("lm_head.weight" if not config.share_embedding_table else "model.embed_tokens.weight")
    if head is not None and config.vocab_size_padded == config.vocab_size:
        modules["lm_head"] = head
    read.discard("model.embed_tokens.weight")  # the embedding stays float
    if config.vocab_size_padded != config.vocab_size:
        read.discard("lm_head.weight")
    layers = {name: layer for name, (_, layer) in modules.items()}
    if not layers:
        raise CheckpointError(f"{path}: no linear weight is of a GGUF type with an exact INT8 / INT4 form "
                              f"(Q8_0, Q4_0, Q4_1, Q4_K, Q6_K); convert it without --use_weight_only")
    kinds = set(layers.values())
    if len(kinds) == 1:
        (kind,) = kinds
        section = {"quant_algo": kind.quant_algo.value, "group_size": kind.group_size,
                   "exclude_modules": sorted(_linear_names(config) - set(layers)) or None}
    else:
        in_layers = {layer for name, layer in layers.items() if name != "lm_head"}
        if len(in_layers) == 1 and set(layers) >= _linear_names(config) - {"lm_head"}:
            # every decoder linear alike (a GGUF file's usual mix: one type, another for the head)
            quantized_layers = {"transformer.layers.*": in_layers.pop().to_dict(),
                                "lm_head": layers["lm_head"].to_dict()}
        else:
            quantized_layers = {name: layer.to_dict() for name, layer in layers.items()}
        section = {"quant_algo": "MIXED_PRECISION", "quantized_layers": quantized_layers}
    source_config = config
    config = dataclasses.replace(config, quantization=section,
                                 share_embedding_table=config.share_embedding_table and "lm_head" not in layers)
    weights = load_weights_from_gguf(path, source_config, reader=reader, placeholders=frozenset(read))
    for name, (w, _) in modules.items():
        set_quantized(weights, name, w)
    return config, weights


# Our linear module -> its Hugging Face linears (q, k and v make one).
def _hf_linears(config: PretrainedConfig) -> dict[str, tuple[str, ...]]:
    out = {}
    for i in range(config.num_hidden_layers):
        hf, ours = f"model.layers.{i}.", f"transformer.layers.{i}."
        out[ours + "attention.qkv"] = tuple(hf + f"self_attn.{p}_proj" for p in "qkv")
        for name, hf_name in (("attention.dense", "self_attn.o_proj"), ("mlp.gate", "mlp.gate_proj"),
                              ("mlp.fc", "mlp.up_proj"), ("mlp.proj", "mlp.down_proj")):
            out[ours + name] = (hf + hf_name,)
    out["lm_head"] = ("lm_head",)
    return out


def load_weight_only_from_awq_gptq(folder, config: PretrainedConfig):
    """(config, weights) of a weight-only checkpoint of an AutoAWQ (GEMM) or AutoGPTQ folder (one
    rank): each 4-bit linear keeps its codes, scales and zero points as INT4 exactly
    (quantization/awq_gptq.py), q, k and v stacked into one; the other tensors (embedding, norms,
    biases, a float LM head) are read as load_weights_from_hf reads them. GPTQ act-order
    (desc_act) linears keep their input permutation (`weight_perm`, gathered at run time),
    except down's, which _fold_down_perms folds into gate's and up's rows. The `quantization`
    section says W4A16_AWQ / W4A16_GPTQ with the group size (MIXED_PRECISION when the linears'
    groups or act-order differ) and excludes the linears the folder keeps float."""
    from ...quantization.awq_gptq import load_awq_gptq
    from ...quantization.formats import cat_rows
    from ...quantization.mode import LayerQuant, QuantAlgo
    from ..quantize import set_quantized
    if config.mapping.world_size != 1:
        raise ConfigError("an AWQ / GPTQ checkpoint converts to one rank (--tp_size 1 --pp_size 1)")
    ckpt = load_awq_gptq(folder)
    algo = QuantAlgo.W4A16_AWQ if ckpt.method == "awq" else QuantAlgo.W4A16_GPTQ
    modules = {}  # our module name -> Int4Weight
    for ours, hf_names in _hf_linears(config).items():
        present = [name in ckpt.layers for name in hf_names]
        if not any(present):
            continue
        if not all(present):
            missing = hf_names[present.index(False)]
            raise CheckpointError(f"{folder}: {missing} is not quantized but {hf_names[present.index(True)]} is "
                                  "(q, k and v must be quantized alike)")
        for name in hf_names:
            _check_hf_shape(name + ".weight", ckpt.layers[name].shape, config)
        try:
            modules[ours] = cat_rows([ckpt.layers[name] for name in hf_names])
        except ValueError as e:
            raise CheckpointError(f"{folder}: {hf_names[0]} .. {hf_names[-1]}: {e}") from None
    known = {name for names in _hf_linears(config).values() for name in names}
    unknown = sorted(set(ckpt.layers) - known)
    if unknown:
        raise CheckpointError(f"{folder}: quantized layer {unknown[0]} is not a linear of this "
                              f"{config.num_hidden_layers}-layer Llama model")
    if "lm_head" in modules and config.vocab_size_padded != config.vocab_size:
        raise ConfigError("a quantized lm_head cannot be padded to the tensor-parallel vocabulary")
    row_perms = _fold_down_perms(modules, config)
    layers = {name: LayerQuant(algo, w.group_size, w.perm is not None) for name, w in modules.items()}
    if len(set(layers.values())) == 1:
        layer = next(iter(layers.values()))
        section = {"quant_algo": algo.value, "group_size": layer.group_size,
                   **({"has_act_order": True} if layer.has_act_order else {}),
                   "exclude_modules": sorted(_linear_names(config) - set(layers)) or None}
    else:  # e.g. group 128 but one linear's in_features only a multiple of 64; act-order but down's folded
        section = {"quant_algo": "MIXED_PRECISION",
                   "quantized_layers": {name: layer.to_dict() for name, layer in layers.items()}}

    def get(name: str) -> torch.Tensor:
        if name not in ckpt.tensors:
            raise CheckpointError(f"{folder} has no tensor {name!r}")
        return ckpt.tensors[name]

    weights = rank_weights(_weights(get, ckpt.tensors.__contains__, config, frozenset(ckpt.layers)), config,
                           config.mapping)
    config = dataclasses.replace(config, quantization=section,
                                 share_embedding_table=config.share_embedding_table and "lm_head" not in modules)
    for name, w in modules.items():
        set_quantized(weights, name, w)
    for name, rows in row_perms.items():  # a float gate / up bias follows its rows
        if f"{name}.bias" in weights:
            weights[f"{name}.bias"] = weights[f"{name}.bias"][rows.to(weights[f"{name}.bias"].device)]
    return config, weights


def _fold_down_perms(modules: dict, config: PretrainedConfig) -> dict[str, torch.Tensor]:
    """GPTQ act-order on the down projection, folded into gate and up (in place in `modules`):
    down's input is silu(gate x) * (up x) feature by feature, so gate's and up's output rows
    taken in down's perm order make down's stored column order its input order, exactly, and
    down needs no gather. qkv, o and gate / up keep theirs (their inputs are the residual
    stream's norm and the attention's heads, which no earlier row order can permute).
    Returns the row order each of gate / up took."""
    from ...quantization.formats import Int4Weight, select_rows
    rows = {}
    for i in range(config.num_hidden_layers):
        p = f"transformer.layers.{i}.mlp."
        down = modules.get(p + "proj")
        if down is None or down.perm is None or not all(p + name in modules for name in ("gate", "fc")):
            continue
        for name in ("gate", "fc"):
            modules[p + name] = select_rows(modules[p + name], down.perm)
            rows[p + name] = down.perm.long()
        modules[p + "proj"] = Int4Weight(down.qweight, down.scales, down.zeros, down.group_size)
    return rows


def _linear_names(config: PretrainedConfig) -> set[str]:
    return set(_hf_linears(config))


# ---------------------------------------------------------------------------- Meta checkpoints

# Meta module name -> the dim its shards are joined along (None: whole on every shard).
_SPLIT_DIM = {"attention.wq": 0, "attention.wk": 0, "attention.wv": 0, "attention.wo": 1,
              "feed_forward.w1": 0, "feed_forward.w3": 0, "feed_forward.w2": 1,
              "attention_norm": None, "ffn_norm": None, "norm": None, "output": 0}

# Hugging Face names -> Meta's.
_META_WHOLE = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
               "lm_head.weight": "output.weight"}
_META_MODULES = {"input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
                 "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo",
                 "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
                 "mlp.down_proj": "feed_forward.w2"}

# params.json keys the converter needs (the others have Meta's defaults).
_REQUIRED_PARAMS = ("dim", "n_layers", "n_heads")

# Buffers some Meta checkpoints carry that are derived from params.json.
_IGNORED = {"rope.freqs"}


def _meta_name(hf_name: str) -> str:
    return _renamed(hf_name, _META_WHOLE, "layers.", _META_MODULES)


def ffn_hidden_dim(dim: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """The feed-forward width Meta's model code derives from params.json."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


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
        self.shards = [load_tensor_file(p) for p in paths]
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
            names += [f"model.layers.{i}.{module}.weight" for module in _META_MODULES]
        return names

    def rank_weights(self, config: PretrainedConfig, mapping: Mapping | None = None) -> dict[str, torch.Tensor]:
        """One rank's weights (our names, config.dtype)."""

        def get(hf_name: str) -> torch.Tensor:
            return _in_hf_rotary_order(hf_name, self._joined(_meta_name(hf_name)), config).contiguous()

        return rank_weights(_weights(get, lambda hf_name: _meta_name(hf_name) in self.keys, config), config,
                            mapping or config.mapping)
