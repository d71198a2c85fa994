"""benchmarks/bench_throughput.py run as a user runs it, on the CPU with a small random model."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_throughput_run_writes_its_figures(tmp_path):
    out = tmp_path / "bt.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_throughput.py"), "--model", "smollm2-135m",
         "--dtype", "float32", "--device", "cpu", "--num_requests", "6", "--input_len", "8",
         "--output_len", "4", "--max_batch_size", "4", "--max_num_tokens", "64", "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    run = result["inflight"]
    assert run["output_tokens"] == 6 * 4 and run["input_tokens"] == 6 * 8
    # Six requests through a batch of four: some joined the batch while others decoded.
    assert run["steps"] < 6 * 4 and run["peak_kv_blocks"] <= run["kv_blocks"]
    before, after = result["matmul_TFLOPs_before_after"]
    assert result["matmul_TFLOPs"] == max(before, after) > 0
    params = result["params"]
    processed = run["input_tokens"] + run["output_tokens"]
    ceiling = run["output_tokens"] / (2 * params * processed / (result["matmul_TFLOPs"] * 1e12))
    assert abs(run["compute_ceiling_tok_s"] - ceiling) < 1e-6 * ceiling
    assert abs(run["fraction_of_ceiling"] - run["output_tok_s"] / ceiling) < 1e-9
    assert "in-flight reaches" in proc.stdout and "before and" in proc.stdout
