"""`ReferenceExecutor`: runs a Network layer by layer with each op's reference (ground truth).

The layer list is turned into a flat plan once; each run checks the feed against the
network's inputs, then calls one op per layer and drops intermediates after their last use.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ._utils import str_dtype_to_torch
from .network import Network
from .ops import references


class ReferenceExecutor:

    def __init__(self, network: Network, device="cpu", ops: Optional[dict[str, Callable]] = None):
        self.network = network
        self.device = torch.device(device)
        ops = references() if ops is None else ops
        self._inputs = [(t.name, str_dtype_to_torch(t.dtype), t.shape, network.dim_range(t.name))
                        for t in network.inputs]
        self._results = network.outputs + [n for n in network.debug_outputs if n not in network.outputs]
        keep = set(self._results)
        layers = network.layers
        last_use = {}
        for i, layer in enumerate(layers):
            for name in layer.inputs:
                if name is not None:
                    last_use[name] = i
        self._constants = {}
        self._plan = []  # (op fn, input names, attrs, output names, names to drop afterwards)
        for i, layer in enumerate(layers):
            if layer.op == "constant":
                weight = network.weights.get(layer.attrs["weight"])
                if weight is None:
                    raise ValueError(f"layer {layer.name!r}: weight {layer.attrs['weight']!r} "
                                     "is not in network.weights")
                self._constants[layer.outputs[0]] = weight.to(self.device)
                continue
            if layer.op not in ops:
                raise NotImplementedError(f"layer {layer.name!r}: no reference implementation of op {layer.op!r}")
            drop = [n for n in dict.fromkeys(layer.inputs)
                    if n is not None and last_use[n] == i and n not in keep]
            drop += [n for n in layer.outputs if n not in last_use and n not in keep]
            # `implementation` is the builder's kernel choice, not an argument of the op.
            attrs = {k: v for k, v in layer.attrs.items() if k != "implementation"}
            self._plan.append((ops[layer.op], layer.inputs, attrs, layer.outputs, drop))

    def check_feed(self, feed: dict[str, torch.Tensor]) -> None:
        """Names, dtypes, ranks, static dims, dynamic ranges, and that dims sharing a
        dim_name agree. Inputs named host_* stay on the CPU; the rest must be on the
        executor's device."""
        names = [name for name, *_ in self._inputs]
        missing = [n for n in names if n not in feed]
        unexpected = [n for n in feed if n not in names]
        if missing or unexpected:
            raise ValueError(f"feed does not match the network inputs: missing {missing}, unexpected {unexpected}")
        named_dims: dict[str, tuple[int, str]] = {}
        for name, dtype, shape, ranges in self._inputs:
            t = feed[name]
            if t.dtype != dtype:
                raise ValueError(f"input {name!r}: expected dtype {dtype}, got {t.dtype}")
            if t.dim() != len(shape):
                raise ValueError(f"input {name!r}: expected rank {len(shape)} {list(shape)}, got shape {list(t.shape)}")
            want_device = torch.device("cpu") if name.startswith("host_") else self.device
            if t.device.type != want_device.type:
                raise ValueError(f"input {name!r}: expected a tensor on {want_device}, got one on {t.device}")
            for axis, (want, got) in enumerate(zip(shape, t.shape)):
                if want != -1 and want != got:
                    raise ValueError(f"input {name!r}: dim {axis} must be {want}, got shape {list(t.shape)}")
            for axis, (dim_name, (lo, _, hi)) in ranges.items():
                got = t.shape[axis]
                if not lo <= got <= hi:
                    raise ValueError(f"input {name!r}: dim {axis} ({dim_name}) = {got} is outside [{lo}, {hi}]")
                seen = named_dims.setdefault(dim_name, (got, name))
                if seen[0] != got:
                    raise ValueError(f"dim {dim_name!r} is {seen[0]} in input {seen[1]!r} but {got} in {name!r}")

    def run(self, feed: dict[str, torch.Tensor], check: bool = True) -> dict[str, torch.Tensor]:
        """Outputs and debug tensors by name."""
        if check:
            self.check_feed(feed)
        env = dict(self._constants)
        env.update(feed)
        for fn, inputs, attrs, outputs, drop in self._plan:
            result = fn(*[None if n is None else env[n] for n in inputs], **attrs)
            if len(outputs) == 1:
                env[outputs[0]] = result
            else:
                env.update(zip(outputs, result))
            for name in drop:
                del env[name]
        return {name: env[name] for name in self._results}
