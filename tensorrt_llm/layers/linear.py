"""Linear layers; the tensor-parallel variants hold one rank's slice of the weight.

ColumnLinear splits the output features across ranks (each rank computes its slice);
RowLinear splits the input features and sums the partial results with an allreduce.

`quantize_weight(layer)` makes a linear quantized as the checkpoint's `quantization` section
says, with the checkpoint names of quantization/formats.py:
- weight-only INT8 / INT4 (W8A16 / W4A16): `weight` holds the codes (int8 [out, in] or uint8
  [out, in / 2]) with `weight_scale` and, for INT4, `weight_zero` (float32: every loader's
  scales are exact in it); it runs as `weight_only_linear`. An INT4 layer with act-order
  (`has_act_order`, GPTQ's desc_act) also has `weight_perm` (int64 [in]): its input is gathered
  by it before the product (weight_only_linear's perm), since stored column j multiplies input
  perm[j].
- FP8 (W8A8, `FP8` or `FP8_PER_CHANNEL_PER_TOKEN`): `weight` holds the E4M3 codes, `weight_scale`
  is float32 [1] (per tensor) or [out] (per output channel), as the bound tensor is (both
  algorithms take either), and `input_scale` float32 [1] for static activation scales (`FP8`;
  per-token scales have none); it runs as `fp8_linear`. Graphs and engines have no FP8 dtype
  (_utils's table), so `weight` is uint8 and takes a float8_e4m3fn tensor by viewing it (the
  same bytes).
"""
import torch

from .. import functional as F
from ..errors import ConfigError
from ..module import Module
from ..parameter import Parameter
from ..quantization.formats import FP8_DTYPE
from ..quantization.mode import LayerQuant

# The dtype of the scales and zeros of a quantized linear's parameters.
QUANT_SCALE_DTYPE = "float32"
WEIGHT_FORMATS = ("int8", "int4", "fp8")


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
    """The float32 weight scale of an [N, K] FP8 weight: [1] (per tensor) or [N] (per output
    channel); the bound tensor decides which."""

    def __init__(self, out_features: int):
        super().__init__(shape=(out_features,), dtype=QUANT_SCALE_DTYPE)
        self.out_features = out_features

    @Parameter.value.setter
    def value(self, v) -> None:
        if isinstance(v, torch.Tensor) and tuple(v.shape) in ((1,), (self.out_features,)):
            self.shape = tuple(v.shape)
        Parameter.value.fset(self, v)


class Linear(Module):

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 dtype: str = "float32"):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(shape=(out_features, in_features), dtype=dtype)
        self.bias = Parameter(shape=(out_features,), dtype=dtype) if bias else None
        self.weight_format = None  # "int8" / "int4" / "fp8" once quantize_weight made it quantized
        self.group_size = 0
        self.weight_perm = None

    def quantize_weight(self, layer: LayerQuant) -> None:
        """Hold the weight as `layer` says it is quantized (INT8 or INT4 weight-only, or FP8)."""
        fmt, group = layer.weight_format, layer.group_size or 0
        n, k = self.weight.shape
        if fmt not in WEIGHT_FORMATS:
            raise ConfigError(f"{self.full_name}: {layer.quant_algo} weights are not supported by Linear "
                              f"(weight-only INT8 / INT4 and FP8 are)")
        if fmt == "fp8":
            self.weight = Fp8Codes((n, k))
            self.weight_scale = Fp8Scale(n)
            self.input_scale = Parameter(shape=(1,), dtype=QUANT_SCALE_DTYPE) if layer.static_activation_scale else None
            self.weight_format = fmt
            return
        if group and k % group:
            raise ConfigError(f"{self.full_name}: in_features {k} is not a multiple of the group size {group}")
        self.weight = Parameter(shape=(n, k) if fmt == "int8" else (n, k // 2),
                                dtype="int8" if fmt == "int8" else "uint8")
        self.weight_scale = Parameter(shape=(n, k // group) if group else (n,), dtype=QUANT_SCALE_DTYPE)
        if fmt == "int4":
            self.weight_zero = Parameter(shape=(n, k // group), dtype=QUANT_SCALE_DTYPE)
        if layer.has_act_order:
            self.weight_perm = Parameter(shape=(k,), dtype="int64")
        self.weight_format, self.group_size = fmt, group

    def matmul(self, x, bias=None):
        """x @ W^T (+ bias): a linear, or the quantized weight's op (weight_only_linear, fp8_linear)."""
        if self.weight_format is None:
            return F.linear(x, self.weight.tensor, bias)
        if self.weight_format == "fp8":
            input_scale = self.input_scale.tensor if self.input_scale is not None else None
            return F.fp8_linear(x, self.weight.tensor, self.weight_scale.tensor, input_scale, bias)
        zeros = self.weight_zero.tensor if self.weight_format == "int4" else None
        perm = self.weight_perm.tensor if self.weight_perm is not None else None
        return F.weight_only_linear(x, self.weight.tensor, self.weight_scale.tensor, zeros, bias, perm,
                                    weight_format=self.weight_format, group_size=self.group_size)

    def forward(self, x):
        return self.matmul(x, self.bias.tensor if self.bias is not None else None)


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
        y = self.matmul(x)
        if self.tp_size > 1:
            y = F.allreduce(y)
        if self.bias is not None:
            y = y + self.bias.tensor
        return y
