from .. import functional as F
from ..module import Module
from .linear import ColumnLinear, RowLinear

ACTIVATIONS = {
    "silu": F.silu,
    "swiglu": F.silu,
    "gelu": F.gelu,
    "gelu_new": F.gelu_tanh,
    "gelu_pytorch_tanh": F.gelu_tanh,
    "gelu_tanh": F.gelu_tanh,
    "relu": F.relu,
}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r} (known: {', '.join(sorted(ACTIVATIONS))})")
    return ACTIVATIONS[name]


class MLP(Module):
    """proj(act(fc(x)))."""

    def __init__(self, hidden_size, ffn_hidden_size, hidden_act, bias=False, dtype="float32", tp_size=1):
        super().__init__()
        self.act = activation(hidden_act)
        self.fc = ColumnLinear(hidden_size, ffn_hidden_size, bias, dtype, tp_size)
        self.proj = RowLinear(ffn_hidden_size, hidden_size, bias, dtype, tp_size)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))


class GatedMLP(MLP):
    """proj(act(gate(x)) * fc(x)); the builder fuses gate and fc into one matmul."""

    def __init__(self, hidden_size, ffn_hidden_size, hidden_act, bias=False, dtype="float32", tp_size=1):
        super().__init__(hidden_size, ffn_hidden_size, hidden_act, bias, dtype, tp_size)
        self.gate = ColumnLinear(hidden_size, ffn_hidden_size, bias, dtype, tp_size)

    def forward(self, x):
        return self.proj(self.act(self.gate(x)) * self.fc(x))
