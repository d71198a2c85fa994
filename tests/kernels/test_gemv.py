"""The fused GEMV ops (a linear layer of 1..4 rows with RMSNorm or SiLU-and-mul in front).

CPU: the ops are the references of the ops they compute (linear, rms_norm_linear, ...). GPU
(`-m gpu`): the compiled kernel against those references on random inputs of odd sizes in every
dtype, the residual sum bit-exact, the cases it does not serve falling back to the reference, the
compiled module refusing what it cannot serve, and CUDA-graph replay.
"""

import pytest
import torch
import torch.nn.functional as F

from tensorrt_llm import kernels
from tensorrt_llm.ops.activation import silu_and_mul_reference
from tensorrt_llm.ops.linear import (
    add_rms_norm_linear_reference,
    linear_reference,
    rms_norm_linear_reference,
    silu_and_mul_linear_reference,
)
from tensorrt_llm.ops.norm import rms_norm_reference

from .utils import DTYPES

# The kernel and cuBLAS sum k products in different orders, and the kernel may round the
# normalised input differently in the last place: compare relative to the output's scale.
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2.5e-2}


def _inputs(gen, rows, n, k, dtype, device, gated=False):
    x = torch.randn(rows, 2 * k if gated else k, generator=gen).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype).to(device)
    b = torch.randn(n, generator=gen).to(dtype).to(device)
    r = torch.randn(rows, k, generator=gen).to(dtype).to(device)
    g = (1 + 0.1 * torch.randn(k, generator=gen)).to(dtype).to(device)
    return x, w, b, r, g


def _close(actual, expected, dtype, msg=""):
    scale = expected.float().abs().max().clamp_min(1.0)
    err = (actual.float() - expected.float()).abs().max() / scale
    assert err <= TOL[dtype], f"{msg} max error {err:.3g} of the output scale (allowed {TOL[dtype]})"


# ---- CPU ----

def test_cpu_ops_are_their_references():
    gen = torch.Generator().manual_seed(0)
    x, w, b, r, g = _inputs(gen, 3, 10, 16, torch.float32, "cpu")
    torch.testing.assert_close(kernels.gemv(x, w, b), F.linear(x, w, b), rtol=0, atol=0)
    torch.testing.assert_close(kernels.rms_norm_gemv(x, g, w, b, 1e-5),
                               F.linear(rms_norm_reference(x, g, eps=1e-5), w, b), rtol=0, atol=0)
    y, s = kernels.rms_norm_gemv(x, g, w, None, 1e-5, residual=r)
    torch.testing.assert_close(s, x + r, rtol=0, atol=0)
    torch.testing.assert_close(y, F.linear(rms_norm_reference(x + r, g, eps=1e-5), w), rtol=0, atol=0)
    xg = torch.randn(3, 32, generator=gen)
    torch.testing.assert_close(kernels.silu_and_mul_gemv(xg, w), F.linear(silu_and_mul_reference(xg), w),
                               rtol=0, atol=0)
    assert not kernels.gemv_supported(x, w)  # CPU tensors: never the compiled kernel


# ---- GPU ----

gpu = pytest.mark.gpu
DEVICE = "cuda"


SHAPES = [(1, 8), (37, 64), (960, 576), (3072, 576), (576, 1536), (4099, 4096), (33, 14336)]


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("n, k", SHAPES)
def test_gemv_matches_reference(gen, needs_kernels, dtype, rows, n, k):
    x, w, b, r, g = _inputs(gen, rows, n, k, dtype, DEVICE)
    rows_in_shared = {1: 1, 2: 2}.get(rows, 4)  # the kernel instance's rows
    served = rows_in_shared * k * x.element_size() <= 200 * 1024
    assert kernels.gemv_supported(x, w) == served
    _close(kernels.gemv(x, w), linear_reference(x, w, None), dtype, "gemv")
    _close(kernels.gemv(x, w, b), linear_reference(x, w, b), dtype, "gemv + bias")
    _close(kernels.rms_norm_gemv(x, g, w, b, 1e-6), rms_norm_linear_reference(x, g, w, b, eps=1e-6), dtype,
           "rms_norm")
    y, s = kernels.rms_norm_gemv(x, g, w, None, 1e-6, residual=r)
    y_ref, s_ref = add_rms_norm_linear_reference(x, r, g, w, None, eps=1e-6)
    assert torch.equal(s, s_ref), "x + residual must be exact"
    _close(y, y_ref, dtype, "add_rms_norm")
    xg = torch.randn(rows, 2 * k, generator=gen).to(dtype).to(DEVICE)
    _close(kernels.silu_and_mul_gemv(xg, w, b), silu_and_mul_linear_reference(xg, w, b), dtype, "silu_and_mul")


@gpu
def test_row_strided_input_and_output_slices(gen, needs_kernels):
    # The decode graph hands the GEMV column slices of wider tensors (e.g. the gate/up half).
    dtype = torch.bfloat16
    wide = torch.randn(2, 3 * 256, generator=gen).to(dtype).to(DEVICE)
    x = wide[:, 256:512]
    w = (torch.randn(300, 256, generator=gen) / 16).to(dtype).to(DEVICE)
    assert kernels.gemv_supported(x, w)
    _close(kernels.gemv(x, w), linear_reference(x, w, None), dtype)


@gpu
@pytest.mark.parametrize("case", ["five_rows", "odd_k", "misaligned_x", "fp32_too_wide"])
def test_unserved_cases_fall_back_to_the_reference(gen, needs_kernels, case):
    dtype = torch.float32 if case == "fp32_too_wide" else torch.bfloat16
    rows, n, k = {"five_rows": (5, 64, 64), "odd_k": (2, 64, 60), "misaligned_x": (2, 64, 64),
                  "fp32_too_wide": (4, 16, 14336)}[case]
    x, w, b, r, g = _inputs(gen, rows, n, k, dtype, DEVICE)
    if case == "misaligned_x":
        flat = torch.zeros(rows * k + 1, dtype=dtype, device=DEVICE)
        flat[1:] = x.reshape(-1)
        x = flat[1:].view(rows, k)
    assert not kernels.gemv_supported(x, w)
    _close(kernels.rms_norm_gemv(x, g, w, b, 1e-6), rms_norm_linear_reference(x, g, w, b, eps=1e-6), dtype)


@gpu
def test_binding_refuses_what_it_cannot_serve(needs_kernels):
    from tensorrt_llm.ops.launch import get_bindings, stream_of, tensor_arg
    x = torch.zeros(5, 64, dtype=torch.bfloat16, device=DEVICE)
    w = torch.zeros(8, 64, dtype=torch.bfloat16, device=DEVICE)
    out = torch.empty(5, 8, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="gemv: 5 rows"):
        get_bindings().gemv(tensor_arg(out), tensor_arg(x), tensor_arg(w), None, 0, None, None, None, 0.0,
                            stream_of(x))
    with pytest.raises(ValueError, match="prologue"):
        get_bindings().gemv(tensor_arg(out[:1]), tensor_arg(x[:1]), tensor_arg(w), None, 7, None, None, None,
                            0.0, stream_of(x))


@gpu
def test_replays_in_a_cuda_graph(gen, needs_kernels):
    dtype = torch.bfloat16
    x, w, b, r, g = _inputs(gen, 2, 1000, 512, dtype, DEVICE)
    static_x, static_r = x.clone(), r.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernels.rms_norm_gemv(static_x, g, w, b, 1e-6, residual=static_r)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, s = kernels.rms_norm_gemv(static_x, g, w, b, 1e-6, residual=static_r)
    for _ in range(2):
        x2, _, _, r2, _ = _inputs(gen, 2, 1000, 512, dtype, DEVICE)
        static_x.copy_(x2)
        static_r.copy_(r2)
        graph.replay()
        y_ref, s_ref = add_rms_norm_linear_reference(x2, r2, g, w, b, eps=1e-6)
        assert torch.equal(s, s_ref)
        _close(y, y_ref, dtype)
