import pytest
import torch

from tensorrt_llm import Network, functional, net_guard
from tensorrt_llm import functional as F
from tensorrt_llm.graph_rewriting import (
    AnalysisPatternManager,
    FLayerInfo,
    FLayerInfoMemo,
    FuseAddRmsNorm,
    FuseGateUp,
    PatternAnalyzer,
    PatternRewriter,
    RewritePatternManager,
    optimize,
    prune_unused_weights,
    record_signature,
    remove_dead_layers,
)
from tensorrt_llm.reference_executor import ReferenceExecutor

H, I = 8, 12


def decoder_network(num_layers=2, act=F.silu, bias=False, debug_sum=False):
    """embedding -> [x += mlp(rms_norm(x))] * num_layers -> rms_norm, llama style."""
    g = torch.Generator().manual_seed(0)
    w = lambda *shape: torch.randn(*shape, generator=g) * 0.3
    net = Network("decoder")
    with net_guard(net):
        ids = net.add_input("input_ids", "int32", [-1], [("num_tokens", (1, 4, 16))])
        x = F.embedding(ids, F.constant(w(20, H), name="transformer.vocab_embedding.weight"))
        for i in range(num_layers):
            p = f"transformer.layers.{i}"
            h = F.rms_norm(x, F.constant(1 + w(H), name=f"{p}.post_layernorm.weight"), eps=1e-5)
            gate = F.linear(h, F.constant(w(I, H), name=f"{p}.mlp.gate.weight"),
                            F.constant(w(I), name=f"{p}.mlp.gate.bias") if bias else None)
            up = F.linear(h, F.constant(w(I, H), name=f"{p}.mlp.fc.weight"),
                          F.constant(w(I), name=f"{p}.mlp.fc.bias") if bias else None)
            x = x + F.linear(act(gate) * up, F.constant(w(H, I), name=f"{p}.mlp.proj.weight"))
            if debug_sum and i == 0:
                net.mark_debug(x)
        net.mark_output(F.rms_norm(x, F.constant(1 + w(H), name="transformer.ln_f.weight"), eps=1e-5), "hidden")
    return net


def run(net, ids):
    return ReferenceExecutor(net).run({"input_ids": ids})


def ops(net):
    return [layer.op for layer in net.layers]


@pytest.mark.parametrize("act,fused_op", [(F.silu, "silu_and_mul"), (F.gelu_tanh, "gelu_and_mul"),
                                          (F.gelu, "gelu_and_mul")])
@pytest.mark.parametrize("bias", [False, True])
def test_optimize_fuses_and_keeps_results(act, fused_op, bias):
    net = decoder_network(act=act, bias=bias)
    ids = torch.tensor([3, 1, 4, 1, 5], dtype=torch.int32)
    before = run(net, ids)
    report = optimize(net, passes=["fuse_add_rms_norm", "fuse_gate_up"])
    after = run(net, ids)
    torch.testing.assert_close(after["hidden"], before["hidden"], atol=1e-5, rtol=1e-5)
    # layer 0's post_layernorm reads the embedding (no add); layer 1's and ln_f read an add
    assert report["rewrites"] == {"fuse_add_rms_norm": 2, "fuse_gate_up": 2}
    assert ops(net).count(fused_op) == 2 and ops(net).count("fused_add_rms_norm") == 2
    assert "mul" not in ops(net) and "add" not in ops(net) and ops(net).count("rms_norm") == 1
    assert report["layers_after"] == net.num_layers < report["layers_before"]
    names = set(net.weights)
    assert "transformer.layers.0.mlp.gate_up.weight" in names
    assert not any(n.endswith((".gate.weight", ".fc.weight")) for n in names)
    assert ("transformer.layers.1.mlp.gate_up.bias" in names) == bias
    assert net.weights["transformer.layers.1.mlp.gate_up.weight"].shape == (2 * I, H)


def test_fused_network_round_trips_through_json():
    net = decoder_network()
    optimize(net)
    again = Network.from_json(net.to_json(), net.weights)
    ids = torch.tensor([7, 2], dtype=torch.int32)
    torch.testing.assert_close(run(again, ids)["hidden"], run(net, ids)["hidden"])


def test_add_result_stays_available_as_debug_output():
    net = decoder_network(debug_sum=True)
    debug_name = net.debug_outputs[0]
    ids = torch.tensor([0, 9, 2], dtype=torch.int32)
    before = run(net, ids)
    optimize(net, passes=["fuse_add_rms_norm"])
    after = run(net, ids)
    assert net.debug_outputs == [debug_name]
    assert net.producer(debug_name).op == "fused_add_rms_norm"
    for name in before:
        torch.testing.assert_close(after[name], before[name], atol=1e-5, rtol=1e-5)


def test_norm_with_a_timed_choice_is_not_fused():
    """The builder's timed choice (timing_cache.py) is for that op: fusing would drop it."""
    net = decoder_network()
    norms = [layer for layer in net.layers if layer.op == "rms_norm"]
    for layer in norms:
        layer.attrs["implementation"] = "cuda"
    assert optimize(net)["rewrites"]["fuse_add_rms_norm"] == 0
    assert all(layer.attrs["implementation"] == "cuda" and not layer.removed for layer in norms)


def test_no_fusion_when_gate_output_has_other_readers():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [2, H])
        gate = F.linear(x, F.constant(torch.randn(I, H), name="g"))
        up = F.linear(x, F.constant(torch.randn(I, H), name="u"))
        net.mark_output(F.silu(gate) * up, "y")
        net.mark_output(gate, "gate")
    assert optimize(net, passes=["fuse_gate_up"])["rewrites"] == {"fuse_gate_up": 0}
    assert ops(net).count("linear") == 2


def test_no_fusion_for_different_inputs_or_broadcast_add():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [2, H])
        z = net.add_input("z", "float32", [2, H])
        up = F.linear(z, F.constant(torch.randn(I, H), name="u"))
        net.mark_output(F.silu(F.linear(x, F.constant(torch.randn(I, H), name="g"))) * up, "y")
        bias = F.constant(torch.randn(H), name="b")
        net.mark_output(F.rms_norm(x + bias, None, eps=1e-6), "n")
    report = optimize(net)
    assert report["rewrites"] == {"fuse_add_rms_norm": 0, "fuse_gate_up": 0, "fuse_rope_attention": 0,
                                  "fuse_norm_linear": 0, "fuse_act_linear": 0}


def test_dead_layers_and_unused_weights_are_removed():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [3])
        F.tanh(F.relu(x))  # reaches nothing
        F.constant(torch.ones(3), name="unused")
        net.mark_output(F.sigmoid(x), "y")
    assert remove_dead_layers(net) == 3
    assert ops(net) == ["sigmoid"]
    assert prune_unused_weights(net) == 1 and net.weights == {}


def test_dead_layer_removal_keeps_side_effects():
    net = Network()
    with net_guard(net):
        q = net.add_input("q", "float32", [-1, 4], [("t", (1, 1, 4))])
        pool = net.add_input("kv_cache_pool", "float32", [1, 2, 2, 1, 2, 4])
        tables = net.add_input("block_tables", "int32", [1, 2])
        lens = [net.add_input(n, "int32", [1]) for n in ("sequence_lengths", "context_lengths",
                                                          "host_context_lengths")]
        F.gpt_attention(q, q, q, pool, tables, *lens, layer_idx=0, num_heads=1, num_kv_heads=1, head_dim=4,
                        tokens_per_block=2)
        net.mark_output(F.relu(q), "y")
    assert remove_dead_layers(net) == 0
    assert "gpt_attention" in ops(net)


class CountOps(PatternAnalyzer):
    def __init__(self):
        super().__init__("count_linear", root_layer={"linear"})
        self.seen = []

    def match(self, layer):
        return layer.get_input(1).get_parent().op == "constant"

    def analyze(self, layer):
        self.seen.append(layer.name)


class TanhToSigmoid(PatternRewriter):
    """A user-defined rewrite through FLayerInfo: tanh(x) -> 2 * sigmoid(2x) - 1."""

    def __init__(self):
        super().__init__("tanh_to_sigmoid", root_layer={"tanh"})

    def match(self, layer):
        return FLayerInfoMemo.instance().get(layer.name) is not None

    def rewrite(self, layer):
        info = FLayerInfoMemo.instance().get(layer.name)
        x = info.get_input("x")
        y = F.sigmoid(x * 2.0) * 2.0 - 1.0
        info.replace_output_uses_with(layer.network, [y])
        layer.network.mark_removed(layer)


def test_rewriting_names_are_importable_where_trtllm_users_find_them():
    # A pass ported from TensorRT-LLM imports these from graph_rewriting; they are functional's objects.
    assert FLayerInfo is functional.FLayerInfo
    assert FLayerInfoMemo is functional.FLayerInfoMemo
    assert record_signature is functional.record_signature


def test_managers_with_user_patterns():
    net = decoder_network(num_layers=1)
    analyzers = AnalysisPatternManager()
    counter = CountOps()
    analyzers.add("count", counter)
    assert analyzers.get("count") is counter
    assert analyzers.process(net) == {"count": 3} and len(counter.seen) == 3
    with pytest.raises(ValueError, match="already registered"):
        analyzers.add("count", CountOps())

    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [5])
        net.mark_output(F.tanh(x) + x, "y")
    x_val = torch.randn(5)
    before = ReferenceExecutor(net).run({"x": x_val})["y"]
    rewriters = RewritePatternManager()
    rewriters.add("t2s", TanhToSigmoid())
    assert rewriters.process(net) == {"t2s": 1}
    assert "tanh" not in ops(net)
    torch.testing.assert_close(ReferenceExecutor(net).run({"x": x_val})["y"], before, atol=1e-6, rtol=1e-6)


def test_unknown_pass_is_rejected():
    with pytest.raises(ValueError, match="unknown optimization passes"):
        optimize(Network(), passes=["fuse_everything"])


def test_fusion_classes_are_pattern_rewriters():
    assert isinstance(FuseAddRmsNorm(), PatternRewriter) and isinstance(FuseGateUp(), PatternRewriter)
