"""examples/quantization/quantize.py as a user runs it: FP8 (calibrated or per-token) and
weight-only checkpoints of a tiny random LLaMA -> trtllm-build -> run.py on the CPU; its
one-line errors; trtllm-build's refusal of FP8 for a GPU before sm_89."""
import json

import pytest
import torch
from safetensors import safe_open

from tensorrt_llm.errors import ConfigError

from ..models.llama_utils import random_hf_llama
from .test_cli_errors import save_tokenizer_of_words, words
from .test_cli_workflow import load_script, run

QUANTIZE = "examples/quantization/quantize.py"
BUILD = ["--max_batch_size", "2", "--max_input_len", "16", "--max_seq_len", "32"]


def quantize(*args):
    """quantize.py's main in this process (a subprocess run costs seconds)."""
    load_script(QUANTIZE).main([str(a) for a in args])


def build_and_run(ckpt, engine):
    """trtllm-build of the checkpoint, then run.py generating from the engine, as a user runs them."""
    p = run("-m", "tensorrt_llm.commands.build", "--checkpoint_dir", ckpt, "--output_dir", engine, *BUILD)
    assert "Engine written to" in p.stdout
    p = run("examples/run.py", "--engine_dir", engine, "--tokenizer_dir", ckpt, "--no_chat_template",
            "--input_text", words(6), "--max_output_len", "6")
    assert p.stdout.strip()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("q") / "hf"
    random_hf_llama(seed=0, tie_word_embeddings=True).save_pretrained(folder)
    save_tokenizer_of_words(folder)
    return folder


@pytest.mark.parametrize("args,algo,per_channel", [
    ([], "FP8", False),
    (["--per_channel", "--calib_size", "2"], "FP8", True),
    (["--dynamic_activations"], "FP8_PER_CHANNEL_PER_TOKEN", False),
])
def test_fp8_checkpoint(hf_dir, tmp_path, capsys, args, algo, per_channel):
    ckpt = tmp_path / "ckpt"
    quantize("--model_dir", hf_dir, "--qformat", "fp8", "--output_dir", ckpt, *args)
    out = capsys.readouterr().out
    assert f"quantization {algo}" in out
    assert ("calibrating on" in out and "samples" in out) == (algo == "FP8")
    config = json.loads((ckpt / "config.json").read_text())
    assert config["quantization"]["quant_algo"] == algo
    assert config["quantization"]["exclude_modules"] == ["lm_head"] and config["share_embedding_table"] is True
    with safe_open(str(ckpt / "rank0.safetensors"), framework="pt") as f:
        names = set(f.keys())
        assert str(f.get_tensor("transformer.layers.1.mlp.proj.weight").dtype) == "torch.float8_e4m3fn"
        scale = f.get_tensor("transformer.layers.1.mlp.proj.weight_scale")
        assert tuple(scale.shape) == ((64,) if per_channel else (1,))
    assert ("transformer.layers.0.attention.qkv.input_scale" in names) == (algo == "FP8")
    assert (ckpt / "tokenizer.json").is_file()


@pytest.mark.parametrize("qformat,dtype", [("fp8", "torch.float8_e4m3fn"), ("int8_wo", "torch.int8")])
def test_quantize_lm_head(hf_dir, tmp_path, qformat, dtype):
    """--quantize_lm_head: the (tied) head quantized in the linears' format, with its own input
    scale for static FP8; the embedding stays float."""
    ckpt = tmp_path / "ckpt"
    quantize("--model_dir", hf_dir, "--qformat", qformat, "--output_dir", ckpt, "--quantize_lm_head")
    config = json.loads((ckpt / "config.json").read_text())
    assert config["quantization"]["exclude_modules"] == [] and config["share_embedding_table"] is False
    with safe_open(str(ckpt / "rank0.safetensors"), framework="pt") as f:
        assert str(f.get_tensor("lm_head.weight").dtype) == dtype
        assert str(f.get_tensor("transformer.vocab_embedding.weight").dtype) == "torch.float32"
        assert ("lm_head.input_scale" in f.keys()) == (qformat == "fp8")


def test_quantize_build_run(hf_dir, tmp_path):
    ckpt, engine = tmp_path / "ckpt", tmp_path / "engine"
    run(QUANTIZE, "--model_dir", hf_dir, "--qformat", "fp8", "--calib_size", "2", "--output_dir", ckpt)
    build_and_run(ckpt, engine)


def test_build_refuses_fp8_for_a_gpu_before_sm89(hf_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    quantize("--model_dir", hf_dir, "--qformat", "fp8", "--dynamic_activations", "--output_dir", ckpt)
    p = run("-m", "tensorrt_llm.commands.build", "--checkpoint_dir", ckpt, "--output_dir", tmp_path / "e",
            *BUILD, "--target_device", "cuda:sm_80", check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "FP8_PER_CHANNEL_PER_TOKEN needs a GPU of compute capability 8.9 or newer" in p.stderr
    assert "sm_80" in p.stderr and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_weight_only_formats(hf_dir, tmp_path):
    quantize("--model_dir", hf_dir, "--qformat", "int4_wo", "--group_size", "32", "--output_dir", tmp_path / "c")
    config = json.loads((tmp_path / "c" / "config.json").read_text())
    assert config["quantization"]["quant_algo"] == "W4A16" and config["quantization"]["group_size"] == 32


@pytest.mark.parametrize("qformat,args", [
    ("int4_wo", ["--group_size", "32"]),
    ("int4_wo", ["--group_size", "32", "--gptq_act_order"]),
    ("int8_wo", ["--gptq_inputs", "float", "--gptq_damp", "0.05"]),
    ("fp8", ["--per_channel", "--gptq_quantized_activations"]),
    ("fp8", ["--dynamic_activations", "--gptq_quantized_activations"]),
])
def test_gptq_checkpoint(hf_dir, tmp_path, capsys, qformat, args):
    """--algorithm gptq: same format, scales and tensors as round-to-nearest, other codes."""
    rtn, gptq = tmp_path / "rtn", tmp_path / "gptq"
    static = qformat == "fp8" and "--dynamic_activations" not in args
    quantize("--model_dir", hf_dir, "--qformat", qformat, "--output_dir", rtn,
             *(["--calib_size", "2"] if static else []),
             *[a for a in args if not a.startswith("--gptq") and a not in ("float", "0.05")])
    capsys.readouterr()
    quantize("--model_dir", hf_dir, "--qformat", qformat, "--algorithm", "gptq", "--calib_size", "2",
             "--output_dir", gptq, *args)
    out = capsys.readouterr().out
    assert "rounding by GPTQ" in out and "GPTQ Hessians" in out and "calibrating on 2 samples" in out
    assert json.loads((rtn / "config.json").read_text()) == json.loads((gptq / "config.json").read_text())
    with safe_open(str(rtn / "rank0.safetensors"), framework="pt") as a, \
            safe_open(str(gptq / "rank0.safetensors"), framework="pt") as b:
        assert set(b.keys()) == set(a.keys())
        name = "transformer.layers.1.mlp.proj.weight"
        assert a.get_tensor(name).dtype == b.get_tensor(name).dtype
        assert not torch.equal(a.get_tensor(name).view(torch.uint8), b.get_tensor(name).view(torch.uint8))
        assert torch.equal(a.get_tensor("transformer.vocab_embedding.weight"),
                           b.get_tensor("transformer.vocab_embedding.weight"))


def test_gptq_checks_the_format_before_calibrating(hf_dir, tmp_path, capsys):
    with pytest.raises(ConfigError, match="in_features 64 is not a multiple of the group size 128"):
        quantize("--model_dir", hf_dir, "--qformat", "int4_wo", "--group_size", "128", "--algorithm", "gptq",
                 "--output_dir", tmp_path / "c")
    assert "calibrating" not in capsys.readouterr().out and not (tmp_path / "c").exists()


def test_gptq_build_run(hf_dir, tmp_path):
    ckpt, engine = tmp_path / "ckpt", tmp_path / "engine"
    run(QUANTIZE, "--model_dir", hf_dir, "--qformat", "int4_wo", "--group_size", "32", "--algorithm", "gptq",
        "--gptq_act_order", "--calib_size", "2", "--output_dir", ckpt)
    build_and_run(ckpt, engine)


@pytest.mark.parametrize("args,message", [
    (["--qformat", "int8_wo", "--gptq_damp", "0.1"], "--gptq_damp applies to --algorithm gptq"),
    (["--qformat", "fp8", "--gptq_inputs", "float"], "--gptq_inputs applies to --algorithm gptq"),
    (["--qformat", "int8_wo", "--algorithm", "gptq", "--gptq_quantized_activations"],
     "--gptq_quantized_activations applies to --qformat fp8"),
    (["--qformat", "none", "--kv_cache_dtype", "fp8", "--algorithm", "gptq"], "--qformat none has none to quantize"),
    (["--qformat", "int4_wo", "--gptq_act_order"], "--gptq_act_order applies to --algorithm gptq"),
    (["--qformat", "int4_wo", "--algorithm", "gptq", "--gptq_damp", "-1"], "--gptq_damp must be in 0..1"),
    (["--qformat", "int4_wo", "--calib_size", "2"], "--calib_size applies to --qformat fp8, --kv_cache_dtype or"),
    (["--qformat", "fp8", "--dynamic_activations", "--calib_size", "4"], "--dynamic_activations has none"),
    (["--qformat", "int8_wo", "--per_channel"], "--per_channel applies to --qformat fp8"),
    (["--qformat", "fp8", "--group_size", "32"], "--group_size applies to --qformat int8_wo / int4_wo"),
    (["--qformat", "fp8", "--calib_size", "0"], "--calib_size must be >= 1"),
    (["--qformat", "fp8", "--calib_data", "missing.jsonl"], "--calib_data missing.jsonl is not a file"),
    (["--qformat", "nvfp4"], "invalid choice"),
    (["--qformat", "none", "--kv_cache_dtype", "fp8", "--quantize_lm_head"], "--quantize_lm_head needs a --qformat"),
])
def test_bad_flags_are_refused(hf_dir, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        quantize("--model_dir", hf_dir, "--output_dir", tmp_path / "c", *args)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bad_input_is_one_line(hf_dir, tmp_path):
    p = run(QUANTIZE, "--model_dir", tmp_path / "nothing.gguf", "--qformat", "fp8", "--output_dir", tmp_path / "c",
            check=False)
    assert p.returncode == 2 and "is not a file" in p.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"article": "fine"}\n{"title": 3}\n')
    p = run(QUANTIZE, "--model_dir", hf_dir, "--qformat", "fp8", "--calib_data", bad, "--output_dir", tmp_path / "c",
            check=False)
    assert p.returncode == 2 and "line 2 is not an object with an 'article' text" in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    # a group the model's widths do not divide
    p = run(QUANTIZE, "--model_dir", hf_dir, "--qformat", "int4_wo", "--group_size", "128", "--output_dir",
            tmp_path / "c", check=False)
    assert p.returncode == 2 and "not a multiple of the group size 128" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "c").exists()


def _kv_scales(ckpt):
    with safe_open(str(ckpt / "rank0.safetensors"), framework="pt") as f:
        return {n: f.get_tensor(n) for n in f.keys() if n.endswith(".kv_cache_scale")}


@pytest.mark.parametrize("qformat,kv,algo", [("int8_wo", "int8", "W8A16"), ("none", "fp8", None)])
def test_kv_cache_dtype_with_any_weight_format(hf_dir, tmp_path, capsys, qformat, kv, algo):
    ckpt = tmp_path / "ckpt"
    quantize("--model_dir", hf_dir, "--qformat", qformat, "--kv_cache_dtype", kv, "--calib_size", "2",
             "--output_dir", ckpt)
    out = capsys.readouterr().out
    assert "calibrating on 2 samples" in out and f"KV cache {kv.upper()}" in out
    section = json.loads((ckpt / "config.json").read_text())["quantization"]
    assert section["kv_cache_quant_algo"] == kv.upper() and section["quant_algo"] == algo
    scales = _kv_scales(ckpt)
    assert sorted(scales) == [f"transformer.layers.{i}.attention.kv_cache_scale" for i in range(2)]
    assert all(tuple(s.shape) == (2,) and bool((s > 0).all()) and bool((s != 1).all()) for s in scales.values())


def test_kv_cache_build_run(hf_dir, tmp_path):
    ckpt, engine = tmp_path / "ckpt", tmp_path / "engine"
    quantize("--model_dir", hf_dir, "--qformat", "fp8", "--kv_cache_dtype", "int8", "--calib_size", "2",
             "--output_dir", ckpt)
    build_and_run(ckpt, engine)


def test_convert_checkpoint_kv_cache_dtype(hf_dir, tmp_path):
    # no calibration there: FP8 with scales 1.0; INT8 is refused in one line
    ckpt = tmp_path / "ckpt"
    p = run("examples/llama/convert_checkpoint.py", "--model_dir", hf_dir, "--output_dir", ckpt, "--use_weight_only",
            "--kv_cache_dtype", "fp8")
    assert "KV cache: FP8 codes, scales 1.0" in p.stdout
    section = json.loads((ckpt / "config.json").read_text())["quantization"]
    assert section["kv_cache_quant_algo"] == "FP8" and section["quant_algo"] == "W8A16"
    assert all(s.tolist() == [1.0, 1.0] for s in _kv_scales(ckpt).values()) and len(_kv_scales(ckpt)) == 2
    p = run("examples/llama/convert_checkpoint.py", "--model_dir", hf_dir, "--output_dir", tmp_path / "c",
            "--kv_cache_dtype", "int8", check=False)
    assert p.returncode == 2 and "--kv_cache_dtype int8 needs calibrated scales" in p.stderr
    assert "Traceback" not in p.stderr


def test_build_refuses_fp8_kv_cache_for_a_gpu_before_sm89(hf_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    quantize("--model_dir", hf_dir, "--qformat", "int8_wo", "--kv_cache_dtype", "fp8", "--calib_size", "1",
             "--output_dir", ckpt)
    p = run("-m", "tensorrt_llm.commands.build", "--checkpoint_dir", ckpt, "--output_dir", tmp_path / "e",
            *BUILD, "--target_device", "cuda:sm_80", check=False)
    assert p.returncode == 2 and "FP8 KV cache needs a GPU of compute capability 8.9 or newer" in p.stderr
    assert "sm_80" in p.stderr and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,message", [
    (["--qformat", "none"], "--qformat none quantizes nothing"),
    (["--qformat", "int8_wo", "--calib_size", "2"], "--calib_size applies to --qformat fp8, --kv_cache_dtype or"),
    (["--qformat", "fp8", "--kv_cache_dtype", "int4"], "invalid choice"),
])
def test_bad_kv_cache_flags_are_refused(hf_dir, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        quantize("--model_dir", hf_dir, "--output_dir", tmp_path / "c", *args)
    assert e.value.code == 2 and message in capsys.readouterr().err
