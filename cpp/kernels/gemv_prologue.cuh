// The input row of a GEMV that computes it in front (GemvPrologue): x through RMSNorm (of
// x + residual) or SiLU-and-mul (x [2k]), each value rounded to T exactly as rms_norm.cu and
// activation.cu round it, so a fused GEMV gives those kernels' numbers: gemv.cu's rows of T in
// shared memory. (The FP8 GEMV computed its rows here too, until 2026-11-29: on its pipelined
// kernel that cost more than the norm's own kernel; weight_only_gemv.cuh says by how much.)
#pragma once

#include "activation.cuh"
#include "common.cuh"

namespace tensorrt_llm {

// Row r of the prologue PRO (kRmsNorm or kSiluAndMul) of a GEMV's parameters p (GemvParams: x,
// xRowStride, residual, residualRowStride, residualOut, normWeight, eps, k; k values a multiple of
// 16 bytes of T, rows on 16-byte boundaries): calls store(i, o) for every pack i of the row, o its
// kVec16<T> values of T. RMSNorm: s = x + residual rounded to T (block 0 writes it to residualOut's
// row r), the mean of the rounded s's squares in float32, then one rounding of s * inv * weight; s
// is kept in `scratch` (k values of T, shared memory) between the two passes, and each thread reads
// back only the packs it wrote, so store may write over them. p's fields are read where they are
// used (a kernel parameter: the constant bank), not held in registers across the row. Every thread
// of the block calls it (a block reduction); THREADS: the block size; B: packs a thread loads
// before it uses any (x is read from L2).
template <typename T, GemvPrologue PRO, int THREADS, int B, typename Params, typename Store>
__device__ __forceinline__ void prologueRow(Params const& p, int r, Pack<T, kVec16<T>>* scratch, Store store) {
    static_assert(PRO == GemvPrologue::kRmsNorm || PRO == GemvPrologue::kSiluAndMul, "a prologue");
    constexpr int V = kVec16<T>;
    using P = Pack<T, V>;
    int const k = static_cast<int>(p.k);
    int const vecs = k / V;
    T const* x = static_cast<T const*>(p.x) + r * p.xRowStride;
    auto load = [](T const* base, int i) {
        uint4 const raw = __ldg(reinterpret_cast<uint4 const*>(base) + i);
        return *reinterpret_cast<P const*>(&raw);
    };
    float inv = 0.f;
    if constexpr (PRO == GemvPrologue::kRmsNorm) {
        T const* residual = p.residual ? static_cast<T const*>(p.residual) + r * p.residualRowStride : nullptr;
        P* residualOut = p.residualOut != nullptr && blockIdx.x == 0
            ? reinterpret_cast<P*>(static_cast<T*>(p.residualOut) + static_cast<int64_t>(r) * k)
            : nullptr;
        float sumSq = 0.f;
        for (int i0 = threadIdx.x; i0 < vecs; i0 += B * THREADS) {
            P s[B], b[B];
#pragma unroll
            for (int j = 0; j < B; ++j) {
                int const i = i0 + j * THREADS;
                if (i < vecs) {
                    s[j] = load(x, i);
                    if (residual) b[j] = load(residual, i);
                }
            }
#pragma unroll
            for (int j = 0; j < B; ++j) {
                int const i = i0 + j * THREADS;
                if (i >= vecs) break;
                if (residual) {
#pragma unroll
                    for (int e = 0; e < V; ++e) s[j].v[e] = fromFloat<T>(toFloat(s[j].v[e]) + toFloat(b[j].v[e]));
                    if (residualOut) residualOut[i] = s[j];
                }
#pragma unroll
                for (int e = 0; e < V; ++e) sumSq += toFloat(s[j].v[e]) * toFloat(s[j].v[e]);
                scratch[i] = s[j];
            }
        }
        inv = rsqrtf(blockReduceSum(sumSq) / static_cast<float>(k) + p.eps);
    }
    for (int i0 = threadIdx.x; i0 < vecs; i0 += B * THREADS) {
        P a[B], b[B];  // RMSNorm: the norm's weight; SiLU-and-mul: gate, up
#pragma unroll
        for (int j = 0; j < B; ++j) {
            int const i = i0 + j * THREADS;
            if (i < vecs) {
                if constexpr (PRO == GemvPrologue::kRmsNorm) {
                    a[j] = load(static_cast<T const*>(p.normWeight), i);
                } else {
                    a[j] = load(x, i);
                    b[j] = load(x, vecs + i);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < B; ++j) {
            int const i = i0 + j * THREADS;
            if (i >= vecs) break;
            P o;
            if constexpr (PRO == GemvPrologue::kRmsNorm) {
                P const s = scratch[i];
#pragma unroll
                for (int e = 0; e < V; ++e) o.v[e] = fromFloat<T>(toFloat(s.v[e]) * inv * toFloat(a[j].v[e]));
            } else {
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    o.v[e] = fromFloat<T>(activate<Activation::kSilu>(toFloat(a[j].v[e])) * toFloat(b[j].v[e]));
                }
            }
            store(i, o);
        }
    }
}

} // namespace tensorrt_llm
