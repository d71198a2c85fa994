"""FP8 (W8A8) linears of a model: a `Linear` whose weight a checkpoint holds as FP8 E4M3
codes with float32 scales (quantization/formats.py, `Fp8Weight`) and whose matmul is the
`fp8_linear` op.

`make_fp8(linear, layer)` turns a Linear, ColumnLinear or RowLinear into its FP8 class in
place, keeping what the linear is (its features, bias, tensor-parallel reduction), as
`Linear.quantize_weight` does for weight-only INT8 / INT4. Its parameters are the checkpoint
names of formats.py: `weight` (the codes), `weight_scale` (float32 [1] per tensor or [N] per
output channel, as the checkpoint's tensor is: both algorithms take either) and, for static
activation scales (`FP8`), `input_scale` (float32 [1]); `FP8_PER_CHANNEL_PER_TOKEN` has none
(each token's own scale).

Graphs and engines have no FP8 dtype (_utils's table), so `weight` holds the codes' bytes as
uint8 and takes a float8_e4m3fn checkpoint tensor by viewing it (the same bytes).
"""
from __future__ import annotations

import torch

from .. import functional as F
from ..errors import ConfigError
from ..layers.linear import ColumnLinear, Linear, RowLinear
from ..parameter import Parameter
from ..quantization.formats import FP8_DTYPE
from ..quantization.mode import LayerQuant


class Fp8Codes(Parameter):
    """A uint8 [N, K] parameter of E4M3 codes that also takes float8_e4m3fn tensors (viewed)."""

    def __init__(self, shape):
        super().__init__(shape=shape, dtype="uint8")

    @Parameter.value.setter
    def value(self, v) -> None:
        if isinstance(v, torch.Tensor) and v.dtype == FP8_DTYPE:
            v = v.view(torch.uint8)
        Parameter.value.fset(self, v)


class Fp8Scale(Parameter):
    """A float32 weight scale of an [N, K] FP8 weight: [1] (per tensor) or [N] (per output
    channel); the bound tensor decides which."""

    def __init__(self, out_features: int):
        super().__init__(shape=(out_features,), dtype="float32")
        self.out_features = out_features

    @Parameter.value.setter
    def value(self, v) -> None:
        if isinstance(v, torch.Tensor) and tuple(v.shape) in ((1,), (self.out_features,)):
            self.shape = tuple(v.shape)
        Parameter.value.fset(self, v)


class Fp8Matmul:
    """The matmul of an FP8 linear (mixed into the Linear classes below)."""

    def matmul(self, x, bias=None):
        input_scale = self.input_scale.tensor if self.input_scale is not None else None
        return F.fp8_linear(x, self.weight.tensor, self.weight_scale.tensor, input_scale, bias)


class Fp8Linear(Fp8Matmul, Linear):
    pass


class Fp8ColumnLinear(Fp8Matmul, ColumnLinear):
    pass


class Fp8RowLinear(Fp8Matmul, RowLinear):
    pass


FP8_CLASSES = {Linear: Fp8Linear, ColumnLinear: Fp8ColumnLinear, RowLinear: Fp8RowLinear}


def make_fp8(linear: Linear, layer: LayerQuant) -> None:
    """Hold `linear`'s weight as FP8 codes and scales, as `layer` (FP8 or
    FP8_PER_CHANNEL_PER_TOKEN) says, and run it as fp8_linear."""
    if layer.weight_format != "fp8":
        raise ConfigError(f"{linear.full_name}: {layer.quant_algo} is not an FP8 algorithm")
    if type(linear) not in FP8_CLASSES:
        raise ConfigError(f"{linear.full_name}: a {type(linear).__name__} cannot take FP8 weights")
    n, k = linear.weight.shape
    linear.__class__ = FP8_CLASSES[type(linear)]
    linear.weight = Fp8Codes((n, k))
    linear.weight_scale = Fp8Scale(n)
    linear.input_scale = Parameter(shape=(1,), dtype="float32") if layer.static_activation_scale else None
    linear.weight_format = "fp8"
