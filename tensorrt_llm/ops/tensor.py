"""Ops that make, reshape, select or convert tensors (no arithmetic): constant, concat,
split, slice, view, permute, transpose, unsqueeze, squeeze, embedding, gather, index_select,
argmax, cast, where."""
from __future__ import annotations

import builtins
import math
from typing import Optional, Sequence, Union

import numpy as np
import torch

from .._utils import canonical_dtype, str_dtype_to_torch, torch_dtype_to_str
from ..network import Tensor, default_net
from .op import REFERENCE, add_layer, broadcast, check_int, check_same_dtype, define, norm_dim


def to_torch(value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    return torch.tensor(value)


def as_tensor(value, like: Tensor) -> Tensor:
    """Python/numpy/torch values become constants in `like`'s dtype."""
    if isinstance(value, Tensor):
        return value
    return constant(to_torch(value).to(str_dtype_to_torch(like.dtype)))


# ---- constant: a weight; executors read network.weights, so it has no implementation --------


@define
def constant(value, name: Optional[str] = None) -> Tensor:
    """A weight (torch/numpy/Python value) stored in network.weights under `name`."""
    net = default_net()
    value = to_torch(value)
    if name is None:
        i = len(net.weights)
        while f"constant_{i}" in net.weights:
            i += 1
        name = f"constant_{i}"
    elif name in net.weights and net.weights[name] is not value:
        raise ValueError(f"constant: network {net.name!r} already has a different weight named {name!r}")
    net.weights[name] = value
    return add_layer("constant", [], [(torch_dtype_to_str(value.dtype), value.shape)], weight=name)


# ---- shape -------------------------------------------------------------------------------------


@define
def concat(inputs: Sequence[Tensor], dim: int = 0) -> Tensor:
    inputs = list(inputs)
    if not inputs:
        raise ValueError("concat: needs at least one input")
    dtype = check_same_dtype("concat", *inputs)
    rank = inputs[0].ndim
    dim = norm_dim("concat", dim, rank)
    out = list(inputs[0].shape)
    for t in inputs[1:]:
        others_match = t.ndim == rank and all(
            a == b or -1 in (a, b) for i, (a, b) in enumerate(zip(out, t.shape)) if i != dim)
        if not others_match:
            raise ValueError(f"concat: shapes {[list(t.shape) for t in inputs]} differ outside dim {dim}")
        out = [a if a != -1 else b for a, b in zip(out, t.shape)]
    sizes = [t.shape[dim] for t in inputs]
    out[dim] = -1 if -1 in sizes else sum(sizes)
    return add_layer("concat", inputs, [(dtype, out)], dim=dim)


@concat.implementation(REFERENCE)
def concat_reference(*xs, dim):
    return torch.cat(xs, dim)


@define
def split(x: Tensor, sizes: Union[int, Sequence[int]], dim: int = 0) -> tuple[Tensor, ...]:
    """torch.split: `sizes` is a list of section sizes, or one chunk size (static dim)."""
    dim = norm_dim("split", dim, x.ndim)
    total = x.shape[dim]
    if isinstance(sizes, int):
        if total == -1:
            raise ValueError(f"split: a chunk size needs a static dim, {list(x.shape)} dim {dim} is dynamic")
        sizes = [min(sizes, total - start) for start in range(0, total, sizes)]
    sizes = [int(s) for s in sizes]
    if total != -1 and sum(sizes) != total:
        raise ValueError(f"split: sizes {sizes} do not add up to dim {dim} of {list(x.shape)}")
    outs = [(x.dtype, x.shape[:dim] + (s,) + x.shape[dim + 1:]) for s in sizes]
    result = add_layer("split", [x], outs, sizes=sizes, dim=dim)
    return result if isinstance(result, tuple) else (result,)


@split.implementation(REFERENCE)
def split_reference(x, *, sizes, dim):
    return tuple(torch.split(x, sizes, dim))


@define
def slice(x: Tensor, dim: int, start: int, end: Optional[int] = None) -> Tensor:
    """x[..., start:end, ...] along `dim` (Python slicing, step 1)."""
    dim = norm_dim("slice", dim, x.ndim)
    size = x.shape[dim]
    if size != -1:
        out = len(range(*builtins.slice(start, end).indices(size)))
    elif start >= 0 and end is not None and end >= 0:
        out = max(0, end - start)
    else:
        out = -1
    shape = x.shape[:dim] + (out,) + x.shape[dim + 1:]
    return add_layer("slice", [x], [(x.dtype, shape)], dim=dim, start=int(start), end=None if end is None else int(end))


@slice.implementation(REFERENCE)
def slice_reference(x, *, dim, start, end=None):
    return x[(builtins.slice(None),) * dim + (builtins.slice(start, end),)]


@define
def view(x: Tensor, shape: Sequence[int]) -> Tensor:
    """Reshape; a 0 copies that input dim, one -1 is inferred."""
    shape = [int(d) for d in shape]
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise ValueError(f"view: invalid target shape {shape}")
    out = []
    for i, d in enumerate(shape):
        if d == 0:
            if i >= x.ndim:
                raise ValueError(f"view: 0 at position {i} but input {list(x.shape)} has rank {x.ndim}")
            d = x.shape[i]
        out.append(d)
    in_static = -1 not in x.shape
    numel = math.prod(x.shape)
    if -1 in shape:
        rest = [d for i, d in enumerate(out) if i != shape.index(-1)]
        if in_static and -1 not in rest:
            known = math.prod(rest)
            if known == 0 or numel % known:
                raise ValueError(f"view: cannot view {list(x.shape)} as {shape}")
            out[shape.index(-1)] = numel // known
    elif in_static and math.prod(out) != numel:
        raise ValueError(f"view: cannot view {list(x.shape)} as {shape}")
    return add_layer("view", [x], [(x.dtype, out)], shape=shape)


@view.implementation(REFERENCE)
def view_reference(x, *, shape):
    return x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(shape)])


@define
def permute(x: Tensor, dims: Sequence[int]) -> Tensor:
    dims = [norm_dim("permute", d, x.ndim) for d in dims]
    if sorted(dims) != list(range(x.ndim)):
        raise ValueError(f"permute: {dims} is not a permutation of the dims of {list(x.shape)}")
    return add_layer("permute", [x], [(x.dtype, [x.shape[d] for d in dims])], dims=dims)


permute.implementation(REFERENCE)(lambda x, *, dims: x.permute(dims))


@define
def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    dim0, dim1 = norm_dim("transpose", dim0, x.ndim), norm_dim("transpose", dim1, x.ndim)
    shape = list(x.shape)
    shape[dim0], shape[dim1] = shape[dim1], shape[dim0]
    return add_layer("transpose", [x], [(x.dtype, shape)], dim0=dim0, dim1=dim1)


transpose.implementation(REFERENCE)(lambda x, *, dim0, dim1: x.transpose(dim0, dim1))


@define
def unsqueeze(x: Tensor, dim: int) -> Tensor:
    dim = norm_dim("unsqueeze", dim, x.ndim + 1)
    return add_layer("unsqueeze", [x], [(x.dtype, x.shape[:dim] + (1,) + x.shape[dim:])], dim=dim)


unsqueeze.implementation(REFERENCE)(lambda x, *, dim: x.unsqueeze(dim))


@define
def squeeze(x: Tensor, dim: int) -> Tensor:
    dim = norm_dim("squeeze", dim, x.ndim)
    if x.shape[dim] not in (1, -1):
        raise ValueError(f"squeeze: dim {dim} of {list(x.shape)} is not 1")
    return add_layer("squeeze", [x], [(x.dtype, x.shape[:dim] + x.shape[dim + 1:])], dim=dim)


@squeeze.implementation(REFERENCE)
def squeeze_reference(x, *, dim):
    if x.shape[dim] != 1:
        raise ValueError(f"squeeze: dim {dim} of {list(x.shape)} is not 1")
    return x.squeeze(dim)


# ---- selection -------------------------------------------------------------------------------


@define
def embedding(ids: Tensor, weight: Tensor, *, vocab_start: Optional[int] = None) -> Tensor:
    """The rows of `weight` the ids name. With `vocab_start`, `weight` holds the rows
    [vocab_start, vocab_start + rows) of a vocabulary-parallel table and ids outside them give
    zeros: the tensor-parallel ranks' results sum to the whole lookup."""
    check_int("embedding", ids, "ids")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be [vocab, hidden], got {list(weight.shape)}")
    if vocab_start is not None and (not isinstance(vocab_start, int) or vocab_start < 0):
        raise ValueError(f"embedding: vocab_start must be an integer >= 0, got {vocab_start!r}")
    attrs = {} if vocab_start is None else {"vocab_start": vocab_start}
    return add_layer("embedding", [ids, weight], [(weight.dtype, ids.shape + (weight.shape[1],))], **attrs)


@embedding.implementation(REFERENCE)
def embedding_reference(ids, weight, *, vocab_start=None):
    flat = ids.reshape(-1)
    if vocab_start is None:
        return weight.index_select(0, flat).view(*ids.shape, weight.shape[1])
    local = flat.long() - vocab_start
    inside = (local >= 0) & (local < weight.shape[0])
    rows = weight.index_select(0, torch.where(inside, local, 0))
    rows = rows.masked_fill(~inside.unsqueeze(1), 0)
    return rows.view(*ids.shape, weight.shape[1])


@define
def gather(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """torch.gather: out[i][j] = x[index[i][j]][j] for dim 0, and so on."""
    dim = norm_dim("gather", dim, x.ndim)
    check_int("gather", index, "index")
    if index.ndim != x.ndim:
        raise ValueError(f"gather: index {list(index.shape)} must have the rank of x {list(x.shape)}")
    return add_layer("gather", [x, index], [(x.dtype, index.shape)], dim=dim)


gather.implementation(REFERENCE)(lambda x, index, *, dim: torch.gather(x, dim, index.long()))


@define
def index_select(x: Tensor, dim: int, index: Tensor, *, increasing: bool = False) -> Tensor:
    """The slices of x along `dim` that index names, in its order. `increasing`: the caller
    promises a strictly increasing index within x's extent, so an index as long as that extent
    names every slice in order and the result is x itself, with no copy (an LLM's decode step,
    whose every row asks for its logits). An index that breaks the promise gives wrong rows,
    never a read outside x."""
    dim = norm_dim("index_select", dim, x.ndim)
    check_int("index_select", index, "index")
    if index.ndim != 1:
        raise ValueError(f"index_select: index must be 1-D, got {list(index.shape)}")
    if not isinstance(increasing, bool):
        raise ValueError(f"index_select: increasing must be a bool, got {increasing!r}")
    shape = x.shape[:dim] + index.shape + x.shape[dim + 1:]
    attrs = {"increasing": True} if increasing else {}
    return add_layer("index_select", [x, index], [(x.dtype, shape)], dim=dim, **attrs)


@index_select.implementation(REFERENCE)
def index_select_reference(x, index, *, dim, increasing=False):
    if increasing and index.shape[0] == x.shape[dim]:
        return x
    return torch.index_select(x, dim, index)


@define
def argmax(x: Tensor, dim: int = -1, keepdim: bool = False) -> Tensor:
    """Indices of the maxima, int64 (torch's index dtype)."""
    dim = norm_dim("argmax", dim, x.ndim)
    shape = x.shape[:dim] + ((1,) if keepdim else ()) + x.shape[dim + 1:]
    return add_layer("argmax", [x], [("int64", shape)], dim=dim, keepdim=bool(keepdim))


argmax.implementation(REFERENCE)(lambda x, *, dim, keepdim=False: torch.argmax(x, dim, keepdim))


@define
def where(condition: Tensor, x, y) -> Tensor:
    if condition.dtype != "bool":
        raise ValueError(f"where: condition must be bool, got {condition.dtype}")
    if not isinstance(x, Tensor):
        x = as_tensor(x, y)
    y = as_tensor(y, x)
    dtype = check_same_dtype("where", x, y)
    shape = broadcast("where", condition.shape, x.shape, y.shape)
    return add_layer("where", [condition, x, y], [(dtype, shape)])


where.implementation(REFERENCE)(torch.where)


# ---- conversion ------------------------------------------------------------------------------


@define
def cast(x: Tensor, dtype) -> Tensor:
    dtype = canonical_dtype(dtype)
    return add_layer("cast", [x], [(dtype, x.shape)], dtype=dtype)


cast.implementation(REFERENCE)(lambda x, *, dtype: x.to(str_dtype_to_torch(dtype)))
