"""bench_weight_only_gemv.py as a user runs it (GPU): FP8 layers with --prologues time the fused
ops and the unfused pairs for the layers a norm or an activation feeds, and nothing for the others."""
import json

import pytest

from .test_bench_multi_rank import run


@pytest.mark.gpu
def test_fp8_prologues_are_timed_for_the_layers_they_feed(tmp_path):
    out = tmp_path / "gemv.json"
    proc = run("bench_weight_only_gemv.py", "--rows", "1", "--formats", "fp8:tensor", "--prologues", "--json",
               str(out), timeout=300)
    layers = {r["layer"]: r for r in json.loads(out.read_text())["layers"]}
    assert list(layers) == ["qkv", "o", "gate_up", "down", "lm_head"]
    prologues = {name: r["prologue"] for name, r in layers.items()}
    assert prologues == {"qkv": "rms_norm", "o": None, "gate_up": "add_rms_norm", "down": "silu_and_mul",
                         "lm_head": None}
    for name, r in layers.items():
        timed = r["fused_us"] is not None and r["unfused_us"] is not None
        assert timed == (r["prologue"] is not None), name
        assert r["us"] > 0 and (not timed or (r["fused_us"] > 0 and r["unfused_us"] > 0)), name
    assert "add_rms_norm: fused us" in proc.stdout


@pytest.mark.gpu
def test_codes_are_timed_in_tile_and_row_order(tmp_path):
    out = tmp_path / "gemv.json"
    run("bench_weight_only_gemv.py", "--rows", "1", "--formats", "int8:0", "--orders", "tile,row", "--json",
        str(out), timeout=300)
    layers = json.loads(out.read_text())["layers"]
    assert [(r["layer"], r["order"]) for r in layers] == [(name, order) for name in ("qkv", "o", "gate_up", "down",
                                                                                    "lm_head")
                                                          for order in ("tile", "row")]
    assert all(r["us"] > 0 for r in layers)


@pytest.mark.gpu
def test_l2_resident_weights_are_timed_beside_streamed_ones(tmp_path):
    out = tmp_path / "gemv.json"
    proc = run("bench_weight_only_gemv.py", "--rows", "1", "--formats", "int4:128", "--l2_resident", "--json",
               str(out), timeout=300)
    layers = json.loads(out.read_text())["layers"]
    assert [r["layer"] for r in layers] == ["qkv", "o", "gate_up", "down", "lm_head"]
    assert all(r["us"] > 0 and r["l2_resident_us"] > 0 for r in layers)
    assert "L2-resident us" in proc.stdout
