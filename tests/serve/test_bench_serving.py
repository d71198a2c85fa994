"""benchmarks/bench_serving.py as a user runs it: against a running server (a sweep of two rates),
starting its own trtllm-serve on an engine folder, and counting requests the server refuses."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_serving.py"), *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_a_sweep_against_a_running_server(server, tmp_path):
    out = tmp_path / "sweep.json"
    run = _bench("--base_url", server.url, "--num_prompts", "6", "--input_len", "16", "--output_len", "4",
                 "--range_ratio", "0.5", "--request_rate", "8", "inf", "--output_json", str(out))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.count("Serving Benchmark Result") == 2 and "TPOT mean/p50/p99 ms" in run.stdout
    report = json.loads(out.read_text())
    assert [r["request_rate"] for r in report["runs"]] == [8.0, "inf"]
    for r in report["runs"]:
        assert r["completed"] == 6 and r["failed"] == 0, r
        assert r["ttft_ms"]["mean"] > 0 and r["e2el_ms"]["p99"] >= r["e2el_ms"]["median"] > 0
        assert r["request_throughput"] > 0 and r["output_throughput"] > 0
    # Synthetic lengths: drawn within the range, the same prompts at every rate, outputs exact (ignore_eos).
    assert report["runs"][0]["total_output_tokens"] == report["runs"][1]["total_output_tokens"]
    assert 6 * 2 <= report["runs"][0]["total_output_tokens"] <= 6 * 6
    assert report["config"]["request_rate"] == [8.0, "inf"]


def test_starting_its_own_server_on_an_engine_folder(engine_dir, tmp_path):
    out = tmp_path / "fixed.json"
    run = _bench("--model", str(engine_dir), "--serve_args", "--device cpu --max_batch_size 4", "--num_prompts", "4",
                 "--input_len", "8", "--output_len", "3", "--max_concurrency", "2", "--output_json", str(out))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "starting" in run.stdout and "trtllm-serve" in run.stdout
    r = json.loads(out.read_text())["runs"][0]
    assert r["completed"] == 4 and r["failed"] == 0
    assert r["total_input_tokens"] == 4 * 8 and r["total_output_tokens"] == 4 * 3  # fixed lengths


def test_refused_requests_are_counted_as_failed(server, tmp_path):
    out = tmp_path / "failed.json"
    run = _bench("--base_url", server.url, "--num_prompts", "3", "--input_len", "600", "--output_len", "2",
                 "--num_warmups", "0", "--output_json", str(out))
    assert run.returncode == 1  # no request completed
    r = json.loads(out.read_text())["runs"][0]
    assert r["completed"] == 0 and r["failed"] == 3
    assert any("HTTP 400" in e and "max_input_len" in e for e in r["errors"]), r["errors"]
    assert "failed x3" in run.stdout
