"""The CPU weight-only linears (torch's int4pack / int8pack kernels) against the reference.

Tolerance: the kernels run on bfloat16 activations, scales and zeros, accumulate in float32
and round the output to bfloat16. Against `quantized_linear_reference` (float32 throughout)
the error is bounded at 2% of the output's largest magnitude; against a float32 emulation of
those bfloat16 roundings it is within the output's own bfloat16 rounding (2^-8 relative,
plus accumulation-order noise), which pins the layout: a wrong nibble or group is far off.
"""
import pytest
import torch

from tensorrt_llm.quantization.cpu import (
    ACT_DTYPE,
    CpuInt8Pack,
    CpuInt8SplitPack,
    int4_weight_only_linear,
    int8_weight_only_linear,
    pack_int4_for_cpu,
    pack_int8_for_cpu,
)
from tensorrt_llm.quantization.formats import (
    Int4Weight,
    Int8Weight,
    dequantize,
    pack_int4,
    quantize_int4,
    quantize_int8,
    quantized_linear_reference,
    unpack_int4,
)

REL = 0.02


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def random_int4(n, k, group, scale_dtype=torch.float16, perm=False):
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scales = (torch.rand(n, k // group) * 0.02 + 0.002).to(scale_dtype)
    zeros = (-scales.float() * torch.randint(4, 12, (n, k // group)) + torch.randn(n, k // group) * 1e-3)
    return Int4Weight(pack_int4(codes), scales, zeros.to(scale_dtype), group, torch.randperm(k) if perm else None)


def close(y, ref, rel=REL):
    assert y.shape == ref.shape and y.dtype == ref.dtype
    err = (y.float() - ref.float()).abs().max()
    assert err <= rel * ref.float().abs().max(), f"max error {err} vs max |ref| {ref.abs().max()}"


def bf16_emulation_int4(x, w: Int4Weight):
    """What the kernel computes, in float32: bfloat16 x, scale and zero' = zero + 8 * scale."""
    s = w.scales.float().to(ACT_DTYPE).float().repeat_interleave(w.group_size, 1)
    z = (w.zeros.float() + 8 * w.scales.float()).to(ACT_DTYPE).float().repeat_interleave(w.group_size, 1)
    stored = (unpack_int4(w.qweight).float() - 8) * s + z
    xb = x.to(ACT_DTYPE).float()
    if w.perm is not None:
        xb = xb[..., w.perm]
    return xb @ stored.t()


@pytest.mark.parametrize("n,k,group", [(64, 256, 32), (40, 576, 64), (96, 1536, 128), (8, 128, 64)])
@pytest.mark.parametrize("rows", [1, 5])
def test_int4_linear_matches_the_reference(n, k, group, rows):
    w = random_int4(n, k, group)
    x = torch.randn(rows, k)
    y = int4_weight_only_linear(x, w)
    close(y, quantized_linear_reference(x, w))
    emu = bf16_emulation_int4(x, w)
    assert (y - emu).abs().max() <= 2.0 ** -7 * emu.abs().max()


def test_int4_linear_with_perm_bias_3d_input_and_bf16():
    w = random_int4(48, 256, 64, scale_dtype=torch.float32, perm=True)
    pack = pack_int4_for_cpu(w)
    x = torch.randn(2, 3, 256)
    bias = torch.randn(48)
    y = int4_weight_only_linear(x, pack, bias)
    assert y.shape == (2, 3, 48)
    close(y, quantized_linear_reference(x, w, bias))
    yb = int4_weight_only_linear(x.bfloat16(), pack)
    assert yb.dtype == torch.bfloat16
    close(yb.float(), quantized_linear_reference(x, w))
    assert torch.equal(int4_weight_only_linear(x, pack, bias), y)  # the pack is reusable


def test_int4_linear_on_quantized_float_weights():
    w = torch.randn(192, 576) * 0.05
    q = quantize_int4(w, 64)
    x = torch.randn(1, 576)
    close(int4_weight_only_linear(x, q), quantized_linear_reference(x, q))
    close(int4_weight_only_linear(x, q), x @ w.t(), rel=0.1)  # INT4 itself is ~5% off


@pytest.mark.parametrize("n,k", [(64, 256), (40, 576), (576, 1536)])
@pytest.mark.parametrize("rows", [1, 4])
def test_int8_linear_matches_the_reference(n, k, rows):
    w = quantize_int8(torch.randn(n, k))
    x = torch.randn(rows, k)
    close(int8_weight_only_linear(x, w), quantized_linear_reference(x, w))
    bias = torch.randn(n)
    close(int8_weight_only_linear(x, pack_int8_for_cpu(w), bias), quantized_linear_reference(x, w, bias))


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("n", [64, 40])
def test_group_wise_int8_runs_as_two_exact_int4_halves(group, n):
    # GGUF Q8_0-like: one float16 scale per group, codes over the whole int8 range
    q = torch.randint(-128, 128, (n, 256), dtype=torch.int8)
    scales = (torch.rand(n, 256 // group) * 0.01 + 1e-4).half()
    w = Int8Weight(q, scales, group)
    pack = pack_int8_for_cpu(w)
    assert isinstance(pack, CpuInt8SplitPack) and pack.out_features == n
    x = torch.randn(3, 256)
    y = int8_weight_only_linear(x, pack)
    close(y, quantized_linear_reference(x, w))
    # the weight is exact but for the bfloat16 scale: emulate that, the error is the outputs' rounding
    emu = x.bfloat16().float() @ (q.float() * scales.float().bfloat16().float().repeat_interleave(group, 1)).t()
    assert (y - emu).abs().max() <= 2.0 ** -7 * emu.abs().max()
    assert torch.equal(int8_weight_only_linear(x, w), y)


def test_group_16_int8_is_requantized_per_row_within_half_a_step():
    # GGUF Q6_K-like: group 16, below the INT4 kernel's smallest group
    q = torch.randint(-32, 32, (64, 256), dtype=torch.int8)
    scales = torch.rand(64, 16) * 0.01 + 1e-4
    w = Int8Weight(q, scales, 16)
    pack = pack_int8_for_cpu(w)
    assert isinstance(pack, CpuInt8Pack) and pack.scales.shape == (64,)
    requantized = pack.qweight.float() * pack.scales.float()[:, None]
    step = pack.scales.float()[:, None]
    assert bool(((requantized - dequantize(w)).abs() <= step / 2 * 1.01).all())
    x = torch.randn(3, 256)
    close(int8_weight_only_linear(x, w), quantized_linear_reference(x, w))


def test_a_wrong_input_width_is_refused():
    w = random_int4(16, 128, 32)
    with pytest.raises(ValueError, match="input has 64 features; the weight takes 128"):
        int4_weight_only_linear(torch.randn(1, 64), w)
    with pytest.raises(ValueError, match="input has 64 features"):
        int8_weight_only_linear(torch.randn(1, 64), quantize_int8(torch.randn(16, 128)))
