"""fp8_linear: the shape rule, the reference (= formats.quantized_linear_reference, the
meaning: x quantized to E4M3 with its static or per-token scale, both operands dequantized,
float32 matmul) against the formula and the float matmul, the fused CPU ops against the reference
(the host kernel itself: tests/kernels/test_host_fp8_gemv.py), and (gpu) the torch._scaled_mm
implementation against the reference on LLaMA-8B's shapes, odd token counts and in a CUDA graph."""
import math

import pytest
import torch

from tensorrt_llm import functional as F
from tensorrt_llm.network import Network, net_guard
from tensorrt_llm.ops import CPU, OPS, REFERENCE, implementations
from tensorrt_llm.ops.activation import silu_and_mul_cuda, silu_and_mul_reference
from tensorrt_llm.ops.fp8_linear import (
    FP8_GEMV_MAX_ROWS,
    _quantize_activation_cuda,
    add_rms_norm_fp8_gated_mlp_cpu,
    add_rms_norm_fp8_gated_mlp_cuda,
    add_rms_norm_fp8_gated_mlp_reference,
    add_rms_norm_fp8_linear_cpu,
    add_rms_norm_fp8_linear_cuda,
    add_rms_norm_fp8_linear_reference,
    fp8_gated_gemv_serves,
    fp8_gemm_of_codes,
    fp8_gemm_wgmma_takes,
    fp8_gemv,
    fp8_gemv_serves,
    fp8_linear_cpu,
    fp8_linear_cuda,
    fp8_linear_reference,
    rms_norm_fp8_linear_cuda,
    rms_norm_fp8_linear_reference,
    silu_and_mul_fp8_linear_cpu,
    silu_and_mul_fp8_linear_cuda,
    silu_and_mul_fp8_linear_reference,
)
from tensorrt_llm.ops.launch import cuda_kernels_available, launch
from tensorrt_llm.ops.norm import fused_add_rms_norm_cuda, rms_norm_cuda, rms_norm_reference
from tensorrt_llm.quantization.formats import (
    FP8_DTYPE,
    FP8_MAX,
    fp8_scale_from_amax,
    quantize_fp8,
    quantize_fp8_activation,
    quantized_linear_reference,
)

# (per-channel weight scales, static activation scale)
MODES = [(False, True), (True, True), (False, False), (True, False)]


def _layer(n, k, per_channel, static, x, seed=0, device="cpu"):
    """The op's tensors (codes as bytes, scales) of a random weight, calibrated on x."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.05).to(device)
    q = quantize_fp8(w, per_channel=per_channel,
                     input_scale=fp8_scale_from_amax(x.abs().amax().float().cpu()) if static else None)
    scale_in = None if q.input_scale is None else q.input_scale.to(device)
    return w, q, (q.qweight.view(torch.uint8), q.scale.to(device), scale_in)


@pytest.mark.parametrize("per_channel,static", MODES)
def test_reference_is_the_formats_meaning(per_channel, static):
    x = torch.randn(2, 3, 128)
    _, q, (qw, ws, xs) = _layer(48, 128, per_channel, static, x)
    bias = torch.randn(48)
    got = fp8_linear_reference(x, qw, ws, xs, bias)
    assert got.shape == (2, 3, 48) and got.dtype == torch.float32
    torch.testing.assert_close(got, quantized_linear_reference(x, q, bias), rtol=0, atol=0)
    # the formula: x / s_x clamped and rounded to E4M3, both sides dequantized in float32
    sx = xs if static else x.abs().amax(-1, keepdim=True) / FP8_MAX
    qx = (x / sx).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float() * sx
    w = qw.view(FP8_DTYPE).float() * (ws[:, None] if per_channel else ws)
    torch.testing.assert_close(got, qx @ w.t() + bias, rtol=1e-5, atol=1e-5)


# E4M3 keeps 3 mantissa bits: each operand rounds with an RMS relative error of about 2.6%, so
# the product's is about 3.7% (both operands); 5% bounds it over the seeds tried.
@pytest.mark.parametrize("per_channel,static", MODES)
@pytest.mark.parametrize("seed", range(4))
def test_reference_is_close_to_the_float_matmul(per_channel, static, seed):
    x = torch.randn(16, 512, generator=torch.Generator().manual_seed(seed))
    w, _, (qw, ws, xs) = _layer(64, 512, per_channel, static, x, seed=seed)
    want = x @ w.t()
    err = fp8_linear_reference(x, qw, ws, xs) - want
    assert err.pow(2).mean().sqrt() <= 0.05 * want.pow(2).mean().sqrt()


def test_static_scale_saturates_and_dynamic_scales_each_token():
    x = torch.randn(2, 64)
    _, _, (qw, ws, _) = _layer(32, 64, False, False, x)
    # a static scale calibrated to |x| <= 1: larger inputs saturate at 448 * scale
    one = torch.ones(1) / FP8_MAX
    torch.testing.assert_close(fp8_linear_reference(x * 100, qw, ws, one),
                               fp8_linear_reference((x * 100).clamp(-1, 1), qw, ws, one))
    # per token: scaling one row leaves the other row's output as it was
    y = fp8_linear_reference(x, qw, ws)
    big = x.clone()
    big[0] *= 1000
    y_big = fp8_linear_reference(big, qw, ws)
    torch.testing.assert_close(y_big[1], y[1], rtol=0, atol=0)
    torch.testing.assert_close(y_big[0], y[0] * 1000, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reference_keeps_x_dtype(dtype):
    x = torch.randn(3, 64).to(dtype)
    _, _, (qw, ws, xs) = _layer(32, 64, True, True, x)
    assert fp8_linear_reference(x, qw, ws, xs, torch.zeros(32, dtype=dtype)).dtype == dtype


def test_shape_rule():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "bfloat16", (-1, 64), dim_range=[("tokens", (1, 8, 16))])
        qw = F.constant(torch.zeros(32, 64, dtype=torch.uint8), name="qw")
        scale = F.constant(torch.ones(1), name="s")
        channel_scale = F.constant(torch.ones(32), name="cs")
        y = F.fp8_linear(x, qw, channel_scale, scale)
        assert (y.dtype, y.shape) == ("bfloat16", (-1, 32))
        assert F.fp8_linear(x, qw, scale).shape == (-1, 32)  # per tensor, per token
        bad = [
            (lambda: F.fp8_linear(x, F.constant(torch.zeros(32, 64, dtype=torch.int8), name="i8"), scale),
             "E4M3 codes' bytes"),
            (lambda: F.fp8_linear(x, qw, F.constant(torch.ones(16), name="s16")), "weight_scale must be"),
            (lambda: F.fp8_linear(x, qw, F.constant(torch.ones(1, dtype=torch.float16), name="h")),
             "weight_scale must be float32"),
            (lambda: F.fp8_linear(x, qw, scale, channel_scale), "input_scale must be float32 \\[1\\]"),
            (lambda: F.fp8_linear(x, F.constant(torch.zeros(32, 48, dtype=torch.uint8), name="q48"), scale),
             "does not match in_features 48"),
            (lambda: F.fp8_linear(x, qw, scale, None, F.constant(torch.zeros(32), name="b")), "bias dtype"),
            (lambda: F.fp8_linear(net.add_input("ids", "int32", (4, 64)), qw, scale), "x must be"),
        ]
        for call, message in bad:
            with pytest.raises(ValueError, match=message):
                call()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("m,k,offset", [(1, 4096, 0), (2048, 4096, 0), (37, 14336, 0), (5, 100, 0), (6, 96, 4)])
def test_quantize_kernel_codes_are_the_references(dtype, static, m, k, offset):
    """The fp8_quantize kernel (one pass over x): codes and scales bit for bit the format's,
    16-byte loads or not (K not a multiple of the pack, rows off 16-byte boundaries)."""
    assert cuda_kernels_available()
    g = torch.Generator().manual_seed(m + k)
    x = (torch.randn(m, k + offset, generator=g) * 3).to(dtype)[:, offset:]
    x[m // 2] = 0  # an all-zero token
    x[0, k // 3] = 1e4  # beyond a static scale's range: saturates
    input_scale = torch.tensor([0.02]) if static else None
    want_codes, want_scale = quantize_fp8_activation(x, input_scale)
    codes, scale = _quantize_activation_cuda(x.cuda(), None if input_scale is None else input_scale.cuda())
    assert torch.equal(codes.view(torch.uint8).cpu(), want_codes.view(torch.uint8))
    assert torch.equal(scale.cpu(), want_scale)


def test_the_cpu_runs_the_host_kernel_then_the_reference():
    # The host FP8 GEMV for decode rows (tests/kernels/test_host_fp8_gemv.py), the reference beyond.
    impls = implementations("cpu")["fp8_linear"]
    assert list(impls) == [CPU, REFERENCE] and OPS["fp8_linear"].reference is fp8_linear_reference


# ---- GPU: torch._scaled_mm against the reference ------------------------------------------------

# LLaMA-3-8B's linears as (in, out): qkv, dense, gate / up, down.
LLAMA_8B = [(4096, 6144), (4096, 4096), (4096, 14336), (14336, 4096)]


def _gpu_case(m, k, n, per_channel, static, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, generator=g, device="cuda").to(dtype)
    _, _, (qw, ws, xs) = _layer(n, k, per_channel, static, x, seed=seed, device="cuda")
    return x, qw, ws, xs


def _assert_close_to_reference(got, want, k):
    """Both compute the same E4M3 products; the GEMM sums them in another order in Hopper's FP8
    accumulator, which with fast accumulation (SCALED_MM_FAST_ACCUM) keeps about 13 bits over
    the whole sum (each of the K additions loses up to 2^-13 of the sum's magnitude, the losses
    adding as a random walk), and rounds once to the output dtype: within one unit of that
    dtype's last place, plus (2^-10 + sqrt(K) 2^-13) of the largest output."""
    assert got.shape == want.shape and got.dtype == want.dtype
    eps = torch.finfo(want.dtype).eps  # bfloat16 2^-7, float16 2^-10, float32 2^-23
    err, ref = (got.float() - want.float()).abs(), want.float().abs()
    bound = eps * ref + (2 ** -10 + math.sqrt(k) * 2 ** -13) * ref.max()
    assert (err <= bound).all(), f"worst error / bound {(err / bound).max().item():.3f}"


@pytest.mark.gpu
@pytest.mark.parametrize("k,n", LLAMA_8B)
@pytest.mark.parametrize("m", [1, 7, 16, 33, 256])
@pytest.mark.parametrize("per_channel,static", MODES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_scaled_mm_matches_reference(k, n, m, per_channel, static, dtype):
    x, qw, ws, xs = _gpu_case(m, k, n, per_channel, static, dtype, seed=m)
    _assert_close_to_reference(fp8_linear_cuda(x, qw, ws, xs), fp8_linear_reference(x, qw, ws, xs), k)


@pytest.mark.gpu
@pytest.mark.parametrize("per_channel,static", MODES)
def test_scaled_mm_float32_x_bias_and_leading_dims(per_channel, static):
    x, qw, ws, xs = _gpu_case(10, 256, 128, per_channel, static, torch.float32)
    x = x.reshape(2, 5, 256)
    bias = torch.randn(128, device="cuda")
    got, want = fp8_linear_cuda(x, qw, ws, xs, bias), fp8_linear_reference(x, qw, ws, xs, bias)
    assert got.shape == (2, 5, 128)
    _assert_close_to_reference(got, want, 256)


@pytest.mark.gpu
def test_shapes_scaled_mm_refuses_run_the_reference():
    x, qw, ws, xs = _gpu_case(5, 40, 24, False, True, torch.bfloat16)  # K, N not multiples of 16
    torch.testing.assert_close(fp8_linear_cuda(x, qw, ws, xs), fp8_linear_reference(x, qw, ws, xs),
                               rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("per_channel,static", MODES)
def test_scaled_mm_replays_in_a_cuda_graph(per_channel, static):
    """The runtime captures decode steps in CUDA graphs: the op must not synchronize."""
    x, qw, ws, xs = _gpu_case(3, 4096, 4096, per_channel, static, torch.bfloat16)
    fp8_linear_cuda(x, qw, ws, xs)  # warm-up outside the capture (cuBLASLt workspace)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fp8_linear_cuda(x, qw, ws, xs)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    _assert_close_to_reference(y, fp8_linear_reference(x, qw, ws, xs), 4096)


# ---- GPU: Hopper's FP8 GEMM of few rows (TMA + wgmma) against the reference --------------------

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="fp8_gemm_wgmma runs on compute capability 9.0 (H100 / H200) only")
# (K, N): LLaMA-8B's four linears and their split / slot choices (K split in two up to 8,192
# features; slots of 512 bytes at K = 14,336, 128 beyond 16,384 features), the smallest shape,
# K not a multiple of the split's 256 bytes, and more rows of blocks than one wave.
WGMMA_SHAPES = LLAMA_8B + [(128, 64), (384, 128), (14336, 1024), (512, 17408), (4096, 28672)]


def _wgmma_codes(m, k, n, per_channel, dtype, seed):
    x, qw, ws, xs = _gpu_case(m, k, n, per_channel, True, dtype, seed=seed)
    return x, qw, ws, xs, _quantize_activation_cuda(x, xs)[0]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("k,n", WGMMA_SHAPES)
@pytest.mark.parametrize("m", [9, 17, 32])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_gemm_wgmma_matches_reference(k, n, m, per_channel, dtype):
    x, qw, ws, xs, codes = _wgmma_codes(m, k, n, per_channel, dtype, seed=m + k + n)
    assert fp8_gemm_wgmma_takes(codes, xs, qw, dtype)
    bias = torch.randn(n, device="cuda").to(dtype) if m == 17 else None
    got = fp8_gemm_of_codes(codes, xs, qw, ws, bias, dtype)
    _assert_close_to_reference(got, fp8_linear_reference(x, qw, ws, xs, bias), k)
    # the op itself (fp8_linear) takes the same kernel at these rows
    _assert_close_to_reference(fp8_linear_cuda(x, qw, ws, xs, bias), fp8_linear_reference(x, qw, ws, xs, bias), k)


@pytest.mark.gpu
@needs_hopper
def test_fp8_gemm_wgmma_extreme_codes_and_one_row():
    """Every code at +-448 (the largest products) and a single row of x (the other 31 rows of the
    tile read as zeros), K split in two parts of one 128-byte step each: exact. (Over K = 4,096
    such same-sign sums lose about 2% in Hopper's FP8 accumulator, ours and cuBLASLt's alike: an
    H200 gave -48.25 and -48.0 for -49.)"""
    k, n = 256, 128
    codes = torch.full((1, k), 448.0, device="cuda").to(FP8_DTYPE)
    qw = torch.full((n, k), -448.0, device="cuda").to(FP8_DTYPE).view(torch.uint8)
    ws, xs = torch.full((1,), 2.0 ** -20, device="cuda"), torch.full((1,), 2.0 ** -4, device="cuda")
    assert fp8_gemm_wgmma_takes(codes, xs, qw, torch.bfloat16)
    got = fp8_gemm_of_codes(codes, xs, qw, ws, None, torch.bfloat16)
    want = torch.full((1, n), -448.0 * 448.0 * k * 2.0 ** -24, device="cuda")
    torch.testing.assert_close(got.float(), want, rtol=0, atol=0)


@pytest.mark.gpu
@needs_hopper
def test_fp8_gemm_wgmma_replays_in_a_cuda_graph():
    x, qw, ws, xs, codes = _wgmma_codes(32, 4096, 4096, False, torch.bfloat16, seed=1)
    fp8_gemm_of_codes(codes, xs, qw, ws, None, torch.bfloat16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fp8_gemm_of_codes(codes, xs, qw, ws, None, torch.bfloat16)
    x2, *_ = _gpu_case(32, 4096, 4096, False, True, torch.bfloat16, seed=2)
    codes.copy_(_quantize_activation_cuda(x2, xs)[0])
    graph.replay()
    torch.cuda.synchronize()
    _assert_close_to_reference(y, fp8_linear_reference(x2, qw, ws, xs), 4096)


@pytest.mark.gpu
@needs_hopper
def test_fp8_gemm_wgmma_dispatch_and_refusals():
    x, qw, ws, xs, codes = _wgmma_codes(32, 256, 128, False, torch.bfloat16, seed=3)
    assert fp8_gemm_wgmma_takes(codes, xs, qw, torch.bfloat16)
    assert not fp8_gemm_wgmma_takes(torch.cat([codes, codes[:1]]), xs, qw, torch.bfloat16)  # 33 rows: cuBLASLt
    assert not fp8_gemm_wgmma_takes(codes, xs.expand(32, 1), qw, torch.bfloat16)  # per-token scales
    assert not fp8_gemm_wgmma_takes(codes, xs, qw, torch.float32)  # float32 output
    _, qw96, *_ = _gpu_case(32, 256, 96, False, True, torch.bfloat16)
    assert not fp8_gemm_wgmma_takes(codes, xs, qw96, torch.bfloat16)  # N not a multiple of 64
    out = torch.empty(33, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="at most 32 rows"):
        launch("fp8_gemm_wgmma", out, torch.cat([codes, codes[:1]]).view(torch.int32), qw.view(torch.int32), ws, xs)
    with pytest.raises(ValueError, match="multiple of 64"):
        launch("fp8_gemm_wgmma", out[:32, :96], codes.view(torch.int32), qw96.view(torch.int32), ws, xs)


# ---- GPU: the FP8 GEMV (static input scale, few rows) against the reference ---------------------


def _assert_within_summation_order(got, want):
    """The GEMV sums the same exact E4M3 products in float32 in another order: at most one unit
    of the output dtype's last place (a rounding that flips) plus float32 summation error."""
    assert got.shape == want.shape and got.dtype == want.dtype
    eps = torch.finfo(want.dtype).eps
    err, ref = (got.float() - want.float()).abs(), want.float().abs()
    bound = eps * ref + 2 ** -14 * ref.max()
    assert (err <= bound).all(), f"worst error / bound {(err / bound).max().item():.3f}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("k,n", [(4096, 6144), (14336, 4096), (48, 40), (272, 17), (1040, 1000)])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
def test_fp8_gemv_matches_reference(m, k, n, per_channel, dtype):
    x, qw, ws, xs = _gpu_case(m, k, n, per_channel, True, dtype, seed=m + k)
    assert fp8_gemv_serves(x, qw, xs)
    bias = torch.randn(n, device="cuda").to(dtype) if m % 2 else None
    got = fp8_linear_cuda(x, qw, ws, xs, bias)
    _assert_within_summation_order(got, fp8_linear_reference(x, qw, ws, xs, bias))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 8])
@pytest.mark.parametrize("blocks_per_sm", [2, 2.5, 3, 3.5])
def test_fp8_gemv_grid_sizes(m, blocks_per_sm):
    """Grids of 2-3 blocks (16 outputs each) per multiprocessor take the kernel's 3-blocks-an-SM
    instance, others the 2-blocks one: both against the reference, on either side of the bounds."""
    sms = torch.cuda.get_device_properties("cuda").multi_processor_count
    n = 16 * int(blocks_per_sm * sms)
    x, qw, ws, xs = _gpu_case(m, 512, n, True, True, torch.bfloat16, seed=m)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    _assert_within_summation_order(fp8_linear_cuda(x, qw, ws, xs, bias), fp8_linear_reference(x, qw, ws, xs, bias))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [17, 24, 32, 33, 37, 70])
@pytest.mark.parametrize("per_channel", [False, True])
def test_fp8_gemv_tile_loop(m, per_channel):
    """More rows than fp8_linear gives it (the kernel serves them all the same): tiles of 32 rows
    per pass over the weight, the last one partial."""
    x, qw, ws, xs = _gpu_case(m, 1024, 272, per_channel, True, torch.bfloat16, seed=m)
    bias = torch.randn(272, device="cuda").to(torch.bfloat16)
    _assert_within_summation_order(fp8_gemv(x, qw, ws, xs, bias), fp8_linear_reference(x, qw, ws, xs, bias))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_gemv_quantizes_x_as_the_format(dtype):
    """W = identity (E4M3 1.0, scale 1): each output is x's E4M3 code times input_scale, one
    exact product: the GEMV's in-kernel quantization (reciprocal multiply, saturation at +-448, rounding
    to nearest even, subnormals) must give the reference's codes bit for bit."""
    k = 256
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(4, k, generator=g, device="cuda") * torch.logspace(-4, 1, k, device="cuda")).to(dtype)
    x[1, :8] = torch.tensor([1e3, -1e3, 30.0, -30.0, 0.0, -0.0, 5e-5, -5e-5])  # saturate, subnormal codes
    x[2] = torch.linspace(-20, 20, k, device="cuda").to(dtype)  # ties between E4M3 neighbours
    qw = (torch.eye(k, device="cuda") * 1.0).to(FP8_DTYPE).view(torch.uint8)
    for scale in (0.05, 0.0123, 1.0):
        xs = torch.tensor([scale], device="cuda")
        ws = torch.ones(1, device="cuda")
        got = fp8_linear_cuda(x, qw, ws, xs)
        torch.testing.assert_close(got, fp8_linear_reference(x, qw, ws, xs), rtol=0, atol=0)


@pytest.mark.gpu
def test_fp8_gemv_dispatch():
    x, qw, ws, xs = _gpu_case(FP8_GEMV_MAX_ROWS, 256, 64, False, True, torch.bfloat16)
    assert fp8_gemv_serves(x, qw, xs)
    assert not fp8_gemv_serves(x, qw, None)  # dynamic scales: _scaled_mm
    assert not fp8_gemv_serves(torch.cat([x, x[:1]]), qw, xs)  # more rows: _scaled_mm
    assert not fp8_gemv_serves(x.float(), qw, xs)  # float32 x: _scaled_mm
    x40, qw40, ws40, xs40 = _gpu_case(3, 40, 24, False, True, torch.bfloat16)
    assert not fp8_gemv_serves(x40, qw40, xs40)  # K not a multiple of 16: the reference


# ---- the fused ops: RMSNorm / SiLU-and-mul in front of fp8_linear --------------------------------


def test_fused_ops_shape_rules():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, 64], [("num_tokens", (1, 4, 8))])
        qw = F.constant(torch.zeros(48, 64, dtype=torch.uint8))
        ws = F.constant(torch.ones(1))
        xs = F.constant(torch.ones(1))
        g = F.constant(torch.ones(64))
        assert F.rms_norm_fp8_linear(x, g, qw, ws, xs, eps=1e-6).shape == (-1, 48)
        y, total = F.add_rms_norm_fp8_linear(x, x, g, qw, ws, None, eps=1e-6)
        assert (y.shape, total.shape) == ((-1, 48), (-1, 64))
        wide = net.add_input("wide", "float32", [-1, 128], [("num_tokens", (1, 4, 8))])
        assert F.silu_and_mul_fp8_linear(wide, qw, ws, xs).shape == (-1, 48)
        with pytest.raises(ValueError, match=r"rms_norm_fp8_linear: norm_weight has shape \[32\], expected \[64\]"):
            F.rms_norm_fp8_linear(x, F.constant(torch.ones(32)), qw, ws, xs, eps=1e-6)
        with pytest.raises(ValueError, match="add_rms_norm_fp8_linear: dtype mismatch"):
            F.add_rms_norm_fp8_linear(x, x, F.constant(torch.ones(64, dtype=torch.bfloat16)), qw, ws, xs, eps=1e-6)
        with pytest.raises(ValueError, match=r"silu_and_mul_fp8_linear: input \[-1, 64\] gated to \[-1, 32\] "
                                             r"does not match in_features 64"):
            F.silu_and_mul_fp8_linear(x, qw, ws, xs)
        with pytest.raises(ValueError, match="rms_norm_fp8_linear: qweight must be the E4M3 codes' bytes"):
            F.rms_norm_fp8_linear(x, g, F.constant(torch.zeros(48, 64)), ws, xs, eps=1e-6)


def test_fused_references_are_the_unfused_references():
    g = torch.Generator().manual_seed(3)
    x, r = torch.randn(3, 64, generator=g), torch.randn(3, 64, generator=g)
    norm_weight = torch.rand(64, generator=g) + 0.5
    _, _, (qw, ws, xs) = _layer(48, 64, False, True, rms_norm_reference(x, norm_weight, eps=1e-6))
    assert torch.equal(rms_norm_fp8_linear_reference(x, norm_weight, qw, ws, xs, eps=1e-6),
                       fp8_linear_reference(rms_norm_reference(x, norm_weight, eps=1e-6), qw, ws, xs))
    y, total = add_rms_norm_fp8_linear_reference(x, r, norm_weight, qw, ws, None, eps=1e-6)
    assert torch.equal(total, x + r)
    assert torch.equal(y, fp8_linear_reference(rms_norm_reference(x + r, norm_weight, eps=1e-6), qw, ws, None))
    wide = torch.randn(3, 128, generator=g)
    assert torch.equal(silu_and_mul_fp8_linear_reference(wide, qw, ws, xs),
                       fp8_linear_reference(silu_and_mul_reference(wide), qw, ws, xs))


# ---- GPU: the fused ops ----------------------------------------------------------------------------


def _fused_case(m, k, n, dtype, seed, op):
    """x (and residual, norm weight) for the op in front ("rms_norm" or "silu_and_mul"), and a layer
    calibrated on that op's output."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    width = 2 * k if op == "silu_and_mul" else k
    x = torch.randn(m, width, generator=g, device="cuda").to(dtype)
    residual = torch.randn(m, k, generator=g, device="cuda").to(dtype)
    norm_weight = (torch.rand(k, generator=g, device="cuda") + 0.5).to(dtype)
    layer_input = silu_and_mul_reference(x) if op == "silu_and_mul" else rms_norm_reference(
        x + residual, norm_weight, eps=1e-5)
    _, _, (qw, ws, xs) = _layer(n, k, seed % 2 == 1, True, layer_input, seed=seed, device="cuda")
    bias = torch.randn(n, device="cuda").to(dtype) if seed % 3 == 0 else None
    return x, residual, norm_weight, qw, ws, xs, bias


def _assert_norm_ops_are_the_unfused_cuda_ops(x, residual, norm_weight, qw, ws, input_scale, bias):
    """rms_norm_fp8_linear and add_rms_norm_fp8_linear give the rms_norm / fused_add_rms_norm
    kernels then fp8_linear's numbers bit for bit; returns add_rms_norm_fp8_linear's output."""
    torch.testing.assert_close(rms_norm_fp8_linear_cuda(x, norm_weight, qw, ws, input_scale, bias, eps=1e-5),
                               fp8_linear_cuda(rms_norm_cuda(x, norm_weight, eps=1e-5), qw, ws, input_scale, bias),
                               rtol=0, atol=0)
    y, total = add_rms_norm_fp8_linear_cuda(x, residual, norm_weight, qw, ws, input_scale, bias, eps=1e-5)
    normed, want_total = fused_add_rms_norm_cuda(x, residual, norm_weight, eps=1e-5)
    assert torch.equal(total, want_total)
    torch.testing.assert_close(y, fp8_linear_cuda(normed, qw, ws, input_scale, bias), rtol=0, atol=0)
    return y


# LLaMA-3-8B's qkv, gate_up and o (as (K, N); SiLU-and-mul's x is 2K wide), small and odd shapes.
FEW_ROW_SHAPES = [(4096, 6144), (4096, 28672), (4096, 4096), (64, 48), (272, 17), (1040, 1000)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k,n", FEW_ROW_SHAPES)
@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_fused_ops_over_few_rows_are_the_unfused_cuda_ops(m, k, n, dtype):
    """The GEMV's rows: the norm / activation kernel, then the FP8 GEMV, bit for bit the unfused
    CUDA ops, with static and dynamic (the _scaled_mm path) input scales; near the reference."""
    x, residual, norm_weight, qw, ws, xs, bias = _fused_case(m, k, n, dtype, m + k + n, "rms_norm")
    assert fp8_gemv_serves(x, qw, xs)
    y = _assert_norm_ops_are_the_unfused_cuda_ops(x, residual, norm_weight, qw, ws, xs, bias)
    _assert_norm_ops_are_the_unfused_cuda_ops(x, residual, norm_weight, qw, ws, None, bias)
    # the reference normalises in float32, rounds, then scales (two roundings): x differs by a
    # unit of its dtype's last place in places, moving some E4M3 codes by one step
    want_ref, _ = add_rms_norm_fp8_linear_reference(x, residual, norm_weight, qw, ws, xs, bias, eps=1e-5)
    assert (y.float() - want_ref.float()).norm() <= 0.02 * want_ref.float().norm()
    wide, _, _, qw2, ws2, xs2, bias2 = _fused_case(m, k, n, dtype, m + k + n + 1, "silu_and_mul")
    got = silu_and_mul_fp8_linear_cuda(wide, qw2, ws2, xs2, bias2)
    torch.testing.assert_close(got, fp8_gemv(silu_and_mul_cuda(wide), qw2, ws2, xs2, bias2), rtol=0, atol=0)
    want_ref = silu_and_mul_fp8_linear_reference(wide, qw2, ws2, xs2, bias2)
    assert (got.float() - want_ref.float()).norm() <= 0.02 * want_ref.float().norm()


# ---- GPU: many rows, the norm / activation kernel writing the FP8 GEMM's codes -----------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,k,offset", [(17, 4096, 0), (300, 1040, 0), (9, 100, 0), (6, 96, 4)])
def test_kernels_writing_codes_are_the_kernel_then_the_quantize(dtype, m, k, offset):
    """rms_norm_fp8 (with and without the residual) and silu_and_mul_fp8 write the codes that
    fp8_quantize makes of the rms_norm / silu_and_mul kernels' outputs, bit for bit: 16-byte
    packs or not (K not a multiple of the pack, rows off 16-byte boundaries), saturated values."""
    g = torch.Generator(device="cuda").manual_seed(m + k)
    x = (torch.randn(m, k + offset, generator=g, device="cuda") * 3).to(dtype)[:, offset:]
    residual = torch.randn(m, k, generator=g, device="cuda").to(dtype)
    norm_weight = (torch.rand(k, generator=g, device="cuda") * 40).to(dtype)  # some outputs beyond +-448 * scale
    wide = (torch.randn(m, 2 * k, generator=g, device="cuda") * 8).to(dtype)
    scale = torch.tensor([0.02], device="cuda")
    codes = torch.empty(m, k, dtype=torch.uint8, device="cuda")
    launch("rms_norm_fp8", codes.view(torch.int32), x, norm_weight, scale, 1e-5)
    want, _ = _quantize_activation_cuda(rms_norm_cuda(x, norm_weight, eps=1e-5), scale)
    assert torch.equal(codes, want.view(torch.uint8))
    total = torch.empty(m, k, dtype=dtype, device="cuda")
    launch("rms_norm_fp8", codes.view(torch.int32), x, norm_weight, scale, 1e-5, residual=residual, residual_out=total)
    normed, want_total = fused_add_rms_norm_cuda(x, residual, norm_weight, eps=1e-5)
    assert torch.equal(total, want_total)
    assert torch.equal(codes, _quantize_activation_cuda(normed, scale)[0].view(torch.uint8))
    launch("silu_and_mul_fp8", codes.view(torch.int32), wide, scale)
    assert torch.equal(codes, _quantize_activation_cuda(silu_and_mul_cuda(wide), scale)[0].view(torch.uint8))
    assert (codes.view(FP8_DTYPE).float().abs() == FP8_MAX).any()  # the clamp was exercised


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("k,n", [(4096, 6144), (14336, 4096), (64, 48)])
@pytest.mark.parametrize("m", [FP8_GEMV_MAX_ROWS + 1, 32, 64, 2048])
def test_fused_ops_over_many_rows_are_the_unfused_cuda_ops(m, k, n, dtype):
    """Over the GEMV's rows, the fused ops quantize x in the norm / activation kernel and run the
    same cuBLASLt FP8 GEMM: the unfused CUDA ops' numbers bit for bit; dynamic scales and widths
    that are not whole int32 words run the unfused ops themselves."""
    x, residual, norm_weight, qw, ws, xs, bias = _fused_case(m, k, n, dtype, m + k + n, "rms_norm")
    assert not fp8_gemv_serves(x, qw, xs)
    y = _assert_norm_ops_are_the_unfused_cuda_ops(x, residual, norm_weight, qw, ws, xs, bias)
    want_ref, _ = add_rms_norm_fp8_linear_reference(x, residual, norm_weight, qw, ws, xs, bias, eps=1e-5)
    assert (y.float() - want_ref.float()).norm() <= 0.02 * want_ref.float().norm()
    _assert_norm_ops_are_the_unfused_cuda_ops(x, residual, norm_weight, qw, ws, None, bias)  # dynamic scales
    wide, _, _, qw2, ws2, xs2, bias2 = _fused_case(m, k, n, dtype, m + k + n + 1, "silu_and_mul")
    torch.testing.assert_close(silu_and_mul_fp8_linear_cuda(wide, qw2, ws2, xs2, bias2),
                               fp8_linear_cuda(silu_and_mul_cuda(wide), qw2, ws2, xs2, bias2), rtol=0, atol=0)


@pytest.mark.gpu
def test_fused_op_replays_in_a_cuda_graph():
    x, residual, norm_weight, qw, ws, xs, bias = _fused_case(4, 4096, 6144, torch.bfloat16, 1, "rms_norm")
    add_rms_norm_fp8_linear_cuda(x, residual, norm_weight, qw, ws, xs, bias, eps=1e-5)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, total = add_rms_norm_fp8_linear_cuda(x, residual, norm_weight, qw, ws, xs, bias, eps=1e-5)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    normed, want_total = fused_add_rms_norm_cuda(x, residual, norm_weight, eps=1e-5)
    assert torch.equal(total, want_total)
    _assert_within_summation_order(y, fp8_gemv(normed, qw, ws, xs, bias))


# ---- the gated MLP: add_rms_norm_fp8_linear (gate_up) then silu_and_mul_fp8_linear (down) --------


def test_gated_mlp_shape_rule():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "bfloat16", [-1, 64], [("num_tokens", (1, 4, 8))])
        gate_up = F.constant(torch.zeros(96, 64, dtype=torch.uint8))
        down = F.constant(torch.zeros(64, 48, dtype=torch.uint8))
        one = F.constant(torch.ones(1))
        g = F.constant(torch.ones(64, dtype=torch.bfloat16))
        y, total = F.add_rms_norm_fp8_gated_mlp(x, x, g, gate_up, one, one, None, down, one, one, eps=1e-6)
        assert (y.shape, total.shape) == ((-1, 64), (-1, 64))
        with pytest.raises(ValueError, match=r"add_rms_norm_fp8_gated_mlp: gate_up's output \[-1, 96\] gated to "
                                             r"\[-1, 48\] does not match in_features 64"):
            F.add_rms_norm_fp8_gated_mlp(x, x, g, gate_up, one, one, None,
                                         F.constant(torch.zeros(64, 64, dtype=torch.uint8)), one, one, eps=1e-6)


def _mlp_case(m, k, inter, dtype, seed, device):
    """x, residual, norm weight, and gate_up [2 inter, k] / down [k, inter] FP8 layers calibrated
    on their inputs (static input scales; per-channel weight scales and biases on odd seeds)."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, generator=g, device=device).to(dtype)
    residual = torch.randn(m, k, generator=g, device=device).to(dtype)
    norm_weight = (torch.rand(k, generator=g, device=device) + 0.5).to(dtype)
    normed = rms_norm_reference(x + residual, norm_weight, eps=1e-5)
    _, _, gate_up = _layer(2 * inter, k, seed % 2 == 1, True, normed, seed=seed, device=device)
    h = silu_and_mul_reference(fp8_linear_reference(normed, *gate_up))
    _, _, down = _layer(k, inter, seed % 2 == 0, True, h, seed=seed + 1, device=device)
    gate_up_bias = torch.randn(2 * inter, device=device).to(dtype) if seed % 2 else None
    return x, residual, norm_weight, (*gate_up, gate_up_bias), (*down, None)


def test_gated_mlp_is_the_two_fused_ops_on_the_cpu():
    """Reference and CPU implementation: add_rms_norm_fp8_linear's, then silu_and_mul_fp8_linear's."""
    for seed in (1, 2):
        x, r, w, gate_up, down = _mlp_case(3, 64, 48, torch.float32, seed, "cpu")
        h, total = add_rms_norm_fp8_linear_reference(x, r, w, *gate_up, eps=1e-5)
        y, got_total = add_rms_norm_fp8_gated_mlp_reference(x, r, w, *gate_up, *down, eps=1e-5)
        assert torch.equal(got_total, total)
        assert torch.equal(y, silu_and_mul_fp8_linear_reference(h, *down))
        h, total = add_rms_norm_fp8_linear_cpu(x, r, w, *gate_up, eps=1e-5)
        y, got_total = add_rms_norm_fp8_gated_mlp_cpu(x, r, w, *gate_up, *down, eps=1e-5)
        assert torch.equal(got_total, total) and torch.equal(y, silu_and_mul_fp8_linear_cpu(h, *down))


# gate_up [2I, K] as (K, 2I): LLaMA-3-8B's (1,792 tiles: three blocks an SM), 256 tiles (two an
# SM, k-steps in pairs), 384 tiles (two an SM), and small and odd ones.
GATED_SHAPES = [(4096, 28672), (4096, 4096), (4096, 6144), (64, 32), (1040, 1008), (272, 16)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k,n", GATED_SHAPES)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_gated_gemv_is_the_gemv_then_silu_and_mul(m, k, n, dtype):
    """fp8_gemv(gated=True): silu_and_mul's kernel on the plain GEMV's output, bit for bit, with
    per-tensor and per-channel weight scales, with and without a bias."""
    if not cuda_kernels_available():
        pytest.skip("needs the compiled CUDA kernels")
    for seed in (m + k + n, m + k + n + 1):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(m, k, generator=g, device="cuda").to(dtype)
        _, _, (qw, ws, xs) = _layer(n, k, seed % 2 == 1, True, x, seed=seed, device="cuda")
        bias = torch.randn(n, generator=g, device="cuda").to(dtype) if seed % 2 else None
        assert fp8_gated_gemv_serves(x, qw, xs)
        got = fp8_gemv(x, qw, ws, xs, bias, gated=True)
        assert got.shape == (m, n // 2)
        torch.testing.assert_close(got, silu_and_mul_cuda(fp8_gemv(x, qw, ws, xs, bias)), rtol=0, atol=0)


@pytest.mark.gpu
def test_gated_gemv_refuses_what_it_does_not_serve():
    if not cuda_kernels_available():
        pytest.skip("needs the compiled CUDA kernels")
    x = torch.randn(9, 64, device="cuda", dtype=torch.bfloat16)
    _, _, (qw, ws, xs) = _layer(32, 64, False, True, x, device="cuda")
    assert not fp8_gated_gemv_serves(x, qw, xs)
    with pytest.raises(ValueError, match=r"fp8_gemv: gated takes out_features a multiple of 16 \(got 32\), at most "
                                         r"8 rows .* \(got x \(bfloat16 \[9, 64\]"):
        fp8_gemv(x, qw, ws, xs, gated=True)
    _, _, (qw, ws, xs) = _layer(24, 64, False, True, x, device="cuda")
    with pytest.raises(ValueError, match=r"a multiple of 16 \(got 24\)"):
        fp8_gemv(x[:2], qw, ws, xs, gated=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 8, FP8_GEMV_MAX_ROWS + 1, 32])
def test_gated_mlp_is_the_two_fused_cuda_ops(m, dtype):
    """add_rms_norm_fp8_gated_mlp on the GPU: add_rms_norm_fp8_linear then silu_and_mul_fp8_linear,
    bit for bit, within the GEMV's rows (silu_and_mul in gate_up's epilogue) and beyond them; in
    a CUDA graph too."""
    if not cuda_kernels_available():
        pytest.skip("needs the compiled CUDA kernels")
    for seed in (m, m + 1):
        x, r, w, gate_up, down = _mlp_case(m, 4096, 1024, dtype, seed, "cuda")
        assert fp8_gated_gemv_serves(x, gate_up[0], gate_up[2]) == (m <= FP8_GEMV_MAX_ROWS)
        h, want_total = add_rms_norm_fp8_linear_cuda(x, r, w, *gate_up, eps=1e-5)
        want = silu_and_mul_fp8_linear_cuda(h, *down)
        y, total = add_rms_norm_fp8_gated_mlp_cuda(x, r, w, *gate_up, *down, eps=1e-5)
        assert torch.equal(total, want_total)
        torch.testing.assert_close(y, want, rtol=0, atol=0)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y, total = add_rms_norm_fp8_gated_mlp_cuda(x, r, w, *gate_up, *down, eps=1e-5)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, want, rtol=0, atol=0)


# ---- the attention in front: gpt_attention_fp8_linear ----------------------------------------------


def test_attention_fp8_linear_shape_rule():
    net = Network()
    with net_guard(net):
        qkv = net.add_input("qkv", "bfloat16", [-1, 256], [("n", (1, 4, 8))])
        q, k, v = F.split(qkv, [128, 64, 64], dim=1)
        pool = net.add_input("pool", "bfloat16", [1, -1, 2, 2, 16, 32], {1: ("b", (1, 8, 16))})
        tables = net.add_input("tables", "int32", [-1, 4], [("n", (1, 4, 8))])
        lens = [net.add_input(f"l{i}", "int32", [-1], [("n", (1, 4, 8))]) for i in range(3)]
        dense = (F.constant(torch.zeros(48, 128, dtype=torch.uint8)), F.constant(torch.ones(1)),
                 F.constant(torch.ones(1)), None)
        attrs = dict(layer_idx=0, num_heads=4, num_kv_heads=2, head_dim=32, tokens_per_block=16)
        y = F.gpt_attention_fp8_linear(q, k, v, pool, tables, *lens, None, None, None, None, None, *dense, **attrs)
        assert (y.shape, y.dtype) == ((-1, 48), "bfloat16")
        with pytest.raises(ValueError, match=r"^gpt_attention_fp8_linear: attention output \[-1, 128\] does not "
                                             r"match in_features 64"):
            F.gpt_attention_fp8_linear(q, k, v, pool, tables, *lens, None, None, None, None, None,
                                       F.constant(torch.zeros(48, 64, dtype=torch.uint8)), *dense[1:], **attrs)
        with pytest.raises(ValueError, match=r"^gpt_attention_fp8_linear: layer_idx 1 out of range"):
            F.gpt_attention_fp8_linear(q, k, v, pool, tables, *lens, None, None, None, None, None, *dense,
                                       **{**attrs, "layer_idx": 1})


def _attention_step(specs, dtype, kv_algo, device, seed=0):
    """A step of LLaMA-8B's attention heads (32 query, 8 KV, 128 wide) over a pool of 2 layers (a
    cache of codes with kv_algo), and an o projection. -> (fresh, attrs, the dense's operands):
    fresh() gives the 13 attention operands over new copies of the packed q / k / v and the pool,
    which the op writes (the pool, and q / k rotated in place on some paths)."""
    from tests.ops.test_attention_kv_quant import code_pool, step_inputs
    heads, kv_heads, head_dim, tpb = 32, 8, 128, 16
    gen = torch.Generator().manual_seed(seed)
    step = step_inputs(specs, heads, kv_heads, head_dim, tpb, dtype, gen, device)
    shape = (2, step["num_blocks"], 2, kv_heads, tpb, head_dim)
    kv_scale = None
    if kv_algo is None:
        pool = torch.randn(shape, generator=gen).to(dtype).to(device)
    else:
        kv_scale = torch.tensor([0.02, 0.015])
        pool = code_pool(shape, kv_algo, kv_scale, gen).to(device)
        kv_scale = kv_scale.to(device)
    cos_sin = F.rope_cos_sin_cache(max(p + n for p, n in specs) + 8, head_dim).to(device)

    def fresh():
        q, k, v = step["qkv"].clone().split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)
        return [q, k, v, pool.clone(), step["tables"], step["lengths"], step["new"], step["host_new"], None,
                step["positions"], cos_sin, step["host_lengths"], kv_scale]
    attrs = dict(layer_idx=1, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, tokens_per_block=tpb,
                 rotary_dim=head_dim)
    _, _, (qw, ws, xs) = _layer(4096, heads * head_dim, False, True, torch.full((1,), 2.0), seed=seed, device=device)
    bias = (torch.randn(4096, generator=gen) * 0.1).to(dtype).to(device) if seed % 2 else None
    return fresh, attrs, [qw, ws, xs, bias]


@pytest.mark.parametrize("specs", [[(5, 1), (17, 1), (8, 1)], [(4, 1), (11, 6), (0, 5)]], ids=["decode", "mixed"])
def test_attention_fp8_linear_is_the_attention_then_the_linear_on_the_cpu(specs):
    from tensorrt_llm.ops.attention import gpt_attention_cpu, gpt_attention_reference
    from tensorrt_llm.ops.fp8_linear import gpt_attention_fp8_linear_cpu, gpt_attention_fp8_linear_reference
    fresh, attrs, dense = _attention_step(specs, torch.float32, None, "cpu")
    for fused, unfused, linear in ((gpt_attention_fp8_linear_reference, gpt_attention_reference, fp8_linear_reference),
                                   (gpt_attention_fp8_linear_cpu, gpt_attention_cpu, fp8_linear_cpu)):
        a, b = fresh(), fresh()
        assert torch.equal(fused(*a, *dense, **attrs), linear(unfused(*b, **attrs), *dense))
        assert torch.equal(a[3], b[3])


@pytest.mark.gpu
@pytest.mark.parametrize("kv_algo", [None, "FP8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("specs", [
    [(40, 1)] * 3,                                         # the FP8 GEMV's rows
    [(40, 1)] * FP8_GEMV_MAX_ROWS,
    [(40 + 9 * i, 1) for i in range(FP8_GEMV_MAX_ROWS + 1)],  # the decode kernel writes the codes
    [(100 + 37 * i, 1) for i in range(32)],
    [(3, 1), (30, 5), (0, 9)] * 4,                          # a mixed step: the two CUDA ops
], ids=["decode3", "decode8", "decode9", "decode32", "mixed"])
def test_attention_fp8_linear_cuda_is_the_two_cuda_ops(specs, dtype, kv_algo):
    """gpt_attention_fp8_linear's CUDA implementation gives gpt_attention's then fp8_linear's CUDA
    numbers and cache bit for bit, on each path; near the reference."""
    from tensorrt_llm.ops.attention_cuda import gpt_attention_cuda
    from tensorrt_llm.ops.fp8_linear import gpt_attention_fp8_linear_cuda, gpt_attention_fp8_linear_reference
    fresh, attrs, dense = _attention_step(specs, dtype, kv_algo, "cuda", seed=len(specs))
    a, b, r = fresh(), fresh(), fresh()
    got = gpt_attention_fp8_linear_cuda(*a, *dense, **attrs)
    want = fp8_linear_cuda(gpt_attention_cuda(*b, **attrs), *dense)
    assert torch.equal(got, want)
    assert torch.equal(a[3], b[3])
    ref = gpt_attention_fp8_linear_reference(*r, *dense, **attrs)
    assert (got.float() - ref.float()).norm() <= 0.05 * ref.float().norm()


@pytest.mark.gpu
def test_attention_fp8_linear_replays_in_a_cuda_graph():
    from tensorrt_llm.ops.attention_cuda import gpt_attention_cuda
    from tensorrt_llm.ops.fp8_linear import gpt_attention_fp8_linear_cuda
    fresh, attrs, dense = _attention_step([(60 + 5 * i, 1) for i in range(16)], torch.bfloat16, None, "cuda")
    gpt_attention_fp8_linear_cuda(*fresh(), *dense, **attrs)  # warm-up outside the graph
    torch.cuda.synchronize()
    a = fresh()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gpt_attention_fp8_linear_cuda(*a, *dense, **attrs)
    a[0].copy_(torch.randn_like(a[0]))  # a new step's queries
    graph.replay()
    torch.cuda.synchronize()
    b = fresh()
    b[0].copy_(a[0])
    assert torch.equal(y, fp8_linear_cuda(gpt_attention_cuda(*b, **attrs), *dense))
