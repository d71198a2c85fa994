"""Timing cache and kernel choice: the cache file, its keys, the builder's recorded choices,
the Session honouring them, and trtllm-build's --input/--output_timing_cache."""
import json
import time

import pytest
import torch

from tensorrt_llm import timing_cache as tc
from tensorrt_llm.builder import BuildConfig, Engine, build
from tensorrt_llm.commands.build import main as trtllm_build
from tensorrt_llm.models.llama.convert import config_from_hf, load_weights_from_hf
from tensorrt_llm.models.llama.model import LLaMAForCausalLM
from tensorrt_llm.models.modeling_utils import save_checkpoint
from tensorrt_llm.ops import OPS, implementations, references
from tensorrt_llm.runtime.session import lower
from tensorrt_llm.timing_cache import TimingCache, TimingCacheError

from .models.llama_utils import generated, random_hf_llama, runner


@pytest.fixture(scope="module")
def hf():
    return random_hf_llama(seed=0)


def build_engine(hf, timing_cache=None, device=None, **build_kwargs):
    config = config_from_hf(hf.config, dtype="float32")
    model = LLaMAForCausalLM(config)
    model.load(load_weights_from_hf(hf, config))
    bc = dict(max_batch_size=4, max_input_len=64, max_seq_len=128, tokens_per_block=8, target_device="any")
    bc.update(build_kwargs)
    return build(model, BuildConfig(**bc), timing_cache=timing_cache, device=device)


def layers_of(engine, op):
    return [layer for layer in engine.network.layers if layer.op == op]


# What a LLaMA's norms and MLP activations become in a default build: the timed ops.
FUSED_LINEAR_OPS = ("rms_norm_linear", "add_rms_norm_linear", "silu_and_mul_linear")


def test_cache_round_trip(tmp_path):
    cache = TimingCache({'["rms_norm","dev"]': {"reference": 12.5, "cuda": 3.25}})
    path = tmp_path / "sub" / "timing.json"
    cache.save(path)
    assert json.loads(path.read_text())["version"] == tc.TIMING_CACHE_VERSION
    assert TimingCache.load(path).entries == cache.entries
    assert [p.name for p in path.parent.iterdir()] == ["timing.json"]  # no temporary left


@pytest.mark.parametrize("text, match", [
    ("{not json", "cannot be read"),
    ('{"version": 99, "entries": {}}', "version 99"),
    ('["a list"]', "version None"),
    ('{"version": 1, "entries": {"k": {"cuda": "fast"}}}', "entries"),
])
def test_unusable_cache_files_are_refused_with_the_reason(tmp_path, text, match):
    path = tmp_path / "timing.json"
    path.write_text(text)
    with pytest.raises(TimingCacheError, match=match):
        TimingCache.load(path)
    with pytest.raises(TimingCacheError, match="cannot be read"):
        TimingCache.load(tmp_path / "missing.json")


def test_keys_use_opt_shapes_and_are_stable(hf):
    def keys(engine):
        memo = {}
        return [tc.timing_key(layer.op, "dev", "float32", tc.opt_shapes(engine.network, layer, memo), layer.attrs)
                for layer in layers_of(engine, "rms_norm_linear")]

    a, b = build_engine(hf), build_engine(hf)
    assert keys(a) == keys(b)
    # max_num_tokens = 4 * 64 = 256, whose opt is min(256, 256); hidden size 64; layer 0's
    # input norm and the qkv projection ((4 + 2 * 4) heads of 16), no bias.
    layer = layers_of(a, "rms_norm_linear")[0]
    assert tc.opt_shapes(a.network, layer, {}) == [[256, 64], [64], [192, 64], None]
    smaller = build_engine(hf, max_input_len=16)  # num_tokens opt: 4 * 16 = 64
    assert tc.opt_shapes(smaller.network, layers_of(smaller, "rms_norm_linear")[0], {}) == \
        [[64, 64], [64], [192, 64], None]
    assert keys(smaller) != keys(a)


def test_cpu_build_with_a_cache_times_the_ops_with_two_cpu_implementations_and_keeps_the_graph(hf):
    """On the CPU the norms, fused into their linears or not, have two implementations (the host
    RMSNorm and the reference): those layers are timed, nothing else; the graph stays the same."""
    cache = TimingCache()
    timed = build_engine(hf, timing_cache=cache, device="cpu")
    plain = build_engine(hf)
    k = timed.config["build_summary"]["kernel_choice"]
    table = implementations(torch.device("cpu"))
    two = {layer.name for layer in plain.network.layers
           if len(table.get(layer.op, {})) > 1 and not OPS[layer.op].side_effects}
    assert two and set(k["layers"]) == two and k["device"] == "cpu"
    assert all(v["implementation"] in ("cpu", "reference") for v in k["layers"].values())
    assert k["misses"] == len(cache.entries) and k["hits"] + k["misses"] == len(two)
    assert "kernel_choice" not in plain.config["build_summary"]
    for layer in timed.network.layers:  # apart from the recorded choices, the plain build's graph
        layer.attrs.pop("implementation", None)
    assert timed.network.to_json() == plain.network.to_json()


def test_choice_between_two_cpu_implementations_is_timed_cached_and_run(hf, monkeypatch, tmp_path):
    """Give silu_and_mul_linear's CPU implementations (its host kernel and the reference) a slow third one."""
    calls = []
    op = "silu_and_mul_linear"

    def slow(*args, **kwargs):
        calls.append(1)
        # 20 ms: far above the reference's time on a busy 2-core machine (2 ms once lost to it)
        time.sleep(0.02)
        return references()[op](*args, **kwargs)

    def with_slow(device):
        table = real(device)
        table[op] = {**table[op], "slow": slow}
        return table
    real = tc.implementations
    monkeypatch.setattr(tc, "implementations", with_slow)

    cache = TimingCache()
    first = build_engine(hf, timing_cache=cache, device="cpu")
    k = first.config["build_summary"]["kernel_choice"]
    timed = layers_of(first, op)
    assert len(timed) == 2 and {layer.name for layer in timed} <= set(k["layers"])
    # the faster of the real two (which one varies with the machine's load), never the slow one
    assert all(layer.attrs["implementation"] in ("cpu", "reference") for layer in timed)
    assert len([key for key in cache.entries if json.loads(key)[0] == op]) == 1  # one shape for every down projection
    assert all(k["layers"][layer.name]["timings_us"]["slow"]
               > k["layers"][layer.name]["timings_us"][layer.attrs["implementation"]] for layer in timed)

    cache.save(tmp_path / "timing.json")
    calls.clear()
    second = build_engine(hf, timing_cache=TimingCache.load(tmp_path / "timing.json"), device="cpu")
    k2 = second.config["build_summary"]["kernel_choice"]
    assert (k2["misses"], k2["hits"], calls) == (0, len(k["layers"]), [])

    # lower() runs the recorded implementation and never passes `implementation` on.
    layer = layers_of(second, op)[0]
    layer.attrs["implementation"] = "slow"
    source, plan = lower(second.network, references(), with_slow(torch.device("cpu")))
    assert "implementation" not in source
    assert any(v is slow for v in plan.__globals__.values())


def test_engine_with_recorded_choices_saves_loads_and_runs(hf, tmp_path):
    """A choice this device lacks ("cuda" on the CPU) runs the device's default."""
    engine = build_engine(hf)
    chosen = [layer for op in FUSED_LINEAR_OPS for layer in layers_of(engine, op)]
    assert len(chosen) == 2 + 3 + 2  # first and final norms, the other norms, the MLPs' down projections
    for layer in chosen:
        layer.attrs["implementation"] = "cuda"
    engine.save(tmp_path / "chosen")
    build_engine(hf).save(tmp_path / "plain")
    loaded = Engine.from_dir(tmp_path / "chosen")
    assert [layer.attrs["implementation"] for op in FUSED_LINEAR_OPS for layer in layers_of(loaded, op)] == \
        ["cuda"] * len(chosen)
    prompt = list(range(3, 20))
    outs = [runner(tmp_path / name).generate([prompt], max_new_tokens=6) for name in ("chosen", "plain")]
    assert generated(outs[0], 0, len(prompt)) == generated(outs[1], 0, len(prompt))


def test_cli_reads_and_writes_the_timing_cache(hf, tmp_path, capsys):
    config = config_from_hf(hf.config, dtype="float32")
    save_checkpoint(tmp_path / "ckpt", config, [load_weights_from_hf(hf, config)])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = tmp_path / "out" / "timing.json"
    argv = ["--checkpoint_dir", str(tmp_path / "ckpt"), "--output_dir", str(tmp_path / "engine"),
            "--max_batch_size", "2", "--max_input_len", "32", "--max_seq_len", "64", "--target_device", "any",
            "--input_timing_cache", str(bad), "--output_timing_cache", str(out)]
    assert trtllm_build(argv) == 0
    err = capsys.readouterr().err
    assert "warning: timing cache" in err and "cannot be read" in err and "timing from scratch" in err
    assert TimingCache.load(out).entries == {}  # nothing to time for target "any"
    argv[argv.index(str(bad))] = str(out)
    assert trtllm_build(argv) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.gpu
def test_cuda_choices_are_recorded_reused_and_keep_outputs(hf, tmp_path):
    cache = TimingCache()
    timed = build_engine(hf, timing_cache=cache, device="cuda")
    k = timed.config["build_summary"]["kernel_choice"]
    assert k["device"] == torch.cuda.get_device_name() and k["misses"] > 0
    chosen = {layer.name: layer.attrs.get("implementation") for op in FUSED_LINEAR_OPS
              for layer in layers_of(timed, op)}
    assert chosen and all(v in ("cuda", "reference") for v in chosen.values())
    assert {name: k["layers"][name]["implementation"] for name in chosen} == chosen
    assert not any("implementation" in layer.attrs for layer in layers_of(timed, "gpt_attention"))

    cache.save(tmp_path / "timing.json")
    again = build_engine(hf, timing_cache=TimingCache.load(tmp_path / "timing.json"), device="cuda")
    k2 = again.config["build_summary"]["kernel_choice"]
    assert k2["misses"] == 0 and k2["hits"] == len(k["layers"])
    assert {n: v["implementation"] for n, v in k2["layers"].items()} == \
        {n: v["implementation"] for n, v in k["layers"].items()}

    timed.save(tmp_path / "timed")
    build_engine(hf).save(tmp_path / "plain")
    prompt = list(range(3, 40))
    outs = [runner(tmp_path / name, device="cuda").generate([prompt], max_new_tokens=12,
                                                            return_context_logits=True)
            for name in ("timed", "plain")]
    assert generated(outs[0], 0, len(prompt)) == generated(outs[1], 0, len(prompt))
    torch.testing.assert_close(outs[0]["context_logits"][0], outs[1]["context_logits"][0],
                               rtol=1e-3, atol=1e-3)
