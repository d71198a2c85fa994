"""The graph: `Network`, `Layer`, `net_guard` and `default_net`.

A Network is plain data: named tensor specs (dtype string, shape with -1 for dynamic
dims), inputs with ranges for their dynamic dims, an ordered (topologically sorted) list
of layers whose inputs/outputs are tensor names and whose attrs are JSON values, output
and debug-output names, and `weights` (name -> torch.Tensor) read by `constant` layers.
Everything but the weight data round-trips through `to_json` / `from_json`.

Layers only change through Network methods, which keep the producer/consumer index
that graph rewriting relies on in step with the layers. `Tensor` is the handle on one
tensor; the op library (functional.py, the layer above) adds layers and gives handles their
operator forms: this module knows no op.
"""
from __future__ import annotations

import contextlib
import json
from typing import Iterable, Optional, Sequence

import torch

from ._utils import canonical_dtype, torch_dtype_to_str

JSON_FORMAT = "tensorrt_llm.network"
JSON_VERSION = 1


class TensorSpec:
    """The one record of a tensor in a network; every `Tensor` handle points at one."""
    __slots__ = ("name", "dtype", "shape")

    def __init__(self, name: str, dtype: str, shape: tuple[int, ...]):
        self.name = name
        self.dtype = dtype
        self.shape = shape


class Layer:
    """One op application. `inputs`/`outputs` are tensor names (None: absent optional input)."""
    __slots__ = ("name", "op", "_inputs", "_outputs", "attrs", "network", "removed")

    def __init__(self, name: str, op: str, inputs: Sequence[Optional[str]], outputs: Sequence[str],
                 attrs: dict, network: "Network"):
        self.name = name
        self.op = op
        self._inputs = tuple(inputs)
        self._outputs = tuple(outputs)
        self.attrs = attrs
        self.network = network
        self.removed = False  # marked by a rewrite; dropped by Network.remove_marked_layers()

    @property
    def inputs(self) -> tuple[Optional[str], ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[str, ...]:
        return self._outputs

    @property
    def type(self) -> str:
        return self.op

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def get_input(self, i: int) -> Optional[Tensor]:
        name = self._inputs[i]
        return None if name is None else self.network.get_tensor(name)

    def get_output(self, i: int) -> Tensor:
        return self.network.get_tensor(self._outputs[i])

    def get_inputs(self) -> list[Optional[Tensor]]:
        return [self.get_input(i) for i in range(len(self._inputs))]

    def get_outputs(self) -> list[Tensor]:
        return [self.get_output(i) for i in range(len(self._outputs))]

    def to_dict(self) -> dict:
        return {"name": self.name, "op": self.op, "inputs": list(self._inputs),
                "outputs": list(self._outputs), "attrs": self.attrs}

    def __repr__(self) -> str:
        removed = ", removed" if self.removed else ""
        return (f"Layer({self.name!r}, op={self.op!r}, inputs={list(self._inputs)}, "
                f"outputs={list(self._outputs)}{removed})")


def shapes_compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Same rank, and each dim equal or dynamic (-1) in either."""
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b))


class Tensor:
    """A handle on one tensor of a network. `Tensor(name=, dtype=, shape=, dim_range=)`
    declares an input of the default network, as in TensorRT-LLM. Handles are equal when
    they point at the same tensor. functional.py gives them their operators (`x + y`,
    `x.view(shape)`, ...)."""
    __slots__ = ("_spec", "network")

    def __init__(self, name: str, dtype, shape: Sequence[int], dim_range=None, network: Optional["Network"] = None):
        network = network or default_net()
        self._spec = network.add_input(name, dtype, shape, dim_range)._spec
        self.network = network

    @classmethod
    def _from_spec(cls, spec: TensorSpec, network: "Network") -> Tensor:
        t = cls.__new__(cls)
        t._spec = spec
        t.network = network
        return t

    @property
    def name(self) -> str:
        return self._spec.name

    @name.setter
    def name(self, new: str) -> None:
        self.network.rename_tensor(self._spec.name, new)

    @property
    def dtype(self) -> str:
        return self._spec.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._spec.shape

    @property
    def ndim(self) -> int:
        return len(self._spec.shape)

    def rank(self) -> int:
        return len(self._spec.shape)

    def size(self, dim: Optional[int] = None):
        return self.shape if dim is None else self.shape[dim]

    @property
    def dim_range(self):
        """Axis -> (dim_name, (min, opt, max)) if this is a network input, else None."""
        return self.network.dim_range(self.name) if self.network.is_input(self.name) else None

    def is_input(self) -> bool:
        return self.network.is_input(self.name)

    # ---- graph rewriting API ------------------------------------------------------------

    def get_parent(self) -> Optional[Layer]:
        """The layer that produces this tensor (None for a network input)."""
        return self.network.producer(self.name)

    def get_users(self) -> list[Layer]:
        """The live layers that read this tensor."""
        return self.network.consumers(self.name)

    def replace_all_uses_with(self, other: Tensor) -> None:
        """Every reader of this tensor reads `other` instead (outputs keep their names)."""
        if other.network is not self.network:
            raise ValueError(f"replace_all_uses_with: {other.name!r} is in another network")
        if other.dtype != self.dtype or not shapes_compatible(self.shape, other.shape):
            raise ValueError(f"replace_all_uses_with: {self.name!r} is {self.dtype} {list(self.shape)}, "
                             f"replacement {other.name!r} is {other.dtype} {list(other.shape)}")
        self.network.replace_all_uses(self.name, other.name)

    def mark_output(self, name: Optional[str] = None) -> None:
        self.network.mark_output(self, name)

    def __eq__(self, other) -> bool:
        return isinstance(other, Tensor) and other._spec is self._spec

    def __hash__(self) -> int:
        return id(self._spec)

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.dtype}, {list(self.shape)})"


def _canonical_dim_range(name: str, shape: tuple[int, ...], dim_range) -> dict[int, tuple[str, tuple[int, int, int]]]:
    """Axis -> (dim_name, (min, opt, max)) for every dynamic axis of input `name`.

    `dim_range` lists one `(dim_name, (min, opt, max))` per dynamic (-1) axis in axis
    order, or one entry per axis with None for static axes, or is a dict axis -> entry.
    """
    dynamic = [axis for axis, d in enumerate(shape) if d == -1]
    if dim_range is None:
        given = {}
    elif isinstance(dim_range, dict):
        given = {int(axis): entry for axis, entry in dim_range.items()}
    else:
        entries = list(dim_range)
        if len(entries) == len(dynamic):
            given = dict(zip(dynamic, entries))
        elif len(entries) == len(shape):
            given = {axis: e for axis, e in enumerate(entries) if e is not None}
        else:
            raise ValueError(f"input {name!r} shape {list(shape)}: dim_range needs one entry per dynamic "
                             f"dim ({len(dynamic)}) or per dim ({len(shape)}), got {len(entries)}")
    ranges = {}
    for axis, entry in given.items():
        if not 0 <= axis < len(shape):
            raise ValueError(f"input {name!r} shape {list(shape)}: dim_range axis {axis} out of range")
        try:
            dim_name, (lo, opt, hi) = entry
            lo, opt, hi = int(lo), int(opt), int(hi)
        except (TypeError, ValueError):
            raise ValueError(f"input {name!r} axis {axis}: dim_range entry must be "
                             f"(dim_name, (min, opt, max)), got {entry!r}") from None
        if not 0 <= lo <= opt <= hi:
            raise ValueError(f"input {name!r} axis {axis} ({dim_name}): need 0 <= min <= opt <= max, "
                             f"got ({lo}, {opt}, {hi})")
        if shape[axis] != -1:
            if (lo, opt, hi) != (shape[axis],) * 3:
                raise ValueError(f"input {name!r} axis {axis} is static ({shape[axis]}) but has range "
                                 f"({lo}, {opt}, {hi})")
            continue
        ranges[axis] = (str(dim_name), (lo, opt, hi))
    missing = [axis for axis in dynamic if axis not in ranges]
    if missing:
        raise ValueError(f"input {name!r} shape {list(shape)}: dynamic axes {missing} have no "
                         f"(dim_name, (min, opt, max)) range")
    return dict(sorted(ranges.items()))


class Network:

    def __init__(self, name: str = "network"):
        self.name = name
        self.weights: dict[str, torch.Tensor] = {}
        self._tensors: dict[str, TensorSpec] = {}
        self._input_names: list[str] = []
        self._dim_ranges: dict[str, dict[int, tuple[str, tuple[int, int, int]]]] = {}
        self._layers: list[Layer] = []
        self._layer_by_name: dict[str, Layer] = {}
        self._producer: dict[str, Layer] = {}
        self._consumers: dict[str, list[Layer]] = {}
        self._outputs: list[str] = []
        self._debug_outputs: list[str] = []
        self._next_id = 0
        self._scopes: list[str] = []
        # Weight name -> the weights a rewrite made it from (concatenated along dim 0, in
        # order; [name, rows]: a [1] weight repeated over rows rows), so that the builder can
        # record how to refit an engine (tensorrt_llm/refit.py).
        self.weight_sources: dict[str, list] = {}
        # Weight name -> the equal weight a rewrite reads in its place (FuseGateUp's shared FP8
        # scales): refit refuses a checkpoint in which the two differ.
        self.equal_sources: dict[str, str] = {}

    # ---- tensors -------------------------------------------------------------------------

    def _wrap(self, spec: TensorSpec) -> Tensor:
        return Tensor._from_spec(spec, self)

    def get_tensor(self, name: str) -> Tensor:
        if name not in self._tensors:
            raise KeyError(f"network {self.name!r} has no tensor {name!r}")
        return self._wrap(self._tensors[name])

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def _add_spec(self, name: str, dtype: str, shape: Iterable[int]) -> TensorSpec:
        if name in self._tensors:
            raise ValueError(f"network {self.name!r} already has a tensor named {name!r}")
        shape = tuple(int(d) for d in shape)
        if any(d < -1 for d in shape):
            raise ValueError(f"tensor {name!r}: invalid shape {list(shape)} (dims are >= 0, or -1 for dynamic)")
        spec = TensorSpec(name, canonical_dtype(dtype), shape)
        self._tensors[name] = spec
        return spec

    # ---- inputs and outputs --------------------------------------------------------------

    def add_input(self, name: str, dtype, shape: Sequence[int], dim_range=None) -> Tensor:
        """A network input; every -1 dim needs a `(dim_name, (min, opt, max))` range."""
        shape = tuple(int(d) for d in shape)
        ranges = _canonical_dim_range(name, shape, dim_range)
        spec = self._add_spec(name, dtype, shape)
        self._input_names.append(name)
        self._dim_ranges[name] = ranges
        return self._wrap(spec)

    @property
    def inputs(self) -> list[Tensor]:
        return [self._wrap(self._tensors[n]) for n in self._input_names]

    @property
    def input_names(self) -> list[str]:
        return list(self._input_names)

    def get_input(self, name: str) -> Tensor:
        if name not in self._dim_ranges:
            raise KeyError(f"network {self.name!r} has no input {name!r}; inputs: {self._input_names}")
        return self._wrap(self._tensors[name])

    def is_input(self, name: str) -> bool:
        return name in self._dim_ranges

    def dim_range(self, input_name: str) -> dict[int, tuple[str, tuple[int, int, int]]]:
        """Axis -> (dim_name, (min, opt, max)) for each dynamic axis of an input."""
        self.get_input(input_name)
        return dict(self._dim_ranges[input_name])

    def mark_output(self, tensor: Tensor, name: Optional[str] = None) -> None:
        """Make `tensor` an output, renaming it to `name` (output names are the API)."""
        if name is not None and name != tensor.name:
            self.rename_tensor(tensor.name, name)
        if tensor.name in self._outputs:
            raise ValueError(f"tensor {tensor.name!r} is already an output")
        self._outputs.append(tensor.name)

    def mark_debug(self, tensor: Tensor) -> None:
        """Executors return debug tensors by name next to the outputs."""
        if tensor.name not in self._debug_outputs:
            self._debug_outputs.append(tensor.name)

    @property
    def outputs(self) -> list[str]:
        return list(self._outputs)

    @property
    def debug_outputs(self) -> list[str]:
        return list(self._debug_outputs)

    def get_output(self, name: str) -> Tensor:
        if name not in self._outputs:
            raise KeyError(f"network {self.name!r} has no output {name!r}; outputs: {self._outputs}")
        return self._wrap(self._tensors[name])

    @property
    def num_inputs(self) -> int:
        return len(self._input_names)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    # ---- layers --------------------------------------------------------------------------

    @contextlib.contextmanager
    def name_scope(self, scope: str):
        """Prefix the names of layers added inside (Module calls use their module path)."""
        self._scopes.append(scope)
        try:
            yield
        finally:
            self._scopes.pop()

    def _fresh_layer_name(self, op: str) -> str:
        scope = self._scopes[-1] + "/" if self._scopes and self._scopes[-1] else ""
        while True:
            name = f"{scope}{op}_{self._next_id}"
            self._next_id += 1
            if name not in self._layer_by_name:
                return name

    def add_layer(self, op: str, inputs: Sequence[Optional[str]], outputs: Sequence[tuple[str, Sequence[int]]],
                  attrs: Optional[dict] = None) -> Layer:
        """Append a layer; `outputs` are (dtype, shape) pairs, named after the layer."""
        for name in inputs:
            if name is not None and name not in self._tensors:
                raise ValueError(f"op {op}: input tensor {name!r} is not in network {self.name!r}")
        # Attrs must be JSON values; normalising here (tuples -> lists) makes them equal
        # before and after a to_json/from_json round trip.
        attrs = json.loads(json.dumps(attrs or {}))
        name = self._fresh_layer_name(op)
        out_names = []
        for i, (dtype, shape) in enumerate(outputs):
            out_names.append(self._add_spec(f"{name}_output_{i}", dtype, shape).name)
        layer = Layer(name, op, inputs, out_names, attrs, self)
        self._attach(layer)
        self._layers.append(layer)
        return layer

    def _attach(self, layer: Layer) -> None:
        self._layer_by_name[layer.name] = layer
        for out in layer.outputs:
            self._producer[out] = layer
        for name in dict.fromkeys(layer.inputs):
            if name is not None:
                self._consumers.setdefault(name, []).append(layer)

    @property
    def layers(self) -> list[Layer]:
        """Live layers in topological order (layers marked removed are left out)."""
        return [layer for layer in self._layers if not layer.removed]

    @property
    def num_layers(self) -> int:
        return sum(1 for layer in self._layers if not layer.removed)

    def get_layer(self, index: int) -> Layer:
        return self.layers[index]

    def get_layer_by_name(self, name: str) -> Layer:
        if name not in self._layer_by_name:
            raise KeyError(f"network {self.name!r} has no layer {name!r}")
        return self._layer_by_name[name]

    def producer(self, tensor_name: str) -> Optional[Layer]:
        """The layer that makes a tensor (None for inputs)."""
        return self._producer.get(tensor_name)

    def consumers(self, tensor_name: str) -> list[Layer]:
        """Live layers that read a tensor, in network order of attachment."""
        return [layer for layer in self._consumers.get(tensor_name, ()) if not layer.removed]

    def set_layer_input(self, layer: Layer, index: int, tensor_name: Optional[str]) -> None:
        if tensor_name is not None and tensor_name not in self._tensors:
            raise ValueError(f"layer {layer.name!r}: no tensor {tensor_name!r} in network {self.name!r}")
        old = layer._inputs[index]
        new_inputs = list(layer._inputs)
        new_inputs[index] = tensor_name
        layer._inputs = tuple(new_inputs)
        if old is not None and old not in layer._inputs:
            self._consumers[old].remove(layer)
        if tensor_name is not None and layer not in self._consumers.setdefault(tensor_name, []):
            self._consumers[tensor_name].append(layer)

    def replace_all_uses(self, old: str, new: str) -> list[Layer]:
        """Make every reader of `old` read `new`; returns the layers changed.

        If `old` is an output or debug output, `new` takes over its name, since
        output names are what callers see.
        """
        if old == new:
            return []
        changed = list(self._consumers.get(old, ()))
        for layer in changed:
            for i, name in enumerate(layer._inputs):
                if name == old:
                    self.set_layer_input(layer, i, new)
        if old in self._outputs or old in self._debug_outputs:
            if self.is_input(new) or new in self._outputs or new in self._debug_outputs:
                raise ValueError(f"cannot let {new!r} take over output name {old!r}: it is an input or "
                                 f"output itself")
            self._rename(old, self._fresh_tensor_name(old + "_replaced"))  # the result lists keep `old`
            self._rename(new, old)
        return changed

    def _fresh_tensor_name(self, base: str) -> str:
        name, i = base, 0
        while name in self._tensors:
            i += 1
            name = f"{base}_{i}"
        return name

    def rename_tensor(self, old: str, new: str) -> None:
        """Rename a tensor everywhere, output and debug-output lists included."""
        if old == new:
            return
        self._rename(old, new)
        self._outputs = [new if n == old else n for n in self._outputs]
        self._debug_outputs = [new if n == old else n for n in self._debug_outputs]

    def _rename(self, old: str, new: str) -> None:
        """Rename a tensor in the layers that make and read it."""
        if new in self._tensors:
            raise ValueError(f"cannot rename {old!r} to {new!r}: network {self.name!r} already has that tensor")
        if self.is_input(old):
            raise ValueError(f"cannot rename network input {old!r}")
        spec = self._tensors.pop(old)
        spec.name = new
        self._tensors[new] = spec
        producer = self._producer.pop(old, None)
        if producer is not None:
            producer._outputs = tuple(new if n == old else n for n in producer._outputs)
            self._producer[new] = producer
        consumers = self._consumers.pop(old, [])
        for layer in consumers:
            layer._inputs = tuple(new if n == old else n for n in layer._inputs)
        if consumers:
            self._consumers[new] = consumers

    def mark_removed(self, layer: Layer) -> None:
        """Step 4 of a rewrite: the layer stays until remove_marked_layers()."""
        layer.removed = True

    def remove_layer(self, layer: Layer) -> None:
        """Delete a layer whose outputs nothing live reads any more."""
        for out in layer.outputs:
            readers = [c.name for c in self._consumers.get(out, ()) if c is not layer and not c.removed]
            if readers or out in self._outputs or out in self._debug_outputs:
                where = readers or ["the network outputs"]
                raise ValueError(f"cannot remove layer {layer.name!r}: its output {out!r} is still used by {where}")
        for out in layer.outputs:
            for reader in self._consumers.pop(out, []):  # removed readers only (checked above)
                reader._inputs = tuple(None if n == out else n for n in reader._inputs)
            del self._producer[out]
            del self._tensors[out]
        for name in dict.fromkeys(layer.inputs):
            if name is not None and name in self._consumers:
                self._consumers[name].remove(layer)
        del self._layer_by_name[layer.name]
        self._layers.remove(layer)
        layer.removed = True

    def remove_marked_layers(self) -> int:
        marked = [layer for layer in self._layers if layer.removed]
        for layer in reversed(marked):  # readers before the layers they read
            self.remove_layer(layer)
        return len(marked)

    def sort_layers(self) -> None:
        """Restore topological order after rewrites appended layers, keeping the original
        order wherever the dependencies allow it."""
        done: set[int] = set()
        visiting: set[int] = set()
        order: list[Layer] = []

        def producers(layer):
            return iter([self._producer[n] for n in layer.inputs if n is not None and n in self._producer])

        for root in self._layers:
            if id(root) in done:
                continue
            stack = [(root, producers(root))]
            visiting.add(id(root))
            while stack:
                layer, deps = stack[-1]
                for dep in deps:
                    if id(dep) in done:
                        continue
                    if id(dep) in visiting:
                        raise ValueError(f"network {self.name!r} has a cycle through layer {dep.name!r}")
                    visiting.add(id(dep))
                    stack.append((dep, producers(dep)))
                    break
                else:
                    stack.pop()
                    visiting.discard(id(layer))
                    done.add(id(layer))
                    order.append(layer)
        self._layers = order

    # ---- serialisation -------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "format": JSON_FORMAT,
            "version": JSON_VERSION,
            "name": self.name,
            "inputs": [{"name": n, "dtype": self._tensors[n].dtype, "shape": list(self._tensors[n].shape),
                        "dim_range": [[axis, dim_name, list(r)] for axis, (dim_name, r) in self._dim_ranges[n].items()]}
                       for n in self._input_names],
            "tensors": {name: {"dtype": spec.dtype, "shape": list(spec.shape)}
                        for name, spec in self._tensors.items() if not self.is_input(name)},
            "layers": [layer.to_dict() for layer in self.layers],
            "outputs": list(self._outputs),
            "debug_outputs": list(self._debug_outputs),
            "weights": {name: {"dtype": torch_dtype_to_str(w.dtype), "shape": list(w.shape)}
                        for name, w in self.weights.items()},
        }

    def to_json(self, indent: Optional[int] = None) -> str:
        if any(layer.removed for layer in self._layers):
            raise ValueError("network has layers marked removed; call remove_marked_layers() first")
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str, weights: Optional[dict[str, torch.Tensor]] = None) -> "Network":
        """Rebuild a network; `weights` must hold every weight the JSON lists, with its
        dtype and shape (None: a graph without weight data, e.g. for inspection)."""
        return cls.from_dict(json.loads(text), weights)

    @classmethod
    def from_dict(cls, data: dict, weights: Optional[dict[str, torch.Tensor]] = None) -> "Network":
        """`from_json` of the parsed JSON (what `to_dict` returns). A graph from a file of
        unknown origin is checked first with engine_check.check_graph, as Engine.from_dir does."""
        if data.get("format") != JSON_FORMAT:
            raise ValueError(f"not a {JSON_FORMAT} graph (format={data.get('format')!r})")
        if data.get("version") != JSON_VERSION:
            raise ValueError(f"graph format version {data.get('version')} is not supported (want {JSON_VERSION})")
        net = cls(name=data["name"])
        for spec in data["inputs"]:
            ranges = {axis: (dim_name, r) for axis, dim_name, r in spec["dim_range"]}
            net.add_input(spec["name"], spec["dtype"], spec["shape"], ranges)
        for name, spec in data["tensors"].items():
            net._add_spec(name, spec["dtype"], spec["shape"])
        for entry in data["layers"]:
            for name in list(entry["inputs"]) + list(entry["outputs"]):
                if name is not None and name not in net._tensors:
                    raise ValueError(f"layer {entry['name']!r} names unknown tensor {name!r}")
            layer = Layer(entry["name"], entry["op"], entry["inputs"], entry["outputs"], entry["attrs"], net)
            net._attach(layer)
            net._layers.append(layer)
        for name in data["outputs"]:
            net.mark_output(net.get_tensor(name))
        for name in data["debug_outputs"]:
            net.mark_debug(net.get_tensor(name))
        if weights is not None:
            problems = []
            for name, spec in data["weights"].items():
                if name not in weights:
                    problems.append(f"{name}: missing")
                    continue
                w = weights[name]
                got = (torch_dtype_to_str(w.dtype), list(w.shape))
                if got != (spec["dtype"], spec["shape"]):
                    problems.append(f"{name}: expected {spec['dtype']} {spec['shape']}, got {got[0]} {got[1]}")
                net.weights[name] = w
            if problems:
                raise ValueError("weights do not match the graph:\n  " + "\n  ".join(problems))
        return net

    # onnx_export is imported where it is used: it imports onnx, a quarter of a second.

    def to_onnx(self, path: str, **kwargs) -> None:
        """Write an ONNX model (see onnx_export.export for the options)."""
        from .onnx_export import export
        export(self, path, **kwargs)

    @classmethod
    def from_onnx(cls, path: str) -> "Network":
        """Load a network back from a model written by `to_onnx`."""
        from .onnx_export import graph_from_onnx
        return cls.from_json(*graph_from_onnx(path))

    def to_dot(self) -> str:
        """Graphviz source: inputs and outputs as ellipses, layers as boxes."""
        def q(s: str) -> str:
            return '"' + s.replace('"', '\\"') + '"'

        def describe(name: str) -> str:
            spec = self._tensors[name]
            return f"{name}\\n{spec.dtype} {list(spec.shape)}"

        lines = [f"digraph {q(self.name)} {{", "  node [shape=box];"]
        for name in self._input_names:
            lines.append(f"  {q('input:' + name)} [shape=ellipse, label={q(describe(name))}];")
        for layer in self.layers:
            lines.append(f"  {q(layer.name)} [label={q(layer.name + chr(92) + 'n' + layer.op)}];")
            for name in layer.inputs:
                if name is None:
                    continue
                src = self._producer[name].name if name in self._producer else "input:" + name
                lines.append(f"  {q(src)} -> {q(layer.name)} [label={q(name)}];")
        for kind, names in (("output", self._outputs), ("debug", self._debug_outputs)):
            for name in names:
                node = f"{kind}:{name}"
                lines.append(f"  {q(node)} [shape=ellipse, label={q(describe(name))}];")
                src = self._producer[name].name if name in self._producer else "input:" + name
                lines.append(f"  {q(src)} -> {q(node)};")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        return (f"Network({self.name!r}, {self.num_inputs} inputs, {self.num_layers} layers, "
                f"{self.num_outputs} outputs, {len(self.weights)} weights)")


_net_stack: list[Network] = []


@contextlib.contextmanager
def net_guard(network: Network):
    """Make `network` the default network (the one ops add layers to) inside the block."""
    _net_stack.append(network)
    try:
        yield network
    finally:
        _net_stack.pop()


def default_net() -> Network:
    if not _net_stack:
        raise RuntimeError("no active network: define layers inside `with net_guard(network):`")
    return _net_stack[-1]


def current_net() -> Optional[Network]:
    """The default network, or None outside net_guard."""
    return _net_stack[-1] if _net_stack else None
