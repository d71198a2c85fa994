"""bench_generation.py --kv_cache_dtype as a user runs it: one run times the engine with its KV
cache in the model's dtype and in FP8 / INT8 codes (a tiny random Llama on the CPU), and its
bytes floor counts the KV cache a step reads at the cache's bytes per element."""
import json

from .test_bench_multi_rank import TINY, run


def test_kv_cache_dtypes_side_by_side_with_their_kv_bytes_in_the_floor(tmp_path):
    out = tmp_path / "kv.json"
    input_len, output_len = 16, 6
    proc = run("bench_generation.py", *TINY, "--quant", "none", "--kv_cache_dtype", "none,fp8,int8", "--batch_sizes",
               "2", "--input_len", str(input_len), "--output_len", str(output_len), "--repeats", "1",
               "--agreement_prompts", "1", "--no_hf", "--json", str(out), timeout=300)
    results = json.loads(out.read_text())
    assert list(results) == ["none", "none+kv_fp8", "none+kv_int8"]
    assert [r["kv_bytes_per_element"] for r in results.values()] == [4, 1, 1]  # float32 engine: 4 bytes
    # llama-tiny: 4 layers x K and V x 2 KV heads x head size 16, per token of context
    per_element = 4 * 2 * 2 * 16 * (input_len + output_len / 2) * 2  # batch 2
    for name, res in results.items():
        row = res["rows"][0]
        kv_bytes = (row["floor_with_kv_ms"] - row["floor_ms"]) / 1e3 * res["copy_bandwidth_GBps"] * 1e9
        assert abs(kv_bytes - per_element * res["kv_bytes_per_element"]) < 1e-6 * kv_bytes, name
    assert "step/none" in proc.stdout and "none+kv_fp8" in proc.stdout
