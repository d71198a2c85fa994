"""ab_load_switches.py as a user runs it: what it cannot do is refused in one line (CPU); on a GPU,
an INT4 engine loaded with its codes in tile order and in row order replays both graphs in turns,
the same logits bit for bit."""
import json
import subprocess
import sys

import pytest
import torch

from .test_bench_multi_rank import ROOT, run

SCRIPT = str(ROOT / "benchmarks" / "ab_load_switches.py")


def _refused(*args) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc


def test_one_setting_or_a_malformed_one_is_refused_in_one_line():
    proc = _refused("--switch", "TRTLLM_TILE_CODES=1")
    assert proc.returncode == 2 and "at least twice" in proc.stderr
    proc = _refused("--switch", "TRTLLM_TILE_CODES", "--switch", "TRTLLM_TILE_CODES=0")
    assert proc.returncode == 2 and "NAME=VALUE" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a CUDA GPU")
def test_without_a_gpu_it_says_so():
    proc = _refused("--switch", "TRTLLM_TILE_CODES=1", "--switch", "TRTLLM_TILE_CODES=0")
    assert "needs a CUDA GPU" in proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tile_and_row_order_replay_in_turns_with_equal_logits(tmp_path):
    out = tmp_path / "ab.json"
    proc = run("ab_load_switches.py", "--model", "smollm2-135m", "--dtype", "bf16", "--quant", "int4_wo",
               "--group_size", "64", "--input_len", "32", "--rounds", "2", "--replays", "4",
               "--switch", "TRTLLM_TILE_CODES=1", "--switch", "TRTLLM_TILE_CODES=0", "--json", str(out), timeout=600)
    assert proc.stdout.count("logits equal: True") == 2, proc.stdout
    results = json.loads(out.read_text())["results"]
    assert [r["switch"] for r in results] == [{"TRTLLM_TILE_CODES": "1"}, {"TRTLLM_TILE_CODES": "0"}]
    assert results[0]["ratio"] == 1.0 and all(len(r["rounds_ms"]) == 2 for r in results)
