"""Meta checkpoints (params.json + consolidated.NN.pth): a Meta-format twin of a random
Hugging Face Llama, written here in 1 or 2 shards, converts with
`convert_checkpoint.py --meta_ckpt_dir` to the same weights and engine outputs as the
Hugging Face model itself, and both match transformers."""
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from tensorrt_llm.builder import BuildConfig, build
from tensorrt_llm.models.llama.convert import MetaCheckpoint, ffn_hidden_dim
from tensorrt_llm.models.llama.model import LLaMAForCausalLM
from tensorrt_llm.runtime import ModelRunner

from .llama_utils import generated, hf_greedy, random_hf_llama

ROOT = Path(__file__).resolve().parents[2]

# Hugging Face module -> Meta module, and the dim along which Meta's model parallelism splits it.
META_LAYER = {"input_layernorm": ("attention_norm", None), "post_attention_layernorm": ("ffn_norm", None),
              "self_attn.q_proj": ("attention.wq", 0), "self_attn.k_proj": ("attention.wk", 0),
              "self_attn.v_proj": ("attention.wv", 0), "self_attn.o_proj": ("attention.wo", 1),
              "mlp.gate_proj": ("feed_forward.w1", 0), "mlp.up_proj": ("feed_forward.w3", 0),
              "mlp.down_proj": ("feed_forward.w2", 1)}

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}

# (transformers overrides, how the Meta twin is written)
CASES = {
    "one_shard": (dict(intermediate_size=192), dict(shards=1)),
    # LLaMA 2 style: ParallelEmbedding splits the hidden dim, vocab_size -1, a rope.freqs buffer.
    "two_shards_llama2": (dict(intermediate_size=192, rms_norm_eps=1e-6),
                          dict(shards=2, embedding_dim=1, vocab_size=-1, rope_freqs=True)),
    # LLaMA 3.1 style: grouped-query heads, VocabParallelEmbedding, ffn_dim_multiplier, scaled rope.
    "two_shards_llama31_gqa": (dict(num_key_value_heads=2, intermediate_size=160, rope_theta=500000.0,
                                    rope_scaling=LLAMA3_ROPE),
                               dict(shards=2, embedding_dim=0, ffn_dim_multiplier=0.9,
                                    rope_theta=500000.0, use_scaled_rope=True)),
}


def interleave_rotary_rows(w, n_heads):
    """Hugging Face rotate-halves rows -> Meta's interleaved pairs (the inverse of HF's permute)."""
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, d // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def write_meta_checkpoint(hf, path: Path, shards=1, embedding_dim=0, vocab_size=None,
                          rope_freqs=False, ffn_dim_multiplier=None, rope_theta=None,
                          use_scaled_rope=False):
    c = hf.config
    state = hf.state_dict()
    whole = {"tok_embeddings.weight": (state["model.embed_tokens.weight"], embedding_dim),
             "norm.weight": (state["model.norm.weight"], None),
             "output.weight": (state["lm_head.weight"], 0)}
    for i in range(c.num_hidden_layers):
        for hf_module, (meta_module, dim) in META_LAYER.items():
            w = state[f"model.layers.{i}.{hf_module}.weight"]
            if hf_module == "self_attn.q_proj":
                w = interleave_rotary_rows(w, c.num_attention_heads)
            elif hf_module == "self_attn.k_proj":
                w = interleave_rotary_rows(w, c.num_key_value_heads)
            whole[f"layers.{i}.{meta_module}.weight"] = (w, dim)
    path.mkdir(parents=True)
    for s in range(shards):
        shard = {name: (w if dim is None or shards == 1 else w.chunk(shards, dim)[s]).clone()
                 for name, (w, dim) in whole.items()}
        if rope_freqs:
            shard["rope.freqs"] = torch.ones(c.head_dim // 2)
        torch.save(shard, path / f"consolidated.{s:02d}.pth")
    params = {"dim": c.hidden_size, "n_layers": c.num_hidden_layers, "n_heads": c.num_attention_heads,
              "n_kv_heads": c.num_key_value_heads, "vocab_size": vocab_size or c.vocab_size,
              "multiple_of": 32, "ffn_dim_multiplier": ffn_dim_multiplier, "norm_eps": c.rms_norm_eps}
    if rope_theta is not None:
        params["rope_theta"] = rope_theta
    if use_scaled_rope:
        params["use_scaled_rope"] = True
    (path / "params.json").write_text(json.dumps(params))
    return path


def convert(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "examples/llama/convert_checkpoint.py", *map(str, args)],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    return p


def engine(ckpt: Path, path: Path) -> ModelRunner:
    bc = BuildConfig(max_batch_size=2, max_input_len=48, max_seq_len=96, tokens_per_block=8,
                     target_device="any")
    build(LLaMAForCausalLM.from_checkpoint(ckpt), bc).save(path)
    return ModelRunner.from_dir(path, device="cpu")


@pytest.mark.parametrize("case", list(CASES))
def test_meta_twin_gives_the_same_engine_outputs_as_the_hugging_face_model(case, tmp_path):
    overrides, meta_kwargs = CASES[case]
    hf = random_hf_llama(seed=7, **overrides)
    meta_dir = write_meta_checkpoint(hf, tmp_path / "meta", **meta_kwargs)
    hf.save_pretrained(tmp_path / "hf")
    for source, flag in ((meta_dir, "--meta_ckpt_dir"), (tmp_path / "hf", "--model_dir")):
        p = convert(flag, source, "--output_dir", tmp_path / f"ckpt_{flag[2:]}")
        assert p.returncode == 0, p.stderr

    meta_w = safetensors.torch.load_file(tmp_path / "ckpt_meta_ckpt_dir" / "rank0.safetensors")
    hf_w = safetensors.torch.load_file(tmp_path / "ckpt_model_dir" / "rank0.safetensors")
    assert meta_w.keys() == hf_w.keys()
    for name in hf_w:
        assert torch.equal(meta_w[name], hf_w[name]), name
    meta_cfg = json.loads((tmp_path / "ckpt_meta_ckpt_dir" / "config.json").read_text())
    hf_cfg = json.loads((tmp_path / "ckpt_model_dir" / "config.json").read_text())
    for key in ("vocab_size", "intermediate_size", "num_key_value_heads", "norm_epsilon",
                "rotary_base", "rotary_scaling", "dtype", "share_embedding_table"):
        assert meta_cfg[key] == hf_cfg[key], key

    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, hf.config.vocab_size, (n,), generator=g).tolist() for n in (30, 11)]
    outs = [engine(tmp_path / f"ckpt_{kind}", tmp_path / f"engine_{kind}")
            .generate(prompts, max_new_tokens=10, return_context_logits=True)
            for kind in ("meta_ckpt_dir", "model_dir")]
    assert torch.equal(outs[0]["output_ids"], outs[1]["output_ids"])
    for ours, twin in zip(outs[0]["context_logits"], outs[1]["context_logits"]):
        assert torch.equal(ours, twin)
    for b, prompt in enumerate(prompts):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0]
        ours = outs[0]["context_logits"][b]
        torch.testing.assert_close(ours, ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())
        assert generated(outs[0], b, len(prompt)) == hf_greedy(hf, prompt, 10)


def test_interleaved_rows_are_metas_rotary_layout():
    """The twin writer's Q layout is the one Meta's own rotary (complex pairs) expects."""
    torch.manual_seed(0)
    heads, d, hidden, T = 2, 8, 16, 5
    w_hf = torch.randn(heads * d, hidden, dtype=torch.float64)
    x = torch.randn(T, hidden, dtype=torch.float64)
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    angles = pos / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # [T, d/2]
    # Meta (model.py apply_rotary_emb): consecutive pairs are complex numbers times e^{i*angle}.
    q = (x @ interleave_rotary_rows(w_hf, heads).T).view(T, heads, d // 2, 2)
    meta = torch.view_as_real(torch.view_as_complex(q.contiguous())
                              * torch.polar(torch.ones_like(angles), angles)[:, None]).flatten(2)
    # Hugging Face: rotate halves with cos/sin repeated over both halves.
    q = (x @ w_hf.T).view(T, heads, d)
    cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None], torch.cat([angles.sin()] * 2, -1)[:, None]
    hf = q * cos + torch.cat([-q[..., d // 2:], q[..., :d // 2]], -1) * sin
    # Same numbers, Meta's in pair order.
    torch.testing.assert_close(meta.view(T, heads, d // 2, 2).transpose(-1, -2).reshape(T, heads, d), hf)


def test_feed_forward_width_follows_metas_formula():
    assert ffn_hidden_dim(4096, 256, None) == 11008  # LLaMA 2 7B
    assert ffn_hidden_dim(8192, 4096, 1.3) == 28672  # LLaMA 3 70B
    assert ffn_hidden_dim(4096, 1024, 1.3) == 14336  # LLaMA 3 8B


class _RunsCode:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def test_pickled_code_in_a_shard_is_refused(tmp_path):
    meta_dir = write_meta_checkpoint(random_hf_llama(seed=9, intermediate_size=192), tmp_path / "meta")
    shard = torch.load(meta_dir / "consolidated.00.pth", weights_only=True)
    shard["extra"] = _RunsCode()
    with open(meta_dir / "consolidated.00.pth", "wb") as f:
        torch.save(shard, f, pickle_module=pickle)
    with pytest.raises(ValueError, match="not a plain tensor file"):
        MetaCheckpoint(meta_dir)
    p = convert("--meta_ckpt_dir", meta_dir, "--output_dir", tmp_path / "ckpt")
    assert p.returncode != 0 and "not a plain tensor file" in p.stderr
    assert "pickled code ran" not in p.stdout + p.stderr
    assert "Traceback" not in p.stderr


def test_a_feed_forward_width_params_json_does_not_give_is_refused(tmp_path):
    meta_dir = write_meta_checkpoint(random_hf_llama(seed=9, intermediate_size=160), tmp_path / "meta")
    with pytest.raises(ValueError, match="feed-forward width of 192"):
        MetaCheckpoint(meta_dir).config()
