"""Weight-only INT8 / INT4 LLaMA engines (issue #17): the quantized checkpoint
(models/quantize.py), the engine's weight_only_linear layers, its checks, and the logits
against a float engine of the dequantized weights (the meaning)."""
import dataclasses
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tensorrt_llm.builder import BuildConfig, build
from tensorrt_llm.engine import Engine
from tensorrt_llm.errors import EngineError
from tensorrt_llm.models.llama.convert import config_from_hf, load_weights_from_hf
from tensorrt_llm.models.llama.model import LLaMAForCausalLM
from tensorrt_llm.models.quantize import quantize_checkpoint, weight_only_config
from tensorrt_llm.ops.quantized_linear import WEIGHT_ONLY_OPS
from tensorrt_llm.quantization import dequantize, from_state_dict

from .llama_utils import generated, random_hf_llama, runner

BC = dict(max_batch_size=4, max_input_len=64, max_seq_len=128, tokens_per_block=8, target_device="any")
LINEARS = ["attention.qkv", "attention.dense", "mlp.gate", "mlp.fc", "mlp.proj"]


@pytest.fixture(scope="module")
def hf():
    return random_hf_llama(seed=5, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)


def _quantized(hf, precision, group, exclude_modules=None):
    config = config_from_hf(hf.config, dtype="float32")
    weights = load_weights_from_hf(hf, config)
    config = weight_only_config(config, precision, group, exclude_modules)
    return config, quantize_checkpoint(LLaMAForCausalLM, config, weights)


def _engine(config, weights, path):
    model = LLaMAForCausalLM(config)
    model.load(weights)
    engine = build(model, BuildConfig(**BC))
    engine.save(path)
    return engine


def _dequantized(config, weights):
    """The float checkpoint the quantized one means."""
    out = {}
    for name, t in weights.items():
        if name.endswith((".weight_scale", ".weight_zero")):
            continue
        prefix = name.removesuffix(".weight")
        layer = config.quant_config.layer(prefix) if name.endswith(".weight") else None
        if layer is not None and not t.is_floating_point():
            t = dequantize(from_state_dict(weights, prefix, layer))
        out[name] = t
    return dataclasses.replace(config, quantization={"quant_algo": None}), out


def test_checkpoint_quantizes_every_linear_and_keeps_the_head_float(hf):
    config, weights = _quantized(hf, "int4", 32)
    for i in range(2):
        for lin in LINEARS:
            p = f"transformer.layers.{i}.{lin}"
            assert weights[f"{p}.weight"].dtype == torch.uint8
            assert weights[f"{p}.weight_scale"].dtype == weights[f"{p}.weight_zero"].dtype == torch.float32
    # TensorRT-LLM's default: the LM head (here the tied embedding) stays float
    assert config.quantization["exclude_modules"] == ["lm_head"]
    assert config.share_embedding_table and "lm_head.weight" not in weights
    assert weights["transformer.vocab_embedding.weight"].dtype == torch.float32
    config8, weights8 = _quantized(hf, "int8", None)
    assert config8.quantization["quant_algo"] == "W8A16" and config8.quantization["group_size"] is None


def test_a_quantized_tied_head_is_untied(hf):
    config, weights = _quantized(hf, "int8", None, exclude_modules=[])
    assert not config.share_embedding_table
    assert weights["lm_head.weight"].dtype == torch.int8 and weights["lm_head.weight_scale"].dim() == 1
    assert weights["transformer.vocab_embedding.weight"].dtype == torch.float32


# Through 2 layers and the head, the CPU kernels' bfloat16 activations (cpu.py) move the logits
# by up to ~1% of their range; 3% bounds it.
@pytest.mark.parametrize("precision,group", [("int8", None), ("int8", 32), ("int4", 32)])
def test_engine_logits_are_those_of_the_dequantized_weights(hf, precision, group, tmp_path):
    config, weights = _quantized(hf, precision, group, exclude_modules=[])
    engine = _engine(config, weights, tmp_path / "q")
    ops = [layer.op for layer in engine.network.layers]
    # gate and fc fuse into one quantized gate_up (their codes, scales and zeros stack by rows);
    # each norm goes in front of the linear that reads it (qkv, gate_up, the head)
    assert sum(ops.count(op) for op in WEIGHT_ONLY_OPS) == 2 * (len(LINEARS) - 1) + 1 and "linear" not in ops
    assert ops.count("rms_norm_weight_only_linear") + ops.count("add_rms_norm_weight_only_linear") == 2 * 2 + 1
    assert "transformer.layers.0.mlp.gate_up.scales" not in engine.network.weights
    assert engine.network.weights["transformer.layers.0.mlp.gate_up.weight_scale"].shape[0] == 2 * 160
    rewrites = engine.config["build_summary"]["rewrites"]["rewrites"]
    assert rewrites["fuse_gate_up"] == 2
    assert rewrites["fuse_norm_linear"] == 2 * 2 + 1 and rewrites["fuse_act_linear"] == 0
    # ...and each gate_up takes its silu_and_mul (fuse_gated_linear)
    assert rewrites["fuse_gated_linear"] == 2 and "silu_and_mul" not in ops
    assert sum(bool(layer.attrs.get("gated")) for layer in engine.network.layers) == 2
    _engine(*_dequantized(config, weights), tmp_path / "f")
    prompt = torch.randint(0, 320, (20,), generator=torch.Generator().manual_seed(0)).tolist()
    q = runner(tmp_path / "q").generate([prompt], max_new_tokens=1, return_context_logits=True)
    f = runner(tmp_path / "f").generate([prompt], max_new_tokens=1, return_context_logits=True)
    lq, lf = q["context_logits"][0], f["context_logits"][0]
    assert (lq - lf).abs().max() <= 0.03 * lf.abs().max()


def test_engine_file_weights_are_quantized_and_checked(hf, tmp_path):
    config, weights = _quantized(hf, "int4", 32)
    _engine(config, weights, tmp_path / "e")
    path = tmp_path / "e" / "rank0.engine"
    with safe_open(str(path), framework="pt") as f:
        assert f.get_tensor("transformer.layers.0.mlp.proj.weight").dtype == torch.uint8
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    Engine.from_dir(tmp_path / "e")  # loads

    def write(meta, tensors, where):
        from tensorrt_llm.engine import engine_checksum
        meta = dict(meta)
        meta["checksum"] = engine_checksum(meta, tensors)
        save_file(tensors, str(where / "rank0.engine"), metadata=meta)

    # a scale table of the wrong shape (checksum recomputed, as a stranger would)
    bad = dict(tensors)
    name = "transformer.layers.0.mlp.proj.weight_scale"
    bad[name] = bad[name][:, :-1].contiguous()
    graph = json.loads(meta["graph"])
    graph["weights"][name]["shape"] = list(bad[name].shape)
    const = next(layer for layer in graph["layers"] if layer["attrs"].get("weight") == name)
    graph["tensors"][const["outputs"][0]]["shape"] = list(bad[name].shape)
    write(dict(meta, graph=json.dumps(graph)), bad, tmp_path / "e")
    with pytest.raises(EngineError, match="weight_only_linear"):
        Engine.from_dir(tmp_path / "e")
    # a quantized graph under a config that quantizes nothing
    own = json.loads(meta["config"])
    own["pretrained_config"]["quantization"] = {"quant_algo": None}
    write(dict(meta, config=json.dumps(own, sort_keys=True)), tensors, tmp_path / "e")
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    cfg["pretrained_config"]["quantization"] = {"quant_algo": None}
    (tmp_path / "e" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EngineError, match="quantizes no weights"):
        Engine.from_dir(tmp_path / "e")


def test_gate_and_up_of_different_formats_are_not_fused(hf, tmp_path):
    config = config_from_hf(hf.config, dtype="float32")
    weights = load_weights_from_hf(hf, config)
    section = {"quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "*.mlp.gate": {"quant_algo": "W8A16", "group_size": None},
        "*.mlp.fc": {"quant_algo": "W4A16", "group_size": 32}}}
    config = dataclasses.replace(config, quantization=section)
    engine = _engine(config, quantize_checkpoint(LLaMAForCausalLM, config, weights), tmp_path / "e")
    assert engine.config["build_summary"]["rewrites"]["rewrites"]["fuse_gate_up"] == 0
    ops = [layer.op for layer in engine.network.layers]
    assert ops.count("weight_only_linear") + ops.count("add_rms_norm_weight_only_linear") == 4
    assert ops.count("linear") + ops.count("rms_norm_linear") + ops.count("add_rms_norm_linear") >= 4


def test_excluded_modules_stay_float(hf, tmp_path):
    config = config_from_hf(hf.config, dtype="float32")
    weights = load_weights_from_hf(hf, config)
    config = weight_only_config(config, "int8", None, ["lm_head", "*.mlp.proj"])
    weights = quantize_checkpoint(LLaMAForCausalLM, config, weights)
    assert config.share_embedding_table and "lm_head.weight" not in weights
    assert weights["transformer.layers.1.mlp.proj.weight"].dtype == torch.float32
    engine = _engine(config, weights, tmp_path / "e")
    ops = [layer.op for layer in engine.network.layers]
    assert sum(ops.count(op) for op in WEIGHT_ONLY_OPS) == 2 * 3  # gate_up fused
    out = runner(tmp_path / "e").generate([[1, 2, 3]], max_new_tokens=4)
    assert len(generated(out, 0, 3)) == 4

