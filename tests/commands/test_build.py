"""trtllm-build --verbose: what each graph-rewriting pass fuses, layer by layer."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from tensorrt_llm.models import LLaMAForCausalLM, PretrainedConfig
from tensorrt_llm.models.modeling_utils import save_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def trtllm_build(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "tensorrt_llm.commands.build", *map(str, args)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr
    return p


def test_verbose_prints_the_fusion_plan(tmp_path):
    config = PretrainedConfig(architecture="LlamaForCausalLM", dtype="float32", num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, hidden_size=32, intermediate_size=48,
                              vocab_size=64, max_position_embeddings=128)
    shapes = dict(LLaMAForCausalLM(config).named_parameters())
    save_checkpoint(tmp_path / "ckpt", config, [{name: torch.randn(p.shape) for name, p in shapes.items()}])
    args = ["--checkpoint_dir", tmp_path / "ckpt", "--max_batch_size", "2", "--max_input_len", "16",
            "--max_seq_len", "32"]

    quiet = trtllm_build(*args, "--output_dir", tmp_path / "quiet")
    assert "DEBUG" not in quiet.stderr
    verbose = trtllm_build(*args, "--output_dir", tmp_path / "verbose", "--verbose")
    rewrites = json.loads((tmp_path / "verbose" / "config.json").read_text())["build_summary"]["rewrites"]["rewrites"]
    plan = re.findall(r"DEBUG rank 0 (\w+): (.+)", verbose.stderr)
    assert {label: sum(1 for p, _ in plan if p == label) for label in rewrites} == rewrites
    assert sum(rewrites.values()) == len(plan) > 0
    # e.g. fuse_gate_up: transformer.layers.0.mlp.gate/linear_40 + ... + transformer.layers.0.mlp/mul_43
    gate_up = [layers.split(" + ") for label, layers in plan if label == "fuse_gate_up"]
    assert [[name.rsplit("/", 1)[1].rsplit("_", 1)[0] for name in names] for names in gate_up] == \
        [["linear", "linear", "silu", "mul"]] * 2
