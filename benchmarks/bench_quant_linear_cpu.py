"""Weight-only INT8 / INT4 linears on the CPU against float32 F.linear, at SmolLM2-135M's shapes.

Two measurements:

1. Per shape ("warm"): one weight called again and again. Small weights then stay in the CPU
   caches, which flatters float32 (a decode step's weights do not fit in them).
2. A decode step's linears ("model"): 30 layers of distinct weights (fused QKV, output,
   fused gate/up, down) and the LM head, called in order, as one decode step calls them, so
   every weight comes from memory. This is the figure that predicts decode speed.

From (2), `--engine_f32_ms` (the float32 engine's ms per decode step, measured elsewhere:
bench_generation.py) gives a projection: the step's non-linear time is taken as the same in
every format, and the linears' time is replaced by the quantized one.

    python benchmarks/bench_quant_linear_cpu.py --threads 2 --rows 1
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's package, installed or not

from tensorrt_llm._utils import keep_freed_host_memory  # noqa: E402
from tensorrt_llm.quantization.cpu import (  # noqa: E402
    CpuInt8Pack,
    CpuInt8SplitPack,
    int4_weight_only_linear,
    int8_weight_only_linear,
    pack_int4_for_cpu,
    pack_int8_for_cpu,
)
from tensorrt_llm.quantization.formats import Int4Weight, Int8Weight, pack_int4  # noqa: E402

HIDDEN, INTER, VOCAB, LAYERS, KV = 576, 1536, 49152, 30, 192
# (name, out_features, in_features) as the engine runs them (QKV and gate/up fused)
SHAPES = [("qkv", HIDDEN + 2 * KV, HIDDEN), ("o_proj", HIDDEN, HIDDEN), ("gate_up", 2 * INTER, HIDDEN),
          ("down", HIDDEN, INTER), ("lm_head", VOCAB, HIDDEN)]
# int8: per channel (_weight_int8pack_mm); int8 g32: group-wise, GGUF Q8_0's layout (two INT4 halves)
FORMATS = ["f32", "int8", "int8 g32", "int4 g32", "int4 g64", "int4 g128"]
# (layers, LM head) of the decode-step measurement; the last is SmolLM2's GGUF as it is
# (Q4_1 layers, the Q8_0 tied embedding as LM head)
MODEL_FORMATS = [("f32", "f32"), ("int8", "int8"), ("int4 g32", "int4 g32"), ("int4 g64", "int4 g64"),
                 ("int4 g32", "int8"), ("int4 g32", "int8 g32")]


def make(fmt: str, n: int, k: int):
    """A weight in `fmt` (random values; the kernels' speed does not depend on them), or None
    where the format cannot hold the shape (group 128 needs in_features % 128 == 0)."""
    if fmt == "f32":
        return torch.randn(n, k)
    if fmt == "int8":
        return pack_int8_for_cpu(Int8Weight(torch.randint(-127, 128, (n, k), dtype=torch.int8), torch.rand(n) * 0.01))
    group = int(fmt.split("g")[1])
    if k % group:
        return None
    if fmt.startswith("int8"):
        scales = (torch.rand(n, k // group) * 0.01).half()
        return pack_int8_for_cpu(Int8Weight(torch.randint(-127, 128, (n, k), dtype=torch.int8), scales, group))
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scales = torch.rand(n, k // group, dtype=torch.float32).half() * 0.01
    return pack_int4_for_cpu(Int4Weight(pack_int4(codes), scales, -8 * scales, group))


def call(x: torch.Tensor, w) -> torch.Tensor:
    if isinstance(w, torch.Tensor):
        return torch.nn.functional.linear(x, w)
    if isinstance(w, (CpuInt8Pack, CpuInt8SplitPack)):
        return int8_weight_only_linear(x, w)
    return int4_weight_only_linear(x, w)


def in_features(w) -> int:
    if isinstance(w, torch.Tensor):
        return w.shape[1]
    if isinstance(w, CpuInt8SplitPack):
        return w.halves.in_features
    return w.qweight.shape[1] if isinstance(w, CpuInt8Pack) else w.in_features

def weight_bytes(w) -> int:
    if isinstance(w, torch.Tensor):
        return w.numel() * w.element_size()
    return sum(weight_bytes(v) for v in vars(w).values() if isinstance(v, torch.Tensor) or hasattr(v, "__dict__"))


def timed(fn, min_time: float, repeats: int) -> float:
    """Median over `repeats` of the mean time of a batch of calls lasting >= min_time (seconds)."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    batch = max(1, int(min_time / once))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) / batch)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1", help="comma-separated input rows (1 = one decode token)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min_time", type=float, default=0.05, help="seconds per timed batch")
    ap.add_argument("--engine_f32_ms", type=float, default=1000 / 26,
                    help="the float32 engine's ms per decode step, for the projection (26 tok/s)")
    ap.add_argument("--skip_model", action="store_true", help="only the per-shape table")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_host_memory()  # as the engine does: outputs over 128 KiB are not mmap'ed afresh each call
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}, load average {os.getloadavg()[0]:.2f} "
          "(another busy process on a 2-core machine stalls the kernels' 2-thread parallel regions)")

    for rows in [int(r) for r in args.rows.split(",")]:
        print(f"\n## per shape, warm (the same weight every call), {rows} row(s): us per call "
              "(speed-up over f32)")
        print("| shape | N x K | " + " | ".join(FORMATS) + " |")
        print("| --- | --- |" + " --- |" * len(FORMATS))
        for name, n, k in SHAPES:
            x = torch.randn(rows, k)
            cells, base = [], None
            for fmt in FORMATS:
                w = make(fmt, n, k)
                if w is None:
                    cells.append("n/a")
                    continue
                t = timed(lambda: call(x, w), args.min_time, args.repeats) * 1e6
                base = base or t
                cells.append(f"{t:.0f}" + ("" if fmt == "f32" else f" ({base / t:.2f}x)"))
            print(f"| {name} | {n} x {k} | " + " | ".join(cells) + " |")

        if args.skip_model:
            continue
        print(f"\n## a decode step's linears ({LAYERS} layers of distinct weights + LM head), {rows} row(s)")
        print("| layers | LM head | weight MB | ms per step | speed-up | projected engine tok/s |")
        print("| --- | --- | --- | --- | --- | --- |")
        f32_ms = None
        for layer_fmt, head_fmt in MODEL_FORMATS:
            layer_shapes = [(n, k) for _, n, k in SHAPES[:-1]]
            if any(make(layer_fmt, 16, k) is None for _, k in layer_shapes):
                print(f"| {layer_fmt} | {head_fmt} | - | n/a: in_features {HIDDEN} is not a multiple of the group "
                      "| | |")
                continue
            weights = [make(layer_fmt, n, k) for _ in range(LAYERS) for n, k in layer_shapes]
            weights.append(make(head_fmt, VOCAB, HIDDEN))
            nbytes = sum(weight_bytes(w) for w in weights)
            xs = {k: torch.randn(rows, k) for k in (HIDDEN, INTER)}
            calls = [(xs[in_features(w)], w) for w in weights]
            del weights

            def step(calls=calls):
                for x, w in calls:
                    call(x, w)

            ms = timed(step, args.min_time * 4, args.repeats) * 1e3
            del calls
            f32_ms = f32_ms or ms
            rest = args.engine_f32_ms - f32_ms
            projected = f"{1000 / (rest + ms):.1f} ({args.engine_f32_ms / (rest + ms):.2f}x)" if rest > 0 else "-"
            print(f"| {layer_fmt} | {head_fmt} | {nbytes / 2 ** 20:.0f} | {ms:.2f} | {f32_ms / ms:.2f}x "
                  f"| {projected} |")
        print(f"\nload average now {os.getloadavg()[0]:.2f}. Projection: the float32 engine's "
              f"{args.engine_f32_ms:.1f} ms per step (--engine_f32_ms) minus its linears ({f32_ms:.1f} ms here) "
              "is kept as every format's non-linear time ('-': the linears alone took longer here than that "
              "whole step, so the figures are not comparable)")

if __name__ == "__main__":
    main()
