"""The host (CPU) SiLU-and-mul, cpp/kernels/host_activation.cpp, through silu_and_mul's CPU
implementation, against its PyTorch reference on random data (e^-g by a polynomial in 8 lanes,
std::exp for a row's last elements), and the CPU's fused linears applying it alike."""
import pytest
import torch

from tensorrt_llm.ops.activation import silu_and_mul_cpu, silu_and_mul_reference
from tensorrt_llm.ops.launch import bindings_available, launch

pytestmark = pytest.mark.skipif(not bindings_available(), reason="needs the compiled bindings")


@pytest.mark.parametrize("shape", [(1, 3072), (3, 5, 46), (7, 2 * 1536), (2, 2)])
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_cpu_silu_and_mul_matches_the_reference(shape, scale):
    torch.manual_seed(shape[-1] + len(shape))
    x = torch.randn(shape) * scale
    # float32 within a few ulp: the exponential's error is at most 2 ulp, then a division and a product
    torch.testing.assert_close(silu_and_mul_cpu(x), silu_and_mul_reference(x), rtol=4e-7, atol=1e-30)


def test_extreme_gates_are_finite():
    """Gates beyond e^-g's range (g below -87 or above 88) give silu's limits, no inf or NaN."""
    g = torch.tensor([-1e30, -200.0, -90.0, -88.0, -87.0, 0.0, 87.0, 89.0, 200.0, 1e30] * 2)
    x = torch.cat([g, torch.full_like(g, 2.0)]).view(1, -1)
    out = silu_and_mul_cpu(x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, silu_and_mul_reference(x), rtol=4e-7, atol=1e-30)


def test_strided_rows_and_other_dtypes():
    torch.manual_seed(2)
    wide = torch.randn(4, 80)
    x = wide[:, :64]  # rows 80 apart
    torch.testing.assert_close(silu_and_mul_cpu(x), silu_and_mul_reference(x), rtol=4e-7, atol=1e-30)
    xb = x.bfloat16()  # not the kernel's: the reference, bit for bit
    assert torch.equal(silu_and_mul_cpu(xb), silu_and_mul_reference(xb))


def test_the_kernel_refuses_mismatched_operands():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="out"):
        launch("host_silu_and_mul", torch.empty(2, 3), x)
    with pytest.raises(ValueError, match="even"):
        launch("host_silu_and_mul", torch.empty(2, 3), torch.randn(2, 7))
    with pytest.raises(TypeError, match="float16"):
        launch("host_silu_and_mul", torch.empty(2, 4).half(), x.half())
