"""Refit: a built engine takes a new checkpoint's weights and then behaves exactly like an
engine built from that checkpoint; checkpoints that do not fit are refused, engine untouched."""
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from tensorrt_llm.builder import BuildConfig, Engine, build
from tensorrt_llm.errors import CheckpointError, EngineError
from tensorrt_llm.graph_rewriting import tile_weight_only_codes, tiled_code_weights
from tensorrt_llm.models.calibrate import calibrate_input_amax
from tensorrt_llm.models.llama.convert import config_from_hf, load_weights_from_hf
from tensorrt_llm.models.llama.model import LLaMAForCausalLM
from tensorrt_llm.models.modeling_utils import save_checkpoint
from tensorrt_llm.models.quantize import fp8_config, quantize_checkpoint, weight_only_config
from tensorrt_llm.ops.quantized_linear import tile_codes
from tensorrt_llm.refit import RefitError, refit_engine
from tensorrt_llm.runtime import ModelRunner

from .models.llama_utils import random_hf_llama

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(num_attention_heads=4, num_key_value_heads=2)


def checkpoint(hf, path, dtype="float32"):
    config = config_from_hf(hf.config, dtype=dtype)
    save_checkpoint(path, config, [load_weights_from_hf(hf, config)])
    return path


def build_engine(ckpt, path, dtype=None):
    model = LLaMAForCausalLM.from_checkpoint(ckpt, dtype=dtype)
    bc = BuildConfig(max_batch_size=2, max_input_len=32, max_seq_len=64, tokens_per_block=8,
                     target_device="any")
    build(model, bc).save(path)
    return path


def outputs(engine_dir):
    r = ModelRunner.from_dir(engine_dir, device="cpu")
    prompts = [list(range(5, 25)), [3, 1, 4, 1, 5, 9, 2, 6]]
    out = r.generate(prompts, max_new_tokens=8, return_context_logits=True)
    return out["output_ids"], [t.clone() for t in out["context_logits"]]


def digest(engine_dir):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(engine_dir).iterdir())}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refit")
    ckpt_a = checkpoint(random_hf_llama(seed=10, **SHAPE), tmp / "ckpt_a")
    ckpt_b = checkpoint(random_hf_llama(seed=11, **SHAPE), tmp / "ckpt_b")
    return tmp, ckpt_a, ckpt_b, build_engine(ckpt_b, tmp / "engine_b")


def assert_same_engine(engine, engine_b):
    """The refitted engine folder holds engine_b's every weight and generates its very tokens
    and logits; returns (the refitted engine, engine_b, the generated ids)."""
    refitted, built = Engine.from_dir(engine), Engine.from_dir(engine_b)  # checksums verified
    for name, w in built.network.weights.items():
        assert torch.equal(refitted.network.weights[name], w), name
    ids, logits = outputs(engine)
    ids_b, logits_b = outputs(engine_b)
    assert torch.equal(ids, ids_b)
    for ours, ref in zip(logits, logits_b):
        assert torch.equal(ours, ref)
    return refitted, built, ids


def test_refitted_engine_equals_engine_built_from_the_new_checkpoint(setup, tmp_path):
    tmp, ckpt_a, ckpt_b, engine_b = setup
    engine = build_engine(ckpt_a, tmp_path / "engine")
    before = outputs(engine)
    report = refit_engine(engine, ckpt_b)  # in place
    assert report["ranks"] == 1 and report["weights_replaced"] > 0
    assert not [p for p in engine.iterdir() if p.name.startswith(".refit-")]

    refitted, built, ids = assert_same_engine(engine, engine_b)
    assert refitted.network.to_json() == built.network.to_json()
    assert refitted.network.weights.keys() == built.network.weights.keys()
    assert any(".mlp.gate_up.weight" in n for n in built.network.weights)  # a fused weight is refitted
    assert not torch.equal(ids, before[0])  # the weights really changed the output


def fp8_checkpoint(hf, path):
    """An FP8 checkpoint (per-tensor weight scales, calibrated static input scales) of `hf`."""
    config = config_from_hf(hf.config, dtype="float32")
    weights = load_weights_from_hf(hf, config)
    config = fp8_config(config)
    amax = calibrate_input_amax(hf, [list(range(3, 30)), [7, 1, 8, 2, 8]])
    save_checkpoint(path, config, [quantize_checkpoint(LLaMAForCausalLM, config, weights, input_amax=amax)])
    return path


@pytest.fixture(scope="module")
def fp8_setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refit_fp8")
    return tuple(fp8_checkpoint(random_hf_llama(seed=seed, **SHAPE), tmp / name)
                 for seed, name in ((10, "ckpt_a"), (11, "ckpt_b")))


def with_other_fc_scales(ckpt, path):
    """`ckpt` with each MLP's fc weight scale doubled: gate and fc no longer share one, as in
    FP8 checkpoints quantized elsewhere (a valid checkpoint: the fc weights double)."""
    path.mkdir()
    shutil.copy(ckpt / "config.json", path / "config.json")
    weights = safetensors.torch.load_file(ckpt / "rank0.safetensors")
    for name in [n for n in weights if n.endswith(".mlp.fc.weight_scale")]:
        weights[name] = weights[name] * 2
    safetensors.torch.save_file(weights, path / "rank0.safetensors")
    return path


def test_an_fp8_engine_takes_an_fp8_checkpoint(fp8_setup, tmp_path):
    ckpt_a, ckpt_b = fp8_setup
    engine, engine_b = build_engine(ckpt_a, tmp_path / "engine"), build_engine(ckpt_b, tmp_path / "engine_b")
    report = refit_engine(engine, ckpt_b)
    assert report["weights_replaced"] > 0
    _, built, _ = assert_same_engine(engine, engine_b)
    codes = [n for n, w in built.network.weights.items() if w.dtype == torch.uint8]
    assert codes and any(n.endswith(".input_scale") for n in built.network.weights)
    # gate and fc run fused, with the gate's per-tensor scales read for both
    assert "transformer.layers.0.mlp.gate_up.weight" in codes
    p = "transformer.layers.0.mlp"
    assert built.refit_map["equal"][f"{p}.fc.weight_scale"] == f"{p}.gate.weight_scale"
    assert built.refit_map["equal"][f"{p}.fc.input_scale"] == f"{p}.gate.input_scale"


def test_an_fp8_engine_with_per_channel_gate_up_scales_takes_a_checkpoint(fp8_setup, tmp_path):
    ckpt_a, ckpt_b = (with_other_fc_scales(c, tmp_path / c.name) for c in fp8_setup)
    engine, engine_b = build_engine(ckpt_a, tmp_path / "engine"), build_engine(ckpt_b, tmp_path / "engine_b")
    refit_engine(engine, ckpt_b)
    _, built, _ = assert_same_engine(engine, engine_b)
    # the two per-tensor scales, each repeated over its rows
    p = "transformer.layers.0.mlp"
    rows = built.network.weights[f"{p}.gate_up.weight"].shape[0]
    assert built.network.weights[f"{p}.gate_up.weight_scale"].shape == (rows,)
    assert built.refit_map["sources"][f"{p}.gate_up.weight_scale"] == [[f"{p}.gate.weight_scale", rows // 2],
                                                                       [f"{p}.fc.weight_scale", rows // 2]]


def test_an_fp8_engine_with_one_gate_up_scale_refuses_a_checkpoint_with_two(fp8_setup, tmp_path):
    ckpt_a, ckpt_b = fp8_setup
    engine = build_engine(ckpt_a, tmp_path / "engine")
    original = digest(engine)
    with pytest.raises(RefitError) as e:
        refit_engine(engine, with_other_fc_scales(ckpt_b, tmp_path / "other"))
    assert "2 problem(s)" in str(e.value)  # one per layer
    assert ("transformer.layers.1.mlp.fc.weight_scale differs from transformer.layers.1.mlp.gate.weight_scale"
            in str(e.value))
    assert digest(engine) == original


def int8_checkpoint(hf, path):
    config = config_from_hf(hf.config, dtype="float32")
    weights = load_weights_from_hf(hf, config)
    config = weight_only_config(config, "int8")
    save_checkpoint(path, config, [quantize_checkpoint(LLaMAForCausalLM, config, weights)])
    return path


def test_an_engine_saved_with_codes_in_tile_order_takes_a_checkpoint(tmp_path):
    # A runner on a GPU puts weight-only codes in tile order (graph_rewriting.tile_weight_only_codes);
    # an engine saved after that keeps them so, and refit puts the new codes in that order too.
    ckpt_a, ckpt_b = (int8_checkpoint(random_hf_llama(seed=seed, **SHAPE), tmp_path / name)
                      for seed, name in ((10, "ckpt_a"), (11, "ckpt_b")))
    engine_b = build_engine(ckpt_b, tmp_path / "engine_b")
    loaded = Engine.from_dir(build_engine(ckpt_a, tmp_path / "engine_a"))
    assert tile_weight_only_codes(loaded.network) > 0
    tiled = tiled_code_weights(loaded.network)
    loaded.save(tmp_path / "engine")
    refit_engine(tmp_path / "engine", ckpt_b)
    refitted, built = Engine.from_dir(tmp_path / "engine"), Engine.from_dir(engine_b)
    assert tiled_code_weights(refitted.network) == tiled
    for name, w in built.network.weights.items():
        assert torch.equal(refitted.network.weights[name], tile_codes(w) if name in tiled else w), name
    assert torch.equal(outputs(tmp_path / "engine")[0], outputs(engine_b)[0])


def test_cli_writes_to_another_folder_and_keeps_the_original(setup, tmp_path):
    tmp, ckpt_a, ckpt_b, engine_b = setup
    engine = build_engine(ckpt_a, tmp_path / "engine")
    (engine / "tokenizer_config.json").write_text("{}")  # other files travel with the engine
    original = digest(engine)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "tensorrt_llm.commands.refit", "--engine_dir", str(engine),
                        "--checkpoint_dir", str(ckpt_b), "--output_dir", str(tmp_path / "out")],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "Refitted engine written to" in p.stdout
    assert digest(engine) == original
    assert (tmp_path / "out" / "tokenizer_config.json").is_file()
    assert torch.equal(outputs(tmp_path / "out")[0], outputs(engine_b)[0])


def test_refuses_names_shapes_and_dtypes_that_differ_and_leaves_the_engine_intact(setup, tmp_path):
    tmp, ckpt_a, ckpt_b, _ = setup
    engine = build_engine(ckpt_a, tmp_path / "engine")
    original = digest(engine)

    def edit(w):
        w["transformer.layers.0.mlp.gatex.weight"] = w.pop("transformer.layers.0.mlp.gate.weight")
        w["transformer.layers.1.mlp.fc.weight"] = w["transformer.layers.1.mlp.fc.weight"][:-1]
        w["transformer.ln_f.weight"] = w["transformer.ln_f.weight"].double()
        return w

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((ckpt_b / "config.json").read_text())
    safetensors.torch.save_file(edit(safetensors.torch.load_file(ckpt_b / "rank0.safetensors")),
                                bad / "rank0.safetensors")
    with pytest.raises(RefitError) as e:
        refit_engine(engine, bad)
    msg = str(e.value)
    assert "4 problem(s)" in msg
    assert "missing: transformer.layers.0.mlp.gate.weight" in msg
    assert "unexpected: transformer.layers.0.mlp.gatex.weight" in msg
    assert "transformer.layers.1.mlp.fc.weight: engine has float32 [160, 64], checkpoint has float32 [159, 64]" in msg
    assert "transformer.ln_f.weight: engine has float32 [64], checkpoint has float64 [64]" in msg
    assert digest(engine) == original
    Engine.from_dir(engine)  # still loads and passes its checksum


@pytest.mark.parametrize("kind", ["other_shape", "other_dtype"])
def test_refuses_a_checkpoint_whose_config_differs(setup, tmp_path, kind):
    tmp, ckpt_a, ckpt_b, _ = setup
    engine = build_engine(ckpt_a, tmp_path / "engine")
    original = digest(engine)
    if kind == "other_shape":
        other = checkpoint(random_hf_llama(seed=12, intermediate_size=96, **SHAPE), tmp_path / "c")
        expected = "intermediate_size: engine 160, checkpoint 96"
    else:
        other = checkpoint(random_hf_llama(seed=12, **SHAPE), tmp_path / "c", dtype="float16")
        expected = "dtype: engine 'float32', checkpoint 'float16'"
    with pytest.raises(RefitError, match="config differs") as e:
        refit_engine(engine, other)
    assert expected in str(e.value)
    assert digest(engine) == original


def test_refuses_an_engine_without_a_refit_map(setup, tmp_path):
    tmp, ckpt_a, ckpt_b, _ = setup
    engine = build_engine(ckpt_a, tmp_path / "engine")
    e = Engine.from_dir(engine)
    e.refit_map = None
    e.save(engine)
    original = digest(engine)
    with pytest.raises(EngineError, match="no refit map"):
        refit_engine(engine, ckpt_b)
    assert digest(engine) == original


def test_refuses_a_damaged_engine(setup, tmp_path):
    tmp, ckpt_a, ckpt_b, _ = setup
    engine = build_engine(ckpt_a, tmp_path / "engine")
    data = bytearray((engine / "rank0.engine").read_bytes())
    data[-1] ^= 0xFF
    (engine / "rank0.engine").write_bytes(bytes(data))
    with pytest.raises(EngineError, match="checksum"):
        refit_engine(engine, ckpt_b)
    assert (engine / "rank0.engine").read_bytes() == bytes(data)


def test_refuses_a_truncated_checkpoint_naming_it_and_leaves_the_engine_intact(setup, tmp_path):
    tmp, ckpt_a, ckpt_b, _ = setup
    engine = build_engine(ckpt_a, tmp_path / "engine")
    original = digest(engine)
    cut = tmp_path / "cut"
    shutil.copytree(ckpt_b, cut)
    data = (cut / "rank0.safetensors").read_bytes()
    (cut / "rank0.safetensors").write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match=f"rank0.safetensors is truncated: expected {len(data)} bytes, "
                                              f"file has {len(data) - 100}"):
        refit_engine(engine, cut)
    assert digest(engine) == original


def test_an_act_order_engine_takes_a_checkpoint_and_refuses_a_bad_input_order(tmp_path):
    """GPTQ act-order: the engine reads gate's input order for the fused gate_up, so the up's must
    equal it; an order with a value out of range would be gathered by the GEMV unchecked: refused,
    the engine untouched."""
    from tensorrt_llm.models.llama.convert import load_weight_only_from_awq_gptq

    from .models.test_awq_gptq_convert import _folder
    hf = random_hf_llama(seed=12, **SHAPE)
    folder, _ = _folder(hf, tmp_path / "gptq", "gptq", act_order=True)
    config, weights = load_weight_only_from_awq_gptq(folder, config_from_hf(folder, "float32"))
    ckpt = tmp_path / "ckpt"
    save_checkpoint(ckpt, config, [weights])
    engine = build_engine(ckpt, tmp_path / "engine")
    before = outputs(engine)
    refit_engine(engine, ckpt)
    assert all(torch.equal(a, b) for a, b in zip(before[1], outputs(engine)[1]))
    original = digest(engine)
    for name, value, problem in (("transformer.layers.1.attention.dense.weight_perm", -1, "holds indices -1 .. "),
                                 ("transformer.layers.0.mlp.fc.weight_perm", None,
                                  "transformer.layers.0.mlp.fc.weight_perm differs from "
                                  "transformer.layers.0.mlp.gate.weight_perm")):
        bad = dict(weights)
        perm = bad[name].clone()
        if value is None:
            perm[[0, 1]] = perm[[1, 0]]
        else:
            perm[3] = value
        bad[name] = perm
        other = tmp_path / f"bad_{name.split('.')[-2]}"
        save_checkpoint(other, config, [bad])
        with pytest.raises(RefitError, match=problem):
            refit_engine(engine, other)
        assert digest(engine) == original
