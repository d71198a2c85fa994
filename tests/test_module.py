import numpy as np
import pytest
import torch

from tensorrt_llm import Module, ModuleList, Network, Parameter, net_guard
from tensorrt_llm import functional as F
from tensorrt_llm.reference_executor import ReferenceExecutor


class Linear(Module):
    def __init__(self, n_in, n_out, bias=True):
        super().__init__()
        self.weight = Parameter((n_out, n_in), "float32")
        self.bias = Parameter((n_out,), "float32") if bias else None

    def forward(self, x):
        return F.linear(x, self.weight.tensor, None if self.bias is None else self.bias.tensor)


class MLP(Module):
    def __init__(self):
        super().__init__()
        self.fc = Linear(4, 8)
        self.proj = Linear(8, 4, bias=False)

    def forward(self, x):
        return self.proj(F.relu(self.fc(x)))


class Model(Module):
    def __init__(self, num_layers=2):
        super().__init__()
        self.layers = ModuleList(MLP() for _ in range(num_layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x) + x
        return x


def random_weights(model):
    g = torch.Generator().manual_seed(0)
    return {name: torch.randn(p.shape, generator=g) for name, p in model.named_parameters()}


def test_hierarchical_names_and_containers():
    model = Model()
    names = [n for n, _ in model.named_parameters()]
    assert names == ["layers.0.fc.weight", "layers.0.fc.bias", "layers.0.proj.weight",
                     "layers.1.fc.weight", "layers.1.fc.bias", "layers.1.proj.weight"]
    assert model.layers[1].fc.weight.name == "layers.1.fc.weight"
    assert len(model.layers) == 2 and model.layers[-1] is list(model.layers)[1]
    model.layers.append(MLP())
    assert model.layers[2].proj.weight.name == "layers.2.proj.weight"
    assert [n for n, _ in model.named_modules()][:3] == ["", "layers", "layers.0"]
    assert len(list(model.parameters())) == 9


def test_parameter_value_checks_shape_and_dtype():
    model = Model()
    p = model.layers[0].fc.weight
    p.value = np.ones((8, 4), dtype=np.float32)
    assert isinstance(p.value, torch.Tensor) and p.value.shape == (8, 4)
    with pytest.raises(ValueError, match=r"layers.0.fc.weight: expected shape \[8, 4\], given \[4, 8\]"):
        p.value = torch.zeros(4, 8)
    with pytest.raises(ValueError, match="layers.0.fc.weight: expected dtype float32, given float16"):
        p.value = torch.zeros(8, 4, dtype=torch.float16)
    with pytest.raises(TypeError):
        p.value = [[1.0]]


def test_load_reports_every_problem_at_once():
    model = Model()
    weights = random_weights(model)
    del weights["layers.0.fc.bias"]
    del weights["layers.1.proj.weight"]
    weights["layers.0.extra"] = torch.zeros(1)
    weights["layers.1.fc.weight"] = torch.zeros(2, 2)
    with pytest.raises(ValueError) as e:
        model.load(weights)
    msg = str(e.value)
    for part in ["missing: layers.0.fc.bias", "missing: layers.1.proj.weight", "unexpected: layers.0.extra",
                 "layers.1.fc.weight: expected shape"]:
        assert part in msg
    model.load({"layers.0.fc.weight": torch.zeros(8, 4)}, strict=False)
    assert torch.equal(model.layers[0].fc.weight.value, torch.zeros(8, 4))


def test_module_builds_network_with_named_constants():
    model = Model()
    weights = random_weights(model)
    model.load(weights)
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, 4], [("n", (1, 4, 16))])
        net.mark_output(model(x), "y")
    consts = [layer for layer in net.layers if layer.op == "constant"]
    assert sorted(c.attrs["weight"] for c in consts) == sorted(weights)
    assert set(net.weights) == set(weights)
    assert any(layer.name.startswith("layers.1.fc/") for layer in net.layers)
    x = torch.randn(3, 4)
    ref = x
    for i in range(2):
        h = torch.relu(ref @ weights[f"layers.{i}.fc.weight"].T + weights[f"layers.{i}.fc.bias"])
        ref = h @ weights[f"layers.{i}.proj.weight"].T + ref
    torch.testing.assert_close(ReferenceExecutor(net).run({"x": x})["y"], ref)


def test_parameter_used_twice_adds_one_constant_and_unbound_is_an_error():
    lin = Linear(2, 2)
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [2, 2])
        with pytest.raises(ValueError, match="weight .* has no value bound"):
            lin(x)
        lin.weight.value = torch.eye(2)
        a, b = lin.weight.tensor, lin.weight.tensor
    assert a == b and sum(layer.op == "constant" for layer in net.layers) == 1


def test_setattr_before_init_is_a_clear_error():
    class Bad(Module):
        def __init__(self):
            self.w = Parameter((1,), "float32")
            super().__init__()

    with pytest.raises(RuntimeError, match="super"):
        Bad()
