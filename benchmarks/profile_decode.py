"""Where a decode step's time goes: graph replay alone, a whole step, and the kernels of one
step (profiled without the graph, so each kernel is seen).

    python benchmarks/profile_decode.py --model smollm2-135m --batch 1
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import random_models  # noqa: E402

from tensorrt_llm.builder import BuildConfig, build  # noqa: E402
from tensorrt_llm.runtime import ModelRunner  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--input_len", type=int, default=128)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--max_seq_len", type=int, default=0,
                   help="engine max_seq_len (default: input_len + steps + 8); bench_generation.py "
                        "builds for its longest prompt, e.g. 2184 for --ttft_input_len 2048")
    args = p.parse_args()
    dev = torch.device("cuda")
    model, _ = random_models(args.model, args.dtype, dev, with_hf=False)
    bc = BuildConfig(max_batch_size=max(args.batch, 1), max_input_len=args.input_len,
                     max_seq_len=args.max_seq_len or args.input_len + args.steps + 8)
    prompts = [torch.randint(100, 1000, (args.input_len,), dtype=torch.int32) for _ in range(args.batch)]
    with tempfile.TemporaryDirectory() as tmp:
        build(model, bc).save(tmp)
        graphs = ModelRunner.from_dir(tmp, device=dev)
        eager = ModelRunner.from_dir(tmp, device=dev, use_cuda_graph=False)
    for r in (graphs, eager):
        r.generate(prompts, max_new_tokens=4)

    def step_ms(r):
        times = []
        for n in (1, args.steps + 1):
            torch.cuda.synchronize()
            t = time.perf_counter()
            r.generate(prompts, max_new_tokens=n)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return (times[1] - times[0]) / args.steps * 1e3

    cuda_graphs = graphs.executor.runner.cuda_graphs
    graph, _ = cuda_graphs.graphs[cuda_graphs.bucket(args.batch)]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(100):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    print(f"{args.model} batch {args.batch}: graph replay {start.elapsed_time(end) / 100:.3f} ms, "
          f"step with graphs {step_ms(graphs):.3f} ms, step without {step_ms(eager):.3f} ms")

    # The kernels of the decode steps alone: a run of 9 tokens (context step + 8 decode steps)
    # minus a run of 1 (the context step), per decode step.
    def kernel_us(max_new_tokens):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            eager.generate(prompts, max_new_tokens=max_new_tokens)
            torch.cuda.synchronize()
        # Kernels, copies and sets by name; not the aten:: / cuda* host ranges that enclose them.
        totals = {}
        for e in prof.key_averages():
            us = getattr(e, "device_time_total", None)
            if us is None:
                us = e.cuda_time_total
            if us > 0 and e.key.isascii() and not e.key.startswith(("aten::", "cuda")):
                totals[e.key] = totals.get(e.key, 0.0) + us
        return totals
    steps = 8
    with_steps, context_only = kernel_us(steps + 1), kernel_us(1)
    per_step = {k: (v - context_only.get(k, 0.0)) / steps for k, v in with_steps.items()}
    per_step = {k: v for k, v in per_step.items() if v > 0.5}
    total = sum(per_step.values())
    print(f"GPU time of one decode step (eager, {args.batch} rows): {total / 1e3:.3f} ms")
    print(f"{'us/step':>9} {'share':>6}  kernel")
    for k, v in sorted(per_step.items(), key=lambda kv: -kv[1])[:25]:
        print(f"{v:>9.1f} {v / total:>6.1%}  {k[:110]}")

if __name__ == "__main__":
    main()
