"""Where a long prompt's first token goes: wall time of `generate(prompt, max_new_tokens=1)`;
where the host's part of it goes (the runtime's phases: before the plan, the plan's enqueue, the
GPU's time for the plan, after it); the GPU's own time for the same call (the call queued behind
a long GPU sleep, so that the host has launched everything before the GPU starts: what is left is
the GPU's critical path); the kernels' busy time, and the kernel table (torch.profiler). Wall minus
GPU time is what the host costs: launches from Python that the GPU waits for.

    python benchmarks/profile_prompt.py --model llama-8b --quant none,fp8 --prompt_len 2048
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import MODEL_DTYPES, QUANTS, dtype_arg, quantized_model, random_models  # noqa: E402
from profile_decode import busy_us, kernel_intervals  # noqa: E402

from tensorrt_llm.builder import BuildConfig, build  # noqa: E402
from tensorrt_llm.runtime import ModelRunner  # noqa: E402


def wall_ms(call, repeats):
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        call()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def gpu_ms(call, repeats, sleep_ms=400.0):
    """The call's wall time behind a GPU sleep of sleep_ms, minus the sleep: the GPU's time for
    the call when the host is never what it waits for (true while the host enqueues the call in
    less than sleep_ms and nothing in it waits for the GPU before the end)."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    torch.cuda.synchronize()
    cycles = int(1_000_000 * sleep_ms / start.elapsed_time(end))
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        t = time.perf_counter()
        call()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) * 1e3 - start.elapsed_time(end))
    return best


def host_phases(runner, call, repeats=8):
    """Medians over `repeats` calls, ms from the call's start: when the plan starts and has been
    enqueued (host), the GPU's time from the plan's start to its end (CUDA events around it:
    the GPU idles inside it whenever the host has not launched the next kernel yet), and when
    the call returns. Stamps the session's run for the duration of the calls only."""
    session = runner.session
    run = session.run
    stamps = {}

    def stamped(feed, check=True):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        stamps["plan start"] = time.perf_counter()
        a.record()
        out = run(feed, check)
        b.record()
        stamps["plan enqueued"] = time.perf_counter()
        stamps["events"] = (a, b)
        return out

    rows = []
    session.run = stamped
    try:
        for _ in range(repeats):
            torch.cuda.synchronize()
            t = time.perf_counter()
            call()
            end = time.perf_counter()
            torch.cuda.synchronize()
            a, b = stamps["events"]
            rows.append({"plan start": (stamps["plan start"] - t) * 1e3,
                         "plan enqueued": (stamps["plan enqueued"] - t) * 1e3,
                         "plan on the GPU": a.elapsed_time(b), "returned": (end - t) * 1e3})
    finally:
        del session.run  # the instance attribute: the class's method again
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def kernel_table(call, top):
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        call()
        torch.cuda.synchronize()
    host = sorted((e for e in prof.key_averages() if e.self_cpu_time_total > 0), key=lambda e: -e.self_cpu_time_total)
    print(f"  {'host ms':>7} {'calls':>5}  operator (self time on the host)")
    for e in host[:top // 2]:
        print(f"  {e.self_cpu_time_total / 1e3:>7.2f} {e.count:>5}  {e.key[:110]}")
    kernels = kernel_intervals(prof)
    covered = busy_us(kernels)
    totals = {}
    for a, b, name in kernels:
        t, c = totals.get(name, (0.0, 0))
        totals[name] = (t + b - a, c + 1)
    span = kernels[-1][1] - kernels[0][0]
    print(f"  {len(kernels)} kernels, first to last {span / 1e3:.2f} ms, busy {covered / 1e3:.2f} ms, "
          f"idle between them {(span - covered) / 1e3:.2f} ms")
    print(f"  {'ms':>7} {'count':>5}  kernel")
    for name, (t, c) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {t / 1e3:>7.2f} {c:>5}  {name[:110]}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-8b")
    p.add_argument("--dtype", default="bfloat16", type=dtype_arg, choices=MODEL_DTYPES)
    p.add_argument("--quant", default="none,fp8", help="comma-separated: " + ", ".join(QUANTS))
    p.add_argument("--group_size", type=int, default=128, help="INT4 weight-only group")
    p.add_argument("--prompt_len", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--top", type=int, default=20, help="rows of the kernel table")
    args = p.parse_args()
    dev = torch.device("cuda")
    quants = args.quant.split(",")
    torch.manual_seed(0)
    model, hf = random_models(args.model, args.dtype, dev, with_hf="fp8" in quants)
    prompt = [torch.randint(100, 1000, (args.prompt_len,), dtype=torch.int32)]
    bc = BuildConfig(max_batch_size=1, max_input_len=args.prompt_len, max_seq_len=args.prompt_len + 16,
                     max_num_tokens=args.prompt_len)
    for quant in quants:
        q = model if quant == "none" else quantized_model(model, quant, args.group_size, False, hf, prompt)
        with tempfile.TemporaryDirectory() as tmp:  # saved and loaded, as a user's engine is
            build(q, bc).save(tmp)
            del q
            runner = ModelRunner.from_dir(tmp, device=dev)
        call = functools.partial(runner.generate, prompt, max_new_tokens=1)
        call()
        call()
        wall = wall_ms(call, args.repeats)
        gpu = gpu_ms(call, args.repeats)
        print(f"{args.model} {quant}, a {args.prompt_len}-token prompt's first token: wall {wall:.2f} ms, "
              f"GPU {gpu:.2f} ms (host-bound {wall - gpu:.2f} ms)")
        phases = host_phases(runner, call)
        print("  host phases, ms from the call's start (medians): "
              + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
              + f"; the GPU idles {phases['plan on the GPU'] - gpu:.2f} ms inside the plan (about)")
        kernel_table(call, args.top)
        del call, runner
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
