"""GPTQ (quantization/gptq.py): against a plain reference of the paper's update (the inverse
Hessian of the remaining columns recomputed at every step), exactly round-to-nearest when H is
the identity, a smaller layer output error than round-to-nearest on correlated inputs in every
format, and the Hessians of a calibration run (models/calibrate.collect_hessians)."""
import pytest
import torch

from tensorrt_llm.quantization import QuantAlgo, QuantConfig
from tensorrt_llm.quantization.formats import dequantize, quantize_fp8, quantize_int4, quantize_int8
from tensorrt_llm.quantization.gptq import (
    HessianAccumulator,
    fp8_grid,
    gptq,
    int4_grid,
    int8_grid,
    layer_error,
    quantize_gptq,
    rtn,
)

LINEAR = "transformer.layers.0.mlp.fc"


def layer(algo, group_size=None):
    return QuantConfig(quant_algo=algo, group_size=group_size).layer(LINEAR)


FORMATS = {  # name -> (LayerQuant, quantize_gptq kwargs, the round-to-nearest quantizer)
    "int8": (layer(QuantAlgo.W8A16), {}, lambda w: quantize_int8(w)),
    "int8_g32": (layer(QuantAlgo.W8A16, 32), {}, lambda w: quantize_int8(w, 32)),
    "int4_g32": (layer(QuantAlgo.W4A16, 32), {}, lambda w: quantize_int4(w, 32)),
    "int4_g64": (layer(QuantAlgo.W4A16, 64), {}, lambda w: quantize_int4(w, 64)),
    "fp8": (layer(QuantAlgo.FP8), {}, lambda w: quantize_fp8(w)),
    "fp8_per_channel": (layer(QuantAlgo.FP8), {"per_channel": True}, lambda w: quantize_fp8(w, per_channel=True)),
}


def correlated(rows, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    mix = torch.eye(k) + 0.5 * torch.randn(k, k, generator=g) / k ** 0.5
    scale = torch.exp(torch.randn(k, generator=g))  # uneven input magnitudes, as in real layers
    return (torch.randn(rows, k, generator=g) @ mix) * scale


def hessian(x):
    acc = HessianAccumulator(x.shape[1])
    acc.add(x)
    return acc.hessian()


def reference_gptq(w, h, grid, damp=0.01):
    """The paper's update without its Cholesky / lazy-batch reformulation: at each column q,
    the inverse of the damped Hessian restricted to the columns not yet quantized (q included)
    is computed afresh, and w_F -= (w_q - quant(w_q)) / [H_F^-1]_qq * [H_F^-1]_{:,q}."""
    w = w.double().clone()
    h = h.double() + damp * torch.mean(torch.diag(h.double())) * torch.eye(h.shape[0], dtype=torch.float64)
    k = w.shape[1]
    q = torch.zeros_like(w)
    for col in range(k):
        if grid.group_size is not None and col % grid.group_size == 0:
            grid.fit(w[:, col:col + grid.group_size].float(), col)
        q[:, col] = grid.round(w[:, col].float(), col).double()
        hinv = torch.linalg.inv(h[col:, col:])
        w[:, col:] -= ((w[:, col] - q[:, col]) / hinv[0, 0])[:, None] * hinv[0][None, :]
    return q.float()


@pytest.mark.parametrize("make_grid", [
    lambda w: fp8_grid(w.abs().amax().reshape(1) / 448),
    lambda w: int8_grid(w),
    lambda w: int4_grid(w, 32),
], ids=["fp8", "int8", "int4_g32"])
def test_matches_the_plain_reference(make_grid):
    x, w = correlated(256, 64, seed=1), torch.randn(16, 64, generator=torch.Generator().manual_seed(2))
    h = hessian(x)
    ours = gptq(w, h, make_grid(w), block_size=16)
    ref = reference_gptq(w, h, make_grid(w))
    # float32 Cholesky against float64 inverses: a rare tie may round the other way and carry on
    # along its row; the rest is the same grid point.
    assert (ours == ref).float().mean() > 0.97
    assert layer_error(x, w, ours) == pytest.approx(layer_error(x, w, ref), rel=0.05)


def test_lazy_blocks_do_not_change_the_result():
    x, w = correlated(256, 128, seed=3), torch.randn(24, 128, generator=torch.Generator().manual_seed(4))
    h = hessian(x)
    one = gptq(w, h, int4_grid(w, 32), block_size=128)
    many = gptq(w, h, int4_grid(w, 32), block_size=32)
    assert (one == many).float().mean() > 0.99


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_identity_hessian_is_round_to_nearest(fmt):
    lq, kwargs, rtn_quantizer = FORMATS[fmt]
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(5)) * 0.05
    ours, nearest = quantize_gptq(w, torch.eye(128), lq, **kwargs), rtn_quantizer(w)
    assert type(ours) is type(nearest)
    for field in ("qweight", "scales", "zeros", "scale"):
        if hasattr(nearest, field):
            assert torch.equal(getattr(ours, field), getattr(nearest, field)), field


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_smaller_output_error_than_round_to_nearest(fmt):
    lq, kwargs, rtn_quantizer = FORMATS[fmt]
    x = correlated(512, 128, seed=6)
    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(7)) * 0.05
    ours = dequantize(quantize_gptq(w, hessian(x), lq, **kwargs))
    assert layer_error(x, w, ours) < 0.85 * layer_error(x, w, dequantize(rtn_quantizer(w)))


def test_rtn_helper_is_the_formats_quantizer():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(8))
    assert torch.equal(rtn(w, int4_grid(w, 32)), dequantize(quantize_int4(w, 32)))


def test_dead_inputs_and_fp8_inputs():
    x = correlated(128, 64, seed=9)
    x[:, 5] = 0  # an input that never fires
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(10))
    q = quantize_gptq(w, hessian(x), layer(QuantAlgo.FP8), input_scale=torch.tensor([0.5]))
    assert float(q.input_scale) == 0.5 and float(dequantize(q)[:, 5].abs().max()) == 0
    assert torch.isfinite(dequantize(q)).all()


def test_hessian_accumulator_is_two_xtx_over_n():
    x = correlated(100, 16, seed=11)
    acc = HessianAccumulator(16)
    acc.add(x[:30])
    acc.add(x[30:].reshape(10, 7, 16))
    torch.testing.assert_close(acc.hessian(), 2 * x.t() @ x / 100, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_collect_hessians_on_a_gpu_equals_the_cpu():
    """A GPU calibration sums X^T X on the GPU (the inputs never leave it): the same Hessians,
    float and sequential, up to float32 summation order; `hessian()` is on the CPU."""
    from tensorrt_llm.models.calibrate import collect_hessians

    from ..models.llama_utils import random_hf_llama
    samples = [list(range(1, 12)), list(range(40, 49))]
    def quantizer(name, w, h):  # as quantize.py's: rounds on the CPU, collect_hessians moves it back
        w = w.cpu()
        return rtn(w, int4_grid(w, 32))

    for sequential in (None, quantizer):
        cpu = collect_hessians(random_hf_llama(seed=0), samples, sequential)
        gpu = collect_hessians(random_hf_llama(seed=0).cuda(), samples, sequential)
        assert set(gpu) == set(cpu)
        for name in cpu:
            assert gpu[name].device.type == "cpu"
            torch.testing.assert_close(gpu[name], cpu[name], rtol=1e-3, atol=1e-4)


def test_bad_input_is_one_line():
    w = torch.randn(4, 32)
    with pytest.raises(ValueError, match=r"GPTQ: a \[N, K\] weight and a \[K, K\] Hessian"):
        gptq(w, torch.eye(16), int8_grid(w))
    with pytest.raises(ValueError, match="damp must be >= 0"):
        gptq(w, torch.eye(32), int8_grid(w), damp=-1)
    with pytest.raises(ValueError, match="non-finite"):
        gptq(w, torch.full((32, 32), float("nan")), int8_grid(w))
    with pytest.raises(ValueError, match="not positive definite"):
        gptq(w, -torch.eye(32), int8_grid(w), damp=0)
    with pytest.raises(ValueError, match="no inputs were added"):
        HessianAccumulator(4).hessian()
    with pytest.raises(ValueError, match="not a multiple of the group size 64"):
        quantize_gptq(torch.randn(4, 96), torch.eye(96), layer(QuantAlgo.W4A16, 64))


def test_collect_hessians_float_and_sequential():
    from tensorrt_llm.models.calibrate import collect_hessians

    from ..models.llama_utils import random_hf_llama
    model = random_hf_llama(seed=0)
    samples = [list(range(1, 12)), list(range(40, 49))]
    float_h = collect_hessians(model, samples)
    names = {f"transformer.layers.{i}.{m}" for i in range(2)
             for m in ("attention.qkv", "attention.dense", "mlp.gate", "mlp.fc", "mlp.proj")}
    assert set(float_h) == names
    assert float_h["transformer.layers.1.mlp.proj"].shape == (160, 160)
    assert float_h["transformer.layers.0.mlp.gate"] is float_h["transformer.layers.0.mlp.fc"]
    # Sequential with a quantizer that changes nothing sees the float model's inputs.
    same = collect_hessians(model, samples, quantize_group=lambda name, w, h: w)
    for name in names:
        torch.testing.assert_close(same[name], float_h[name], rtol=1e-4, atol=1e-5)
    # A real quantizer changes the later layers' inputs (and the model's weights).
    w0 = model.model.layers[1].mlp.down_proj.weight.clone()
    seq = collect_hessians(model, samples, quantize_group=lambda name, w, h: rtn(w, int4_grid(w, 32)))
    torch.testing.assert_close(seq["transformer.layers.0.attention.qkv"], float_h["transformer.layers.0.attention.qkv"])
    assert not torch.allclose(seq["transformer.layers.1.mlp.proj"], float_h["transformer.layers.1.mlp.proj"])
    assert not torch.equal(model.model.layers[1].mlp.down_proj.weight, w0)


@pytest.mark.parametrize("fmt", ["int4_g32", "int8_g32", "fp8"])
def test_act_order_static_groups(fmt):
    """Act-order walks the inputs by decreasing H[k, k] on round-to-nearest's group scales: the
    same grid as RTN (scales, zeros), no permutation stored, a smaller error than RTN, and
    exactly gptq() of the permuted inputs on that grid."""
    lq, kwargs, rtn_quantizer = FORMATS[fmt]
    x = correlated(512, 128, seed=12)
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(13)) * 0.05
    h = hessian(x)
    q, nearest = quantize_gptq(w, h, lq, act_order=True, **kwargs), rtn_quantizer(w)
    for field in ("scales", "zeros", "scale"):
        if hasattr(nearest, field):
            assert torch.equal(getattr(q, field), getattr(nearest, field)), field
    assert getattr(q, "perm", None) is None
    assert layer_error(x, w, dequantize(q)) < 0.85 * layer_error(x, w, dequantize(nearest))
    if fmt == "fp8":  # no groups: act-order is gptq() of the permuted layer
        perm = torch.sort(torch.diag(h), descending=True, stable=True).indices
        permuted = dequantize(quantize_gptq(w[:, perm], h[perm][:, perm], lq))
        torch.testing.assert_close(dequantize(q)[:, perm], permuted, rtol=0, atol=0)
