// Paged decode attention: one new query token per sequence attends to its cached keys/values.
//
// Grid (kvHeads, batch, numSplits). A block owns one KV head of one sequence over one chunk of
// its positions, and serves every query head of that KV head's group, so each K/V row is read
// from memory once per group (grouped-query attention). The chunks split the sequence's actual
// (visible) length evenly, at most splitSize positions each, so short and long sequences both
// use the whole grid. With several splits, each block writes a partial result (its max, its
// sum of exponentials and its normalised output), and the last block of the sequence's KV
// head to finish combines them; empty chunks write an empty partial. The grid is fixed by the
// caller (from the engine's max_seq_len), so a launch never depends on data on the device and
// can be captured in a CUDA graph.
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


// Rotates pairs of x[0 .. rotaryDim) in place (shared memory): NeoX pairs (j, j + r/2),
// GPT-J pairs (2j, 2j + 1), by the angles cs = [cos, sin] (shared memory). Threads take pairs.
__device__ __forceinline__ void rotate(float* x, int heads, int headDim, DecodeAttentionParams const& p,
                                       float const* cs) {
    int const half = p.rotaryDim / 2;
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

// How a warp reads K/V rows of D elements of T: each lane takes EPL consecutive elements (whole
// 16-byte packs, at least 16 bytes), LPR lanes cover a row, so a warp reads RPW rows at once
// and a dot product is reduced over LPR lanes only (e.g. bf16, D = 128: 16 lanes, 2 rows).
template <typename T, int D>
struct RowLayout {
    static constexpr int V = kVec16<T>;
    static constexpr int EPL = D / 32 > V ? D / 32 : V;
    static constexpr int LPR = D / EPL;
    static constexpr int RPW = 32 / LPR;
    static constexpr int PACKS = EPL / V;
};

template <typename T, int D>
struct RowSlice {  // a lane's EPL elements of one row, as loaded
    Pack<T, kVec16<T>> packs[RowLayout<T, D>::PACKS];
};

template <typename T, int D>
__device__ __forceinline__ void loadSlice(T const* rowStart, int sub, RowSlice<T, D>& dst) {
    using L = RowLayout<T, D>;
    auto const* src = reinterpret_cast<Pack<T, L::V> const*>(rowStart + sub * L::EPL);
#pragma unroll
    for (int i = 0; i < L::PACKS; ++i) dst.packs[i] = src[i];
}

template <typename T, int D>
__device__ __forceinline__ float sliceAt(RowSlice<T, D> const& s, int e) {
    constexpr int V = kVec16<T>;
    return toFloat(s.packs[e / V].v[e % V]);
}

// Sum over the LPR lanes that share a row (lanes aligned to LPR: xor offsets below LPR stay
// inside the group). Every lane of the warp calls it.
template <int LPR>
__device__ __forceinline__ float rowReduceSum(float v) {
#pragma unroll
    for (int offset = LPR / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// D: head size. MAXG: the largest query-head group this instance serves (the launcher picks
// the smallest of 1, 2, 4, 8 that holds the group, so no work is spent on absent heads). U:
// rows each lane group has in flight at once.
//
// One pass with an online softmax: each lane group (LPR lanes) walks its positions U at a
// time, loading the K and V rows of all U positions before using any (their block ids come
// from shared memory), so it waits for memory once per U rows; it keeps a running max, sum and
// weighted sum per query head, and the groups' partial results are merged in shared memory at
// the end. The positions a block covers are its share of the sequence's actual length (the
// visible part of it), so short sequences spread over all the blocks of the grid, whose size
// depends on shapes only.
// 512 threads per multiprocessor (128 registers a thread) where that compiles without spills:
// half-precision heads up to 128 with groups up to 4; 256 otherwise. THREADS: the block size
// (launchTyped chooses it).
template <typename T, int D, int MAXG, int THREADS>
constexpr int kMinBlocks = (MAXG * RowLayout<T, D>::EPL <= 32 && D <= 128 && sizeof(T) == 2 ? 2 : 1) * (256 / THREADS);

template <typename T, int D, int MAXG, int U, int THREADS>
__global__ void __launch_bounds__(THREADS, kMinBlocks<T, D, MAXG, THREADS>) decodeAttentionKernel(DecodeAttentionParams p) {
    using L = RowLayout<T, D>;
    constexpr int kThreads = THREADS;
    constexpr int kWarps = THREADS / 32;
    constexpr int kGroups = kWarps * L::RPW;            // lane groups in the block
    extern __shared__ float smem[];
    float* qS = smem;                                  // [MAXG][D], rotated and scaled
    float* kS = qS + MAXG * D;                         // [D]: this step's K row (owner block)
    float* vS = kS + D;                                // [D]: this step's V row (owner block)
    float* csS = vS + D;                               // [D]: cos, sin of the query's position
    float* accS = csS + D;                             // [kGroups][MAXG][D]
    float* statS = accS + kGroups * MAXG * D;          // [kGroups][MAXG][2]: max, sum
    int* blockS = reinterpret_cast<int*>(statS + kGroups * MAXG * 2);  // [splitSize / tpb + 2]

    int const kvh = blockIdx.x;
    int const b = blockIdx.y;
    int const split = blockIdx.z;
    int const group = static_cast<int>(p.numHeads / p.kvHeads);
    int const lane = threadIdx.x % 32;
    int const warp = threadIdx.x / 32;
    int const sub = lane % L::LPR;                     // which slice of a row this lane reads
    int const laneGroup = warp * L::RPW + lane / L::LPR;

    int const seqLen = p.sequenceLengths[b];
    int const first = p.slidingWindow > 0 ? max(0, seqLen - p.slidingWindow) : 0;
    int const chunk = min(p.splitSize, (max(0, seqLen - first) + p.numSplits - 1) / p.numSplits);
    int const begin = first + split * chunk;
    int const end = min(seqLen, begin + chunk);
    int const n = max(0, end - begin);
    int const qPos = seqLen - 1;
    // tokensPerBlock is a power of two (checked by the binding): shifts, not 64-bit divisions,
    // which cost a software routine per position.
    int const tpb = static_cast<int>(p.tokensPerBlock);
    int const tpbShift = 31 - __clz(tpb);
    int const tpbMask = tpb - 1;
    int32_t const* table = p.blockTables + b * p.maxBlocks;
    bool const rotary = p.cosSin != nullptr && qPos >= 0 && qPos < p.maxPositions;
    bool const owner = p.kNew != nullptr && qPos >= begin && qPos < end;  // writes the new position

    // Stage everything else the block reads once (q, the new K/V rows, the rotation angles,
    // the chunk's block ids) in one memory round trip.
    T const* q = static_cast<T const*>(p.q) + b * p.qTokenStride + kvh * group * D;
    for (int i = threadIdx.x; i < group * D; i += kThreads) qS[i] = toFloat(q[i]);
    if (owner) {
        T const* kIn = static_cast<T const*>(p.kNew) + b * p.kNewTokenStride + kvh * D;
        T const* vIn = static_cast<T const*>(p.vNew) + b * p.vNewTokenStride + kvh * D;
        for (int d = threadIdx.x; d < D; d += kThreads) {
            kS[d] = toFloat(kIn[d]);
            vS[d] = toFloat(vIn[d]);
        }
    }
    if (rotary) {
        float const* cs = p.cosSin + static_cast<int64_t>(qPos) * p.rotaryDim;
        for (int i = threadIdx.x; i < p.rotaryDim; i += kThreads) csS[i] = cs[i];
    }
    int const firstBlock = n > 0 ? begin >> tpbShift : 0;
    int const numChunkBlocks = n > 0 ? ((end - 1) >> tpbShift) - firstBlock + 1 : 0;
    for (int i = threadIdx.x; i < numChunkBlocks; i += kThreads) {
        int64_t const blockInSeq = firstBlock + i;
        int64_t const block = blockInSeq < p.maxBlocks ? table[blockInSeq] : -1;
        blockS[i] = (block >= 0 && block < p.numBlocks) ? static_cast<int>(block) : -1;
    }
    __syncthreads();
    if (rotary) {
        rotate(qS, group, D, p, csS);
        if (owner) rotate(kS, 1, D, p, csS);
        __syncthreads();
    }
    for (int i = threadIdx.x; i < group * D; i += kThreads) qS[i] *= p.scale;

    int64_t const headStride = tpb * D;
    T* cache = static_cast<T*>(p.kvCache);
    if (owner) {
        int const block = blockS[(qPos >> tpbShift) - firstBlock];
        if (block >= 0) {
            int64_t const slot = qPos & tpbMask;
            T* kDst = cache + ((block * 2LL + 0) * p.kvHeads + kvh) * headStride + slot * D;
            T* vDst = cache + ((block * 2LL + 1) * p.kvHeads + kvh) * headStride + slot * D;
            for (int d = threadIdx.x; d < D; d += kThreads) {
                kDst[d] = fromFloat<T>(kS[d]);
                vDst[d] = fromFloat<T>(vS[d]);
            }
        }
    }
    __syncthreads();  // q ready, the new row in the cache

    // This lane's slice of every query head, in registers for the whole walk.
    float qr[MAXG][L::EPL];
#pragma unroll
    for (int g = 0; g < MAXG; ++g)
#pragma unroll
        for (int e = 0; e < L::EPL; ++e) qr[g][e] = g < group ? qS[g * D + sub * L::EPL + e] : 0.f;

    float m[MAXG], l[MAXG], acc[MAXG][L::EPL];
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        m[g] = -FLT_MAX;
        l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < L::EPL; ++e) acc[g][e] = 0.f;
    }
    // Positions j0 + u * RPW + (lane / LPR) for u < U: a warp covers RPW * U consecutive ones.
    for (int j0 = warp * L::RPW * U; j0 < n; j0 += kWarps * L::RPW * U) {
        RowSlice<T, D> k[U], v[U];
        bool valid[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int const j = j0 + u * L::RPW + lane / L::LPR;
            int const pos = begin + j;
            int const block = j < n ? blockS[(pos >> tpbShift) - firstBlock] : -1;
            valid[u] = block >= 0;
            if (valid[u]) {
                T const* kRow = cache + ((block * 2LL + 0) * p.kvHeads + kvh) * headStride + (pos & tpbMask) * D;
                loadSlice<T, D>(kRow, sub, k[u]);
                loadSlice<T, D>(kRow + p.kvHeads * headStride, sub, v[u]);
            }
        }
        // Scores: each K element is converted once and used for every head of the group.
        float w[MAXG][U];
#pragma unroll
        for (int g = 0; g < MAXG; ++g)
#pragma unroll
            for (int u = 0; u < U; ++u) w[g][u] = 0.f;
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int e = 0; e < L::EPL; ++e) {
                float const kf = valid[u] ? sliceAt<T, D>(k[u], e) : 0.f;
#pragma unroll
                for (int g = 0; g < MAXG; ++g) w[g][u] += qr[g][e] * kf;
            }
        }
        // Online softmax per head: w becomes each row's weight under the running max.
#pragma unroll
        for (int g = 0; g < MAXG; ++g) {
            if (g >= group) break;
            float mNew = m[g];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                float dot = rowReduceSum<L::LPR>(w[g][u]);
                if (p.alibiSlopes != nullptr) {
                    int const pos = begin + j0 + u * L::RPW + lane / L::LPR;
                    dot += p.alibiSlopes[kvh * group + g] * static_cast<float>(pos - qPos);
                }
                w[g][u] = valid[u] ? dot : -FLT_MAX;
                mNew = fmaxf(mNew, w[g][u]);
            }
            if (mNew == -FLT_MAX) {  // nothing visible yet for this lane group
#pragma unroll
                for (int u = 0; u < U; ++u) w[g][u] = 0.f;
                continue;
            }
            float const rescale = __expf(m[g] - mNew);
            l[g] *= rescale;
#pragma unroll
            for (int e = 0; e < L::EPL; ++e) acc[g][e] *= rescale;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                w[g][u] = valid[u] ? __expf(w[g][u] - mNew) : 0.f;
                l[g] += w[g][u];
            }
            m[g] = mNew;
        }
        // Weighted values: each V element converted once, used for every head.
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (!valid[u]) continue;
#pragma unroll
            for (int e = 0; e < L::EPL; ++e) {
                float const vf = sliceAt<T, D>(v[u], e);
#pragma unroll
                for (int g = 0; g < MAXG; ++g) acc[g][e] += w[g][u] * vf;
            }
        }
    }

    // Merge the lane groups: each wrote its max, sum and weighted sum per head.
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        if (g >= group) break;
#pragma unroll
        for (int e = 0; e < L::EPL; ++e) accS[(laneGroup * MAXG + g) * D + sub * L::EPL + e] = acc[g][e];
        if (sub == 0) {
            statS[(laneGroup * MAXG + g) * 2] = m[g];
            statS[(laneGroup * MAXG + g) * 2 + 1] = l[g];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < group * D; i += kThreads) {
        int const g = i / D;
        int const d = i - g * D;
        float mAll = -FLT_MAX;
        for (int w = 0; w < kGroups; ++w) mAll = fmaxf(mAll, statS[(w * MAXG + g) * 2]);
        float num = 0.f;
        float den = 0.f;
        for (int w = 0; w < kGroups; ++w) {
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
    if (p.numSplits == 1) return;

    // The last block of this (sequence, KV head) to finish merges the splits' partials: no
    // second kernel. Counters are zero before a launch and left zero after it.
    __shared__ bool lastS;
    __threadfence();  // this block's partials are visible before its arrival is counted
    __syncthreads();
    if (threadIdx.x == 0) {
        int* counter = p.splitCounters + b * p.kvHeads + kvh;
        lastS = atomicAdd(counter, 1) == p.numSplits - 1;
        if (lastS) *counter = 0;
    }
    __syncthreads();
    if (!lastS) return;
    __threadfence();
    for (int i = threadIdx.x; i < group * D; i += kThreads) {
        int const g = i / D;
        int const d = i - g * D;
        int const h = kvh * group + g;
        // Read through L2 (__ldcg): other blocks wrote these.
        float const* parts = p.workspace + (static_cast<int64_t>(b) * p.numHeads + h) * p.numSplits * (D + 2);
        float mAll = -FLT_MAX;
        for (int sp = 0; sp < p.numSplits; ++sp) mAll = fmaxf(mAll, __ldcg(parts + sp * (D + 2) + D));
        float num = 0.f;
        float den = 0.f;
        for (int sp = 0; sp < p.numSplits; ++sp) {
            float const lsp = __ldcg(parts + sp * (D + 2) + D + 1);
            if (lsp == 0.f) continue;
            float const c = __expf(__ldcg(parts + sp * (D + 2) + D) - mAll) * lsp;
            num += c * __ldcg(parts + sp * (D + 2) + d);
            den += c;
        }
        static_cast<T*>(p.out)[b * p.outTokenStride + h * D + d] = fromFloat<T>(den > 0.f ? num / den : 0.f);
    }
}

template <typename T, int D, int MAXG, int THREADS>
void launchGrouped(DecodeAttentionParams const& p, cudaStream_t stream) {
    using L = RowLayout<T, D>;
    constexpr int kWarps = THREADS / 32;
    constexpr int kGroups = kWarps * L::RPW;
    // Rows in flight per lane group, few enough that the registers (q, accumulators and the
    // loaded rows) fit without spilling.
    constexpr int U = MAXG * L::EPL >= 32 ? 2 : 4;
    int const chunkBlocks = static_cast<int>(p.splitSize / p.tokensPerBlock) + 2;
    size_t const smem = sizeof(float) * (MAXG * D + 3 * D + kGroups * MAXG * D + kGroups * MAXG * 2)
                        + sizeof(int) * chunkBlocks;
    auto kernel = decodeAttentionKernel<T, D, MAXG, U, THREADS>;
    if (smem > 48 * 1024) {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    }
    dim3 grid(static_cast<unsigned>(p.kvHeads), static_cast<unsigned>(p.batch), static_cast<unsigned>(p.numSplits));
    kernel<<<grid, THREADS, smem, stream>>>(p);
    checkLaunch("decode_attention");
}

template <typename T, int D, int THREADS>
void launchSized(DecodeAttentionParams const& p, cudaStream_t stream) {
    static_assert(kDecodeAttentionMaxGroup == 8, "instances below cover groups up to 8");
    int64_t const group = p.numHeads / p.kvHeads;
    if (group <= 1) {
        launchGrouped<T, D, 1, THREADS>(p, stream);
    } else if (group <= 2) {
        launchGrouped<T, D, 2, THREADS>(p, stream);
    } else if (group <= 4) {
        launchGrouped<T, D, 4, THREADS>(p, stream);
    } else {
        launchGrouped<T, D, 8, THREADS>(p, stream);
    }
}

int multiprocessors() {
    int device = 0;
    cudaGetDevice(&device);
    static int counts[64] = {};  // per device, read once (launches are captured in CUDA graphs)
    if (device >= 64) return 132;
    if (counts[device] == 0) cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device);
    return counts[device];
}

// Block size: 256 threads share one chunk of a sequence when there are few blocks (long
// sequences, small batches: the caller's splits fill the GPU); with several waves of blocks
// (large decode batches of short sequences) 64-thread blocks spend less of each block on its
// fixed part (staging, merging 4 lane groups instead of 16) and overlap one another's fixed
// parts. Measured on an H100 (benchmarks/bench_decode_attention.py, 8B shape, 192 positions):
// batch 512 264.7 us vs 331.2 us, batch 256 135.4 vs 169.4; batch 32 (256 blocks) 20.2 us at
// 256 threads vs 44.4 at 64.
template <typename T, int D>
void launchTyped(DecodeAttentionParams const& p, cudaStream_t stream) {
    int64_t const blocks = p.batch * p.kvHeads * p.numSplits;
    if (blocks >= 8LL * multiprocessors()) {
        launchSized<T, D, 64>(p, stream);
    } else {
        launchSized<T, D, 256>(p, stream);
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
            case 64: launchTyped<T, 64>(p, s); break;
            case 128: launchTyped<T, 128>(p, s); break;
            case 256: launchTyped<T, 256>(p, s); break;
            default:
                throw std::invalid_argument("decode_attention: head_dim " + std::to_string(p.headDim)
                                            + " is not supported (64, 128 or 256)");
        }
    });
}

} // namespace tensorrt_llm
