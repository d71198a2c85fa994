"""Quantization algorithms and a checkpoint's `quantization` section.

A checkpoint's `config.json` may hold a `quantization` object with the keys TensorRT-LLM's
checkpoint config uses:

```json
"quantization": {"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": "FP8", "group_size": 128,
                 "has_zero_point": true, "pre_quant_scale": false, "exclude_modules": ["lm_head"]}
```

`QuantConfig.from_dict` reads it (a missing section or `null` algos mean no quantization) and
refuses, with one line naming the key, anything this project does not implement;
`QuantConfig.to_dict` writes it back. The algorithm names are TensorRT-LLM's `QuantAlgo`
names; all of them parse, and the ones this project runs are:

- `W8A16`: INT8 weights, symmetric; float activations. `group_size` null: one scale per
  output channel; 16, 32, 64 or 128: one scale per group of that many inputs (GGUF Q8_0 is
  32, Q6_K 16).
- `W4A16`, `W4A16_AWQ`, `W4A16_GPTQ`: INT4 weights, asymmetric, per group of 32, 64 or 128
  inputs (default 128); float activations. AWQ / GPTQ say only where the weights came from.
- `FP8`: FP8 E4M3 weights with one scale per tensor; FP8 activations with one static
  (calibrated) scale per tensor.
- `FP8_PER_CHANNEL_PER_TOKEN`: FP8 E4M3 weights with one scale per output channel; FP8
  activations with a dynamic scale per token.

  What tells the two apart at run time is the activation scale (a checkpoint's `input_scale`
  or none); the weight scale's shape ([1] or [N], formats.py) is read from the tensor, so either
  algorithm runs weights of either granularity (examples/quantization/quantize.py writes all
  four combinations).
- `MIXED_PRECISION`: per layer, from `quantized_layers`.

`kv_cache_quant_algo` is `INT8` or `FP8` (1-byte codes; a K and a V scale per attention layer,
formats.py) or `null`.

Unlike TensorRT-LLM, which writes `group_size: 128` for every algorithm, `W8A16` reads its
`group_size` (`null` is per channel), so a per-channel INT8 checkpoint must say `null`.

`has_act_order` (INT4 only; not a TensorRT-LLM key) says each INT4 linear's weight holds its
inputs in another order, GPTQ's act-order (`desc_act`): the linear has a `weight_perm` (int64
[in_features], stored column j multiplies input perm[j]) and gathers its input by it first.

`MIXED_PRECISION` names each quantized layer (exact module names, or `fnmatch` patterns such
as `transformer.layers.*.mlp.fc`) in `quantized_layers`, each with its own `quant_algo` and
`group_size` (and `has_act_order`); a GGUF file whose layers are Q4_1 but whose tied embedding
is Q8_0 is one.

`check_device_support` is what a build calls with the target GPU: FP8 (weights or KV cache)
needs compute capability 8.9 or newer.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..errors import ConfigError


class QuantAlgo(str, Enum):
    """TensorRT-LLM's algorithm names (the value is the name, as configs spell it)."""
    W8A16 = "W8A16"
    W4A16 = "W4A16"
    W4A16_AWQ = "W4A16_AWQ"
    W4A8_AWQ = "W4A8_AWQ"
    W8A16_GPTQ = "W8A16_GPTQ"
    W4A16_GPTQ = "W4A16_GPTQ"
    W8A8_SQ_PER_CHANNEL = "W8A8_SQ_PER_CHANNEL"
    W8A8_SQ_PER_TENSOR_PLUGIN = "W8A8_SQ_PER_TENSOR_PLUGIN"
    W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN = "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN"
    W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN = "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN"
    W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN = "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN"
    W4A8_QSERVE_PER_GROUP = "W4A8_QSERVE_PER_GROUP"
    W4A8_QSERVE_PER_CHANNEL = "W4A8_QSERVE_PER_CHANNEL"
    FP8 = "FP8"
    FP8_PER_CHANNEL_PER_TOKEN = "FP8_PER_CHANNEL_PER_TOKEN"
    FP8_BLOCK_SCALES = "FP8_BLOCK_SCALES"
    INT8 = "INT8"
    MIXED_PRECISION = "MIXED_PRECISION"
    NVFP4 = "NVFP4"
    W4A8_MXFP4_FP8 = "W4A8_MXFP4_FP8"
    NO_QUANT = "NO_QUANT"

    def __str__(self) -> str:
        return self.value


# What this project implements.
INT8_WEIGHT_ALGOS = frozenset({QuantAlgo.W8A16})
INT4_WEIGHT_ALGOS = frozenset({QuantAlgo.W4A16, QuantAlgo.W4A16_AWQ, QuantAlgo.W4A16_GPTQ})
FP8_WEIGHT_ALGOS = frozenset({QuantAlgo.FP8, QuantAlgo.FP8_PER_CHANNEL_PER_TOKEN})
LAYER_ALGOS = INT8_WEIGHT_ALGOS | INT4_WEIGHT_ALGOS | FP8_WEIGHT_ALGOS
WEIGHT_ALGOS = LAYER_ALGOS | {QuantAlgo.MIXED_PRECISION}
KV_CACHE_ALGOS = frozenset({QuantAlgo.INT8, QuantAlgo.FP8})

INT4_GROUP_SIZES = (32, 64, 128)
INT8_GROUP_SIZES = (16, 32, 64, 128)
DEFAULT_GROUP_SIZE = 128

# Keys of TensorRT-LLM's QuantConfig that only its other algorithms read: accepted, ignored.
_IGNORED_KEYS = frozenset({"smoothquant_val", "clamp_val", "use_meta_recipe", "sq_use_plugin"})
_KEYS = frozenset({"quant_algo", "kv_cache_quant_algo", "group_size", "has_zero_point",
                   "pre_quant_scale", "has_act_order", "exclude_modules", "quantized_layers"})
_LAYER_KEYS = frozenset({"quant_algo", "group_size", "has_zero_point", "has_act_order"})

FP8_MIN_CAPABILITY = (8, 9)


def _names(algos) -> str:
    return ", ".join(sorted(a.value for a in algos))


def parse_algo(value: Any, key: str = "quant_algo", allowed=WEIGHT_ALGOS) -> QuantAlgo | None:
    """`value` (a name, a QuantAlgo or None/"NO_QUANT") as a QuantAlgo of `allowed`, or None."""
    if value is None:
        return None
    if isinstance(value, QuantAlgo):
        algo = value
    elif isinstance(value, str) and value.upper() in QuantAlgo.__members__:
        algo = QuantAlgo[value.upper()]
    else:
        raise ConfigError(f"quantization.{key} {value!r} is not a quantization algorithm; "
                          f"supported: {_names(allowed)}")
    if algo == QuantAlgo.NO_QUANT:
        return None
    if algo not in allowed:
        raise ConfigError(f"quantization.{key} {algo.value} is not supported by this project; "
                          f"supported: {_names(allowed)}")
    return algo


def _check_group_size(algo: QuantAlgo | None, group_size: Any, where: str) -> int | None:
    """The group size `algo` uses (None: per channel / not grouped), checked."""
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)):
        raise ConfigError(f"{where}.group_size must be an integer or null, got {group_size!r}")
    if algo in INT4_WEIGHT_ALGOS:
        if group_size == -1:
            raise ConfigError(f"{where}.group_size -1 (per channel) is not an INT4 group size: per-channel "
                              f"INT4 is stored in groups of {', '.join(map(str, INT4_GROUP_SIZES))}, each "
                              "group repeating the channel's scale (the GPTQ loader does this)")
        if group_size is None:
            group_size = DEFAULT_GROUP_SIZE
        if group_size not in INT4_GROUP_SIZES:
            raise ConfigError(f"{where}.group_size {group_size} is not supported for {algo.value}; "
                              f"choose {', '.join(map(str, INT4_GROUP_SIZES))}")
        return group_size
    if algo in INT8_WEIGHT_ALGOS:
        if group_size == -1:  # GPTQ's spelling of "one group per output channel"
            group_size = None
        if group_size is not None and group_size not in INT8_GROUP_SIZES:
            raise ConfigError(f"{where}.group_size {group_size} is not supported for {algo.value}; "
                              f"choose null (per channel) or {', '.join(map(str, INT8_GROUP_SIZES))}")
        return group_size
    return None  # FP8, no quantization: not grouped


def _check_act_order(algo: QuantAlgo | None, value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.has_act_order must be true or false, got {value!r}")
    if value and algo not in INT4_WEIGHT_ALGOS:
        raise ConfigError(f"{where}.has_act_order is true, but only INT4 weights ({_names(INT4_WEIGHT_ALGOS)}) "
                          f"have an input permutation, not {algo}"
                          + ("; under MIXED_PRECISION each layer says it" if algo == QuantAlgo.MIXED_PRECISION else ""))
    return value


@dataclass(frozen=True)
class LayerQuant:
    """How one linear layer's weight is quantized: the algorithm, its group size, and whether
    its INT4 weight holds its inputs in another order (GPTQ act-order: `weight_perm`)."""
    quant_algo: QuantAlgo
    group_size: int | None = None
    has_act_order: bool = False

    @property
    def weight_format(self) -> str:
        """"int8", "int4" or "fp8": the internal weight format (formats.py) of this layer."""
        if self.quant_algo in INT8_WEIGHT_ALGOS:
            return "int8"
        if self.quant_algo in INT4_WEIGHT_ALGOS:
            return "int4"
        return "fp8"

    @property
    def static_activation_scale(self) -> bool:
        """FP8 with one calibrated activation scale per tensor (the checkpoint holds it)."""
        return self.quant_algo == QuantAlgo.FP8

    def to_dict(self) -> dict:
        out = {"quant_algo": self.quant_algo.value, "group_size": self.group_size}
        if self.has_act_order:
            out["has_act_order"] = True
        return out


def _layer_from_dict(d: Any, where: str) -> LayerQuant:
    if not isinstance(d, dict):
        raise ConfigError(f"{where} must be an object with quant_algo and group_size, got {type(d).__name__}")
    unknown = sorted(set(d) - _LAYER_KEYS)
    if unknown:
        raise ConfigError(f"{where} has unknown key {unknown[0]!r}; known: {', '.join(sorted(_LAYER_KEYS))}")
    algo = parse_algo(d.get("quant_algo"), f"{where.removeprefix('quantization.')}.quant_algo", LAYER_ALGOS)
    if algo is None:
        raise ConfigError(f"{where}.quant_algo is missing; choose one of {_names(LAYER_ALGOS)}")
    return LayerQuant(algo, _check_group_size(algo, d.get("group_size"), where),
                      _check_act_order(algo, d.get("has_act_order", False), where))


@dataclass
class QuantConfig:
    """A checkpoint's `quantization` section (see the module docstring)."""
    quant_algo: QuantAlgo | None = None
    kv_cache_quant_algo: QuantAlgo | None = None
    group_size: int | None = None
    has_zero_point: bool = False
    pre_quant_scale: bool = False
    has_act_order: bool = False
    exclude_modules: list[str] | None = None
    quantized_layers: dict[str, LayerQuant] = field(default_factory=dict)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        self.quant_algo = parse_algo(self.quant_algo)
        self.kv_cache_quant_algo = parse_algo(self.kv_cache_quant_algo, "kv_cache_quant_algo", KV_CACHE_ALGOS)
        self.group_size = _check_group_size(self.quant_algo, self.group_size, "quantization")
        for key in ("has_zero_point", "pre_quant_scale"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"quantization.{key} must be true or false, got {getattr(self, key)!r}")
        self.has_act_order = _check_act_order(self.quant_algo, self.has_act_order, "quantization")
        if self.pre_quant_scale:
            raise ConfigError("quantization.pre_quant_scale true (an activation scale before each AWQ "
                              "linear) is not supported; fold the scales into the previous layer, as "
                              "AutoAWQ checkpoints do")
        if self.exclude_modules is not None and (
                not isinstance(self.exclude_modules, list)
                or not all(isinstance(m, str) for m in self.exclude_modules)):
            raise ConfigError(f"quantization.exclude_modules must be a list of module names or patterns, "
                              f"got {self.exclude_modules!r}")
        if not isinstance(self.quantized_layers, dict):
            raise ConfigError("quantization.quantized_layers must be an object of module name -> "
                              f"{{quant_algo, group_size}}, got {type(self.quantized_layers).__name__}")
        layers = {}
        for name, spec in self.quantized_layers.items():
            where = f"quantization.quantized_layers[{name!r}]"
            if isinstance(spec, LayerQuant):
                spec = spec.to_dict()
            layers[name] = _layer_from_dict(spec, where)
        self.quantized_layers = layers
        if self.quant_algo == QuantAlgo.MIXED_PRECISION and not layers:
            raise ConfigError("quantization.quant_algo MIXED_PRECISION needs quantized_layers "
                              "(module name -> {quant_algo, group_size})")
        if layers and self.quant_algo != QuantAlgo.MIXED_PRECISION:
            raise ConfigError("quantization.quantized_layers is read only with quant_algo MIXED_PRECISION, "
                              f"not {self.quant_algo}")

    # ------------------------------------------------------------------ reading / writing

    @classmethod
    def from_dict(cls, d: dict | None) -> QuantConfig:
        """A `quantization` section (None or {} is no quantization)."""
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ConfigError(f"quantization must be an object, got {type(d).__name__}")
        unknown = sorted(set(d) - _KEYS - _IGNORED_KEYS)
        if unknown:
            raise ConfigError(f"quantization has unknown key {unknown[0]!r}; known: {', '.join(sorted(_KEYS))}")
        return cls(**{k: v for k, v in d.items() if k in _KEYS and not (k == "quantized_layers" and v is None)})

    def to_dict(self) -> dict:
        out = {
            "quant_algo": self.quant_algo.value if self.quant_algo else None,
            "kv_cache_quant_algo": self.kv_cache_quant_algo.value if self.kv_cache_quant_algo else None,
            "group_size": self.group_size,
            "has_zero_point": self.has_zero_point,
            "pre_quant_scale": self.pre_quant_scale,
            **({"has_act_order": True} if self.has_act_order else {}),
            "exclude_modules": list(self.exclude_modules) if self.exclude_modules is not None else None,
        }
        if self.quantized_layers:
            out["quantized_layers"] = {name: spec.to_dict() for name, spec in self.quantized_layers.items()}
        return out

    # ------------------------------------------------------------------ questions

    @property
    def quantizes_weights(self) -> bool:
        return self.quant_algo is not None

    @property
    def quantizes_kv_cache(self) -> bool:
        return self.kv_cache_quant_algo is not None

    def layer(self, module_name: str) -> LayerQuant | None:
        """How the linear layer `module_name` (e.g. `transformer.layers.0.attention.qkv`) is
        quantized, or None if its weight stays in float (no algorithm, excluded, or not listed
        under MIXED_PRECISION). Excludes and layer keys match exactly or as fnmatch patterns."""
        if self.quant_algo is None:
            return None
        if any(name == module_name or fnmatch.fnmatchcase(module_name, name) for name in self.exclude_modules or ()):
            return None
        if self.quant_algo == QuantAlgo.MIXED_PRECISION:
            if module_name in self.quantized_layers:
                return self.quantized_layers[module_name]
            for pattern, spec in self.quantized_layers.items():
                if fnmatch.fnmatchcase(module_name, pattern):
                    return spec
            return None
        return LayerQuant(self.quant_algo, self.group_size, self.has_act_order)

    def layer_algos(self) -> set[QuantAlgo]:
        """Every per-layer algorithm the config can use."""
        if self.quant_algo is None:
            return set()
        if self.quant_algo == QuantAlgo.MIXED_PRECISION:
            return {spec.quant_algo for spec in self.quantized_layers.values()}
        return {self.quant_algo}

    def summary(self) -> str:
        """One line for a converter's report: the algorithm, group size and act-order; under
        MIXED_PRECISION each distinct layer setting with how many entries name it."""
        def details(group, act_order):
            return ([f"group {group}"] if group else []) + (["act-order"] if act_order else [])
        if self.quant_algo != QuantAlgo.MIXED_PRECISION:
            return ", ".join([self.quant_algo.value, *details(self.group_size, self.has_act_order)])
        counts: dict[LayerQuant, int] = {}
        for spec in self.quantized_layers.values():
            counts[spec] = counts.get(spec, 0) + 1
        parts = []
        for spec, n in counts.items():
            more = details(spec.group_size, spec.has_act_order)
            parts.append(f"{n} x {spec.quant_algo.value}" + (f" ({', '.join(more)})" if more else ""))
        return "MIXED_PRECISION: " + ", ".join(parts)

    def uses_fp8(self) -> bool:
        return bool(self.layer_algos() & FP8_WEIGHT_ALGOS) or self.kv_cache_quant_algo == QuantAlgo.FP8


def check_device_support(config: QuantConfig, device: str = "cuda",
                         capability: tuple[int, int] | None = None) -> None:
    """Refuse, with the reason, a quantization the target cannot run.

    `device` is "cpu" or "cuda"; for "cuda", `capability` is the GPU's (major, minor) compute
    capability (torch.cuda.get_device_capability()). FP8 weights, activations or KV cache need
    8.9 or newer (Ada, Hopper and later): the E4M3 tensor-core and conversion instructions
    start there. The CPU runs every format (FP8 through the float reference)."""
    if device == "cpu" or not config.uses_fp8():
        return
    if capability is None:
        raise ConfigError("FP8 quantization needs the GPU's compute capability to be checked; none was given")
    if tuple(capability) < FP8_MIN_CAPABILITY:
        what = [str(a) for a in sorted(config.layer_algos() & FP8_WEIGHT_ALGOS, key=str)]
        if config.kv_cache_quant_algo == QuantAlgo.FP8:
            what.append("FP8 KV cache")
        raise ConfigError(f"{' and '.join(what)} needs a GPU of compute capability 8.9 or newer (Ada, Hopper); "
                          f"this GPU is sm_{capability[0]}{capability[1]}: use W8A16/W4A16 weights and an "
                          f"INT8 KV cache instead")
