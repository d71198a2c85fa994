"""Where a decode step's time goes: graph replay alone, a whole step, the kernels of one
step (profiled without the graph, so each kernel is seen), and the replayed graph's timeline:
how much of a replay the GPU spends in kernels and how much between them (launch gaps and
tails, which a batch-1 step of ~300 short kernels pays at every kernel boundary).

    python benchmarks/profile_decode.py --model smollm2-135m --batch 1
    python benchmarks/profile_decode.py --model llama-8b --quant fp8 --batch 1
    python benchmarks/profile_decode.py --model llama-8b --quant fp8 --kv_cache_dtype fp8 --batch 32 --input_len 2048
"""
from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import KV_CACHE_DTYPES, MODEL_DTYPES, QUANTS, dtype_arg, quantized_model, random_models  # noqa: E402

from tensorrt_llm.builder import BuildConfig, build  # noqa: E402
from tensorrt_llm.runtime import ModelRunner  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16", type=dtype_arg, choices=MODEL_DTYPES)
    p.add_argument("--quant", choices=list(QUANTS), default="none")
    p.add_argument("--group_size", type=int, default=128, help="INT4 weight-only group")
    p.add_argument("--quantize_lm_head", action="store_true", help="the --quant engine's LM head quantized too")
    p.add_argument("--kv_cache_dtype", choices=list(KV_CACHE_DTYPES), default="none",
                   help="KV cache codes (fp8, int8: scales calibrated on the prompts)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--input_len", type=int, default=128)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--max_seq_len", type=int, default=0,
                   help="engine max_seq_len (default: input_len + steps + 8); bench_generation.py "
                        "builds for its longest prompt, e.g. 2184 for --ttft_input_len 2048")
    args = p.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    calibrate = args.quant == "fp8" or args.kv_cache_dtype != "none"
    model, hf = random_models(args.model, args.dtype, dev, with_hf=calibrate)
    # Prompts are prefilled 8,192 tokens a step (below): the runs of the eager breakdown start
    # with this many steps of prompt chunks and first tokens before every row decodes.
    max_num_tokens = min(8192, args.batch * args.input_len)
    prompt_steps = -(-args.batch * args.input_len // max_num_tokens) + 1
    bc = BuildConfig(max_batch_size=max(args.batch, 1), max_input_len=args.input_len,
                     max_seq_len=args.max_seq_len or args.input_len + args.steps + prompt_steps + 8)
    prompts = [torch.randint(100, 1000, (args.input_len,), dtype=torch.int32) for _ in range(args.batch)]
    if args.quant != "none" or args.kv_cache_dtype != "none":
        # fp8 (its activation scales) and a KV cache of codes (its scales) calibrate on the prompts
        # through `hf`
        model = quantized_model(model, args.quant, args.group_size, False, hf, prompts, kv=args.kv_cache_dtype,
                                quantize_lm_head=args.quantize_lm_head)
        del hf

    def step_ms(r):
        times = []
        for n in (1, args.steps + 1):
            torch.cuda.synchronize()
            t = time.perf_counter()
            r.generate(prompts, max_new_tokens=n)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return (times[1] - times[0]) / args.steps * 1e3

    # One runner at a time, each with a KV pool of what the batch needs (not of the free
    # memory), prompts prefilled 8,192 tokens a step: a large batch's whole prompt step, or two
    # runners' copies of the 8B weights, would not fit.
    blocks_per_seq = -(-bc.max_seq_len // bc.tokens_per_block)  # whole blocks: every row must fit at once
    pool = dict(max_tokens_in_paged_kv_cache=args.batch * blocks_per_seq * bc.tokens_per_block,
                enable_chunked_context=True,
                max_num_tokens=max_num_tokens)
    tmp = tempfile.TemporaryDirectory()
    build(model, bc).save(tmp.name)
    del model  # the runners load their own copies of the weights
    graphs = ModelRunner.from_dir(tmp.name, device=dev, **pool)
    # Long enough that every row decodes at once after a chunked prompt (the graph is captured).
    graphs.generate(prompts, max_new_tokens=args.steps + 1)
    decode_graphs = graphs.executor.runner.decode_graphs
    bucket = decode_graphs.bucket(args.batch)
    if bucket not in decode_graphs.greedy_graphs:
        sys.exit(f"no greedy decode step of all {args.batch} rows ran "
                 f"(greedy graphs of {sorted(decode_graphs.greedy_graphs)})")
    decode_graphs.capture([bucket])  # the plain graph too, timed below
    # A graph replays what its input buffers hold: after the run, its last step, in which the
    # rows that had already finished (their prompts were chunked, so they started decoding
    # earlier) are padding of one token. One step of every row at a full length on blocks of its
    # own, so that the replays below attend over the whole batch. The plain graph is timed: the
    # greedy one (which the steps replay) advances the lengths at every replay.
    n = args.batch
    full_length = (torch.zeros(n, dtype=torch.int32, device=dev),
                   torch.full((n,), args.input_len + args.steps, dtype=torch.int32, device=dev),
                   torch.arange(n * blocks_per_seq, dtype=torch.int32, device=dev).view(n, blocks_per_seq))
    decode_graphs.step(*full_length)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    decode_graphs.replay(bucket)
    start.record()
    for _ in range(100):
        decode_graphs.replay(bucket)
    end.record()
    torch.cuda.synchronize()
    kv = "" if args.kv_cache_dtype == "none" else f" kv {args.kv_cache_dtype}"
    print(f"{args.model} {args.quant}{kv} batch {args.batch}: graph replay {start.elapsed_time(end) / 100:.3f} ms, "
          f"step with graphs {step_ms(graphs):.3f} ms")
    if replay_timeline(functools.partial(decode_graphs.replay, bucket)):
        # The greedy graph's kernels, to find its replays in a run: a few replays (the max_seq_len
        # margin holds the lengths they add).
        decode_graphs.step(*full_length)
        greedy_kernels = replay_timeline(functools.partial(decode_graphs.replay, bucket, greedy=True),
                                         replays=3, show=False)
        step_timeline(graphs, prompts, greedy_kernels, args.steps)
    del graphs, decode_graphs
    torch.cuda.empty_cache()
    eager = ModelRunner.from_dir(tmp.name, device=dev, use_cuda_graph=False, **pool)
    tmp.cleanup()
    eager.generate(prompts, max_new_tokens=4)
    print(f"step without graphs {step_ms(eager):.3f} ms")

    # The kernels of the decode steps alone: a run of prompt_steps + 8 tokens minus a run of
    # prompt_steps (the prompt's steps, with the first rows' first decodes beside the chunks),
    # per decode step: the 8 more steps are every row decoding.
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
    with_steps, context_only = kernel_us(prompt_steps + steps), kernel_us(prompt_steps)
    per_step = {k: (v - context_only.get(k, 0.0)) / steps for k, v in with_steps.items()}
    per_step = {k: v for k, v in per_step.items() if v > 0.5}
    total = sum(per_step.values())
    print(f"GPU time of one decode step (eager, {args.batch} rows): {total / 1e3:.3f} ms")
    print(f"{'us/step':>9} {'share':>6}  kernel")
    for k, v in sorted(per_step.items(), key=lambda kv: -kv[1])[:25]:
        print(f"{v:>9.1f} {v / total:>6.1%}  {k[:110]}")


def kernel_intervals(prof, categories=("kernel",)) -> list[tuple[float, float, str]]:
    """The kernels (and the other GPU work of `categories`: gpu_memcpy, gpu_memset) a
    torch.profiler run saw: (start us, end us, name), in start order."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    return sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                  if e.get("cat") in categories and "dur" in e)


def short_name(kernel: str) -> str:
    """A kernel's name without its return type, namespaces and parameter list: its template
    arguments are what tells the instances apart."""
    name = re.sub(r"^void ", "", kernel)
    name = re.sub(r"[A-Za-z_0-9]+::|\(anonymous namespace\)::", "", name)
    return re.sub(r"\((?!anonymous)[^()]*\)$", "", name)


def busy_us(kernels) -> float:
    """The union of the kernels' intervals (start order): the time at least one of them ran."""
    covered, end = 0.0, kernels[0][0]
    for a, b, _ in kernels:
        covered += max(0.0, b - max(a, end))
        end = max(end, b)
    return covered


def replay_timeline(replay, replays: int = 20, show: bool = True):
    """Kernel time against the span of each `replay()` of a graph: the GPU's idle time between
    its kernels (launch latency, the previous kernel's tail) is the span minus the union of the
    kernels' intervals. Returns the names of one replay's kernels in order."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            replay()
        torch.cuda.synchronize()
    kernels = kernel_intervals(prof)
    if not kernels:
        print("the profiler saw no kernels of the replayed graph (CUPTI without graph kernel records)")
        return
    per_replay = len(kernels) // replays
    if not show:
        return [name for _, _, name in kernels[per_replay:2 * per_replay]]
    spans, busy, gaps = [], [], []
    for r in range(1, replays):  # the first replay is left out: the profiler's own start-up
        ks = kernels[r * per_replay:(r + 1) * per_replay]
        spans.append(ks[-1][1] - ks[0][0])
        busy.append(busy_us(ks))
        gaps.extend(max(0.0, ks[i + 1][0] - ks[i][1]) for i in range(len(ks) - 1))
    n = len(spans)
    gaps.sort()
    idle = (sum(spans) - sum(busy)) / n
    print(f"replayed graph: {per_replay} kernels a replay, span {sum(spans) / n / 1e3:.3f} ms, "
          f"kernels busy {sum(busy) / n / 1e3:.3f} ms, idle between kernels {idle / 1e3:.3f} ms "
          f"(gap p50 {gaps[len(gaps) // 2]:.1f} us, p90 {gaps[int(len(gaps) * 0.9)]:.1f} us)")
    totals = {}
    for a, b, name in kernels[per_replay:per_replay * replays]:
        t, c = totals.get(name, (0.0, 0))
        totals[name] = (t + b - a, c + 1)
    print(f"{'us/replay':>9} {'count':>5}  kernel")
    for name, (t, c) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:20]:
        print(f"{t / n:>9.1f} {c // n:>5}  {name[:110]}")
    # With programmatic launch a kernel starts under its predecessor's tail, so its span says
    # little; what it adds to the replay is the time from its predecessor's end to its own.
    chain = {}
    for r in range(1, replays):
        ks = kernels[r * per_replay:(r + 1) * per_replay]
        for (_, prev_end, _), (_, b, name) in zip(ks, ks[1:]):
            t, c = chain.get(name, (0.0, 0))
            chain[name] = (t + b - prev_end, c + 1)
    print(f"{'us/replay':>9} {'count':>5} {'us each':>8}  kernel, from its predecessor's end to its own")
    for name, (t, c) in sorted(chain.items(), key=lambda kv: -kv[1][0])[:20]:
        print(f"{t / n:>9.1f} {c // n:>5} {t / c:>8.2f}  {short_name(name)[:150]}")
    return [name for _, _, name in kernels[per_replay:2 * per_replay]]


def step_timeline(runner, prompts, graph_kernels: list[str], steps: int):
    """A whole decode step of `runner.generate` against its graph: from the start of one
    replay to the start of the next, the replay's own span, the GPU work queued outside the
    graph (copies, sampling) and the time the GPU idles. The replays are found by their
    kernel sequence (`graph_kernels`, one replay's kernels in order)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        runner.generate(prompts, max_new_tokens=steps + 1)
        torch.cuda.synchronize()
    work = kernel_intervals(prof, ("kernel", "gpu_memcpy", "gpu_memset"))
    names = [name for _, _, name in work]
    n = len(graph_kernels)
    starts = [i for i in range(len(work) - n + 1) if names[i] == graph_kernels[0]
              and names[i:i + n] == graph_kernels]
    if len(starts) < 4:
        print(f"step timeline: {len(starts)} replays found in the run, too few")
        return
    starts = starts[1:-1]  # steady steps only: not the first replay, and each has a next one
    spans, replays, outside, busy_outside = [], [], {}, []
    for a, b in zip(starts, starts[1:]):
        spans.append(work[b][0] - work[a][0])
        replays.append(work[a + n - 1][1] - work[a][0])
        between = work[a + n:b]
        busy_outside.append(busy_us(between) if between else 0.0)
        for s0, s1, name in between:
            t, c = outside.get(name, (0.0, 0))
            outside[name] = (t + s1 - s0, c + 1)
    k = len(spans)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(f"decode step with graphs ({k} steady steps): replay start to replay start {mean(spans):.1f} us, "
          f"replay span {mean(replays):.1f} us, GPU work outside the graph {mean(busy_outside):.1f} us, "
          f"GPU idle {mean(spans) - mean(replays) - mean(busy_outside):.1f} us")
    print(f"{'us/step':>9} {'count':>5}  outside the graph")
    for name, (t, c) in sorted(outside.items(), key=lambda kv: -kv[1][0])[:15]:
        print(f"{t / k:>9.1f} {c / k:>5.1f}  {name[:110]}")


if __name__ == "__main__":
    main()
