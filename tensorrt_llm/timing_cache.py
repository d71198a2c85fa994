"""Timing cache and kernel choice.

Where an op has several implementations on the build device (those registered with the op
in tensorrt_llm/ops that run there), the builder times each one on that device at the
layer's `opt` shapes and records the fastest in the layer's attrs as `implementation`, which
the Session then runs. The timings live in
a TimingCache, a JSON file that later builds (trtllm-build --input_timing_cache) reuse
instead of timing again:

    {"version": 1, "entries": {key: {implementation name: median microseconds}}}

A key is the JSON text of [op, device name, dtype, input shapes at opt, attrs], so two
layers that would run the same call share one entry.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from ._utils import str_dtype_to_torch
from .errors import TrtLlmError
from .network import Layer, Network
from .ops import OPS, implementations

TIMING_CACHE_VERSION = 1
WARMUP_RUNS = 3
TIMED_RUNS = 20


class TimingCacheError(TrtLlmError, ValueError):
    """A timing cache file that cannot be used; the message says why."""


class TimingCache:

    def __init__(self, entries: Optional[dict[str, dict[str, float]]] = None):
        self.entries: dict[str, dict[str, float]] = dict(entries or {})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TimingCache":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TimingCacheError(f"timing cache {path} cannot be read ({e})") from e
        version = data.get("version") if isinstance(data, dict) else None
        if version != TIMING_CACHE_VERSION:
            raise TimingCacheError(f"timing cache {path} has version {version!r}, "
                                   f"this build reads version {TIMING_CACHE_VERSION}")
        entries = data.get("entries")
        if not (isinstance(entries, dict) and all(
                isinstance(t, dict) and all(isinstance(us, (int, float)) for us in t.values())
                for t in entries.values())):
            raise TimingCacheError(f"timing cache {path}: 'entries' is not {{key: {{name: microseconds}}}}")
        return cls(entries)

    def save(self, path: str | os.PathLike) -> None:
        """Write next to the final name and rename, so a failed save never leaves half a cache."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"version": TIMING_CACHE_VERSION, "entries": self.entries},
                                  indent=1, sort_keys=True))
        os.replace(tmp, path)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def timing_key(op: str, device: str, dtype: str, shapes: list, attrs: dict) -> str:
    return json.dumps([op, device, dtype, shapes, attrs], sort_keys=True, separators=(",", ":"))


def _opt_size(network: Network, name: str, memo: dict[str, int]) -> int:
    """The size that stands for the dynamic dims of tensor `name`: the `opt` of the first
    dynamic axis of the network input it derives from. Intermediate tensors keep no dim
    names, so each producer is followed through its first dynamic input back to a network
    input (packed hidden states lead to input_ids: num_tokens)."""
    path = []
    while name not in memo:
        if network.is_input(name):
            ranges = network.dim_range(name)
            memo[name] = ranges[min(ranges)][1][1]
            break
        path.append(name)
        layer = network.producer(name)
        name = next((n for n in layer.inputs if n is not None and -1 in network.get_tensor(n).shape), None)
        if name is None:
            raise ValueError(f"layer {layer.name!r} makes a dynamic shape from static inputs")
    for n in path:
        memo[n] = memo[name]
    return memo[name]


def opt_shapes(network: Network, layer: Layer, memo: dict[str, int]) -> list[Optional[list[int]]]:
    shapes = []
    for name in layer.inputs:
        if name is None:
            shapes.append(None)
            continue
        shape = network.get_tensor(name).shape
        size = _opt_size(network, name, memo) if -1 in shape else None
        shapes.append([size if d == -1 else d for d in shape])
    return shapes


def _median_us(fn: Callable, args: list, kwargs: dict, device: torch.device) -> float:
    for _ in range(WARMUP_RUNS):
        fn(*args, **kwargs)
    if device.type == "cuda":
        events = []
        for _ in range(TIMED_RUNS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args, **kwargs)
            end.record()
            events.append((start, end))
        torch.cuda.synchronize(device)
        times = [start.elapsed_time(end) * 1e3 for start, end in events]
    else:
        times = []
        for _ in range(TIMED_RUNS):
            t0 = time.perf_counter()
            fn(*args, **kwargs)
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


@torch.inference_mode()
def choose_implementations(network: Network, device, cache: TimingCache) -> dict:
    """Time every implementation of each layer that has a choice on `device` (cached
    timings are reused), record the fastest as attrs["implementation"], and report
    {device, hits, misses, layers: {layer name: {implementation, timings_us}}}."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    table = implementations(device)
    name = device_name(device)
    report = {"device": name, "hits": 0, "misses": 0, "layers": {}}
    memo: dict[str, int] = {}
    for layer in network.layers:
        candidates = table.get(layer.op, {})
        # An op with side effects (gpt_attention writes the KV cache) is never timed: its paths
        # depend on runtime metadata (block tables, lengths) that random inputs cannot stand for.
        if len(candidates) < 2 or OPS[layer.op].side_effects:
            continue
        attrs = {k: v for k, v in layer.attrs.items() if k != "implementation"}
        shapes = opt_shapes(network, layer, memo)
        dtypes = [None if n is None else network.get_tensor(n).dtype for n in layer.inputs]
        key = timing_key(layer.op, name, dtypes[0], shapes, attrs)
        timings = cache.entries.get(key)
        if timings is not None and set(candidates) <= set(timings):
            report["hits"] += 1
        else:
            args = [None if s is None else torch.randn(s, device=device).to(str_dtype_to_torch(dt))
                    for s, dt in zip(shapes, dtypes)]
            timings = {impl: _median_us(fn, args, attrs, device) for impl, fn in candidates.items()}
            cache.entries[key] = timings
            report["misses"] += 1
        choice = min(candidates, key=timings.__getitem__)
        layer.attrs["implementation"] = choice
        report["layers"][layer.name] = {"implementation": choice,
                                        "timings_us": {k: round(timings[k], 2) for k in candidates}}
    return report
