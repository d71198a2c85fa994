"""The internal formats: packing, quantizers against their error bounds, the reference op,
checkpoint tensors through real safetensors files, row/column operations, KV cache scales."""
import pytest
import torch
from safetensors.torch import load_file, save_file

from tensorrt_llm.errors import CheckpointError
from tensorrt_llm.quantization import LayerQuant, QuantAlgo, QuantConfig
from tensorrt_llm.quantization.formats import (
    FP8_DTYPE,
    Fp8Weight,
    Int4Weight,
    Int8Weight,
    cat_rows,
    dequantize,
    dequantize_kv,
    dequantize_rows,
    fp8_scale_from_amax,
    from_state_dict,
    kv_cache_algo_of,
    kv_cache_scale_from_amax,
    narrow_columns,
    pack_int4,
    quantize,
    quantize_fp8,
    quantize_fp8_activation,
    quantize_int4,
    quantize_int8,
    quantize_kv,
    quantized_linear_reference,
    select_rows,
    to_state_dict,
    unpack_int4,
)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def random_int4(n=48, k=256, group=64, dtype=torch.float16, perm=False) -> Int4Weight:
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scales = (torch.rand(n, k // group) * 0.02 + 0.001).to(dtype)
    zeros = (-torch.rand(n, k // group) * 0.2).to(dtype)
    return Int4Weight(pack_int4(codes), scales, zeros, group, torch.randperm(k) if perm else None)


# ------------------------------------------------------------------------------ packing

def test_int4_packing_layout():
    codes = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0]], dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.tolist() == [[0x21, 0x43, 0x65, 0x87, 0xA9, 0xCB, 0xED, 0x0F]]  # even input low
    # as little-endian int32 words: input 8w + i in bits 4i..4i+3
    words = packed.view(torch.int32)  # little-endian words
    assert words.tolist() == [[0x87654321 - 2 ** 32, 0x0FEDCBA9]]
    for w in range(2):
        for i in range(8):
            assert (int(words[0, w]) >> (4 * i)) & 15 == int(codes[0, 8 * w + i])
    assert torch.equal(unpack_int4(packed), codes)
    big = torch.randint(0, 16, (7, 96), dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(big)), big)
    with pytest.raises(ValueError):
        pack_int4(torch.tensor([[16, 0]]))
    with pytest.raises(ValueError):
        pack_int4(torch.tensor([[1, 2, 3]]))


# ------------------------------------------------------------------------------ quantizers

@pytest.mark.parametrize("group", [None, 16, 32, 128])
def test_int8_quantizer_is_within_half_a_step(group):
    w = torch.randn(40, 256) * torch.rand(40, 1) * 3
    w[3] = 0  # an all-zero row: scale 0, codes 0
    q = quantize_int8(w, group)
    assert q.qweight.dtype == torch.int8 and int(q.qweight.abs().max()) <= 127
    assert q.scales.shape == ((40,) if group is None else (40, 256 // group))
    step = q.scales.float()[:, None] if group is None else q.scales.float().repeat_interleave(group, 1)
    err = (dequantize(q) - w).abs()
    assert bool((err <= step / 2 * (1 + 1e-5) + 1e-12).all())
    assert torch.equal(dequantize(q)[3], torch.zeros(256))


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_int4_quantizer_is_within_half_a_step(group, dtype):
    w = torch.randn(24, 256) * 0.05 + 0.01
    w[:, :group] = 0.5  # a constant group: scale 0, zero 0.5, exact
    q = quantize_int4(w, group, scale_dtype=dtype)
    assert q.qweight.shape == (24, 128) and q.scales.dtype == dtype and q.zeros.dtype == dtype
    step = q.scales.float().repeat_interleave(group, 1)
    err = (dequantize(q) - w).abs()
    # half a step, plus the zero's rounding to `dtype`
    slack = 2.0 ** -11 * q.zeros.float().abs().repeat_interleave(group, 1) if dtype == torch.float16 else 1e-7
    assert bool((err <= step / 2 * (1 + 1e-3) + slack).all())
    assert torch.equal(dequantize(q)[:, :group], w[:, :group])
    with pytest.raises(ValueError, match="group size 48"):
        quantize_int4(w, 48)
    with pytest.raises(ValueError, match="multiple of the group size"):
        quantize_int4(w[:, :96], 64)
    with pytest.raises(ValueError, match="overflow float16"):
        quantize_int4(w * 1e6, group)


@pytest.mark.parametrize("per_channel", [False, True])
def test_fp8_quantizer_keeps_e4m3_precision(per_channel):
    w = torch.randn(32, 64) * torch.logspace(-2, 1, 32)[:, None]
    q = quantize_fp8(w, per_channel=per_channel)
    assert q.qweight.dtype == FP8_DTYPE and q.per_channel == per_channel
    assert q.scale.shape == ((32,) if per_channel else (1,))
    scale = q.scale[:, None] if per_channel else q.scale
    assert float((q.qweight.float().abs()).max()) <= 448
    err = (dequantize(q) - w).abs()
    # 3 mantissa bits: half an ulp is 2^-4 relative; subnormals step 2^-9 of the scale
    assert bool((err <= w.abs() * 2.0 ** -4 + scale * 2.0 ** -9).all())


def test_fp8_quantizer_scales_by_a_given_shared_amax():
    """Linears fused into one GEMM (gate and up) share one per-tensor scale, from the larger amax."""
    w = torch.randn(32, 64)
    amax = w.abs().amax() * 3
    q = quantize_fp8(w, amax=amax)
    assert torch.equal(q.scale, (amax / 448).reshape(1))
    assert bool(((dequantize(q) - w).abs() <= w.abs() * 2.0 ** -4 + q.scale * 2.0 ** -9).all())
    with pytest.raises(ValueError, match="below the weight's own"):
        quantize_fp8(w, amax=w.abs().amax() / 2)
    with pytest.raises(ValueError, match="per tensor"):
        quantize_fp8(w, per_channel=True, amax=amax)


def test_quantize_follows_the_layer_quant():
    w = torch.randn(16, 128)
    assert isinstance(quantize(w, LayerQuant(QuantAlgo.W8A16)), Int8Weight)
    assert quantize(w, LayerQuant(QuantAlgo.W8A16, 32)).group_size == 32
    assert quantize(w, LayerQuant(QuantAlgo.W4A16_AWQ, 64)).group_size == 64
    assert not quantize(w, LayerQuant(QuantAlgo.FP8)).per_channel
    assert quantize(w, LayerQuant(QuantAlgo.FP8_PER_CHANNEL_PER_TOKEN)).per_channel


# ------------------------------------------------------------------------------ the reference op

def test_reference_is_the_float32_matmul_of_the_dequantized_weight():
    x = torch.randn(5, 256)
    bias = torch.randn(48)
    for w in (random_int4(), random_int4(dtype=torch.bfloat16), quantize_int8(torch.randn(48, 256)),
              quantize_int8(torch.randn(48, 256), 32)):
        expected = x @ dequantize(w).t() + bias
        assert torch.equal(quantized_linear_reference(x, w, bias), expected)
        y16 = quantized_linear_reference(x.bfloat16(), w)
        assert y16.dtype == torch.bfloat16
        assert torch.equal(y16, (x.bfloat16().float() @ dequantize(w).t()).bfloat16())


def test_int4_dequantization_formula_and_perm():
    w = random_int4(8, 64, 32, perm=True)
    codes = unpack_int4(w.qweight).float()
    stored = codes * w.scales.float().repeat_interleave(32, 1) + w.zeros.float().repeat_interleave(32, 1)
    deq = dequantize(w)
    assert torch.equal(deq[:, w.perm], stored)  # stored column j is input perm[j]
    x = torch.randn(3, 64)
    assert torch.allclose(quantized_linear_reference(x, w), x[:, w.perm] @ stored.t(), atol=1e-5)


@pytest.mark.parametrize("static", [True, False])
def test_fp8_reference_quantizes_the_activation(static):
    w = torch.randn(32, 64) * 0.1
    x = torch.randn(4, 64) * torch.tensor([[0.1], [1.0], [10.0], [0.0]])
    input_scale = fp8_scale_from_amax(x.abs().max()) if static else None
    q = quantize_fp8(w, per_channel=not static, input_scale=input_scale)
    qx, sx = quantize_fp8_activation(x, q.input_scale)
    assert qx.dtype == FP8_DTYPE
    assert sx.shape == ((1,) if static else (4, 1))
    y = quantized_linear_reference(x, q)
    assert torch.equal(y, (qx.float() * sx) @ dequantize(q).t())
    assert torch.equal(y[3], torch.zeros(32))  # a zero token: scale guarded, output zero
    exact = x @ w.t()
    assert (y - exact).abs().max() <= 0.1 * exact.abs().max()
    if not static:  # a per-token scale keeps the small token's precision
        assert (y[0] - exact[0]).abs().max() <= 0.1 * exact[0].abs().max()


# ------------------------------------------------------------------------------ validation

def one_line_error(fn, *words):
    with pytest.raises(CheckpointError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_formats_refuse_bad_tensors_naming_them():
    good = random_int4(16, 64, 32)
    one_line_error(lambda: Int4Weight(good.qweight, good.scales[:, :1], good.zeros, 32),
                   "weight_scale has shape [16, 1]; expected [16, 2]", "group 32")
    one_line_error(lambda: Int4Weight(good.qweight, good.scales, good.zeros.float(), 32),
                   "weight_zero has dtype float32; expected float16")
    one_line_error(lambda: Int4Weight(good.qweight.to(torch.int8), good.scales, good.zeros, 32),
                   "weight has dtype int8; expected uint8")
    one_line_error(lambda: Int4Weight(good.qweight, good.scales, good.zeros, 16), "group size 16")
    one_line_error(lambda: Int4Weight(good.qweight, good.scales, good.zeros, 32, torch.zeros(64, dtype=torch.long)),
                   "weight_perm is not a permutation")
    one_line_error(lambda: Int8Weight(torch.zeros(4, 64, dtype=torch.int8), torch.ones(5)),
                   "weight_scale has shape [5]; expected [4]")
    one_line_error(lambda: Int8Weight(torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 2), 48), "group size 48")
    one_line_error(lambda: Int8Weight(torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 2, dtype=torch.int32), 32),
                   "weight_scale has dtype int32")
    one_line_error(lambda: Fp8Weight(torch.zeros(4, 8).to(FP8_DTYPE), torch.ones(3)),
                   "weight_scale has shape [3]; expected [1] (per tensor) or [4]")
    one_line_error(lambda: Fp8Weight(torch.zeros(4, 8).to(FP8_DTYPE), torch.ones(1), torch.ones(2)),
                   "input_scale has shape [2]; expected [1]")


# ------------------------------------------------------------------------------ checkpoint tensors

def weights_for_checkpoint():
    w = torch.randn(32, 128)
    return {
        "a.int8": (quantize_int8(w), LayerQuant(QuantAlgo.W8A16)),
        "a.int8g": (quantize_int8(w, 32), LayerQuant(QuantAlgo.W8A16, 32)),
        "a.int4": (quantize_int4(w, 64), LayerQuant(QuantAlgo.W4A16, 64)),
        "a.int4perm": (random_int4(32, 128, 32, torch.float32, perm=True), LayerQuant(QuantAlgo.W4A16_GPTQ, 32)),
        "a.fp8": (quantize_fp8(w, input_scale=0.02), LayerQuant(QuantAlgo.FP8)),
        "a.fp8pc": (quantize_fp8(w, per_channel=True), LayerQuant(QuantAlgo.FP8_PER_CHANNEL_PER_TOKEN)),
    }


def test_checkpoint_tensors_survive_a_safetensors_file(tmp_path):
    weights = weights_for_checkpoint()
    tensors = {}
    for prefix, (w, _) in weights.items():
        tensors.update(to_state_dict(w, prefix))
    assert tensors["a.int4perm.weight_perm"].dtype == torch.int64
    assert tensors["a.fp8.input_scale"].shape == (1,)
    save_file(tensors, str(tmp_path / "rank0.safetensors"))
    back = load_file(str(tmp_path / "rank0.safetensors"))
    x = torch.randn(3, 128)
    for prefix, (w, layer) in weights.items():
        again = from_state_dict(back, prefix, layer, source="rank0.safetensors")
        assert type(again) is type(w)
        assert torch.equal(dequantize(again), dequantize(w))
        assert torch.equal(quantized_linear_reference(x, again), quantized_linear_reference(x, w))


def test_checkpoint_errors_name_the_tensor(tmp_path):
    weights = weights_for_checkpoint()
    tensors = {}
    for prefix, (w, _) in weights.items():
        tensors.update(to_state_dict(w, prefix))
    layers = {prefix: layer for prefix, (_, layer) in weights.items()}

    def broken(change, prefix, *words):
        t = dict(tensors)
        change(t)
        one_line_error(lambda: from_state_dict(t, prefix, layers[prefix], source="rank0.safetensors"),
                       "rank0.safetensors: ", *words)

    broken(lambda t: t.pop("a.int4.weight_zero"), "a.int4", "a.int4.weight_zero is missing",
           "needs weight, weight_scale and weight_zero")
    broken(lambda t: t.update({"a.int4.weight_scale": t["a.int4.weight_scale"][:, :1]}), "a.int4",
           "a.int4.weight_scale has shape [32, 1]; expected [32, 2]")
    broken(lambda t: t.update({"a.int8.weight": t["a.int8.weight"].float()}), "a.int8",
           "a.int8.weight has dtype float32; expected int8")
    broken(lambda t: t.pop("a.fp8.input_scale"), "a.fp8", "a.fp8.input_scale is missing")
    broken(lambda t: t.update({"a.fp8pc.input_scale": torch.ones(1)}), "a.fp8pc",
           "a.fp8pc.input_scale is given but FP8_PER_CHANNEL_PER_TOKEN uses dynamic")
    one_line_error(lambda: from_state_dict(tensors, "a.int8g", LayerQuant(QuantAlgo.W8A16)),
                   "a.int8g.weight_scale has shape [32, 4], group-wise scales, but the quantization config says "
                   "per channel")
    one_line_error(lambda: from_state_dict(tensors, "a.int8", LayerQuant(QuantAlgo.W8A16, 32)),
                   "a.int8.weight_scale has shape [32]; expected [32, 4]")
    one_line_error(lambda: from_state_dict(tensors, "a.int4", LayerQuant(QuantAlgo.W4A16, 128)),
                   "a.int4.weight_scale has shape [32, 2]; expected [32, 1]")
    # the config's view of a layer drives it
    config = QuantConfig.from_dict({"quant_algo": "W4A16", "group_size": 64})
    assert torch.equal(dequantize(from_state_dict(tensors, "a.int4", config.layer("a.int4"))),
                       dequantize(weights["a.int4"][0]))


# ------------------------------------------------------------------------------ rows and columns

def test_row_and_column_operations_are_exact():
    w = torch.randn(64, 256)
    index = torch.tensor([5, 0, 63, 17])
    for q in (quantize_int8(w), quantize_int8(w, 32), quantize_int4(w, 64), random_int4(64, 256, 32, perm=True),
              quantize_fp8(w), quantize_fp8(w, per_channel=True)):
        deq = dequantize(q)
        assert torch.equal(dequantize(select_rows(q, index)), deq[index])
        assert torch.equal(dequantize_rows(q, index), deq[index]) if not isinstance(q, Fp8Weight) else True
        if not (isinstance(q, Int4Weight) and q.perm is not None):
            assert torch.equal(dequantize(narrow_columns(q, 64, 128)), deq[:, 64:192])
    a, b = quantize_int4(w[:32], 64), quantize_int4(w[32:], 64, scale_dtype=torch.bfloat16)
    both = cat_rows([a, b])
    assert both.scales.dtype == torch.float32  # mixed scale dtypes widen, exactly
    assert torch.equal(dequantize(both), torch.cat([dequantize(a), dequantize(b)]))
    f1, f2 = quantize_fp8(w[:32], input_scale=0.1), quantize_fp8(w[32:] * 5, input_scale=0.3)
    fused = cat_rows([f1, f2])
    assert fused.per_channel and float(fused.input_scale) == pytest.approx(0.3)
    assert torch.equal(dequantize(fused), torch.cat([dequantize(f1), dequantize(f2)]))
    top, bottom = quantize_int8(w[:10]), quantize_int8(w[10:])
    assert torch.equal(dequantize(cat_rows([top, bottom])), torch.cat([dequantize(top), dequantize(bottom)]))
    with pytest.raises(ValueError, match="groups of 64"):
        narrow_columns(quantize_int4(w, 64), 32, 64)
    with pytest.raises(ValueError, match="permutation"):
        narrow_columns(random_int4(64, 256, 32, perm=True), 0, 128)
    with pytest.raises(ValueError, match="different input permutations"):
        cat_rows([random_int4(8, 64, 32, perm=True), random_int4(8, 64, 32, perm=True)])
    with pytest.raises(ValueError, match="group sizes"):
        cat_rows([quantize_int4(w, 64), quantize_int4(w, 32)])


# ------------------------------------------------------------------------------ KV cache

def test_kv_cache_quantization():
    x = torch.randn(2, 4, 16, 64) * 3
    for algo in ("INT8", QuantAlgo.FP8):
        scale = kv_cache_scale_from_amax(x.abs().max(), algo)
        assert scale.shape == (1,) and scale.dtype == torch.float32
        q = quantize_kv(x, scale, algo)
        back = dequantize_kv(q, scale)
        if algo == "INT8":
            assert q.dtype == torch.int8 and int(q.abs().max()) == 127
            assert bool(((back - x).abs() <= scale / 2 * (1 + 1e-5)).all())
        else:
            assert q.dtype == FP8_DTYPE and float(q.float().abs().max()) == 448
            assert bool(((back - x).abs() <= x.abs() * 2.0 ** -4 + scale * 2.0 ** -9).all())
        # values past the calibrated range saturate instead of wrapping
        assert float(dequantize_kv(quantize_kv(torch.tensor([1e6]), scale, algo), scale)) > 0
    assert dequantize_kv(quantize_kv(x, scale, "FP8"), scale, torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="INT8 or FP8"):
        quantize_kv(x, scale, "W8A16")
    with pytest.raises(ValueError, match="INT8 or FP8"):
        kv_cache_scale_from_amax(1.0, QuantAlgo.W4A16)


def test_kv_cache_codes_per_layer_k_and_v_scales():
    # a layer's (K, V) maxima -> its two scales; codes against exact integer / torch E4M3 references
    gen = torch.Generator().manual_seed(7)
    k, v = torch.randn(64, 2, 8, generator=gen) * 4, torch.randn(64, 2, 8, generator=gen) * 0.5
    amax = torch.stack([k.abs().max(), v.abs().max()])
    for algo, top in (("INT8", 127.0), ("FP8", 448.0)):
        scales = kv_cache_scale_from_amax(amax, algo)
        assert scales.shape == (2,) and torch.equal(scales, amax / top)
        for x, s in ((k, scales[0]), (v, scales[1])):
            codes = quantize_kv(x, s, algo)
            if algo == "INT8":  # round half to even of x / s, exactly
                assert bool(((codes.float() - x / s).abs() <= 0.5).all()) and int(codes.abs().max()) == 127
                assert torch.equal(quantize_kv(torch.tensor([2.5, -2.5, 3.5]) * s, s, algo).int(),
                                   torch.tensor([2, -2, 4], dtype=torch.int32))
            else:
                assert torch.equal(codes.view(torch.uint8), (x / s).clamp(-448, 448).to(FP8_DTYPE).view(torch.uint8))
            # the pool's bytes (uint8 for FP8) dequantize to the same values
            stored = codes.view(torch.uint8) if algo == "FP8" else codes
            assert torch.equal(dequantize_kv(stored, s), codes.float() * s)
    assert kv_cache_algo_of(torch.uint8) == QuantAlgo.FP8 and kv_cache_algo_of(torch.int8) == QuantAlgo.INT8
    assert kv_cache_algo_of(torch.bfloat16) is None
