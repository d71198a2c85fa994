"""The multi-rank benchmarks as a user runs them: bench_generation.py and bench_throughput.py
with --tp_size / --pp_size start their own rank processes (gloo on the CPU here, a tiny random
Llama), each rank builds its own shard in memory, rank 0 alone prints and writes the JSON."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "llama-tiny", "--dtype", "float32", "--device", "cpu"]


def rank_env(dist_timeout: str = "60") -> dict:
    """This environment for a script that starts its own rank processes: no launcher's variables,
    a collective timeout, one thread a rank, no hub."""
    env = dict(os.environ, TRTLLM_DIST_TIMEOUT=dist_timeout, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def run(script: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=ROOT, env=rank_env(),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_bench_generation_tp2_against_one_rank_in_one_run(tmp_path):
    out = tmp_path / "g.json"
    proc = run("bench_generation.py", *TINY, "--batch_sizes", "1,2", "--input_len", "8", "--output_len", "6",
               "--repeats", "1", "--tp_size", "2", "--compare_one_gpu", "--json", str(out))
    result = json.loads(out.read_text())
    assert (result["tp_size"], result["pp_size"]) == (2, 1)
    one = result["one_gpu"]
    assert (one["tp_size"], one["pp_size"]) == (1, 1)
    # Each rank holds its shard: more than half the one-rank bytes (norms and the rotary table
    # are replicated), less than all of them.
    half = one["per_rank_weight_bytes"][0] / 2
    assert len(result["per_rank_weight_bytes"]) == 2
    assert all(half <= b < 2 * half for b in result["per_rank_weight_bytes"])
    floor = max(result["per_rank_weight_bytes"]) / (result["copy_bandwidth_GBps"] * 1e9) * 1e3
    for row in result["rows"]:
        assert abs(row["floor_ms"] - floor) < 1e-9 * floor
        assert row["speedup_vs_one_gpu"] == pytest.approx(row["one_gpu_ms_per_step"] / row["ours_ms_per_step"])
    # Rank 0 alone prints: one row line per batch size and run.
    assert proc.stdout.count('{"batch": 1,') == 2 and proc.stdout.count('{"batch": 2,') == 2
    assert "TP2xPP1 ms/step" in proc.stdout


def test_bench_generation_pp2_floor_is_its_stages_in_turn(tmp_path):
    out = tmp_path / "g.json"
    proc = run("bench_generation.py", *TINY, "--batch_sizes", "2", "--input_len", "8", "--output_len", "4",
               "--repeats", "1", "--pp_size", "2", "--pp_partition", "1,3", "--json", str(out))
    result = json.loads(out.read_text())
    assert (result["tp_size"], result["pp_size"], result["pp_partition"]) == (1, 2, [1, 3])
    stages = sum(result["per_rank_weight_bytes"])
    assert result["rows"][0]["floor_ms"] == pytest.approx(stages / (result["copy_bandwidth_GBps"] * 1e9) * 1e3)
    assert proc.stdout.count('{"batch": 2,') == 1


def test_llama_70b_rank_of_tp2_holds_half_the_model_built_over_meta_weights():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_generation import SHAPES, meta_rank_engine

    from tensorrt_llm.builder import BuildConfig
    from tensorrt_llm.mapping import Mapping
    shape = SHAPES["llama-70b"]
    assert (shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]) == (8192, 28672, 80)
    assert (shape["num_attention_heads"], shape["num_key_value_heads"], shape["vocab_size"]) == (64, 8, 128256)
    assert shape["rope_theta"] == 500000.0 and shape["rope_scaling"]["factor"] == 8.0
    bc = BuildConfig(max_batch_size=32, max_input_len=128, max_seq_len=264, max_num_tokens=4096)
    engine, params = meta_rank_engine("llama-70b", "bfloat16", Mapping(world_size=2, rank=1, tp_size=2), bc)
    whole, norms = 70_553_706_496, 8192 * (2 * 80 + 1)  # Llama-3.1-70B; its norms are on every rank
    assert params == (whole - norms) // 2 + norms
    meta = [w for w in engine.network.weights.values() if w is not None and w.is_meta]
    assert sum(w.numel() for w in meta) == params  # no weight made, none lost by the rewrites
    assert engine.rank == 1


def test_bench_throughput_pp2_against_one_rank(tmp_path):
    out = tmp_path / "t.json"
    proc = run("bench_throughput.py", *TINY, "--num_requests", "12", "--input_len", "8", "--output_len", "6",
               "--max_batch_size", "8", "--max_num_tokens", "128", "--tokens_per_block", "8", "--pp_size", "2",
               "--compare_one_gpu", "--json", str(out))
    result = json.loads(out.read_text())
    # The balanced default: the LM head (1,024 x 64) weighs ~1.8 of llama-tiny's layers.
    assert (result["tp_size"], result["pp_size"], result["pp_partition"]) == (1, 2, [3, 1])
    for run_ in (result["inflight"], result["one_gpu"]["inflight"]):
        assert run_["output_tokens"] == 12 * 6 and run_["input_tokens"] == 12 * 8
    assert result["inflight"]["peak_in_flight"] == 2  # the two stages computed at once
    assert result["speedup_vs_one_gpu"] == pytest.approx(
        result["inflight"]["output_tok_s"] / result["one_gpu"]["inflight"]["output_tok_s"])
    assert proc.stdout.count("| in-flight |") == 2  # rank 0 of each run alone prints
    assert "TP1 x PP2 / 1 GPU:" in proc.stdout


def test_llama_8b_pp2_stages_are_balanced_by_default():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_generation import meta_rank_engine

    from tensorrt_llm.builder import BuildConfig
    from tensorrt_llm.mapping import Mapping
    bc = BuildConfig(max_batch_size=8, max_input_len=64, max_seq_len=128, max_num_tokens=512)
    layers = {}
    for rank, partition in ((0, None), (1, None), (1, [16, 16])):
        engine, _ = meta_rank_engine("llama-8b", "bfloat16", Mapping(2, rank, 1, 2, pp_partition=partition), bc)
        layers[rank, partition is None] = engine.network._tensors["kv_cache_pool"].shape[0]
        assert engine.pretrained_config["mapping"]["pp_partition"] == (partition or [17, 15])
    assert layers == {(0, True): 17, (1, True): 15, (1, False): 16}


@pytest.mark.parametrize("script", ["bench_generation.py", "bench_throughput.py"])
def test_a_bad_pp_partition_is_refused_before_any_rank_starts(script):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--model", "llama-8b",
                           "--pp_size", "2", "--pp_partition", "16,15"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].endswith(
        "error: --pp_partition 16,15 sums to 31, not llama-8b's 32 layers"), proc.stderr


def test_bench_throughput_tp2_with_poisson_arrivals(tmp_path):
    # Arrivals on rank 0's clock: both ranks admit each request at the same step.
    out = tmp_path / "t.json"
    run("bench_throughput.py", *TINY, "--num_requests", "8", "--input_len", "8", "--output_len", "4",
        "--max_batch_size", "4", "--max_num_tokens", "64", "--tokens_per_block", "8", "--tp_size", "2",
        "--request_rate", "200", "--static_batch_sizes", "4", "--json", str(out))
    result = json.loads(out.read_text())
    assert result["inflight"]["output_tokens"] == 8 * 4 and result["static"][0]["batch"] == 4


# Two gloo ranks run bench_throughput's static generate on requests that arrive over time, rank 1
# coming back from each batch half a second after rank 0 (a delay injected around the real
# runner's generate). Each rank writes the batches it formed.
LAGGING_STATIC = '''
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
from bench_generation import random_rank_engine
from bench_throughput import run_static
from launch_ranks import run_ranks
import tensorrt_llm.distributed as distributed
from tensorrt_llm.builder import BuildConfig
from tensorrt_llm.mapping import Mapping
from tensorrt_llm.runtime import ModelRunner


def rank(out):
    info = distributed.launch_info()
    device = torch.device("cpu")
    mapping = Mapping(world_size=2, rank=info.rank, tp_size=2, pp_size=1)
    distributed.init(mapping, device, info)
    bc = BuildConfig(max_batch_size=8, max_input_len=8, max_seq_len=24, max_num_tokens=64, tokens_per_block=8)
    runner = ModelRunner(random_rank_engine("llama-tiny", "float32", device, mapping, bc)[0], device)
    generate = runner.generate

    def lagging(*args, **kwargs):
        tokens = generate(*args, **kwargs)
        if info.rank == 1:
            time.sleep(0.5)
        return tokens

    runner.generate = lagging
    workload = [([5 + i, 6, 7, 8], 3) for i in range(8)]
    result = run_static(runner, workload, 8, device, np.arange(8) * 0.06)
    Path(out, f"rank{info.rank}.json").write_text(json.dumps(result["batches"]))
    distributed.barrier()  # as bench_throughput's rank_main: no rank leaves while another works


if __name__ == "__main__":
    run_ranks(2, rank, sys.argv[2])
'''


def test_static_generate_ranks_form_the_same_batches_when_one_lags(tmp_path):
    # Each rank reading its own clock, the lagging rank saw more requests arrived and formed
    # other batches than rank 0: a collective of another size (gloo aborts) or a hang.
    script = tmp_path / "lagging_static.py"
    script.write_text(LAGGING_STATIC)
    proc = subprocess.run([sys.executable, str(script), str(ROOT / "benchmarks"), str(tmp_path)], cwd=ROOT,
                          env=rank_env("30"), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    batches = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert batches[0] == batches[1] and sum(batches[0]) == 8 and len(batches[0]) > 1, batches
