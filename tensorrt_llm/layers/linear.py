"""Linear layers; the tensor-parallel variants hold one rank's slice of the weight.

ColumnLinear splits the output features across ranks (each rank computes its slice);
RowLinear splits the input features and sums the partial results with an allreduce.
"""
from .. import functional as F
from ..module import Module
from ..parameter import Parameter


class Linear(Module):

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 dtype: str = "float32"):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(shape=(out_features, in_features), dtype=dtype)
        self.bias = Parameter(shape=(out_features,), dtype=dtype) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight.tensor, self.bias.tensor if self.bias is not None else None)


class ColumnLinear(Linear):

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 dtype: str = "float32", tp_size: int = 1):
        if out_features % tp_size:
            raise ValueError(f"out_features {out_features} is not divisible by tp_size {tp_size}")
        super().__init__(in_features, out_features // tp_size, bias, dtype)


class RowLinear(Linear):

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 dtype: str = "float32", tp_size: int = 1):
        if in_features % tp_size:
            raise ValueError(f"in_features {in_features} is not divisible by tp_size {tp_size}")
        super().__init__(in_features // tp_size, out_features, False, dtype)
        self.tp_size = tp_size
        # The bias is added once, after the partial products are summed.
        self.bias = Parameter(shape=(out_features,), dtype=dtype) if bias else None

    def forward(self, x):
        y = F.linear(x, self.weight.tensor)
        if self.tp_size > 1:
            y = F.allreduce(y)
        if self.bias is not None:
            y = y + self.bias.tensor
        return y
