"""Arithmetic: add, sub, mul, div (broadcasting), pow, and allreduce (the sum over the
tensor-parallel group)."""
from __future__ import annotations

import torch

from ..network import Tensor
from .op import REFERENCE, add_layer, broadcast, check_same_dtype, define
from .tensor import as_tensor


def _binary(op: str, a, b) -> Tensor:
    if not isinstance(a, Tensor):
        a = as_tensor(a, b)
    b = as_tensor(b, a)
    dtype = check_same_dtype(op, a, b)
    return add_layer(op, [a, b], [(dtype, broadcast(op, a.shape, b.shape))])


@define
def add(a, b) -> Tensor:
    return _binary("add", a, b)


@define
def sub(a, b) -> Tensor:
    return _binary("sub", a, b)


@define
def mul(a, b) -> Tensor:
    return _binary("mul", a, b)


@define
def div(a, b) -> Tensor:
    return _binary("div", a, b)


add.implementation(REFERENCE)(torch.add)
sub.implementation(REFERENCE)(torch.sub)
mul.implementation(REFERENCE)(torch.mul)
div.implementation(REFERENCE)(torch.div)


@define
def pow(x: Tensor, exponent: float) -> Tensor:
    return add_layer("pow", [x], [(x.dtype, x.shape)], exponent=float(exponent))


pow.implementation(REFERENCE)(lambda x, *, exponent: torch.pow(x, exponent))


@define
def allreduce(x: Tensor) -> Tensor:
    """Sum over the tensor-parallel group (identity at world size 1)."""
    return add_layer("allreduce", [x], [(x.dtype, x.shape)])


@allreduce.implementation(REFERENCE)
def allreduce_reference(x):
    """Sum over the default process group once torch.distributed runs with > 1 ranks."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return x
    out = x.clone()
    dist.all_reduce(out)
    return out
