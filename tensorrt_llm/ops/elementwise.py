"""Arithmetic: add, sub, mul, div (broadcasting), pow."""
from __future__ import annotations

import torch

from ..network import Tensor
from .op import REFERENCE, Op, add_layer, broadcast, check_same_dtype, define
from .tensor import as_tensor


def _broadcasting(name: str, reference) -> Op:
    """An op `name(a, b)` applying `reference` to a and b broadcast together; a Python or numpy
    value on either side becomes a constant in the other's dtype."""
    def graph_fn(a, b) -> Tensor:
        if not isinstance(a, Tensor):
            a = as_tensor(a, b)
        b = as_tensor(b, a)
        dtype = check_same_dtype(name, a, b)
        return add_layer(name, [a, b], [(dtype, broadcast(name, a.shape, b.shape))])
    return define(graph_fn, name=name, reference=reference)


add = _broadcasting("add", torch.add)
sub = _broadcasting("sub", torch.sub)
mul = _broadcasting("mul", torch.mul)
div = _broadcasting("div", torch.div)


@define
def pow(x: Tensor, exponent: float) -> Tensor:
    return add_layer("pow", [x], [(x.dtype, x.shape)], exponent=float(exponent))


pow.implementation(REFERENCE)(lambda x, *, exponent: torch.pow(x, exponent))
