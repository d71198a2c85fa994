"""The engine executor: lowers a Network to a flat execution plan once, then runs it.

The plan is generated Python source, one statement per layer, compiled at load. Weights,
op implementations, attribute dicts, feed keys and output names are bound as globals of
that code under generated names, so a step costs one call per layer and nothing else (no
graph walking, no dict lookups of layer attributes, each intermediate dropped right after
its last use), and no string of the network, which may come from an engine file, is ever
part of the compiled source (docs/security.md).
"""
from __future__ import annotations

import functools
import inspect
import keyword
from typing import Callable, Optional

import torch

from .._utils import str_dtype_to_torch
from ..network import Network
from ..ops import default_implementations, implementations


class Session:

    def __init__(self, network: Network, device="cpu", ops: Optional[dict[str, Callable]] = None):
        self.network = network
        self.device = torch.device(device)
        self.ops = ops if ops is not None else default_implementations(self.device)
        self._input_specs = {t.name: t for t in network.inputs}
        # Explicit `ops` are run as given; the builder's recorded choices apply to the defaults.
        impls = implementations(self.device) if ops is None else None
        self.source, self._plan = lower(network, self.ops, impls)

    @classmethod
    def from_engine(cls, engine, device="cpu") -> "Session":
        return cls(engine.network, device)

    @property
    def plan_globals(self) -> dict:
        """The globals the plan runs with (a host tape lends it `__import__` while recording)."""
        return self._plan.__globals__

    @property
    def input_names(self) -> list[str]:
        return list(self._input_specs)

    def check_inputs(self, feed: dict[str, torch.Tensor]) -> None:
        """Names, dtypes and ranks of a feed; cheap enough to run every step."""
        missing = set(self._input_specs) - set(feed)
        unexpected = set(feed) - set(self._input_specs)
        if missing or unexpected:
            raise ValueError(f"session inputs: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        for name, spec in self._input_specs.items():
            t = feed[name]
            want = str_dtype_to_torch(spec.dtype)
            if t.dtype != want or t.dim() != len(spec.shape):
                raise ValueError(f"input {name!r}: expected {spec.dtype} of rank {len(spec.shape)}, "
                                 f"got {t.dtype} of shape {tuple(t.shape)}")

    def run(self, feed: dict[str, torch.Tensor], check: bool = True) -> dict[str, torch.Tensor]:
        """Outputs and debug tensors by name."""
        if check:
            self.check_inputs(feed)
        # No autograd bookkeeping on any op of the plan (the engine is never trained).
        with torch.inference_mode():
            return self._plan(feed)


def _identifier(i: int) -> str:
    return f"t{i}"


@functools.lru_cache(maxsize=None)
def _keyword_parameters(fn: Callable) -> dict[str, str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin: attributes, if any, go through **
        return {}
    return {p.name: p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name.isidentifier()
            and not keyword.iskeyword(p.name)}


def keyword_parameters(fn: Callable) -> dict[str, str]:
    """Keyword-only parameter names of `fn`, as its signature spells them."""
    try:
        return _keyword_parameters(fn)
    except TypeError:  # unhashable callable
        return {}


def lower(network: Network, ops: dict[str, Callable],
          impls: Optional[dict[str, dict[str, Callable]]] = None) -> tuple[str, Callable]:
    """Generate and compile the plan: `plan(feed) -> {name: tensor}`.

    A layer whose attrs name an `implementation` (the builder's timed choice) runs that
    entry of `impls[op]`; a name this device lacks (an engine for "any" timed on a GPU,
    run on the CPU) falls back to `ops[op]`: the choice is about speed, never meaning.

    The source holds only identifiers this function makes up (`t<i>` tensors, `w<i>`
    weights, `f<i>` functions, `a<i>_<j>` attribute values, `a<i>` attribute dicts), the
    keyword-parameter names of the bound functions' own signatures, and the keywords of
    the plan itself: no string of the network (names, ops, attribute keys or values) is
    written into it. Feed keys, output names, functions and attribute values are globals
    of the plan, so an engine from a stranger cannot smuggle code into what is compiled here."""
    names: dict[str, str] = {}  # tensor name -> Python identifier

    def ident(tensor_name: str) -> str:
        if tensor_name not in names:
            names[tensor_name] = _identifier(len(names))
        return names[tensor_name]

    # No builtins but the two the return statement uses: the plan calls only what is bound here.
    env: dict[str, object] = {"__builtins__": {}, "dict": dict, "zip": zip}
    fn_names: dict[int, str] = {}  # id(function) -> its global

    def bind_function(fn: Callable) -> str:
        if id(fn) not in fn_names:
            fn_names[id(fn)] = f"f{len(fn_names)}"
            env[fn_names[id(fn)]] = fn
        return fn_names[id(fn)]

    lines = ["def plan(feed):"]
    env["feed_keys"] = tuple(spec.name for spec in network.inputs)
    for j, spec in enumerate(network.inputs):
        lines.append(f"    {ident(spec.name)} = feed[feed_keys[{j}]]")

    # Last use of every tensor, so the plan can drop intermediates as soon as it can.
    keep = set(network.outputs) | set(network.debug_outputs)
    last_use: dict[str, int] = {}
    for i, layer in enumerate(network.layers):
        for name in layer.inputs:
            if name is not None:
                last_use[name] = i

    for i, layer in enumerate(network.layers):
        if layer.op == "constant":
            # A weight is a global of the plan: no statement, never dropped.
            global_name = f"w{i}"
            env[global_name] = network.weights[layer.attrs["weight"]]
            names[layer.outputs[0]] = global_name
            keep.add(layer.outputs[0])
            continue
        outs = ", ".join(ident(o) for o in layer.outputs)
        if layer.op not in ops:
            raise NotImplementedError(f"layer {layer.name!r}: no implementation of op {layer.op!r}")
        attrs = dict(layer.attrs)
        chosen = attrs.pop("implementation", None)
        fn = (impls or {}).get(layer.op, {}).get(chosen, ops[layer.op])
        args = [ident(n) if n is not None else "None" for n in layer.inputs]
        # An attribute the function declares as a keyword-only parameter is passed as
        # `param=a<i>_<j>`, the parameter's name taken from the function's own signature
        # (our code), its value bound as a global; any other (a custom op's) goes in a dict
        # through `**a<i>`. A literal keyword is about 150 ns per call cheaper than `**`.
        declared = keyword_parameters(fn)
        rest = {}
        for j, (key, value) in enumerate(sorted(attrs.items())):
            param = declared.get(key)
            if param is None:
                rest[key] = value
                continue
            env[f"a{i}_{j}"] = value
            args.append(f"{param}=a{i}_{j}")
        if rest:
            env[f"a{i}"] = rest
            args.append(f"**a{i}")
        lines.append(f"    {outs} = {bind_function(fn)}({', '.join(args)})")
        dead = [ident(n) for n in dict.fromkeys(layer.inputs)
                if n is not None and last_use.get(n) == i and n not in keep]
        dead += [ident(o) for o in layer.outputs if o not in last_use and o not in keep]
        if dead:
            lines.append(f"    del {', '.join(dead)}")

    returned = list(network.outputs) + list(network.debug_outputs)
    env["result_keys"] = tuple(returned)
    values = "".join(f"{ident(n)}, " for n in returned)
    lines.append(f"    return dict(zip(result_keys, ({values})))")
    source = "\n".join(lines) + "\n"
    code = compile(source, "<plan>", "exec")
    exec(code, env)
    return source, env["plan"]
