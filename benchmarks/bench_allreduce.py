"""The tensor-parallel all-reduce of a decode step, alone: the engine's `allreduce` op (what a
TP engine runs twice a layer, after attention's output and the MLP's down projection) on
`rows x hidden` values, per call, on --tp_size ranks this script starts (or the ones torchrun /
mpirun launched). On GPUs the calls are timed inside a captured CUDA graph, as a decode step
replays them (NCCL); on the CPU (gloo) eagerly.

    python benchmarks/bench_allreduce.py --tp_size 2 --hidden 4096 --rows 1,8,32,256
    python benchmarks/bench_allreduce.py --tp_size 2 --device cpu --dtype float32 --rows 1,4

A step of Llama-3.1-8B at batch 1 holds 64 such calls of one row of 4,096: the per-call time x
64 is what TP pays on top of its GEMVs (benchmarks/README.md, "First run on two GPUs").
Rank 0 prints a table and writes --json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's tensorrt_llm, as the other benchmarks
sys.path.insert(0, str(ROOT / "benchmarks"))
from launch_ranks import run_ranks  # noqa: E402

from tensorrt_llm import distributed  # noqa: E402
from tensorrt_llm.mapping import Mapping  # noqa: E402
from tensorrt_llm.ops import OPS  # noqa: E402

CALLS = 64  # calls per timed run: one 8B decode step's worth


def time_calls(allreduce, x: torch.Tensor, repeats: int) -> float:
    """Seconds per call of `allreduce(x)`, CALLS calls a run, best of `repeats` runs."""
    if x.device.type == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                allreduce(x)  # warm-up outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(CALLS):
                    allreduce(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        return best / CALLS
    allreduce(x)
    best = float("inf")
    for _ in range(repeats):
        distributed.barrier()
        t = time.perf_counter()
        for _ in range(CALLS):
            allreduce(x)
        best = min(best, time.perf_counter() - t)
    return best / CALLS


def rank_main(args) -> None:
    info = distributed.launch_info()
    device = distributed.device_for(info, args.device)
    distributed.init(Mapping(world_size=args.tp_size, rank=info.rank, tp_size=args.tp_size), device, info)
    allreduce = OPS["allreduce"].reference
    dtype = getattr(torch, args.dtype)
    rows = []
    for n in args.rows:
        x = torch.ones(n, args.hidden, dtype=dtype, device=device)
        # Every rank adds its ones: the sum is the rank count, checked once.
        if not torch.equal(allreduce(x), torch.full_like(x, args.tp_size)):
            raise SystemExit(f"rank {info.rank}: the all-reduce of {n} x {args.hidden} gave a wrong sum")
        seconds = time_calls(allreduce, x, args.repeats)
        nbytes = x.numel() * x.element_size()
        rows.append({"rows": n, "bytes": nbytes, "us_per_call": seconds * 1e6,
                     "us_per_8b_step": seconds * 1e6 * CALLS})
    if info.rank == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        how = "in a CUDA graph" if device.type == "cuda" else "eager"
        print(f"allreduce over {args.tp_size} ranks on {name} ({torch.distributed.get_backend()}, {how}), "
              f"{args.dtype}, hidden {args.hidden}")
        print(f"{'rows':>6} {'bytes':>10} {'us/call':>9} {'x64 (one step) us':>18}")
        for r in rows:
            print(f"{r['rows']:>6} {r['bytes']:>10} {r['us_per_call']:>9.2f} {r['us_per_8b_step']:>18.1f}")
        if args.json:
            Path(args.json).write_text(json.dumps({"device_name": name, "tp_size": args.tp_size,
                                                   "dtype": args.dtype, "hidden": args.hidden, "rows": rows},
                                                  indent=2))
    distributed.barrier()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp_size", type=int, default=2)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--rows", default="1,8,32,256", help="comma-separated row counts (tokens of a step)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    try:
        args.rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        p.error(f"--rows must be comma-separated integers, got {args.rows!r}")
    if args.tp_size < 2:
        p.error("--tp_size must be at least 2 (an all-reduce over one rank is the identity)")
    if min(args.rows) < 1 or args.hidden < 1 or args.repeats < 1:
        p.error("--rows, --hidden and --repeats must be positive")
    if torch.device(args.device).type == "cuda" and torch.cuda.device_count() < args.tp_size:
        p.error(f"--tp_size {args.tp_size} needs {args.tp_size} GPUs; this machine has {torch.cuda.device_count()}")
    run_ranks(args.tp_size, rank_main, args)


if __name__ == "__main__":
    main()
