"""benchmarks/fp8_rounding_spread.py on a tiny random LLaMA (a Hugging Face folder with a word
tokenizer), on the CPU: --exclude_modules keeps those linears float in the checkpoint and the
built engine, the JSON records the exclusion and its float share, --data_file's texts are the ones
measured, and bad options are one line."""
import json

import pytest
import torch

from tensorrt_llm.builder import Engine
from tensorrt_llm.models.llama.convert import config_from_hf, load_weights_from_hf
from tensorrt_llm.quantization.formats import FP8_DTYPE

from ..commands.test_cli_errors import save_tokenizer_of_words
from ..commands.test_cli_workflow import load_script
from ..models.llama_utils import random_hf_llama

LINEARS = ["attention.qkv", "attention.dense", "mlp.gate", "mlp.fc", "mlp.proj"]


def spread():
    return load_script("benchmarks/fp8_rounding_spread.py")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spread") / "hf"
    hf = random_hf_llama(seed=2, num_key_value_heads=2)
    hf.save_pretrained(folder)
    save_tokenizer_of_words(folder)
    return folder


def test_excluded_linears_stay_float_in_checkpoint_and_engine(hf_dir, tmp_path, monkeypatch):
    module = spread()
    built = []

    def engine_perplexity(config, weights, prompts, folder):
        ppl = original(config, weights, prompts, folder)
        built.append((config, weights, Engine.from_dir(folder).network.weights))
        return ppl
    original, module.engine_perplexity = module.engine_perplexity, engine_perplexity
    out = tmp_path / "spread.json"
    excluded = ["transformer.layers.0.*", "transformer.layers.1.mlp.proj"]
    assert module.main(["--model_dir", str(hf_dir), "--modes", "pt_static,pc_dyn", "--roundings", "2",
                        "--exclude_modules", ",".join(excluded), "--threads", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["exclude_modules"] == ["lm_head", *excluded]
    # layer 0 whole and one of layer 1's five linears; hidden 64, intermediate 160, 4 heads of 16, 2 KV heads
    qkv, dense, mlp = 64 * (4 + 2 * 2) * 16, 64 * 64, 64 * 160
    layer = qkv + dense + 3 * mlp
    assert result["float_share_of_decoder_linear_weights"]["model"] == pytest.approx((layer + mlp) / (2 * layer))
    eight_b = 4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336
    assert result["float_share_of_decoder_linear_weights"]["llama_3.1_8b_shape"] == pytest.approx(
        (eight_b + 4096 * 14336) / (32 * eight_b))
    assert set(result["modes"]) == {"pt_static", "pc_dyn"} and len(built) == 1 + 2 * 2
    float_names = [f"transformer.layers.0.{lin}" for lin in LINEARS] + ["transformer.layers.1.mlp.proj"]
    quantized = [f"transformer.layers.1.{lin}" for lin in LINEARS[:4]]
    for config, weights, engine_weights in built[1:]:
        for name in float_names:
            assert config.quant_config.layer(name) is None
            assert weights[f"{name}.weight"].dtype == torch.float32 and f"{name}.weight_scale" not in weights
        for name in quantized:
            assert weights[f"{name}.weight"].dtype == FP8_DTYPE and f"{name}.weight_scale" in weights
        # in the engine: no FP8 codes or scales in layer 0 nor in layer 1's proj, layer 1's qkv FP8
        float_keys = [k for k in engine_weights
                      if k.startswith(("transformer.layers.0.", "transformer.layers.1.mlp.proj"))]
        assert float_keys and all("scale" not in k and engine_weights[k].dtype == torch.float32 for k in float_keys)
        assert engine_weights["transformer.layers.1.attention.qkv.weight"].dtype == torch.uint8


def test_linear_params_are_the_weights(hf_dir):
    import transformers
    hf = transformers.LlamaForCausalLM.from_pretrained(hf_dir)
    config = config_from_hf(hf.config, dtype="float32")
    weights = load_weights_from_hf(hf, config)
    params = spread().linear_params(config)
    assert params == {name: weights[f"{name}.weight"].numel() for name in params}
    assert len(params) == 2 * len(LINEARS)


def test_bad_exclusions_are_one_line(hf_dir, capsys):
    module = spread()
    with pytest.raises(SystemExit):
        module.main(["--model_dir", str(hf_dir), "--exclude_modules", "layers.0.*"])
    assert "--exclude_modules 'layers.0.*' matches no linear of the model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        module.main(["--model_dir", str(hf_dir), "--algorithm", "gptq", "--exclude_modules", "lm_head"])
    assert "not supported with --algorithm gptq" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        module.main(["--model_dir", str(hf_dir), "--data_file", str(hf_dir / "absent.jsonl")])
    assert f"--data_file {hf_dir / 'absent.jsonl'} is not a file" in capsys.readouterr().err


def test_data_file_is_the_text_measured(hf_dir, tmp_path):
    from tensorrt_llm.tokenizer_utils import load_tokenizer
    texts = ["w5 w6 w7 w8 w9 w10", "w11 w12 w13"]
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"article": t}) + "\n" for t in texts))
    out = tmp_path / "spread.json"
    assert spread().main(["--model_dir", str(hf_dir), "--modes", "pc_dyn", "--roundings", "1", "--threads", "1",
                          "--data_file", str(data), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    tokenizer = load_tokenizer(hf_dir)
    assert result["data_file"] == str(data)
    assert result["tokens"] == sum(len(tokenizer(t)["input_ids"]) - 1 for t in texts)
