"""Programmatic dependent launch (launchKernel in cpp/kernels/common.cuh) changes when a kernel
starts, never what it computes: every kernel waits for the previous one before it reads or writes
anything an earlier kernel touches. A kernel that broke that contract would read a stale input now
and then; here whole decode runs (CUDA graphs, every kernel of a decode step chained) must give
the same tokens and generation logits bit for bit with TRTLLM_ENABLE_PDL=1 and =0 (read once per
process, so each runs in its own).

GPU only: pytest -m gpu tests/kernels/test_programmatic_launch.py
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

# bf16 (the fused-prologue GEMVs, RMSNorm, SiLU-and-mul, decode attention) and INT8 / INT4
# weight-only (the tensor-core GEMV, codes in tile order) engines of one random model, three prompts
# of different lengths, 24 greedy tokens each; prints the tokens, a digest of the logits' bytes and
# how many weights the runner put in tile order.
SCRIPT = r"""
import hashlib, json, sys, tempfile
import torch
sys.path.insert(0, sys.argv[1])
from tests.models.llama_utils import random_hf_llama
from tensorrt_llm.builder import BuildConfig, build
from tensorrt_llm.graph_rewriting import tiled_code_weights
from tensorrt_llm.models.llama.convert import config_from_hf, load_weights_from_hf
from tensorrt_llm.models.llama.model import LLaMAForCausalLM
from tensorrt_llm.models.quantize import quantize_checkpoint, weight_only_config
from tensorrt_llm.runtime import ModelRunner

hf = random_hf_llama(seed=3, hidden_size=512, intermediate_size=1408, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
prompts = [torch.randint(5, 1000, (n,), generator=torch.Generator().manual_seed(n), dtype=torch.int32)
           for n in (7, 40, 93)]
out = {}
for quant in ("none", "int8", "int4"):
    config = config_from_hf(hf.config, dtype="bfloat16")
    weights = load_weights_from_hf(hf, config)
    if quant != "none":
        config = weight_only_config(config, quant, 128 if quant == "int4" else None)
        weights = quantize_checkpoint(LLaMAForCausalLM, config, weights)
    model = LLaMAForCausalLM(config)
    model.load(weights)
    with tempfile.TemporaryDirectory() as tmp:
        build(model, BuildConfig(max_batch_size=4, max_input_len=128, max_seq_len=160,
                                 tokens_per_block=32)).save(tmp)
        runner = ModelRunner.from_dir(tmp, device=torch.device("cuda"))
    r = runner.generate(prompts, max_new_tokens=24, output_generation_logits=True)
    logits = r["generation_logits"].float().cpu().contiguous()
    out[quant] = {"tokens": r["output_ids"].tolist(),
                  "logits": hashlib.sha256(logits.numpy().tobytes()).hexdigest(),
                  "tiled": len(tiled_code_weights(runner.engine.network))}
print(json.dumps(out))
"""


def _run(pdl: str) -> dict:
    env = dict(os.environ, TRTLLM_ENABLE_PDL=pdl)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_decode_runs_equal_with_and_without_programmatic_launch():
    with_pdl, without = _run("1"), _run("0")
    assert with_pdl["none"]["tiled"] == 0
    # qkv, o, gate_up, down of 3 layers; the float head stays float
    assert with_pdl["int8"]["tiled"] == with_pdl["int4"]["tiled"] == 12
    for quant in ("none", "int8", "int4"):
        assert with_pdl[quant]["tokens"] == without[quant]["tokens"], quant
        assert with_pdl[quant]["logits"] == without[quant]["logits"], quant
