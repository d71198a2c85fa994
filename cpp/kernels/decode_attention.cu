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

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

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

// EPL: elements of a head per lane (headDim / 32). MAXG: the largest query-head group this
// instance serves (the launcher picks the smallest of 1, 2, 4, 8 that holds the group, so no
// work is spent on absent heads). U: K/V rows a warp has in flight at once.
//
// One pass with an online softmax: each warp walks its positions U at a time, loading the K and
// V rows of all U positions before using any (their block ids come from shared memory), so a
// warp waits for memory once per U rows; it keeps a running max, sum and weighted sum per query
// head, and the warps' partial results are merged in shared memory at the end.
template <typename T, int EPL, int MAXG, int U>
__global__ void __launch_bounds__(kThreads, EPL >= 8 ? 1 : 2) decodeAttentionKernel(DecodeAttentionParams p) {
    constexpr int D = EPL * 32;
    extern __shared__ float smem[];
    float* qS = smem;                                  // [MAXG][D], rotated and scaled
    float* accS = qS + MAXG * D;                       // [kWarps][MAXG][D]
    float* statS = accS + kWarps * MAXG * D;           // [kWarps][MAXG][2]: max, sum
    int* blockS = reinterpret_cast<int*>(statS + kWarps * MAXG * 2);  // [splitSize / tpb + 2]

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
    // tokensPerBlock is a power of two (checked by the binding): shifts, not 64-bit divisions,
    // which cost a software routine per position.
    int const tpb = static_cast<int>(p.tokensPerBlock);
    int const tpbShift = 31 - __clz(tpb);
    int const tpbMask = tpb - 1;
    int32_t const* table = p.blockTables + b * p.maxBlocks;

    // Stage q and the chunk's block ids (one memory round trip for both).
    bool const rotary = p.cosSin != nullptr && qPos < p.maxPositions;
    T const* q = static_cast<T const*>(p.q) + b * p.qTokenStride + kvh * group * D;
    for (int i = threadIdx.x; i < group * D; i += kThreads) qS[i] = toFloat(q[i]);
    int const firstBlock = n > 0 ? begin >> tpbShift : 0;
    int const numChunkBlocks = n > 0 ? ((end - 1) >> tpbShift) - firstBlock + 1 : 0;
    for (int i = threadIdx.x; i < numChunkBlocks; i += kThreads) {
        int64_t const blockInSeq = firstBlock + i;
        int64_t const block = blockInSeq < p.maxBlocks ? table[blockInSeq] : -1;
        blockS[i] = (block >= 0 && block < p.numBlocks) ? static_cast<int>(block) : -1;
    }
    __syncthreads();
    if (rotary) {
        rotate(qS, group, D, p, qPos);
        __syncthreads();
    }
    for (int i = threadIdx.x; i < group * D; i += kThreads) qS[i] *= p.scale;

    int64_t const headStride = tpb * D;
    T* cache = static_cast<T*>(p.kvCache);
    if (p.kNew != nullptr && qPos >= begin && qPos < end) {  // this block owns the new position
        float* kS = accS;  // free until the merge
        T const* kIn = static_cast<T const*>(p.kNew) + b * p.kNewTokenStride + kvh * D;
        T const* vIn = static_cast<T const*>(p.vNew) + b * p.vNewTokenStride + kvh * D;
        for (int d = threadIdx.x; d < D; d += kThreads) kS[d] = toFloat(kIn[d]);
        __syncthreads();
        if (rotary) {
            rotate(kS, 1, D, p, qPos);
            __syncthreads();
        }
        int const block = blockS[(qPos >> tpbShift) - firstBlock];
        if (block >= 0) {
            int64_t const slot = qPos & tpbMask;
            T* kDst = cache + ((block * 2LL + 0) * p.kvHeads + kvh) * headStride + slot * D;
            T* vDst = cache + ((block * 2LL + 1) * p.kvHeads + kvh) * headStride + slot * D;
            for (int d = threadIdx.x; d < D; d += kThreads) {
                kDst[d] = fromFloat<T>(kS[d]);
                vDst[d] = vIn[d];
            }
        }
    }
    __syncthreads();  // q ready, the new row in the cache, kS no longer needed

    // Each lane's slice of every query head, in registers for the whole walk.
    float qr[MAXG][EPL];
#pragma unroll
    for (int g = 0; g < MAXG; ++g)
#pragma unroll
        for (int e = 0; e < EPL; ++e) qr[g][e] = g < group ? qS[g * D + lane * EPL + e] : 0.f;

    float m[MAXG], l[MAXG], acc[MAXG][EPL];
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        m[g] = -FLT_MAX;
        l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[g][e] = 0.f;
    }
    for (int j0 = warp * U; j0 < n; j0 += kWarps * U) {
        float k[U][EPL], v[U][EPL];
        bool valid[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int const pos = begin + j0 + u;
            int const block = j0 + u < n ? blockS[(pos >> tpbShift) - firstBlock] : -1;
            valid[u] = block >= 0;
            if (valid[u]) {
                T const* kRow = cache + ((block * 2LL + 0) * p.kvHeads + kvh) * headStride + (pos & tpbMask) * D;
                loadRow<T, EPL>(kRow, lane, k[u]);
                loadRow<T, EPL>(kRow + p.kvHeads * headStride, lane, v[u]);
            }
        }
#pragma unroll
        for (int g = 0; g < MAXG; ++g) {
            if (g >= group) break;
            float s[U];
            float mNew = m[g];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                float dot = 0.f;
#pragma unroll
                for (int e = 0; e < EPL; ++e) dot += qr[g][e] * (valid[u] ? k[u][e] : 0.f);
                dot = warpReduceSum(dot);
                if (p.alibiSlopes != nullptr) {
                    dot += p.alibiSlopes[kvh * group + g] * static_cast<float>(begin + j0 + u - qPos);
                }
                s[u] = valid[u] ? dot : -FLT_MAX;
                mNew = fmaxf(mNew, s[u]);
            }
            if (mNew == -FLT_MAX) continue;  // nothing visible yet
            float const rescale = __expf(m[g] - mNew);
            l[g] *= rescale;
#pragma unroll
            for (int e = 0; e < EPL; ++e) acc[g][e] *= rescale;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (!valid[u]) continue;
                float const w = __expf(s[u] - mNew);
                l[g] += w;
#pragma unroll
                for (int e = 0; e < EPL; ++e) acc[g][e] += w * v[u][e];
            }
            m[g] = mNew;
        }
    }

    // Merge the warps: each wrote its max, sum and weighted sum per head.
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        if (g >= group) break;
#pragma unroll
        for (int e = 0; e < EPL; ++e) accS[(warp * MAXG + g) * D + lane * EPL + e] = acc[g][e];
        if (lane == 0) {
            statS[(warp * MAXG + g) * 2] = m[g];
            statS[(warp * MAXG + g) * 2 + 1] = l[g];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < group * D; i += kThreads) {
        int const g = i / D;
        int const d = i - g * D;
        float mAll = -FLT_MAX;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) mAll = fmaxf(mAll, statS[(w * MAXG + g) * 2]);
        float num = 0.f;
        float den = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            float const lw = statS[(w * MAXG + g) * 2 + 1];
            if (lw == 0.f) continue;
            float const c = __expf(statS[(w * MAXG + g) * 2] - mAll);
            num += c * accS[(w * MAXG + g) * D + d];
            den += c * lw;
        }
        int const h = kvh * group + g;
        float const normalised = den > 0.f ? num / den : 0.f;
        if (p.numSplits == 1) {
            static_cast<T*>(p.out)[b * p.outTokenStride + h * D + d] = fromFloat<T>(normalised);
        } else {
            // workspace: [batch, numHeads, numSplits, D + 2] = output, then max and sum
            float* part = p.workspace + ((static_cast<int64_t>(b) * p.numHeads + h) * p.numSplits + split) * (D + 2);
            part[d] = normalised;
            if (d == 0) {
                part[D] = den > 0.f ? mAll : -FLT_MAX;
                part[D + 1] = den;
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

template <typename T, int EPL, int MAXG>
void launchGrouped(DecodeAttentionParams const& p, cudaStream_t stream) {
    constexpr int D = EPL * 32;
    // K/V rows in flight per warp, few enough that two blocks fit on a multiprocessor (128
    // registers a thread): more warps hide more memory latency than a deeper unroll does.
    constexpr int U = EPL * MAXG >= 32 ? 2 : 4;
    int const chunkBlocks = static_cast<int>(p.splitSize / p.tokensPerBlock) + 2;
    size_t const smem = sizeof(float) * (MAXG * D + kWarps * MAXG * D + kWarps * MAXG * 2) + sizeof(int) * chunkBlocks;
    auto kernel = decodeAttentionKernel<T, EPL, MAXG, U>;
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

template <typename T, int EPL>
void launchTyped(DecodeAttentionParams const& p, cudaStream_t stream) {
    static_assert(kDecodeAttentionMaxGroup == 8, "instances below cover groups up to 8");
    int64_t const group = p.numHeads / p.kvHeads;
    if (group <= 1) {
        launchGrouped<T, EPL, 1>(p, stream);
    } else if (group <= 2) {
        launchGrouped<T, EPL, 2>(p, stream);
    } else if (group <= 4) {
        launchGrouped<T, EPL, 4>(p, stream);
    } else {
        launchGrouped<T, EPL, 8>(p, stream);
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
