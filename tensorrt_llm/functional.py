"""`Tensor` and the op library.

Every op appends one layer (op name = function name) to the default network, infers the
output dtype and shape there and then, and raises ValueError naming the op and the
offending shapes/dtypes on a mismatch. Dynamic dims are -1 and propagate. The meaning of
each op at run time is `reference_ops.REFERENCE_OPS[op]`.

`Tensor` is the graph's handle (network.py); this module gives it its operators and method
forms (`x + y`, `x.view(shape)`), at the end of the file.

`@record_signature` records an op's signature once, when it is defined. An op keeps each
tensor argument as a layer input (in parameter order) and every other argument as an attr
of the same name, so the call that made any layer, built here or loaded from JSON, can be
read back from the layer: graph_rewriting's `FLayerInfo`.
"""
from __future__ import annotations

import builtins
import inspect
import math
from typing import Optional, Sequence, Union

import numpy as np
import torch

from ._utils import canonical_dtype, is_floating, str_dtype_to_torch, torch_dtype_to_str
from .network import Tensor, default_net, shapes_compatible

Shape = tuple[int, ...]


# ---- the ops' signatures -----------------------------------------------------------------

# Op name -> the signature of the function that adds its layers (see record_signature).
OP_SIGNATURES: dict[str, inspect.Signature] = {}


def record_signature(op):
    """Record the signature of `op`, whose layers are named after it, so that the call that
    made one of its layers can be read back from the layer (graph_rewriting.FLayerInfo).
    Costs nothing per call: the op is returned as it is."""
    OP_SIGNATURES[op.__name__] = inspect.signature(op)
    return op


# ---- helpers ------------------------------------------------------------------------------


def _broadcast(op: str, *shapes: Shape) -> Shape:
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


def _norm_dim(op: str, dim: int, rank: int) -> int:
    if not -rank <= dim < rank:
        raise ValueError(f"{op}: dim {dim} out of range for rank {rank}")
    return dim % rank


def _check_same_dtype(op: str, *tensors: Tensor) -> str:
    dtypes = [t.dtype for t in tensors if t is not None]
    if len(set(dtypes)) > 1:
        raise ValueError(f"{op}: dtype mismatch: " + " vs ".join(f"{t.name} {t.dtype}" for t in tensors if t is not None))
    return dtypes[0]


def _check_int(op: str, t: Tensor, what: str) -> None:
    if t.dtype not in ("int32", "int64"):
        raise ValueError(f"{op}: {what} must be int32 or int64, got {t.dtype}")


def _check_shape(op: str, t: Tensor, expected: Sequence[int], what: str) -> None:
    if not shapes_compatible(t.shape, tuple(expected)):
        raise ValueError(f"{op}: {what} has shape {list(t.shape)}, expected {list(expected)}")


def _add(op: str, inputs: Sequence[Optional[Tensor]], outputs: Sequence[tuple[str, Sequence[int]]], **attrs):
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


def _to_torch(value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    return torch.tensor(value)


def _as_tensor(value, like: Tensor) -> Tensor:
    """Python/numpy/torch values become constants in `like`'s dtype."""
    if isinstance(value, Tensor):
        return value
    return constant(_to_torch(value).to(str_dtype_to_torch(like.dtype)))


# ---- ops ----------------------------------------------------------------------------------


@record_signature
def constant(value, name: Optional[str] = None) -> Tensor:
    """A weight (torch/numpy/Python value) stored in network.weights under `name`."""
    net = default_net()
    value = _to_torch(value)
    if name is None:
        i = len(net.weights)
        while f"constant_{i}" in net.weights:
            i += 1
        name = f"constant_{i}"
    elif name in net.weights and net.weights[name] is not value:
        raise ValueError(f"constant: network {net.name!r} already has a different weight named {name!r}")
    net.weights[name] = value
    return _add("constant", [], [(torch_dtype_to_str(value.dtype), value.shape)], weight=name)


@record_signature
def embedding(ids: Tensor, weight: Tensor) -> Tensor:
    _check_int("embedding", ids, "ids")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be [vocab, hidden], got {list(weight.shape)}")
    return _add("embedding", [ids, weight], [(weight.dtype, ids.shape + (weight.shape[1],))])


@record_signature
def matmul(a: Tensor, b: Tensor, transa: bool = False, transb: bool = False) -> Tensor:
    dtype = _check_same_dtype("matmul", a, b)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul: operands need rank >= 2, got {list(a.shape)} and {list(b.shape)}")
    m, ka = (a.shape[-1], a.shape[-2]) if transa else (a.shape[-2], a.shape[-1])
    kb, n = (b.shape[-1], b.shape[-2]) if transb else (b.shape[-2], b.shape[-1])
    if ka != kb and -1 not in (ka, kb):
        raise ValueError(f"matmul: inner dims differ: {list(a.shape)}{' (transposed)' if transa else ''} x "
                         f"{list(b.shape)}{' (transposed)' if transb else ''}")
    batch = _broadcast("matmul", a.shape[:-2], b.shape[:-2])
    return _add("matmul", [a, b], [(dtype, batch + (m, n))], transa=bool(transa), transb=bool(transb))


def _linear_shape(op: str, x_shape: Shape, weight: Tensor, bias: Optional[Tensor], what: str = "input") -> Shape:
    """The shape of x @ weight.T + bias for x of `x_shape` ([..., in]), weight [out, in],
    bias [out]; `what` names x in the error."""
    if weight.ndim != 2 or len(x_shape) < 1 or not shapes_compatible(x_shape[-1:], weight.shape[1:]):
        raise ValueError(f"{op}: {what} {list(x_shape)} does not match weight [out, in] {list(weight.shape)}")
    if bias is not None:
        _check_shape(op, bias, weight.shape[:1], "bias")
    return tuple(x_shape[:-1]) + weight.shape[:1]


@record_signature
def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """x @ weight.T + bias, weight [out, in]."""
    dtype = _check_same_dtype("linear", x, weight, bias)
    return _add("linear", [x, weight, bias], [(dtype, _linear_shape("linear", x.shape, weight, bias))])


def _binary(op: str, a, b) -> Tensor:
    if not isinstance(a, Tensor):
        a = _as_tensor(a, b)
    b = _as_tensor(b, a)
    dtype = _check_same_dtype(op, a, b)
    return _add(op, [a, b], [(dtype, _broadcast(op, a.shape, b.shape))])


@record_signature
def add(a, b) -> Tensor:
    return _binary("add", a, b)


@record_signature
def sub(a, b) -> Tensor:
    return _binary("sub", a, b)


@record_signature
def mul(a, b) -> Tensor:
    return _binary("mul", a, b)


@record_signature
def div(a, b) -> Tensor:
    return _binary("div", a, b)


@record_signature
def pow(x: Tensor, exponent: float) -> Tensor:
    return _add("pow", [x], [(x.dtype, x.shape)], exponent=float(exponent))


def _unary(op: str, x: Tensor) -> Tensor:
    if not is_floating(x.dtype):
        raise ValueError(f"{op}: needs a floating input, got {x.dtype}")
    return _add(op, [x], [(x.dtype, x.shape)])


@record_signature
def relu(x: Tensor) -> Tensor:
    return _unary("relu", x)


@record_signature
def gelu(x: Tensor) -> Tensor:
    return _unary("gelu", x)


@record_signature
def gelu_tanh(x: Tensor) -> Tensor:
    return _unary("gelu_tanh", x)


@record_signature
def silu(x: Tensor) -> Tensor:
    return _unary("silu", x)


@record_signature
def sigmoid(x: Tensor) -> Tensor:
    return _unary("sigmoid", x)


@record_signature
def tanh(x: Tensor) -> Tensor:
    return _unary("tanh", x)


@record_signature
def softmax(x: Tensor, dim: int = -1) -> Tensor:
    dim = _norm_dim("softmax", dim, x.ndim)
    if not is_floating(x.dtype):
        raise ValueError(f"softmax: needs a floating input, got {x.dtype}")
    return _add("softmax", [x], [(x.dtype, x.shape)], dim=dim)


def _check_norm_params(op: str, x: Tensor, *params: Optional[Tensor]) -> None:
    _check_same_dtype(op, x, *params)
    for p in params:
        if p is not None:
            _check_shape(op, p, x.shape[-1:], p.name)


@record_signature
def layer_norm(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """Normalises over the last dim; statistics in float32."""
    _check_norm_params("layer_norm", x, weight, bias)
    return _add("layer_norm", [x, weight, bias], [(x.dtype, x.shape)], eps=float(eps))


@record_signature
def rms_norm(x: Tensor, weight: Optional[Tensor] = None, eps: float = 1e-6) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim; statistics in float32."""
    _check_norm_params("rms_norm", x, weight)
    return _add("rms_norm", [x, weight], [(x.dtype, x.shape)], eps=float(eps))


@record_signature
def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Optional[Tensor] = None, eps: float = 1e-6):
    """(rms_norm(x + residual) * weight, x + residual)."""
    _check_norm_params("fused_add_rms_norm", x, weight)
    _check_same_dtype("fused_add_rms_norm", x, residual)
    shape = _residual_sum_shape("fused_add_rms_norm", x, residual)
    return _add("fused_add_rms_norm", [x, residual, weight], [(x.dtype, shape), (x.dtype, shape)], eps=float(eps))


def _residual_sum_shape(op: str, x: Tensor, residual: Tensor) -> Shape:
    """x + residual without broadcasting (fused kernels add row by row)."""
    if not shapes_compatible(x.shape, residual.shape):
        raise ValueError(f"{op}: x {list(x.shape)} and residual {list(residual.shape)} differ")
    return _broadcast(op, x.shape, residual.shape)


def _gated_shape(op: str, x: Tensor) -> Shape:
    last = x.shape[-1]
    if last != -1 and last % 2:
        raise ValueError(f"{op}: last dim must be even ([..., 2I]), got {list(x.shape)}")
    return x.shape[:-1] + ((last // 2) if last != -1 else -1,)


@record_signature
def silu_and_mul(x: Tensor) -> Tensor:
    """silu(x[..., :I]) * x[..., I:] for x [..., 2I]."""
    return _add("silu_and_mul", [x], [(x.dtype, _gated_shape("silu_and_mul", x))])


@record_signature
def gelu_and_mul(x: Tensor, approximate: str = "none") -> Tensor:
    """gelu(x[..., :I], approximate) * x[..., I:] for x [..., 2I]."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu_and_mul: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _add("gelu_and_mul", [x], [(x.dtype, _gated_shape("gelu_and_mul", x))], approximate=approximate)


# ---- a norm or gated activation and the linear reading it, as one op -----------------------
# Made by the fuse_norm_linear / fuse_act_linear passes so that a small-batch decode step can
# run each pair as one kernel; the meaning is the unfused pair's.


@record_signature
def rms_norm_linear(x: Tensor, norm_weight: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *,
                    eps: float) -> Tensor:
    """linear(rms_norm(x, norm_weight, eps), weight, bias)."""
    op = "rms_norm_linear"
    dtype = _check_same_dtype(op, x, norm_weight, weight, bias)
    _check_shape(op, norm_weight, x.shape[-1:], "norm_weight")
    return _add(op, [x, norm_weight, weight, bias], [(dtype, _linear_shape(op, x.shape, weight, bias))],
                eps=float(eps))


@record_signature
def add_rms_norm_linear(x: Tensor, residual: Tensor, norm_weight: Tensor, weight: Tensor,
                        bias: Optional[Tensor] = None, *, eps: float) -> tuple[Tensor, Tensor]:
    """(linear(rms_norm(x + residual, norm_weight, eps), weight, bias), x + residual)."""
    op = "add_rms_norm_linear"
    dtype = _check_same_dtype(op, x, residual, norm_weight, weight, bias)
    total = _residual_sum_shape(op, x, residual)
    _check_shape(op, norm_weight, total[-1:], "norm_weight")
    return _add(op, [x, residual, norm_weight, weight, bias],
                [(dtype, _linear_shape(op, total, weight, bias)), (dtype, total)], eps=float(eps))


@record_signature
def silu_and_mul_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """linear(silu_and_mul(x), weight, bias) for x [..., 2K], weight [N, K]."""
    op = "silu_and_mul_linear"
    dtype = _check_same_dtype(op, x, weight, bias)
    gated = _gated_shape(op, x)
    shape = _linear_shape(op, gated, weight, bias, what=f"input {list(x.shape)} gated to")
    return _add(op, [x, weight, bias], [(dtype, shape)])


# ---- rotary position embedding -------------------------------------------------------------


def rope_inv_freq(rotary_dim: int, theta: float = 10000.0, scaling: Optional[dict] = None) -> torch.Tensor:
    """Inverse frequencies [rotary_dim / 2] in float32 (Hugging Face's dtype), scaled."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    kind = (scaling or {}).get("type", (scaling or {}).get("rope_type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise ValueError(f"rope scaling type {kind!r} is not supported (None, 'linear' or 'llama3')")


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths slowed by `factor`, short ones kept, the band between
    the two cut-offs interpolated smoothly in 1/wavelength."""
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    long_cutoff, short_cutoff = original / low, original / high
    scaled = torch.where(wavelen > long_cutoff, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    interpolated = (1 - smooth) * scaled / factor + smooth * scaled
    in_between = (wavelen >= short_cutoff) & (wavelen <= long_cutoff)
    return torch.where(in_between, interpolated, scaled)


def rope_cos_sin_cache(max_positions: int, rotary_dim: int, theta: float = 10000.0,
                       scaling: Optional[dict] = None) -> torch.Tensor:
    """float32 [max_positions, rotary_dim]: row p is cat(cos(p * inv_freq), sin(p * inv_freq))."""
    if rotary_dim % 2:
        raise ValueError(f"rope_cos_sin_cache: rotary_dim must be even, got {rotary_dim}")
    inv_freq = rope_inv_freq(rotary_dim, theta, scaling).double()
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)  # exact products
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


@record_signature
def rotary_embedding(x: Tensor, position_ids: Tensor, cos_sin_cache: Tensor, *, num_heads: int, head_dim: int,
                     rotary_dim: Optional[int] = None, is_neox: bool = True) -> Tensor:
    """Rotate the first `rotary_dim` dims of each head of x [T, num_heads * head_dim]."""
    op = "rotary_embedding"
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    if x.ndim != 2 or x.shape[1] not in (-1, num_heads * head_dim):
        raise ValueError(f"{op}: x must be [T, num_heads*head_dim = {num_heads * head_dim}], got {list(x.shape)}")
    _check_int(op, position_ids, "position_ids")
    _check_shape(op, position_ids, x.shape[:1], "position_ids")
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ValueError(f"{op}: rotary_dim {rotary_dim} must be even and in (0, head_dim={head_dim}]")
    if cos_sin_cache.dtype != "float32" or cos_sin_cache.ndim != 2 or cos_sin_cache.shape[1] not in (-1, rotary_dim):
        raise ValueError(f"{op}: cos_sin_cache must be float32 [max_positions, {rotary_dim}], "
                         f"got {cos_sin_cache.dtype} {list(cos_sin_cache.shape)}")
    return _add(op, [x, position_ids, cos_sin_cache], [(x.dtype, x.shape)], num_heads=int(num_heads),
                head_dim=int(head_dim), rotary_dim=int(rotary_dim), is_neox=bool(is_neox))


# ---- attention -----------------------------------------------------------------------------


@record_signature
def gpt_attention(q: Tensor, k: Tensor, v: Tensor, kv_cache_pool: Tensor, block_tables: Tensor,
                  sequence_lengths: Tensor, context_lengths: Tensor, host_context_lengths: Tensor,
                  alibi_slopes: Optional[Tensor] = None, position_ids: Optional[Tensor] = None,
                  rotary_cos_sin: Optional[Tensor] = None, host_sequence_lengths: Optional[Tensor] = None, *,
                  layer_idx: int, num_heads: int, num_kv_heads: int,
                  head_dim: int, tokens_per_block: int, scale: Optional[float] = None,
                  sliding_window: Optional[int] = None, rotary_dim: int = 0, rotary_is_neox: bool = True) -> Tensor:
    """Causal attention over a paged KV cache; writes this step's K/V into
    kv_cache_pool[layer_idx] first (see docs/architecture.md). With `rotary_cos_sin` (and
    `position_ids`), q and k are first rotated as `rotary_embedding` would (the fused form
    the builder's fuse_rope_attention pass makes, so a kernel can rotate in the same pass).
    `host_sequence_lengths` (CPU) lets an implementation see, without a device sync, which
    sequences have no cached past (a prompt's first step)."""
    op = "gpt_attention"
    if num_heads % num_kv_heads:
        raise ValueError(f"{op}: num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    dtype = _check_same_dtype(op, q, k, v, kv_cache_pool)
    num_tokens = q.shape[0] if q.ndim == 2 else -1
    _check_shape(op, q, (num_tokens, num_heads * head_dim), "q")
    _check_shape(op, k, (num_tokens, num_kv_heads * head_dim), "k")
    _check_shape(op, v, (num_tokens, num_kv_heads * head_dim), "v")
    pool = kv_cache_pool.shape
    if len(pool) != 6 or not shapes_compatible(pool[2:], (2, num_kv_heads, tokens_per_block, head_dim)):
        raise ValueError(f"{op}: kv_cache_pool must be [num_layers, num_blocks, 2, {num_kv_heads}, "
                         f"{tokens_per_block}, {head_dim}], got {list(pool)}")
    if pool[0] != -1 and not 0 <= layer_idx < pool[0]:
        raise ValueError(f"{op}: layer_idx {layer_idx} out of range for a pool of {pool[0]} layers")
    for t, rank in ((block_tables, 2), (sequence_lengths, 1), (context_lengths, 1), (host_context_lengths, 1)):
        if t.dtype != "int32" or t.ndim != rank:
            raise ValueError(f"{op}: {t.name} must be int32 of rank {rank}, got {t.dtype} {list(t.shape)}")
    batch = block_tables.shape[:1]
    for t in (sequence_lengths, context_lengths, host_context_lengths):
        _check_shape(op, t, batch, t.name)
    if alibi_slopes is not None:
        if not is_floating(alibi_slopes.dtype):
            raise ValueError(f"{op}: alibi_slopes must be floating, got {alibi_slopes.dtype}")
        _check_shape(op, alibi_slopes, (num_heads,), "alibi_slopes")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"{op}: sliding_window must be >= 1, got {sliding_window}")
    inputs = [q, k, v, kv_cache_pool, block_tables, sequence_lengths, context_lengths, host_context_lengths,
              alibi_slopes]
    rotary = {}
    if (position_ids is None) != (rotary_cos_sin is None):
        raise ValueError(f"{op}: position_ids and rotary_cos_sin are given together or not at all")
    if rotary_cos_sin is not None:
        _check_int(op, position_ids, "position_ids")
        _check_shape(op, position_ids, (num_tokens,), "position_ids")
        if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(f"{op}: rotary_dim must be even and in (0, {head_dim}], got {rotary_dim}")
        _check_shape(op, rotary_cos_sin, (-1, rotary_dim), "rotary_cos_sin")
        rotary = dict(rotary_dim=int(rotary_dim), rotary_is_neox=bool(rotary_is_neox))
    inputs += [position_ids, rotary_cos_sin]
    if host_sequence_lengths is not None:
        if host_sequence_lengths.dtype != "int32" or host_sequence_lengths.ndim != 1:
            raise ValueError(f"{op}: host_sequence_lengths must be int32 of rank 1, got "
                             f"{host_sequence_lengths.dtype} {list(host_sequence_lengths.shape)}")
        _check_shape(op, host_sequence_lengths, batch, "host_sequence_lengths")
        inputs.append(host_sequence_lengths)
    return _add(op, inputs, [(dtype, (num_tokens, num_heads * head_dim))], layer_idx=int(layer_idx),
                num_heads=int(num_heads), num_kv_heads=int(num_kv_heads), head_dim=int(head_dim),
                tokens_per_block=int(tokens_per_block), scale=None if scale is None else float(scale),
                sliding_window=None if sliding_window is None else int(sliding_window), **rotary)


# ---- shape manipulation --------------------------------------------------------------------


@record_signature
def concat(inputs: Sequence[Tensor], dim: int = 0) -> Tensor:
    inputs = list(inputs)
    if not inputs:
        raise ValueError("concat: needs at least one input")
    dtype = _check_same_dtype("concat", *inputs)
    rank = inputs[0].ndim
    dim = _norm_dim("concat", dim, rank)
    out = list(inputs[0].shape)
    for t in inputs[1:]:
        others_match = t.ndim == rank and all(
            a == b or -1 in (a, b) for i, (a, b) in enumerate(zip(out, t.shape)) if i != dim)
        if not others_match:
            raise ValueError(f"concat: shapes {[list(t.shape) for t in inputs]} differ outside dim {dim}")
        out = [a if a != -1 else b for a, b in zip(out, t.shape)]
    sizes = [t.shape[dim] for t in inputs]
    out[dim] = -1 if -1 in sizes else sum(sizes)
    return _add("concat", inputs, [(dtype, out)], dim=dim)


@record_signature
def split(x: Tensor, sizes: Union[int, Sequence[int]], dim: int = 0) -> tuple[Tensor, ...]:
    """torch.split: `sizes` is a list of section sizes, or one chunk size (static dim)."""
    dim = _norm_dim("split", dim, x.ndim)
    total = x.shape[dim]
    if isinstance(sizes, int):
        if total == -1:
            raise ValueError(f"split: a chunk size needs a static dim, {list(x.shape)} dim {dim} is dynamic")
        sizes = [min(sizes, total - start) for start in range(0, total, sizes)]
    sizes = [int(s) for s in sizes]
    if total != -1 and sum(sizes) != total:
        raise ValueError(f"split: sizes {sizes} do not add up to dim {dim} of {list(x.shape)}")
    outs = [(x.dtype, x.shape[:dim] + (s,) + x.shape[dim + 1:]) for s in sizes]
    result = _add("split", [x], outs, sizes=sizes, dim=dim)
    return result if isinstance(result, tuple) else (result,)


@record_signature
def slice(x: Tensor, dim: int, start: int, end: Optional[int] = None) -> Tensor:
    """x[..., start:end, ...] along `dim` (Python slicing, step 1)."""
    dim = _norm_dim("slice", dim, x.ndim)
    size = x.shape[dim]
    if size != -1:
        out = len(range(*builtins.slice(start, end).indices(size)))
    elif start >= 0 and end is not None and end >= 0:
        out = max(0, end - start)
    else:
        out = -1
    shape = x.shape[:dim] + (out,) + x.shape[dim + 1:]
    return _add("slice", [x], [(x.dtype, shape)], dim=dim, start=int(start), end=None if end is None else int(end))


@record_signature
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
    return _add("view", [x], [(x.dtype, out)], shape=shape)


@record_signature
def permute(x: Tensor, dims: Sequence[int]) -> Tensor:
    dims = [_norm_dim("permute", d, x.ndim) for d in dims]
    if sorted(dims) != list(range(x.ndim)):
        raise ValueError(f"permute: {dims} is not a permutation of the dims of {list(x.shape)}")
    return _add("permute", [x], [(x.dtype, [x.shape[d] for d in dims])], dims=dims)


@record_signature
def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    dim0, dim1 = _norm_dim("transpose", dim0, x.ndim), _norm_dim("transpose", dim1, x.ndim)
    shape = list(x.shape)
    shape[dim0], shape[dim1] = shape[dim1], shape[dim0]
    return _add("transpose", [x], [(x.dtype, shape)], dim0=dim0, dim1=dim1)


@record_signature
def unsqueeze(x: Tensor, dim: int) -> Tensor:
    dim = _norm_dim("unsqueeze", dim, x.ndim + 1)
    return _add("unsqueeze", [x], [(x.dtype, x.shape[:dim] + (1,) + x.shape[dim:])], dim=dim)


@record_signature
def squeeze(x: Tensor, dim: int) -> Tensor:
    dim = _norm_dim("squeeze", dim, x.ndim)
    if x.shape[dim] not in (1, -1):
        raise ValueError(f"squeeze: dim {dim} of {list(x.shape)} is not 1")
    return _add("squeeze", [x], [(x.dtype, x.shape[:dim] + x.shape[dim + 1:])], dim=dim)


@record_signature
def gather(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """torch.gather: out[i][j] = x[index[i][j]][j] for dim 0, and so on."""
    dim = _norm_dim("gather", dim, x.ndim)
    _check_int("gather", index, "index")
    if index.ndim != x.ndim:
        raise ValueError(f"gather: index {list(index.shape)} must have the rank of x {list(x.shape)}")
    return _add("gather", [x, index], [(x.dtype, index.shape)], dim=dim)


@record_signature
def index_select(x: Tensor, dim: int, index: Tensor) -> Tensor:
    dim = _norm_dim("index_select", dim, x.ndim)
    _check_int("index_select", index, "index")
    if index.ndim != 1:
        raise ValueError(f"index_select: index must be 1-D, got {list(index.shape)}")
    shape = x.shape[:dim] + index.shape + x.shape[dim + 1:]
    return _add("index_select", [x, index], [(x.dtype, shape)], dim=dim)


@record_signature
def cast(x: Tensor, dtype) -> Tensor:
    dtype = canonical_dtype(dtype)
    return _add("cast", [x], [(dtype, x.shape)], dtype=dtype)


@record_signature
def where(condition: Tensor, x, y) -> Tensor:
    if condition.dtype != "bool":
        raise ValueError(f"where: condition must be bool, got {condition.dtype}")
    if not isinstance(x, Tensor):
        x = _as_tensor(x, y)
    y = _as_tensor(y, x)
    dtype = _check_same_dtype("where", x, y)
    shape = _broadcast("where", condition.shape, x.shape, y.shape)
    return _add("where", [condition, x, y], [(dtype, shape)])


@record_signature
def argmax(x: Tensor, dim: int = -1, keepdim: bool = False) -> Tensor:
    """Indices of the maxima, int64 (torch's index dtype)."""
    dim = _norm_dim("argmax", dim, x.ndim)
    shape = x.shape[:dim] + ((1,) if keepdim else ()) + x.shape[dim + 1:]
    return _add("argmax", [x], [("int64", shape)], dim=dim, keepdim=bool(keepdim))


@record_signature
def allreduce(x: Tensor) -> Tensor:
    """Sum over the tensor-parallel group (identity at world size 1)."""
    return _add("allreduce", [x], [(x.dtype, x.shape)])


# ---- Tensor operators ------------------------------------------------------------------------
# network.Tensor is the graph's handle; the ops are its operators and method forms here, so
# that the graph layer below knows no op.

_TENSOR_METHODS = {
    "__add__": add, "__radd__": lambda self, other: add(other, self),
    "__sub__": sub, "__rsub__": lambda self, other: sub(other, self),
    "__mul__": mul, "__rmul__": lambda self, other: mul(other, self),
    "__truediv__": div, "__rtruediv__": lambda self, other: div(other, self),
    "__matmul__": matmul, "__neg__": lambda self: mul(self, -1), "__pow__": pow,
    "view": view, "permute": permute, "transpose": transpose, "unsqueeze": unsqueeze, "squeeze": squeeze,
    "cast": cast, "split": split,
}
for _name, _method in _TENSOR_METHODS.items():
    setattr(Tensor, _name, _method)
