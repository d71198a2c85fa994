"""The paged decode-attention kernel alone: microseconds per call and the K/V bytes it reads
per second, for the decode shapes of the benchmark models (fused write + RoPE, as the runtime
calls it), over a bf16 cache or one of 1-byte codes (FP8 / INT8, with K and V scales).

    python benchmarks/bench_decode_attention.py [--kv_cache_dtype bf16,fp8,int8] [--cases "llama-8b b32 L2080"]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's package, installed or not

from tensorrt_llm.functional import rope_cos_sin_cache  # noqa: E402
from tensorrt_llm.ops.attention_cuda import decode_attention_cuda  # noqa: E402
from tensorrt_llm.quantization.formats import KV_CACHE_STORAGE, kv_cache_scale_from_amax, quantize_kv  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_timing import graph_seconds_per_call  # noqa: E402

CASES = {  # name: (batch, heads, kv_heads, head_dim, sequence length)
    "smollm2 b1 L150": (1, 9, 3, 64, 150),
    "llama-8b b1 L200": (1, 32, 8, 128, 200),
    "llama-8b b32 L200": (32, 32, 8, 128, 200),
    "llama-8b b1 L2100": (1, 32, 8, 128, 2100),
    "llama-8b b32 L2080": (32, 32, 8, 128, 2080),  # quantization's FP8 KV bar: batch 32, 2,048 tokens
    "llama-8b b40 L200": (40, 32, 8, 128, 200),     # 320 blocks: between two and three an SM (132 SMs)
    "llama-8b b40 L2080": (40, 32, 8, 128, 2080),
    "llama-8b b64 L200": (64, 32, 8, 128, 200),
    "llama-8b b64 L2080": (64, 32, 8, 128, 2080),
    "llama-8b b128 L2080": (128, 32, 8, 128, 2080),
    "llama-8b b256 L192": (256, 32, 8, 128, 192),   # in-flight batching's large decode batches
    "llama-8b b512 L192": (512, 32, 8, 128, 192),
}


def run(batch, heads, kv_heads, head_dim, length, tpb=32, dtype=torch.bfloat16, kv_algo=None, iters=200):
    dev = torch.device("cuda")
    max_blocks = -(-(length + 64) // tpb)
    num_blocks = batch * max_blocks
    cache = torch.randn(num_blocks, 2, kv_heads, tpb, head_dim, dtype=dtype, device=dev)
    kv_scale = None
    if kv_algo is not None:  # codes of the same values, under the scales of their maxima
        kv_scale = kv_cache_scale_from_amax(cache.float().abs().amax(dim=(0, 2, 3, 4)).cpu(), kv_algo).to(dev)
        cache = quantize_kv(cache, kv_scale.view(2, 1, 1, 1), kv_algo).view(KV_CACHE_STORAGE[kv_algo])
    tables = torch.randperm(num_blocks, device=dev).view(batch, max_blocks).to(torch.int32)
    lengths = torch.full((batch,), length, dtype=torch.int32, device=dev)
    q = torch.randn(batch, heads, head_dim, dtype=dtype, device=dev)
    k = torch.randn(batch, kv_heads, head_dim, dtype=dtype, device=dev)
    v = torch.randn_like(k)
    cos_sin = rope_cos_sin_cache(max_blocks * tpb, head_dim, 10000.0).to(dev)

    def call():
        return decode_attention_cuda(q, cache, tables, lengths, 0.1, None, 0, k, v, cos_sin, True, kv_scale)
    us = graph_seconds_per_call([call] * 20, repeats=iters // 20) * 1e6  # the kernel, not the Python call
    kv_bytes = 2 * batch * kv_heads * length * head_dim * cache.element_size()
    return us, kv_bytes / (us * 1e-6) / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kv_cache_dtype", default="bf16", help="comma-separated: bf16, fp8, int8")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names (default: all)")
    args = parser.parse_args()
    algos = {"bf16": None, "fp8": "FP8", "int8": "INT8"}
    kinds = args.kv_cache_dtype.split(",")
    names = args.cases.split(",")
    for kind in kinds:
        if kind not in algos:
            parser.error(f"--kv_cache_dtype: {kind!r} is not one of {', '.join(algos)}")
    for name in names:
        if name not in CASES:
            parser.error(f"--cases: {name!r} is not one of: {', '.join(CASES)}")
    print(f"{'case':<20} {'KV':>5} {'us/call':>8} {'K/V GB/s':>9}")
    for name in names:
        for kind in kinds:
            us, gbps = run(*CASES[name], kv_algo=algos[kind])
            print(f"{name:<20} {kind:>5} {us:>8.2f} {gbps:>9.0f}")


if __name__ == "__main__":
    main()
