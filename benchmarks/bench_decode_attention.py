"""The paged decode-attention kernel alone: microseconds per call and the K/V bytes it reads
per second, for the decode shapes of the benchmark models (fused write + RoPE, as the runtime
calls it).

    python benchmarks/bench_decode_attention.py
"""
from __future__ import annotations

import torch

from tensorrt_llm import kernels
from tensorrt_llm.functional import rope_cos_sin_cache

CASES = {  # name: (batch, heads, kv_heads, head_dim, sequence length)
    "smollm2 b1 L150": (1, 9, 3, 64, 150),
    "llama-8b b1 L200": (1, 32, 8, 128, 200),
    "llama-8b b32 L200": (32, 32, 8, 128, 200),
    "llama-8b b1 L2100": (1, 32, 8, 128, 2100),
    "llama-8b b256 L192": (256, 32, 8, 128, 192),   # in-flight batching's large decode batches
    "llama-8b b512 L192": (512, 32, 8, 128, 192),
}


def run(batch, heads, kv_heads, head_dim, length, tpb=32, dtype=torch.bfloat16, iters=200):
    dev = torch.device("cuda")
    max_blocks = -(-(length + 64) // tpb)
    num_blocks = batch * max_blocks
    cache = torch.randn(num_blocks, 2, kv_heads, tpb, head_dim, dtype=dtype, device=dev)
    tables = torch.randperm(num_blocks, device=dev).view(batch, max_blocks).to(torch.int32)
    lengths = torch.full((batch,), length, dtype=torch.int32, device=dev)
    q = torch.randn(batch, heads, head_dim, dtype=dtype, device=dev)
    k = torch.randn(batch, kv_heads, head_dim, dtype=dtype, device=dev)
    v = torch.randn_like(k)
    cos_sin = rope_cos_sin_cache(max_blocks * tpb, head_dim, 10000.0).to(dev)

    def call():
        return kernels.decode_attention(q, cache, tables, lengths, 0.1, None, 0, k, v, cos_sin, True)
    call()
    graph = torch.cuda.CUDAGraph()  # time the kernel, not the Python call
    with torch.cuda.graph(graph):
        for _ in range(20):
            call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters // 20):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1e3 / iters
    kv_bytes = 2 * batch * kv_heads * length * head_dim * cache.element_size()
    return us, kv_bytes / (us * 1e-6) / 1e9


def main():
    print(f"{'case':<20} {'us/call':>8} {'K/V GB/s':>9}")
    for name, shape in CASES.items():
        us, gbps = run(*shape)
        print(f"{name:<20} {us:>8.2f} {gbps:>9.0f}")


if __name__ == "__main__":
    main()
