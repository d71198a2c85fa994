"""bench_generation.py --quant with --quantize_lm_head as a user runs it (a tiny random Llama on
the CPU): the head's quantized bytes leave the engine and its decode floor; --quant int4_awq's
engine, from an AutoAWQ folder of the same weights, is int4_wo's size."""
import json
import subprocess
import sys

from .test_bench_multi_rank import ROOT, TINY, run


def bench(tmp_path, name, *args, quant="int4_wo"):
    out = tmp_path / f"{name}.json"
    run("bench_generation.py", *TINY, "--quant", quant, "--group_size", "32", "--batch_sizes", "1",
        "--input_len", "8", "--output_len", "4", "--repeats", "1", "--no_hf", "--json", str(out), *args,
        timeout=300)
    return json.loads(out.read_text())


def test_quantize_lm_head_shrinks_the_engine_and_its_floor(tmp_path):
    float_head = bench(tmp_path, "float_head")
    int4_head = bench(tmp_path, "int4_head", "--quantize_lm_head")
    assert float_head["quantize_lm_head"] is False and int4_head["quantize_lm_head"] is True
    # llama-tiny's head is its own 1,024 x 64 float32 matrix: as INT4 codes in groups of 32 it is
    # 4 bits a weight plus a float32 scale and zero a group, 1/8 + 1/16 of its float bytes (the
    # engine file also gains the new tensors' names).
    head = 1024 * 64 * 4
    saved = float_head["engine_bytes"] - int4_head["engine_bytes"]
    assert abs(saved - head * (1 - 1 / 8 - 1 / 16)) < 0.01 * head
    assert int4_head["decode_read_floor_ms"] < float_head["decode_read_floor_ms"]


def test_quantize_lm_head_needs_a_quantized_engine():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_generation.py"), *TINY, "--quant", "none",
                           "--quantize_lm_head"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--quantize_lm_head applies to the --quant engines" in proc.stderr


def test_int4_awq_engine_is_read_from_an_awq_folder_and_is_int4_wos_size(tmp_path):
    wo, awq = bench(tmp_path, "wo"), bench(tmp_path, "awq", quant="int4_awq")
    assert awq["quant"] == "int4_awq" and awq["params"] == wo["params"]
    # the same codes, scales and zeros a weight: the engine files differ only in names' bytes
    assert abs(awq["engine_bytes"] - wo["engine_bytes"]) < 0.01 * wo["engine_bytes"]
    assert awq["decode_read_floor_ms"] > 0 and awq["rows"][0]["batch"] == 1  # (its speed: GPU runs)


def test_int4_gptq_act_order_engine_gathers_its_inputs(tmp_path):
    wo, act = bench(tmp_path, "wo"), bench(tmp_path, "act", quant="int4_gptq_act_order")
    # llama-tiny, 4 layers of hidden 64: each layer's qkv, o, gate and up hold a permutation of
    # their 64 inputs (down's is folded into gate's and up's rows); in the engine gate and up
    # share one gather, so 3 int64 permutations a layer; the graph's JSON grows by the gathers and
    # by the norms left unfused in front of them (25 KB of 703 KB when written)
    assert act["quant"] == "int4_gptq_act_order" and act["params"] == wo["params"] + 4 * 4 * 64
    perms = 4 * 3 * 64 * 8
    assert perms < act["engine_bytes"] - wo["engine_bytes"] < perms + 0.05 * wo["engine_bytes"]
    assert act["rows"][0]["batch"] == 1
