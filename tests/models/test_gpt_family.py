"""GPT-2, OPT, Phi and Bloom end to end: random-weight Hugging Face models, saved and
converted by examples/convert_checkpoint.py, built and run, give the logits and greedy tokens
of transformers."""
import importlib
import os
from pathlib import Path

import pytest
import torch
import transformers

from tensorrt_llm.builder import BuildConfig, build
from tensorrt_llm.layers import alibi_slopes
from tensorrt_llm.mapping import Mapping
from tensorrt_llm.models import MODEL_MAP, PretrainedConfig
from tensorrt_llm.models.modeling_utils import load_checkpoint_weights

from ..commands.test_cli_workflow import load_script
from .llama_utils import DEVICES, generated, hf_greedy, runner

os.environ.setdefault("HF_HUB_OFFLINE", "1")

convert_cli = load_script("examples/convert_checkpoint.py")

VOCAB = 320
# name -> (--model_type, transformers config arguments)
CASES = {
    "gpt2": ("gpt2", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256)),
    "gpt2_untied_gelu": ("gpt2", dict(n_embd=96, n_layer=2, n_head=3, n_inner=160, n_positions=256,
                                      activation_function="gelu", tie_word_embeddings=False)),
    "opt": ("opt", dict(hidden_size=64, ffn_dim=160, num_hidden_layers=2, num_attention_heads=4,
                        max_position_embeddings=256, word_embed_proj_dim=64)),
    "opt_post_norm": ("opt", dict(hidden_size=64, ffn_dim=160, num_hidden_layers=2, num_attention_heads=4,
                                  max_position_embeddings=256, word_embed_proj_dim=64,
                                  do_layer_norm_before=False)),
    # Phi-2's head_dim 80 and partial_rotary_factor 0.4 (rotary_dim 32)
    "phi2_like": ("phi", dict(hidden_size=160, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                              max_position_embeddings=256, partial_rotary_factor=0.4)),
    # phi_gqa_tied and bloom_5_heads have head_dim 64: on a GPU they run the attention kernels
    "phi_gqa_tied": ("phi", dict(hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)),
    "bloom_5_heads": ("bloom", dict(hidden_size=320, n_layer=2, n_head=5)),
    "bloom_12_heads": ("bloom", dict(hidden_size=96, n_layer=2, n_head=12)),
}


def random_hf(case: str, seed: int = 0):
    model_type, kw = CASES[case]
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(model_type, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2,
                                               pad_token_id=0, **kw)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    # transformers initialises matrices with std 0.02 and norms/biases with 1/0: large random
    # matrices make greedy tokens depend on the whole context (tied models otherwise tend to
    # repeat a token), and random norms/biases check that each lands in its place.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.5)
            else:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.1)
    return model


def convert(hf, tmp_path: Path, tp_size: int = 1) -> Path:
    """save_pretrained, then the converter CLI; returns the checkpoint folder."""
    hf_dir, ckpt = tmp_path / f"hf_{tp_size}", tmp_path / f"ckpt_{tp_size}"
    hf.save_pretrained(hf_dir)
    convert_cli.main(["--model_type", hf.config.model_type, "--model_dir", str(hf_dir),
                      "--output_dir", str(ckpt), "--dtype", "float32", "--tp_size", str(tp_size)])
    return ckpt


def engine_from_checkpoint(ckpt: Path, engine_dir: Path) -> Path:
    """What trtllm-build does: the model class named by the checkpoint's architecture."""
    config = PretrainedConfig.from_checkpoint(ckpt)
    model = MODEL_MAP[config.architecture].from_checkpoint(ckpt)
    bc = BuildConfig(max_batch_size=4, max_input_len=64, max_seq_len=128, tokens_per_block=8, target_device="any")
    build(model, bc).save(engine_dir)
    return engine_dir


def test_alibi_slopes_are_bloom_s():
    # build_alibi_tensor (public in every transformers version we meet) gives slope * position;
    # at position 1 that is the slope itself.
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    for n in (1, 2, 3, 5, 6, 8, 12, 16, 17, 40, 64, 112):
        theirs = build_alibi_tensor(torch.ones(1, 2), n, torch.float32)[:, 0, 1]
        torch.testing.assert_close(alibi_slopes(n), theirs, rtol=1e-6, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_greedy_match_transformers(case, device, tmp_path):
    hf = random_hf(case, seed=1)
    engine = engine_from_checkpoint(convert(hf, tmp_path), tmp_path / "engine")
    r = runner(engine, device=device)
    prompt = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(2)).tolist()

    out = r.generate([prompt], max_new_tokens=12, return_context_logits=True)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    ours = out["context_logits"][0].cpu()
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())
    want = hf_greedy(hf, prompt, 12)
    assert len(set(want)) >= 4, f"weak test: transformers' greedy tokens {want} hardly vary"
    assert generated(out, 0, len(prompt)) == want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["bloom_5_heads", "opt", "phi2_like"])
def test_ragged_batch_equals_each_alone(case, device, tmp_path):
    hf = random_hf(case, seed=3)
    r = runner(engine_from_checkpoint(convert(hf, tmp_path), tmp_path / "engine"), device=device)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 17, 1, 33)]
    together = r.generate(prompts, max_new_tokens=10)
    for b, p in enumerate(prompts):
        alone = r.generate([p], max_new_tokens=10)
        assert generated(together, b, len(p)) == generated(alone, 0, len(p)), f"prompt {b}"
        assert generated(alone, 0, len(p)) == hf_greedy(hf, p, 10), f"prompt {b}"


@pytest.mark.parametrize("case", ["bloom_12_heads", "gpt2", "phi_gqa_tied"])
def test_tensor_parallel_ranks_reassemble_the_whole(case, tmp_path):
    """Each rank holds its q/k/v heads, fc rows, dense/proj columns and lm_head rows."""
    hf = random_hf(case)
    whole = load_checkpoint_weights(convert(hf, tmp_path, tp_size=1))
    ckpt = convert(hf, tmp_path, tp_size=2)
    config = PretrainedConfig.from_checkpoint(ckpt)
    assert config.mapping == Mapping(world_size=2, tp_size=2)
    ranks = [load_checkpoint_weights(ckpt, r) for r in range(2)]
    assert set(ranks[0]) == set(ranks[1]) == set(whole)
    q = config.num_attention_heads * config.head_size
    kv = config.num_key_value_heads * config.head_size
    for name, want in whole.items():
        parts = [w[name] for w in ranks]
        if ".attention.qkv." in name:
            pieces = [p.split([q // 2, kv // 2, kv // 2]) for p in parts]
            got = torch.cat([torch.cat([pieces[0][i], pieces[1][i]]) for i in range(3)])
        elif name.endswith((".attention.dense.weight", ".mlp.proj.weight")):
            got = torch.cat(parts, dim=1)
        elif ".mlp.fc." in name or name.startswith("lm_head."):
            got = torch.cat(parts)
        elif name == "transformer.vocab_embedding.weight":  # vocabulary-parallel, padded to tp rows
            got = torch.cat(parts)
            assert not got[want.shape[0]:].any(), "vocab padding rows must be zero"
            got = got[:want.shape[0]]
        else:
            assert torch.equal(parts[0], parts[1]), name
            got = parts[0]
        assert torch.equal(got, want), name


@pytest.mark.parametrize("model_type, kw, message", [
    ("opt", dict(hidden_size=64, word_embed_proj_dim=32, num_attention_heads=4), "word_embed_proj_dim"),
    ("phi", dict(hidden_size=64, num_attention_heads=4, qk_layernorm=True), "qk_layernorm"),
    ("bloom", dict(hidden_size=64, n_head=4, apply_residual_connection_post_layernorm=True),
     "apply_residual_connection_post_layernorm"),
    ("gpt2", dict(n_embd=64, n_head=4, scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
])
def test_unsupported_variants_are_refused(model_type, kw, message):
    module = importlib.import_module(f"tensorrt_llm.models.{convert_cli.CONVERTERS[model_type]}.convert")
    with pytest.raises(ValueError, match=message):
        module.config_from_hf(transformers.AutoConfig.for_model(model_type, **kw))
