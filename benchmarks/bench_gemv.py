"""The linear layers of a small-batch decode step, alone: the fused GEMV (tensorrt_llm.kernels
gemv ops, the input's RMSNorm or SiLU-and-mul computed in the same launch) against what it
replaces (our RMSNorm / SiLU-and-mul kernel, then cuBLAS through F.linear) and against
F.linear alone. Microseconds per layer and the weight bytes read per second, as a fraction
of the device-to-device copy bandwidth measured in the same run.

Each timing replays a CUDA graph of consecutive calls (launch gaps as in the decode graph)
that cycle through enough copies of the weights to overflow the L2 cache, as a step's
layers do.

    python benchmarks/bench_gemv.py [--rows 1,2,4] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's package, installed or not

from tensorrt_llm import kernels  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_timing import copy_bandwidth, graph_seconds_per_call  # noqa: E402

# name: (n, k, prologue) per model, in decode-step order.
LAYERS = {
    "llama-8b": [("qkv", 6144, 4096, "add_rms_norm"), ("o", 4096, 4096, "none"),
                 ("gate_up", 28672, 4096, "add_rms_norm"), ("down", 4096, 14336, "silu_and_mul"),
                 ("lm_head", 128256, 4096, "rms_norm")],
    "smollm2-135m": [("qkv", 960, 576, "add_rms_norm"), ("o", 576, 576, "none"),
                     ("gate_up", 3072, 576, "add_rms_norm"), ("down", 576, 1536, "silu_and_mul"),
                     ("lm_head", 49152, 576, "rms_norm")],
}


def bench_layer(rows: int, n: int, k: int, prologue: str, dtype=torch.bfloat16) -> dict:
    dev = "cuda"
    weight_bytes = n * k * torch.tensor([], dtype=dtype).element_size()
    copies = max(2, -(-(512 << 20) // weight_bytes))  # more than the L2 cache holds
    weights = [torch.randn(n, k, dtype=dtype, device=dev) / k ** 0.5 for _ in range(copies)]
    x = torch.randn(rows, 2 * k if prologue == "silu_and_mul" else k, dtype=dtype, device=dev)
    residual = torch.randn(rows, k, dtype=dtype, device=dev)
    norm_w = torch.ones(k, dtype=dtype, device=dev)

    def fused(w):
        if prologue == "add_rms_norm":
            return lambda: kernels.rms_norm_gemv(x, norm_w, w, None, 1e-5, residual=residual)
        if prologue == "rms_norm":
            return lambda: kernels.rms_norm_gemv(x, norm_w, w, None, 1e-5)
        if prologue == "silu_and_mul":
            return lambda: kernels.silu_and_mul_gemv(x, w)
        return lambda: kernels.gemv(x, w)

    def unfused(w):
        if prologue == "add_rms_norm":
            return lambda: F.linear(kernels.rms_norm(x, norm_w, 1e-5, residual)[0], w)
        if prologue == "rms_norm":
            return lambda: F.linear(kernels.rms_norm(x, norm_w, 1e-5), w)
        if prologue == "silu_and_mul":
            return lambda: F.linear(kernels.silu_and_mul(x), w)
        return lambda: F.linear(x, w)

    x_plain = x[:, :k].contiguous()
    assert kernels.gemv_supported(x_plain, weights[0]), "the fused GEMV does not serve this shape"
    result = {"rows": rows, "n": n, "k": k, "prologue": prologue, "weight_bytes": weight_bytes}
    for name, make in (("fused_gemv", fused), ("ours_then_cublas", unfused),
                       ("cublas_alone", lambda w: (lambda: F.linear(x_plain, w)))):
        result[name + "_us"] = graph_seconds_per_call([make(w) for w in weights]) * 1e6
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4")
    parser.add_argument("--models", default=",".join(LAYERS))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    print(f"{'model':<13} {'layer':<8} {'rows':>4} {'fused us':>9} {'of bw':>6} {'norm+cuBLAS us':>15} "
          f"{'cuBLAS us':>10} {'of bw':>6}")
    results = []
    for model in args.models.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            for layer, n, k, prologue in LAYERS[model]:
                r = bench_layer(rows, n, k, prologue)
                r.update(model=model, layer=layer)
                results.append(r)
                frac = lambda us: r["weight_bytes"] / (us * 1e-6) / bandwidth  # noqa: E731
                print(f"{model:<13} {layer:<8} {rows:>4} {r['fused_gemv_us']:>9.2f} "
                      f"{frac(r['fused_gemv_us']):>6.1%} {r['ours_then_cublas_us']:>15.2f} "
                      f"{r['cublas_alone_us']:>10.2f} {frac(r['cublas_alone_us']):>6.1%}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_bandwidth": bandwidth, "device": torch.cuda.get_device_name(), "layers": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
