"""Serving throughput of the in-flight batching executor (what `trtllm-bench throughput` and
vLLM's benchmark_throughput measure), against the static generate and the compute ceiling
measured in the same run.

    python benchmarks/bench_throughput.py --model llama-8b --dtype bf16 --num_requests 2000 \
        --input_len 128 --output_len 128 --static_batch_sizes 128,256 --json tp.json
    python benchmarks/bench_throughput.py --model llama-8b --dataset synthetic \
        --input_range 32,1024 --output_range 32,512 --num_requests 1000
    python benchmarks/bench_throughput.py --model llama-8b --scenario chunked    # 4,096-token prompt among 64 decodes
    python benchmarks/bench_throughput.py --model llama-8b --scenario reuse      # 256 requests, one 1,024-token prefix
    python benchmarks/bench_throughput.py --model smollm2-gguf --device cpu --dtype float32 \
        --num_requests 32 --input_len 32 --output_len 32 --request_rate 4 --llm_api

Requests are submitted all at once (`--request_rate inf`) or with Poisson arrivals at that
rate (seeded). Random weights as bench_generation.py makes them (no end token is ever
special, so every request makes exactly its output length). Reported: output and total
tokens/s, requests/s, time to first token and time per output token (mean, p50, p99),
inter-token latency, peak KV blocks in use, reuse hits; the static generate (batches of
requests that have arrived, each batch run to its end before the next starts) at each
`--static_batch_sizes`;
and the compute ceiling: output tokens / (2 x parameters x processed tokens / the bf16
matmul rate measured in this run).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generation import (  # noqa: E402
    MODEL_DTYPES,
    SHAPES,
    add_pp_partition_argument,
    check_pp_partition,
    dtype_arg,
    gguf_models,
    matmul_rate,
    random_models,
    random_rank_engine,
    sync,
)
from launch_ranks import run_split  # noqa: E402

import tensorrt_llm.distributed as distributed  # noqa: E402
from tensorrt_llm.builder import BuildConfig, build  # noqa: E402
from tensorrt_llm.mapping import Mapping  # noqa: E402
from tensorrt_llm.runtime import ModelRunner  # noqa: E402
from tensorrt_llm.runtime.request import Request  # noqa: E402
from tensorrt_llm.runtime.sampling import SamplingConfig  # noqa: E402

GREEDY = SamplingConfig(top_k=1)


def percentiles(values) -> dict:
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    a = np.asarray(values, dtype=np.float64)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99))}


def make_workload(args, vocab: int, rng: np.random.Generator) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) per request."""
    n = args.num_requests
    if args.dataset == "synthetic":
        lo, hi = (int(x) for x in args.input_range.split(","))
        ins = rng.integers(lo, hi + 1, n)
        lo, hi = (int(x) for x in args.output_range.split(","))
        outs = rng.integers(lo, hi + 1, n)
    else:
        ins, outs = np.full(n, args.input_len), np.full(n, args.output_len)
    return [(rng.integers(100, vocab - 100, int(i)).tolist(), int(o)) for i, o in zip(ins, outs)]


def arrivals(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    if rate == float("inf"):
        return np.zeros(n)
    return np.cumsum(rng.exponential(1.0 / rate, n))


def agreed_time(arrival):
    """What makes a time every rank's: in a multi-rank engine with requests arriving over time,
    rank 0's (broadcast), so that the ranks admit the same requests at the same step and form the
    same batches; otherwise each time as it is."""
    if distributed.world_size() > 1 and not np.all(arrival == 0):
        return distributed.broadcast_object
    return lambda now: now


def run_executor(runner, workload, arrival, device, profile: bool = False) -> dict:
    """Submit each request at its arrival time, step until all are done. Per-request token
    arrival times are taken on the host when the tokens reach it. `profile`: print where the
    run's host and device time went (torch.profiler; the run itself is slower for it)."""
    if profile:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            res = run_executor(runner, workload, arrival, device)
        table = prof.key_averages()
        if device.type == "cuda":
            print(table.table(sort_by="cuda_time_total", row_limit=20), flush=True)
        print(table.table(sort_by="self_cpu_time_total", row_limit=20), flush=True)
        return res
    ex = runner.executor
    reqs = [Request(ids, GREEDY, out) for ids, out in workload]
    times: dict[int, list[float]] = {r.request_id: [] for r in reqs}
    start_blocks = runner.kv_cache.num_free_blocks
    reused_before = runner.kv_cache.reused_blocks
    ex.stats.peak_used_blocks = ex.stats.peak_in_flight = 0
    steps_before, decode_before = ex.stats.steps, ex.stats.decode_only_steps
    wait_before, graphs_before = ex.stats.gpu_wait_s, captured_graphs(runner)
    sync(device)
    t0 = time.perf_counter()
    submitted, last = 0, 0.0
    steps = []  # per step() call: (seconds, prompt tokens launched, requests running before)
    agree = agreed_time(arrival)
    while submitted < len(reqs) or ex.has_work:
        now = agree(time.perf_counter() - t0)
        while submitted < len(reqs) and arrival[submitted] <= now:
            ex.add_request(reqs[submitted])
            submitted += 1
        if not ex.has_work:
            time.sleep(max(0.0, min(arrival[submitted] - now, 0.01)))
            continue
        prompt_before, running = ex.stats.prompt_tokens, ex.num_running
        updated = ex.step()
        t = time.perf_counter() - t0
        steps.append((t - last, ex.stats.prompt_tokens - prompt_before, running))
        last = t
        for r in updated:
            got = len(r.output_token_ids) - len(times[r.request_id])
            times[r.request_id].extend([t] * got)
    elapsed = time.perf_counter() - t0
    assert runner.kv_cache.num_free_blocks == start_blocks, "blocks were not returned to the pool"
    ttft = [times[r.request_id][0] - arrival[i] for i, r in enumerate(reqs)]
    tpot = [(ts[-1] - ts[0]) / (len(ts) - 1) for ts in (times[r.request_id] for r in reqs) if len(ts) > 1]
    itl = [b - a for ts in times.values() for a, b in zip(ts, ts[1:]) if b > a]
    out_tokens = sum(len(r.output_token_ids) for r in reqs)
    in_tokens = sum(r.prompt_len for r in reqs)
    return {"elapsed_s": elapsed, "output_tokens": out_tokens, "input_tokens": in_tokens,
            "output_tok_s": out_tokens / elapsed, "total_tok_s": (out_tokens + in_tokens) / elapsed,
            "requests_s": len(reqs) / elapsed, "ttft_s": percentiles(ttft), "tpot_s": percentiles(tpot),
            "itl_s": percentiles(itl), "peak_kv_blocks": ex.stats.peak_used_blocks,
            "kv_blocks": runner.kv_cache.num_blocks,
            "reused_blocks": runner.kv_cache.reused_blocks - reused_before,
            "preemptions": ex.stats.preemptions, "steps": ex.stats.steps - steps_before,
            "decode_only_steps": ex.stats.decode_only_steps - decode_before,
            "step_time": step_time(steps),
            "gpu_wait_s": ex.stats.gpu_wait_s - wait_before,
            "graphs_captured": captured_graphs(runner) - graphs_before,
            # Pipeline stages: steps in flight at once (pp_size when the stages overlap).
            "peak_in_flight": ex.stats.peak_in_flight,
            "outputs": [r.output_token_ids for r in reqs]}


def step_time(steps) -> dict:
    """Where the wall time went: steps that launched no prompt tokens (decodes only) against
    steps that launched some, with their mean time and rows. A step() call returns when the
    previous step's tokens are on the host, so its time is about the GPU time of a step."""
    out = {}
    for name, keep in (("decode", lambda p: p == 0), ("with_prompt", lambda p: p > 0)):
        sel = [(dt, p, n) for dt, p, n in steps if keep(p)]
        total = sum(dt for dt, _, _ in sel)
        out[name] = {"steps": len(sel), "seconds": total,
                     "mean_ms": total / len(sel) * 1e3 if sel else None,
                     "mean_running": sum(n for _, _, n in sel) / len(sel) if sel else None,
                     "prompt_tokens": sum(p for _, p, _ in sel)}
    return out


def run_static(runner, workload, batch: int, device, arrival=None) -> dict:
    """The static generate: a batch of up to `batch` requests that have arrived (all at t=0
    without `arrival`) runs to its longest output before the next batch starts."""
    arrival = np.zeros(len(workload)) if arrival is None else arrival
    stats, graphs_before = runner.executor.stats, captured_graphs(runner)
    steps_before, decode_before, wait_before = stats.steps, stats.decode_only_steps, stats.gpu_wait_s
    sync(device)
    t0 = time.perf_counter()
    out_tokens, i, batches = 0, 0, []
    agree = agreed_time(arrival)
    while i < len(workload):
        now = time.perf_counter() - t0
        if arrival[i] > now:
            time.sleep(arrival[i] - now)
            now = arrival[i]
        now = agree(now)
        j = i + 1
        while j < len(workload) and j - i < batch and arrival[j] <= now:
            j += 1
        chunk = workload[i:j]
        batches.append(len(chunk))
        runner.generate([ids for ids, _ in chunk], max_new_tokens=max(o for _, o in chunk), top_k=1)
        out_tokens += sum(o for _, o in chunk)  # tokens past a request's own length are waste
        i = j
    sync(device)
    elapsed = time.perf_counter() - t0
    return {"batch": batch, "elapsed_s": elapsed, "output_tok_s": out_tokens / elapsed,
            "steps": stats.steps - steps_before, "decode_only_steps": stats.decode_only_steps - decode_before,
            "gpu_wait_s": stats.gpu_wait_s - wait_before,
            "graphs_captured": captured_graphs(runner) - graphs_before, "batches": batches}


def decode_graphs(runner):
    """The runner's decode recordings (CUDA graphs, or host tapes on the CPU), or None (off)."""
    return getattr(getattr(runner.executor, "runner", None), "decode_graphs", None)


def captured_graphs(runner) -> int:
    """Decode recordings captured so far (a capture inside a timed run is part of its time)."""
    graphs = decode_graphs(runner)
    return len(graphs.graphs) if graphs is not None else 0


def run_llm_api(engine_dir, workload, arrival, device) -> dict:
    """The same requests through LLM.generate_async. The LLM's engine runs in a fresh process of
    its own, as a user's would, so this process having run torch's CPU ops (the runs above)
    does not slow it (benchmarks/README.md: a second OpenMP team in one process is throttled
    on a small CPU); this process only submits and waits."""
    from tensorrt_llm import LLM, SamplingParams
    with LLM(engine_dir, device=device, progress=None) as llm:
        # Warm-up, as the executor's run had (first steps allocate; CUDA graphs are captured).
        llm.generate([ids for ids, _ in workload[:8]], SamplingParams(max_tokens=8, ignore_eos=True,
                                                                      detokenize=False), use_tqdm=False)
        t0 = time.perf_counter()
        results = []
        for (ids, out), at in zip(workload, arrival):
            delay = at - (time.perf_counter() - t0)
            if delay > 0:
                time.sleep(delay)
            results.append(llm.generate_async(ids, SamplingParams(max_tokens=out, ignore_eos=True,
                                                                   detokenize=False)))
        outs = [r.result() for r in results]
        elapsed = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"elapsed_s": elapsed, "output_tok_s": tokens / elapsed,
            "outputs": [o.outputs[0].token_ids for o in outs]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=[*SHAPES, "smollm2-gguf"], default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16", type=dtype_arg, choices=MODEL_DTYPES)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--scenario", choices=["throughput", "chunked", "reuse"], default="throughput")
    p.add_argument("--num_requests", type=int, default=200)
    p.add_argument("--dataset", choices=["fixed", "synthetic"], default="fixed")
    p.add_argument("--input_len", type=int, default=128)
    p.add_argument("--output_len", type=int, default=128)
    p.add_argument("--input_range", default="32,1024")
    p.add_argument("--output_range", default="32,512")
    p.add_argument("--request_rate", type=float, default=float("inf"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max_batch_size", type=int, default=256)
    p.add_argument("--max_num_tokens", type=int, default=8192)
    p.add_argument("--tokens_per_block", type=int, default=64)
    p.add_argument("--kv_cache_free_gpu_memory_fraction", type=float, default=0.9)
    p.add_argument("--no_chunked_context", action="store_true")
    p.add_argument("--static_batch_sizes", default="", help="also time the static generate at these")
    p.add_argument("--check_alone", type=int, default=0,
                   help="run this many requests alone and count those whose tokens equal the batched run")
    p.add_argument("--llm_api", action="store_true", help="also run the requests through LLM.generate_async")
    p.add_argument("--profile", action="store_true",
                   help="print torch.profiler tables of the measured run (throughput) or of the reuse run")
    p.add_argument("--json", default=None)
    p.add_argument("--tp_size", type=int, default=1,
                   help="tensor-parallel ranks (the script starts the --tp_size x --pp_size rank processes, "
                        "each building its own shard of random weights in memory)")
    p.add_argument("--pp_size", type=int, default=1, help="pipeline-parallel ranks")
    add_pp_partition_argument(p)
    p.add_argument("--compare_one_gpu", action="store_true",
                   help="first run the one-rank engine of the same shape on one device (its own process), "
                        "then the --tp_size x --pp_size one, and compare their output tokens/s")
    args = p.parse_args(argv)
    if args.tp_size < 1 or args.pp_size < 1:
        p.error("--tp_size and --pp_size must be >= 1")
    check_pp_partition(p, args)
    if args.tp_size * args.pp_size > 1 or args.compare_one_gpu:
        if args.model not in SHAPES:
            p.error(f"a multi-rank run builds random weights in memory: --model must be one of {', '.join(SHAPES)}")
        if args.scenario != "throughput" or args.llm_api or args.profile:
            p.error("a multi-rank run measures --scenario throughput (without --llm_api / --profile)")
        return run_multi(args)
    return run(args)


def rank_main(args, out: str) -> None:
    """One rank process of run_multi: run, rank 0 writes the result to `out`."""
    result = run(args)
    if result is not None:
        Path(out).write_text(json.dumps(result))
    distributed.barrier()


def run_multi(args):
    """The --tp_size x --pp_size engine in the rank processes this script starts (or the ones
    torchrun / mpirun launched); with --compare_one_gpu the one-rank engine first, in a process
    of its own, on the same requests. Rank 0 prints; the comparison and --json come once."""
    world = args.tp_size * args.pp_size
    one, result = run_split(args, rank_main, dict(vars(args), ranks=True, json=None))
    if result is None:
        return None  # a launched rank other than 0
    if one is not None and world > 1:
        result["one_gpu"] = one
        a, b = one["inflight"], result["inflight"]
        result["speedup_vs_one_gpu"] = b["output_tok_s"] / a["output_tok_s"]
        print(f"\n| run | output tok/s | TPOT p50 ms | steps |\n| --- | --- | --- | --- |\n"
              f"| 1 GPU | {a['output_tok_s']:.1f} | {a['tpot_s']['p50'] * 1e3:.2f} | {a['steps']} |\n"
              f"| TP{args.tp_size} x PP{args.pp_size} | {b['output_tok_s']:.1f} | {b['tpot_s']['p50'] * 1e3:.2f} | "
              f"{b['steps']} |\nTP{args.tp_size} x PP{args.pp_size} / 1 GPU: {result['speedup_vs_one_gpu']:.2f}x "
              f"output tokens/s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


def run(args):
    """Build, load and measure (in a rank process of run_multi: this rank's part, built in
    memory; rank 0 alone prints and returns the result)."""
    dtype = args.dtype
    ranks = getattr(args, "ranks", False)
    world = args.tp_size * args.pp_size if ranks else 1
    if ranks:
        info = distributed.launch_info()
        if info.world_size > 1 and torch.device(args.device).type == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // info.world_size))
        device = distributed.device_for(info, args.device)
        mapping = Mapping(world_size=world, rank=info.rank, tp_size=args.tp_size, pp_size=args.pp_size,
                          pp_partition=getattr(args, "pp_partition", None))
        distributed.init(mapping, device, info)
    else:
        device = torch.device(args.device)
    lead = distributed.rank() == 0
    rng = np.random.default_rng(args.seed)
    result = {"args": vars(args), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
              else "cpu"}
    result["matmul_TFLOPs"] = matmul_rate(device, getattr(torch, dtype)) / 1e12
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the measurement's buffers back to the GPU before the KV pool is sized

    if args.scenario == "chunked":
        max_in, max_out = 4096, 256
    elif args.scenario == "reuse":
        max_in, max_out = 1024 + 64, 16
    else:
        max_in = args.input_len if args.dataset == "fixed" else int(args.input_range.split(",")[1])
        max_out = args.output_len if args.dataset == "fixed" else int(args.output_range.split(",")[1])
    bc = BuildConfig(max_batch_size=args.max_batch_size, max_input_len=max_in, max_seq_len=max_in + max_out + 8,
                     max_num_tokens=max(args.max_num_tokens, max_in + args.max_batch_size),
                     tokens_per_block=args.tokens_per_block)
    runner_kwargs = dict(kv_cache_free_gpu_mem_fraction=args.kv_cache_free_gpu_memory_fraction,
                         enable_chunked_context=not args.no_chunked_context,
                         enable_block_reuse=args.scenario == "reuse", max_num_tokens=args.max_num_tokens)
    if ranks:
        # This rank's shard of random weights, built in memory (bench_generation.random_rank_engine).
        engine, params = random_rank_engine(args.model, dtype, device, mapping, bc)
        params = sum(distributed.broadcast_object(params, src=r) for r in range(world)) if world > 1 else params
        runner = ModelRunner(engine, device, **runner_kwargs)
        del engine
    else:
        if args.model == "smollm2-gguf":
            model, _ = gguf_models(dtype, device, False)
        else:
            model, _ = random_models(args.model, dtype, device, False)
        params = sum(p.numel() for _, p in model.named_parameters())
        engine = build(model, bc)
        del model
        # Removed when run() returns (it held a whole engine: 16 GB for the 8B shape in bf16).
        engine_dir = tempfile.TemporaryDirectory(prefix="bench_throughput-")
        engine.save(engine_dir.name)
        del engine
        runner = ModelRunner.from_dir(engine_dir.name, device=device, **runner_kwargs)
    vocab = runner.vocab_size
    result.update(params=params, kv_blocks=runner.kv_cache.num_blocks, tokens_per_block=args.tokens_per_block,
                  tp_size=args.tp_size, pp_size=args.pp_size,
                  pp_partition=runner.mapping.stage_layer_counts(runner.config["num_hidden_layers"]))

    # Warm-up: the attention paths, then the CUDA graphs of every bucket.
    warm = make_workload(argparse.Namespace(**{**vars(args), "num_requests": min(args.max_batch_size, 64),
                                               "dataset": "fixed", "input_len": min(64, max_in),
                                               "output_len": min(8, max_out)}), vocab, rng)
    run_executor(runner, warm, np.zeros(len(warm)), device)
    if decode_graphs(runner) is not None:  # every bucket now: the timed runs time steps, not captures
        decode_graphs(runner).capture()

    if args.scenario == "throughput":
        workload = make_workload(args, vocab, rng)
        arrival = arrivals(len(workload), args.request_rate, rng)
        res = run_executor(runner, workload, arrival, device, args.profile)
        # The GPU's matmul rate moves with its clocks (the same H100 measured 663 and 779
        # TFLOP/s a minute apart): measured again after the run, the ceiling takes the higher.
        result["matmul_TFLOPs_before_after"] = [result["matmul_TFLOPs"],
                                                matmul_rate(device, getattr(torch, dtype)) / 1e12]
        result["matmul_TFLOPs"] = max(result["matmul_TFLOPs_before_after"])
        processed = res["input_tokens"] + res["output_tokens"]
        # Every rank's GPU computes at the measured rate (rank 0's measurement stands for all).
        ceiling = res["output_tokens"] / (2 * params * processed / (world * result["matmul_TFLOPs"] * 1e12))
        res["compute_ceiling_tok_s"] = ceiling
        res["fraction_of_ceiling"] = res["output_tok_s"] / ceiling
        outputs = res.pop("outputs")
        result["inflight"] = res
        if lead:
            print(json.dumps({"inflight": res}), flush=True)
        static = []
        for b in [int(x) for x in args.static_batch_sizes.split(",") if x]:
            static.append(run_static(runner, workload, b, device, arrival))
            if lead:
                print(json.dumps({"static": static[-1]}), flush=True)
        if static:
            best = max(static, key=lambda s: s["output_tok_s"])
            result["static"] = static
            result["speedup_vs_best_static"] = res["output_tok_s"] / best["output_tok_s"]
        if args.check_alone:
            idx = rng.choice(len(workload), min(args.check_alone, len(workload)), replace=False)
            same = 0
            for i in idx:
                alone = run_executor(runner, [workload[i]], np.zeros(1), device)["outputs"][0]
                same += alone == outputs[i]
            result["equal_to_alone"] = {"checked": len(idx), "equal": int(same)}
        if args.llm_api:
            api = run_llm_api(engine_dir.name, workload, arrival, device)
            result["llm_api"] = {k: v for k, v in api.items() if k != "outputs"}
            result["llm_api"]["outputs_equal_executor"] = api["outputs"] == outputs
            # The static generate on the same requests arriving at the same times.
            result["static_same_prompts"] = run_static(runner, workload, args.max_batch_size, device, arrival)
    elif args.scenario == "chunked":
        result["chunked"] = scenario_chunked(runner, vocab, rng, device)
    else:
        result["reuse"] = scenario_reuse(runner, vocab, rng, device, args.profile)

    if not lead:
        return None
    print_summary(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


def scenario_chunked(runner, vocab, rng, device) -> dict:
    """64 requests decode; a 4,096-token prompt arrives while they do. Their inter-token
    latency and time per output token with the prompt chunked, unchunked, and absent."""
    sched = runner.executor.scheduler
    decoders = [(rng.integers(100, vocab - 100, 128).tolist(), 256) for _ in range(64)]
    long = (rng.integers(100, vocab - 100, 4096).tolist(), 8)
    out = {}
    for name, chunked, with_long in (("alone", True, False), ("chunked", True, True), ("unchunked", False, True)):
        sched.enable_chunked_context = chunked
        budget = sched.max_num_tokens
        if not chunked:
            sched.max_num_tokens = max(budget, 4096 + 64)
        workload = decoders + ([long] if with_long else [])
        arrival = np.zeros(len(workload))
        if with_long:
            arrival[-1] = 0.25  # well into the decodes
        res = run_executor(runner, workload, arrival, device)
        sched.max_num_tokens = budget
        out[name] = {"tpot_s": res["tpot_s"], "itl_s": res["itl_s"], "elapsed_s": res["elapsed_s"]}
    sched.enable_chunked_context = True
    out["p99_tpot_ratio_chunked"] = out["chunked"]["tpot_s"]["p99"] / out["alone"]["tpot_s"]["p99"]
    out["p99_tpot_ratio_unchunked"] = out["unchunked"]["tpot_s"]["p99"] / out["alone"]["tpot_s"]["p99"]
    out["max_itl_chunked_s"] = out["chunked"]["itl_s"]["p99"]
    return out


def scenario_reuse(runner, vocab, rng, device, profile: bool = False) -> dict:
    """256 requests sharing a 1,024-token prefix, each with its own 64-token suffix: time to
    first token with block reuse and without; outputs equal."""
    kv = runner.kv_cache
    prefix = rng.integers(100, vocab - 100, 1024).tolist()
    workload = [(prefix + rng.integers(100, vocab - 100, 64).tolist(), 16) for _ in range(256)]
    out = {}
    for name, reuse in (("no_reuse", False), ("reuse", True)):
        kv.enable_block_reuse = reuse
        res = run_executor(runner, workload, np.zeros(len(workload)), device, profile and reuse)
        out[name] = {k: res[k] for k in ("ttft_s", "elapsed_s", "reused_blocks", "output_tok_s", "step_time")}
        out[name + "_outputs"] = res["outputs"]
    a, b = out.pop("no_reuse_outputs"), out.pop("reuse_outputs")
    out["outputs_equal"] = sum(x == y for x, y in zip(a, b)) / len(a)
    out["p50_ttft_ratio"] = out["reuse"]["ttft_s"]["p50"] / out["no_reuse"]["ttft_s"]["p50"]
    return out


def print_summary(result: dict) -> None:
    rates = result.get("matmul_TFLOPs_before_after")
    measured = f" (best of {rates[0]:.3g} before and {rates[1]:.3g} after the run)" if rates else ""
    print(f"\ndevice: {result['device_name']}, matmul {result['matmul_TFLOPs']:.3g} TFLOP/s{measured}, "
          f"{result['params'] / 1e9:.2f} B parameters, KV pool {result['kv_blocks']} blocks")
    if "inflight" in result:
        r = result["inflight"]
        print("| run | output tok/s | total tok/s | req/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | peak KV blocks |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        print(f"| in-flight | {r['output_tok_s']:.0f} | {r['total_tok_s']:.0f} | {r['requests_s']:.2f} | "
              f"{r['ttft_s']['p50'] * 1e3:.1f} / {r['ttft_s']['p99'] * 1e3:.1f} | "
              f"{r['tpot_s']['p50'] * 1e3:.2f} / {r['tpot_s']['p99'] * 1e3:.2f} | {r['peak_kv_blocks']} |")
        for s in result.get("static", []):
            print(f"| static batch {s['batch']} | {s['output_tok_s']:.0f} | | | | | |")
        print(f"compute ceiling {r['compute_ceiling_tok_s']:.0f} output tok/s: in-flight reaches "
              f"{r['fraction_of_ceiling']:.3f} of it")
        print_steps("in-flight", r["step_time"])
        if result["device_name"] != "cpu":
            pace = ("the GPU sets the pace" if r["gpu_wait_s"] > 0.25 * r["elapsed_s"]
                    else "little waiting: the host's own work per step sets the pace")
            print(f"the host waited for the GPU {r['gpu_wait_s']:.2f} s of {r['elapsed_s']:.2f} s ({pace}); "
                  f"{r['graphs_captured']} CUDA graphs captured during the run")
            for s in result.get("static", []):
                print(f"static batch {s['batch']}: {s['steps']} steps ({s['decode_only_steps']} decode only), "
                      f"host waited {s['gpu_wait_s']:.2f} s of {s['elapsed_s']:.2f} s, "
                      f"{s['graphs_captured']} CUDA graphs captured during the run")
        if "speedup_vs_best_static" in result:
            print(f"in-flight / best static: {result['speedup_vs_best_static']:.2f}x")
        if "equal_to_alone" in result:
            e = result["equal_to_alone"]
            print(f"equal to alone: {e['equal']} of {e['checked']}")
        if "llm_api" in result:
            print(f"LLM API: {result['llm_api']['output_tok_s']:.1f} output tok/s; static generate on the same "
                  f"prompts: {result['static_same_prompts']['output_tok_s']:.1f}")
    if "chunked" in result:
        c = result["chunked"]
        for k in ("alone", "chunked", "unchunked"):
            print(f"{k}: TPOT p50 {c[k]['tpot_s']['p50'] * 1e3:.2f} ms p99 {c[k]['tpot_s']['p99'] * 1e3:.2f} ms, "
                  f"ITL p99 {c[k]['itl_s']['p99'] * 1e3:.2f} ms")
        print(f"p99 TPOT ratio: chunked {c['p99_tpot_ratio_chunked']:.2f}x, "
              f"unchunked {c['p99_tpot_ratio_unchunked']:.2f}x")
    if "reuse" in result:
        r = result["reuse"]
        print(f"TTFT p50: no reuse {r['no_reuse']['ttft_s']['p50'] * 1e3:.1f} ms, reuse "
              f"{r['reuse']['ttft_s']['p50'] * 1e3:.1f} ms ({r['p50_ttft_ratio']:.2f}x), reused blocks "
              f"{r['reuse']['reused_blocks']}, outputs equal to no reuse: {r['outputs_equal']:.1%}")
        for k in ("no_reuse", "reuse"):
            print_steps(k, r[k]["step_time"])


def print_steps(name: str, st: dict) -> None:
    parts = []
    for kind in ("decode", "with_prompt"):
        k = st[kind]
        if k["steps"]:
            parts.append(f"{k['steps']} {kind} steps {k['seconds']:.2f} s ({k['mean_ms']:.1f} ms each, "
                         f"{k['mean_running']:.0f} running, {k['prompt_tokens']} prompt tokens)")
    print(f"{name} steps: " + "; ".join(parts))


if __name__ == "__main__":
    main()
