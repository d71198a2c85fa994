"""Graph rewriting: patterns, their managers, clean-up passes, and the builder's fusions.

A rewrite follows four stages: take the inputs/outputs of the subgraph to replace, build
the new subgraph from those inputs (plain functional calls: layers are appended to the
network being processed), redirect the readers of the old outputs with
`Tensor.replace_all_uses_with`, and mark the old layers removed. The manager then drops
marked layers and restores topological order. Patterns read layers through `Layer`
(op, attrs, inputs) rather than FLayerInfo, so they also work on networks loaded from JSON.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import functional as F

# Where TensorRT-LLM users import them from when they port a pass: the same objects as functional's.
from .functional import FLayerInfo as FLayerInfo
from .functional import FLayerInfoMemo as FLayerInfoMemo
from .functional import record_signature as record_signature
from .network import Layer, Network, net_guard

# Ops that do something besides producing their outputs: never removed as dead.
SIDE_EFFECT_OPS = {"gpt_attention"}


class PatternRewriter:
    """Alters the network. `root_layer`: the ops whose layers are offered (None: all)."""

    def __init__(self, name: str, root_layer: Optional[set[str]] = None):
        self.name = name
        self.root_layer = root_layer

    def match(self, layer: Layer) -> bool:
        raise NotImplementedError

    def rewrite(self, layer: Layer) -> None:
        raise NotImplementedError

    def match_and_rewrite(self, layer: Layer) -> bool:
        """Rewrite if the pattern matches at `layer`; True if it did."""
        if not self.match(layer):
            return False
        self.rewrite(layer)
        return True


class PatternAnalyzer:
    """Collects information without changing the network."""

    def __init__(self, name: str, root_layer: Optional[set[str]] = None):
        self.name = name
        self.root_layer = root_layer

    def match(self, layer: Layer) -> bool:
        raise NotImplementedError

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
            if layer.removed:
                continue
            if pattern.root_layer is None or layer.op in pattern.root_layer:
                yield layer


class RewritePatternManager(_PatternManager):

    def process(self, network: Network) -> dict[str, int]:
        """Run each pattern over the network in turn; returns rewrites per label."""
        counts = {}
        with net_guard(network):
            for label, pattern in self.patterns.items():
                counts[label] = sum(1 for layer in list(self._candidates(network, pattern))
                                    if not layer.removed and pattern.match_and_rewrite(layer))
                network.remove_marked_layers()
                network.sort_layers()
        return counts


class AnalysisPatternManager(_PatternManager):

    def process(self, network: Network) -> dict[str, int]:
        """Analyze every matching layer; returns matches per label."""
        counts = {}
        for label, pattern in self.patterns.items():
            counts[label] = 0
            for layer in list(self._candidates(network, pattern)):
                if pattern.match(layer):
                    pattern.analyze(layer)
                    counts[label] += 1
        return counts


# ---- clean-up --------------------------------------------------------------------------------


def remove_dead_layers(network: Network) -> int:
    """Drop layers whose outputs reach no output or debug output (and that have no side
    effect). Returns how many were removed."""
    network.remove_marked_layers()
    needed = set(network.outputs) | set(network.debug_outputs)
    dead = []
    for layer in reversed(network.layers):  # readers come after the layers they read
        if layer.op in SIDE_EFFECT_OPS or any(out in needed for out in layer.outputs):
            needed.update(name for name in layer.inputs if name is not None)
        else:
            dead.append(layer)
    for layer in dead:  # reverse topological order: each one's readers are already gone
        network.remove_layer(layer)
    return len(dead)


def prune_unused_weights(network: Network) -> int:
    """Drop weights no constant layer reads. Returns how many were removed."""
    used = {layer.attrs["weight"] for layer in network.layers if layer.op == "constant"}
    unused = [name for name in network.weights if name not in used]
    for name in unused:
        del network.weights[name]
    return len(unused)


# ---- fusions ---------------------------------------------------------------------------------


def _only_reader(tensor: F.Tensor, layer: Layer) -> bool:
    """`layer` is the tensor's only reader and the tensor is not a network result."""
    net = tensor.network
    return (tensor.get_users() == [layer] and tensor.name not in net.outputs
            and tensor.name not in net.debug_outputs)


def _is_constant(tensor: F.Tensor) -> bool:
    parent = tensor.get_parent()
    return parent is not None and parent.op == "constant"


def _has_timed_choice(*layers: Layer) -> bool:
    """A layer holds the builder's timed implementation choice (timing_cache.py). Fusing it
    would drop a choice measured for that op, so such layers are left as they are."""
    return any("implementation" in layer.attrs for layer in layers)


class FuseAddRmsNorm(PatternRewriter):
    """rms_norm(a + b) -> fused_add_rms_norm(a, b); the sum (its second output) replaces
    the add's result for every other reader (the residual stream)."""

    def __init__(self):
        super().__init__("fuse_add_rms_norm", root_layer={"rms_norm"})

    def match(self, layer: Layer) -> bool:
        total = layer.get_input(0)
        add = total.get_parent()
        if add is None or add.removed or add.op != "add" or _has_timed_choice(layer):
            return False
        a, b = add.get_input(0), add.get_input(1)
        return a.shape == b.shape == total.shape  # no broadcasting inside the fused op

    def rewrite(self, layer: Layer) -> None:
        total = layer.get_input(0)
        add = total.get_parent()
        normed, new_total = F.fused_add_rms_norm(add.get_input(0), add.get_input(1), layer.get_input(1),
                                                 eps=layer.attrs["eps"])
        layer.get_output(0).replace_all_uses_with(normed)
        total.replace_all_uses_with(new_total)
        layer.network.mark_removed(layer)
        layer.network.mark_removed(add)


_GATED_ACTIVATIONS = {"silu": ("silu_and_mul", None), "gelu": ("gelu_and_mul", "none"),
                      "gelu_tanh": ("gelu_and_mul", "tanh")}


class FuseGateUp(PatternRewriter):
    """act(linear(x, W_gate, b_gate)) * linear(x, W_up, b_up) -> one linear with
    cat([W_gate, W_up]) (and biases) followed by silu_and_mul / gelu_and_mul."""

    def __init__(self):
        super().__init__("fuse_gate_up", root_layer={"mul"})

    def _find(self, mul: Layer):
        """(activation layer, gate linear, up linear) or None."""
        for act_t, up_t in ((mul.get_input(0), mul.get_input(1)), (mul.get_input(1), mul.get_input(0))):
            act = act_t.get_parent()
            if act is None or act.op not in _GATED_ACTIVATIONS or act_t.shape != up_t.shape:
                continue
            gate, up = act.get_input(0).get_parent(), up_t.get_parent()
            if gate is None or up is None or gate is up or gate.op != "linear" or up.op != "linear":
                continue
            if gate.inputs[0] != up.inputs[0] or (gate.inputs[2] is None) != (up.inputs[2] is None):
                continue
            params = [t for t in gate.get_inputs()[1:] + up.get_inputs()[1:] if t is not None]
            if not all(_is_constant(t) for t in params):
                continue
            if not (_only_reader(act.get_input(0), act) and _only_reader(act_t, mul) and _only_reader(up_t, mul)):
                continue
            return act, gate, up
        return None

    def match(self, layer: Layer) -> bool:
        return self._find(layer) is not None

    def rewrite(self, layer: Layer) -> None:
        act, gate, up = self._find(layer)
        net = layer.network
        fused = []
        for i in (1, 2):  # weight, then bias
            if gate.inputs[i] is None:
                fused.append(None)
                continue
            names = [lin.get_input(i).get_parent().attrs["weight"] for lin in (gate, up)]
            value = torch.cat([net.weights[n] for n in names], dim=0)
            name = _fused_weight_name(net, *names)
            net.weight_sources[name] = [s for n in names for s in net.weight_sources.get(n, [n])]
            fused.append(F.constant(value, name=name))
        y = F.linear(gate.get_input(0), fused[0], fused[1])
        op, approximate = _GATED_ACTIVATIONS[act.op]
        out = F.silu_and_mul(y) if op == "silu_and_mul" else F.gelu_and_mul(y, approximate=approximate)
        layer.get_output(0).replace_all_uses_with(out)
        for old in (layer, act, gate, up):
            net.mark_removed(old)


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


class FuseRopeAttention(PatternRewriter):
    """gpt_attention(rotary_embedding(q), rotary_embedding(k), ...) -> gpt_attention(q, k, ...)
    with the rotation as its inputs/attrs, so one kernel rotates, writes the cache and attends."""

    def __init__(self):
        super().__init__("fuse_rope_attention", root_layer={"gpt_attention"})

    @staticmethod
    def _ropes(attn: Layer):
        if attn.attrs.get("rotary_dim"):
            return None
        rq, rk = attn.get_input(0).get_parent(), attn.get_input(1).get_parent()
        if rq is None or rk is None or rq.op != "rotary_embedding" or rk.op != "rotary_embedding":
            return None
        same = ("is_neox", "rotary_dim", "head_dim")
        if rq.inputs[1:] != rk.inputs[1:] or any(rq.attrs[a] != rk.attrs[a] for a in same):
            return None
        if rq.attrs["num_heads"] != attn.attrs["num_heads"] or rk.attrs["num_heads"] != attn.attrs["num_kv_heads"]:
            return None
        if not (_only_reader(attn.get_input(0), attn) and _only_reader(attn.get_input(1), attn)):
            return None
        return rq, rk

    def match(self, layer: Layer) -> bool:
        return self._ropes(layer) is not None

    def rewrite(self, layer: Layer) -> None:
        rq, rk = self._ropes(layer)
        net = layer.network
        a = layer.attrs
        inputs = dict(zip(F.GPT_ATTENTION_INPUTS, layer.get_inputs()))
        inputs.update(q=rq.get_input(0), k=rk.get_input(0), position_ids=rq.get_input(1),
                      rotary_cos_sin=rq.get_input(2))
        out = F.gpt_attention(
            **inputs,
            layer_idx=a["layer_idx"], num_heads=a["num_heads"], num_kv_heads=a["num_kv_heads"],
            head_dim=a["head_dim"], tokens_per_block=a["tokens_per_block"], scale=a["scale"],
            sliding_window=a["sliding_window"], rotary_dim=rq.attrs["rotary_dim"],
            rotary_is_neox=rq.attrs["is_neox"])
        layer.get_output(0).replace_all_uses_with(out)
        for old in (layer, rq, rk):
            net.mark_removed(old)


def _sole_linear_reader(tensor: F.Tensor) -> Optional[Layer]:
    """The linear that reads `tensor` as its input x, with a constant weight (and bias), when
    it is the tensor's only reader and the tensor is no network result; else None. Constant
    parameters are what a fused kernel streams, and they cannot depend on the tensor."""
    users = tensor.get_users()
    if len(users) != 1:
        return None
    linear = users[0]
    if linear.op != "linear" or linear.inputs.count(tensor.name) != 1 or linear.inputs[0] != tensor.name:
        return None
    if not all(_is_constant(t) for t in linear.get_inputs()[1:] if t is not None):
        return None
    return linear if _only_reader(tensor, linear) and not _has_timed_choice(linear) else None


# The input holding the norm weight, per norm op that fuse_norm_linear extends.
_NORM_WEIGHT_INPUT = {"rms_norm": 1, "fused_add_rms_norm": 2}


class FuseNormLinear(PatternRewriter):
    """rms_norm(x, w) -> linear becomes rms_norm_linear, and fused_add_rms_norm(x, r, w) ->
    linear becomes add_rms_norm_linear, whose sum output takes over every reader of the old
    sum (the residual stream). Only where the norm has a weight and the normalised output has
    that linear as its only reader and is no network or debug output: a norm read twice
    (Phi's parallel attention and MLP) stays as it is. Runs after fuse_add_rms_norm and
    fuse_gate_up, whose results it matches."""

    def __init__(self):
        super().__init__("fuse_norm_linear", root_layer=set(_NORM_WEIGHT_INPUT))

    @staticmethod
    def _linear(norm: Layer) -> Optional[Layer]:
        if norm.inputs[_NORM_WEIGHT_INPUT[norm.op]] is None or _has_timed_choice(norm):
            return None
        return _sole_linear_reader(norm.get_output(0))

    def match(self, layer: Layer) -> bool:
        return self._linear(layer) is not None

    def rewrite(self, layer: Layer) -> None:
        linear = self._linear(layer)
        weight, bias = linear.get_input(1), linear.get_input(2)
        eps = layer.attrs["eps"]
        if layer.op == "rms_norm":
            y = F.rms_norm_linear(layer.get_input(0), layer.get_input(1), weight, bias, eps=eps)
        else:
            y, total = F.add_rms_norm_linear(*layer.get_inputs(), weight, bias, eps=eps)
            layer.get_output(1).replace_all_uses_with(total)
        linear.get_output(0).replace_all_uses_with(y)
        layer.network.mark_removed(layer)
        layer.network.mark_removed(linear)


class FuseActLinear(PatternRewriter):
    """silu_and_mul -> linear becomes silu_and_mul_linear, where that linear is the only reader
    of the activation and the activation no network or debug output. Runs after fuse_gate_up,
    which makes the silu_and_mul."""

    def __init__(self):
        super().__init__("fuse_act_linear", root_layer={"silu_and_mul"})

    @staticmethod
    def _linear(act: Layer) -> Optional[Layer]:
        return None if _has_timed_choice(act) else _sole_linear_reader(act.get_output(0))

    def match(self, layer: Layer) -> bool:
        return self._linear(layer) is not None

    def rewrite(self, layer: Layer) -> None:
        linear = self._linear(layer)
        y = F.silu_and_mul_linear(layer.get_input(0), linear.get_input(1), linear.get_input(2))
        linear.get_output(0).replace_all_uses_with(y)
        layer.network.mark_removed(layer)
        layer.network.mark_removed(linear)


# The default order: later passes match what earlier ones make.
PASSES = {"fuse_add_rms_norm": FuseAddRmsNorm, "fuse_gate_up": FuseGateUp,
          "fuse_rope_attention": FuseRopeAttention, "fuse_norm_linear": FuseNormLinear,
          "fuse_act_linear": FuseActLinear}


def optimize(network: Network, passes: Optional[list[str]] = None) -> dict:
    """Run the named fusion passes (default: all of PASSES), then remove dead layers and
    unused weights. Returns a report for the build summary."""
    passes = list(PASSES) if passes is None else list(passes)
    unknown = [p for p in passes if p not in PASSES]
    if unknown:
        raise ValueError(f"unknown optimization passes {unknown}; known: {sorted(PASSES)}")
    layers_before, weights_before = network.num_layers, len(network.weights)
    manager = RewritePatternManager()
    for label in passes:
        manager.add(label, PASSES[label]())
    rewrites = manager.process(network)
    dead = remove_dead_layers(network)
    pruned = prune_unused_weights(network)
    network.sort_layers()
    return {"layers_before": layers_before, "layers_after": network.num_layers, "rewrites": rewrites,
            "dead_layers_removed": dead, "weights_before": weights_before, "weights_after": len(network.weights),
            "weights_removed": pruned}
