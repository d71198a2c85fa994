"""AutoAWQ / AutoGPTQ Hugging Face folders -> our INT4 checkpoint (convert.load_weight_only_from_awq_gptq),
as convert_checkpoint.py and the LLM API read them: each linear's codes, zero points and scales
exactly, the section that says so, and an engine whose logits are those of the dequantized weights."""
import copy
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tensorrt_llm.builder import BuildConfig, build
from tensorrt_llm.errors import CheckpointError, ConfigError
from tensorrt_llm.llmapi.model_loader import _source
from tensorrt_llm.mapping import Mapping
from tensorrt_llm.models.llama.convert import config_from_hf, load_weight_only_from_awq_gptq
from tensorrt_llm.models.llama.model import LLaMAForCausalLM
from tensorrt_llm.quantization import dequantize, from_state_dict
from tensorrt_llm.quantization.awq_gptq import awq_gptq_method, pack_awq, pack_gptq, round_to_nearest_awq

from ..commands.test_cli_workflow import load_script
from .llama_utils import engine_from_hf, random_hf_llama, runner

GROUP = 32
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@pytest.fixture(scope="module")
def hf():
    return random_hf_llama(seed=7, num_attention_heads=4, num_key_value_heads=2)  # an untied, float head


def _round(w: torch.Tensor):
    """round_to_nearest_awq's codes, zero points and scales, and the float weight [N, K] they mean."""
    codes, zeros, scales = round_to_nearest_awq(w, GROUP)
    g = torch.arange(w.shape[1]) // GROUP
    return codes, zeros, scales, ((codes - zeros[g]).float() * scales.float()[g]).t()


def _folder(hf, path, method: str, act_order: bool = False):
    """The random model as an AutoAWQ (GEMM) or AutoGPTQ folder, and the float model it means."""
    path.mkdir(parents=True)
    meant_model = copy.deepcopy(hf)
    meant = dict(meant_model.named_parameters())
    tensors = {}
    for name, t in hf.state_dict().items():
        prefix = name.removesuffix(".weight")
        if not prefix.endswith(LINEARS):
            tensors[name] = t.contiguous()
            continue
        w = t.float()
        perm = None
        if act_order:  # GPTQ's desc_act: groups of inputs in another order, the same for q, k and v
            perm = torch.randperm(w.shape[1], generator=torch.Generator().manual_seed(w.shape[1]))
        codes, zeros, scales, w_meant = _round(w if perm is None else w[:, perm])
        if perm is None:
            g_idx = None
        else:  # input perm[j] is the j-th in the groups' order
            g_idx = torch.empty(w.shape[1], dtype=torch.long)
            g_idx[perm] = torch.arange(w.shape[1]) // GROUP
            codes = codes[torch.argsort(perm)]
            w_meant = w_meant[:, torch.argsort(perm)]
        packed = pack_awq(codes, zeros, scales) if method == "awq" else pack_gptq(codes, zeros, scales, g_idx)
        tensors.update({f"{prefix}.{part}": v.contiguous() for part, v in packed.items()})
        with torch.no_grad():
            meant[name].copy_(w_meant)
    save_file(tensors, str(path / "model.safetensors"))
    config = hf.config.to_dict()
    config["quantization_config"] = (
        {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"}
        if method == "awq" else {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": act_order,
                                 "sym": False})
    (path / "config.json").write_text(json.dumps(config))
    return path, meant_model


@pytest.mark.parametrize("method", ["awq", "gptq", "gptq_act_order"])
def test_folder_converts_exactly_and_its_engine_means_its_weights(hf, tmp_path, method):
    act_order = method == "gptq_act_order"
    method = method.removesuffix("_act_order")
    folder, meant_model = _folder(hf, tmp_path / method, method, act_order=act_order)
    assert awq_gptq_method(folder) == method
    config, weights = load_weight_only_from_awq_gptq(folder, config_from_hf(folder, "float32"))
    algo = "W4A16_AWQ" if method == "awq" else "W4A16_GPTQ"
    if not act_order:
        assert config.quantization == {"quant_algo": algo, "group_size": GROUP, "exclude_modules": ["lm_head"]}
    else:  # down's perm is folded into gate's and up's rows: it alone has no act-order
        layers = config.quantization["quantized_layers"]
        assert config.quantization["quant_algo"] == "MIXED_PRECISION" and "lm_head" not in layers
        assert {name: spec.get("has_act_order", False) for name, spec in layers.items()} == {
            name: not name.endswith("mlp.proj") for name in layers}
        assert weights["transformer.layers.0.attention.qkv.weight_perm"].dtype == torch.int64
        assert "transformer.layers.0.mlp.proj.weight_perm" not in weights
    assert weights["lm_head.weight"].dtype == torch.float32
    meant = dict(meant_model.named_parameters())

    def ours(i, name):
        prefix = f"transformer.layers.{i}.{name}"
        assert weights[f"{prefix}.weight"].dtype == torch.uint8
        return dequantize(from_state_dict(weights, prefix, config.quant_config.layer(prefix)))

    for i in range(2):
        # q, k, v (stacked) and o: exactly the weight the folder means, in the inputs' order
        want = torch.cat([meant[f"model.layers.{i}.self_attn.{h}_proj.weight"] for h in "qkv"])
        assert torch.equal(ours(i, "attention.qkv"), want.detach())
        assert torch.equal(ours(i, "attention.dense"), meant[f"model.layers.{i}.self_attn.o_proj.weight"].detach())
        # the MLP: the same weights, gate's and up's rows and down's columns in one order
        gate, up, down = ours(i, "mlp.gate"), ours(i, "mlp.fc"), ours(i, "mlp.proj")
        m = {h: meant[f"model.layers.{i}.mlp.{h}_proj.weight"].detach() for h in ("gate", "up", "down")}
        order = torch.tensor([int(torch.nonzero((m["gate"] == row).all(1))[0]) for row in gate])
        identity = torch.arange(len(order))
        assert torch.equal(order.sort().values, identity) and bool((order != identity).any()) == act_order
        assert torch.equal(gate, m["gate"][order]) and torch.equal(up, m["up"][order])
        assert torch.equal(down, m["down"][:, order])
    model = LLaMAForCausalLM(config)
    model.load(weights)
    build(model, BuildConfig(max_batch_size=2, max_input_len=64, max_seq_len=96, tokens_per_block=8,
                             target_device="any")).save(tmp_path / "q")
    engine_from_hf(meant_model, tmp_path / "f")
    prompt = torch.randint(0, 320, (20,), generator=torch.Generator().manual_seed(0)).tolist()
    q = runner(tmp_path / "q").generate([prompt], max_new_tokens=1, return_context_logits=True)
    f = runner(tmp_path / "f").generate([prompt], max_new_tokens=1, return_context_logits=True)
    lq, lf = q["context_logits"][0], f["context_logits"][0]
    # the CPU's INT4 kernel takes bfloat16 activations (as in tests/models/test_quantize.py)
    assert (lq - lf).abs().max() <= 0.03 * lf.abs().max()


@pytest.mark.gpu
def test_an_act_order_engine_on_cuda_matches_the_cpu(tmp_path):
    """The act-order engine on the GPU (the input gathers, the INT4 GEMV of decode rows and its
    dequantize-and-cuBLAS prompt path, decode steps in CUDA graphs) against the same engine on
    the CPU: they differ by float16 roundings only."""
    hf = random_hf_llama(seed=5, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                         num_key_value_heads=2)
    folder, _ = _folder(hf, tmp_path / "gptq", "gptq", act_order=True)
    config, weights = load_weight_only_from_awq_gptq(folder, config_from_hf(folder, "float16"))
    model = LLaMAForCausalLM(config)
    model.load(weights)
    build(model, BuildConfig(max_batch_size=2, max_input_len=64, max_seq_len=96, tokens_per_block=8,
                             target_device="any")).save(tmp_path / "q")
    prompts = [torch.randint(0, 320, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (20, 7)]
    outs = {device: runner(tmp_path / "q", device=device).generate(prompts, max_new_tokens=4,
                                                                     return_context_logits=True)
            for device in ("cpu", "cuda")}
    for b, prompt in enumerate(prompts):
        ref, got = outs["cpu"]["context_logits"][b].float(), outs["cuda"]["context_logits"][b].float().cpu()
        assert float((got - ref).pow(2).mean().sqrt() / ref.std()) <= 0.02
        assert outs["cuda"]["output_ids"][b, 0, len(prompt)] == outs["cpu"]["output_ids"][b, 0, len(prompt)]


def test_convert_checkpoint_and_the_llm_api_read_an_awq_folder(hf, tmp_path, capsys):
    folder, _ = _folder(hf, tmp_path / "awq", "awq")
    convert = load_script("examples/llama/convert_checkpoint.py")
    convert.main(["--model_dir", str(folder), "--output_dir", str(tmp_path / "ckpt"), "--dtype", "float32"])
    assert "quantization: W4A16_AWQ" in capsys.readouterr().out
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["quantization"]["quant_algo"] == "W4A16_AWQ" and saved["quantization"]["group_size"] == GROUP
    with safe_open(str(tmp_path / "ckpt" / "rank0.safetensors"), framework="pt") as f:
        assert str(f.get_tensor("transformer.layers.1.mlp.proj.weight").dtype) == "torch.uint8"
    # the settings of a float conversion do not apply
    with pytest.raises(SystemExit):
        convert.main(["--model_dir", str(folder), "--output_dir", str(tmp_path / "c2"), "--use_weight_only",
                      "--weight_only_precision", "int8"])
    assert "does not apply to an AWQ checkpoint" in capsys.readouterr().err
    # the generic converter reads float weights only, and says where such a folder goes
    with pytest.raises(SystemExit):
        load_script("examples/convert_checkpoint.py").main(["--model_type", "llama", "--model_dir", str(folder),
                                                             "--output_dir", str(tmp_path / "c3")])
    assert "is an AWQ checkpoint: convert it with examples/llama/convert_checkpoint.py" in capsys.readouterr().err
    # the LLM API's Hugging Face source is the same conversion
    config, rank_weights = _source(folder, "hf", "float32", on_gpu=False)
    assert config.quantization["quant_algo"] == "W4A16_AWQ"
    assert rank_weights(0)["transformer.layers.0.attention.qkv.weight"].dtype == torch.uint8


def test_convert_checkpoint_and_the_llm_api_read_a_gptq_act_order_folder(hf, tmp_path, capsys):
    folder, _ = _folder(hf, tmp_path / "gptq", "gptq", act_order=True)
    load_script("examples/llama/convert_checkpoint.py").main(
        ["--model_dir", str(folder), "--output_dir", str(tmp_path / "ckpt"), "--dtype", "float32"])
    # 2 layers: qkv, o, gate and up keep their input order; down's is folded into gate's and up's rows
    assert ("quantization: MIXED_PRECISION: 8 x W4A16_GPTQ (group 32, act-order), 2 x W4A16_GPTQ (group 32)"
            in capsys.readouterr().out)
    with safe_open(str(tmp_path / "ckpt" / "rank0.safetensors"), framework="pt") as f:
        assert f.get_tensor("transformer.layers.1.mlp.fc.weight_perm").dtype == torch.int64
    config, rank_weights = _source(folder, "hf", "float32", on_gpu=False)
    assert config.quant_config.layer("transformer.layers.0.attention.qkv").has_act_order
    assert "transformer.layers.0.attention.dense.weight_perm" in rank_weights(0)


def test_malformed_folders_are_refused_with_the_reason(hf, tmp_path):
    folder, _ = _folder(hf, tmp_path / "awq", "awq")
    config = config_from_hf(folder, "float32")
    with pytest.raises(ConfigError, match="one rank"):
        load_weight_only_from_awq_gptq(folder, config_from_hf(folder, "float32", Mapping(world_size=2, tp_size=2)))
    # k quantized but not q: the stacked qkv cannot be formed
    from safetensors.torch import load_file
    tensors = load_file(str(folder / "model.safetensors"))
    for part in ("qweight", "qzeros", "scales"):
        del tensors[f"model.layers.0.self_attn.q_proj.{part}"]
    tensors["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(64, 64)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="q_proj is not quantized but model.layers.0.self_attn.k_proj is"):
        load_weight_only_from_awq_gptq(folder, config)
