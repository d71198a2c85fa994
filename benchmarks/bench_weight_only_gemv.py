"""Weight-only INT8 / INT4 linear layers on a GPU: weight_only_linear's CUDA implementation
(the GEMV up to GEMV_MAX_ROWS rows, dequantization + cuBLAS beyond) against torch's bfloat16
matmul on the unquantized layer, for the linear layers of Llama-3.1-8B. Formats `fp8:tensor`
and `fp8:channel` (W8A8 E4M3, static input scale, per-tensor or per-channel weight scale) time
fp8_linear's CUDA implementation (the FP8 GEMV up to FP8_GEMV_MAX_ROWS rows, _scaled_mm
beyond) and, in the column `scaled_mm us`, the _scaled_mm path (quantize x, cuBLASLt) on the
same rows.

INT8 / INT4 codes are timed in tile order (`--orders tile`, what a runner on a GPU gives its
engine: ops/quantized_linear.py's tile_codes) and, with `--orders tile,row`, also in row order
(the engine file's; the `order` column).

For each layer and row count: microseconds per call, the bytes of the quantized weight it reads
(codes, scales and zeros), those bytes per second, and that as a fraction of the copy
bandwidth measured in the same run (a torch copy of a 1 GiB buffer: bytes read + written over
its time), which is the layer's floor; and the bfloat16 matmul's time and its ratio to ours.

Each timing replays a CUDA graph of consecutive calls that cycle through enough copies of the
weights to overflow the L2 cache, as a decode step's layers do (launch gaps as in the decode
graph); CUDA events around the replays, after a warm-up, median of the repeats. With
--l2_resident, the same graph length on the first copy alone, whose weights stay in L2: the
kernel's own limit, apart from DRAM's.

With --prologues (FP8 formats), each layer read after a norm or an activation in a LLaMA decoder
layer is also timed with it: `fused us`, the fused op (rms_norm_fp8_linear before qkv,
add_rms_norm_fp8_linear before gate_up, silu_and_mul_fp8_linear before down: beyond the FP8
GEMV's rows, the norm's or activation's kernel writing the E4M3 codes the FP8 GEMM reads; within
them, the unfused pair itself), and `unfused us`, the norm's or activation's kernel then fp8_linear.

    python benchmarks/bench_weight_only_gemv.py [--rows 1,8,32] [--formats int4:128,int8:0]
        [--scale-dtype float32] [--prologues] [--orders tile,row] [--l2_resident] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's package, installed or not

from tensorrt_llm.ops.activation import silu_and_mul_cuda  # noqa: E402
from tensorrt_llm.ops.fp8_linear import (  # noqa: E402
    add_rms_norm_fp8_linear_cuda,
    fp8_linear_cuda,
    fp8_linear_scaled_mm,
    rms_norm_fp8_linear_cuda,
    silu_and_mul_fp8_linear_cuda,
)
from tensorrt_llm.ops.norm import fused_add_rms_norm_cuda, rms_norm_cuda  # noqa: E402
from tensorrt_llm.ops.quantized_linear import cuda_serves, tile_codes, tileable, weight_only_linear_cuda  # noqa: E402
from tensorrt_llm.quantization import quantize_fp8, quantize_int4, quantize_int8  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_timing import copy_bandwidth, graph_seconds_per_call  # noqa: E402

# Llama-3.1-8B: (layer, out_features, in_features).
LAYERS = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
          ("lm_head", 128256, 4096)]
L2_OVERFLOW = 512 << 20  # bytes of weight copies per graph: well over any L2 cache
# What a LLaMA decoder layer computes in front of each layer (--prologues).
PROLOGUES = {"qkv": "rms_norm", "gate_up": "add_rms_norm", "down": "silu_and_mul"}


def quantized(fmt: str, group: int, n: int, k: int, scale_dtype: torch.dtype):
    """The op's tensors (qweight, scales, zeros) of a random layer, made on the GPU; FP8:
    (qweight bytes, weight_scale, input_scale)."""
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    if fmt == "fp8":
        q = quantize_fp8(w.float(), per_channel=bool(group), input_scale=torch.tensor([4.0 / 448]))
        return q.qweight.view(torch.uint8), q.scale, q.input_scale.cuda()
    q = quantize_int8(w, group or None, scale_dtype=scale_dtype) if fmt == "int8" else \
        quantize_int4(w, group, scale_dtype=scale_dtype)
    return q.qweight, q.scales, getattr(q, "zeros", None)


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def prologue_calls(kind: str, rows: int, k: int, copies: list) -> tuple[list, list]:
    """The fused op and the unfused pair (the norm's or activation's kernel, then fp8_linear) of
    `kind` on rows of x, one call per weight copy."""
    x = torch.randn(rows, 2 * k if kind == "silu_and_mul" else k, device="cuda", dtype=torch.bfloat16)
    if kind == "silu_and_mul":
        return ([lambda q=q: silu_and_mul_fp8_linear_cuda(x, *q) for q in copies],
                [lambda q=q: fp8_linear_cuda(silu_and_mul_cuda(x), *q) for q in copies])
    g = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
    if kind == "rms_norm":
        return ([lambda q=q: rms_norm_fp8_linear_cuda(x, g, *q, eps=1e-5) for q in copies],
                [lambda q=q: fp8_linear_cuda(rms_norm_cuda(x, g, eps=1e-5), *q) for q in copies])
    r = torch.randn_like(x)
    return ([lambda q=q: add_rms_norm_fp8_linear_cuda(x, r, g, *q, eps=1e-5) for q in copies],
            [lambda q=q: fp8_linear_cuda(fused_add_rms_norm_cuda(x, r, g, eps=1e-5)[0], *q) for q in copies])


def bench_layer(fmt: str, group: int, rows: int, n: int, k: int, scale_dtype: torch.dtype, bandwidth: float,
                prologue: str = None, order: str = "tile", l2_resident: bool = False) -> dict:
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    first = quantized(fmt, group, n, k, scale_dtype)
    weight_bytes = nbytes(*first)
    copies = [first] + [quantized(fmt, group, n, k, scale_dtype)
                        for _ in range(max(1, -(-L2_OVERFLOW // weight_bytes)) - 1)]
    scaled_mm = fused = unfused = None
    if fmt == "fp8":
        calls = [lambda q=q: fp8_linear_cuda(x, *q) for q in copies]
        ours = graph_seconds_per_call(calls)
        scaled_mm = graph_seconds_per_call([lambda q=q: fp8_linear_scaled_mm(x, *q) for q in copies])
        if prologue:
            fused, unfused = (graph_seconds_per_call(pair) for pair in prologue_calls(prologue, rows, k, copies))
    else:
        assert cuda_serves(x, first[0], fmt), "the kernels do not serve this shape"
        tiled = order == "tile" and tileable(*first[0].shape)
        if tiled:
            copies = [(tile_codes(q[0]), *q[1:]) for q in copies]
        calls = [lambda q=q: weight_only_linear_cuda(x, *q, weight_format=fmt, group_size=group, tiled=tiled)
                 for q in copies]
        ours = graph_seconds_per_call(calls)
    # The same weights every call, so that they stay in L2: what the layer takes when its bytes
    # cost (almost) nothing to fetch, i.e. the kernel's own limit.
    hot = graph_seconds_per_call([calls[0]] * len(calls)) if l2_resident else None
    del calls, copies, first
    dense_bytes = n * k * 2
    dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
             for _ in range(max(2, -(-L2_OVERFLOW // dense_bytes)))]
    torch_bf16 = graph_seconds_per_call([lambda w=w: F.linear(x, w) for w in dense])
    del dense
    torch.cuda.empty_cache()
    return {"format": fmt, "group_size": group, "rows": rows, "n": n, "k": k,
            "order": "tile" if fmt != "fp8" and order == "tile" and tileable(n, k * (4 if fmt == "int4" else 8) // 8)
            else "row",
            "scale_dtype": str(scale_dtype).removeprefix("torch."), "weight_bytes": weight_bytes,
            "us": ours * 1e6, "gb_per_s": weight_bytes / ours / 1e9,
            "l2_resident_us": None if hot is None else hot * 1e6,
            "of_copy_bandwidth": weight_bytes / ours / bandwidth,
            "bf16_matmul_us": torch_bf16 * 1e6, "bf16_matmul_bytes": dense_bytes,
            "speedup_vs_bf16": torch_bf16 / ours,
            "scaled_mm_us": None if scaled_mm is None else scaled_mm * 1e6, "prologue": prologue,
            "fused_us": None if fused is None else fused * 1e6,
            "unfused_us": None if unfused is None else unfused * 1e6}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--formats", default="int4:128,int8:0",
                        help="format:group_size, comma-separated; fp8:tensor / fp8:channel (static input scale)")
    parser.add_argument("--scale-dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="dtype of the scales and zeros (engines hold float32)")
    parser.add_argument("--prologues", action="store_true",
                        help="FP8: also time qkv, gate_up and down with the norm / activation in front, fused and not")
    parser.add_argument("--orders", default="tile",
                        help="INT8 / INT4 codes in tile order (a GPU runner's), row order (the engine file's), or both")
    parser.add_argument("--l2_resident", action="store_true",
                        help="also time each layer on the same weights every call (held in L2): the kernel's "
                             "own limit, against the `us` column's weights streamed from DRAM")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    orders = args.orders.split(",")
    if not orders or any(o not in ("tile", "row") for o in orders):
        parser.error(f"--orders takes tile and / or row, got {args.orders!r}")
    scale_dtype = getattr(torch, args.scale_dtype)
    bandwidth = copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e9:.0f} GB/s; "
          f"scales and zeros {args.scale_dtype}")
    print(f"{'format':<9} {'layer':<8} {'order':<5} {'rows':>4} {'us':>9} {'MB':>8} {'GB/s':>7} {'of copy':>8} "
          f"{'bf16 us':>9} {'speedup':>8}")
    results = []
    for spec in args.formats.split(","):
        fmt, group = spec.split(":")
        group = {"tensor": 0, "channel": 1}[group] if fmt == "fp8" else int(group)
        jobs = [(rows, layer, n, k, order) for rows in (int(r) for r in args.rows.split(","))
                for layer, n, k in LAYERS for order in (orders if fmt != "fp8" else ["row"])]
        for rows, layer, n, k, order in jobs:
            prologue = PROLOGUES.get(layer) if args.prologues and fmt == "fp8" else None
            r = bench_layer(fmt, group, rows, n, k, scale_dtype, bandwidth, prologue, order, args.l2_resident)
            r["layer"] = layer
            results.append(r)
            print(f"{spec:<9} {layer:<8} {r['order']:<5} {rows:>4} {r['us']:>9.2f} {r['weight_bytes'] / 1e6:>8.1f} "
                  f"{r['gb_per_s']:>7.0f} {r['of_copy_bandwidth']:>8.1%} {r['bf16_matmul_us']:>9.2f} "
                  f"{r['speedup_vs_bf16']:>7.2f}x"
                  + (f"  scaled_mm us {r['scaled_mm_us']:.2f}" if r["scaled_mm_us"] else "")
                  + (f"  L2-resident us {r['l2_resident_us']:.2f}" if args.l2_resident else "")
                  + (f"  {prologue}: fused us {r['fused_us']:.2f}, unfused us {r['unfused_us']:.2f}"
                     if prologue else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_bandwidth": bandwidth,
                       "scale_dtype": args.scale_dtype, "layers": results}, f, indent=1)


if __name__ == "__main__":
    main()
