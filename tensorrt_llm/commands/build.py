"""trtllm-build: checkpoint folder -> engine folder, one engine per rank."""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from .._utils import dtype_size
from ..builder import BuildConfig, build, current_device_target
from ..cli import add_debug_argument, run_cli
from ..errors import ConfigError
from ..kv_cache_layout import KVCacheLayout
from ..logger import logger
from ..models import MODEL_MAP
from ..models.modeling_utils import PretrainedConfig
from ..timing_cache import TimingCache, TimingCacheError


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trtllm-build", description=__doc__)
    p.add_argument("--checkpoint_dir", required=True, help="folder with config.json + rank*.safetensors")
    p.add_argument("--output_dir", required=True, help="engine folder to write")
    d = BuildConfig()
    p.add_argument("--max_batch_size", type=int, default=d.max_batch_size)
    p.add_argument("--max_input_len", type=int, default=d.max_input_len)
    p.add_argument("--max_seq_len", type=int, default=None,
                   help="default: max_input_len + 1024, capped by the model's max_position_embeddings")
    p.add_argument("--max_num_tokens", type=int, default=None)
    p.add_argument("--max_beam_width", type=int, default=d.max_beam_width)
    p.add_argument("--tokens_per_block", type=int, default=d.tokens_per_block)
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                   help="cast the checkpoint's weights to this dtype (default: keep the checkpoint's)")
    p.add_argument("--target_device", default=d.target_device,
                   help="'auto' (this machine's GPU, else any), 'any', or e.g. cuda:sm_90")
    p.add_argument("--no_rewrite", action="store_true", help="skip the graph-rewriting passes")
    p.add_argument("--verbose", action="store_true",
                   help="log at debug level, with the layers each graph-rewriting pass fuses")
    p.add_argument("--input_timing_cache", default=None,
                   help="kernel timings of earlier builds to reuse (an unusable file is ignored with a warning)")
    p.add_argument("--output_timing_cache", default=None,
                   help="write the kernel timings (reused and new) to this file")
    p.add_argument("--workers", type=int, default=1,
                   help="build this many ranks at once, each in a process of its own (default 1)")
    add_debug_argument(p)
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error("--workers must be >= 1")
    return args


def _size(n: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 2**10:.1f} KiB"


def target_memory_bytes(target: str) -> Optional[int]:
    """Total memory of the GPU a target names, when this machine has that GPU (else None:
    a cross-build cannot know it)."""
    if target.startswith("cuda") and torch.cuda.is_available() and current_device_target() == target:
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return None


def host_memory_bytes() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_kv_cache_fits(model_cls, config: PretrainedConfig, build_config: BuildConfig) -> None:
    """The KV pool the limits imply (every beam of every request at max_seq_len, in whole
    blocks, sized as the runtime sizes it) against the target: on a GPU target present here,
    refuse (ConfigError) what exceeds its memory less one rank's weights; elsewhere warn when
    it exceeds this host's memory (on the CPU the runtime allocates all of it at load)."""
    bc = build_config
    layout = KVCacheLayout.of_engine(config.to_dict(), bc.tokens_per_block)
    pool = layout.max_pool_bytes(bc.max_batch_size * bc.max_beam_width, bc.max_seq_len)
    weights = sum(p.numel() * dtype_size(p.dtype) for p in model_cls(config).parameters())
    what = (f"the KV cache these limits imply ({_size(pool)}: max_batch_size {bc.max_batch_size} x "
            f"max_beam_width {bc.max_beam_width} sequences of max_seq_len {bc.max_seq_len} tokens, "
            f"x {layout.num_layers} layers x 2 x {layout.num_kv_heads} KV heads x {layout.head_dim} x "
            f"{dtype_size(layout.dtype_name)} bytes)")
    options = "lower --max_batch_size, --max_seq_len or --max_beam_width"
    device_total = target_memory_bytes(bc.target_device)
    if device_total is not None:
        if pool > device_total - weights:
            raise ConfigError(f"{what} does not fit the {_size(device_total)} of {bc.target_device} "
                              f"with {_size(weights)} of weights; {options}")
        return
    host = host_memory_bytes()
    if host is not None and pool > host - weights and not bc.target_device.startswith("cuda"):
        print(f"trtllm-build: warning: {what} exceeds this host's {_size(host)} of memory less "
              f"{_size(weights)} of weights: on the CPU the runtime allocates all of it at load "
              f"(bound it with max_tokens_in_paged_kv_cache, or {options})", file=sys.stderr)


def checkpoint_config(checkpoint_dir) -> PretrainedConfig:
    """The config of a checkpoint folder; ConfigError when no model class builds its
    architecture. A bad checkpoint raises the project's own error (or OSError)."""
    config = PretrainedConfig.from_checkpoint(Path(checkpoint_dir))
    if config.architecture not in MODEL_MAP:
        raise ConfigError(f"architecture {config.architecture!r} is not supported "
                          f"(known: {', '.join(sorted(MODEL_MAP))})")
    return config


def check_build(config: PretrainedConfig, build_config: BuildConfig, dtype: Optional[str] = None) -> BuildConfig:
    """The build limits resolved against the model (ConfigError where they do not fit it, or
    where the KV cache they imply cannot fit the target; see check_kv_cache_fits)."""
    resolved = build_config.resolve(config.max_position_embeddings)
    model_config = config if dtype is None else dataclasses.replace(config, dtype=dtype)
    check_kv_cache_fits(MODEL_MAP[config.architecture], model_config, resolved)
    return resolved


def _build_rank(checkpoint_dir, output_dir, architecture: str, rank: int, build_config: BuildConfig,
                dtype: Optional[str], timing_entries: Optional[dict],
                in_worker: bool = False) -> tuple[int, dict, Optional[dict]]:
    """Build and save one rank: (bytes written, its build summary, the timing cache's entries
    after it). Runs in trtllm-build's process, or in a --workers process."""
    timing_cache = TimingCache(timing_entries) if timing_entries is not None else None
    if in_worker and torch.cuda.is_available():  # ranks built at once time their kernels on GPUs of their own
        torch.cuda.set_device(rank % torch.cuda.device_count())
    model = MODEL_MAP[architecture].from_checkpoint(Path(checkpoint_dir), rank=rank, dtype=dtype)
    engine = build(model, build_config, timing_cache=timing_cache)
    path = engine.save(output_dir)
    return (path.stat().st_size, engine.config["build_summary"],
            timing_cache.entries if timing_cache is not None else None)


def _log_rank(log, rank: int, world: int, s: dict) -> None:
    fused = s["rewrites"].get("rewrites", {})
    log(f"[rank {rank}/{world}] layers: {s['layers_before_rewriting']} defined, "
        f"{s['layers_after_rewriting']} after rewriting "
        f"({', '.join(f'{k} x{v}' for k, v in fused.items()) or 'no rewrites'}); "
        f"{s['weight_bytes'] / 2**20:.1f} MiB of weights, built in {s['build_seconds']:.1f} s")
    if "kernel_choice" in s:
        k = s["kernel_choice"]
        picked = {}
        for layer in k["layers"].values():
            picked[layer["implementation"]] = picked.get(layer["implementation"], 0) + 1
        log(f"[rank {rank}/{world}] kernel choice on {k['device']}: "
            f"{', '.join(f'{n} x{c}' for n, c in sorted(picked.items())) or 'nothing to choose'} "
            f"({k['hits']} timing cache hits, {k['misses']} timed)")


def build_engines(checkpoint_dir, output_dir, config: PretrainedConfig, build_config: BuildConfig, *,
                  dtype: Optional[str] = None, timing_cache: Optional[TimingCache] = None,
                  log: Callable[[str], None] = print, workers: int = 1) -> int:
    """Builds every rank of the checkpoint (`config`: its checkpoint_config) and saves each
    into output_dir; says one line per rank (and its kernel choice) through `log`.
    `dtype`: cast the weights to it (None: keep the checkpoint's). `workers` > 1 builds that
    many ranks at once, each in a process of its own (spawned); their kernel timings are
    merged into `timing_cache`. Returns the bytes written."""
    world = config.mapping.world_size
    entries = timing_cache.entries if timing_cache is not None else None
    args = [(checkpoint_dir, output_dir, config.architecture, rank, build_config, dtype) for rank in range(world)]
    total_bytes = 0
    if workers <= 1 or world == 1:
        for a in args:
            size, summary, _ = _build_rank(*a, entries)
            total_bytes += size
            _log_rank(log, a[3], world, summary)
        return total_bytes
    import concurrent.futures
    import multiprocessing
    with concurrent.futures.ProcessPoolExecutor(min(workers, world),
                                                mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_build_rank, *a, entries, True) for a in args]
        for rank, future in enumerate(futures):  # logged in rank order, as each is done
            size, summary, new_entries = future.result()
            total_bytes += size
            if timing_cache is not None:
                timing_cache.entries.update(new_entries)
            _log_rank(log, rank, world, summary)
    return total_bytes


def build_checkpoint(checkpoint_dir, output_dir, build_config: BuildConfig, *, dtype: Optional[str] = None,
                     timing_cache: Optional[TimingCache] = None, log: Callable[[str], None] = print,
                     workers: int = 1) -> int:
    """What trtllm-build does, as a function: checkpoint folder -> engine files in output_dir
    (written in place, rank file by rank file: wrap it in an atomic folder write where a
    half-written output matters). Returns the bytes written."""
    config = checkpoint_config(checkpoint_dir)
    check_build(config, build_config, dtype)
    return build_engines(checkpoint_dir, output_dir, config, build_config, dtype=dtype,
                         timing_cache=timing_cache, log=log, workers=workers)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.verbose:
        logger.setLevel(logging.DEBUG)
    t0 = time.perf_counter()
    ckpt = Path(args.checkpoint_dir)
    # A bad checkpoint or option raises the project's own error (run_cli prints its line).
    config = checkpoint_config(ckpt)
    build_config = BuildConfig(max_batch_size=args.max_batch_size, max_input_len=args.max_input_len,
                               max_seq_len=args.max_seq_len, max_num_tokens=args.max_num_tokens,
                               max_beam_width=args.max_beam_width, tokens_per_block=args.tokens_per_block,
                               target_device=args.target_device,
                               optimizations=[] if args.no_rewrite else BuildConfig().optimizations)
    check_build(config, build_config, args.dtype)
    # Kernel timing is asked for by naming a timing cache; otherwise each op runs its
    # default implementation (the compiled kernel on a GPU).
    timing_cache = None
    if args.input_timing_cache is not None or args.output_timing_cache is not None:
        timing_cache = TimingCache()
    if args.input_timing_cache is not None:
        # Timings only speed the build up: a cache we cannot use is not worth failing for.
        try:
            timing_cache = TimingCache.load(args.input_timing_cache)
        except TimingCacheError as e:
            print(f"trtllm-build: warning: {e}; timing from scratch", file=sys.stderr)
    total_bytes = build_engines(ckpt, args.output_dir, config, build_config, dtype=args.dtype,
                                timing_cache=timing_cache, workers=args.workers)
    if args.output_timing_cache is not None:
        timing_cache.save(args.output_timing_cache)
    print(f"Engine written to {args.output_dir}: {config.mapping.world_size} rank(s), "
          f"{total_bytes / 2**20:.1f} MiB, {time.perf_counter() - t0:.1f} s")
    return 0


def cli() -> int:
    """The trtllm-build console script: main() through tensorrt_llm.cli.run_cli, so a user
    error ends in one "trtllm-build: error: ..." line (exit code 2); --debug shows its
    traceback."""
    return run_cli(main, "trtllm-build")


if __name__ == "__main__":
    sys.exit(cli())
