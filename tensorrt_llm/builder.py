"""`build()`: a model with its weights bound -> its network -> the graph-rewriting passes ->
the kernel choice -> an `Engine` (engine.py holds the format, build_config.py the options).
"""
from __future__ import annotations

import logging
import re
import time
from typing import Optional

import torch

from .build_config import BuildConfig, current_device_target
from .engine import Engine
from .engine import read_engine_config as read_engine_config  # where the LLM API and refit.py find it
from .graph_rewriting import optimize
from .logger import logger
from .network import Network, net_guard
from .quantization.mode import check_device_support
from .timing_cache import TimingCache, choose_implementations


def target_capability(target_device: str) -> Optional[tuple[int, int]]:
    """(major, minor) compute capability of a "cuda:sm_XY" build target (sm_89 -> (8, 9),
    sm_100 -> (10, 0)); None for a target that names no GPU ("any")."""
    m = re.fullmatch(r"cuda:sm_(\d+)(\d)", target_device)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_quantization_target(quant_config, target_device: str) -> None:
    """ConfigError, in one line, when the build target is a GPU that cannot run the model's
    quantization (FP8 before sm_89); a target naming no GPU builds anything (the CPU runs
    FP8 through the reference)."""
    capability = target_capability(target_device)
    check_device_support(quant_config, "cpu" if capability is None else "cuda", capability)


def build(model, build_config: BuildConfig, timing_cache=None, device=None) -> Engine:
    """Define `model` as a network, bind its weights, rewrite, and return the Engine.

    Where a layer's op has several implementations on the target GPU, each is timed there
    and the fastest recorded in the layer (tensorrt_llm/timing_cache.py): on `device` when
    given, else on this machine's GPU when it is the target. `timing_cache` (a
    TimingCache) supplies earlier timings and receives the new ones; without a cache or a
    device nothing is timed and every op runs its default implementation."""
    t0 = time.perf_counter()
    pretrained = model.config
    build_config = build_config.resolve(pretrained.max_position_embeddings)
    check_quantization_target(pretrained.quant_config, build_config.target_device)
    network = Network(name=type(model).__name__)
    with net_guard(network):
        bc = build_config
        inputs = model.prepare_inputs(max_batch_size=bc.max_batch_size, max_beam_width=bc.max_beam_width,
                                      max_seq_len=bc.max_seq_len, max_num_tokens=bc.max_num_tokens,
                                      tokens_per_block=bc.tokens_per_block)
        model(**inputs)
    layers_before = network.num_layers
    # The checkpoint weights the network reads, taken before rewriting drops the ones it fuses.
    params = {name: [p.dtype, list(p.shape)] for name, p in model.named_parameters() if name in network.weights}
    constants = set(network.weights) - set(params)
    report = {}
    if build_config.optimizations:
        # What each pass fuses, layer by layer, is worth the analysis only when it is logged.
        plan = {} if logger.isEnabledFor(logging.DEBUG) else None
        report = optimize(network, passes=build_config.optimizations, plan=plan)
        for label, matches in (plan or {}).items():
            for names in matches:
                logger.debug(f"rank {pretrained.mapping.rank} {label}: {' + '.join(names)}")
    layers_after = network.num_layers
    # Timing is asked for with a cache (or a device). Timings from another GPU say nothing
    # about the target: without a device, time only when this machine's GPU is the target.
    if (device is None and timing_cache is not None and torch.cuda.is_available()
            and build_config.target_device == current_device_target()):
        device = "cuda"
    kernel_choice = None
    if device is not None:
        cache = timing_cache if timing_cache is not None else TimingCache()
        kernel_choice = choose_implementations(network, device, cache)
    weight_bytes = sum(t.numel() * t.element_size() for t in network.weights.values())
    elapsed = time.perf_counter() - t0
    summary = {
        "layers_before_rewriting": layers_before,
        "layers_after_rewriting": layers_after,
        "rewrites": report,
        "weight_bytes": weight_bytes,
        "build_seconds": round(elapsed, 3),
    }
    if kernel_choice is not None:
        summary["kernel_choice"] = kernel_choice
    logger.info(f"built {network.name} rank {pretrained.mapping.rank}: {layers_before} layers "
                f"-> {layers_after} after rewriting, {weight_bytes / 2**20:.1f} MiB of weights, "
                f"{elapsed:.2f} s")
    config = {
        "pretrained_config": pretrained.to_dict(),
        "build_config": build_config.to_dict(),
        "build_summary": summary,
    }
    return Engine(config, network, rank=pretrained.mapping.rank,
                  refit_map=refit_map(network, params, constants))


def refit_map(network: Network, params: dict, constants: set) -> Optional[dict]:
    """How each engine weight derives from the checkpoint, for tensorrt_llm/refit.py:
    {"sources": {engine weight: checkpoint names, concatenated along dim 0 ([name, rows]:
                 a [1] tensor repeated over rows rows)},
     "checkpoint": {checkpoint name: [dtype, shape]},
     "equal": {checkpoint name: the checkpoint name the engine reads in its place, which it
               must equal}}. Weights in none are the model's own constants (e.g. the rotary
    table). None when a rewrite made a weight without recording its sources: such an engine
    cannot be refitted."""
    sources = {}
    for name in network.weights:
        if name in params:
            sources[name] = [name]
        elif name in network.weight_sources:
            sources[name] = network.weight_sources[name]
        elif name not in constants:
            return None
    equal = {unread: read for unread, read in network.equal_sources.items() if read in sources}
    return {"sources": sources, "checkpoint": params, "equal": equal}
