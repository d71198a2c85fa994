"""Graph rewriting: FLayerInfo, patterns and their managers, and the builder's passes.

A rewrite follows four stages: read the subgraph's inputs (a layer's `FLayerInfo`: the
arguments of the functional call that made it), build the new subgraph from them (plain
functional calls: layers are appended to the network being processed), redirect the
readers of the old outputs with `replace_all_uses_with`, and mark the old layers removed.
The manager then drops marked layers and restores topological order.

The builder's passes are written this way: each fusion is a `Fusion` (a `PatternRewriter`
that also names the layers one rewrite replaces, which `FusionPlan`, a `PatternAnalyzer`,
reports before the pass runs), and dead-layer removal is `RemoveDeadLayers`.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from . import functional as F

# Where TensorRT-LLM users import it from when they port a pass: functional's decorator.
from .functional import record_signature as record_signature
from .network import Layer, Network, Tensor, current_net, net_guard
from .ops import IMPLEMENTATION_ATTR, OPS, call_arguments, signature_of
from .ops.quantized_linear import WEIGHT_ONLY_OPS, tile_codes, tileable

# ---- FLayerInfo -------------------------------------------------------------------------------


class FLayerInfo:
    """The functional call that made a layer: its arguments by parameter name, tensor
    arguments as Tensors of the layer's network.

    It is read back from the layer (inputs in parameter order, attrs by name; see
    functional.record_signature), so every layer of a recorded op has one, whether built in
    this process or loaded from JSON, and it shows the layer as it is now, rewiring included.
    A pattern reads it, changes a copy (`clone_inputs`), calls the op again with it, and
    redirects the old outputs (`replace_output_uses_with`)."""

    def __init__(self, layer: Layer, signature: dict[str, Any]):
        self.layer = layer
        self.signature = signature

    @classmethod
    def of(cls, layer: Layer) -> Optional["FLayerInfo"]:
        """The layer's FLayerInfo; None when its op is no recorded functional op."""
        signature = signature_of(layer.op)
        return None if signature is None else cls(layer, call_arguments(layer, signature))

    @property
    def layer_type(self) -> str:
        return self.layer.op

    @property
    def layer_name(self) -> str:
        return self.layer.name

    @property
    def network(self) -> Network:
        return self.layer.network

    @property
    def raw_inputs(self) -> dict[str, Any]:
        return self.signature

    def get_input(self, name: str):
        return self.signature[name]

    def clone_inputs(self) -> dict[str, Any]:
        """A copy of the arguments, to change and call the op with (`F.<op>(**args)`)."""
        return dict(self.signature)

    @property
    def outputs(self) -> list[Tensor]:
        return self.layer.get_outputs()

    def replace_input_with(self, src: Tensor, dst: Tensor) -> None:
        """The layer reads `dst` wherever it read `src`."""
        layer = self.layer
        if src.name not in layer.inputs:
            raise ValueError(f"layer {layer.name!r} does not read {src.name!r}")
        for i, name in enumerate(layer.inputs):
            if name == src.name:
                self.network.set_layer_input(layer, i, dst.name)

        def swap(value):
            if isinstance(value, Tensor) and value == src:
                return dst
            if isinstance(value, (list, tuple)):
                return type(value)(swap(v) for v in value)
            return value

        self.signature = {k: swap(v) for k, v in self.signature.items()}

    def replace_output_uses_with(self, net: Network, new_outs: Sequence[Tensor]) -> None:
        """Readers of the layer's outputs read `new_outs` (same order) instead."""
        old_outs = self.outputs
        if len(new_outs) != len(old_outs):
            raise ValueError(f"layer {self.layer_name!r} has {len(old_outs)} outputs, got {len(new_outs)} replacements")
        for old, new in zip(old_outs, new_outs):
            old.replace_all_uses_with(new)

    def __repr__(self) -> str:
        return f"FLayerInfo({self.layer_type!r}, layer={self.layer_name!r}, args={list(self.signature)})"


class FLayerInfoMemo:
    """Where TensorRT-LLM passes look FLayerInfo up: `FLayerInfoMemo.instance().get(name)`.
    Nothing is stored: the info is read from the layer of that name in `network` (default:
    the current network, which the pattern managers set)."""
    _instance: Optional["FLayerInfoMemo"] = None

    @classmethod
    def instance(cls) -> "FLayerInfoMemo":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def get(self, layer_name: str, network: Optional[Network] = None) -> Optional[FLayerInfo]:
        """None when there is no such layer or its op is no recorded functional op."""
        network = network or current_net()
        if network is None:
            raise RuntimeError("FLayerInfoMemo.get outside net_guard: pass the network")
        try:
            layer = network.get_layer_by_name(layer_name)
        except KeyError:
            return None
        return FLayerInfo.of(layer)


def _info(layer: Layer) -> FLayerInfo:
    """FLayerInfo of a layer the builder's passes matched (all of recorded ops)."""
    return FLayerInfoMemo.instance().get(layer.name, layer.network)


# ---- patterns and managers ------------------------------------------------------------------


class _Pattern:
    """A pattern's name, and the ops whose layers it is offered (`root_layer`; None: all)."""

    def __init__(self, name: str, root_layer: Optional[set[str]] = None):
        self.name = name
        self.root_layer = root_layer

    def match(self, layer: Layer) -> bool:
        raise NotImplementedError


class PatternRewriter(_Pattern):
    """Alters the network."""

    def rewrite(self, layer: Layer) -> None:
        raise NotImplementedError

    def match_and_rewrite(self, layer: Layer) -> bool:
        """Rewrite if the pattern matches at `layer`; True if it did."""
        if not self.match(layer):
            return False
        self.rewrite(layer)
        return True


class PatternAnalyzer(_Pattern):
    """Collects information without changing the network."""

    def analyze(self, layer: Layer) -> None:
        raise NotImplementedError


class _PatternManager:

    def __init__(self):
        self.patterns: dict = {}

    def add(self, label: str, pattern) -> None:
        if label in self.patterns:
            raise ValueError(f"a pattern labelled {label!r} is already registered")
        self.patterns[label] = pattern

    def get(self, label: str):
        return self.patterns[label]

    @staticmethod
    def _candidates(network: Network, pattern):
        """A snapshot of the live layers the pattern roots at; ones removed meanwhile are skipped."""
        for layer in network.layers:
            if pattern.root_layer is None or layer.op in pattern.root_layer:
                yield layer


class RewritePatternManager(_PatternManager):

    def process(self, network: Network,
                before_each: Optional[Callable[[str, PatternRewriter], None]] = None) -> dict[str, int]:
        """Run each pattern over the network in turn (the network is the current one meanwhile);
        returns rewrites per label. `before_each(label, pattern)` is called before a pattern
        runs, on the network as the patterns before it left it."""
        counts = {}
        with net_guard(network):
            for label, pattern in self.patterns.items():
                if before_each is not None:
                    before_each(label, pattern)
                counts[label] = sum(1 for layer in list(self._candidates(network, pattern))
                                    if not layer.removed and pattern.match_and_rewrite(layer))
                network.remove_marked_layers()
                network.sort_layers()
        return counts


class AnalysisPatternManager(_PatternManager):

    def process(self, network: Network) -> dict[str, int]:
        """Analyze every matching layer (the network is the current one meanwhile); returns
        matches per label."""
        counts = {}
        with net_guard(network):
            for label, pattern in self.patterns.items():
                counts[label] = 0
                for layer in list(self._candidates(network, pattern)):
                    if pattern.match(layer):
                        pattern.analyze(layer)
                        counts[label] += 1
        return counts


# ---- clean-up --------------------------------------------------------------------------------


class RemoveDeadLayers(PatternRewriter):
    """A layer whose outputs no live layer reads and that are no network or debug outputs,
    and that has no side effect, is removed, and so is each producer left unread by that
    (up the graph: one pass removes a whole dead branch). `removed` counts them."""

    def __init__(self):
        super().__init__("remove_dead_layers")
        self.removed = 0

    def match(self, layer: Layer) -> bool:
        net = layer.network
        op = OPS.get(layer.op)  # an op of one's own (record_signature) has no side effects here
        return not (op is not None and op.side_effects) and not any(
            net.consumers(out) or out in net.outputs or out in net.debug_outputs for out in layer.outputs)

    def rewrite(self, layer: Layer) -> None:
        net = layer.network
        dead = [layer]
        while dead:
            layer = dead.pop()
            if layer.removed:  # reached through two of its readers
                continue
            net.mark_removed(layer)
            self.removed += 1
            producers = (net.producer(name) for name in dict.fromkeys(layer.inputs) if name is not None)
            dead.extend(p for p in producers if p is not None and not p.removed and self.match(p))


def remove_dead_layers(network: Network) -> int:
    """Drop layers whose outputs reach no output or debug output (and that have no side
    effect). Returns how many were removed."""
    network.remove_marked_layers()
    pattern = RemoveDeadLayers()
    manager = RewritePatternManager()
    manager.add(pattern.name, pattern)
    manager.process(network)
    return pattern.removed


def prune_unused_weights(network: Network) -> int:
    """Drop weights no constant layer reads. Returns how many were removed."""
    used = {layer.attrs["weight"] for layer in network.layers if layer.op == "constant"}
    unused = [name for name in network.weights if name not in used]
    for name in unused:
        del network.weights[name]
    return len(unused)


# ---- fusions ---------------------------------------------------------------------------------


class Fusion(PatternRewriter):
    """A rewrite that replaces a matched subgraph with new layers. `find(layer)` gives the
    FLayerInfo of every layer one rewrite at `layer` replaces, by role (None: no match);
    `emit(found)` adds the new layers from their inputs and redirects the old outputs'
    readers; the layers found are then marked removed. FusionPlan reports them."""

    def find(self, layer: Layer) -> Optional[dict[str, FLayerInfo]]:
        raise NotImplementedError

    def emit(self, found: dict[str, FLayerInfo]) -> None:
        raise NotImplementedError

    def match(self, layer: Layer) -> bool:
        return self.find(layer) is not None

    def rewrite(self, layer: Layer) -> None:
        self._replace(self.find(layer))

    def match_and_rewrite(self, layer: Layer) -> bool:
        found = self.find(layer)
        if found is None:
            return False
        self._replace(found)
        return True

    def _replace(self, found: dict[str, FLayerInfo]) -> None:
        self.emit(found)
        for info in found.values():
            info.network.mark_removed(info.layer)


class FusionPlan(PatternAnalyzer):
    """What a fusion is about to do: for each match, the names of the layers its rewrite
    replaces (`matches`). optimize() runs it before each pass when asked for a plan."""

    def __init__(self, fusion: Fusion):
        super().__init__(fusion.name, fusion.root_layer)
        self.fusion = fusion
        self.matches: list[list[str]] = []

    def match(self, layer: Layer) -> bool:
        return self.fusion.match(layer)

    def analyze(self, layer: Layer) -> None:
        self.matches.append([info.layer_name for info in self.fusion.find(layer).values()])


def _only_reader(tensor: Tensor, layer: Layer) -> bool:
    """`layer` is the tensor's only reader and the tensor is not a network result."""
    net = tensor.network
    return (tensor.get_users() == [layer] and tensor.name not in net.outputs
            and tensor.name not in net.debug_outputs)


def _is_constant(tensor: Tensor) -> bool:
    parent = tensor.get_parent()
    return parent is not None and parent.op == "constant"


def _has_timed_choice(*layers: Layer) -> bool:
    """A layer holds the builder's timed implementation choice (timing_cache.py). Fusing it
    would drop a choice measured for that op, so such layers are left as they are."""
    return any(IMPLEMENTATION_ATTR in layer.attrs for layer in layers)


class FuseAddRmsNorm(Fusion):
    """rms_norm(a + b) -> fused_add_rms_norm(a, b); the sum (its second output) replaces
    the add's result for every other reader (the residual stream)."""

    def __init__(self):
        super().__init__("fuse_add_rms_norm", root_layer={"rms_norm"})

    def find(self, layer: Layer) -> Optional[dict[str, FLayerInfo]]:
        if _has_timed_choice(layer):
            return None
        norm = _info(layer)
        total = norm.get_input("x")
        add_layer = total.get_parent()
        if add_layer is None or add_layer.removed or add_layer.op != "add":
            return None
        add = _info(add_layer)
        if not add.get_input("a").shape == add.get_input("b").shape == total.shape:
            return None  # no broadcasting inside the fused op
        return {"add": add, "norm": norm}

    def emit(self, found: dict[str, FLayerInfo]) -> None:
        add, norm = found["add"], found["norm"]
        normed, total = F.fused_add_rms_norm(add.get_input("a"), add.get_input("b"), norm.get_input("weight"),
                                             eps=norm.get_input("eps"))
        norm.replace_output_uses_with(norm.network, [normed])
        add.replace_output_uses_with(add.network, [total])


_GATED_ACTIVATIONS = {"silu": ("silu_and_mul", None), "gelu": ("gelu_and_mul", "none"),
                      "gelu_tanh": ("gelu_and_mul", "tanh")}


# The ops FuseGateUp fuses, with their parameters that stack along the output rows: a float
# linear, a weight-only quantized one (its codes, scales and zeros are per output row), and an
# FP8 one (codes per row; its weight scale is per tensor or per row, see _fp8_weight_scale).
_GATE_UP_PARAMS = {"linear": ("weight", "bias"), "weight_only_linear": ("qweight", "scales", "zeros", "bias"),
                   "fp8_linear": ("qweight", "weight_scale", "bias")}
# Parameters of one value for the whole input that both linears must share, and the fused one
# reads once: FP8's static input scale (x is quantized once, with one scale); an act-order INT4
# weight's input order (x is gathered once; GPTQ gives gate and up the same one).
_GATE_UP_SHARED = {"fp8_linear": ("input_scale",), "weight_only_linear": ("perm",)}


class FuseGateUp(Fusion):
    """act(linear(x, W_gate, b_gate)) * linear(x, W_up, b_up) -> one linear with
    cat([W_gate, W_up]) (and biases) followed by silu_and_mul / gelu_and_mul.

    fp8_linear pairs fuse when their input scales are the same (both dynamic, or equal static
    values) and their weight scales of one kind: equal per-tensor scales stay one per-tensor
    scale (cuBLASLt's fast tensor-wise FP8 GEMM); different per-tensor or per-channel scales
    become per-channel, each row keeping its own scale. The codes are kept as they are, so the
    fused linear computes the unfused ones' products exactly. Weights read in place of an
    equal one (the shared input scale, an equal per-tensor weight scale) are recorded in
    `Network.equal_sources`, so refit refuses a checkpoint in which they differ."""

    def __init__(self):
        super().__init__("fuse_gate_up", root_layer={"mul"})

    def find(self, layer: Layer) -> Optional[dict[str, FLayerInfo]]:
        product = _info(layer)
        a, b = product.get_input("a"), product.get_input("b")
        for act_t, up_t in ((a, b), (b, a)):
            act_layer = act_t.get_parent()
            if act_layer is None or act_layer.op not in _GATED_ACTIVATIONS or act_t.shape != up_t.shape:
                continue
            act = _info(act_layer)
            gate_layer, up_layer = act.get_input("x").get_parent(), up_t.get_parent()
            if (gate_layer is None or up_layer is None or gate_layer is up_layer
                    or gate_layer.op not in _GATE_UP_PARAMS or up_layer.op != gate_layer.op
                    or gate_layer.attrs != up_layer.attrs):  # one weight format and group (quantized)
                continue
            gate, up = _info(gate_layer), _info(up_layer)
            names = _GATE_UP_PARAMS[gate_layer.op] + _GATE_UP_SHARED.get(gate_layer.op, ())
            if (gate.get_input("x") != up.get_input("x")
                    or any((gate.get_input(p) is None) != (up.get_input(p) is None) for p in names)
                    or any(gate.get_input(p) is not None and gate.get_input(p).dtype != up.get_input(p).dtype
                           for p in names)):
                continue
            params = [lin.get_input(p) for lin in (gate, up) for p in names]
            if not all(_is_constant(t) for t in params if t is not None):
                continue
            if not all(_same_checkpoint_values(gate, up, p) for p in _GATE_UP_SHARED.get(gate_layer.op, ())):
                continue
            if gate_layer.op == "fp8_linear" and not _fp8_fusable(gate, up):
                continue
            if not (_only_reader(act.get_input("x"), act_layer) and _only_reader(act_t, layer)
                    and _only_reader(up_t, layer)):
                continue
            return {"gate": gate, "up": up, "act": act, "mul": product}
        return None

    def emit(self, found: dict[str, FLayerInfo]) -> None:
        gate, up, act = found["gate"], found["up"], found["act"]
        net = gate.network
        fused = {}
        for param in _GATE_UP_PARAMS[gate.layer_type]:
            if gate.get_input(param) is None:
                fused[param] = None
            elif param == "weight_scale":
                fused[param] = _fp8_weight_scale(gate, up)
            else:
                fused[param] = _stacked(net, *(_weight_name(lin.get_input(param)) for lin in (gate, up)))
        for param in _GATE_UP_SHARED.get(gate.layer_type, ()):
            if gate.get_input(param) is not None:
                _record_equal(net, _weight_name(up.get_input(param)), _weight_name(gate.get_input(param)))
        if gate.layer_type == "linear":
            y = F.linear(gate.get_input("x"), fused["weight"], fused["bias"])
        elif gate.layer_type == "fp8_linear":
            y = F.fp8_linear(gate.get_input("x"), fused["qweight"], fused["weight_scale"],
                             gate.get_input("input_scale"), fused["bias"])
        else:
            attrs = {k: v for k, v in gate.raw_inputs.items() if k in ("weight_format", "group_size")}
            y = F.weight_only_linear(gate.get_input("x"), fused["qweight"], fused["scales"], fused["zeros"],
                                     fused["bias"], gate.get_input("perm"), **attrs)
        op, approximate = _GATED_ACTIVATIONS[act.layer_type]
        out = F.silu_and_mul(y) if op == "silu_and_mul" else F.gelu_and_mul(y, approximate=approximate)
        found["mul"].replace_output_uses_with(net, [out])


def _weight_name(tensor: Tensor) -> str:
    """The network weight a constant tensor holds."""
    return _info(tensor.get_parent()).get_input("name")


def _is_checkpoint_weight(net: Network, name: str) -> bool:
    """A weight as the checkpoint has it (no rewrite made it), which refit can compare."""
    return name not in net.weight_sources


def _same_checkpoint_values(gate: FLayerInfo, up: FLayerInfo, param: str) -> bool:
    """Both linears' `param` (one of _GATE_UP_SHARED, which the fused linear reads once) absent,
    or equal checkpoint weights (refit can compare those)."""
    a, b = gate.get_input(param), up.get_input(param)
    if a is None or b is None:
        return a is None and b is None
    net = gate.network
    g, u = _weight_name(a), _weight_name(b)
    return torch.equal(net.weights[g], net.weights[u]) and _is_checkpoint_weight(net, g) and \
        _is_checkpoint_weight(net, u)


def _fp8_fusable(gate: FLayerInfo, up: FLayerInfo) -> bool:
    """Two fp8_linear calls on one x (their input scales the same: _GATE_UP_SHARED) that one
    fp8_linear computes exactly: weight scales of one kind, both per tensor or both per channel.
    Values read once for both must be checkpoint weights, for refit to compare."""
    net = gate.network
    ws_g, ws_u = gate.get_input("weight_scale"), up.get_input("weight_scale")
    if (tuple(ws_g.shape) == (1,)) != (tuple(ws_u.shape) == (1,)):
        return False
    # per-tensor scales are repeated per row or read once: either way refit needs their own names
    return tuple(ws_g.shape) != (1,) or all(_is_checkpoint_weight(net, _weight_name(t)) for t in (ws_g, ws_u))


def _fp8_weight_scale(gate: FLayerInfo, up: FLayerInfo) -> Tensor:
    """The fused FP8 weight scale: the gate's per-tensor scale when the up's equals it (the
    fast tensor-wise GEMM), else one scale per row (per-tensor scales repeated over their rows)."""
    net = gate.network
    g, u = (_weight_name(lin.get_input("weight_scale")) for lin in (gate, up))
    scale_g, scale_u = net.weights[g], net.weights[u]
    if scale_g.numel() == 1 and scale_u.numel() == 1:
        if torch.equal(scale_g, scale_u):
            _record_equal(net, u, g)
            return gate.get_input("weight_scale")
        rows_g, rows_u = (lin.get_input("qweight").shape[0] for lin in (gate, up))
        name = _fused_weight_name(net, g, u)
        net.weight_sources[name] = [[g, rows_g], [u, rows_u]]
        return F.constant(torch.cat([scale_g.expand(rows_g), scale_u.expand(rows_u)]), name=name)
    return _stacked(net, g, u)


def _stacked(net: Network, gate_name: str, up_name: str) -> Tensor:
    """A constant of the two weights stacked along their rows, its refit sources recorded."""
    names = [gate_name, up_name]
    name = _fused_weight_name(net, *names)
    net.weight_sources[name] = [s for n in names for s in net.weight_sources.get(n, [n])]
    # Rows of the output: a quantized weight's codes and scales stack as its rows do.
    return F.constant(torch.cat([net.weights[n] for n in names], dim=0), name=name)


def _record_equal(net: Network, unread: str, read: str) -> None:
    """The engine reads checkpoint weight `read` where it read `unread` too (they are equal)."""
    if unread != read:
        net.equal_sources[unread] = read


def _fused_weight_name(net: Network, gate_name: str, up_name: str) -> str:
    """transformer.layers.0.mlp.{gate,fc}.weight -> transformer.layers.0.mlp.gate_up.weight"""
    g, u = gate_name.split("."), up_name.split(".")
    common = 0
    while common < min(len(g), len(u)) - 1 and g[common] == u[common]:
        common += 1
    base = ".".join(g[:common] + ["gate_up", g[-1]])
    name, i = base, 0
    while name in net.weights:
        i += 1
        name = f"{base}_{i}"
    return name


class FuseRopeAttention(Fusion):
    """gpt_attention(rotary_embedding(q), rotary_embedding(k), ...) -> gpt_attention(q, k, ...)
    with the rotation as its inputs/attrs, so one kernel rotates, writes the cache and attends."""

    def __init__(self):
        super().__init__("fuse_rope_attention", root_layer={"gpt_attention"})

    def find(self, layer: Layer) -> Optional[dict[str, FLayerInfo]]:
        attn = _info(layer)
        if attn.get_input("rotary_dim"):  # already rotates
            return None
        q, k = attn.get_input("q"), attn.get_input("k")
        rq_layer, rk_layer = q.get_parent(), k.get_parent()
        if (rq_layer is None or rk_layer is None or rq_layer.op != "rotary_embedding"
                or rk_layer.op != "rotary_embedding"):
            return None
        rq, rk = _info(rq_layer), _info(rk_layer)
        same = ("position_ids", "cos_sin_cache", "is_neox", "rotary_dim", "head_dim")
        if any(rq.get_input(a) != rk.get_input(a) for a in same):
            return None
        if rq.get_input("num_heads") != attn.get_input("num_heads") or \
                rk.get_input("num_heads") != attn.get_input("num_kv_heads"):
            return None
        if not (_only_reader(q, layer) and _only_reader(k, layer)):
            return None
        return {"rope_q": rq, "rope_k": rk, "attention": attn}

    def emit(self, found: dict[str, FLayerInfo]) -> None:
        rq, rk, attn = found["rope_q"], found["rope_k"], found["attention"]
        args = attn.clone_inputs()
        args.update(q=rq.get_input("x"), k=rk.get_input("x"), position_ids=rq.get_input("position_ids"),
                    rotary_cos_sin=rq.get_input("cos_sin_cache"), rotary_dim=rq.get_input("rotary_dim"),
                    rotary_is_neox=rq.get_input("is_neox"))
        attn.replace_output_uses_with(attn.network, [F.gpt_attention(**args)])


class FuseAttentionFp8Linear(Fusion):
    """gpt_attention -> fp8_linear with a static input scale (the o projection) becomes
    gpt_attention_fp8_linear, where that linear is the attention's only reader and the attention
    no network or debug output: a decode step's attention kernel then writes the E4M3 codes the
    linear's FP8 GEMM reads, instead of a quantize kernel between them. Runs after
    fuse_rope_attention, whose result it matches."""

    def __init__(self):
        super().__init__("fuse_attention_fp8_linear", root_layer={"gpt_attention"})

    def find(self, layer: Layer) -> Optional[dict[str, FLayerInfo]]:
        if _has_timed_choice(layer):
            return None
        linear = _sole_linear_reader(layer.get_output(0))
        if linear is None or linear.layer_type != "fp8_linear" or linear.get_input("input_scale") is None:
            return None
        return {"attention": _info(layer), "linear": linear}

    def emit(self, found: dict[str, FLayerInfo]) -> None:
        attn, linear = found["attention"], found["linear"]
        y = F.gpt_attention_fp8_linear(**attn.clone_inputs(), **dict(zip(
            _FUSABLE_LINEAR_PARAMS["fp8_linear"], _linear_params(linear))))
        linear.replace_output_uses_with(linear.network, [y])


# The linear layers a norm or activation fuses into, and their parameters (every input but x).
_FUSABLE_LINEAR_PARAMS = {"linear": ("weight", "bias"),
                          "fp8_linear": ("qweight", "weight_scale", "input_scale", "bias"),
                          "weight_only_linear": ("qweight", "scales", "zeros", "bias", "perm")}
# A weight-only linear's attrs, which its fused forms carry.
_WEIGHT_ONLY_ATTRS = ("weight_format", "group_size", "tiled", "gated")


def _linear_params(linear: FLayerInfo) -> list:
    """The parameters of a linear or fp8_linear (_FUSABLE_LINEAR_PARAMS), in its order."""
    return [linear.get_input(name) for name in _FUSABLE_LINEAR_PARAMS[linear.layer_type]]


def _sole_linear_reader(tensor: Tensor) -> Optional[FLayerInfo]:
    """The FLayerInfo of the linear (or fp8_linear) that reads `tensor` as its input x, with
    constant parameters, when it is the tensor's only reader and the tensor is no network result;
    else None. Constant parameters are what a fused kernel streams, and they cannot depend on the
    tensor."""
    users = tensor.get_users()
    if len(users) != 1 or users[0].op not in _FUSABLE_LINEAR_PARAMS or _has_timed_choice(users[0]):
        return None
    linear = _info(users[0])
    params = _linear_params(linear)
    if linear.get_input("x") != tensor or tensor in params:
        return None
    if not all(_is_constant(t) for t in params if t is not None):
        return None
    return linear if _only_reader(tensor, linear.layer) else None


class FuseNormLinear(Fusion):
    """rms_norm(x, w) -> linear becomes rms_norm_linear, and fused_add_rms_norm(x, r, w) ->
    linear becomes add_rms_norm_linear (an fp8_linear: rms_norm_fp8_linear and
    add_rms_norm_fp8_linear; a weight_only_linear: rms_norm_weight_only_linear and
    add_rms_norm_weight_only_linear, with its attrs), whose sum output takes over every reader
    of the old sum (the residual stream). Only where the norm has a weight and the normalised
    output has that linear as its only reader and is no network or debug output: a norm read
    twice (Phi's parallel attention and MLP) stays as it is. Runs after fuse_add_rms_norm,
    fuse_gate_up and fuse_gated_linear, whose results it matches."""

    def __init__(self):
        super().__init__("fuse_norm_linear", root_layer={"rms_norm", "fused_add_rms_norm"})

    def find(self, layer: Layer) -> Optional[dict[str, FLayerInfo]]:
        norm = _info(layer)
        if norm.get_input("weight") is None or _has_timed_choice(layer):
            return None
        linear = _sole_linear_reader(layer.get_output(0))
        return None if linear is None else {"norm": norm, "linear": linear}

    def emit(self, found: dict[str, FLayerInfo]) -> None:
        norm, linear = found["norm"], found["linear"]
        params = _linear_params(linear)
        eps = norm.get_input("eps")
        kind = linear.layer_type
        attrs = {k: v for k, v in linear.raw_inputs.items() if k in _WEIGHT_ONLY_ATTRS}
        if norm.layer_type == "rms_norm":
            fused = {"fp8_linear": F.rms_norm_fp8_linear, "weight_only_linear": F.rms_norm_weight_only_linear}
            y = fused.get(kind, F.rms_norm_linear)(norm.get_input("x"), norm.get_input("weight"), *params, eps=eps,
                                                   **attrs)
        else:
            fused = {"fp8_linear": F.add_rms_norm_fp8_linear, "weight_only_linear": F.add_rms_norm_weight_only_linear}
            y, total = fused.get(kind, F.add_rms_norm_linear)(norm.get_input("x"), norm.get_input("residual"),
                                                              norm.get_input("weight"), *params, eps=eps, **attrs)
            norm.outputs[1].replace_all_uses_with(total)
        linear.replace_output_uses_with(linear.network, [y])


class FuseActLinear(Fusion):
    """silu_and_mul -> linear becomes silu_and_mul_linear (fp8_linear: silu_and_mul_fp8_linear),
    where that linear is the only reader of the activation and the activation no network or
    debug output. Runs after fuse_gate_up, which makes the silu_and_mul."""

    def __init__(self):
        super().__init__("fuse_act_linear", root_layer={"silu_and_mul"})

    def find(self, layer: Layer) -> Optional[dict[str, FLayerInfo]]:
        if _has_timed_choice(layer):
            return None
        linear = _sole_linear_reader(layer.get_output(0))
        if linear is None or linear.layer_type == "weight_only_linear":  # its own: gated (fuse_gated_linear)
            return None
        return {"activation": _info(layer), "linear": linear}

    def emit(self, found: dict[str, FLayerInfo]) -> None:
        act, linear = found["activation"], found["linear"]
        fused = F.silu_and_mul_fp8_linear if linear.layer_type == "fp8_linear" else F.silu_and_mul_linear
        y = fused(act.get_input("x"), *_linear_params(linear))
        linear.replace_output_uses_with(linear.network, [y])


class FuseFp8GatedMlp(Fusion):
    """add_rms_norm_fp8_linear (gate_up) -> silu_and_mul_fp8_linear (down) becomes
    add_rms_norm_fp8_gated_mlp, where the down op is the only reader of gate_up's output and that
    output no network or debug output: within the FP8 GEMV's rows, silu_and_mul then runs in
    gate_up's epilogue instead of a kernel of its own. Runs after fuse_norm_linear and
    fuse_act_linear, whose results it matches."""

    def __init__(self):
        super().__init__("fuse_fp8_gated_mlp", root_layer={"add_rms_norm_fp8_linear"})

    def find(self, layer: Layer) -> Optional[dict[str, FLayerInfo]]:
        h = layer.get_output(0)
        users = h.get_users()
        if (len(users) != 1 or users[0].op != "silu_and_mul_fp8_linear" or not _only_reader(h, users[0])
                or _has_timed_choice(layer, users[0])):
            return None
        down = _info(users[0])
        return None if down.get_input("x") != h else {"gate_up": _info(layer), "down": down}

    def emit(self, found: dict[str, FLayerInfo]) -> None:
        gate_up, down = found["gate_up"], found["down"]
        y, total = F.add_rms_norm_fp8_gated_mlp(
            gate_up.get_input("x"), gate_up.get_input("residual"), gate_up.get_input("norm_weight"),
            gate_up.get_input("qweight"), gate_up.get_input("weight_scale"), gate_up.get_input("input_scale"),
            gate_up.get_input("bias"), down.get_input("qweight"), down.get_input("weight_scale"),
            down.get_input("input_scale"), down.get_input("bias"), eps=gate_up.get_input("eps"))
        gate_up.outputs[1].replace_all_uses_with(total)
        down.replace_output_uses_with(down.network, [y])


class FuseGatedLinear(Fusion):
    """weight_only_linear -> silu_and_mul becomes weight_only_linear(gated=True), where the
    activation is the product's only reader and the product no network or debug output: within
    the GEMV's rows, silu_and_mul then runs in the GEMV's epilogue (the FP8 MLP's counterpart is
    fuse_fp8_gated_mlp). Runs after fuse_gate_up, which makes the pair."""

    def __init__(self):
        super().__init__("fuse_gated_linear", root_layer={"silu_and_mul"})

    def find(self, layer: Layer) -> Optional[dict[str, FLayerInfo]]:
        product = _info(layer).get_input("x")
        linear = product.get_parent()
        if (linear is None or linear.op != "weight_only_linear" or linear.attrs.get("gated")
                or not _only_reader(product, layer) or _has_timed_choice(layer, linear)):
            return None
        return {"activation": _info(layer), "linear": _info(linear)}

    def emit(self, found: dict[str, FLayerInfo]) -> None:
        act, linear = found["activation"], found["linear"]
        attrs = {k: v for k, v in linear.raw_inputs.items() if k in ("weight_format", "group_size", "tiled")}
        y = F.weight_only_linear(linear.get_input("x"), linear.get_input("qweight"), linear.get_input("scales"),
                                 linear.get_input("zeros"), linear.get_input("bias"), linear.get_input("perm"),
                                 **attrs, gated=True)
        act.replace_output_uses_with(act.network, [y])


# The default order: later passes match what earlier ones make.
PASSES = {"fuse_add_rms_norm": FuseAddRmsNorm, "fuse_gate_up": FuseGateUp,
          "fuse_rope_attention": FuseRopeAttention, "fuse_attention_fp8_linear": FuseAttentionFp8Linear,
          "fuse_gated_linear": FuseGatedLinear, "fuse_norm_linear": FuseNormLinear,
          "fuse_act_linear": FuseActLinear, "fuse_fp8_gated_mlp": FuseFp8GatedMlp}


def optimize(network: Network, passes: Optional[list[str]] = None, plan: Optional[dict] = None) -> dict:
    """Run the named fusion passes (default: all of PASSES) with a RewritePatternManager,
    then remove dead layers and unused weights. Returns a report for the build summary.

    With `plan` (a dict), FusionPlan fills plan[pass] before each pass runs: for each of
    its rewrites, the names of the layers it replaces (what trtllm-build --verbose prints)."""
    passes = list(PASSES) if passes is None else list(passes)
    unknown = [p for p in passes if p not in PASSES]
    if unknown:
        raise ValueError(f"unknown optimization passes {unknown}; known: {sorted(PASSES)}")
    order = list(PASSES)
    passes = sorted(dict.fromkeys(passes), key=order.index)  # PASSES' order, whatever the list's
    layers_before, weights_before = network.num_layers, len(network.weights)
    manager = RewritePatternManager()
    for label in passes:
        manager.add(label, PASSES[label]())

    def analyze(label: str, fusion: Fusion) -> None:
        analysis = AnalysisPatternManager()
        analysis.add(label, FusionPlan(fusion))
        analysis.process(network)
        plan[label] = analysis.get(label).matches

    rewrites = manager.process(network, before_each=None if plan is None else analyze)
    dead = remove_dead_layers(network)
    pruned = prune_unused_weights(network)
    return {"layers_before": layers_before, "layers_after": network.num_layers, "rewrites": rewrites,
            "dead_layers_removed": dead, "weights_before": weights_before, "weights_after": len(network.weights),
            "weights_removed": pruned}


# ---- the GPU's layout of weight-only codes ------------------------------------------------------


def tiled_code_weights(network: Network) -> set[str]:
    """The weights the network's weight-only linears read as codes in tile order."""
    names = set()
    for layer in network.layers:
        if layer.op in WEIGHT_ONLY_OPS and layer.attrs.get("tiled"):
            parent = network.producer(layer.inputs[WEIGHT_ONLY_OPS[layer.op]])
            if parent is not None and parent.op == "constant":
                names.add(parent.attrs["weight"])
    return names


def tile_weight_only_codes(network: Network) -> int:
    """Put the codes of each weight-only linear in tile order (ops/quantized_linear.py's
    tile_codes), the order the GPU kernels read them fastest in, and mark the layer `tiled`.
    In place: a runner calls it on a network it loaded onto a GPU (one weight at a time: the
    row-order copy is freed as the next is made). A weight read by any other layer, or of a
    shape with no tile order, stays as it is. Returns how many weights were reordered."""
    readers: dict[str, int] = {}
    for layer in network.layers:
        if layer.op == "constant":
            readers[layer.attrs["weight"]] = readers.get(layer.attrs["weight"], 0) + 1
    count = 0
    for layer in network.layers:
        if layer.op not in WEIGHT_ONLY_OPS or layer.attrs.get("tiled"):
            continue
        qweight = network.get_tensor(layer.inputs[WEIGHT_ONLY_OPS[layer.op]])
        parent = qweight.get_parent()
        if parent is None or parent.op != "constant" or qweight.get_users() != [layer]:
            continue
        name = parent.attrs["weight"]
        w = network.weights[name]
        if readers[name] != 1 or w.ndim != 2 or not tileable(*w.shape):
            continue
        network.weights[name] = tile_codes(w)
        layer.attrs["tiled"] = True
        count += 1
    return count
