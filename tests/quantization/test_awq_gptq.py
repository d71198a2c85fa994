"""AutoAWQ (GEMM) and AutoGPTQ checkpoints: the published bit layouts, whole folders written
as safetensors at small sizes, exact INT4 results, and errors that name the tensor."""
import json

import pytest
import torch
from safetensors.torch import save_file

from tensorrt_llm.errors import CheckpointError
from tensorrt_llm.quantization import QuantAlgo, dequantize, quantized_linear_reference
from tensorrt_llm.quantization.awq_gptq import (
    awq_to_int4,
    gptq_to_int4,
    load_awq_gptq,
    pack_awq,
    pack_gptq,
    round_to_nearest_awq,
)
from tensorrt_llm.quantization.cpu import int4_weight_only_linear


def signed(word: int) -> int:
    return word - 2 ** 32 if word >= 2 ** 31 else word


# ------------------------------------------------------------------------------ literal layouts

def test_awq_word_order_literal():
    # nibble i holds column AWQ_ORDER[i] = [0, 2, 4, 6, 1, 3, 5, 7]: columns 0..7 holding
    # codes 0..7 pack to nibbles 0, 2, 4, 6, 1, 3, 5, 7 = 0x75316420
    k, group = 32, 32
    qweight = torch.full((k, 1), 0x75316420, dtype=torch.int32)
    qzeros = torch.zeros(1, 1, dtype=torch.int32)
    scales = torch.tensor([[1.0, 2, 3, 4, 5, 6, 7, 8]], dtype=torch.float16)
    w = awq_to_int4(qweight, qzeros, scales, group)
    expected = (torch.arange(8.0) * scales.float()[0])[:, None].expand(8, k)
    assert torch.equal(dequantize(w), expected)
    # a zero point of 15 in column 7 (nibble 7, the sign bit of the word)
    qzeros = torch.tensor([[signed(0xF0000000)]], dtype=torch.int32)
    w = awq_to_int4(qweight, qzeros, scales, group)
    assert torch.equal(dequantize(w)[7], torch.full((k,), (7 - 15) * 8.0))
    assert torch.equal(pack_awq(torch.arange(8).repeat(k, 1), torch.zeros(1, 8, dtype=torch.long), scales)["qweight"],
                       qweight)


def test_gptq_word_order_literal():
    # qweight [K / 8, N]: input 8r + i in bits 4i; qzeros store z - 1 (v1) or z (v2)
    k, n = 32, 8
    qweight = torch.full((k // 8, n), 0x76543210, dtype=torch.int32)
    qweight[0, 0] = signed(0xF6543210)  # input 7 of column 0 has code 15
    qzeros = torch.zeros(1, 1, dtype=torch.int32)
    scales = torch.ones(1, n, dtype=torch.float16)
    v1 = dequantize(gptq_to_int4(qweight, qzeros, scales, 32))
    v2 = dequantize(gptq_to_int4(qweight, qzeros, scales, 32, checkpoint_format="gptq_v2"))
    codes = (torch.arange(k) % 8).float().repeat(n, 1)
    codes[0, 7] = 15
    assert torch.equal(v1, codes - 1)
    assert torch.equal(v2, codes)
    # stored 15 is z = 16 (the exllama / vLLM reading, no wrap)
    w = gptq_to_int4(qweight, torch.full((1, 1), signed(0xFFFFFFFF), dtype=torch.int32), scales, 32)
    assert torch.equal(dequantize(w), codes - 16)


# ------------------------------------------------------------------------------ random layers

def awq_layer(k, n, group, gen):
    codes = torch.randint(0, 16, (k, n), generator=gen)
    zeros = torch.randint(0, 16, (k // group, n), generator=gen)
    scales = (torch.rand(k // group, n, generator=gen) * 0.05 + 1e-3).half()
    original = (codes - zeros.repeat_interleave(group, 0)).float() * scales.float().repeat_interleave(group, 0)
    return pack_awq(codes, zeros, scales), original.t()


def gptq_layer(k, n, group, gen, act_order=False, fmt="gptq"):
    per_channel = group == -1
    g = k if per_channel else group
    groups = -(-k // g)
    codes = torch.randint(0, 16, (k, n), generator=gen)
    zeros = torch.randint(1 if fmt == "gptq" else 0, 16, (groups, n), generator=gen)
    scales = (torch.rand(groups, n, generator=gen) * 0.05 + 1e-3).half()
    g_idx = torch.arange(k) // g
    if act_order:  # GPTQ with desc_act: g_idx[k] = (position of k in the activation order) // group
        g_idx = torch.argsort(torch.randperm(k, generator=gen)) // g
    original = (codes - zeros[g_idx]).float() * scales.float()[g_idx]
    return pack_gptq(codes, zeros, scales, g_idx, fmt), original.t()


@pytest.mark.parametrize("k,n,group,stored", [(128, 64, 64, 64), (256, 32, 128, 128), (192, 16, 64, 64),
                                              (512, 8, 256, 128), (96, 24, 32, 32)])
def test_awq_layer_is_exact(k, n, group, stored):
    gen = torch.Generator().manual_seed(k + n)
    t, original = awq_layer(k, n, group, gen)
    assert t["qweight"].shape == (k, n // 8) and t["qzeros"].shape == (-(-k // group), n // 8)
    w = awq_to_int4(t["qweight"], t["qzeros"], t["scales"], group)
    assert w.group_size == stored and w.perm is None
    assert torch.equal(dequantize(w), original)
    with pytest.raises(CheckpointError, match="in_features 96 is not a multiple of the AWQ group size 64"):
        awq_to_int4(t["qweight"][:96], t["qzeros"], t["scales"], 64, "layer")


@pytest.mark.parametrize("k,n,group,act_order,fmt,stored", [
    (128, 64, 64, False, "gptq", 64), (256, 16, 128, True, "gptq", 128), (192, 8, 128, True, "gptq", 64),
    (256, 16, 32, True, "gptq_v2", 32), (96, 16, -1, False, "gptq", 32), (512, 8, -1, False, "gptq", 128)])
def test_gptq_layer_is_exact(k, n, group, act_order, fmt, stored):
    gen = torch.Generator().manual_seed(k + n + group)
    t, original = gptq_layer(k, n, group, gen, act_order, fmt)
    w = gptq_to_int4(t["qweight"], t["qzeros"], t["scales"], group, t["g_idx"], fmt)
    assert w.group_size == stored
    assert (w.perm is not None) == act_order
    assert torch.equal(dequantize(w), original)
    x = torch.randn(3, k, generator=gen)
    assert torch.allclose(quantized_linear_reference(x, w), x @ original.t(), rtol=1e-5, atol=1e-5)
    if not act_order:  # no g_idx: k // group
        again = gptq_to_int4(t["qweight"], t["qzeros"], t["scales"], group, None, fmt)
        assert torch.equal(dequantize(again), original)


# ------------------------------------------------------------------------------ folders

def write_folder(path, method, layers, extra=None, config=None, shards=1):
    """A checkpoint folder as AutoAWQ / AutoGPTQ publish it (config.json + safetensors)."""
    path.mkdir(parents=True, exist_ok=True)
    tensors = dict(extra or {})
    for prefix, t in layers.items():
        tensors.update({f"{prefix}.{name}": value for name, value in t.items()})
    names = sorted(tensors)
    for s in range(shards):
        part = {name: tensors[name].contiguous() for name in names[s::shards]}
        save_file(part, str(path / f"model-{s + 1:05d}-of-{shards:05d}.safetensors"))
    if config is not False:
        qc = config or ({"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True, "version": "gemm"}
                        if method == "awq" else {"quant_method": "gptq", "bits": 4, "group_size": 64,
                                                 "desc_act": True, "sym": False})
        (path / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": qc}))
    return path


PREFIXES = ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.o_proj"]


def test_awq_folder_loads_exactly(tmp_path):
    gen = torch.Generator().manual_seed(1)
    layers, originals = {}, {}
    for p in PREFIXES:
        layers[p], originals[p] = awq_layer(128, 64, 64, gen)
    extra = {"model.embed_tokens.weight": torch.randn(10, 128), "model.layers.0.self_attn.q_proj.bias": torch.randn(64),
             "lm_head.weight": torch.randn(10, 128)}
    ckpt = load_awq_gptq(write_folder(tmp_path / "awq", "awq", layers, extra, shards=2))
    assert ckpt.method == "awq" and sorted(ckpt.layers) == sorted(PREFIXES)
    for p in PREFIXES:
        assert torch.equal(dequantize(ckpt.layers[p]), originals[p])
    assert sorted(ckpt.tensors) == sorted(extra)  # everything else is passed through as stored
    assert torch.equal(ckpt.tensors["lm_head.weight"], extra["lm_head.weight"])
    assert ckpt.quant_config.quant_algo == QuantAlgo.W4A16_AWQ and ckpt.quant_config.group_size == 64
    assert ckpt.quant_config.layer(PREFIXES[0]).weight_format == "int4"


def test_gptq_act_order_folder_loads_exactly_and_runs_on_the_cpu(tmp_path):
    gen = torch.Generator().manual_seed(2)
    layers, originals = {}, {}
    for p in PREFIXES:
        layers[p], originals[p] = gptq_layer(128, 64, 64, gen, act_order=True)
    ckpt = load_awq_gptq(write_folder(tmp_path / "gptq", "gptq", layers))
    assert ckpt.quant_config.quant_algo == QuantAlgo.W4A16_GPTQ
    x = torch.randn(2, 128, generator=gen)
    for p in PREFIXES:
        w = ckpt.layers[p]
        assert w.perm is not None
        assert torch.equal(dequantize(w), originals[p])
        ref = x @ originals[p].t()
        assert (int4_weight_only_linear(x, w) - ref).abs().max() <= 0.02 * ref.abs().max()


def test_gptq_settings_files_and_mixed_group_sizes(tmp_path):
    # AutoGPTQ's quantize_config.json instead of config.json; q_proj's in_features (192) is not a
    # multiple of 128, so it is stored in groups of 64 and the config becomes per layer
    gen = torch.Generator().manual_seed(3)
    layers, originals = {}, {}
    layers["a"], originals["a"] = gptq_layer(256, 16, 128, gen)
    layers["b"], originals["b"] = gptq_layer(192, 16, 128, gen)
    folder = write_folder(tmp_path / "g", "gptq", layers, config=False)
    (folder / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128, "desc_act": False}))
    ckpt = load_awq_gptq(folder)
    assert ckpt.quant_config.quant_algo == QuantAlgo.MIXED_PRECISION
    assert ckpt.quant_config.layer("a").group_size == 128 and ckpt.quant_config.layer("b").group_size == 64
    for p in "ab":
        assert torch.equal(dequantize(ckpt.layers[p]), originals[p])
    # AutoAWQ's older quant_config.json spelling
    layers = {"c": awq_layer(64, 8, 32, gen)[0]}
    folder = write_folder(tmp_path / "a", "awq", layers, config=False)
    (folder / "quant_config.json").write_text(json.dumps({"zero_point": True, "q_group_size": 32, "w_bit": 4,
                                                         "version": "GEMM"}))
    assert load_awq_gptq(folder).quant_config.group_size == 32


def refused(folder, *words):
    with pytest.raises(CheckpointError) as e:
        load_awq_gptq(folder)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg


def test_malformed_folders_name_the_missing_or_misshaped_tensor(tmp_path):
    gen = torch.Generator().manual_seed(4)
    awq, _ = awq_layer(128, 64, 64, gen)
    gptq, _ = gptq_layer(128, 64, 64, gen, act_order=True)
    p = "model.layers.0.self_attn.q_proj"

    def folder(name, method, t):
        return write_folder(tmp_path / name, method, {p: t})

    refused(folder("no_zeros", "awq", {k: v for k, v in awq.items() if k != "qzeros"}),
            f"{p}.qzeros is missing", "needs qweight, qzeros and scales")
    refused(folder("no_scales", "gptq", {k: v for k, v in gptq.items() if k != "scales"}), f"{p}.scales is missing")
    refused(folder("bad_scales", "awq", {**awq, "scales": awq["scales"][:, :32]}),
            f"{p}.scales has shape [2, 32]; expected [2, 64]", "in_features / group_size, out_features")
    refused(folder("bad_zeros", "gptq", {**gptq, "qzeros": gptq["qzeros"][:1]}),
            f"{p}.qzeros has shape [1, 8]; expected [2, 8]")
    refused(folder("bad_gidx", "gptq", {**gptq, "g_idx": gptq["g_idx"][:64]}),
            f"{p}.g_idx has shape [64]; expected [128]")
    refused(folder("float_qweight", "awq", {**awq, "qweight": awq["qweight"].float()}),
            f"{p}.qweight has dtype float32; expected int32")
    refused(folder("flat_qweight", "gptq", {**gptq, "qweight": gptq["qweight"].flatten()}),
            f"{p}.qweight has shape [1024]; expected 2 dimensions")
    uneven = gptq["g_idx"].clone()
    uneven[:3] = 0  # group 0 now has more than 64 inputs, another fewer
    refused(folder("uneven_groups", "gptq", {**gptq, "g_idx": uneven}), f"{p}: its groups", "do not split")
    refused(write_folder(tmp_path / "no_q", "awq", {}, {"w": torch.zeros(2)}), "no quantized layer")
    refused(write_folder(tmp_path / "bits8", "gptq", {p: gptq}, config={"quant_method": "gptq", "bits": 8}),
            "8-bit GPTQ is not supported")
    refused(write_folder(tmp_path / "gemv", "awq", {p: awq}, config={"quant_method": "awq", "version": "gemv"}),
            "AWQ version 'gemv' is not supported")
    refused(write_folder(tmp_path / "other", "awq", {p: awq}, config={"quant_method": "bitsandbytes"}),
            "quant_method 'bitsandbytes' is not awq or gptq")
    refused(write_folder(tmp_path / "nocfg", "awq", {p: awq}, config=False), "has no quantization settings")
    broken = write_folder(tmp_path / "broken", "awq", {p: awq})
    (broken / "model-00001-of-00001.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    refused(broken, "is not a readable safetensors file")
    refused(tmp_path / "absent", "is not a folder")


def test_round_to_nearest_awq_is_within_half_a_step():
    """Each weight's stored value is its nearest on the group's grid of 16 steps, the zero point
    an integer in 1..15 (AutoGPTQ stores z - 1), the scale float16."""
    w = torch.randn(24, 256, generator=torch.Generator().manual_seed(4)) * 0.05
    codes, zeros, scales = round_to_nearest_awq(w, 64)
    assert codes.shape == (256, 24) and zeros.shape == scales.shape == (4, 24) and scales.dtype == torch.float16
    assert codes.min() >= 0 and codes.max() <= 15 and zeros.min() >= 1 and zeros.max() <= 15
    g = torch.arange(256) // 64
    meant = ((codes - zeros[g]).float() * scales.float()[g]).t()
    step = scales.float().t().repeat_interleave(64, 1)
    assert ((meant - w).abs() <= 0.5 * step + 1e-6).float().mean() > 0.99  # all but a clamped edge
    assert torch.equal(dequantize(awq_to_int4(**pack_awq(codes, zeros, scales), group_size=64)), meant)
    with pytest.raises(ValueError, match="not a multiple of the group size"):
        round_to_nearest_awq(w, 96)
