"""ONNX export and re-import of a `Network`.

Every op maps to standard ONNX (opset `OPSET`) except those ONNX has no equivalent for,
which become nodes of the custom domain `tensorrt_llm` (semantics in docs/network.md):

- `GptAttention`: `gpt_attention` (paged attention that also writes the KV cache).
- `AllReduce`: `allreduce`, the sum over the tensor-parallel group.

Their inputs are the layer's inputs in order (absent optional ones as empty names) and
their attributes the layer's attrs (those that are None left out).

The fused ops (`fused_add_rms_norm`, `silu_and_mul`, `gelu_and_mul`, `rms_norm_linear`,
`add_rms_norm_linear`, `silu_and_mul_linear`) are decomposed into standard ops, so an
optimized network still runs in ONNX Runtime. Ops that the reference computes in float32
(norms, softmax, rotary) are wrapped in Casts for half precision.

Weights become initializers named after the weight; a weight read only as the weight of
linears (plain or fused) is stored transposed ([in, out]) so that each of those linears is a
plain MatMul. Past `external_data_threshold` bytes of weights (default 2 GB, under
protobuf's 2 GiB limit) every weight is written to `<model file>.data` instead, one after
the other.

Re-import (`graph_from_onnx`, which `Network.from_onnx` calls) reads the graph from the
JSON form that the exporter stores in the model's metadata (`tensorrt_llm.network`) and the
weight data from the initializers: composed ops (rms_norm, rotary) are many ONNX nodes each,
so mapping nodes back would take a pattern matcher per op.

This module sits below network.py, whose `to_onnx` / `from_onnx` call it: it reads a
Network through its public API and hands back JSON and weights, so it never imports it.
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import onnx
import torch
from onnx import TensorProto, helper

from ._utils import str_dtype_to_torch, torch_dtype_to_str

if TYPE_CHECKING:
    from .network import Network

OPSET = 20  # LayerNormalization (17), Split num_outputs / ReduceMean axes input (18), Gelu (20)
IR_VERSION = 9  # the IR version of opset 20
CUSTOM_DOMAIN = "tensorrt_llm"
CUSTOM_OPSET = 1
EXTERNAL_DATA_THRESHOLD = 2_000_000_000
META_NETWORK = "tensorrt_llm.network"
META_WEIGHTS = "tensorrt_llm.weights"

ONNX_DTYPES = {
    "float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
    "int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int32": TensorProto.INT32,
    "int64": TensorProto.INT64, "bool": TensorProto.BOOL,
}
_DTYPES_FROM_ONNX = {code: name for name, code in ONNX_DTYPES.items()}
_INT64_MAX = 2**63 - 1


# ---- tensors ---------------------------------------------------------------------------------


def _raw_bytes(t: torch.Tensor):
    """The tensor's little-endian bytes as a uint8 numpy array (no copy when contiguous)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def _tensor_proto(name: str, t: torch.Tensor) -> TensorProto:
    """Built from raw bytes, which covers bfloat16 (numpy has no such dtype)."""
    proto = TensorProto(name=name, data_type=ONNX_DTYPES[torch_dtype_to_str(t.dtype)], dims=list(t.shape))
    proto.raw_data = _raw_bytes(t).tobytes()
    return proto


def _tensor_from_proto(proto: TensorProto) -> torch.Tensor:
    dtype = str_dtype_to_torch(_DTYPES_FROM_ONNX[proto.data_type])
    if not proto.raw_data:  # torch.frombuffer refuses an empty buffer
        return torch.empty(list(proto.dims), dtype=dtype)
    return torch.frombuffer(bytearray(proto.raw_data), dtype=dtype).reshape(list(proto.dims))


# ---- the graph builder -----------------------------------------------------------------------


class _Graph:
    """Collects ONNX nodes for one network; converters call `op` with ONNX value names."""

    def __init__(self, used_names):
        self.nodes: list[onnx.NodeProto] = []
        self.used = set(used_names)
        self.dtypes: dict[str, str] = {}  # ONNX value -> dtype, for network tensors and weights
        self.ranks: dict[str, int] = {}
        self.pretransposed: set[str] = set()  # initializers stored as weight.T
        self.scope = "graph"

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name

    def op(self, op_type: str, *inputs, outputs: int = 1, domain: str = "", **attrs):
        """Append a node; returns its output name, or a tuple of names for several outputs.
        None inputs become "" (an absent optional input); trailing ones are left off, as
        ONNX Runtime 1.31 crashes on a LayerNormalization with an explicit empty bias."""
        inputs = list(inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        outs = [self.fresh(f"{self.scope}/{op_type}") for _ in range(outputs)]
        node = helper.make_node(op_type, ["" if i is None else i for i in inputs], outs,
                                name=self.fresh(f"{self.scope}/{op_type}_node"), domain=domain, **attrs)
        self.nodes.append(node)
        return outs[0] if outputs == 1 else tuple(outs)

    def const(self, values, dtype: str = "int64") -> str:
        """A small Constant node (shapes, axes, scalars); initializers hold weights only."""
        t = torch.tensor(values, dtype=str_dtype_to_torch(dtype))
        return self.op("Constant", value=_tensor_proto(self.fresh(f"{self.scope}/const"), t))

    def cast(self, x: str, from_dtype: str, to_dtype: str) -> str:
        return x if from_dtype == to_dtype else self.op("Cast", x, to=ONNX_DTYPES[to_dtype])


# ---- converters: ONNX_OPS[op](g, *inputs, **attrs) mirrors the op's reference (tensorrt_llm/ops) ---


def _float32_math(fn):
    """Run `fn` in float32 and cast back, as the reference does for softmax, layer_norm, rotary."""
    def converter(g, x, *rest, **attrs):
        dtype = g.dtypes[x]
        return g.cast(fn(g, g.cast(x, dtype, "float32"), *rest, dtype=dtype, **attrs), "float32", dtype)
    return converter


def _embedding(g, ids, weight, vocab_start=None):
    if vocab_start is not None:
        raise ValueError("ONNX export of a vocabulary-parallel (tensor-parallel) embedding is not supported")
    return g.op("Gather", weight, ids, axis=0)


def _swap_last_two(g, x):
    rank = g.ranks[x]
    return g.op("Transpose", x, perm=list(range(rank - 2)) + [rank - 1, rank - 2])


def _matmul(g, a, b, *, transa=False, transb=False):
    return g.op("MatMul", _swap_last_two(g, a) if transa else a, _swap_last_two(g, b) if transb else b)


def _linear(g, x, weight, bias=None):
    weight_t = weight if weight in g.pretransposed else g.op("Transpose", weight, perm=[1, 0])
    y = g.op("MatMul", x, weight_t)
    return y if bias is None else g.op("Add", y, bias)


def _pow(g, x, *, exponent):
    return g.op("Pow", x, g.const(exponent, g.dtypes[x]))


def _silu(g, x):
    return g.op("Mul", x, g.op("Sigmoid", x))


def _softmax(g, x, *, dim, dtype):
    return g.op("Softmax", x, axis=dim)


def _layer_norm(g, x, weight=None, bias=None, *, eps, dtype):
    if weight is None:  # ONNX requires a scale: ones of the last dim's size
        ones = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
        weight = g.op("ConstantOfShape", g.op("Shape", x, start=-1), value=ones)
    else:
        weight = g.cast(weight, dtype, "float32")
    bias = None if bias is None else g.cast(bias, dtype, "float32")
    return g.op("LayerNormalization", x, weight, bias, axis=-1, epsilon=eps, stash_type=1)


def _rms_normalize(g, x, eps):
    """x / sqrt(mean(x^2, -1) + eps) for float32 x."""
    mean_square = g.op("ReduceMean", g.op("Mul", x, x), g.const([-1]), keepdims=1)
    rms = g.op("Sqrt", g.op("Add", mean_square, g.const(eps, "float32")))
    return g.op("Div", x, rms)


def _rms_norm(g, x, weight=None, *, eps):
    # Normalise in float32, round to the input dtype, then scale (the reference's order).
    dtype = g.dtypes[x]
    normed = g.cast(_rms_normalize(g, g.cast(x, dtype, "float32"), eps), "float32", dtype)
    return normed if weight is None else g.op("Mul", normed, weight)


def _fused_add_rms_norm(g, x, residual, weight=None, *, eps):
    total = g.op("Add", x, residual)
    g.dtypes[total] = g.dtypes[x]
    return _rms_norm(g, total, weight, eps=eps), total


def _gated(g, x, activation):
    gate, up = g.op("Split", x, axis=-1, num_outputs=2, outputs=2)
    return g.op("Mul", activation(gate), up)


def _silu_and_mul(g, x):
    return _gated(g, x, lambda gate: _silu(g, gate))


def _gelu_and_mul(g, x, *, approximate="none"):
    return _gated(g, x, lambda gate: g.op("Gelu", gate, approximate=approximate))


def _rms_norm_linear(g, x, norm_weight, weight, bias=None, *, eps):
    return _linear(g, _rms_norm(g, x, norm_weight, eps=eps), weight, bias)


def _add_rms_norm_linear(g, x, residual, norm_weight, weight, bias=None, *, eps):
    normed, total = _fused_add_rms_norm(g, x, residual, norm_weight, eps=eps)
    return _linear(g, normed, weight, bias), total


def _silu_and_mul_linear(g, x, weight, bias=None):
    return _linear(g, _silu_and_mul(g, x), weight, bias)


def _rotary_embedding(g, x, position_ids, cos_sin_cache, *, num_heads, head_dim, rotary_dim, is_neox, dtype):
    """x is float32 here. Gathers each token's cos/sin row and rotates the first rotary_dim
    dims of each head: halves (NeoX) or interleaved pairs (GPT-J)."""
    rows = g.op("Unsqueeze", g.op("Gather", cos_sin_cache, position_ids, axis=0), g.const([1]))  # [T, 1, r]
    cos, sin = g.op("Split", rows, axis=-1, num_outputs=2, outputs=2)  # [T, 1, r/2]
    heads = g.op("Reshape", x, g.const([0, num_heads, head_dim]))  # [T, H, D]
    rot = g.op("Slice", heads, g.const([0]), g.const([rotary_dim]), g.const([2]))
    if is_neox:
        x1, x2 = g.op("Split", rot, axis=-1, num_outputs=2, outputs=2)
    else:  # pairs become a trailing axis of 2: [T, H, r/2, 2]
        pairs = g.op("Reshape", rot, g.const([0, num_heads, rotary_dim // 2, 2]))
        x1, x2 = g.op("Split", pairs, axis=-1, num_outputs=2, outputs=2)  # [T, H, r/2, 1]
        cos, sin = (g.op("Unsqueeze", t, g.const([-1])) for t in (cos, sin))
    first = g.op("Sub", g.op("Mul", x1, cos), g.op("Mul", x2, sin))
    second = g.op("Add", g.op("Mul", x2, cos), g.op("Mul", x1, sin))
    out = g.op("Concat", first, second, axis=-1)
    if not is_neox:
        out = g.op("Reshape", out, g.const([0, num_heads, rotary_dim]))
    if rotary_dim < head_dim:  # pass-through dims (exact through the float32 round trip)
        rest = g.op("Slice", heads, g.const([rotary_dim]), g.const([head_dim]), g.const([2]))
        out = g.op("Concat", out, rest, axis=-1)
    return g.op("Reshape", out, g.const([0, num_heads * head_dim]))


def _custom(op_type: str):
    """A node of the tensorrt_llm domain: the layer's inputs in order (absent optional ones
    as empty names) and its attrs, leaving out those that are None."""
    def converter(g, *inputs, **attrs):
        return g.op(op_type, *inputs, domain=CUSTOM_DOMAIN, **{k: v for k, v in attrs.items() if v is not None})
    return converter


def _concat(g, *xs, dim):
    return g.op("Concat", *xs, axis=dim)


def _split(g, x, *, sizes, dim):
    outs = g.op("Split", x, g.const(sizes), axis=dim, outputs=len(sizes))
    return outs if len(sizes) > 1 else (outs,)


def _slice(g, x, *, dim, start, end=None):
    end = _INT64_MAX if end is None else end  # ONNX clamps like Python slicing
    return g.op("Slice", x, g.const([start]), g.const([end]), g.const([dim]))


def _transpose(g, x, *, dim0, dim1):
    perm = list(range(g.ranks[x]))
    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    return g.op("Transpose", x, perm=perm)


ONNX_OPS = {
    "embedding": _embedding,
    "matmul": _matmul,
    "linear": _linear,
    "add": lambda g, a, b: g.op("Add", a, b),
    "sub": lambda g, a, b: g.op("Sub", a, b),
    "mul": lambda g, a, b: g.op("Mul", a, b),
    "div": lambda g, a, b: g.op("Div", a, b),
    "pow": _pow,
    "relu": lambda g, x: g.op("Relu", x),
    "gelu": lambda g, x: g.op("Gelu", x),
    "gelu_tanh": lambda g, x: g.op("Gelu", x, approximate="tanh"),
    "silu": _silu,
    "sigmoid": lambda g, x: g.op("Sigmoid", x),
    "tanh": lambda g, x: g.op("Tanh", x),
    "softmax": _float32_math(_softmax),
    "layer_norm": _float32_math(_layer_norm),
    "rms_norm": _rms_norm,
    "fused_add_rms_norm": _fused_add_rms_norm,
    "silu_and_mul": _silu_and_mul,
    "gelu_and_mul": _gelu_and_mul,
    "rms_norm_linear": _rms_norm_linear,
    "add_rms_norm_linear": _add_rms_norm_linear,
    "silu_and_mul_linear": _silu_and_mul_linear,
    "rotary_embedding": _float32_math(_rotary_embedding),
    "gpt_attention": _custom("GptAttention"),
    "concat": _concat,
    "split": _split,
    "slice": _slice,
    "view": lambda g, x, *, shape: g.op("Reshape", x, g.const(shape)),  # 0 copies a dim, as in ONNX
    "transpose": _transpose,
    "permute": lambda g, x, *, dims: g.op("Transpose", x, perm=dims),
    "unsqueeze": lambda g, x, *, dim: g.op("Unsqueeze", x, g.const([dim])),
    "squeeze": lambda g, x, *, dim: g.op("Squeeze", x, g.const([dim])),
    "gather": lambda g, x, index, *, dim: g.op("GatherElements", x, index, axis=dim),
    "index_select": lambda g, x, index, *, dim, increasing=False: g.op("Gather", x, index, axis=dim),
    "cast": lambda g, x, *, dtype: g.op("Cast", x, to=ONNX_DTYPES[dtype]),
    "where": lambda g, cond, a, b: g.op("Where", cond, a, b),
    "argmax": lambda g, x, *, dim, keepdim=False: g.op("ArgMax", x, axis=dim, keepdims=int(keepdim)),
    "allreduce": _custom("AllReduce"),
}
CUSTOM_OPS = {"gpt_attention", "allreduce"}
# The input of each op that is a linear's weight [out, in] (what `_linear` converts).
_LINEAR_WEIGHT_INPUT = {"linear": 1, "rms_norm_linear": 2, "add_rms_norm_linear": 3, "silu_and_mul_linear": 1}


# ---- export ----------------------------------------------------------------------------------


def _linear_only_weights(network: Network) -> set[str]:
    """2-D weights whose every constant layer is read only as the weight of linears
    (_LINEAR_WEIGHT_INPUT)."""
    results = set(network.outputs) | set(network.debug_outputs)
    verdict: dict[str, bool] = {}
    for layer in network.layers:
        if layer.op != "constant":
            continue
        out, name = layer.outputs[0], layer.attrs["weight"]
        readers = network.consumers(out)
        ok = (bool(readers) and out not in results and network.weights[name].ndim == 2
              and all(r.op in _LINEAR_WEIGHT_INPUT and [i for i, n in enumerate(r.inputs) if n == out]
                      == [_LINEAR_WEIGHT_INPUT[r.op]] for r in readers))
        verdict[name] = verdict.get(name, True) and ok
    return {name for name, ok in verdict.items() if ok}


class _WeightWriter:
    """Initializers holding the weight data inline, or in one external file."""

    def __init__(self, path: str, external: bool):
        self.location = os.path.basename(path) + ".data" if external else None
        self._file = open(path + ".data", "wb") if external else None

    def initializer(self, name: str, data: torch.Tensor) -> TensorProto:
        if self._file is None:
            return _tensor_proto(name, data)
        proto = TensorProto(name=name, data_type=ONNX_DTYPES[torch_dtype_to_str(data.dtype)], dims=list(data.shape))
        raw = _raw_bytes(data)
        proto.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", self._file.tell()), ("length", raw.nbytes)):
            proto.external_data.add(key=key, value=str(value))
        self._file.write(raw.data)
        return proto

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _value_info(name: str, dtype: str, dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, ONNX_DTYPES[dtype], list(dims))


def _named_output_dims(graph: onnx.GraphProto, initializers: list[TensorProto], opsets) -> dict[str, list]:
    """Output dims as ONNX shape inference names them (dim_params propagate from the
    inputs). Inferred on a copy whose weights are inputs, so no weight data is copied."""
    weight_inputs = [_value_info(t.name, _DTYPES_FROM_ONNX[t.data_type], t.dims) for t in initializers]
    light = helper.make_graph(graph.node, graph.name, list(graph.input) + weight_inputs, graph.output,
                              value_info=graph.value_info)
    model = helper.make_model(light, opset_imports=opsets, ir_version=IR_VERSION)
    inferred = onnx.shape_inference.infer_shapes(model).graph.output
    return {out.name: [d.dim_param or (d.dim_value if d.HasField("dim_value") else None)
                       for d in out.type.tensor_type.shape.dim] for out in inferred}


def export(network: Network, path: str, external_data_threshold: int = EXTERNAL_DATA_THRESHOLD) -> None:
    """Write `network` as an ONNX model to `path` (weights in `path + '.data'` when they
    take more than `external_data_threshold` bytes)."""
    graph_json = network.to_json()  # also refuses networks with layers marked removed
    layers = network.layers
    tensor_names = [t.name for t in network.inputs] + [out for layer in layers for out in layer.outputs]
    g = _Graph(tensor_names)
    value: dict[str, str] = {}  # network tensor -> ONNX value
    for t in network.inputs:
        value[t.name] = t.name
        g.dtypes[t.name], g.ranks[t.name] = t.dtype, t.ndim

    # Weights -> initializers.
    external = sum(w.numel() * w.element_size() for w in network.weights.values()) > external_data_threshold
    writer = _WeightWriter(path, external)
    initializers, weight_table = [], {}
    linear_only = _linear_only_weights(network)
    try:
        for name, data in network.weights.items():
            transposed = name in linear_only
            init_name = g.fresh(name)
            initializers.append(writer.initializer(init_name, data.t() if transposed else data))
            weight_table[name] = {"initializer": init_name, "transposed": transposed}
            g.dtypes[init_name], g.ranks[init_name] = torch_dtype_to_str(data.dtype), data.ndim
            if transposed:
                g.pretransposed.add(init_name)
    finally:
        writer.close()

    # Layers -> nodes. A converter's results are renamed to the layer's output names.
    custom_outputs = []
    for layer in layers:
        if layer.op == "constant":
            value[layer.outputs[0]] = weight_table[layer.attrs["weight"]]["initializer"]
            continue
        if layer.op not in ONNX_OPS:
            raise NotImplementedError(f"layer {layer.name!r}: op {layer.op!r} has no ONNX mapping")
        first_node = len(g.nodes)
        g.scope = layer.name
        inputs = [None if name is None else value[name] for name in layer.inputs]
        results = ONNX_OPS[layer.op](g, *inputs, **layer.attrs)
        results = (results,) if isinstance(results, str) else tuple(results)
        for out, result in zip(layer.outputs, results):
            value[out] = _rename_value(g.nodes[first_node:], result, out)
            spec = network.get_tensor(out)
            g.dtypes[value[out]], g.ranks[value[out]] = spec.dtype, spec.ndim
            if layer.op in CUSTOM_OPS:  # ONNX cannot infer these; downstream shapes need them
                custom_outputs.append(_value_info(value[out], spec.dtype, [d if d >= 0 else None for d in spec.shape]))

    results = list(dict.fromkeys(network.outputs + network.debug_outputs))
    for name in results:
        if value[name] != name:  # a weight or an input returned as is
            g.scope = name
            g.nodes.append(helper.make_node("Identity", [value[name]], [name], name=g.fresh(f"{name}/Identity")))

    inputs = [_value_info(t.name, t.dtype, [network.dim_range(t.name)[axis][0] if d == -1 else d
                                            for axis, d in enumerate(t.shape)]) for t in network.inputs]
    outputs = [_value_info(name, network.get_tensor(name).dtype,
                           [d if d >= 0 else None for d in network.get_tensor(name).shape]) for name in results]
    opsets = [helper.make_opsetid("", OPSET)]
    if any(node.domain == CUSTOM_DOMAIN for node in g.nodes):
        opsets.append(helper.make_opsetid(CUSTOM_DOMAIN, CUSTOM_OPSET))
    graph = helper.make_graph(g.nodes, network.name, inputs, outputs, value_info=custom_outputs)
    named = _named_output_dims(graph, initializers, opsets)
    for out in graph.output:
        for dim, inferred in zip(out.type.tensor_type.shape.dim, named[out.name]):
            if not dim.HasField("dim_value") and isinstance(inferred, str):
                dim.dim_param = inferred
    graph.initializer.extend(initializers)

    model = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name="tensorrt_llm")
    helper.set_model_props(model, {META_NETWORK: graph_json, META_WEIGHTS: json.dumps(weight_table)})
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def _rename_value(nodes: list[onnx.NodeProto], old: str, new: str) -> str:
    """Rename value `old` to `new` if one of `nodes` produces it; returns the name to use."""
    if not any(old in node.output for node in nodes):
        return old  # not made by this layer (e.g. an input passed through)
    for node in nodes:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                if name == old:
                    field[i] = new
    return new


# ---- import ----------------------------------------------------------------------------------


def graph_from_onnx(path: str) -> tuple[str, dict[str, torch.Tensor]]:
    """The graph JSON and weights of a model written by `export` (what `Network.from_json`
    takes): the graph from its metadata, the weights from its initializers (external data is
    read from next to the file)."""
    model = onnx.load(path)
    props = {p.key: p.value for p in model.metadata_props}
    if META_NETWORK not in props or META_WEIGHTS not in props:
        raise ValueError(f"{path}: no {META_NETWORK!r} metadata; only models written by "
                         f"tensorrt_llm's ONNX export can be loaded back as a Network")
    initializers = {t.name: t for t in model.graph.initializer}
    weights = {}
    for name, entry in json.loads(props[META_WEIGHTS]).items():
        data = _tensor_from_proto(initializers[entry["initializer"]])
        weights[name] = data.t().contiguous() if entry["transposed"] else data
    return props[META_NETWORK], weights
