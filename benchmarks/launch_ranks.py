"""Start the rank processes of a multi-rank benchmark, as torchrun would on one machine.

    run_ranks(world, fn, *args)   # fn(*args) in `world` processes, rank 0 .. world - 1
    one, result = run_split(args, rank_main, fields)   # --compare_one_gpu's one rank, then the split

Each process gets torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR=127.0.0.1, MASTER_PORT a free port) and finds its rank with
tensorrt_llm.distributed.launch_info, so the code it runs is the code a torchrun launch runs.
The processes are started with torch.multiprocessing (the "spawn" method: no CUDA state is
inherited); they inherit this process's environment, where importing tensorrt_llm has set
NCCL_NVLS_ENABLE=0 / TORCH_SYMM_MEM_DISABLE_MULTICAST=1 / NVSHMEM_DISABLE_NVLS=1 (NVLink
multicast stays off). A rank that fails makes run_ranks raise (the others then fail their next
collective within TRTLLM_DIST_TIMEOUT and are ended by torch.multiprocessing).

Already inside a launch of `world` processes (torchrun / mpirun started this one), run_ranks
runs fn here, as this process's rank, and starts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
from pathlib import Path

import torch.multiprocessing as mp

import tensorrt_llm.distributed as distributed  # noqa: F401  (sets the NVLink-multicast variables)
from tensorrt_llm.distributed import launch_info


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(local_rank: int, world: int, port: int, fn, args) -> None:
    os.environ.update(RANK=str(local_rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    fn(*args)


def launched_here(world: int) -> bool:
    """Whether this process is already one of a launch of `world` ranks (torchrun, mpirun)."""
    info = launch_info()
    if info.launcher != "none" and info.world_size != world:
        raise SystemExit(f"launched as {info.world_size} process(es) by {info.launcher}, but "
                         f"{world} rank(s) were asked for")
    return info.launcher != "none"


def run_ranks(world: int, fn, *args) -> None:
    """fn(*args) in each of `world` rank processes (here, when this is one of them already)."""
    if launched_here(world):
        fn(*args)
        return
    env = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
           if k in os.environ}
    try:
        mp.spawn(_entry, args=(world, _free_port(), fn, args), nprocs=world, join=True)
    finally:
        os.environ.update(env)


def run_split(args, rank_main, fields: dict):
    """The benchmark's two runs: with args.compare_one_gpu the one-rank engine first (in a process
    of its own), then the args.tp_size x args.pp_size engine, each as rank_main(namespace, path)
    in its rank processes, rank 0 writing its result as JSON to `path`. `fields`: the namespace's
    fields. Returns (the one-rank result or None, the split's result); (None, None) in a
    launched rank other than 0."""
    world = args.tp_size * args.pp_size
    with tempfile.TemporaryDirectory() as tmp:
        one = None
        if args.compare_one_gpu:
            if launched_here(world) and world > 1:
                raise SystemExit("--compare_one_gpu starts its own processes: run the script without a launcher")
            print("== one rank (tp_size 1, pp_size 1) ==", flush=True)
            one_rank = argparse.Namespace(**dict(fields, tp_size=1, pp_size=1, pp_partition=None))
            run_ranks(1, rank_main, one_rank, f"{tmp}/one.json")
            one = json.loads(Path(f"{tmp}/one.json").read_text())
        if world == 1:
            return one, one
        print(f"== tp_size {args.tp_size} x pp_size {args.pp_size} ==", flush=True)
        run_ranks(world, rank_main, argparse.Namespace(**fields), f"{tmp}/multi.json")
        if not Path(f"{tmp}/multi.json").exists():
            return None, None  # a launched rank other than 0
        return one, json.loads(Path(f"{tmp}/multi.json").read_text())
