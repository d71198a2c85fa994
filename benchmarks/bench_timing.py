"""How the benchmarks time things: the device's copy bandwidth (the denominator of every floor
and "of copy" fraction) and the time per call of functions replayed in a CUDA graph (launch gaps
as in the runtime's decode graphs, no Python in between)."""
from __future__ import annotations

import statistics
import time

import torch


def copy_bandwidth(device: torch.device = torch.device("cuda"), repeats: int = 10) -> float:
    """Bytes per second of a device-to-device copy (1 GiB; 128 MiB on a CPU), counting the read
    and the write: the best of `repeats` copies."""
    n = (1 << 30) if device.type == "cuda" else (1 << 27)
    src = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            with torch.cuda.device(src.device):  # the events on the copy's device
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                dst.copy_(src)
                end.record()
                end.synchronize()
            seconds = start.elapsed_time(end) * 1e-3
        else:
            t = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - t
        best = min(best, seconds)
    return 2 * n / best


def graph_seconds_per_call(calls, repeats: int = 10) -> float:
    """Median over `repeats` replays of the seconds per call of a CUDA graph that calls every
    function in `calls` once, in order; each is called once first, outside the graph (lazy
    initialisation: cuBLAS handles, kernel attributes)."""
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / len(calls))
    return statistics.median(times)
