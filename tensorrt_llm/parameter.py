"""`Parameter`: a named, typed weight slot of a Module, bound through `.value`.

`.value` holds the data (a torch.Tensor; numpy arrays are accepted); `.tensor` is the
weight as a graph Tensor of the default network: its first use in a network adds one
`constant` layer with attrs {"weight": <hierarchical name>} and puts the data in
`network.weights` under that name.
"""
from __future__ import annotations

import math
import weakref
from typing import Optional, Sequence

import numpy as np
import torch

from . import functional
from ._utils import canonical_dtype, torch_dtype_to_str
from .network import Tensor, default_net


class Parameter:

    def __init__(self, shape: Optional[Sequence[int]] = None, dtype="float32", value=None):
        if shape is None and value is None:
            raise ValueError("Parameter needs a shape or a value")
        self._value: Optional[torch.Tensor] = None
        self._owner = None  # the Module that registered it first, and the attribute name
        self._attr: Optional[str] = None
        # The Tensor this weight became in each network it was used in.
        self._tensors: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        if shape is None:
            value = _as_torch(value)
            shape, dtype = value.shape, torch_dtype_to_str(value.dtype)
        self.shape = tuple(int(d) for d in shape)
        self.dtype = canonical_dtype(dtype)
        if value is not None:
            self.value = value

    @property
    def name(self) -> Optional[str]:
        """Hierarchical name (e.g. transformer.layers.0.mlp.fc.weight) once in a Module tree."""
        if self._owner is None:
            return None
        prefix = self._owner.full_name
        return f"{prefix}.{self._attr}" if prefix else self._attr

    def numel(self) -> int:
        return math.prod(self.shape)

    def _register(self, owner, attr: str) -> None:
        if self._owner is None:  # a shared parameter keeps its first name
            self._owner, self._attr = owner, attr

    @property
    def value(self) -> Optional[torch.Tensor]:
        """The bound data, or None before a value is set."""
        return self._value

    @value.setter
    def value(self, v) -> None:
        v = _as_torch(v)
        who = self.name or "<unregistered parameter>"
        if tuple(v.shape) != self.shape:
            raise ValueError(f"parameter {who}: expected shape {list(self.shape)}, given {list(v.shape)}")
        if torch_dtype_to_str(v.dtype) != self.dtype:
            raise ValueError(f"parameter {who}: expected dtype {self.dtype}, given {torch_dtype_to_str(v.dtype)}")
        self._value = v

    @property
    def tensor(self) -> Tensor:
        """This weight as a Tensor of the default network (one constant layer per network,
        added again if a rewrite removed it)."""
        net = default_net()
        t = self._tensors.get(net)
        if t is None or not (net.has_tensor(t.name) and net.get_tensor(t.name) == t):
            name = self.name or f"unnamed_parameter_{id(self)}"
            if self._value is None:
                raise ValueError(f"parameter {name} ({self.dtype} {list(self.shape)}) has no value bound: set "
                                 f".value or call Module.load(weights) before building")
            t = self._tensors[net] = functional.constant(self._value, name=name)
        return t

    def __repr__(self) -> str:
        bound = "bound" if self._value is not None else "unbound"
        return f"Parameter({self.name!r}, {self.dtype}, {list(self.shape)}, {bound})"


def _as_torch(v) -> torch.Tensor:
    if isinstance(v, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(v))
    if isinstance(v, torch.Tensor):
        return v
    raise TypeError(f"a parameter value must be a torch.Tensor or numpy array, got {type(v).__name__}")
