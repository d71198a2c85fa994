import json

import pytest
import torch

from tensorrt_llm import Network, default_net, net_guard
from tensorrt_llm import functional as F
from tensorrt_llm.reference_executor import ReferenceExecutor


def small_network():
    net = Network("small")
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, 4], [("num_tokens", (1, 8, 64))])
        w = F.constant(torch.randn(6, 4), name="w")
        h = F.relu(F.linear(x, w))
        a, b = F.split(h, [2, 4], dim=1)
        net.mark_debug(a)
        net.mark_output(F.softmax(b, -1), "probs")
    return net


def test_add_input_validates_dynamic_ranges():
    net = Network()
    with pytest.raises(ValueError, match="dynamic axes \\[0\\]"):
        net.add_input("x", "float32", [-1, 4])
    with pytest.raises(ValueError, match="min <= opt <= max"):
        net.add_input("y", "float32", [-1], [("n", (4, 2, 8))])
    with pytest.raises(ValueError, match="one entry per dynamic"):
        net.add_input("z", "float32", [-1, -1, 3], [("a", (1, 1, 1))])
    t = net.add_input("ok", "int32", [-1, 3, -1], [("a", (1, 2, 3)), ("b", (0, 5, 9))])
    assert net.dim_range("ok") == {0: ("a", (1, 2, 3)), 2: ("b", (0, 5, 9))}
    t2 = net.add_input("full", torch.float16, [-1, 3], [("a", (1, 2, 3)), None])
    assert t2.dtype == "float16" and t.shape == (-1, 3, -1)


def test_net_guard_sets_default_network():
    net = Network()
    with pytest.raises(RuntimeError, match="net_guard"):
        default_net()
    with net_guard(net):
        assert default_net() is net
    with pytest.raises(RuntimeError):
        default_net()


def test_inputs_outputs_layers_and_lookup():
    net = small_network()
    assert [t.name for t in net.inputs] == ["x"]
    assert net.outputs == ["probs"]
    assert net.get_output("probs").shape == (-1, 4)
    assert net.get_input("x").dtype == "float32"
    assert [layer.op for layer in net.layers] == ["constant", "linear", "relu", "split", "softmax"]
    assert net.num_layers == 5 and net.get_layer(1).op == "linear"
    split = net.get_layer(3)
    assert net.producer(split.outputs[1]) is split
    assert [c.op for c in net.consumers(split.outputs[1])] == ["softmax"]
    assert net.debug_outputs == [split.outputs[0]]


def test_json_round_trip_preserves_graph_and_results():
    net = small_network()
    text = net.to_json()
    data = json.loads(text)
    assert data["weights"] == {"w": {"dtype": "float32", "shape": [6, 4]}}
    again = Network.from_json(text, dict(net.weights))
    assert again.to_json() == text
    x = torch.randn(5, 4)
    want = ReferenceExecutor(net).run({"x": x})
    got = ReferenceExecutor(again).run({"x": x})
    assert want.keys() == got.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k])


def test_from_json_checks_weights():
    net = small_network()
    with pytest.raises(ValueError, match="w: missing"):
        Network.from_json(net.to_json(), {})
    with pytest.raises(ValueError, match="expected float32 \\[6, 4\\], got float16"):
        Network.from_json(net.to_json(), {"w": torch.zeros(6, 4, dtype=torch.float16)})
    with pytest.raises(ValueError, match="not a tensorrt_llm.network"):
        Network.from_json(json.dumps({"format": "onnx"}), {})


def test_to_dot_mentions_every_layer():
    net = small_network()
    dot = net.to_dot()
    assert dot.startswith('digraph "small"')
    for layer in net.layers:
        assert f'"{layer.name}"' in dot
    assert '"output:probs"' in dot


def test_remove_and_sort_layers():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [3])
        y = F.relu(x)
        z = F.tanh(y)
        net.mark_output(z, "z")
        w = F.sigmoid(x)  # a new layer appended after z's producer
        z_layer = z.get_parent()
        net.set_layer_input(z_layer, 0, w.name)
    assert net.consumers(y.name) == []
    relu = y.get_parent()
    net.remove_layer(relu)
    assert not net.has_tensor(y.name)
    with pytest.raises(ValueError, match="still used"):
        net.remove_layer(w.get_parent())
    net.sort_layers()
    assert [layer.op for layer in net.layers] == ["sigmoid", "tanh"]


def test_mark_output_renames_and_rejects_duplicates():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [2])
        y = F.relu(x)
        net.mark_output(y, "out")
        assert y.name == "out" and y.get_parent().outputs == ("out",)
        with pytest.raises(ValueError, match="already an output"):
            net.mark_output(y)
        with pytest.raises(ValueError, match="already has"):
            net.mark_output(F.tanh(x), "out")
