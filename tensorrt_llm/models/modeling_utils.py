"""`PretrainedConfig` and the checkpoint folder format.

A checkpoint folder holds `config.json` (one `PretrainedConfig`, shared by every rank) and
`rank{N}.safetensors` for N in [0, world_size): the weights rank N loads, named as in
docs/architecture.md "Checkpoint weight names".
"""
import contextlib
import copy
import dataclasses
import json
import math
import os
import shutil
import tempfile
import typing
from pathlib import Path
from typing import Iterable, Iterator

import safetensors.torch
import torch

try:  # safetensors' error for a file it cannot read
    from safetensors import SafetensorError
except ImportError:  # older safetensors
    SafetensorError = OSError

from .._utils import read_json_object, str_dtype_to_torch
from ..errors import CheckpointError, ConfigError
from ..mapping import Mapping, balanced_pp_partition
from ..quantization.formats import FP8_DTYPE, kv_cache_dtype_name
from ..quantization.mode import QuantConfig

# Architecture names a checkpoint may declare. `tensorrt_llm/models/__init__.py` adds the
# keys of its MODEL_MAP, so a config is rejected before a build looks for a missing class.
KNOWN_ARCHITECTURES: set[str] = {"LlamaForCausalLM"}
# Architectures whose linears take weight-only INT8 / INT4 or FP8 weights (a `quantization` section).
QUANTIZABLE_ARCHITECTURES: set[str] = {"LlamaForCausalLM"}
# Checkpoint tensors of quantized linears (and KV cache scales) that stay as they are when weights are cast.
QUANT_TENSOR_SUFFIXES = (".weight_scale", ".weight_zero", ".input_scale", ".kv_cache_scale")

MODEL_DTYPES = ("float32", "float16", "bfloat16")
POSITION_EMBEDDING_TYPES = ("rope_gpt_neox", "rope_gptj", "learned_absolute", "alibi")
HIDDEN_ACTS = ("silu", "gelu", "gelu_tanh", "relu")
ROTARY_SCALING_KEYS = {
    "linear": {"type", "factor"},
    "llama3": {"type", "factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"},
}

CONFIG_NAME = "config.json"


def rank_weights_name(rank: int) -> str:
    return f"rank{rank}.safetensors"


def pad_vocab_size(vocab_size: int, tp_size: int) -> int:
    """The vocabulary rounded up to a multiple of tp_size (rows of a vocab-split lm_head)."""
    return math.ceil(vocab_size / tp_size) * tp_size


def _has_json_type(value, t) -> bool:
    if t is type(None):
        return value is None
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, t)


@dataclasses.dataclass
class PretrainedConfig:
    architecture: str
    dtype: str
    num_hidden_layers: int
    num_attention_heads: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_key_value_heads: int | None = None  # None: the same as num_attention_heads
    logits_dtype: str = "float32"
    position_embedding_type: str = "rope_gpt_neox"
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    norm_epsilon: float = 1e-5
    rotary_base: float = 10000.0
    rotary_scaling: dict | None = None
    rotary_pct: float = 1.0
    head_size: int | None = None  # None: hidden_size // num_attention_heads
    quantization: dict = dataclasses.field(default_factory=lambda: {"quant_algo": None})
    mapping: Mapping = dataclasses.field(default_factory=Mapping)
    share_embedding_table: bool = False
    attn_bias: bool = False
    mlp_bias: bool = False
    lm_head_bias: bool = False
    # Layer-structure options of the LayerNorm (GPT-family) decoder; LLaMA ignores them.
    parallel_attention: bool = False  # attention and MLP read one normed input (Phi)
    do_layer_norm_before: bool = True  # False: post-norm layers and no ln_f (OPT-350m style)
    embedding_layernorm: bool = False  # a LayerNorm over the token embeddings (Bloom)
    # Keys this class does not know, kept so that a load/save round trip loses nothing.
    extra: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self._check_field_types()
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_size is None:
            self._check_positive_int("num_attention_heads")
            self._check_positive_int("hidden_size")
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError(
                    f"PretrainedConfig: num_attention_heads ({self.num_attention_heads}) must divide "
                    f"hidden_size ({self.hidden_size}), or head_size must be given")
            self.head_size = self.hidden_size // self.num_attention_heads
        self.validate()

    def _check_positive_int(self, name: str):
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"PretrainedConfig: {name} must be a positive integer, got {value!r}")

    def _check_field_types(self):
        """Each field holds a value of its annotated JSON type (a config.json may hold anything)."""
        for f in dataclasses.fields(self):
            if f.name in ("mapping", "extra"):
                continue
            value = getattr(self, f.name)
            allowed = typing.get_args(f.type) or (f.type,)
            if not any(_has_json_type(value, t) for t in allowed):
                # every integer field of this config is a count or size
                words = {type(None): "null", int: "a positive integer", float: "a number", str: "a string",
                         bool: "true or false", dict: "an object"}
                names = " or ".join(words.get(t, t.__name__) for t in allowed)
                raise ConfigError(f"PretrainedConfig: {f.name} must be {names}, got {str(value)[:60]!r}")

    def validate(self):
        """Raises ConfigError (a ValueError) naming the first inconsistent field."""
        self._check_field_types()
        if self.architecture not in KNOWN_ARCHITECTURES:
            raise ConfigError(f"PretrainedConfig: unknown architecture {self.architecture!r}; "
                              f"known: {sorted(KNOWN_ARCHITECTURES)}")
        for name in ("dtype", "logits_dtype"):
            if getattr(self, name) not in MODEL_DTYPES:
                raise ConfigError(f"PretrainedConfig: {name} must be one of {list(MODEL_DTYPES)}, "
                                  f"got {getattr(self, name)!r}")
        for name in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
                     "intermediate_size", "vocab_size", "max_position_embeddings", "head_size"):
            self._check_positive_int(name)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"PretrainedConfig: num_key_value_heads ({self.num_key_value_heads}) must divide "
                f"num_attention_heads ({self.num_attention_heads})")
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ConfigError(f"PretrainedConfig: position_embedding_type must be one of "
                              f"{POSITION_EMBEDDING_TYPES}, got {self.position_embedding_type!r}")
        if self.hidden_act not in HIDDEN_ACTS:
            raise ConfigError(f"PretrainedConfig: hidden_act must be one of {HIDDEN_ACTS}, "
                              f"got {self.hidden_act!r}")
        for name in ("norm_epsilon", "rotary_base", "rotary_pct"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"PretrainedConfig: {name} must be a number, got {value!r}")
        if not self.norm_epsilon > 0:
            raise ConfigError(f"PretrainedConfig: norm_epsilon must be > 0, got {self.norm_epsilon!r}")
        if not self.rotary_base > 0:
            raise ConfigError(f"PretrainedConfig: rotary_base must be > 0, got {self.rotary_base!r}")
        if not 0 < self.rotary_pct <= 1:
            raise ConfigError(f"PretrainedConfig: rotary_pct must be in (0, 1], got {self.rotary_pct!r}")
        rotary_dim = self.head_size * self.rotary_pct
        if rotary_dim != int(rotary_dim) or int(rotary_dim) % 2:
            raise ConfigError(f"PretrainedConfig: head_size * rotary_pct ({self.head_size} * "
                              f"{self.rotary_pct}) must be an even integer")
        self._validate_rotary_scaling()
        if self.lm_head_bias and self.share_embedding_table:
            raise ConfigError("PretrainedConfig: lm_head_bias needs an lm_head of its own "
                              "(share_embedding_table is set)")
        self._validate_quantization()
        self._validate_mapping()
        clashes = set(self.extra) & {f.name for f in dataclasses.fields(self)}
        if clashes:
            raise ConfigError(f"PretrainedConfig: extra keys {sorted(clashes)} clash with fields")

    def _validate_quantization(self):
        """The `quantization` section: a QuantConfig section (quantization/mode.py) whose
        weight algorithms (the weight-only INT8 / INT4 and the FP8 ones: QuantConfig refuses
        any other) and KV cache algorithms (INT8, FP8) are for LLaMA-family models (whose
        converters write the quantized tensors)."""
        qc = self.quant_config
        if not qc.quantizes_weights and not qc.quantizes_kv_cache:
            return
        if self.architecture not in QUANTIZABLE_ARCHITECTURES:
            raise ConfigError(f"PretrainedConfig: quantized checkpoints of {self.architecture} are not "
                              f"supported (only {', '.join(sorted(QUANTIZABLE_ARCHITECTURES))})")

    @property
    def kv_cache_dtype(self) -> str:
        """The KV cache pool's dtype: the model's, or int8 / uint8 (FP8 bytes) codes."""
        return kv_cache_dtype_name(self.dtype, self.quant_config.kv_cache_quant_algo)

    @property
    def quant_config(self) -> QuantConfig:
        """The `quantization` section as a QuantConfig (ConfigError when malformed)."""
        try:
            return QuantConfig.from_dict(self.quantization)
        except ConfigError as e:
            raise ConfigError(f"PretrainedConfig: {e}") from None

    def _validate_rotary_scaling(self):
        scaling = self.rotary_scaling
        if scaling is None:
            return
        if not isinstance(scaling, dict) or scaling.get("type") not in ROTARY_SCALING_KEYS:
            raise ConfigError(f"PretrainedConfig: rotary_scaling must be None or a dict with type in "
                              f"{list(ROTARY_SCALING_KEYS)}, got {scaling!r}")
        expected = ROTARY_SCALING_KEYS[scaling["type"]]
        if set(scaling) != expected:
            raise ConfigError(f"PretrainedConfig: rotary_scaling of type {scaling['type']!r} needs "
                              f"exactly the keys {sorted(expected)}, got {sorted(scaling)}")
        if not isinstance(scaling["factor"], (int, float)) or not scaling["factor"] > 0:
            raise ConfigError(f"PretrainedConfig: rotary_scaling factor must be > 0, got {scaling!r}")

    def tp_size_fits(self, tp: int) -> bool:
        """Whether `tp` ranks can split this model: each takes a whole number of query heads,
        MLP columns, and KV heads (or one KV head, replicated, when tp exceeds them)."""
        kv = self.num_key_value_heads
        return (self.num_attention_heads % tp == 0 and self.intermediate_size % tp == 0
                and (kv % tp == 0 or tp % kv == 0))

    def _validate_mapping(self):
        tp = self.mapping.tp_size
        if self.tp_size_fits(tp):
            pass
        else:
            works = [t for t in range(1, self.num_attention_heads + 1) if self.tp_size_fits(t)]
            kv = self.num_key_value_heads
            if self.num_attention_heads % tp:
                what = f"num_attention_heads ({self.num_attention_heads})"
            elif self.intermediate_size % tp:
                what = f"intermediate_size ({self.intermediate_size})"
            else:
                what = f"num_key_value_heads ({kv}) (or be a multiple of it)"
            raise ConfigError(f"PretrainedConfig: tp_size ({tp}) must divide {what}; "
                              f"the tp sizes that split this model: {', '.join(map(str, works))}")
        try:
            self.mapping.stage_layer_counts(self.num_hidden_layers)
        except ConfigError as e:
            raise ConfigError(f"PretrainedConfig: {str(e).removeprefix('Mapping: ')}") from None

    @property
    def decoder_layer_params(self) -> int:
        """Weights of one decoder layer (its attention and MLP matrices; the norms and biases,
        a few vectors, left out): what a layer reads and multiplies a token."""
        q = self.num_attention_heads * self.head_size
        kv = self.num_key_value_heads * self.head_size
        mlp_matrices = 3 if self.architecture == "LlamaForCausalLM" else 2  # gated: gate, up, down
        return self.hidden_size * (2 * q + 2 * kv) + mlp_matrices * self.hidden_size * self.intermediate_size

    @property
    def lm_head_params(self) -> int:
        """The LM head's vocab x hidden (shared with the embedding or not, the last stage
        multiplies by it every token)."""
        return self.vocab_size * self.hidden_size

    def balanced_pp_partition(self, pp_size: int | None = None) -> list[int]:
        """Layers per pipeline stage that even out the stages' weights, the last stage's LM
        head included (mapping.balanced_pp_partition); pp_size defaults to the mapping's."""
        return balanced_pp_partition(self.num_hidden_layers, pp_size or self.mapping.pp_size,
                                     self.decoder_layer_params, self.lm_head_params)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_size * self.rotary_pct)

    @property
    def vocab_size_padded(self) -> int:
        """Rows of lm_head over all TP ranks: vocab_size rounded up to a multiple of tp_size."""
        return pad_vocab_size(self.vocab_size, self.mapping.tp_size)

    @property
    def torch_dtype(self) -> torch.dtype:
        return str_dtype_to_torch(self.dtype)

    def set_rank(self, rank: int):
        """Makes this the config of one rank (the same file serves every rank)."""
        self.mapping = self.mapping.with_rank(rank)

    def to_dict(self) -> dict:
        d = {f.name: copy.deepcopy(getattr(self, f.name))
             for f in dataclasses.fields(self) if f.name not in ("mapping", "extra")}
        mapping = self.mapping.to_dict()
        del mapping["rank"]  # config.json is shared by all ranks
        d["mapping"] = mapping
        d.update(copy.deepcopy(self.extra))
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "PretrainedConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"PretrainedConfig: a config is a JSON object, got {type(d).__name__}")
        d = copy.deepcopy(d)
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in d.items() if k in names}
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                   and f.name not in kwargs]
        if missing:
            raise ConfigError(f"PretrainedConfig: missing required keys {missing}")
        if "mapping" in kwargs:
            if not isinstance(kwargs["mapping"], dict):
                raise ConfigError(f"PretrainedConfig: mapping must be a dict, got {kwargs['mapping']!r}")
            try:
                kwargs["mapping"] = Mapping.from_dict(kwargs["mapping"])
            except (TypeError, ValueError) as e:
                raise ConfigError(f"PretrainedConfig: {e}") from e
        extra = {k: v for k, v in d.items() if k not in names}
        return cls(**kwargs, extra=extra)

    def to_json_file(self, path):
        Path(path).write_text(json.dumps(self.to_dict(), indent=4) + "\n")

    @classmethod
    def from_json_file(cls, path) -> "PretrainedConfig":
        """The config of a JSON file; CheckpointError naming the file when it is not JSON
        and ConfigError (naming it too) when its content is not a valid config."""
        d = read_json_object(path, CheckpointError)
        try:
            return cls.from_dict(d)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from e

    @classmethod
    def from_checkpoint(cls, checkpoint_dir, rank: int = 0) -> "PretrainedConfig":
        path = Path(checkpoint_dir) / CONFIG_NAME
        if not path.is_file():
            gone = "" if Path(checkpoint_dir).is_dir() else " (the folder does not exist)"
            raise FileNotFoundError(f"no {CONFIG_NAME} in checkpoint folder {checkpoint_dir}{gone}")
        config = cls.from_json_file(path)
        config.set_rank(rank)
        return config


def with_pp_partition(config: PretrainedConfig, pp_partition=None) -> PretrainedConfig:
    """`config` whose mapping records the layers of each pipeline stage: `pp_partition` (a
    list of layer counts, checked against the model), or else the balanced one
    (PretrainedConfig.balanced_pp_partition), unless the mapping already has one. What a new
    conversion or build of pp_size > 1 writes, so that its config.json says how it is split;
    a one-stage config is returned as it is (given a partition, it must be [num_hidden_layers])."""
    m = config.mapping
    if pp_partition is None:
        if m.pp_size == 1 or m.pp_partition is not None:
            return config
        pp_partition = config.balanced_pp_partition()
    elif m.pp_size == 1 and list(pp_partition) == [config.num_hidden_layers]:
        return config
    return dataclasses.replace(config, mapping=m.with_pp_partition(pp_partition))


def check_output_dir(output_dir, sources: Iterable = ()) -> None:
    """CheckpointError unless `output_dir` can be replaced by atomic_output_dir: it is a
    folder or does not exist, and it neither is nor holds one of `sources`. A converter calls
    this first, so that a bad --output_dir is refused before the conversion's work."""
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise CheckpointError(f"output folder {output_dir} exists and is not a folder")
    out = output_dir.resolve()
    for source in sources:
        if Path(source).resolve().is_relative_to(out):
            raise CheckpointError(f"output folder {output_dir} holds the source {source}: writing "
                                  f"the checkpoint there would replace the source; choose another folder")


@contextlib.contextmanager
def atomic_output_dir(output_dir, sources: Iterable = ()) -> Iterator[Path]:
    """Writes a folder all at once: yields a new, empty temporary folder beside `output_dir`
    (same parent, so the renames below stay on one file system) to write into; when the
    block ends without an error it becomes `output_dir`.

    An existing `output_dir` is renamed aside, the new folder renamed in, and only then is
    the old one deleted (if renaming the new one in fails, the old one is put back). When
    the block raises, or is interrupted, the temporary folder is deleted and `output_dir`
    is left exactly as it was. Every converter writes its checkpoint through this.
    `sources`: paths being read; an output folder that is or holds one is refused (replacing
    it would delete the source).
    """
    output_dir = Path(output_dir)
    check_output_dir(output_dir, sources)
    parent = output_dir.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.tmp-", dir=parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would outlive the rename
        yield tmp
        old = None
        if output_dir.exists() or output_dir.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.old-", dir=parent))
            os.rename(output_dir, old / output_dir.name)
        try:
            os.rename(tmp, output_dir)
        except BaseException:
            if old is not None:
                os.rename(old / output_dir.name, output_dir)
                shutil.rmtree(old, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_checkpoint(folder, config: PretrainedConfig,
                     weights_per_rank: Iterable[dict[str, torch.Tensor]]) -> list[Path]:
    """Writes config.json and one rank{N}.safetensors per item of weights_per_rank into
    `folder`, in place (see save_checkpoint for the atomic version).

    weights_per_rank is consumed in rank order, one rank at a time, so a generator keeps
    only one rank's weights in memory. Returns the paths written.
    """
    output_dir = Path(folder)
    output_dir.mkdir(parents=True, exist_ok=True)
    config.to_json_file(output_dir / CONFIG_NAME)
    paths = [output_dir / CONFIG_NAME]
    num_ranks = 0
    for rank, weights in enumerate(weights_per_rank):
        if rank >= config.mapping.world_size:
            raise ValueError(f"save_checkpoint: more weight sets than world_size "
                             f"({config.mapping.world_size})")
        for name, tensor in weights.items():
            if in_model_dtype(name, tensor) and tensor.dtype != config.torch_dtype:
                raise ValueError(f"save_checkpoint: rank {rank} weight {name} is {tensor.dtype}, "
                                 f"config dtype is {config.dtype}")
        path = output_dir / rank_weights_name(rank)
        safetensors.torch.save_file({k: v.contiguous() for k, v in weights.items()}, path,
                                    metadata={"format": "pt"})
        paths.append(path)
        num_ranks += 1
    if num_ranks != config.mapping.world_size:
        raise ValueError(f"save_checkpoint: got weights for {num_ranks} ranks, world_size is "
                         f"{config.mapping.world_size}")
    return paths


def save_checkpoint(output_dir, config: PretrainedConfig,
                    weights_per_rank: Iterable[dict[str, torch.Tensor]]) -> list[Path]:
    """write_checkpoint into `output_dir` through atomic_output_dir: `output_dir` (replaced
    whole if it exists) holds the new checkpoint, or, if anything fails, stays as it was.
    Returns the paths written."""
    output_dir = Path(output_dir)
    with atomic_output_dir(output_dir) as tmp:
        names = [p.name for p in write_checkpoint(tmp, config, weights_per_rank)]
    return [output_dir / name for name in names]


def hf_config_from_dir(model_dir, model_type: str, required: Iterable[str | tuple[str, ...]]):
    """The transformers config of a Hugging Face model folder, once its raw config.json has
    been checked: of `model_type`, and holding every key of `required` (a tuple: any of
    these names). transformers fills a missing key with its class default (hidden_size 4096
    for LLaMA), which would convert a model that is not the one in the folder; here a missing
    key is a CheckpointError naming it."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"Hugging Face model folder not found: {model_dir}")
    path = model_dir / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(f"no {CONFIG_NAME} in Hugging Face model folder {model_dir}")
    raw = read_json_object(path, CheckpointError, ": it is not a Hugging Face config")
    if raw.get("model_type") != model_type:
        raise CheckpointError(f"unsupported architecture {raw.get('architectures')} (model_type "
                              f"{raw.get('model_type')!r}); this converter handles model_type "
                              f"{model_type!r}")
    missing = [" or ".join(names) for names in ((n,) if isinstance(n, str) else n for n in required)
               if not any(name in raw for name in names)]
    if missing:
        raise CheckpointError(f"{path} has no {', '.join(missing)}: the converter needs "
                              f"{'them' if len(missing) > 1 else 'it'} and does not guess defaults")
    import transformers
    try:
        return transformers.AutoConfig.from_pretrained(str(model_dir))
    except (ValueError, TypeError, KeyError) as e:
        raise CheckpointError(f"transformers cannot read {path}: {' '.join(str(e).split())}") from e


# safetensors' own limit on the JSON header of a file.
_SAFETENSORS_MAX_HEADER = 100_000_000


def check_safetensors_file(path) -> None:
    """CheckpointError when `path` is not a whole safetensors file: shorter than its header
    says ("... is truncated: expected N bytes, file has M") or not safetensors at all.
    Reads only the header, so it is cheap to call before reading any tensor."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path} is truncated: expected at least 8 bytes, file has {size}")
        header_len = int.from_bytes(head, "little")
        if header_len > _SAFETENSORS_MAX_HEADER:
            raise CheckpointError(f"{path} is not a safetensors file (its first 8 bytes give a "
                                  f"header of {header_len} bytes)")
        if 8 + header_len > size:
            raise CheckpointError(f"{path} is truncated: expected at least {8 + header_len} bytes, "
                                  f"file has {size}")
        header = f.read(header_len)
    try:
        entries = json.loads(header)
        end = max((int(v["data_offsets"][1]) for k, v in entries.items() if k != "__metadata__"),
                  default=0)
    except (ValueError, UnicodeDecodeError, TypeError, KeyError, IndexError, AttributeError):
        raise CheckpointError(f"{path} is not a safetensors file (its header is not a "
                              f"safetensors header)") from None
    expected = 8 + header_len + end
    if size < expected:
        raise CheckpointError(f"{path} is truncated: expected {expected} bytes, file has {size}")


def load_checkpoint_weights(checkpoint_dir, rank: int = 0) -> dict[str, torch.Tensor]:
    path = Path(checkpoint_dir) / rank_weights_name(rank)
    if not path.is_file():
        raise FileNotFoundError(f"no {path.name} in checkpoint folder {checkpoint_dir}")
    check_safetensors_file(path)
    try:
        return safetensors.torch.load_file(path)
    except SafetensorError as e:
        raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from e


def in_model_dtype(name: str, tensor: torch.Tensor) -> bool:
    """Whether a checkpoint tensor is a float weight in the model's dtype: not an integer, not
    FP8 codes, not a quantized linear's scale or zero (float32 whatever the dtype)."""
    return tensor.is_floating_point() and tensor.dtype != FP8_DTYPE and not name.endswith(QUANT_TENSOR_SUFFIXES)


def cast_weights(weights: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """Cast the float weights (in_model_dtype) to `dtype`; the others are left alone."""
    target = str_dtype_to_torch(dtype)
    return {k: (v.to(target) if in_model_dtype(k, v) else v) for k, v in weights.items()}
