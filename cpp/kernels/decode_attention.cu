// Paged decode attention: one new query token per sequence attends to its cached keys/values.
//
// Grid (kvHeads, batch, numSplits). A block owns one KV head of one sequence over one chunk of
// `splitSize` positions, and serves every query head of that KV head's group, so each K/V row
// is read from memory once per group (grouped-query attention). With several splits, each
// block writes a partial result (its max, its sum of exponentials and its normalised output)
// and a second kernel combines them; splits that start past a sequence's end write an empty
// partial. The number of splits is fixed by the caller (from the engine's max_seq_len), so a
// launch never depends on data on the device and can be captured in a CUDA graph.
//
// Cache layout [numBlocks, 2, kvHeads, tokensPerBlock, headDim]; position p of sequence b is in
// block blockTables[b, p / tpb], slot p % tpb. A block id outside [0, numBlocks) is treated as
// a masked position: nothing is read from it (or written to it).
//
// Fused form (kNew != nullptr): the block whose chunk holds the query's position first rotates
// (RoPE, when cosSin is given) and writes this step's K and V rows into the cache, then
// attends; every block rotates its query heads in shared memory. One launch replaces the
// rotation, the cache write and the attention.
#include "common.cuh"

#include <cfloat>

namespace tensorrt_llm {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;  // K/V rows a warp has in flight at once

// Rotates pairs of x[0 .. rotaryDim) in place (shared memory): NeoX pairs (j, j + r/2),
// GPT-J pairs (2j, 2j + 1), by the angles of row `pos` of cosSin. Threads take pairs.
__device__ __forceinline__ void rotate(float* x, int heads, int headDim, DecodeAttentionParams const& p, int pos) {
    int const half = p.rotaryDim / 2;
    float const* cs = p.cosSin + static_cast<int64_t>(pos) * p.rotaryDim;
    for (int i = threadIdx.x; i < heads * half; i += blockDim.x) {
        int const h = i / half;
        int const j = i - h * half;
        int const a = p.isNeox ? j : 2 * j;
        int const b = p.isNeox ? j + half : 2 * j + 1;
        float const c = cs[j];
        float const sn = cs[half + j];
        float const x1 = x[h * headDim + a];
        float const x2 = x[h * headDim + b];
        x[h * headDim + a] = x1 * c - x2 * sn;
        x[h * headDim + b] = x2 * c + x1 * sn;
    }
}

template <typename T, int EPL>
__device__ __forceinline__ void loadRow(T const* row, int lane, float (&dst)[EPL]) {
    Pack<T, EPL> p = *reinterpret_cast<Pack<T, EPL> const*>(row + lane * EPL);
#pragma unroll
    for (int e = 0; e < EPL; ++e) dst[e] = toFloat(p.v[e]);
}

// EPL: elements of a head per lane (headDim / 32). MAXG: the largest query-head group served.
template <typename T, int EPL, int MAXG>
__global__ void __launch_bounds__(kThreads) decodeAttentionKernel(DecodeAttentionParams p) {
    constexpr int D = EPL * 32;
    extern __shared__ float smem[];
    float* qS = smem;                         // [group][D], pre-scaled
    float* scoresS = qS + MAXG * D;           // [group][splitSize]
    float* reduceS = scoresS + MAXG * p.splitSize;  // [kWarps][group][D]

    int const kvh = blockIdx.x;
    int const b = blockIdx.y;
    int const split = blockIdx.z;
    int const group = static_cast<int>(p.numHeads / p.kvHeads);
    int const lane = threadIdx.x % 32;
    int const warp = threadIdx.x / 32;

    int const seqLen = p.sequenceLengths[b];
    int const first = p.slidingWindow > 0 ? max(0, seqLen - p.slidingWindow) : 0;
    int const begin = max(first, split * p.splitSize);
    int const end = min(seqLen, (split + 1) * p.splitSize);
    int const n = end - begin;
    int const qPos = seqLen - 1;

    bool const rotary = p.cosSin != nullptr && qPos < p.maxPositions;
    T const* q = static_cast<T const*>(p.q) + b * p.qTokenStride + kvh * group * D;
    for (int i = threadIdx.x; i < group * D; i += kThreads) qS[i] = toFloat(q[i]);
    __syncthreads();
    if (rotary) {
        rotate(qS, group, D, p, qPos);
        __syncthreads();
    }
    for (int i = threadIdx.x; i < group * D; i += kThreads) qS[i] *= p.scale;

    int64_t const headStride = p.tokensPerBlock * D;
    T* cacheOut = static_cast<T*>(p.kvCache);
    T const* cache = cacheOut;
    int32_t const* table = p.blockTables + b * p.maxBlocks;
    if (p.kNew != nullptr && qPos >= begin && qPos < end) {  // this block owns the new position
        float* kS = reduceS;  // free until the value pass
        T const* kIn = static_cast<T const*>(p.kNew) + b * p.kNewTokenStride + kvh * D;
        T const* vIn = static_cast<T const*>(p.vNew) + b * p.vNewTokenStride + kvh * D;
        for (int d = threadIdx.x; d < D; d += kThreads) kS[d] = toFloat(kIn[d]);
        __syncthreads();
        if (rotary) {
            rotate(kS, 1, D, p, qPos);
            __syncthreads();
        }
        int64_t const blockInSeq = qPos / p.tokensPerBlock;
        int64_t const block = blockInSeq < p.maxBlocks ? table[blockInSeq] : -1;
        if (block >= 0 && block < p.numBlocks) {
            int64_t const slot = qPos - blockInSeq * p.tokensPerBlock;
            T* kDst = cacheOut + ((block * 2 + 0) * p.kvHeads + kvh) * headStride + slot * D;
            T* vDst = cacheOut + ((block * 2 + 1) * p.kvHeads + kvh) * headStride + slot * D;
            for (int d = threadIdx.x; d < D; d += kThreads) {
                kDst[d] = fromFloat<T>(kS[d]);
                vDst[d] = vIn[d];
            }
        }
    }
    __syncthreads();  // q in shared memory, and the new row in the cache, for every thread
    auto rowOf = [&](int pos, int kv) -> T const* {
        int64_t const blockInSeq = pos / p.tokensPerBlock;
        if (blockInSeq >= p.maxBlocks) return nullptr;
        int64_t const block = table[blockInSeq];
        if (block < 0 || block >= p.numBlocks) return nullptr;
        return cache + ((block * 2 + kv) * p.kvHeads + kvh) * headStride + (pos - blockInSeq * p.tokensPerBlock) * D;
    };

    // Scores: warp w takes positions begin + w, begin + w + kWarps, ... kUnroll at a time.
    for (int j0 = warp * kUnroll; j0 < n; j0 += kWarps * kUnroll) {
        float k[kUnroll][EPL];
        bool valid[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            int const j = j0 + u;
            T const* row = j < n ? rowOf(begin + j, 0) : nullptr;
            valid[u] = row != nullptr;
            if (valid[u]) loadRow<T, EPL>(row, lane, k[u]);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            int const j = j0 + u;
            if (j >= n) break;
#pragma unroll
            for (int g = 0; g < MAXG; ++g) {
                if (g >= group) break;
                float s = 0.f;
                if (valid[u]) {
#pragma unroll
                    for (int e = 0; e < EPL; ++e) s += qS[g * D + lane * EPL + e] * k[u][e];
                }
                s = warpReduceSum(s);
                if (lane == 0) {
                    int const pos = begin + j;
                    float score = valid[u] ? s : -FLT_MAX;
                    if (p.alibiSlopes != nullptr && valid[u]) {
                        score += p.alibiSlopes[kvh * group + g] * static_cast<float>(pos - qPos);
                    }
                    scoresS[g * p.splitSize + j] = score;
                }
            }
        }
    }
    __syncthreads();

    // Softmax statistics of this chunk, one warp per query head.
    __shared__ float maxS[MAXG];
    __shared__ float sumS[MAXG];
    for (int g = warp; g < group; g += kWarps) {
        float m = -FLT_MAX;
        for (int j = lane; j < n; j += 32) m = fmaxf(m, scoresS[g * p.splitSize + j]);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float s = 0.f;
        for (int j = lane; j < n; j += 32) {
            float const e = __expf(scoresS[g * p.splitSize + j] - m);
            scoresS[g * p.splitSize + j] = e;
            s += e;
        }
        s = warpReduceSum(s);
        if (lane == 0) {
            maxS[g] = m;
            sumS[g] = s;
        }
    }
    __syncthreads();

    // Weighted sum of values: each warp a subset of positions, each lane EPL dims of every head.
    float acc[MAXG][EPL];
#pragma unroll
    for (int g = 0; g < MAXG; ++g)
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[g][e] = 0.f;
    for (int j0 = warp * kUnroll; j0 < n; j0 += kWarps * kUnroll) {
        float v[kUnroll][EPL];
        bool valid[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            int const j = j0 + u;
            T const* row = j < n ? rowOf(begin + j, 1) : nullptr;
            valid[u] = row != nullptr;
            if (valid[u]) loadRow<T, EPL>(row, lane, v[u]);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            if (!valid[u]) continue;
            int const j = j0 + u;
#pragma unroll
            for (int g = 0; g < MAXG; ++g) {
                if (g >= group) break;
                float const w = scoresS[g * p.splitSize + j];
#pragma unroll
                for (int e = 0; e < EPL; ++e) acc[g][e] += w * v[u][e];
            }
        }
    }
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        if (g >= group) break;
#pragma unroll
        for (int e = 0; e < EPL; ++e) reduceS[(warp * MAXG + g) * D + lane * EPL + e] = acc[g][e];
    }
    __syncthreads();

    for (int i = threadIdx.x; i < group * D; i += kThreads) {
        int const g = i / D;
        int const d = i - g * D;
        float o = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) o += reduceS[(w * MAXG + g) * D + d];
        int const h = kvh * group + g;
        bool const empty = n <= 0 || sumS[g] == 0.f;
        float const normalised = empty ? 0.f : o / sumS[g];
        if (p.numSplits == 1) {
            static_cast<T*>(p.out)[b * p.outTokenStride + h * D + d] = fromFloat<T>(normalised);
        } else {
            // workspace: [batch, numHeads, numSplits, D + 2] = output, then max and sum
            float* part = p.workspace + ((static_cast<int64_t>(b) * p.numHeads + h) * p.numSplits + split) * (D + 2);
            part[d] = normalised;
            if (d == 0) {
                part[D] = empty ? -FLT_MAX : maxS[g];
                part[D + 1] = empty ? 0.f : sumS[g];
            }
        }
    }
}

// Grid (numHeads, batch), headDim threads: merges the splits of one head.
template <typename T>
__global__ void combineSplitsKernel(DecodeAttentionParams p) {
    int const h = blockIdx.x;
    int const b = blockIdx.y;
    int const D = static_cast<int>(p.headDim);
    int const d = threadIdx.x;
    float const* parts = p.workspace + (static_cast<int64_t>(b) * p.numHeads + h) * p.numSplits * (D + 2);
    float m = -FLT_MAX;
    for (int s = 0; s < p.numSplits; ++s) m = fmaxf(m, parts[s * (D + 2) + D]);
    float num = 0.f;
    float den = 0.f;
    for (int s = 0; s < p.numSplits; ++s) {
        float const l = parts[s * (D + 2) + D + 1];
        if (l == 0.f) continue;
        float const w = __expf(parts[s * (D + 2) + D] - m) * l;
        num += w * parts[s * (D + 2) + d];
        den += w;
    }
    static_cast<T*>(p.out)[b * p.outTokenStride + h * D + d] = fromFloat<T>(den > 0.f ? num / den : 0.f);
}

template <typename T, int EPL>
void launchTyped(DecodeAttentionParams const& p, cudaStream_t stream) {
    constexpr int D = EPL * 32;
    constexpr int MAXG = kDecodeAttentionMaxGroup;
    size_t const smem = sizeof(float) * (MAXG * D + MAXG * p.splitSize + kWarps * MAXG * D);
    auto kernel = decodeAttentionKernel<T, EPL, MAXG>;
    if (smem > 48 * 1024) {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    }
    dim3 grid(static_cast<unsigned>(p.kvHeads), static_cast<unsigned>(p.batch), static_cast<unsigned>(p.numSplits));
    kernel<<<grid, kThreads, smem, stream>>>(p);
    checkLaunch("decode_attention");
    if (p.numSplits > 1) {
        dim3 grid2(static_cast<unsigned>(p.numHeads), static_cast<unsigned>(p.batch));
        combineSplitsKernel<T><<<grid2, D, 0, stream>>>(p);
        checkLaunch("decode_attention (combine)");
    }
}

} // namespace

bool decodeAttentionSupportsHeadDim(int64_t headDim) {
    return headDim == 64 || headDim == 128 || headDim == 256;
}

void launchDecodeAttention(DecodeAttentionParams const& p, void* stream) {
    if (p.batch == 0) return;
    auto s = static_cast<cudaStream_t>(stream);
    dispatchFloat(p.dtype, "decode_attention", [&](auto tag) {
        using T = decltype(tag);
        switch (p.headDim) {
            case 64: launchTyped<T, 2>(p, s); break;
            case 128: launchTyped<T, 4>(p, s); break;
            case 256: launchTyped<T, 8>(p, s); break;
            default:
                throw std::invalid_argument("decode_attention: head_dim " + std::to_string(p.headDim)
                                            + " is not supported (64, 128 or 256)");
        }
    });
}

} // namespace tensorrt_llm
