from .. import functional as F
from ..module import Module
from ..parameter import Parameter


class RmsNorm(Module):

    def __init__(self, normalized_shape: int, eps: float = 1e-6, dtype: str = "float32"):
        super().__init__()
        self.eps = eps
        self.weight = Parameter(shape=(normalized_shape,), dtype=dtype)

    def forward(self, x):
        return F.rms_norm(x, self.weight.tensor, eps=self.eps)


class LayerNorm(Module):

    def __init__(self, normalized_shape: int, eps: float = 1e-5, bias: bool = True,
                 dtype: str = "float32"):
        super().__init__()
        self.eps = eps
        self.weight = Parameter(shape=(normalized_shape,), dtype=dtype)
        self.bias = Parameter(shape=(normalized_shape,), dtype=dtype) if bias else None

    def forward(self, x):
        bias = self.bias.tensor if self.bias is not None else None
        return F.layer_norm(x, self.weight.tensor, bias, eps=self.eps)
