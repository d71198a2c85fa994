"""BuildConfig, the engine format and its refusals."""
import json

import pytest
import torch

from tensorrt_llm.build_config import current_device_target
from tensorrt_llm.builder import BuildConfig, Engine, build
from tensorrt_llm.errors import EngineError
from tensorrt_llm.models import LLaMAForCausalLM, PretrainedConfig
from tensorrt_llm.version import __version__

from .models.llama_utils import engine_from_hf, generated, random_hf_llama, runner


@pytest.fixture(scope="module")
def hf():
    return random_hf_llama(seed=0)


@pytest.fixture
def engine_dir(hf, tmp_path):
    return engine_from_hf(hf, tmp_path / "engine")


def test_build_config_round_trip_and_checks():
    bc = BuildConfig(max_batch_size=3, max_input_len=100, max_seq_len=200, tokens_per_block=16)
    assert BuildConfig.from_dict(json.loads(json.dumps(bc.to_dict()))) == bc
    with pytest.raises(ValueError, match="unknown BuildConfig fields"):
        BuildConfig.from_dict({"max_batch_size": 1, "bogus": 2})
    with pytest.raises(ValueError, match="power of two"):
        BuildConfig(tokens_per_block=24)
    with pytest.raises(ValueError, match="max_position_embeddings 512"):
        BuildConfig(max_seq_len=1000).resolve(512)
    resolved = BuildConfig(max_batch_size=2, max_input_len=10).resolve(512)
    assert resolved.max_seq_len == 512 and resolved.max_num_tokens == 20


def test_engine_folder_layout_and_summary(engine_dir):
    assert sorted(p.name for p in engine_dir.iterdir()) == ["config.json", "rank0.engine"]
    config = json.loads((engine_dir / "config.json").read_text())
    assert config["version"]["package"] == __version__
    s = config["build_summary"]
    assert s["layers_after_rewriting"] < s["layers_before_rewriting"]
    assert s["rewrites"]


def test_engine_loads_the_same_graph_and_weights(hf, engine_dir):
    e = Engine.from_dir(engine_dir)
    assert "transformer.vocab_embedding.weight" in e.network.weights
    torch.testing.assert_close(e.network.weights["transformer.vocab_embedding.weight"],
                               hf.model.embed_tokens.weight.detach())


def test_truncated_engine_is_refused(engine_dir):
    path = engine_dir / "rank0.engine"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(EngineError, match="rebuild"):
        Engine.from_dir(engine_dir)


def test_altered_engine_is_refused(engine_dir):
    path = engine_dir / "rank0.engine"
    data = bytearray(path.read_bytes())
    data[-50] ^= 0x40  # one bit of one weight
    path.write_bytes(bytes(data))
    with pytest.raises(EngineError, match="checksum"):
        Engine.from_dir(engine_dir)


def test_engine_from_another_package_version_is_refused(engine_dir):
    path = engine_dir / "config.json"
    config = json.loads(path.read_text())
    config["version"]["package"] = "0.0.1"
    path.write_text(json.dumps(config))
    with pytest.raises(EngineError, match=r"built by tensorrt_llm 0.0.1, this is tensorrt_llm"):
        Engine.from_dir(engine_dir)


def test_engine_from_another_format_version_is_refused(engine_dir):
    path = engine_dir / "config.json"
    config = json.loads(path.read_text())
    config["version"]["format"] = 99
    path.write_text(json.dumps(config))
    with pytest.raises(EngineError, match="format version 99"):
        Engine.from_dir(engine_dir)


def test_engine_for_a_missing_gpu_architecture_is_refused(hf, tmp_path):
    engine_dir = engine_from_hf(hf, tmp_path / "engine", target_device="cuda:sm_90")
    if torch.cuda.is_available() and current_device_target() == "cuda:sm_90":
        pytest.skip("this machine has the sm_90 GPU the engine targets")
    with pytest.raises(EngineError, match="built for cuda:sm_90"):
        runner(engine_dir, device="cpu")


def test_failed_save_keeps_the_previous_engine(hf, engine_dir, monkeypatch):
    before = (engine_dir / "rank0.engine").read_bytes()
    e = Engine.from_dir(engine_dir)

    def broken(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr("tensorrt_llm.engine.save_file", broken)
    with pytest.raises(OSError):
        e.save(engine_dir)
    assert (engine_dir / "rank0.engine").read_bytes() == before
    out = runner(engine_dir).generate([[1, 2, 3]], max_new_tokens=2)
    assert len(generated(out, 0, 3)) == 2


def test_each_rewrite_pass_keeps_the_logits(hf, tmp_path):
    prompt = list(range(7, 30))
    plain_dir = engine_from_hf(hf, tmp_path / "plain", optimizations=[])
    plain = runner(plain_dir).generate([prompt], max_new_tokens=3, return_context_logits=True)
    ops_plain = [layer.op for layer in Engine.from_dir(plain_dir).network.layers]
    for name, gone in (("fuse_add_rms_norm", "rms_norm"), ("fuse_gate_up", "silu"),
                       ("fuse_rope_attention", "rotary_embedding")):
        engine_dir = engine_from_hf(hf, tmp_path / name, optimizations=[name])
        ops = [layer.op for layer in Engine.from_dir(engine_dir).network.layers]
        assert ops.count(gone) < ops_plain.count(gone), name
        out = runner(engine_dir).generate([prompt], max_new_tokens=3, return_context_logits=True)
        torch.testing.assert_close(out["context_logits"][0], plain["context_logits"][0], rtol=1e-5, atol=1e-5)
        assert out["output_ids"].tolist() == plain["output_ids"].tolist()
    assert "rotary_embedding" not in ops


def test_norm_and_activation_linear_fusions_keep_the_logits_bit_for_bit(hf, tmp_path):
    """The default build against one without fuse_norm_linear / fuse_act_linear: saved,
    loaded and generated with, the engines give the same logits, bit for bit."""
    prompt = list(range(5, 22))
    defaults = BuildConfig().optimizations
    prior = [p for p in defaults if p not in ("fuse_norm_linear", "fuse_act_linear")]
    outs, op_lists = [], []
    for name, passes in (("prior", prior), ("default", defaults)):
        engine_dir = engine_from_hf(hf, tmp_path / name, optimizations=passes)
        engine = Engine.from_dir(engine_dir)
        op_lists.append([layer.op for layer in engine.network.layers])
        assert engine.refit_map is not None  # the fusions make no weight: refit still works
        outs.append(runner(engine_dir).generate([prompt, prompt[:9]], max_new_tokens=4, return_context_logits=True))
    before, after = op_lists
    # Two layers: layer 0's input norm reads the embedding and ln_f the last residual add
    # (rms_norm); the other three norms read a residual add (fused_add_rms_norm).
    assert (before.count("rms_norm"), before.count("fused_add_rms_norm"), before.count("silu_and_mul")) == (2, 3, 2)
    assert (after.count("rms_norm_linear"), after.count("add_rms_norm_linear"), after.count("silu_and_mul_linear")) \
        == (2, 3, 2)
    assert not {"rms_norm", "fused_add_rms_norm", "silu_and_mul"} & set(after)
    assert len(after) == len(before) - 7
    for b in range(2):
        assert torch.equal(outs[1]["context_logits"][b], outs[0]["context_logits"][b])
    assert outs[1]["output_ids"].tolist() == outs[0]["output_ids"].tolist()


def test_an_8b_network_is_defined_and_rewritten_in_under_0_3_s():
    """build() of a Llama-3.1-8B-shaped model (weights on the meta device: no data) defines the
    network and runs every pass; the passes' FLayerInfo reads must not make that slow."""
    config = PretrainedConfig(
        architecture="LlamaForCausalLM", dtype="bfloat16", num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, hidden_size=4096, intermediate_size=14336, vocab_size=128256,
        max_position_embeddings=131072, rotary_base=500000.0,
        rotary_scaling={"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192})
    model = LLaMAForCausalLM(config)
    model.load({name: torch.empty(p.shape, dtype=torch.bfloat16, device="meta")
                for name, p in model.named_parameters()})
    torch.cat([torch.empty(1, device="meta")] * 2)  # torch loads its meta kernels on first use (a second)
    seconds = []
    for _ in range(3):
        engine = build(model, BuildConfig(target_device="any"))
        seconds.append(engine.config["build_summary"]["build_seconds"])
    summary = engine.config["build_summary"]
    assert (summary["layers_before_rewriting"], summary["layers_after_rewriting"]) == (713, 393)
    assert summary["rewrites"]["rewrites"] == {"fuse_add_rms_norm": 63, "fuse_gate_up": 32, "fuse_rope_attention": 32,
                                               "fuse_attention_fp8_linear": 0, "fuse_norm_linear": 65,
                                               "fuse_act_linear": 32, "fuse_fp8_gated_mlp": 0, "fuse_gated_linear": 0}
    assert min(seconds) < 0.3, seconds
