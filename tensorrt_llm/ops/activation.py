"""Activations: relu, gelu, gelu_tanh, silu, sigmoid, tanh, softmax, and the gated ones
silu_and_mul and gelu_and_mul (an MLP's act(gate) * up, made by the fuse_gate_up pass).

The gated ones mean what transformers computes (LlamaMLP: `act_fn(gate_proj(x)) * up_proj(x)`):
the activation in x's dtype (rounded), then the product in x's dtype (rounded again). Their
CUDA kernel computes both in float32 and rounds once, so it may differ from the reference by
a unit in the last place of the dtype. On the CPU, float32 silu_and_mul is the host kernel
(kernels/host_activation.cpp: its e^-g within 2 ulp of PyTorch's), in every op that applies it
there (silu_and_mul_cpu: the fused linears too), so that the builder's fusions keep a CPU
engine's outputs bit for bit.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._utils import is_floating
from ..network import Tensor
from .launch import bindings_available, launch, rows
from .op import CPU, CUDA, REFERENCE, Op, Shape, add_layer, define, norm_dim


def _pointwise(name: str, reference) -> Op:
    """An op `name(x)` applying `reference` to each element of a floating x."""
    def graph_fn(x: Tensor) -> Tensor:
        if not is_floating(x.dtype):
            raise ValueError(f"{name}: needs a floating input, got {x.dtype}")
        return add_layer(name, [x], [(x.dtype, x.shape)])
    return define(graph_fn, name=name, reference=reference)


relu = _pointwise("relu", F.relu)
gelu = _pointwise("gelu", F.gelu)
gelu_tanh = _pointwise("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"))
silu = _pointwise("silu", F.silu)
sigmoid = _pointwise("sigmoid", torch.sigmoid)
tanh = _pointwise("tanh", torch.tanh)


@define
def softmax(x: Tensor, dim: int = -1) -> Tensor:
    dim = norm_dim("softmax", dim, x.ndim)
    if not is_floating(x.dtype):
        raise ValueError(f"softmax: needs a floating input, got {x.dtype}")
    return add_layer("softmax", [x], [(x.dtype, x.shape)], dim=dim)


@softmax.implementation(REFERENCE)
def softmax_reference(x, *, dim):
    return torch.softmax(x, dim, dtype=torch.float32).to(x.dtype)


# ---- gated activations: act(x[..., :I]) * x[..., I:] -------------------------------------------


def gated_shape(op: str, x_shape: Shape) -> Shape:
    """[..., 2I] -> [..., I]."""
    last = x_shape[-1]
    if last != -1 and last % 2:
        raise ValueError(f"{op}: last dim must be even ([..., 2I]), got {list(x_shape)}")
    return tuple(x_shape[:-1]) + ((last // 2) if last != -1 else -1,)


def _act_and_mul_kernel(kernel: str, x: torch.Tensor, *extra) -> torch.Tensor:
    """`kernel` (silu_and_mul / gelu_and_mul on a GPU, host_silu_and_mul on the CPU) into a new out."""
    inter = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    if out.numel():
        launch(kernel, out.view(-1, inter), rows(x), *extra)
    return out


@define
def silu_and_mul(x: Tensor) -> Tensor:
    """silu(x[..., :I]) * x[..., I:] for x [..., 2I]."""
    return add_layer("silu_and_mul", [x], [(x.dtype, gated_shape("silu_and_mul", x.shape))])


@silu_and_mul.implementation(REFERENCE)
def silu_and_mul_reference(x):
    half = x.shape[-1] // 2
    return F.silu(x[..., :half]) * x[..., half:]


@silu_and_mul.implementation(CUDA)
def silu_and_mul_cuda(x):
    return _act_and_mul_kernel("silu_and_mul", x)


@silu_and_mul.implementation(CPU)
def silu_and_mul_cpu(x):
    """The host kernel for float32 x (one call, where PyTorch's takes two), else the reference."""
    if x.dtype != torch.float32 or not bindings_available():
        return silu_and_mul_reference(x)
    return _act_and_mul_kernel("host_silu_and_mul", x)


@define
def gelu_and_mul(x: Tensor, approximate: str = "none") -> Tensor:
    """gelu(x[..., :I], approximate) * x[..., I:] for x [..., 2I]."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu_and_mul: approximate must be 'none' or 'tanh', got {approximate!r}")
    return add_layer("gelu_and_mul", [x], [(x.dtype, gated_shape("gelu_and_mul", x.shape))],
                     approximate=approximate)


@gelu_and_mul.implementation(REFERENCE)
def gelu_and_mul_reference(x, *, approximate="none"):
    half = x.shape[-1] // 2
    return F.gelu(x[..., :half], approximate=approximate) * x[..., half:]


@gelu_and_mul.implementation(CUDA)
def gelu_and_mul_cuda(x, *, approximate="none"):
    return _act_and_mul_kernel("gelu_and_mul", x, approximate)
