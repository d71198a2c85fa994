"""fuse_norm_linear and fuse_act_linear: a norm or gated activation and the one linear reading
it become one op (rms_norm_linear, add_rms_norm_linear, silu_and_mul_linear) with the same
numbers bit for bit on the CPU, and only where nothing else reads the intermediate;
fuse_fp8_gated_mlp, which makes the FP8 pair of an MLP's two fused ops one; and
fuse_attention_fp8_linear, an attention and the FP8 linear reading it."""
import pytest
import torch

from tensorrt_llm import Network, net_guard
from tensorrt_llm import functional as F
from tensorrt_llm.graph_rewriting import (
    FuseActLinear,
    FuseAttentionFp8Linear,
    FuseFp8GatedMlp,
    FuseGatedLinear,
    FuseNormLinear,
    PatternRewriter,
    optimize,
)
from tensorrt_llm.quantization import quantize_fp8, quantize_int4, quantize_int8
from tensorrt_llm.reference_executor import ReferenceExecutor
from tensorrt_llm.runtime.session import Session

H, FFN, V = 16, 24, 40
BEFORE = ["fuse_add_rms_norm", "fuse_gate_up"]  # what the two passes match is made by these


def decoder(dtype="float32", num_layers=2, bias=False, debug_residual=False):
    """embedding -> [x += attn(norm(x)); x += mlp(norm(x))] * num_layers -> ln_f -> lm_head,
    llama style, with a linear standing in for attention."""
    g = torch.Generator().manual_seed(0)

    def w(name, *shape, center=0.0):
        return F.constant((center + torch.randn(*shape, generator=g) * 0.3).to(getattr(torch, dtype)), name=name)

    def linear(x, name, out, inp):
        return F.linear(x, w(f"{name}.weight", out, inp), w(f"{name}.bias", out) if bias else None)

    net = Network("decoder")
    with net_guard(net):
        ids = net.add_input("input_ids", "int32", [-1], [("num_tokens", (1, 4, 16))])
        x = F.embedding(ids, w("transformer.vocab_embedding.weight", V, H))
        for i in range(num_layers):
            p = f"transformer.layers.{i}"
            h = F.rms_norm(x, w(f"{p}.input_layernorm.weight", H, center=1.0), eps=1e-5)
            x = x + linear(h, f"{p}.attention.dense", H, H)
            if debug_residual and i == 0:
                net.mark_debug(x)
            h = F.rms_norm(x, w(f"{p}.post_layernorm.weight", H, center=1.0), eps=1e-5)
            gate, up = linear(h, f"{p}.mlp.gate", FFN, H), linear(h, f"{p}.mlp.fc", FFN, H)
            x = x + linear(F.silu(gate) * up, f"{p}.mlp.proj", H, FFN)
        h = F.rms_norm(x, w("transformer.ln_f.weight", H, center=1.0), eps=1e-5)
        net.mark_output(linear(h, "lm_head", V, H), "logits")
    return net


def ops(net):
    return [layer.op for layer in net.layers]


def outputs(net, feed):
    return ReferenceExecutor(net).run(feed)


def copy(net):
    return Network.from_json(net.to_json(), dict(net.weights))


IDS = {"input_ids": torch.tensor([3, 1, 4, 1, 5, 9, 2], dtype=torch.int32)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bias", [False, True])
def test_each_pass_keeps_the_outputs_bit_for_bit(dtype, bias):
    net = decoder(dtype, bias=bias, debug_residual=True)
    optimize(net, passes=BEFORE)
    before = outputs(net, IDS)
    unfused = copy(net)
    counts = {op: ops(net).count(op) for op in ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "linear")}
    # layer 0's input norm reads the embedding; every other norm reads a residual add.
    assert counts == {"rms_norm": 1, "fused_add_rms_norm": 4, "silu_and_mul": 2, "linear": 7}
    num_layers = net.num_layers

    report = optimize(net, passes=["fuse_norm_linear"])
    assert report["rewrites"] == {"fuse_norm_linear": 5}
    assert net.num_layers == num_layers - 5
    assert ops(net).count("rms_norm_linear") == 1 and ops(net).count("add_rms_norm_linear") == 4
    assert not {"rms_norm", "fused_add_rms_norm"} & set(ops(net))
    after_norm = outputs(net, IDS)

    report = optimize(net, passes=["fuse_act_linear"])
    assert report["rewrites"] == {"fuse_act_linear": 2}
    assert net.num_layers == num_layers - 7
    assert ops(net).count("silu_and_mul_linear") == 2 and "silu_and_mul" not in ops(net)
    assert ops(net).count("linear") == 0
    after_act = outputs(net, IDS)

    for after in (after_norm, after_act):
        assert list(after) == list(before)  # logits, then the residual kept as a debug output
        for name in before:
            assert after[name].dtype == getattr(torch, dtype)
            assert torch.equal(after[name], before[name]), name
    # The runtime runs the CPU implementations (the host RMSNorm for float32): the fused network
    # gives the unfused one's numbers there too.
    session_before = Session(unfused).run(IDS)
    assert all(torch.equal(got, session_before[name]) for name, got in Session(net).run(IDS).items())


def test_fused_network_round_trips_through_json():
    net = decoder()
    optimize(net)
    again = copy(net)
    assert again.to_json() == net.to_json()
    assert torch.equal(outputs(again, IDS)["logits"], outputs(net, IDS)["logits"])


def test_residual_sum_keeps_every_reader():
    net = decoder(debug_residual=True)
    debug_name = net.debug_outputs[0]
    optimize(net, passes=BEFORE + ["fuse_norm_linear"])
    assert net.debug_outputs == [debug_name]
    producer = net.producer(debug_name)
    assert producer.op == "add_rms_norm_linear" and producer.outputs[1] == debug_name
    # ...which also feeds the next residual add's fused op as its residual input.
    assert any(layer.op == "add_rms_norm_linear" and layer.inputs[0] == debug_name
               for layer in net.consumers(debug_name))


def norm_read_twice():
    """Phi's parallel attention and MLP: one norm output, two linears."""
    net = Network("parallel")
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, H], [("n", (1, 4, 8))])
        h = F.rms_norm(x, F.constant(torch.ones(H), name="ln.weight"), eps=1e-5)
        a = F.linear(h, F.constant(torch.randn(H, H), name="attn.weight"))
        m = F.linear(h, F.constant(torch.randn(H, H), name="mlp.weight"))
        net.mark_output(x + a + m, "y")
    return net


def norm_linear(mark):
    net = Network("marked")
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, H], [("n", (1, 4, 8))])
        r = net.add_input("r", "float32", [-1, H], [("n", (1, 4, 8))])
        h, _ = F.fused_add_rms_norm(x, r, F.constant(torch.ones(H), name="ln.weight"), eps=1e-5)
        net.mark_output(F.linear(h, F.constant(torch.randn(H, H), name="w")), "y")
        mark(net, h)
    return net


def act_linear(mark):
    net = Network("act")
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, 2 * FFN], [("n", (1, 4, 8))])
        a = F.silu_and_mul(x)
        net.mark_output(F.linear(a, F.constant(torch.randn(H, FFN), name="w")), "y")
        mark(net, a)
    return net


def timed(net, op):
    for layer in net.layers:
        if layer.op == op:
            layer.attrs["implementation"] = "cuda"
    return net


def read_again(net, t):
    net.mark_output(F.relu(t), "other")


def norm_without_weight():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, H], [("n", (1, 4, 8))])
        net.mark_output(F.linear(F.rms_norm(x, None, eps=1e-5), F.constant(torch.randn(H, H))), "y")
    return net


def weight_from_an_input():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, H], [("n", (1, 4, 8))])
        w = net.add_input("w", "float32", [H, H])
        net.mark_output(F.linear(F.rms_norm(x, F.constant(torch.ones(H)), eps=1e-5), w), "y")
    return net


def layer_norm_linear():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, H], [("n", (1, 4, 8))])
        h = F.layer_norm(x, F.constant(torch.ones(H)), F.constant(torch.zeros(H)), eps=1e-5)
        net.mark_output(F.linear(h, F.constant(torch.randn(H, H))), "y")
    return net


@pytest.mark.parametrize("make", [
    norm_read_twice,
    lambda: norm_linear(lambda net, h: net.mark_output(h, "normed")),
    lambda: norm_linear(lambda net, h: net.mark_debug(h)),
    lambda: norm_linear(read_again),
    lambda: timed(norm_linear(lambda net, h: None), "fused_add_rms_norm"),
    norm_without_weight,
    weight_from_an_input,
    layer_norm_linear,
    lambda: act_linear(lambda net, a: net.mark_output(a, "act")),
    lambda: act_linear(lambda net, a: net.mark_debug(a)),
    lambda: act_linear(read_again),
    lambda: timed(act_linear(lambda net, a: None), "silu_and_mul"),
], ids=["read_twice", "network_output", "debug_output", "other_reader", "norm_timed", "no_norm_weight",
        "weight_input", "layer_norm", "act_output", "act_debug_output", "act_other_reader", "act_timed"])
def test_left_alone(make):
    net = make()
    layers = [(layer.op, layer.inputs, layer.outputs, dict(layer.attrs)) for layer in net.layers]
    report = optimize(net, passes=["fuse_norm_linear", "fuse_act_linear"])
    assert report["rewrites"] == {"fuse_norm_linear": 0, "fuse_act_linear": 0}
    assert [(layer.op, layer.inputs, layer.outputs, dict(layer.attrs)) for layer in net.layers] == layers


def test_the_same_networks_fuse_without_the_obstacle():
    for net, fused in ((norm_linear(lambda net, h: None), "add_rms_norm_linear"),
                       (act_linear(lambda net, a: None), "silu_and_mul_linear")):
        optimize(net, passes=["fuse_norm_linear", "fuse_act_linear"])
        assert [op for op in ops(net) if op != "constant"] == [fused]


def test_default_build_order_and_registration():
    from tensorrt_llm.builder import BuildConfig
    order = BuildConfig().optimizations
    assert order.index("fuse_norm_linear") > max(order.index(p) for p in BEFORE)
    assert order.index("fuse_act_linear") > order.index("fuse_gate_up")
    assert order.index("fuse_fp8_gated_mlp") > max(order.index("fuse_norm_linear"), order.index("fuse_act_linear"))
    assert isinstance(FuseNormLinear(), PatternRewriter) and isinstance(FuseActLinear(), PatternRewriter)
    assert isinstance(FuseFp8GatedMlp(), PatternRewriter) and isinstance(FuseGatedLinear(), PatternRewriter)
    assert order.index("fuse_gated_linear") > order.index("fuse_gate_up")
    assert order.index("fuse_attention_fp8_linear") > order.index("fuse_rope_attention")
    assert isinstance(FuseAttentionFp8Linear(), PatternRewriter)


# ---- fuse_fp8_gated_mlp ---------------------------------------------------------------------------

FP8_PASSES = ["fuse_norm_linear", "fuse_act_linear", "fuse_fp8_gated_mlp"]


def fp8_mlp(mark=lambda net, h: None):
    """x + r -> RMSNorm -> FP8 gate_up -> silu_and_mul -> FP8 down, and the residual sum; `mark`
    gets the network and gate_up's output."""
    g = torch.Generator().manual_seed(1)

    def fp8(name, out, inp):
        q = quantize_fp8(torch.randn(out, inp, generator=g) * 0.3, input_scale=torch.tensor([0.02]))
        return (F.constant(q.qweight.view(torch.uint8), name=f"{name}.weight"),
                F.constant(q.scale, name=f"{name}.weight_scale"), F.constant(q.input_scale, name=f"{name}.input_scale"))

    net = Network("fp8_mlp")
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, H], [("n", (1, 4, 8))])
        r = net.add_input("r", "float32", [-1, H], [("n", (1, 4, 8))])
        normed, total = F.fused_add_rms_norm(x, r, F.constant(torch.rand(H, generator=g) + 0.5, name="ln.weight"),
                                             eps=1e-5)
        h = F.fp8_linear(normed, *fp8("gate_up", 2 * FFN, H))
        net.mark_output(F.fp8_linear(F.silu_and_mul(h), *fp8("down", H, FFN)), "y")
        net.mark_output(total, "total")
        mark(net, h)
    return net


FP8_FEED = {"x": torch.randn(5, H, generator=torch.Generator().manual_seed(2)),
            "r": torch.randn(5, H, generator=torch.Generator().manual_seed(3))}


def test_fp8_gated_mlp_keeps_the_outputs_bit_for_bit():
    net = fp8_mlp()
    unfused = copy(net)
    report = optimize(net, passes=FP8_PASSES)
    assert report["rewrites"] == {"fuse_norm_linear": 1, "fuse_act_linear": 1, "fuse_fp8_gated_mlp": 1}
    assert [op for op in ops(net) if op != "constant"] == ["add_rms_norm_fp8_gated_mlp"]
    for got, want in ((outputs(net, FP8_FEED), outputs(unfused, FP8_FEED)),
                      (Session(net).run(FP8_FEED), Session(unfused).run(FP8_FEED))):
        assert list(got) == list(want) == ["y", "total"]
        assert all(torch.equal(got[name], want[name]) for name in want)


@pytest.mark.parametrize("mark", [lambda net, h: net.mark_output(h, "h"), lambda net, h: net.mark_debug(h),
                                  read_again], ids=["network_output", "debug_output", "other_reader"])
def test_fp8_gated_mlp_left_alone(mark):
    net = fp8_mlp(mark)
    report = optimize(net, passes=FP8_PASSES)
    assert report["rewrites"]["fuse_fp8_gated_mlp"] == 0
    assert "add_rms_norm_fp8_gated_mlp" not in ops(net)


def test_fp8_gated_mlp_leaves_a_timed_layer_alone():
    net = fp8_mlp()
    optimize(net, passes=FP8_PASSES[:2])
    timed(net, "silu_and_mul_fp8_linear")
    assert optimize(net, passes=["fuse_fp8_gated_mlp"])["rewrites"] == {"fuse_fp8_gated_mlp": 0}


# ---- fuse_gated_linear ------------------------------------------------------------------------------


def weight_only_mlp(mark=lambda net, h: None):
    """x -> INT4 gate_up (made by fuse_gate_up) -> silu_and_mul -> INT8 down; `mark` gets the
    network and the product."""
    g = torch.Generator().manual_seed(4)
    gate_up = quantize_int4(torch.randn(2 * FFN + 16, H * 8, generator=g) * 0.1, 32)
    down = quantize_int8(torch.randn(H, FFN + 8, generator=g) * 0.1, None)
    net = Network("wo_mlp")
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, H * 8], [("n", (1, 4, 8))])
        h = F.weight_only_linear(x, F.constant(gate_up.qweight, name="gu.q"), F.constant(gate_up.scales, name="gu.s"),
                                 F.constant(gate_up.zeros, name="gu.z"), weight_format="int4", group_size=32)
        y = F.weight_only_linear(F.silu_and_mul(h), F.constant(down.qweight, name="d.q"),
                                 F.constant(down.scales, name="d.s"), weight_format="int8")
        net.mark_output(y, "y")
        mark(net, h)
    return net


def test_gated_linear_keeps_the_outputs_bit_for_bit():
    net = weight_only_mlp()
    unfused = copy(net)
    assert optimize(net, passes=["fuse_gated_linear"])["rewrites"] == {"fuse_gated_linear": 1}
    assert [op for op in ops(net) if op != "constant"] == ["weight_only_linear", "weight_only_linear"]
    assert [layer.attrs.get("gated") for layer in net.layers if layer.op == "weight_only_linear"] == [True, None]
    feed = {"x": torch.randn(5, H * 8, generator=torch.Generator().manual_seed(5))}
    for run in (outputs, lambda network, feed: Session(network).run(feed)):
        assert torch.equal(run(net, feed)["y"], run(unfused, feed)["y"])
    assert copy(net).to_json() == net.to_json()  # the attr travels with the graph


@pytest.mark.parametrize("mark", [lambda net, h: net.mark_output(h, "h"), lambda net, h: net.mark_debug(h),
                                  read_again], ids=["network_output", "debug_output", "other_reader"])
def test_gated_linear_left_alone(mark):
    net = weight_only_mlp(mark)
    assert optimize(net, passes=["fuse_gated_linear"])["rewrites"] == {"fuse_gated_linear": 0}
    assert "silu_and_mul" in ops(net)


# ---- fuse_attention_fp8_linear ----------------------------------------------------------------------

HEADS, KV_HEADS, HEAD_DIM, TPB = 4, 2, 8, 4


def attention_fp8(mark=lambda net, a: None, static=True):
    """A decode step's packed q / k / v -> gpt_attention (RoPE fused) -> FP8 dense (a static or
    per-token input scale); `mark` gets the network and the attention's output."""
    g = torch.Generator().manual_seed(6)
    width = HEADS * HEAD_DIM
    q = quantize_fp8(torch.randn(H, width, generator=g) * 0.3, input_scale=torch.tensor([0.01]) if static else None)
    net = Network("attention_fp8")
    with net_guard(net):
        qkv = net.add_input("qkv", "float32", [-1, (HEADS + 2 * KV_HEADS) * HEAD_DIM], [("n", (1, 4, 8))])
        pool = net.add_input("kv_cache_pool", "float32", [1, -1, 2, KV_HEADS, TPB, HEAD_DIM], {1: ("b", (1, 8, 16))})
        tables = net.add_input("block_tables", "int32", [-1, 4], [("n", (1, 4, 8))])
        lens = [net.add_input(name, "int32", [-1], [("n", (1, 4, 8))])
                for name in ("sequence_lengths", "context_lengths", "host_context_lengths", "host_sequence_lengths")]
        positions = net.add_input("position_ids", "int32", [-1], [("n", (1, 4, 8))])
        table = F.constant(F.rope_cos_sin_cache(16, HEAD_DIM), name="rope")
        qh, kh, vh = F.split(qkv, [width, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=1)
        a = F.gpt_attention(qh, kh, vh, pool, tables, *lens[:3], None, positions, table, lens[3], layer_idx=0,
                            num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, tokens_per_block=TPB,
                            rotary_dim=HEAD_DIM)
        dense = (F.constant(q.qweight.view(torch.uint8), name="dense.weight"), F.constant(q.scale, name="dense.ws"),
                 F.constant(q.input_scale, name="dense.is") if static else None)
        net.mark_output(F.fp8_linear(a, *dense), "y")
        mark(net, a)
    return net


def attention_feed():
    """Three sequences decoding one token each at lengths 3, 9 and 14."""
    g = torch.Generator().manual_seed(7)
    lengths = torch.tensor([3, 9, 14], dtype=torch.int32)
    return {"qkv": torch.randn(3, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=g),
            "kv_cache_pool": torch.randn(1, 12, 2, KV_HEADS, TPB, HEAD_DIM, generator=g),
            "block_tables": torch.arange(12, dtype=torch.int32).view(3, 4),
            "sequence_lengths": lengths, "context_lengths": torch.ones(3, dtype=torch.int32),
            "host_context_lengths": torch.ones(3, dtype=torch.int32), "host_sequence_lengths": lengths.clone(),
            "position_ids": lengths - 1}


def test_attention_fp8_linear_keeps_the_outputs_and_the_cache_bit_for_bit():
    net = attention_fp8()
    unfused = copy(net)
    assert optimize(net, passes=["fuse_attention_fp8_linear"])["rewrites"] == {"fuse_attention_fp8_linear": 1}
    assert [op for op in ops(net) if op not in ("constant", "split")] == ["gpt_attention_fp8_linear"]
    for run in (outputs, lambda network, feed: Session(network).run(feed)):
        feeds = [attention_feed(), attention_feed()]
        got, want = run(net, feeds[0]), run(unfused, feeds[1])
        assert torch.equal(got["y"], want["y"])
        assert torch.equal(feeds[0]["kv_cache_pool"], feeds[1]["kv_cache_pool"])  # the step's K/V rows written
        assert not torch.equal(feeds[0]["kv_cache_pool"], attention_feed()["kv_cache_pool"])
    assert copy(net).to_json() == net.to_json()


@pytest.mark.parametrize("make", [
    lambda: attention_fp8(static=False),
    lambda: attention_fp8(lambda net, a: net.mark_output(a, "a")),
    lambda: attention_fp8(lambda net, a: net.mark_debug(a)),
    lambda: attention_fp8(read_again),
    lambda: timed(attention_fp8(), "gpt_attention"),
], ids=["per_token_scales", "network_output", "debug_output", "other_reader", "timed"])
def test_attention_fp8_linear_left_alone(make):
    net = make()
    assert optimize(net, passes=["fuse_attention_fp8_linear"])["rewrites"] == {"fuse_attention_fp8_linear": 0}
    assert "gpt_attention" in ops(net) and "gpt_attention_fp8_linear" not in ops(net)
