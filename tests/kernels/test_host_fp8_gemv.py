"""The host (CPU) FP8 GEMV, cpp/kernels/host_fp8_gemv.cpp, against a plain float64 reference of what
it computes: (x's E4M3 values @ W's E4M3 values^T) * input scale * weight scale + bias, on random
data holding every E4M3 code but NaN (subnormals, both zeros, +-448), and fp8_linear's CPU
implementation (which takes it for decode rows) against fp8_linear's reference."""
import pytest
import torch

from tensorrt_llm.ops.fp8_linear import HOST_FP8_GEMV_MAX_ROWS, fp8_linear_cpu, fp8_linear_reference
from tensorrt_llm.ops.launch import bindings_available, get_bindings, launch, tensor_arg
from tensorrt_llm.quantization.formats import FP8_DTYPE, quantize_fp8_activation

pytestmark = pytest.mark.skipif(not bindings_available() or not get_bindings().host_fp8_gemv_available(),
                                reason="needs the compiled bindings on a CPU with AVX2 and FMA")

CODES = torch.arange(256, dtype=torch.uint8)
CODES = CODES[~torch.isnan(CODES.view(FP8_DTYPE).float())]  # 254: all but 0x7F and 0xFF


def random_codes(shape, gen) -> torch.Tensor:
    return CODES[torch.randint(0, len(CODES), shape, generator=gen)].contiguous()


def values(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(FP8_DTYPE).double()


@pytest.mark.parametrize("n,k", [(96, 1024), (37, 576), (1003, 64), (5, 8)])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 8])
@pytest.mark.parametrize("per_channel,per_token", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("threads", [1, 3])
def test_matches_the_float64_reference_on_every_code(n, k, m, per_channel, per_token, threads):
    gen = torch.Generator().manual_seed(n + 7 * k + 31 * m)
    w, xc = random_codes((n, k), gen), random_codes((m, k), gen)
    weight_scale = torch.rand(n if per_channel else 1, generator=gen) * 0.01 + 1e-4
    input_scale = torch.rand(m if per_token else 1, generator=gen) * 0.1 + 1e-3
    bias = torch.randn(n, generator=gen)
    out = torch.full((m, n), float("nan"))
    launch("host_fp8_gemv", out, values(xc).float(), w, weight_scale, input_scale, bias, threads)
    sums = values(xc) @ values(w).T
    expected = sums * input_scale.double()[:, None] * weight_scale.double()[None, :] + bias.double()
    # float32 sums of exact products over 8 lanes: a few float32 roundings of the sum of magnitudes.
    magnitude = (values(xc).abs() @ values(w).abs().T) * input_scale.double()[:, None] * weight_scale.double()
    tol = (k / 8 + 8) * 2.0 ** -24 * magnitude + 2.0 ** -23 * expected.abs() + 1e-30
    err = (out.double() - expected).abs()
    assert bool((err <= tol).all()), f"error {err.max():.3g} over {tol.flatten()[int((err - tol).argmax())]:.3g}"


def test_rows_together_and_threads_give_each_rows_own_bits():
    """A pass over W serves up to 4 rows of x: each output is the same sum in the same order as the
    row's own call, on one thread or three."""
    gen = torch.Generator().manual_seed(3)
    n, k, m = 530, 576, 7
    w, x = random_codes((n, k), gen), values(random_codes((m, k), gen)).float()
    ws, xs = torch.tensor([0.01]), torch.tensor([0.02])
    together = torch.empty(m, n)
    launch("host_fp8_gemv", together, x, w, ws, xs, None, 3)
    for r in range(m):
        alone = torch.empty(1, n)
        launch("host_fp8_gemv", alone, x[r:r + 1].clone(), w, ws, xs, None, 1)
        assert torch.equal(together[r], alone[0]), f"row {r}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("static", [True, False])
def test_the_cpu_op_takes_it_for_decode_rows_and_the_reference_beyond(dtype, static):
    gen = torch.Generator().manual_seed(5)
    n, k = 96, 256
    w = random_codes((n, k), gen)
    weight_scale = torch.tensor([0.004])
    input_scale = torch.tensor([0.01]) if static else None
    bias = torch.randn(n, generator=gen).to(dtype)
    for m in (1, HOST_FP8_GEMV_MAX_ROWS, HOST_FP8_GEMV_MAX_ROWS + 1):
        x = torch.randn(2, m, k, generator=gen).to(dtype)[1]  # a view: rows of x as the graph hands them
        got = fp8_linear_cpu(x, w, weight_scale, input_scale, bias)
        want = fp8_linear_reference(x, w, weight_scale, input_scale, bias)
        assert got.dtype == dtype and got.shape == (m, n)
        if m > HOST_FP8_GEMV_MAX_ROWS:
            assert torch.equal(got, want)  # the reference itself
            continue
        codes, scale = quantize_fp8_activation(x, input_scale)
        direct = torch.empty(m, n)
        launch("host_fp8_gemv", direct, codes.float(), w, weight_scale, scale.reshape(-1).contiguous(),
               bias.float(), 1)
        assert torch.equal(got, direct.to(dtype))
        # The reference's result up to float32 roundings, then rounded to x's dtype.
        eps = torch.finfo(dtype).eps if dtype != torch.float32 else 2.0 ** -20
        assert (got.float() - want.float()).abs().max() <= eps * want.float().abs().max()


def test_refusals_name_the_argument():
    b = get_bindings()
    w, x, out = torch.zeros(16, 64, dtype=torch.uint8), torch.zeros(2, 64), torch.empty(2, 16)
    ws, xs = torch.ones(1), torch.ones(1)
    args = [tensor_arg(t) for t in (out, x, w)]
    with pytest.raises(ValueError, match=r"^host_fp8_gemv: no kernel for in_features 60 \(a multiple of 8\)$"):
        b.host_fp8_gemv(tensor_arg(out), tensor_arg(torch.zeros(2, 60)),
                        tensor_arg(torch.zeros(16, 60, dtype=torch.uint8)), tensor_arg(ws), tensor_arg(xs), None, 1)
    with pytest.raises(ValueError, match=r"^host_fp8_gemv: weight_scale .* must hold 1 or 16 scales"):
        b.host_fp8_gemv(*args, tensor_arg(torch.ones(3)), tensor_arg(xs), None, 1)
    with pytest.raises(ValueError, match=r"^host_fp8_gemv: input_scale .* must hold 1 or 2 scales"):
        b.host_fp8_gemv(*args, tensor_arg(ws), tensor_arg(torch.ones(5)), None, 1)
    with pytest.raises(ValueError, match=r"^host_fp8_gemv: threads must be in \[1, 1024\], got 0$"):
        b.host_fp8_gemv(*args, tensor_arg(ws), tensor_arg(xs), None, 0)
    with pytest.raises(TypeError, match=r"^host_fp8_gemv: qweight must be one of \{uint8\}, got int8$"):
        b.host_fp8_gemv(*args[:2], tensor_arg(torch.zeros(16, 64, dtype=torch.int8)), tensor_arg(ws), tensor_arg(xs),
                        None, 1)
