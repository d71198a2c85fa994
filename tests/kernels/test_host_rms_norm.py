"""The host (CPU) RMSNorm, cpp/kernels/host_rms_norm.cpp, through the CPU implementations of
rms_norm and fused_add_rms_norm, against their PyTorch references on random data."""
import pytest
import torch

from tensorrt_llm.ops.launch import bindings_available, launch
from tensorrt_llm.ops.norm import (
    fused_add_rms_norm_cpu,
    fused_add_rms_norm_reference,
    rms_norm_cpu,
    rms_norm_reference,
)

pytestmark = pytest.mark.skipif(not bindings_available(), reason="needs the compiled bindings")


@pytest.mark.parametrize("shape", [(1, 576), (3, 5, 64), (7, 4096), (2, 1)])
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_cpu_norms_match_the_references(shape, eps):
    torch.manual_seed(shape[-1] + len(shape))
    x, residual = torch.randn(shape) * 3, torch.randn(shape)
    weight = torch.randn(shape[-1])
    torch.testing.assert_close(rms_norm_cpu(x, weight, eps=eps), rms_norm_reference(x, weight, eps=eps))
    out, total = fused_add_rms_norm_cpu(x, residual, weight, eps=eps)
    ref_out, ref_total = fused_add_rms_norm_reference(x, residual, weight, eps=eps)
    assert torch.equal(total, ref_total)  # one float32 add either way
    torch.testing.assert_close(out, ref_out)


def test_strided_rows_and_other_dtypes():
    torch.manual_seed(1)
    wide = torch.randn(4, 96)
    x = wide[:, :64]  # rows 96 apart
    weight = torch.randn(64)
    torch.testing.assert_close(rms_norm_cpu(x, weight, eps=1e-6), rms_norm_reference(x, weight, eps=1e-6))
    xb, wb = x.bfloat16(), weight.bfloat16()  # not the kernel's: the reference, bit for bit
    assert torch.equal(rms_norm_cpu(xb, wb, eps=1e-6), rms_norm_reference(xb, wb, eps=1e-6))
    assert torch.equal(rms_norm_cpu(x, None, eps=1e-6), rms_norm_reference(x, None, eps=1e-6))


def test_the_kernel_refuses_mismatched_operands():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="weight"):
        launch("host_rms_norm", torch.empty(2, 8), x, torch.randn(7), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        launch("host_rms_norm", torch.empty(2, 8), x, torch.randn(8), 1e-6, residual=torch.randn(2, 8))
    with pytest.raises(TypeError, match="float16"):
        launch("host_rms_norm", torch.empty(2, 8).half(), x.half(), torch.randn(8).half(), 1e-6)
