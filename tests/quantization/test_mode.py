"""The checkpoint `quantization` section: reading, writing, refusing, per-layer lookups."""
import json

import pytest

from tensorrt_llm.errors import ConfigError
from tensorrt_llm.quantization import LayerQuant, QuantAlgo, QuantConfig, check_device_support


def refused(section, *words):
    with pytest.raises(ConfigError) as e:
        QuantConfig.from_dict(section)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg
    return msg


@pytest.mark.parametrize("section", [
    {"quant_algo": "W8A16", "kv_cache_quant_algo": None, "group_size": None},
    {"quant_algo": "W8A16", "group_size": 32},
    {"quant_algo": "W4A16_AWQ", "group_size": 64, "has_zero_point": True, "exclude_modules": ["lm_head"]},
    {"quant_algo": "W4A16_GPTQ", "group_size": 128},
    {"quant_algo": "W4A16_GPTQ", "group_size": 128, "has_act_order": True},
    {"quant_algo": "W4A16", "group_size": 32, "kv_cache_quant_algo": "INT8"},
    {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
    {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"},
    {"quant_algo": None, "kv_cache_quant_algo": "INT8"},
    {"quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "transformer.layers.*.attention.qkv": {"quant_algo": "W4A16", "group_size": 32},
        "lm_head": {"quant_algo": "W8A16", "group_size": 32}}},
    {"quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "transformer.layers.*.mlp.proj": {"quant_algo": "W4A16_GPTQ", "group_size": 32},
        "transformer.layers.*": {"quant_algo": "W4A16_GPTQ", "group_size": 32, "has_act_order": True}}},
])
def test_a_section_survives_json_and_back(section):
    config = QuantConfig.from_dict(section)
    again = QuantConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    assert again.to_dict() == config.to_dict()
    for key in ("quant_algo", "kv_cache_quant_algo"):
        assert config.to_dict()[key] == section.get(key)


def test_no_section_and_no_quant_mean_float():
    for section in (None, {}, {"quant_algo": "NO_QUANT"}, {"quant_algo": None, "kv_cache_quant_algo": None}):
        config = QuantConfig.from_dict(section)
        assert not config.quantizes_weights and not config.quantizes_kv_cache
        assert config.layer("transformer.layers.0.mlp.fc") is None


def test_defaults_and_spellings():
    assert QuantConfig.from_dict({"quant_algo": "W4A16_AWQ"}).group_size == 128  # TensorRT-LLM's default
    assert QuantConfig.from_dict({"quant_algo": "w4a16"}).quant_algo == QuantAlgo.W4A16
    assert QuantConfig.from_dict({"quant_algo": "W8A16"}).group_size is None  # per channel
    assert QuantConfig.from_dict({"quant_algo": "W8A16", "group_size": -1}).group_size is None
    assert QuantConfig.from_dict({"quant_algo": "FP8", "group_size": 128}).group_size is None  # not grouped
    # TensorRT-LLM keys of other algorithms are accepted and ignored
    assert QuantConfig.from_dict({"quant_algo": "W8A16", "smoothquant_val": 0.5, "clamp_val": None}).quant_algo
    assert str(QuantAlgo.FP8) == "FP8"


def test_bad_sections_are_refused_in_one_line():
    refused({"quant_algo": "W3A16"}, "quant_algo 'W3A16' is not a quantization algorithm", "W4A16_AWQ")
    refused({"quant_algo": "W8A8_SQ_PER_CHANNEL"}, "W8A8_SQ_PER_CHANNEL is not supported", "supported:")
    refused({"quant_algo": "NVFP4"}, "NVFP4 is not supported")
    refused({"quant_algo": 4}, "quant_algo 4")
    refused({"quant_algo": "W4A16", "group_size": 96}, "group_size 96", "W4A16", "32, 64, 128")
    refused({"quant_algo": "W4A16_GPTQ", "group_size": -1}, "group_size -1", "per channel")
    refused({"quant_algo": "W8A16", "group_size": 48}, "group_size 48", "null (per channel)")
    refused({"quant_algo": "W4A16", "group_size": "64"}, "group_size must be an integer")
    refused({"quant_algo": "W4A16", "group_size": True}, "group_size must be an integer")
    refused({"kv_cache_quant_algo": "W4A16"}, "kv_cache_quant_algo W4A16 is not supported", "FP8, INT8")
    refused({"kv_cache_quant_algo": "FP16"}, "kv_cache_quant_algo 'FP16'")
    refused({"quant_algo": "W4A16", "groupsize": 64}, "unknown key 'groupsize'")
    refused({"quant_algo": "W4A16_AWQ", "pre_quant_scale": True}, "pre_quant_scale")
    refused({"quant_algo": "W4A16", "has_zero_point": "yes"}, "has_zero_point must be true or false")
    refused({"quant_algo": "W4A16", "exclude_modules": "lm_head"}, "exclude_modules must be a list")
    refused({"quant_algo": "MIXED_PRECISION"}, "MIXED_PRECISION needs quantized_layers")
    refused({"quant_algo": "W4A16", "quantized_layers": {"a": {"quant_algo": "W8A16"}}},
            "quantized_layers is read only with quant_algo MIXED_PRECISION")
    refused({"quant_algo": "MIXED_PRECISION", "quantized_layers": {"a": {"quant_algo": "W4A16", "group_size": 7}}},
            "quantized_layers['a'].group_size 7")
    refused({"quant_algo": "MIXED_PRECISION", "quantized_layers": {"a": {"quant_algo": "MIXED_PRECISION"}}},
            "MIXED_PRECISION is not supported")
    refused({"quant_algo": "MIXED_PRECISION", "quantized_layers": {"a": {"group_size": 32}}},
            "quantized_layers['a'].quant_algo is missing")
    refused({"quant_algo": "MIXED_PRECISION", "quantized_layers": {"a": {"quant_algo": "W8A16", "bits": 8}}},
            "unknown key 'bits'")
    refused({"quant_algo": "MIXED_PRECISION", "quantized_layers": {"a": "W8A16"}}, "must be an object")
    refused([1], "quantization must be an object")
    refused({"quant_algo": "W4A16_GPTQ", "has_act_order": 1}, "has_act_order must be true or false")
    refused({"quant_algo": "W8A16", "has_act_order": True}, "has_act_order is true", "not W8A16")
    refused({"quant_algo": "MIXED_PRECISION", "has_act_order": True,
             "quantized_layers": {"a": {"quant_algo": "W4A16"}}}, "under MIXED_PRECISION each layer says it")
    refused({"quant_algo": "MIXED_PRECISION", "quantized_layers": {"a": {"quant_algo": "FP8", "has_act_order": True}}},
            "quantized_layers['a'].has_act_order is true", "not FP8")


def test_the_one_line_summary_a_converter_prints():
    assert QuantConfig.from_dict({"quant_algo": "W4A16_AWQ", "group_size": 64}).summary() == "W4A16_AWQ, group 64"
    assert QuantConfig.from_dict({"quant_algo": "W8A16"}).summary() == "W8A16"
    assert QuantConfig.from_dict({"quant_algo": "W4A16_GPTQ", "has_act_order": True}).summary() == \
        "W4A16_GPTQ, group 128, act-order"
    mixed = QuantConfig.from_dict({"quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "a": {"quant_algo": "W4A16_GPTQ", "group_size": 32, "has_act_order": True},
        "b": {"quant_algo": "W4A16_GPTQ", "group_size": 32, "has_act_order": True},
        "c": {"quant_algo": "W4A16_GPTQ", "group_size": 32}, "d": {"quant_algo": "FP8"}}})
    assert mixed.summary() == ("MIXED_PRECISION: 2 x W4A16_GPTQ (group 32, act-order), 1 x W4A16_GPTQ (group 32), "
                               "1 x FP8")


def test_act_order_reaches_each_layer():
    config = QuantConfig.from_dict({"quant_algo": "W4A16_GPTQ", "group_size": 64, "has_act_order": True})
    assert config.layer("transformer.layers.0.attention.qkv") == LayerQuant(QuantAlgo.W4A16_GPTQ, 64, True)
    assert "has_act_order" not in QuantConfig.from_dict({"quant_algo": "W4A16_GPTQ"}).to_dict()
    mixed = QuantConfig.from_dict({"quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "transformer.layers.*.mlp.proj": {"quant_algo": "W4A16_GPTQ", "group_size": 32},
        "transformer.layers.*": {"quant_algo": "W4A16_GPTQ", "group_size": 32, "has_act_order": True}}})
    assert not mixed.layer("transformer.layers.3.mlp.proj").has_act_order
    assert mixed.layer("transformer.layers.3.mlp.fc").has_act_order


def test_layer_lookup_with_excludes_and_mixed_layers():
    config = QuantConfig.from_dict({"quant_algo": "W4A16_AWQ", "group_size": 64,
                                    "exclude_modules": ["lm_head", "*.router"]})
    assert config.layer("transformer.layers.3.mlp.fc") == LayerQuant(QuantAlgo.W4A16_AWQ, 64)
    assert config.layer("transformer.layers.3.mlp.fc").weight_format == "int4"
    assert config.layer("lm_head") is None
    assert config.layer("transformer.layers.3.mlp.router") is None

    mixed = QuantConfig.from_dict({"quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "transformer.layers.*": {"quant_algo": "W4A16", "group_size": 32},
        "transformer.layers.0.attention.qkv": {"quant_algo": "FP8"},
        "lm_head": {"quant_algo": "W8A16", "group_size": 32}}})
    assert mixed.layer("transformer.layers.0.attention.qkv").weight_format == "fp8"  # exact name first
    assert mixed.layer("transformer.layers.0.attention.qkv").static_activation_scale
    assert mixed.layer("transformer.layers.5.mlp.proj") == LayerQuant(QuantAlgo.W4A16, 32)
    assert mixed.layer("lm_head").weight_format == "int8"
    assert mixed.layer("transformer.vocab_embedding") is None
    assert mixed.layer_algos() == {QuantAlgo.W4A16, QuantAlgo.FP8, QuantAlgo.W8A16}


def test_fp8_is_refused_before_sm89_with_the_reason():
    fp8 = QuantConfig.from_dict({"quant_algo": "FP8"})
    with pytest.raises(ConfigError, match=r"FP8 needs a GPU of compute capability 8.9 or newer .*sm_80"):
        check_device_support(fp8, "cuda", (8, 0))
    kv = QuantConfig.from_dict({"quant_algo": "W4A16", "kv_cache_quant_algo": "FP8"})
    with pytest.raises(ConfigError, match=r"FP8 KV cache needs .* sm_86"):
        check_device_support(kv, "cuda", (8, 6))
    mixed = QuantConfig.from_dict({"quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "a": {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}}})
    with pytest.raises(ConfigError, match="FP8_PER_CHANNEL_PER_TOKEN needs"):
        check_device_support(mixed, "cuda", (7, 5))
    with pytest.raises(ConfigError, match="compute capability"):
        check_device_support(fp8, "cuda", None)
    for ok in [(8, 9), (9, 0), (10, 0)]:
        check_device_support(fp8, "cuda", ok)
        check_device_support(kv, "cuda", ok)
    check_device_support(fp8, "cpu")
    check_device_support(QuantConfig.from_dict({"quant_algo": "W4A16", "kv_cache_quant_algo": "INT8"}),
                         "cuda", (7, 0))
