"""ONNX export: checker, ONNX Runtime vs the reference executor, custom ops, external data,
round trips through JSON and ONNX, and the example script."""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from tensorrt_llm import Network, default_net, net_guard
from tensorrt_llm import functional as F
from tensorrt_llm.graph_rewriting import optimize
from tensorrt_llm.onnx_export import CUSTOM_DOMAIN, CUSTOM_OPS, EXTERNAL_DATA_THRESHOLD, ONNX_OPS
from tensorrt_llm.ops import references
from tensorrt_llm.reference_executor import ReferenceExecutor

REPO = Path(__file__).resolve().parents[1]
NUM_TOKENS = ("n", (1, 4, 32))
SIZES = (3, 13)  # two sizes of the dynamic dim


def inp(name, dtype, shape):
    """An input whose dynamic dims all share the dim name `n`."""
    return default_net().add_input(name, dtype, shape, [NUM_TOKENS] * list(shape).count(-1))


def const(*shape, scale=1.0):
    return F.constant(torch.randn(*shape) * scale)


def positive(*shape):
    return F.constant(torch.rand(*shape) + 0.5)


# Each case builds on x: float32 [n, 8] and returns the tensors to mark as outputs.
# Integer inputs are drawn from [0, INT_HIGH[name]).
INT_HIGH = {"ids": 10, "pos": 64, "cols": 8, "picks": 8}
CASES = {
    "embedding": lambda x: F.embedding(inp("ids", "int32", [-1]), const(10, 6)),
    "tied_embedding": lambda x: (lambda w: F.linear(F.embedding(inp("ids", "int32", [-1]), w), w))(const(10, 8)),
    "matmul": lambda x: F.matmul(F.view(x, [-1, 2, 4]), const(4, 5)),
    "matmul_transposed": lambda x: F.matmul(F.view(x, [-1, 4, 2]), const(1, 5, 4), transa=True, transb=True),
    "linear": lambda x: F.linear(x, const(6, 8), const(6)),
    "linear_weight_input": lambda x: F.linear(x, inp("w", "float32", [6, 8])),
    "binary": lambda x: (x + const(8), x - const(1, 8), x * const(8), x / positive(8), x * 2.0, 1.0 - x),
    "pow": lambda x: (F.pow(x, 3.0), F.pow(F.mul(x, x), 0.5)),
    "activations": lambda x: (F.relu(x), F.gelu(x), F.gelu_tanh(x), F.silu(x), F.sigmoid(x), F.tanh(x)),
    "softmax": lambda x: (F.softmax(x, -1), F.softmax(x, 0)),
    "layer_norm": lambda x: (F.layer_norm(x, positive(8), const(8), 1e-5), F.layer_norm(x, None, None, 1e-3)),
    "rms_norm": lambda x: (F.rms_norm(x, positive(8), 1e-6), F.rms_norm(x, None, 1e-3)),
    "fused_add_rms_norm": lambda x: F.fused_add_rms_norm(x, inp("r", "float32", [-1, 8]), positive(8), 1e-6),
    "silu_and_mul": lambda x: F.silu_and_mul(x),
    "gelu_and_mul": lambda x: (F.gelu_and_mul(x, "none"), F.gelu_and_mul(x, "tanh")),
    "rms_norm_linear": lambda x: F.rms_norm_linear(x, positive(8), const(6, 8), const(6), eps=1e-6),
    "add_rms_norm_linear": lambda x: F.add_rms_norm_linear(x, inp("r", "float32", [-1, 8]), positive(8), const(6, 8),
                                                           eps=1e-6),
    "silu_and_mul_linear": lambda x: F.silu_and_mul_linear(x, const(5, 4), const(5)),
    "rotary_neox": lambda x: F.rotary_embedding(x, inp("pos", "int32", [-1]), F.constant(F.rope_cos_sin_cache(64, 4)),
                                                num_heads=2, head_dim=4, rotary_dim=4, is_neox=True),
    "rotary_gptj_partial": lambda x: F.rotary_embedding(
        x, inp("pos", "int32", [-1]), F.constant(F.rope_cos_sin_cache(64, 2, scaling={"type": "linear", "factor": 2})),
        num_heads=2, head_dim=4, rotary_dim=2, is_neox=False),
    "concat_split_slice": lambda x: (F.concat([x, F.relu(x)], 1), *F.split(x, [3, 5], 1), F.slice(x, 1, -5, None),
                                     F.slice(x, 0, 1, 2), F.slice(x, 1, 2, 100)),
    "view_transpose_permute": lambda x: (F.view(x, [0, 2, -1]), F.transpose(F.view(x, [-1, 2, 4]), 0, 2),
                                         F.permute(F.view(x, [-1, 2, 4]), [1, 2, 0])),
    "unsqueeze_squeeze": lambda x: (F.unsqueeze(x, 1), F.squeeze(F.unsqueeze(x, -1), 2)),
    "gather_index_select": lambda x: (F.gather(x, 1, inp("cols", "int64", [-1, 3])),
                                      F.index_select(x, 1, inp("picks", "int32", [5]))),
    "cast_where_argmax": lambda x: (F.cast(F.mul(x, 4.0), "int32"), F.cast(x, "bool"),
                                    F.where(inp("c", "bool", [-1, 8]), x, const(8)),
                                    F.argmax(x, -1), F.argmax(x, 0, keepdim=True)),
}


def build_case(name):
    net = Network(name)
    with net_guard(net):
        outs = CASES[name](inp("x", "float32", [-1, 8]))
        for i, out in enumerate(outs if isinstance(outs, tuple) else (outs,)):
            net.mark_output(out, f"out{i}")
    return net


def random_feed(net, n, generator):
    feed = {}
    for t in net.inputs:
        shape = [n if d == -1 else d for d in t.shape]
        if t.dtype == "bool":
            feed[t.name] = torch.rand(shape, generator=generator) > 0.5
        elif t.dtype in ("int32", "int64"):
            feed[t.name] = torch.randint(0, INT_HIGH[t.name], shape, generator=generator, dtype=getattr(torch, t.dtype))
        else:
            feed[t.name] = torch.randn(shape, generator=generator)
    return feed


def run_ort(path, feed):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {k: v.numpy() for k, v in feed.items()})))


def assert_matches(got: dict, expected: dict, atol=1e-5):
    assert list(got) == list(expected)
    for name, want in expected.items():
        have = torch.from_numpy(np.asarray(got[name]))
        assert have.dtype == want.dtype and have.shape == want.shape, name
        if want.is_floating_point():
            diff = (have - want).abs().max().item() if want.numel() else 0.0
            assert diff <= atol, f"{name}: max |ORT - reference| = {diff}"
        else:
            assert torch.equal(have, want), name


def test_every_mapping_is_of_an_op():
    """ONNX export is optional per op (an op without a mapping is refused by name at export);
    the decoder and attention tests below export every op the models and passes make."""
    assert set(ONNX_OPS) <= set(references())


def test_cases_cover_every_standard_op():
    covered = {layer.op for name in CASES for layer in build_case(name).layers}
    assert set(ONNX_OPS) - CUSTOM_OPS <= covered


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_runtime_matches_reference(name, tmp_path):
    net = build_case(name)
    path = tmp_path / "model.onnx"
    net.to_onnx(str(path))
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path))
    assert all(node.domain == "" for node in model.graph.node)
    generator = torch.Generator().manual_seed(0)
    for n in SIZES:
        feed = random_feed(net, n, generator)
        assert_matches(run_ort(path, feed), ReferenceExecutor(net).run(feed))


def test_weights_are_initializers_and_dims_are_named(tmp_path):
    net = build_case("linear")
    path = tmp_path / "model.onnx"
    net.to_onnx(str(path))
    graph = onnx.load(str(path)).graph
    inits = {t.name: list(t.dims) for t in graph.initializer}
    weight_name = next(n for n, w in net.weights.items() if w.ndim == 2)
    assert inits[weight_name] == [8, 6]  # a linear-only weight is stored transposed
    assert len(inits) == len(net.weights)
    dims = lambda value: [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]  # noqa: E731
    assert dims(graph.input[0]) == ["n", 8]
    assert dims(graph.output[0]) == ["n", 6]
    assert not (tmp_path / "model.onnx.data").exists()
    assert EXTERNAL_DATA_THRESHOLD == 2_000_000_000


@pytest.mark.parametrize("name", ["rms_norm_linear", "add_rms_norm_linear", "silu_and_mul_linear"])
def test_fused_linear_weights_are_stored_transposed(name, tmp_path):
    net = build_case(name)
    path = tmp_path / "model.onnx"
    net.to_onnx(str(path))
    graph = onnx.load(str(path)).graph
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    weight_name = next(n for n, w in net.weights.items() if w.ndim == 2)
    assert shapes[weight_name] == list(net.weights[weight_name].shape)[::-1]
    assert "Transpose" not in [node.op_type for node in graph.node]


def test_optimized_decoder_exports_and_runs(tmp_path):
    """Every fusion pass's ops decomposed: ONNX Runtime agrees with the reference."""
    net = Network("decoder")
    with net_guard(net):
        x = inp("x", "float32", [-1, 8])
        for _ in range(2):
            h = F.rms_norm(x, positive(8), 1e-5)
            gate, up = F.linear(h, const(12, 8, scale=0.3)), F.linear(h, const(12, 8, scale=0.3))
            x = x + F.linear(F.silu(gate) * up, const(8, 12, scale=0.3))
        net.mark_output(F.linear(F.rms_norm(x, positive(8), 1e-5), const(10, 8)), "logits")
    report = optimize(net)
    assert report["rewrites"]["fuse_norm_linear"] == 3 and report["rewrites"]["fuse_act_linear"] == 2
    path = tmp_path / "decoder.onnx"
    net.to_onnx(str(path))
    onnx.checker.check_model(str(path), full_check=True)
    feed = random_feed(net, 6, torch.Generator().manual_seed(4))
    expected = ReferenceExecutor(net).run(feed)
    assert_matches(run_ort(path, feed), expected)
    assert torch.equal(ReferenceExecutor(Network.from_onnx(str(path))).run(feed)["logits"], expected["logits"])


def test_tied_weight_is_stored_once_untransposed(tmp_path):
    net = build_case("tied_embedding")
    path = tmp_path / "model.onnx"
    net.to_onnx(str(path))
    graph = onnx.load(str(path)).graph
    assert [list(t.dims) for t in graph.initializer] == [[10, 8]]
    assert "Transpose" in [node.op_type for node in graph.node]


def test_external_data_past_the_threshold(tmp_path):
    net = build_case("rms_norm")
    with net_guard(net):
        net.mark_output(F.linear(net.get_tensor("out0"), const(5, 8), const(5)), "projected")
    path = tmp_path / "model.onnx"
    net.to_onnx(str(path), external_data_threshold=0)
    data = tmp_path / "model.onnx.data"
    assert data.stat().st_size == sum(w.numel() * w.element_size() for w in net.weights.values())
    model = onnx.load(str(path), load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    onnx.checker.check_model(str(path), full_check=True)
    feed = random_feed(net, 5, torch.Generator().manual_seed(1))
    expected = ReferenceExecutor(net).run(feed)
    assert_matches(run_ort(path, feed), expected)
    reloaded = Network.from_onnx(str(path))
    for name, want in ReferenceExecutor(reloaded).run(feed).items():
        assert torch.equal(want, expected[name])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_export_passes_checker(dtype, tmp_path):
    net = Network(dtype)
    with net_guard(net):
        x = inp("x", dtype, [-1, 8])
        pos = inp("pos", "int32", [-1])
        w = lambda *shape: F.constant(torch.randn(*shape).to(getattr(torch, dtype)))  # noqa: E731
        h = F.rms_norm(F.linear(x, w(8, 8), w(8)), w(8), 1e-6)
        h = F.rotary_embedding(h, pos, F.constant(F.rope_cos_sin_cache(64, 4)), num_heads=2, head_dim=4,
                               rotary_dim=4, is_neox=True)
        h = F.layer_norm(F.silu_and_mul(h), w(4), w(4), 1e-5)
        net.mark_output(F.cast(F.softmax(h, -1), "float32"), "probs")
    path = tmp_path / "model.onnx"
    net.to_onnx(str(path))
    onnx.checker.check_model(str(path), full_check=True)
    reloaded = Network.from_onnx(str(path))
    feed = random_feed(net, 4, torch.Generator().manual_seed(2))
    feed["x"] = feed["x"].to(getattr(torch, dtype))
    expected = ReferenceExecutor(net).run(feed)
    assert torch.equal(ReferenceExecutor(reloaded).run(feed)["probs"], expected["probs"])
    if dtype == "float16":  # ONNX Runtime's CPU kernels lack bfloat16 MatMul
        assert_matches(run_ort(path, feed), expected, atol=2e-3)


def attention_network():
    """qkv projection, rotary, paged gpt_attention, allreduce and the output projection."""
    heads, head_dim, tpb = 2, 4, 4
    net = Network("attention")
    with net_guard(net):
        x = inp("x", "float32", [-1, 8])
        pos = inp("pos", "int32", [-1])
        batch = [("batch", (1, 2, 4))]
        pool = net.add_input("kv_cache_pool", "float32", [1, -1, 2, heads, tpb, head_dim], [("blocks", (1, 4, 8))])
        tables = net.add_input("block_tables", "int32", [-1, -1], [batch[0], ("max_blocks", (1, 2, 4))])
        lengths = [net.add_input(n, "int32", [-1], batch)
                   for n in ("sequence_lengths", "context_lengths", "host_context_lengths")]
        q, k, v = F.split(F.linear(x, const(24, 8, scale=0.3)), [8, 8, 8], 1)
        cache = F.constant(F.rope_cos_sin_cache(64, head_dim))
        q, k = (F.rotary_embedding(t, pos, cache, num_heads=heads, head_dim=head_dim, rotary_dim=head_dim,
                                   is_neox=True) for t in (q, k))
        att = F.gpt_attention(q, k, v, pool, tables, *lengths, layer_idx=0, num_heads=heads, num_kv_heads=heads,
                              head_dim=head_dim, tokens_per_block=tpb, sliding_window=6)
        net.mark_output(F.linear(F.allreduce(att), const(8, 8, scale=0.3)), "out")
    return net


def attention_feed():
    context = torch.tensor([3, 5], dtype=torch.int32)
    return {"x": torch.randn(8, 8), "pos": torch.tensor([0, 1, 2, 0, 1, 2, 3, 4], dtype=torch.int32),
            "kv_cache_pool": torch.zeros(1, 4, 2, 2, 4, 4),
            "block_tables": torch.tensor([[0, 0], [1, 2]], dtype=torch.int32),
            "sequence_lengths": context.clone(), "context_lengths": context.clone(),
            "host_context_lengths": context.clone()}


def test_custom_ops_export_passes_checker(tmp_path):
    net = attention_network()
    path = tmp_path / "attention.onnx"
    net.to_onnx(str(path))
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path))
    assert {(o.domain, o.version) for o in model.opset_import} >= {(CUSTOM_DOMAIN, 1)}
    custom = {node.op_type: node for node in model.graph.node if node.domain == CUSTOM_DOMAIN}
    assert set(custom) == {"GptAttention", "AllReduce"}
    attention = custom["GptAttention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in attention.attribute}
    assert attrs["num_heads"] == 2 and attrs["tokens_per_block"] == 4 and attrs["sliding_window"] == 6
    assert "scale" not in attrs  # None attrs are left out
    assert list(attention.input)[3:8] == ["kv_cache_pool", "block_tables", "sequence_lengths", "context_lengths",
                                         "host_context_lengths"]


def test_optimized_attention_network_exports(tmp_path):
    """Rewrites may fuse rotary into gpt_attention (absent inputs in between become "")."""
    net = attention_network()
    optimize(net)
    path = tmp_path / "attention.onnx"
    net.to_onnx(str(path))
    onnx.checker.check_model(str(path), full_check=True)
    feed = attention_feed()
    expected = ReferenceExecutor(net).run({name: t.clone() for name, t in feed.items()})["out"]
    assert torch.equal(ReferenceExecutor(Network.from_onnx(str(path))).run(feed)["out"], expected)


def test_net_guard_network_round_trips_through_json_and_onnx(tmp_path):
    net = attention_network()
    path = tmp_path / "attention.onnx"
    net.to_onnx(str(path))
    from_json = Network.from_json(net.to_json(), net.weights)
    from_onnx = Network.from_onnx(str(path))
    assert from_onnx.to_json() == net.to_json()
    results = []
    original_feed = attention_feed()
    for network in (net, from_json, from_onnx):
        feed = {name: t.clone() for name, t in original_feed.items()}
        out = ReferenceExecutor(network).run(feed)["out"]
        results.append((out, feed["kv_cache_pool"]))  # the pool holds the written K/V
    for out, pool in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(pool, results[0][1])
    assert results[0][1].abs().sum() > 0


def test_standard_network_round_trip_and_onnx_runtime(tmp_path):
    net = build_case("fused_add_rms_norm")
    path = tmp_path / "model.onnx"
    net.to_onnx(str(path))
    feed = random_feed(net, 7, torch.Generator().manual_seed(3))
    expected = ReferenceExecutor(net).run(feed)
    for network in (Network.from_json(net.to_json(), net.weights), Network.from_onnx(str(path))):
        got = ReferenceExecutor(network).run(feed)
        assert all(torch.equal(got[name], expected[name]) for name in expected)
    assert_matches(run_ort(path, feed), expected)


def test_from_onnx_refuses_foreign_models(tmp_path):
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    path = tmp_path / "foreign.onnx"
    onnx.save(onnx.helper.make_model(graph), str(path))
    with pytest.raises(ValueError, match="only models written by"):
        Network.from_onnx(str(path))


def test_unknown_op_is_refused(tmp_path):
    net = Network()
    x = net.add_input("x", "float32", [2])
    net.mark_output(net.get_tensor(net.add_layer("mystery", [x.name], [("float32", [2])]).outputs[0]))
    with pytest.raises(NotImplementedError, match="mystery"):
        net.to_onnx(str(tmp_path / "m.onnx"))


def test_example_runs_and_prints_the_difference(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "examples/network/build_and_export.py", "--onnx_path",
                             str(tmp_path / "tiny_lm.onnx")], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    diff = float(re.findall(r"^max \|ORT - reference\| = (\S+)$", result.stdout, re.M)[-1])
    assert diff <= 1e-5
    assert "reloaded from ONNX gives the same logits: True" in result.stdout
    assert (tmp_path / "tiny_lm.onnx").exists()
