import pytest
import torch

from tensorrt_llm import Network, default_net, functional, net_guard
from tensorrt_llm import functional as F
from tensorrt_llm.graph_rewriting import (
    PASSES,
    AnalysisPatternManager,
    FLayerInfoMemo,
    PatternAnalyzer,
    PatternRewriter,
    RemoveDeadLayers,
    RewritePatternManager,
    optimize,
    prune_unused_weights,
    record_signature,
    remove_dead_layers,
)
from tensorrt_llm.models import LLaMAForCausalLM, PretrainedConfig
from tensorrt_llm.network import Tensor
from tensorrt_llm.ops import op as op_registry
from tensorrt_llm.quantization.formats import FP8_DTYPE
from tensorrt_llm.reference_executor import ReferenceExecutor

H, INTER = 8, 12


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
            gate = F.linear(h, F.constant(w(INTER, H), name=f"{p}.mlp.gate.weight"),
                            F.constant(w(INTER), name=f"{p}.mlp.gate.bias") if bias else None)
            up = F.linear(h, F.constant(w(INTER, H), name=f"{p}.mlp.fc.weight"),
                          F.constant(w(INTER), name=f"{p}.mlp.fc.bias") if bias else None)
            x = x + F.linear(act(gate) * up, F.constant(w(H, INTER), name=f"{p}.mlp.proj.weight"))
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
    assert net.weights["transformer.layers.1.mlp.gate_up.weight"].shape == (2 * INTER, H)


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
        gate = F.linear(x, F.constant(torch.randn(INTER, H), name="g"))
        up = F.linear(x, F.constant(torch.randn(INTER, H), name="u"))
        net.mark_output(F.silu(gate) * up, "y")
        net.mark_output(gate, "gate")
    assert optimize(net, passes=["fuse_gate_up"])["rewrites"] == {"fuse_gate_up": 0}
    assert ops(net).count("linear") == 2


def test_no_fusion_for_different_inputs_or_broadcast_add():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [2, H])
        z = net.add_input("z", "float32", [2, H])
        up = F.linear(z, F.constant(torch.randn(INTER, H), name="u"))
        net.mark_output(F.silu(F.linear(x, F.constant(torch.randn(INTER, H), name="g"))) * up, "y")
        bias = F.constant(torch.randn(H), name="b")
        net.mark_output(F.rms_norm(x + bias, None, eps=1e-6), "n")
    report = optimize(net)
    assert report["rewrites"] == {"fuse_add_rms_norm": 0, "fuse_gate_up": 0, "fuse_rope_attention": 0,
                                  "fuse_attention_fp8_linear": 0, "fuse_norm_linear": 0, "fuse_act_linear": 0,
                                  "fuse_fp8_gated_mlp": 0, "fuse_gated_linear": 0}


def fp8_mlp_network(weight_scales, input_scales, bias=False, up_fp8=True):
    """y = silu(fp8_linear(x, gate)) * fp8_linear(x, up) (up a float linear unless up_fp8):
    weight_scales and input_scales are the (gate, up) scales, a list or None."""
    g = torch.Generator().manual_seed(1)
    codes = lambda: (torch.randn(INTER, H, generator=g) * 100).clamp(-448, 448).to(FP8_DTYPE).view(torch.uint8)
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, H], [("num_tokens", (1, 4, 16))])

        def fp8(name, weight_scale, input_scale):
            const = lambda value, suffix: F.constant(torch.tensor(value, dtype=torch.float32), name=f"{name}.{suffix}")
            return F.fp8_linear(x, F.constant(codes(), name=f"{name}.weight"), const(weight_scale, "weight_scale"),
                                None if input_scale is None else const([input_scale], "input_scale"),
                                F.constant(torch.randn(INTER, generator=g), name=f"{name}.bias") if bias else None)
        gate = fp8("mlp.gate", weight_scales[0], input_scales[0])
        up = (fp8("mlp.fc", weight_scales[1], input_scales[1]) if up_fp8
              else F.linear(x, F.constant(torch.randn(INTER, H, generator=g), name="mlp.fc.weight")))
        net.mark_output(F.silu(gate) * up, "y")
    return net


SCALES = torch.linspace(0.001, 0.003, INTER).tolist()
# (weight scales, the fused weight scale's shape and its refit sources)
FP8_CASES = {"per_tensor_equal": (([0.002], [0.002]), (1,), None),
             "per_tensor_different": (([0.002], [0.003]), (2 * INTER,),
                                      [["mlp.gate.weight_scale", INTER], ["mlp.fc.weight_scale", INTER]]),
             "per_channel": ((SCALES, SCALES[::-1]), (2 * INTER,), ["mlp.gate.weight_scale", "mlp.fc.weight_scale"])}


@pytest.mark.parametrize("case", FP8_CASES)
@pytest.mark.parametrize("input_scales,bias", [((0.02, 0.02), False), ((None, None), True)])
def test_fp8_gate_and_up_fuse_into_one_fp8_linear(case, input_scales, bias):
    weight_scales, scale_shape, scale_sources = FP8_CASES[case]
    net = fp8_mlp_network(weight_scales, input_scales, bias=bias)
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(2))
    before = ReferenceExecutor(net).run({"x": x})["y"]
    dequantized = lambda name: (net.weights[f"{name}.weight"].view(FP8_DTYPE).float()
                                * net.weights[f"{name}.weight_scale"].reshape(-1, 1))
    unfused_weight = torch.cat([dequantized("mlp.gate"), dequantized("mlp.fc")])
    assert optimize(net, passes=["fuse_gate_up"])["rewrites"] == {"fuse_gate_up": 1}
    assert ops(net).count("fp8_linear") == 1 and "silu_and_mul" in ops(net) and "mul" not in ops(net)
    (layer,) = [layer for layer in net.layers if layer.op == "fp8_linear"]
    qweight, weight_scale, input_scale = (name and net.producer(name).attrs["weight"] for name in layer.inputs[1:4])
    # The codes and each row's scale are the unfused ones: the same float32 weight, bit for bit,
    # and x quantized with the same scale, so every output is the same float32 dot product, up
    # to the order the GEMM sums it in (it blocks a 2I-row weight unlike an INTER-row one: measured
    # 1e-7 of the largest output).
    fused_weight = net.weights[qweight].view(FP8_DTYPE).float() * net.weights[weight_scale].reshape(-1, 1)
    assert torch.equal(fused_weight, unfused_weight)
    after = ReferenceExecutor(net).run({"x": x})["y"]
    assert (after - before).abs().max() <= 1e-6 * before.abs().max()
    assert qweight == "mlp.gate_up.weight" and net.weights[qweight].shape == (2 * INTER, H)
    assert net.weight_sources[qweight] == ["mlp.gate.weight", "mlp.fc.weight"]
    assert net.weights[weight_scale].shape == scale_shape
    equal = {}
    if scale_sources is None:  # the gate's scale, read for both
        assert weight_scale == "mlp.gate.weight_scale"
        equal["mlp.fc.weight_scale"] = "mlp.gate.weight_scale"
    else:
        assert weight_scale == "mlp.gate_up.weight_scale" and net.weight_sources[weight_scale] == scale_sources
    if input_scales[0] is not None:
        assert input_scale == "mlp.gate.input_scale"
        equal["mlp.fc.input_scale"] = "mlp.gate.input_scale"
    assert net.equal_sources == equal
    assert ("mlp.gate_up.bias" in net.weights) == bias


@pytest.mark.parametrize("weight_scales,input_scales,up_fp8", [
    (([0.002], [0.002]), (0.02, 0.03), True),  # x would be quantized with two scales
    (([0.002], [0.002]), (0.02, None), True),  # static and dynamic
    (([0.002], SCALES), (0.02, 0.02), True),  # per tensor and per channel
    (([0.002], None), (0.02, None), False),  # only the gate is FP8
])
def test_fp8_gate_and_up_do_not_fuse_unless_one_fp8_linear_computes_them(weight_scales, input_scales, up_fp8):
    net = fp8_mlp_network(weight_scales, input_scales, up_fp8=up_fp8)
    assert optimize(net, passes=["fuse_gate_up"])["rewrites"] == {"fuse_gate_up": 0}
    assert "mul" in ops(net) and not net.equal_sources and not net.weight_sources


def test_dead_branches_are_removed_in_one_pass():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [3])
        kept = F.relu(x)
        shared = F.tanh(kept)
        F.sigmoid(F.silu(shared) + shared)  # a dead branch reading a layer only it reads
        net.mark_output(F.gelu(kept), "y")
    assert remove_dead_layers(net) == 4
    assert ops(net) == ["relu", "gelu"]


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
    # A pass ported from TensorRT-LLM imports these from graph_rewriting.
    assert record_signature is functional.record_signature
    assert FLayerInfoMemo.instance() is FLayerInfoMemo.instance()


def test_flayer_info_reads_the_call_back_from_the_layer():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, 4], [("n", (1, 3, 16))])
        w = F.constant(torch.randn(3, 4), name="w")
        y = F.linear(x, w)
        a = F.relu(y)
        net.mark_output(a + F.tanh(y) * 2.0, "out")
        info = FLayerInfoMemo.instance().get(y.get_parent().name)
    assert info.layer_type == "linear" and info.outputs == [y]
    assert info.raw_inputs == {"x": x, "weight": w, "bias": None}
    constant = FLayerInfoMemo.instance().get(w.get_parent().name, net)
    assert constant.get_input("name") == "w" and constant.get_input("value") is net.weights["w"]
    with pytest.raises(RuntimeError, match="net_guard"):
        FLayerInfoMemo.instance().get(y.get_parent().name)
    assert FLayerInfoMemo.instance().get("no such layer", net) is None

    with net_guard(net):
        y2 = F.sigmoid(x)
        y3 = F.linear(x, w)
    y.replace_all_uses_with(y3)
    relu = FLayerInfoMemo.instance().get(a.get_parent().name, net)
    assert relu.get_input("x") == y3  # read from the layer: it follows the rewiring
    relu.replace_input_with(y3, y2)
    assert a.get_parent().inputs == (y2.name,) and relu.get_input("x") == y2
    assert FLayerInfoMemo.instance().get(a.get_parent().name, net).get_input("x") == y2


def every_op_network() -> Network:
    """A network with a layer of every recorded op (the FLayerInfo contract is checked on it)."""
    g = torch.Generator().manual_seed(1)
    net = Network("every_op")
    with net_guard(net):
        T = ("t", (1, 3, 8))
        ids = net.add_input("ids", "int32", [-1], [T])
        pos = net.add_input("pos", "int32", [-1], [T])
        x = F.embedding(ids, F.constant(torch.randn(10, 16, generator=g), name="emb"))
        w = F.constant(torch.randn(16, 16, generator=g), name="w")
        norm_w = F.constant(torch.rand(16, generator=g) + 0.5, name="norm_w")
        h = F.layer_norm(x, norm_w, F.constant(torch.zeros(16), name="ln_b"), eps=1e-5)
        n, s = F.fused_add_rms_norm(h, F.rms_norm(x, norm_w, eps=1e-6), norm_w, eps=1e-6)
        y, s2 = F.add_rms_norm_linear(n, s, norm_w, w, None, eps=1e-6)
        y = F.rms_norm_linear(y, norm_w, w, F.constant(torch.zeros(16), name="b"), eps=1e-6)
        y = F.silu_and_mul_linear(F.concat([y, s2], dim=-1), w) + F.silu_and_mul(F.concat([y, y], -1))
        y = F.gelu_and_mul(F.concat([y, y], -1), approximate="tanh") - F.gelu(y) * F.gelu_tanh(y) / 2.0
        y = F.pow(F.sigmoid(F.tanh(F.relu(F.silu(y)))), 2.0)
        table = F.constant(F.rope_cos_sin_cache(32, 8), name="rope")
        q = F.rotary_embedding(F.linear(y, w), pos, table, num_heads=2, head_dim=8, rotary_dim=8)
        k = F.rotary_embedding(F.slice(y, 1, 0, 8), pos, table, num_heads=1, head_dim=8, is_neox=False)
        pool = net.add_input("kv_cache_pool", "float32", [2, -1, 2, 1, 4, 8], {1: ("b", (1, 4, 8))})
        tables = net.add_input("block_tables", "int32", [-1, 2], {0: ("batch", (1, 1, 2))})
        lens = [net.add_input(name, "int32", [-1], [("batch", (1, 1, 2))])
                for name in ("seq", "ctx", "host_ctx", "host_seq")]
        att = F.gpt_attention(q, k, k, pool, tables, *lens[:3], layer_idx=0, num_heads=2, num_kv_heads=1,
                              head_dim=8, tokens_per_block=4, scale=0.3)
        att = att + F.gpt_attention(q, k, k, pool, tables, *lens[:3], F.constant(torch.ones(2), name="alibi"),
                                    pos, table, lens[3], layer_idx=1, num_heads=2, num_kv_heads=1, head_dim=8,
                                    tokens_per_block=4, sliding_window=3, rotary_dim=8, rotary_is_neox=False)
        a, b = F.split(att, [4, 12], dim=1)
        z = F.view(F.transpose(F.permute(F.unsqueeze(b, 0), [0, 2, 1]), 0, 2), [0, -1])
        z = F.squeeze(F.matmul(F.unsqueeze(a, 0), F.unsqueeze(a, 0), transb=True), 0)
        z = F.where(F.cast(F.index_select(z, 0, F.argmax(z, dim=1)), "bool"), z, 0.0)
        z = F.softmax(F.allreduce(F.gather(z, 1, F.cast(F.argmax(z, -1, keepdim=True), "int32"))), dim=0)
        net.mark_output(z, "z")
    return net


def llama_network(optimized: bool) -> Network:
    config = PretrainedConfig(architecture="LlamaForCausalLM", dtype="float32", num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, hidden_size=32, intermediate_size=48,
                              vocab_size=64, max_position_embeddings=128)
    model = LLaMAForCausalLM(config)
    model.load({name: torch.randn(p.shape) for name, p in model.named_parameters()})
    net = Network("llama")
    with net_guard(net):
        model(**model.prepare_inputs(max_batch_size=2, max_beam_width=1, max_seq_len=64, max_num_tokens=32,
                                     tokens_per_block=8))
    if optimized:
        optimize(net)
    return net


def by_name(value):
    """Arguments with each Tensor as its name, to compare calls across networks."""
    if isinstance(value, Tensor):
        return value.name
    if isinstance(value, dict):
        return {k: by_name(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [by_name(v) for v in value]
    return value


@pytest.mark.parametrize("make", [every_op_network, lambda: llama_network(False), lambda: llama_network(True)],
                         ids=["every_op", "llama", "llama_optimized"])
def test_flayer_info_remakes_every_layer_of_a_network_loaded_from_json(make):
    """A layer's FLayerInfo holds the whole call: the op called again with it makes the same
    layer, also in a network loaded from JSON (which keeps only inputs and attrs)."""
    net = make()
    loaded = Network.from_json(net.to_json(), net.weights)
    for original, layer in zip(net.layers, loaded.layers):
        info = FLayerInfoMemo.instance().get(layer.name, loaded)
        assert info.layer_type == original.op
        assert by_name(info.raw_inputs) == by_name(FLayerInfoMemo.instance().get(original.name, net).raw_inputs)
        with net_guard(loaded):
            getattr(F, info.layer_type)(**info.clone_inputs())
        again = loaded.get_layer(-1)
        assert (again.op, again.inputs, again.attrs) == (layer.op, layer.inputs, layer.attrs), layer.name
        assert [(t.dtype, t.shape) for t in again.get_outputs()] == [(t.dtype, t.shape) for t in layer.get_outputs()]


def test_an_op_refuses_a_layer_its_call_cannot_be_read_back_from(monkeypatch):
    """Every op checks, on each call, that the layer it made keeps every argument as an input or
    an attr of the same name (Op.__call__), so FLayerInfo reads the layers of any op, also one
    added later; every_op_network checks the round trip of today's ops."""
    monkeypatch.setattr(op_registry, "OPS", dict(op_registry.OPS))
    monkeypatch.setattr(op_registry, "OP_SIGNATURES", dict(op_registry.OP_SIGNATURES))

    @op_registry.define
    def scaled(x, scale: float):
        return default_net().add_layer("scaled", [x.name], [(x.dtype, x.shape)], {"factor": scale}).get_output(0)

    assert {layer.op for layer in every_op_network().layers} <= set(functional.OP_SIGNATURES)
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [3])
        with pytest.raises(ValueError, match="gives no argument 'scale'"):
            scaled(x, 2.0)


def test_a_user_op_recorded_with_record_signature_has_flayer_info(monkeypatch):
    monkeypatch.setattr(op_registry, "OP_SIGNATURES", dict(op_registry.OP_SIGNATURES))

    def scaled_tanh(x, *, scale: float):
        return default_net().add_layer("scaled_tanh", [x.name], [(x.dtype, x.shape)], {"scale": scale}).get_output(0)

    assert record_signature(scaled_tanh) is scaled_tanh  # nothing wraps the op: no cost per call
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [3])
        y = scaled_tanh(x, scale=2.0)
        assert FLayerInfoMemo.instance().get(y.get_parent().name).raw_inputs == {"x": x, "scale": 2.0}
        bad = net.add_layer("scaled_tanh", [x.name], [("float32", (3,))], {"scale": 2.0, "shift": 1.0})
        with pytest.raises(ValueError, match="shift"):
            FLayerInfoMemo.instance().get(bad.name)


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


def test_builder_passes_are_pattern_rewriters():
    assert all(isinstance(p(), PatternRewriter) for p in PASSES.values())
    assert isinstance(RemoveDeadLayers(), PatternRewriter)


@pytest.mark.parametrize("make", [decoder_network, lambda: llama_network(False)], ids=["decoder", "llama"])
def test_fusion_plan_reports_what_each_pass_replaces(make):
    net = make()
    before = {layer.name: layer.op for layer in net.layers}
    plan = {}
    report = optimize(net, plan=plan)
    assert list(plan) == list(PASSES)
    assert {label: len(matches) for label, matches in plan.items()} == report["rewrites"]
    assert sum(report["rewrites"].values()) > 0
    shapes = {"fuse_add_rms_norm": ["add", "rms_norm"], "fuse_gate_up": ["linear", "linear", "silu", "mul"],
              "fuse_rope_attention": ["rotary_embedding", "rotary_embedding", "gpt_attention"],
              "fuse_act_linear": ["silu_and_mul", "linear"]}
    live = {layer.name for layer in net.layers}
    for label, matches in plan.items():
        for names in matches:
            assert not live & set(names)  # each named layer was replaced
            if label in shapes and all(n in before for n in names):
                assert [before[n] for n in names] == shapes[label]


def test_act_order_gate_and_up_fuse_when_their_input_orders_are_equal():
    """GPTQ act-order: gate and up are INT4 weight-only linears that gather x by their perms. With
    equal perms they fuse (one gather, one GEMV, gated, the norm in front), the up's perm recorded
    as read in place of the gate's; with different perms they stay apart. Results unchanged."""
    from tensorrt_llm.quantization import quantize_int4
    g = torch.Generator().manual_seed(1)
    h, inter, group = 64, 32, 32

    def mlp_network(up_perm_equal: bool):
        perm = torch.randperm(h, generator=torch.Generator().manual_seed(2))
        up_perm = perm.clone() if up_perm_equal else torch.randperm(h, generator=torch.Generator().manual_seed(3))
        net = Network("act_order_mlp")
        with net_guard(net):
            x = net.add_input("x", "float32", [-1, h], [("num_tokens", (1, 4, 16))])
            normed = F.rms_norm(x, F.constant(1 + 0.1 * torch.randn(h, generator=g), name="norm.weight"), eps=1e-5)
            outs = []
            for name, p in (("gate", perm), ("fc", up_perm)):
                w = quantize_int4(torch.randn(inter, h, generator=g), group)
                outs.append(F.weight_only_linear(
                    normed, F.constant(w.qweight, name=f"{name}.weight"), F.constant(w.scales, name=f"{name}.scale"),
                    F.constant(w.zeros, name=f"{name}.zero"), None, F.constant(p, name=f"{name}.weight_perm"),
                    weight_format="int4", group_size=group))
            net.mark_output(F.silu(outs[0]) * outs[1], "y")
        return net

    feed = {"x": torch.randn(3, h, generator=g)}
    for equal in (True, False):
        net = mlp_network(equal)
        before = ReferenceExecutor(net).run(feed)
        report = optimize(net)
        torch.testing.assert_close(ReferenceExecutor(net).run(feed)["y"], before["y"], atol=1e-5, rtol=1e-5)
        assert report["rewrites"]["fuse_gate_up"] == int(equal)
        if equal:
            assert ops(net) == ["constant"] * 5 + ["rms_norm_weight_only_linear"]  # norm, codes, scales, zeros, perm
            assert net.equal_sources == {"fc.weight_perm": "gate.weight_perm"} and "fc.weight_perm" not in net.weights
        else:
            assert ops(net).count("weight_only_linear") == 2 and not net.equal_sources
