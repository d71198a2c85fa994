"""Define a small network, bind its weights, rewrite it, export it to ONNX and run the
export with ONNX Runtime next to the reference executor.

    python examples/network/build_and_export.py [--onnx_path tiny_lm.onnx] [--seed 0]

The network is an attention-free language model: token embedding, two residual blocks of
RMSNorm + gated SiLU MLP, a final RMSNorm and an output head. See docs/network.md.
An error (e.g. an --onnx_path that cannot be written) ends in one "error:" line (exit code
2); --debug shows its traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import torch

from tensorrt_llm import Module, ModuleList, Network, Parameter, net_guard
from tensorrt_llm import functional as F
from tensorrt_llm.cli import add_debug_argument, run_cli
from tensorrt_llm.graph_rewriting import AnalysisPatternManager, PatternAnalyzer, optimize
from tensorrt_llm.layers.embedding import Embedding
from tensorrt_llm.layers.mlp import GatedMLP
from tensorrt_llm.layers.normalization import RmsNorm
from tensorrt_llm.reference_executor import ReferenceExecutor

VOCAB, HIDDEN, FFN, NUM_BLOCKS = 64, 32, 64, 2
MAX_TOKENS = 128
PROG = "build_and_export.py"


class Block(Module):
    def __init__(self):
        super().__init__()
        self.norm = RmsNorm(HIDDEN)
        self.mlp = GatedMLP(HIDDEN, FFN, "silu")

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class TinyLM(Module):
    def __init__(self):
        super().__init__()
        self.vocab_embedding = Embedding(VOCAB, HIDDEN)
        self.blocks = ModuleList(Block() for _ in range(NUM_BLOCKS))
        self.ln_f = RmsNorm(HIDDEN)
        self.lm_head = Parameter(shape=(VOCAB, HIDDEN))  # a bare Parameter, bound below through .value

    def forward(self, input_ids):
        x = self.vocab_embedding(input_ids)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.lm_head.tensor)


class CountOps(PatternAnalyzer):
    """Counts layers per op (an analysis pass: it reads the network, never changes it)."""

    def __init__(self):
        super().__init__("count_ops")
        self.counts: dict[str, int] = {}

    def match(self, layer):
        return True

    def analyze(self, layer):
        self.counts[layer.op] = self.counts.get(layer.op, 0) + 1


def op_counts(network: Network) -> dict[str, int]:
    manager = AnalysisPatternManager()
    manager.add("count_ops", CountOps())
    manager.process(network)
    return dict(sorted(manager.get("count_ops").counts.items()))


def build(seed: int) -> Network:
    model = TinyLM()
    generator = torch.Generator().manual_seed(seed)
    # Module.load binds a whole checkpoint by hierarchical name; Parameter.value binds one.
    model.load({name: torch.randn(p.shape, generator=generator) * 0.2
                for name, p in model.named_parameters() if name != "lm_head"}, strict=False)
    model.lm_head.value = torch.randn(VOCAB, HIDDEN, generator=generator) * 0.2

    network = Network("tiny_lm")
    with net_guard(network):
        input_ids = network.add_input("input_ids", "int32", [-1], [("num_tokens", (1, 16, MAX_TOKENS))])
        network.mark_output(model(input_ids), "logits")
    return network


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onnx_path", default=None, help="where to write the model (default: a new temporary folder)")
    parser.add_argument("--seed", type=int, default=0)
    add_debug_argument(parser)
    args = parser.parse_args(argv)
    onnx_path = args.onnx_path or os.path.join(tempfile.mkdtemp(prefix="tiny_lm_"), "tiny_lm.onnx")

    network = build(args.seed)
    print(f"built {network}: {op_counts(network)}")
    report = optimize(network)  # the builder's fusion passes, dead-layer and weight removal
    print(f"optimized: {report['layers_before']} -> {report['layers_after']} layers, rewrites {report['rewrites']}")
    print(f"ops now: {op_counts(network)}")

    network.to_onnx(onnx_path)
    onnx.checker.check_model(onnx_path, full_check=True)
    print(f"wrote {onnx_path} (passes onnx.checker full_check)")

    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    reference = ReferenceExecutor(network)
    reloaded = Network.from_onnx(onnx_path)
    worst = 0.0
    for num_tokens in (5, 37):  # two sizes of the dynamic num_tokens dim
        ids = torch.randint(0, VOCAB, (num_tokens,), dtype=torch.int32)
        expected = reference.run({"input_ids": ids})["logits"]
        (got,) = session.run(["logits"], {"input_ids": ids.numpy()})
        diff = float(np.abs(got - expected.numpy()).max())
        worst = max(worst, diff)
        same = torch.equal(ReferenceExecutor(reloaded).run({"input_ids": ids})["logits"], expected)
        print(f"num_tokens={num_tokens}: max |ORT - reference| = {diff:.3g}; "
              f"network reloaded from ONNX gives the same logits: {same}")
    print(f"max |ORT - reference| = {worst:.3g}")
    return 0 if worst <= 1e-5 else 1


def cli() -> int:
    return run_cli(main, PROG)


if __name__ == "__main__":
    sys.exit(cli())
