"""`Op`: one op's definition, and the table of every op (`OPS`).

An op is defined once, by decorating its graph function with `@define`:

- the graph function is its shape rule: called as the op (`F.rms_norm(x, w, eps=1e-6)`), it
  checks the arguments, infers each output's dtype and shape and appends one layer (op name =
  function name) to the default network. Every tensor argument becomes a layer input (in
  parameter order), every other argument an attr of the same name, so the call that made a
  layer can be read back from it (`call_arguments`, which graph_rewriting's `FLayerInfo`
  reads with; the op checks it on every call);
- `@op.implementation(REFERENCE)` registers its reference: the meaning of the op in plain
  PyTorch, `reference(*inputs, **attrs)` with the attrs as keyword-only parameters. It runs
  on every device and is the CPU runtime;
- `@op.implementation(CUDA)` registers a faster implementation for a GPU (usually the
  compiled kernel, through ops/launch.py's `launch`); it computes the same op, within the
  rounding its kernel documents;
- `@op.implementation(CPU)` likewise on the CPU, for an op with a faster path there than its
  reference (weight_only_linear: torch's INT8 / INT4 CPU kernels).

Ops of one kind made by one function pass their `name` and `reference` to `define`.

The runtime (`Session`) runs, for each layer, the implementation the builder recorded
(`timing_cache`) or else the device's default: `implementations(device)`.
"""
from __future__ import annotations

import functools
import inspect
import types
from typing import Any, Callable, Optional, Sequence

import torch

from ..network import Layer, Tensor, default_net, shapes_compatible

Shape = tuple[int, ...]

# ---- implementation names -----------------------------------------------------------------

REFERENCE, CUDA, CPU = "reference", "cuda", "cpu"


def _cuda_kernels_here(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    from .launch import cuda_kernels_available  # loads the compiled module, on a GPU only
    return cuda_kernels_available()


# The names an implementation may be registered under, in order of preference, with where each
# runs. An engine records one of these names per layer (engine_check refuses any other).
IMPLEMENTATIONS: dict[str, Callable[[torch.device], bool]] = {
    CUDA: _cuda_kernels_here,
    CPU: lambda device: device.type == "cpu",  # a faster CPU path than the reference (torch's own kernels)
    REFERENCE: lambda device: True,
}

# ---- signatures -----------------------------------------------------------------------------

# Op name -> the signature of the function that adds its layers: every op's, and any a user
# records for an op of their own (record_signature), so that FLayerInfo can read its layers.
OP_SIGNATURES: dict[str, inspect.Signature] = {}


def record_signature(fn):
    """Record the signature of `fn`, whose layers are named after it, so that the call that
    made one of its layers can be read back from the layer (graph_rewriting.FLayerInfo).
    Costs nothing per call: `fn` is returned as it is."""
    OP_SIGNATURES[fn.__name__] = inspect.signature(fn)
    return fn


def signature_of(op: str) -> Optional[inspect.Signature]:
    return OP_SIGNATURES.get(op)


# The attr in which the builder records a timed implementation choice (timing_cache.py): no
# argument of the op.
IMPLEMENTATION_ATTR = "implementation"


def call_arguments(layer: Layer, signature: inspect.Signature) -> dict[str, Any]:
    """The arguments of the call that made `layer`: an attr gives the parameter of its name,
    the inputs fill the other positional parameters in order (a `Sequence[Tensor]` one takes
    them all, as concat does), and the rest keep their defaults. ValueError when the layer
    holds what no parameter takes, or lacks what one needs."""
    net = layer.network
    attrs = {k: v for k, v in layer.attrs.items() if k != IMPLEMENTATION_ATTR}
    if layer.op == "constant":  # its attr names the weight; the call took the data and the name
        return {"value": net.weights[attrs["weight"]], "name": attrs["weight"]}
    inputs = layer.get_inputs()
    args, used = {}, 0
    for name, takes, default in _parameters(layer.op, signature):
        if name in attrs:
            args[name] = attrs.pop(name)
        elif takes == "all":
            args[name], used = inputs[used:], len(inputs)
        elif takes == "input" and used < len(inputs):
            args[name] = inputs[used]
            used += 1
        elif default is not inspect.Parameter.empty:
            args[name] = default
        else:
            raise ValueError(f"layer {layer.name!r} ({layer.op}) gives no argument {name!r}")
    if attrs or used < len(inputs):
        raise ValueError(f"layer {layer.name!r} ({layer.op}): attrs {sorted(attrs)} and "
                         f"{len(inputs) - used} input(s) are no arguments of the op")
    return args


# op -> (its signature, (name, what may give it, default) per parameter): read once per op.
_PARAMETERS: dict[str, tuple[inspect.Signature, tuple[tuple[str, str, Any], ...]]] = {}


def _parameters(op: str, signature: inspect.Signature) -> tuple[tuple[str, str, Any], ...]:
    """Per parameter: its name, what gives it besides an attr of that name ("all": every
    input, "input": the next input, "attr": nothing), and its default."""
    cached = _PARAMETERS.get(op)
    if cached is None or cached[0] is not signature:
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        cached = _PARAMETERS[op] = (signature, tuple(
            (p.name, "all" if p.annotation == "Sequence[Tensor]" else "input" if p.kind in positional else "attr",
             p.default) for p in signature.parameters.values()))
    return cached[1]


# ---- the op ---------------------------------------------------------------------------------


class Op:
    """One op: called, it is its graph function (the shape rule); `impls` holds what
    computes it, by implementation name, the reference among them."""

    def __init__(self, graph_fn: Callable, side_effects: bool = False):
        functools.update_wrapper(self, graph_fn)
        self.name = graph_fn.__name__
        self.graph_fn = graph_fn
        self.signature = inspect.signature(graph_fn)
        # An op that writes one of its inputs (gpt_attention fills the KV cache): never removed
        # as dead, never timed on random inputs.
        self.side_effects = side_effects
        self.impls: dict[str, Callable] = {}  # implementation name -> function

    def __call__(self, *args, **kwargs):
        out = self.graph_fn(*args, **kwargs)
        # The call must be readable back from the layer it made (every argument an input or an
        # attr of its name): graph rewriting and the engine checks rely on it.
        first = out[0] if isinstance(out, tuple) else out
        call_arguments(first.network.producer(first.name), self.signature)
        return out

    def __get__(self, obj, objtype=None):  # a method when set on a class (Tensor's operators)
        return self if obj is None else types.MethodType(self, obj)

    def __repr__(self) -> str:
        return f"<op {self.name}: {', '.join(self.impls) or 'no implementation'}>"

    def implementation(self, name: str) -> Callable[[Callable], Callable]:
        """Decorator: register `fn` as this op's implementation `name` (one of IMPLEMENTATIONS)."""
        if name not in IMPLEMENTATIONS:
            raise ValueError(f"{self.name}: unknown implementation name {name!r} (one of {list(IMPLEMENTATIONS)})")

        def register(fn: Callable) -> Callable:
            if name in self.impls:
                raise ValueError(f"{self.name}: implementation {name!r} is registered twice")
            self.impls[name] = fn
            return fn
        return register

    @property
    def reference(self) -> Optional[Callable]:
        """The meaning of the op (None only for `constant`, whose layers executors read from
        network.weights)."""
        return self.impls.get(REFERENCE)

    def impls_on(self, device: torch.device) -> dict[str, Callable]:
        """{name: function} of the implementations that run on `device`, the default first."""
        return {name: self.impls[name] for name, runs_on in IMPLEMENTATIONS.items()
                if name in self.impls and runs_on(device)}


# Op name -> Op: every op of the graph.
OPS: dict[str, Op] = {}


def define(graph_fn: Optional[Callable] = None, *, side_effects: bool = False, name: Optional[str] = None,
           reference: Optional[Callable] = None):
    """Decorator (`@define` or `@define(side_effects=True)`): make the graph function an `Op`
    and enter it in OPS. A function that makes ops of a kind gives each its `name` and
    `reference` here."""
    def make(fn: Callable) -> Op:
        if name is not None:
            fn.__name__ = fn.__qualname__ = name
        if fn.__name__ in OPS:
            raise ValueError(f"op {fn.__name__!r} is defined twice")
        op = Op(fn, side_effects=side_effects)
        OPS[op.name] = op
        OP_SIGNATURES[op.name] = op.signature
        if reference is not None:
            op.implementation(REFERENCE)(reference)
        return op
    return make if graph_fn is None else make(graph_fn)


def implementations(device) -> dict[str, dict[str, Callable]]:
    """op -> {implementation name: function} on `device`; the first name is the default."""
    device = torch.device(device)
    return {name: impls for name, op in OPS.items() if (impls := op.impls_on(device))}


def default_implementations(device) -> dict[str, Callable]:
    """op -> its default implementation on `device`."""
    return {name: next(iter(impls.values())) for name, impls in implementations(device).items()}


def references() -> dict[str, Callable]:
    """op -> its reference (every op but `constant`)."""
    return {name: op.reference for name, op in OPS.items() if op.reference is not None}


# ---- what shape rules share -------------------------------------------------------------------


def add_layer(op: str, inputs: Sequence[Optional[Tensor]], outputs: Sequence[tuple[str, Sequence[int]]], **attrs):
    """Append a layer to the default network; one Tensor, or a tuple for several outputs."""
    net = default_net()
    names = []
    for t in inputs:
        if t is not None and t.network is not net:
            raise ValueError(f"{op}: input {t.name!r} belongs to network {t.network.name!r}, "
                             f"not to the default network {net.name!r}")
        names.append(None if t is None else t.name)
    layer = net.add_layer(op, names, outputs, attrs)
    outs = tuple(net.get_tensor(n) for n in layer.outputs)
    return outs[0] if len(outs) == 1 else outs


def broadcast(op: str, *shapes: Shape) -> Shape:
    """Numpy broadcasting; a -1 against a concrete dim takes the concrete one unless it is 1."""
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        known = {d for d in dims if d not in (1, -1)}
        if len(known) > 1:
            raise ValueError(f"{op}: shapes {' and '.join(str(list(s)) for s in shapes)} do not broadcast")
        out.append(known.pop() if known else (-1 if -1 in dims else 1))
    return tuple(out)


def norm_dim(op: str, dim: int, rank: int) -> int:
    if not -rank <= dim < rank:
        raise ValueError(f"{op}: dim {dim} out of range for rank {rank}")
    return dim % rank


def check_same_dtype(op: str, *tensors: Optional[Tensor]) -> str:
    dtypes = [t.dtype for t in tensors if t is not None]
    if len(set(dtypes)) > 1:
        given = " vs ".join(f"{t.name} {t.dtype}" for t in tensors if t is not None)
        raise ValueError(f"{op}: dtype mismatch: {given}")
    return dtypes[0]


def check_int(op: str, t: Tensor, what: str) -> None:
    if t.dtype not in ("int32", "int64"):
        raise ValueError(f"{op}: {what} must be int32 or int64, got {t.dtype}")


def check_shape(op: str, t: Tensor, expected: Sequence[int], what: str) -> None:
    if not shapes_compatible(t.shape, tuple(expected)):
        raise ValueError(f"{op}: {what} has shape {list(t.shape)}, expected {list(expected)}")
