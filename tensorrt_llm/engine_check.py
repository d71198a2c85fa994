"""What an engine file may hold: the grammar its graph must follow and the checks of its
configuration, applied when an engine is loaded (builder.Engine.from_dir), before anything
of it runs.

An engine may come from a stranger (docs/security.md). Its checksum lives in the same file,
so whoever edits the file can recompute it: the checks here assume nothing the file says is
honest. They refuse, with one `EngineError` naming the offending field:

- a graph that is not exactly the structure `Network.to_dict` writes;
- a name (network, tensor, layer, input, output, weight, dim range) outside `NAME_PATTERN`;
- an op outside the closed set the runtime implements (`ops.OPS`), an attribute key the op
  does not take, an attribute value that is not a plain JSON scalar or a flat list of
  numbers, an `implementation` that is not one of `IMPLEMENTATION_NAMES`, an unknown dtype,
  a layer input that no input or earlier layer defines, a tensor made twice;
- a configuration (the engine's copy, and config.json beside it) of the wrong shape or
  types, and one that disagrees with the graph where the runtime relies on both agreeing
  (KV-cache pool layout, vocabulary, position tables, limits), so that a lie in a config
  cannot reach a kernel as an out-of-range index.

The attributes each op takes are not listed by hand: they are the keyword-only parameters
of the op's reference (`op_signatures()`), which is what `Session` calls with a layer's
attrs. The checks are linear in the size of the graph (milliseconds for an
8B network).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import re
from typing import Any, NamedTuple, Optional

from ._utils import _STR_TO_TORCH
from .build_config import BuildConfig
from .errors import ConfigError, EngineError
from .kv_cache_layout import KVCacheLayout, blocks_for_tokens
from .models import MODEL_MAP  # noqa: F401  (registers the known architectures)
from .models.modeling_utils import PretrainedConfig
from .network import JSON_FORMAT, JSON_VERSION, Network, net_guard
from .ops import IMPLEMENTATION_ATTR, IMPLEMENTATIONS, OPS
from .ops.quantized_linear import WEIGHT_ONLY_OPS

# Letters, digits and `_ . : / - [ ]`: every name the builder makes (module paths such as
# transformer/layers/0/attention/gpt_attention_12, weights such as
# transformer.layers.0.mlp.gate_up.weight) and nothing that quotes, escapes or spaces.
NAME_PATTERN = r"[A-Za-z0-9_.:/\[\]-]{1,256}"
_NAME = re.compile(NAME_PATTERN, re.ASCII)
DTYPES = frozenset(_STR_TO_TORCH)
MAX_RANK = 16
MAX_LIST_ATTR = 4096

GRAPH_KEYS = ("format", "version", "name", "inputs", "tensors", "layers", "outputs", "debug_outputs", "weights")
INPUT_KEYS = ("name", "dtype", "shape", "dim_range")
SPEC_KEYS = ("dtype", "shape")
LAYER_KEYS = ("name", "op", "inputs", "outputs", "attrs")
# Every implementation name an engine may record in attrs["implementation"] (ops register
# their implementations under these names); any other is refused at load.
IMPLEMENTATION_NAMES = frozenset(IMPLEMENTATIONS)


class OpSignature(NamedTuple):
    """What a layer of one op may carry: attribute keys (all, and those without a default)
    and how many inputs (None: no upper bound)."""
    attrs: frozenset
    required_attrs: frozenset
    min_inputs: int
    max_inputs: Optional[int]


@functools.cache
def op_signatures() -> dict[str, OpSignature]:
    """op -> OpSignature for every op the runtime runs, derived from the op definitions:
    a layer's attrs are passed to the op's reference as keywords and its inputs as
    positional arguments, so the keyword-only parameters are the attributes and the others
    the inputs. A reference that is a torch builtin (no inspectable signature) takes no
    attributes, and as many inputs as the op's graph function has parameters."""

    table = {"constant": OpSignature(frozenset({"weight"}), frozenset({"weight"}), 0, 0)}
    for op, definition in OPS.items():
        fn = definition.reference
        if fn is None:
            continue
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            n = len(definition.signature.parameters)
            table[op] = OpSignature(frozenset(), frozenset(), n, n)
            continue
        keyword = [p for p in params if p.kind is p.KEYWORD_ONLY]
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
        table[op] = OpSignature(
            attrs=frozenset(p.name for p in keyword),
            required_attrs=frozenset(p.name for p in keyword if p.default is p.empty),
            min_inputs=sum(1 for p in positional if p.default is p.empty) + (1 if variadic else 0),
            max_inputs=None if variadic else len(positional))
    return table


def _show(value: Any) -> str:
    """A value from the file as it may appear in a one-line message: repr'd, shortened."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Refusal(Exception):
    pass


def _refuse(problem: str):
    raise _Refusal(problem)


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        _refuse(f"{what} {_show(value)} is not a valid name (letters, digits and _ . : / - [ ], "
                f"at most 256)")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_dtype(value: Any, what: str) -> str:
    if not isinstance(value, str) or value not in DTYPES:
        _refuse(f"{what} has dtype {_show(value)}, not one of {sorted(DTYPES)}")
    return value


def _check_shape(value: Any, what: str, dynamic: bool = True) -> list:
    lowest = -1 if dynamic else 0
    if (not isinstance(value, list) or len(value) > MAX_RANK
            or not all(_is_int(d) and d >= lowest for d in value)):
        _refuse(f"{what} has shape {_show(value)}, not a list of at most {MAX_RANK} dims >= {lowest}")
    return value


def _check_keys(entry: Any, keys: tuple, what: str) -> dict:
    if not isinstance(entry, dict):
        _refuse(f"{what} is {type(entry).__name__}, not an object")
    if set(entry) != set(keys):
        extra = sorted(set(entry) - set(keys), key=str)
        missing = sorted(set(keys) - set(entry))
        _refuse(f"{what} has " + (f"unknown field(s) {_show(extra)}" if extra else f"no {_show(missing)}"))
    return entry


def _check_list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        _refuse(f"{what} is {type(value).__name__}, not a list")
    return value


def _check_attr_value(value: Any, what: str) -> None:
    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            _refuse(f"{what} is {_show(value)}, not a finite number")
        return
    if isinstance(value, str):
        _check_name(value, what)
        return
    if isinstance(value, list) and len(value) <= MAX_LIST_ATTR:
        for item in value:
            if not (item is None or isinstance(item, (bool, int)) or (isinstance(item, float) and math.isfinite(item))):
                _refuse(f"{what} holds {_show(item)}: a list attribute holds numbers only")
        return
    _refuse(f"{what} is {_show(value)}: attributes are null, booleans, numbers, names or lists of numbers")


def _check_layer(index: int, entry: Any, defined: set, produced: set, spec_of: dict, weights: dict,
                 layer_names: set, signatures: dict, implementations: frozenset) -> None:
    _check_keys(entry, LAYER_KEYS, f"layer {index}")
    name = _check_name(entry["name"], f"layer {index}'s name")
    if name in layer_names:
        _refuse(f"layer name {_show(name)} is used twice")
    layer_names.add(name)
    where = f"layer {_show(name)}"
    op = entry["op"]
    if not isinstance(op, str) or op not in signatures:
        _refuse(f"{where} has op {_show(op)}, which is not an op of this runtime")
    sig = signatures[op]
    inputs = _check_list(entry["inputs"], f"{where}'s inputs")
    if len(inputs) < sig.min_inputs or (sig.max_inputs is not None and len(inputs) > sig.max_inputs):
        most = "any number" if sig.max_inputs is None else sig.max_inputs
        _refuse(f"{where} ({op}) has {len(inputs)} inputs; {op} takes {sig.min_inputs} to {most}")
    for t in inputs:
        if t is None:
            continue
        _check_name(t, f"{where}'s input")
        if t not in defined:
            _refuse(f"{where} reads tensor {_show(t)}, which no input or earlier layer defines")
    outputs = _check_list(entry["outputs"], f"{where}'s outputs")
    if not outputs:
        _refuse(f"{where} has no outputs")
    for t in outputs:
        _check_name(t, f"{where}'s output")
        if t in defined:
            _refuse(f"{where} makes tensor {_show(t)}, which is already defined")
        if t not in spec_of:
            _refuse(f"{where} makes tensor {_show(t)}, which the graph's tensor list lacks")
        defined.add(t)
        produced.add(t)
    attrs = entry["attrs"]
    if not isinstance(attrs, dict):
        _refuse(f"{where}'s attrs are {type(attrs).__name__}, not an object")
    for key, value in attrs.items():
        if key == IMPLEMENTATION_ATTR and op != "constant":
            if not isinstance(value, str) or value not in implementations:
                _refuse(f"{where} ({op}) names implementation {_show(value)}, not one of "
                        f"{sorted(implementations)}")
            continue
        if key not in sig.attrs:
            takes = ", ".join(sorted(sig.attrs)) or "none"
            _refuse(f"{where} has attribute {_show(key)}, which op {op} does not take (it takes: {takes})")
        _check_attr_value(value, f"{where}'s attribute {key}")
    missing = sig.required_attrs - set(attrs)
    if missing:
        _refuse(f"{where} ({op}) lacks attribute(s) {', '.join(sorted(missing))}")
    if op == "constant":
        weight = _check_name(attrs["weight"], f"{where}'s weight")
        if weight not in weights:
            _refuse(f"{where} reads weight {_show(weight)}, which the graph's weight list lacks")
        if len(outputs) != 1 or spec_of[outputs[0]] != weights[weight]:
            _refuse(f"{where}: its output does not have weight {_show(weight)}'s dtype and shape")
    elif op == "cast":
        _check_dtype(attrs["dtype"], f"{where}'s attribute dtype")


def check_graph(data: Any, where: str) -> None:
    """Refuse (EngineError naming `where` and the field) a graph, as parsed from an engine
    file's JSON, that does not follow the grammar above."""
    try:
        _check_graph(data)
    except _Refusal as e:
        raise EngineError(f"{where}: graph refused: {e}; do not use this engine, rebuild it "
                          f"from a trusted checkpoint") from None


def _check_graph(data: Any) -> None:
    _check_keys(data, GRAPH_KEYS, "the graph")
    if data["format"] != JSON_FORMAT or data["version"] != JSON_VERSION:
        _refuse(f"format {_show(data['format'])} version {_show(data['version'])} is not "
                f"{JSON_FORMAT} version {JSON_VERSION}")
    _check_name(data["name"], "the network name")
    signatures = op_signatures()
    spec_of: dict[str, tuple] = {}
    defined: set[str] = set()
    for i, entry in enumerate(_check_list(data["inputs"], "the inputs")):
        _check_keys(entry, INPUT_KEYS, f"input {i}")
        name = _check_name(entry["name"], f"input {i}'s name")
        if name in defined:
            _refuse(f"input {_show(name)} is declared twice")
        what = f"input {_show(name)}"
        spec_of[name] = (_check_dtype(entry["dtype"], what), _check_shape(entry["shape"], what))
        for r in _check_list(entry["dim_range"], f"{what}'s dim_range"):
            if not (isinstance(r, list) and len(r) == 3 and _is_int(r[0]) and isinstance(r[2], list)
                    and len(r[2]) == 3 and all(_is_int(v) for v in r[2])):
                _refuse(f"{what} has dim_range entry {_show(r)}, not [axis, name, [min, opt, max]]")
            _check_name(r[1], f"{what}'s dim_range name")
        defined.add(name)
    tensors = data["tensors"]
    if not isinstance(tensors, dict):
        _refuse("the tensor list is not an object")
    for name, spec in tensors.items():
        _check_name(name, "tensor")
        if name in spec_of:
            _refuse(f"tensor {_show(name)} is declared twice")
        what = f"tensor {_show(name)}"
        _check_keys(spec, SPEC_KEYS, what)
        spec_of[name] = (_check_dtype(spec["dtype"], what), _check_shape(spec["shape"], what))
    weights = data["weights"]
    if not isinstance(weights, dict):
        _refuse("the weight list is not an object")
    weight_specs = {}
    for name, spec in weights.items():
        what = f"weight {_show(_check_name(name, 'weight'))}"
        _check_keys(spec, SPEC_KEYS, what)
        weight_specs[name] = (_check_dtype(spec["dtype"], what), _check_shape(spec["shape"], what, dynamic=False))
    produced: set[str] = set()
    layer_names: set[str] = set()
    for i, entry in enumerate(_check_list(data["layers"], "the layers")):
        _check_layer(i, entry, defined, produced, spec_of, weight_specs, layer_names, signatures,
                     IMPLEMENTATION_NAMES)
    for key in ("outputs", "debug_outputs"):
        seen = set()
        for name in _check_list(data[key], f"the {key}"):
            _check_name(name, f"{key[:-1].replace('_', ' ')}")
            if name not in defined:
                _refuse(f"{key[:-1].replace('_', ' ')} {_show(name)} is no input or layer output")
            if name in seen:
                _refuse(f"{key[:-1].replace('_', ' ')} {_show(name)} is listed twice")
            seen.add(name)


# ---- configurations -----------------------------------------------------------------------


def _build_config_field_types() -> dict[str, tuple]:
    """BuildConfig field -> the JSON type of its resolved value, from the field annotations."""
    kinds = {"int": (int,), "Optional[int]": (int,), "str": (str,), "list": (list,)}
    return {f.name: kinds[str(f.type)] for f in dataclasses.fields(BuildConfig)}


def check_engine_config(config: Any, where: str) -> tuple[dict, dict]:
    """The pretrained and build config of an engine (config.json's or the engine file's
    copy), refused with EngineError naming the field when malformed. Returns both dicts."""

    if not isinstance(config, dict):
        raise EngineError(f"{where} is a JSON {type(config).__name__}, not an object; "
                          f"restore the engine's config.json or rebuild the engine")
    parts = []
    for key in ("pretrained_config", "build_config"):
        part = config.get(key)
        if not isinstance(part, dict):
            raise EngineError(f"{where}: {key} is {'missing' if part is None else type(part).__name__}, "
                              f"not an object; restore the engine's config.json or rebuild the engine")
        parts.append(part)
    pretrained, build = parts
    try:
        normal = PretrainedConfig.from_dict(pretrained).to_dict()
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise EngineError(f"{where}: pretrained_config is malformed ({' '.join(str(e).split())}); "
                          f"restore the engine's config.json or rebuild the engine") from None
    # The builder writes every field (to_dict()); the runtime reads them without defaults.
    unlike = config_differences(normal, pretrained)
    if unlike:
        raise EngineError(f"{where}: pretrained_config is not as the builder writes it "
                          f"({', '.join(unlike[:4])}); restore the engine's config.json or rebuild the engine")
    types = _build_config_field_types()
    for name, value in build.items():
        if name not in types:
            raise EngineError(f"{where}: build_config has unknown field {_show(name)}; restore the "
                              f"engine's config.json or rebuild the engine")
        if isinstance(value, bool) or not isinstance(value, types[name]):
            raise EngineError(f"{where}: build_config.{name} is {_show(value)}, not of type "
                              f"{types[name][0].__name__}; restore the engine's config.json or rebuild the engine")
    missing = sorted(set(types) - set(build))
    if missing:
        raise EngineError(f"{where}: build_config lacks {', '.join(missing)}; restore the engine's "
                          f"config.json or rebuild the engine")
    if not all(isinstance(p, str) for p in build["optimizations"]):
        raise EngineError(f"{where}: build_config.optimizations holds a non-string; restore the "
                          f"engine's config.json or rebuild the engine")
    try:
        bc = BuildConfig.from_dict(build)
    except (ValueError, TypeError) as e:
        raise EngineError(f"{where}: build_config is malformed ({' '.join(str(e).split())}); "
                          f"restore the engine's config.json or rebuild the engine") from None
    if bc.max_seq_len < 1 or bc.max_num_tokens < 1 or bc.max_input_len > bc.max_seq_len:
        raise EngineError(f"{where}: build_config limits are inconsistent (max_input_len "
                          f"{bc.max_input_len}, max_seq_len {bc.max_seq_len}, max_num_tokens "
                          f"{bc.max_num_tokens}); restore the engine's config.json or rebuild the engine")
    return pretrained, build


def _flatten(value: Any, prefix: str, out: dict) -> dict:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = value
    return out


def config_differences(theirs: dict, ours: dict) -> list[str]:
    """Dotted paths of the fields where two configs differ (a missing field differs)."""
    a, b = _flatten(theirs, "", {}), _flatten(ours, "", {})
    return [k for k in sorted(set(a) | set(b))
            if k not in a or k not in b or json.dumps(a[k], sort_keys=True) != json.dumps(b[k], sort_keys=True)]


def check_config_matches_graph(pretrained: dict, build: dict, network, where: str, rank: int = 0) -> None:
    """Refuse an engine whose configuration disagrees with its graph where the runtime sizes
    buffers from the configuration and kernels index them with the graph's numbers (or the
    other way round): the KV-cache pool layout, the vocabulary, the position tables, the
    batch and token limits."""
    problems = []
    try:  # the layers of this rank's pipeline stage
        layout = KVCacheLayout.of_engine(pretrained, build["tokens_per_block"], rank=rank)
    except ConfigError as e:  # a rank outside the config's world
        raise EngineError(f"{where}: {e}; rebuild the engine") from None
    max_seq_len = build["max_seq_len"]
    tensors = network._tensors

    def shape(name):
        return tensors[name].shape if name is not None and name in tensors else None

    if network.is_input("kv_cache_pool"):
        spec = tensors["kv_cache_pool"]
        want = (layout.num_layers, -1, 2, layout.num_kv_heads, layout.tokens_per_block, layout.head_dim)
        if spec.shape != want or spec.dtype != layout.dtype_name:
            problems.append(f"input kv_cache_pool is {spec.dtype} {list(spec.shape)}, the config "
                            f"implies {layout.dtype_name} {list(want)}")
    vocab = pretrained["vocab_size"]
    tp = pretrained["mapping"]["tp_size"]
    quantized = PretrainedConfig.from_dict(pretrained).quant_config.quantizes_weights
    for layer in network.layers:
        a = layer.attrs
        if layer.op in WEIGHT_ONLY_OPS and not quantized:
            problems.append(f"layer {layer.name}: a weight-only quantized linear, but the config's "
                            f"quantization section quantizes no weights")
        elif layer.op in ("gpt_attention", "gpt_attention_fp8_linear"):  # the same attention inputs and attrs
            if not (_is_int(a["layer_idx"]) and 0 <= a["layer_idx"] < layout.num_layers):
                problems.append(f"layer {layer.name}: layer_idx {a['layer_idx']} is outside the "
                                f"{layout.num_layers} layers of the KV cache")
            for key, value in (("num_kv_heads", layout.num_kv_heads), ("head_dim", layout.head_dim),
                               ("tokens_per_block", layout.tokens_per_block)):
                if a[key] != value:
                    problems.append(f"layer {layer.name}: {key} {a[key]}, the config implies {value}")
            table = shape(layer.inputs[10]) if len(layer.inputs) > 10 else None
            if table is not None:
                problems += _rotary_problems(layer.name, table, a.get("rotary_dim", 0), a["head_dim"], max_seq_len)
        elif layer.op == "rotary_embedding":
            problems += _rotary_problems(layer.name, shape(layer.inputs[2]), a["rotary_dim"], a["head_dim"],
                                         max_seq_len)
        elif layer.op == "embedding":
            ids, rows = layer.inputs[0], (shape(layer.inputs[1]) or (None,))[0]
            # A vocabulary-parallel table (vocab_start) holds this rank's slice of the padded rows.
            want = -(-vocab // tp) if "vocab_start" in a else vocab
            if ids == "input_ids" and rows != want:
                problems.append(f"layer {layer.name}: the token embedding has {rows} rows, vocab_size "
                                f"is {vocab}" + (f" ({want} per rank of {tp})" if want != vocab else ""))
            elif ids == "position_ids" and (rows is None or rows < max_seq_len):
                problems.append(f"layer {layer.name}: the position embedding has {rows} rows, "
                                f"max_seq_len is {max_seq_len}")
    if "logits" in network.outputs:
        if tensors["logits"].shape[-1:] != (vocab,):
            problems.append(f"output logits has shape {list(tensors['logits'].shape)}, vocab_size is {vocab}")
    ranges = {name: network.dim_range(name) for name in ("input_ids", "block_tables") if network.is_input(name)}
    if "input_ids" in ranges and ranges["input_ids"].get(0, (None, (0, 0, 0)))[1][2] != build["max_num_tokens"]:
        problems.append(f"input input_ids allows {ranges['input_ids'].get(0, (None, (0, 0, None)))[1][2]} "
                        f"tokens, max_num_tokens is {build['max_num_tokens']}")
    if "block_tables" in ranges:
        rows = build["max_batch_size"] * build["max_beam_width"]
        blocks = blocks_for_tokens(max_seq_len, layout.tokens_per_block)
        got = tuple(ranges["block_tables"].get(axis, (None, (0, 0, None)))[1][2] for axis in (0, 1))
        if got != (rows, blocks):
            problems.append(f"input block_tables allows {list(got)}, the limits imply [{rows}, {blocks}] "
                            f"(max_batch_size x max_beam_width, max_seq_len / tokens_per_block)")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise EngineError(f"{where}: the engine's config disagrees with its graph: {problems[0]}{more}; "
                          f"do not use this engine, rebuild it")


def _rotary_problems(layer: str, table: Optional[tuple], rotary_dim: int, head_dim: int, max_seq_len: int) -> list:
    if table is None or len(table) != 2:
        return [f"layer {layer}: the rotary table is not [positions, rotary_dim]"]
    rows, width = table
    problems = []
    if rows < max_seq_len:
        problems.append(f"layer {layer}: the rotary table has {rows} positions, max_seq_len is {max_seq_len}")
    if not (_is_int(rotary_dim) and _is_int(head_dim) and width == rotary_dim and 0 < rotary_dim <= head_dim
            and rotary_dim % 2 == 0):
        problems.append(f"layer {layer}: rotary_dim {rotary_dim} does not fit the table [{rows}, {width}] "
                        f"and head_dim {head_dim}")
    return problems


# ---- shapes ---------------------------------------------------------------------------------


def check_shapes(network, where: str) -> None:
    """Refuse an engine whose recorded tensor shapes are not what its ops make of their inputs.

    Every layer is replayed, in a scratch network, through its op's own definition in
    `ops` (the shape rules and argument checks the builder ran), on the shapes the
    replay itself inferred for its inputs. An attribute or shape the file changed (a view to
    another size, an eps that is a string, a weight of another shape) then fails here, naming
    the layer, instead of inside a kernel. Errors of any type raised by the replay are the
    file's: the replay runs our shape rules on values a stranger chose."""

    scratch = Network("replay")
    handles = {}
    # Each named dynamic dim takes its own size (distinct primes), so that reading a tensor
    # of `batch_size` rows where one of `num_tokens` rows belongs is a shape error here,
    # not a wrong read later; a -1 in a recorded shape then matches any size.
    sizes: dict[str, int] = {}
    for name in network.input_names:
        spec = network._tensors[name]
        shape = list(spec.shape)
        for axis, (dim_name, _) in network.dim_range(name).items():
            if 0 <= axis < len(shape) and shape[axis] == -1:
                shape[axis] = sizes.setdefault(dim_name, _PRIMES[len(sizes) % len(_PRIMES)])
        handles[name] = scratch._wrap(scratch._add_spec(name, spec.dtype, shape))
    with net_guard(scratch):
        for layer in network.layers:
            recorded = [network._tensors[o] for o in layer.outputs]
            if layer.op == "constant":
                spec = recorded[0]
                handles[spec.name] = scratch._wrap(scratch._add_spec(spec.name, spec.dtype, spec.shape))
                continue
            # The builder's kernel choice is not an argument of the op.
            attrs = {k: v for k, v in layer.attrs.items() if k != IMPLEMENTATION_ATTR}
            try:
                args = [None if n is None else handles[n] for n in layer.inputs]
                out = _replay(OPS[layer.op], args, attrs)
            except Exception as e:  # noqa: BLE001 - see the docstring
                raise EngineError(f"{where}: layer {_show(layer.name)} ({layer.op}) does not hold together: "
                                  f"{' '.join(str(e).split())[:200]}; do not use this engine, rebuild it") from None
            # The op records its attributes in normal form (an int dim, a float eps): one the
            # file wrote otherwise (a bool dim, an int eps) is not what the op would run.
            made = scratch._layers[-1].attrs
            if json.dumps(made, sort_keys=True) != json.dumps(attrs, sort_keys=True):
                key = next((k for k in sorted(set(made) | set(attrs))
                            if json.dumps(made.get(k)) != json.dumps(attrs.get(k))), "?")
                raise EngineError(f"{where}: layer {_show(layer.name)} ({layer.op}) has attribute {key} = "
                                  f"{_show(attrs.get(key))}, which the op records as {_show(made.get(key))}; "
                                  f"do not use this engine, rebuild it")
            outs = out if isinstance(out, tuple) else (out,)
            if len(outs) != len(recorded) or not all(_spec_matches(o, r) for o, r in zip(outs, recorded)):
                got = [[o.dtype, list(o.shape)] for o in outs]
                want = [[r.dtype, list(r.shape)] for r in recorded]
                raise EngineError(f"{where}: layer {_show(layer.name)} ({layer.op}) records outputs {want} "
                                  f"but makes {got} of its inputs; do not use this engine, rebuild it")
            for r, o in zip(recorded, outs):
                handles[r.name] = o
    # The runtime reads one row of logits per entry of last_token_ids.
    if "logits" in network.outputs and "last_token_ids" in handles:
        rows, asked = handles["logits"].shape[:1], handles["last_token_ids"].shape[:1]
        if rows != asked:
            raise EngineError(f"{where}: output logits has {_show(rows)} rows where last_token_ids asks for "
                              f"{_show(asked)}; do not use this engine, rebuild it")


_PRIMES = (101, 103, 107, 109, 113, 127, 131, 137, 139, 149)


# ---- indices the file holds -----------------------------------------------------------------

# op -> (the input that indexes, the input it indexes; along attrs["dim"], or the last dim when
# the op has none): layers whose index is a weight read memory at positions the file chose. A
# weight-only linear's index is an INT4 act-order weight's input order (`perm`, its last input).
_INDEXING_OPS = {"index_select": (1, 0), "gather": (2, 0), **{op: (at + 4, 0) for op, at in WEIGHT_ONLY_OPS.items()}}


def check_constant_indices(network, where: str) -> None:
    """Refuse an engine whose weights index out of range (constant_index_problem)."""
    problem = constant_index_problem(network)
    if problem is not None:
        raise EngineError(f"{where}: {problem}; do not use this engine, rebuild it")


def constant_index_problem(network) -> Optional[str]:
    """Every index_select / gather and act-order weight-only linear whose index is a weight must
    index within the fixed size of the indexed dimension, and a weight-only linear's perm must
    be a weight (its GEMV gathers by it unchecked): the first layer that does not, said, or None.
    A CUDA gather past its tensor is not an error but a fault that ends the process, or a silent
    read."""
    tensors = network._tensors
    for layer in network.layers:
        if layer.op not in _INDEXING_OPS:
            continue
        at, of = _INDEXING_OPS[layer.op]
        name = layer.inputs[at] if at < len(layer.inputs) else None
        if name is None:
            continue
        parent = network.producer(name)
        if parent is None or parent.op != "constant":
            if layer.op in WEIGHT_ONLY_OPS:
                return f"layer {_show(layer.name)} ({layer.op}): its perm is not a weight of the engine"
            continue
        index = network.weights[parent.attrs["weight"]]
        size = tensors[layer.inputs[of]].shape[layer.attrs.get("dim", -1)]
        if size < 0:
            problem = "indexes a dimension of no fixed size"
        elif index.numel() and not (int(index.min()) >= 0 and int(index.max()) < size):
            problem = f"holds indices {int(index.min())} .. {int(index.max())} into a dimension of size {size}"
        else:
            continue
        return f"layer {_show(layer.name)} ({layer.op}): its index {_show(parent.attrs['weight'])} {problem}"
    return None


def _spec_matches(made, recorded) -> bool:
    """A replayed tensor against the file's spec of it: same dtype and rank; each recorded
    dim equal, or -1 (dynamic) where the replay has a size."""
    return (made.dtype == recorded.dtype and len(made.shape) == len(recorded.shape)
            and all(r == m or r == -1 for m, r in zip(made.shape, recorded.shape)))


def _replay(fn, inputs: list, attrs: dict):
    """Call a functional op the way it made the layer: the layer's inputs fill, in order, the
    parameters its attributes do not name (concat takes them as one list)."""
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if params and params[0].name == "inputs":  # concat(inputs, dim)
        return fn(inputs, **attrs)
    kwargs = dict(attrs)
    pending = list(inputs)
    for p in params:
        if p.name not in attrs and pending:
            kwargs[p.name] = pending.pop(0)
    if pending:
        raise ValueError(f"{len(inputs)} inputs, more than the op takes")
    return fn(**kwargs)
