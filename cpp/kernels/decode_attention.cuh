#pragma once
// Paged decode attention: one new query token per sequence attends to its cached keys/values.
//
// Grid (kvHeads, batch, numSplits). A block owns one KV head of one sequence over one chunk of
// its positions, and serves every query head of that KV head's group, so each K/V row is read
// from memory once per group (grouped-query attention). The grid's numSplits is the most splits
// a sequence may use (fixed by the caller from the engine's max_seq_len and the batch, so a
// launch never depends on data on the device and can be captured in a CUDA graph); each
// sequence uses as many of them as its actual (visible) length is worth (splitsFor) and splits
// that length evenly, the other blocks return at once. With several splits, each block writes
// a partial result (its max, its sum of exponentials and its normalised output), and the last
// block of the sequence's KV head to finish combines them; empty chunks write an empty partial. Two kernels walk the positions and share the rest (the
// staging, the merges): a tensor-core one for half-precision heads of 64 or 128 on sm_80+, and
// a CUDA-core one for float32 and head size 256.
//
// Cache layout [numBlocks, 2, kvHeads, tokensPerBlock, headDim]; position p of sequence b is in
// block blockTables[b, p / tpb], slot p % tpb. A block id outside [0, numBlocks) is treated as
// a masked position: nothing is read from it (or written to it).
//
// Fused form (kNew != nullptr): the block whose chunk holds the query's position first rotates
// (RoPE, when cosSin is given) and writes this step's K and V rows into the cache, then
// attends; every block rotates its query heads in shared memory. One launch replaces the
// rotation, the cache write and the attention.
//
// Early cache loads (p.earlyCacheLoads, the fused form over a cache of T, tensor-core kernel of
// one block id a tile): the caller promises that every cached position before each query was
// written before this launch's stream work began (DecodeGraphs: one decode step a graph). A block
// then stages its block ids and issues its warps' first tiles of K/V before waitForPreviousKernel,
// under the previous kernel's tail, and after the owner's write replaces this step's row (loaded
// stale) in the registers of the lanes that hold it with the values the write stored.
//
// Quantized cache (cacheDtype kUInt8 / kInt8: FP8 E4M3 / INT8 codes, kv_codes.cuh), tensor-core
// kernel only: the fused write stores this step's rows as codes; the walk loads 16 codes per
// 16-byte load and turns them into half2 MMA operands in registers (a few logic ops per pair,
// exact), so the MMAs run in float16 whatever the activations' type. The K scale is folded once
// into the score scale, the V scale once into the output: no per-element multiply.
#include "kv_codes.cuh"

#include <cfloat>
#include <type_traits>

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

// Eight values of shared memory (float) rounded to T, as one 16-byte pack (T of 2 bytes).
template <typename T>
__device__ __forceinline__ uint4 packOf(float const* v) {
    static_assert(sizeof(T) == 2, "a pack of 8");
    Pack<T, 8> out;
#pragma unroll
    for (int e = 0; e < 8; ++e) out.v[e] = fromFloat<T>(v[e]);
    return *reinterpret_cast<uint4 const*>(&out);
}

// Sum over the LPR lanes that share a row (lanes aligned to LPR: xor offsets below LPR stay
// inside the group). Every lane of the warp calls it.
template <int LPR>
__device__ __forceinline__ float rowReduceSum(float v) {
#pragma unroll
    for (int offset = LPR / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// ---- the parts both kernels share: a block's chunk, its staging, its merge --------------

// The positions [begin, end) of sequence b that the block of split `split` covers: its share
// of the sequence's actual (visible) length, so short sequences spread over all the blocks
// of the grid, whose size depends on shapes only.
struct Chunk {
    int splits;  // the splits this sequence uses (<= numSplits); blocks of later splits have no work
    int begin, end, n, qPos;
    int tpbShift, tpbMask;  // tokensPerBlock is a power of two (checked by the binding): shifts,
                            // not 64-bit divisions, which cost a software routine per position
    int firstBlock, numBlocks;  // the cache blocks the chunk touches, in block-table order
    bool rotary, owner;         // owner: writes this step's K/V row (its position is inside)
};

// Splits worth their cost for `visible` positions. Measured on an H100 (batch 1, 8 KV heads,
// head 128: a block's fixed cost ~5 us, a merge ~5.6 us plus ~1 us per split, ~0.018 us per
// position a block walks): one block up to 768 positions (a second split costs more than it
// saves: 8.7 vs 13.3 us at 200 positions), then a split per 384 (2,100 positions: 6 splits, 22-23
// us, against 30 at 17 and 44 at 1). Never fewer than the chunk cap (splitSize) needs.
__device__ __forceinline__ int splitsFor(DecodeAttentionParams const& p, int visible) {
    int const worth = visible <= 768 ? 1 : (visible + 383) / 384;
    int const needed = (visible + p.splitSize - 1) / p.splitSize;
    return max(1, min(static_cast<int>(p.numSplits), max(worth, needed)));
}

__device__ __forceinline__ Chunk chunkOf(DecodeAttentionParams const& p, int b, int split) {
    Chunk c;
    int const seqLen = p.sequenceLengths[b];
    int const first = p.slidingWindow > 0 ? max(0, seqLen - p.slidingWindow) : 0;
    int const visible = max(0, seqLen - first);
    c.splits = splitsFor(p, visible);
    int const size = min(p.splitSize, (visible + c.splits - 1) / c.splits);
    c.begin = first + split * size;
    c.end = min(seqLen, c.begin + size);
    c.n = max(0, c.end - c.begin);
    c.qPos = seqLen - 1;
    int const tpb = static_cast<int>(p.tokensPerBlock);
    c.tpbShift = 31 - __clz(tpb);
    c.tpbMask = tpb - 1;
    c.firstBlock = c.n > 0 ? c.begin >> c.tpbShift : 0;
    c.numBlocks = c.n > 0 ? ((c.end - 1) >> c.tpbShift) - c.firstBlock + 1 : 0;
    c.rotary = p.cosSin != nullptr && c.qPos >= 0 && c.qPos < p.maxPositions;
    c.owner = p.kNew != nullptr && c.qPos >= c.begin && c.qPos < c.end;
    return c;
}

// The cache block of chunk position j (0 <= j < n), -1 when masked.
__device__ __forceinline__ int blockOf(Chunk const& c, int const* blockS, int j) {
    return blockS[((c.begin + j) >> c.tpbShift) - c.firstBlock];
}

// The K row of `pos` in cache block `block` (its V row is kvHeads * tpb * D further on); T: the
// cache's element type.
template <typename T, int D>
__device__ __forceinline__ T const* kRowOf(DecodeAttentionParams const& p, Chunk const& c, int block, int kvh,
                                           int pos) {
    int64_t const headStride = p.tokensPerBlock * D;
    return static_cast<T const*>(p.kvCache) + ((block * 2LL) * p.kvHeads + kvh) * headStride
           + static_cast<int64_t>(pos & c.tpbMask) * D;
}

// Shared memory of a block, in this order: q [MAXG][D], k, v, cs [D] each, acc [parts][MAXG][D],
// stat [parts][MAXG][2], then the chunk's block ids.
template <int D, int MAXG>
size_t sharedBytes(DecodeAttentionParams const& p, int parts) {
    int const chunkBlocks = static_cast<int>(p.splitSize / p.tokensPerBlock) + 2;
    return sizeof(float) * (MAXG * D + 3 * D + parts * MAXG * D + parts * MAXG * 2) + sizeof(int) * chunkBlocks;
}

struct Shared {
    float* q;
    float* k;
    float* v;
    float* cs;
    float* acc;
    float* stat;
    int* blocks;
};

template <int D, int MAXG>
__device__ __forceinline__ Shared carveShared(float* smem, int parts) {
    Shared sh;
    sh.q = smem;
    sh.k = sh.q + MAXG * D;
    sh.v = sh.k + D;
    sh.cs = sh.v + D;
    sh.acc = sh.cs + D;
    sh.stat = sh.acc + parts * MAXG * D;
    sh.blocks = reinterpret_cast<int*>(sh.stat + parts * MAXG * 2);
    return sh;
}

// Stages what the block reads once (the group's query heads, rotated, into sh.q [group][D] as
// float; the chunk's block ids into sh.blocks) in one memory round trip: every thread issues
// all of its loads (16-byte packs where the rows are aligned) before it stores any, since a
// store of a loaded value waits for that load and would turn each further load into another
// round trip. In the fused form, the owner block then rotates and writes this step's K/V rows
// into the cache. Ends synchronised. THREADS: the block size.
// The chunk's block ids into sh.blocks, then a block barrier (stageBlock's part, on its own for a
// kernel that reads the cache before waitForPreviousKernel: the block tables are the step's input).
template <int THREADS>
__device__ void stageBlockIds(DecodeAttentionParams const& p, Chunk const& c, int b, Shared const& sh) {
    int32_t const* table = p.blockTables + b * p.maxBlocks;
    for (int i = threadIdx.x; i < c.numBlocks; i += THREADS) {
        int64_t const blockInSeq = c.firstBlock + i;
        int64_t const block = blockInSeq < p.maxBlocks ? table[blockInSeq] : -1;
        sh.blocks[i] = (block >= 0 && block < p.numBlocks) ? static_cast<int>(block) : -1;
    }
    __syncthreads();
}

// stageBlock's form for rows of 8-element packs (float16 / bfloat16 q and K/V of a cache of T) that
// are rotated NeoX-wise over the whole head or not at all: a thread loads a q (or new K) pack and
// its rotation partner D/2 further on, or a new V pack, with their cos and sin, rotates them in
// registers, stores them to shared memory and (owner) writes them into the cache itself, in 16-byte
// stores. One block barrier ends it where the general form takes three (staged, rotated, written).
// The same values as the general form: the same products, sums and roundings.
template <typename T, typename C, int D, int THREADS, bool IDS_STAGED>
__device__ void stageRotatedPacks(DecodeAttentionParams const& p, Chunk const& c, int b, int kvh, int group,
                                  Shared const& sh, T const* q, T const* kIn, T const* vIn) {
    constexpr int H = D / 16;  // packs of 8 in half a row
    static_assert(THREADS >= (kDecodeAttentionMaxGroup + 3) * H, "a thread a pack pair (q, K) or pack (V)");
    using P = Pack<T, 8>;
    int const i = static_cast<int>(threadIdx.x);
    int const qItems = group * H;
    int const kEnd = qItems + (c.owner ? H : 0);
    int const vEnd = kEnd + (c.owner ? 2 * H : 0);
    int const kind = i < qItems ? 0 : i < kEnd ? 1 : i < vEnd ? 2 : 3;  // q pair, K pair, V pack, none
    int const item = kind == 0 ? i : kind == 1 ? i - qItems : i - kEnd;
    int const j = (kind == 0 ? item % H : item) * 8;  // the pack's first dim in its row (pairs: low half)
    T const* src = kind == 0 ? q + (item / H) * D + j : kind == 1 ? kIn + j : vIn + j;
    int32_t const* table = p.blockTables + b * p.maxBlocks;
    auto blockId = [&](int64_t block) { return (block >= 0 && block < p.numBlocks) ? static_cast<int>(block) : -1; };
    // Every load first, then the stores (see stageBlock).
    P x1, x2;
    float4 cosSin[4];  // cos of dims j .. j + 7, then their sin
    int64_t ownBlock = -1;
    int64_t firstId = -1;
    if (kind < 3) x1 = *reinterpret_cast<P const*>(src);
    if (kind < 2) x2 = *reinterpret_cast<P const*>(src + D / 2);
    if (kind < 2 && c.rotary) {
        float4 const* row = reinterpret_cast<float4 const*>(p.cosSin + static_cast<int64_t>(c.qPos) * p.rotaryDim);
        cosSin[0] = row[j / 4];
        cosSin[1] = row[j / 4 + 1];
        cosSin[2] = row[(D / 2 + j) / 4];
        cosSin[3] = row[(D / 2 + j) / 4 + 1];
    }
    if (!IDS_STAGED && (kind == 1 || kind == 2)) {
        int64_t const blockInSeq = c.qPos >> c.tpbShift;
        ownBlock = blockInSeq < p.maxBlocks ? table[blockInSeq] : -1;
    }
    if (!IDS_STAGED && i < c.numBlocks) firstId = c.firstBlock + i < p.maxBlocks ? table[c.firstBlock + i] : -1;
    int const block = IDS_STAGED ? ((kind == 1 || kind == 2) ? sh.blocks[(c.qPos >> c.tpbShift) - c.firstBlock] : -1)
                                 : blockId(ownBlock);
    C* kDst = (kind == 1 || kind == 2) && block >= 0 ? const_cast<C*>(kRowOf<C, D>(p, c, block, kvh, c.qPos)) : nullptr;
    if (kind < 2) {
        float const* cs = reinterpret_cast<float const*>(cosSin);
        float lo[8], hi[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            float const x1e = toFloat(x1.v[e]);
            float const x2e = toFloat(x2.v[e]);
            lo[e] = c.rotary ? x1e * cs[e] - x2e * cs[8 + e] : x1e;
            hi[e] = c.rotary ? x2e * cs[e] + x1e * cs[8 + e] : x2e;
        }
        float* dst = kind == 0 ? sh.q + (item / H) * D + j : sh.k + j;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            dst[e] = lo[e];
            dst[D / 2 + e] = hi[e];
        }
        if (kDst != nullptr) {
            P a, bb;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                a.v[e] = fromFloat<T>(lo[e]);
                bb.v[e] = fromFloat<T>(hi[e]);
            }
            *reinterpret_cast<P*>(kDst + j) = a;
            *reinterpret_cast<P*>(kDst + D / 2 + j) = bb;
        }
    } else if (kind == 2) {
#pragma unroll
        for (int e = 0; e < 8; ++e) sh.v[j + e] = toFloat(x1.v[e]);
        if (kDst != nullptr) *reinterpret_cast<P*>(kDst + p.kvHeads * p.tokensPerBlock * D + j) = x1;
    }
    if constexpr (!IDS_STAGED) {
        if (i < c.numBlocks) sh.blocks[i] = blockId(firstId);
        for (int n = i + THREADS; n < c.numBlocks; n += THREADS) {  // chunks of many blocks
            int64_t const blockInSeq = c.firstBlock + n;
            sh.blocks[n] = blockId(blockInSeq < p.maxBlocks ? table[blockInSeq] : -1);
        }
    }
    __syncthreads();  // q ready, the new row in the cache
}

// IDS_STAGED: sh.blocks holds the chunk's block ids already (stageBlockIds).
template <typename T, typename C, int D, int THREADS, bool IDS_STAGED = false>
__device__ void stageBlock(DecodeAttentionParams const& p, Chunk const& c, int b, int kvh, int group,
                           Shared const& sh) {
    constexpr int V = kVec16<T>;
    using P = Pack<T, V>;
    constexpr int kQ = (kDecodeAttentionMaxGroup * D / V + THREADS - 1) / THREADS;  // q packs a thread loads
    constexpr int kRow = (D / V + THREADS - 1) / THREADS;                           // new K (V) row packs
    constexpr int kCs = (D / 2 + THREADS - 1) / THREADS;                            // cos/sin pairs
    T const* q = static_cast<T const*>(p.q) + b * p.qTokenStride + kvh * group * D;
    T const* kIn = c.owner ? static_cast<T const*>(p.kNew) + b * p.kNewTokenStride + kvh * D : nullptr;
    T const* vIn = c.owner ? static_cast<T const*>(p.vNew) + b * p.vNewTokenStride + kvh * D : nullptr;
    auto isAligned = [](T const* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
    bool const packed = isAligned(q) && (!c.owner || (isAligned(kIn) && isAligned(vIn)));
    if constexpr (!kIsKvCode<C> && V == 8 && (D == 64 || D == 128) && THREADS >= (kDecodeAttentionMaxGroup + 3) * D / 16) {
        if (packed && (!c.rotary || (p.isNeox && p.rotaryDim == D
                                     && (reinterpret_cast<uintptr_t>(p.cosSin) & 15u) == 0))) {
            stageRotatedPacks<T, C, D, THREADS, IDS_STAGED>(p, c, b, kvh, group, sh, q, kIn, vIn);
            return;
        }
    }

    int32_t const* table = p.blockTables + b * p.maxBlocks;
    int const i0 = c.firstBlock + static_cast<int>(threadIdx.x);
    int64_t const firstId =
        !IDS_STAGED && c.numBlocks > static_cast<int>(threadIdx.x) && i0 < p.maxBlocks ? table[i0] : -1;
    float2 const* cs = c.rotary ? reinterpret_cast<float2 const*>(p.cosSin + static_cast<int64_t>(c.qPos) * p.rotaryDim)
                                : nullptr;
    float2 csv[kCs];
#pragma unroll
    for (int u = 0; u < kCs; ++u) {
        int const i = threadIdx.x + u * THREADS;
        if (cs != nullptr && i < p.rotaryDim / 2) csv[u] = cs[i];
    }
    if (packed) {
        P qv[kQ], kv[kRow], vv[kRow];
#pragma unroll
        for (int u = 0; u < kQ; ++u) {
            int const i = threadIdx.x + u * THREADS;
            if (i < group * D / V) qv[u] = reinterpret_cast<P const*>(q)[i];
        }
#pragma unroll
        for (int u = 0; u < kRow; ++u) {
            int const i = threadIdx.x + u * THREADS;
            if (c.owner && i < D / V) {
                kv[u] = reinterpret_cast<P const*>(kIn)[i];
                vv[u] = reinterpret_cast<P const*>(vIn)[i];
            }
        }
#pragma unroll
        for (int u = 0; u < kQ; ++u) {
            int const i = threadIdx.x + u * THREADS;
            if (i < group * D / V) {
#pragma unroll
                for (int e = 0; e < V; ++e) sh.q[i * V + e] = toFloat(qv[u].v[e]);
            }
        }
#pragma unroll
        for (int u = 0; u < kRow; ++u) {
            int const i = threadIdx.x + u * THREADS;
            if (c.owner && i < D / V) {
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    sh.k[i * V + e] = toFloat(kv[u].v[e]);
                    sh.v[i * V + e] = toFloat(vv[u].v[e]);
                }
            }
        }
    } else {  // unaligned rows (a strided view): element by element
        for (int i = threadIdx.x; i < group * D; i += THREADS) sh.q[i] = toFloat(q[i]);
        if (c.owner) {
            for (int d = threadIdx.x; d < D; d += THREADS) {
                sh.k[d] = toFloat(kIn[d]);
                sh.v[d] = toFloat(vIn[d]);
            }
        }
    }
#pragma unroll
    for (int u = 0; u < kCs; ++u) {
        int const i = threadIdx.x + u * THREADS;
        if (cs != nullptr && i < p.rotaryDim / 2) {
            sh.cs[2 * i] = csv[u].x;
            sh.cs[2 * i + 1] = csv[u].y;
        }
    }
    auto blockId = [&](int64_t block) { return (block >= 0 && block < p.numBlocks) ? static_cast<int>(block) : -1; };
    if constexpr (!IDS_STAGED) {
        if (static_cast<int>(threadIdx.x) < c.numBlocks) sh.blocks[threadIdx.x] = blockId(firstId);
        for (int i = threadIdx.x + THREADS; i < c.numBlocks; i += THREADS) {  // chunks of many blocks
            int64_t const blockInSeq = c.firstBlock + i;
            sh.blocks[i] = blockId(blockInSeq < p.maxBlocks ? table[blockInSeq] : -1);
        }
    }
    __syncthreads();
    if (c.rotary) {
        rotate(sh.q, group, D, p, sh.cs);
        if (c.owner) rotate(sh.k, 1, D, p, sh.cs);
        __syncthreads();
    }
    if (c.owner) {
        int const block = sh.blocks[(c.qPos >> c.tpbShift) - c.firstBlock];
        if (block >= 0) {
            C* kDst = const_cast<C*>(kRowOf<C, D>(p, c, block, kvh, c.qPos));
            C* vDst = kDst + p.kvHeads * p.tokensPerBlock * D;
            for (int d = threadIdx.x; d < D; d += THREADS) {
                if constexpr (kIsKvCode<C>) {  // codes of the rows in T, as the unfused path writes them
                    kDst[d] = encodeKv<C>(toFloat(fromFloat<T>(sh.k[d])), p.kvScale[0]);
                    vDst[d] = encodeKv<C>(toFloat(fromFloat<T>(sh.v[d])), p.kvScale[1]);
                } else {
                    kDst[d] = fromFloat<T>(sh.k[d]);
                    vDst[d] = fromFloat<T>(sh.v[d]);
                }
            }
        }
    }
    __syncthreads();  // q ready, the new row in the cache
}

// Output element i of value v: rounded to T, or (codeScale given) the E4M3 code of that rounded
// value for the FP8 linear that reads it, as fp8_quantize would write it.
template <typename T>
__device__ __forceinline__ void storeOutput(DecodeAttentionParams const& p, int64_t i, float v, float inverse) {
    T const rounded = fromFloat<T>(v);
    if (p.codeScale) {
        static_cast<uint8_t*>(p.out)[i] = fp8Code(toFloat(rounded), inverse);
    } else {
        static_cast<T*>(p.out)[i] = rounded;
    }
}

// Merges the block's `parts` partial results per query head (part w: running max statS[w][g][0]
// in natural-log units, sum of exponentials statS[w][g][1], weighted sum accS[w][g][:]) and
// stores the head's output; with several splits, the split's partial instead, and the last
// block of this (sequence, KV head) to finish merges the splits' partials: no second kernel.
// The caller has written accS/statS (statS's maxima are overwritten with the parts' weights); every
// thread of the block calls this.
template <typename T, int D, int MAXG>
__device__ void mergeAndStore(DecodeAttentionParams const& p, float const* accS, float* statS, int parts,
                              int b, int kvh, int split, int splits, int group) {
    __syncthreads();
    float const inverse = p.codeScale ? __frcp_rn(*p.codeScale) : 1.f;
    // Each head's part weights c_w = exp(m_w - max) and denominator sum_w c_w l_w, once (a thread a
    // head, in place of its parts' maxima) rather than by every thread of its D outputs: the same
    // values, summed in the same order, so the same bits. A part of no positions gets -1: skipped.
    __shared__ float headS[MAXG][2];  // max, denominator
    if (threadIdx.x < group) {
        int const g = threadIdx.x;
        float mAll = -FLT_MAX;
        for (int w = 0; w < parts; ++w) mAll = fmaxf(mAll, statS[(w * MAXG + g) * 2]);
        float den = 0.f;
        for (int w = 0; w < parts; ++w) {
            float const lw = statS[(w * MAXG + g) * 2 + 1];
            float c = -1.f;
            if (lw != 0.f) {
                c = __expf(statS[(w * MAXG + g) * 2] - mAll);
                den += c * lw;
            }
            statS[(w * MAXG + g) * 2] = c;
        }
        headS[g][0] = mAll;
        headS[g][1] = den;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
        int const g = i / D;
        int const d = i - g * D;
        float const mAll = headS[g][0];
        float const den = headS[g][1];
        float num = 0.f;
        for (int w = 0; w < parts; ++w) {
            float const c = statS[(w * MAXG + g) * 2];
            if (c >= 0.f) num += c * accS[(w * MAXG + g) * D + d];
        }
        int const h = kvh * group + g;
        float const normalised = den > 0.f ? num / den : 0.f;
        if (splits == 1) {
            storeOutput<T>(p, b * p.outTokenStride + h * D + d, normalised, inverse);
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
    if (splits == 1) return;

    // Counters are zero before a launch and left zero after it.
    __shared__ bool lastS;
    __threadfence();  // this block's partials are visible before its arrival is counted
    __syncthreads();
    if (threadIdx.x == 0) {
        int* counter = p.splitCounters + b * p.kvHeads + kvh;
        lastS = atomicAdd(counter, 1) == splits - 1;
        if (lastS) *counter = 0;
    }
    __syncthreads();
    if (!lastS) return;
    __threadfence();
    for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
        int const g = i / D;
        int const d = i - g * D;
        int const h = kvh * group + g;
        // Read through L2 (__ldcg): other blocks wrote these.
        float const* parts = p.workspace + (static_cast<int64_t>(b) * p.numHeads + h) * p.numSplits * (D + 2);
        float mAll = -FLT_MAX;
        for (int sp = 0; sp < splits; ++sp) mAll = fmaxf(mAll, __ldcg(parts + sp * (D + 2) + D));
        float num = 0.f;
        float den = 0.f;
        for (int sp = 0; sp < splits; ++sp) {
            float const lsp = __ldcg(parts + sp * (D + 2) + D + 1);
            if (lsp == 0.f) continue;
            float const c = __expf(__ldcg(parts + sp * (D + 2) + D) - mAll) * lsp;
            num += c * __ldcg(parts + sp * (D + 2) + d);
            den += c;
        }
        storeOutput<T>(p, b * p.outTokenStride + h * D + d, den > 0.f ? num / den : 0.f, inverse);
    }
}


// ---- CUDA-core kernel (float32; head size 256) ------------------------------------------------

// D: head size. MAXG: the largest query-head group this instance serves (the launcher picks
// the smallest of 1, 2, 4, 8 that holds the group, so no work is spent on absent heads). U:
// rows each lane group has in flight at once.
//
// One pass with an online softmax: each lane group (LPR lanes) walks its positions U at a
// time, loading the K and V rows of all U positions before using any (their block ids come
// from shared memory), so it waits for memory once per U rows; it keeps a running max, sum and
// weighted sum per query head, and the groups' partial results are merged at the end.
// 512 threads per multiprocessor (128 registers a thread) where that compiles without spills:
// half-precision heads up to 128 with groups up to 4; 256 otherwise. THREADS: the block size
// (launchCudaCore chooses it).
template <typename T, int D, int MAXG, int THREADS>
constexpr int kMinBlocks = (MAXG * RowLayout<T, D>::EPL <= 32 && D <= 128 && sizeof(T) == 2 ? 2 : 1) * (256 / THREADS);

template <typename T, int D, int MAXG, int U, int THREADS>
__global__ void __launch_bounds__(THREADS, kMinBlocks<T, D, MAXG, THREADS>) decodeAttentionKernel(DecodeAttentionParams p) {
    waitForPreviousKernel();  // see launchKernel
    allowNextKernel();
    using L = RowLayout<T, D>;
    constexpr int kWarps = THREADS / 32;
    constexpr int kGroups = kWarps * L::RPW;            // lane groups in the block
    extern __shared__ float smem[];
    Shared const sh = carveShared<D, MAXG>(smem, kGroups);

    int const kvh = blockIdx.x;
    int const b = blockIdx.y;
    int const split = blockIdx.z;
    int const group = static_cast<int>(p.numHeads / p.kvHeads);
    int const lane = threadIdx.x % 32;
    int const warp = threadIdx.x / 32;
    int const sub = lane % L::LPR;                     // which slice of a row this lane reads
    int const laneGroup = warp * L::RPW + lane / L::LPR;
    Chunk const c = chunkOf(p, b, split);
    if (split >= c.splits) return;  // the whole block: this sequence uses fewer splits
    int const n = c.n;
    stageBlock<T, T, D, THREADS>(p, c, b, kvh, group, sh);

    // This lane's slice of every query head, scaled, in registers for the whole walk.
    float qr[MAXG][L::EPL];
#pragma unroll
    for (int g = 0; g < MAXG; ++g)
#pragma unroll
        for (int e = 0; e < L::EPL; ++e) qr[g][e] = g < group ? sh.q[g * D + sub * L::EPL + e] * p.scale : 0.f;

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
            int const block = j < n ? blockOf(c, sh.blocks, j) : -1;
            valid[u] = block >= 0;
            if (valid[u]) {
                T const* kRow = kRowOf<T, D>(p, c, block, kvh, c.begin + j);
                loadSlice<T, D>(kRow, sub, k[u]);
                loadSlice<T, D>(kRow + p.kvHeads * p.tokensPerBlock * D, sub, v[u]);
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
                    int const pos = c.begin + j0 + u * L::RPW + lane / L::LPR;
                    dot += p.alibiSlopes[kvh * group + g] * static_cast<float>(pos - c.qPos);
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

#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        if (g >= group) break;
#pragma unroll
        for (int e = 0; e < L::EPL; ++e) sh.acc[(laneGroup * MAXG + g) * D + sub * L::EPL + e] = acc[g][e];
        if (sub == 0) {
            sh.stat[(laneGroup * MAXG + g) * 2] = m[g];
            sh.stat[(laneGroup * MAXG + g) * 2 + 1] = l[g];
        }
    }
    mergeAndStore<T, D, MAXG>(p, sh.acc, sh.stat, kGroups, b, kvh, split, c.splits, group);
}

// ---- tensor-core kernel (half precision, head sizes 64 and 128; sm_80 and later) ------------

// Each warp walks tiles of 16 positions with two MMAs (m16n8k16, float accumulators):
//   S^T = K Q^T:    M = the tile's 16 positions, N = the group's query heads (8), K = the head
//                   dimension: one MMA a k-step for the whole tile, and Q, the B operand, has no
//                   zero rows to keep in registers;
//   O^T += V^T P^T: M = 16 output dims per MMA, N = the 8 heads, K = the tile's 16 positions,
//                   so no accumulator is spent on zero rows. P^T is the transpose of the S^T
//                   fragment's two 8 x 8 halves (movmatrix), and a lane's output columns are
//                   the heads whose softmax it keeps: their rescales need no shuffle.
// Memory is the bound, so the layout is chosen for the loads, not the MMAs: a lane loads whole
// 16-byte pieces of K/V rows straight into the registers an MMA reads (no shared memory, no
// synchronisation in the loop). That works because a dot product may visit its terms in any
// order: the head dimension is permuted identically in Q and K (lane t of a quad owns dims
// 32c + 8t .. 32c + 8t + 7 of its position), and the output dims are permuted and put back
// when written. Of V, lane (g, t) needs positions 2t, 2t+1, 8+2t, 9+2t of the tile and output
// dims g*8 .. g*8+7 (+64k): whole 16-byte pieces again, paired into MMA registers by byte
// permutes. The online softmax runs on the score fragments, 16 positions at a time.
template <typename T>
__device__ __forceinline__ uint32_t packPair(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t packPair<__half>(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t packPair<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}

// d += a (16 x 16, row-major fragment) * b (16 x 8, column-major fragment), float accumulate.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same_v<T, __half>) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
#else
    __trap();  // launchTyped chooses this kernel on sm_80 and later only
#endif
}

// The 8 x 8 matrix of 16-bit elements whose row lane / 4, columns 2 (lane % 4), +1 are in a
// lane's word, transposed: the same layout of the transpose.
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
    uint32_t y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

// C: the cache's element type (T, or __nv_fp8_e4m3 / int8_t codes). With codes, M (the MMA's
// operand type) is __half, and a lane's K and V pieces are 16 codes (16 bytes) instead of 8:
//   K: lane t of a quad owns dims 64c + 16t .. 64c + 16t + 15 of its position, four k-steps a
//      piece (k-step kc reads word kc % 4 of piece kc / 4; Q is permuted the same way);
//   V: lane g owns the output dims g * D/8 .. g * D/8 + D/8 - 1 of each of its four positions
//      (16 bytes for D = 128, 8 for D = 64); m-tile i takes dims 2i, 2i + 1 of that run.
//
// TILE_BLOCKS (tokensPerBlock >= 16): tiles start at multiples of 16 absolute positions, so each
// lies in one cache block: one block id and one row address a tile, a lane's rows at fixed
// offsets from it (the first tile may begin before the chunk: those positions are masked).
// Without it (smaller blocks), every row looks up its own block.
template <typename T, typename C, int D, int WARPS, int TILES, int MINB, bool PIPE, bool TILE_BLOCKS>
__global__ void __launch_bounds__(WARPS * 32, MINB) decodeAttentionMmaKernel(DecodeAttentionParams p) {
    constexpr bool kCodes = kIsKvCode<C>;
    // early: the warp's first tiles of K/V are loaded before waitForPreviousKernel (see
    // DecodeAttentionParams::earlyCacheLoads), this step's own row patched in from shared memory
    // after the owner writes it; one block-table-first round trip is off the chain.
    // Not the instance held to 168 registers (three four-warp blocks an SM): the early tiles' registers
    // would spill there. Twelve warps of one tile (one block an SM, 170 registers a thread at most)
    // take them in 166 registers, as eight do.
    constexpr bool kEarly = TILE_BLOCKS && !PIPE && !kCodes && (WARPS * 32 * MINB <= 256 || (MINB == 1 && WARPS <= 12));
    bool const early = kEarly && p.earlyCacheLoads && p.kNew != nullptr;
    if (!early) {
        waitForPreviousKernel();  // see launchKernel
        allowNextKernel();
    }
    static_assert(D == 64 || D == 128, "head dims of the tensor-core kernel");
    using M = std::conditional_t<kCodes, __half, T>;
    constexpr int MAXG = kDecodeAttentionMaxGroup;   // query heads: MMA rows 0..7
    constexpr int KC = D / 16;                        // MMA k-steps of a score (S = Q K^T)
    constexpr int KP = kCodes ? D / 64 : D / 32;      // 16-byte pieces of a K row a lane loads
    constexpr int MT = D / 16;                        // MMA m-tiles of the output (O^T += V^T P^T)
    constexpr int VP = D / 64;                        // 16-byte pieces of a V row a lane loads (T)
    constexpr int VW = D / 32;                        // 32-bit words of codes of a V row a lane loads
    constexpr float kLog2e = 1.4426950408889634f;
    extern __shared__ float smem[];
    Shared const sh = carveShared<D, MAXG>(smem, WARPS);

    int const kvh = blockIdx.x;
    int const b = blockIdx.y;
    int const split = blockIdx.z;
    int const group = static_cast<int>(p.numHeads / p.kvHeads);
    int const lane = threadIdx.x % 32;
    int const warp = threadIdx.x / 32;
    int const g = lane / 4;  // MMA row (query head) and column (position, output dim) of this lane
    int const t = lane % 4;  // its place in the quad
    Chunk const c = chunkOf(p, b, split);
    if (split >= c.splits) {  // the whole block: this sequence uses fewer splits
        if (early) waitForPreviousKernel();
        return;
    }
    int64_t const vOffset = p.kvHeads * p.tokensPerBlock * D;
    // A warp takes TILES tiles of 16 positions at a time: their loads first, all of them, then
    // the math of each: one wait for memory per TILES * 16 positions. PIPE: the next TILES
    // tiles' loads are issued before this iteration's math, so they are in flight while it runs.
    struct Tiles {
        uint4 kq[TILES][2][KP];                 // K of positions tile + 8j + g
        uint4 vq[TILES][4][kCodes ? 1 : VP];    // V of positions tile + {2t, 2t+1, 8+2t, 9+2t} (T)
        uint32_t vw[TILES][4][kCodes ? VW : 1];  // the same, codes
        bool cached[TILES];                     // TILE_BLOCKS: the tile's block is in the cache
        bool whole[TILES];                      // TILE_BLOCKS: and every position of it is in the chunk
    };
    // TILE_BLOCKS: the chunk's walk starts at the tile holding its first position.
    int const lead = TILE_BLOCKS ? (c.begin & 15) : 0;
    auto load = [&](int base, Tiles& x) {
#pragma unroll
        for (int u = 0; u < TILES; ++u) {
            int const tile = base + 16 * u;
            C const* kTile = nullptr;  // TILE_BLOCKS: the tile's first K row
            if constexpr (TILE_BLOCKS) {
                // Every load is issued: a tile past the chunk or outside the cache reads block 0
                // (any block is memory of the pool) and is masked in compute.
                int const block = tile < c.n ? sh.blocks[((c.begin + tile) >> c.tpbShift) - c.firstBlock] : -1;
                x.cached[u] = block >= 0;
                x.whole[u] = block >= 0 && tile >= 0 && tile + 16 <= c.n;
                kTile = kRowOf<C, D>(p, c, max(block, 0), kvh, c.begin + tile);
            }
            // A row's piece this lane loads, or nullptr: a masked position, zeros (never with
            // TILE_BLOCKS, whose loads are all issued).
            auto rowAt = [&](int pos, int lanePart) -> C const* {
                if constexpr (TILE_BLOCKS) {  // lane part first: the rest is a load's constant offset
                    return (kTile + lanePart) + (pos - tile) * D;
                } else {
                    int const block = pos < c.n ? blockOf(c, sh.blocks, pos) : -1;
                    return block >= 0 ? kRowOf<C, D>(p, c, block, kvh, c.begin + pos) + lanePart : nullptr;
                }
            };
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                C const* row = rowAt(tile + 8 * j + g, kCodes ? t * 16 : t * 8);
                bool const read = TILE_BLOCKS || row != nullptr;
#pragma unroll
                for (int i = 0; i < KP; ++i) {
                    x.kq[u][j][i] = read ? *reinterpret_cast<uint4 const*>(row + i * (kCodes ? 64 : 32))
                                         : make_uint4(0, 0, 0, 0);
                }
            }
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                C const* row = rowAt(tile + (r / 2) * 8 + 2 * t + (r % 2), kCodes ? g * (D / 8) : g * 8);
                bool const read = TILE_BLOCKS || row != nullptr;
                if (read) row += vOffset;
                if constexpr (kCodes) {
                    if constexpr (VW == 4) {
                        uint4 const w = read ? *reinterpret_cast<uint4 const*>(row) : make_uint4(0, 0, 0, 0);
                        x.vw[u][r][0] = w.x;
                        x.vw[u][r][1] = w.y;
                        x.vw[u][r][2] = w.z;
                        x.vw[u][r][3] = w.w;
                    } else {
                        uint2 const w = read ? *reinterpret_cast<uint2 const*>(row) : make_uint2(0, 0);
                        x.vw[u][r][0] = w.x;
                        x.vw[u][r][1] = w.y;
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < VP; ++i) {
                        x.vq[u][r][i] = read ? *reinterpret_cast<uint4 const*>(row + i * 64) : make_uint4(0, 0, 0, 0);
                    }
                }
            }
        }
    };
    Tiles pre;  // early: the warp's first tiles
    if (early) {
        stageBlockIds<WARPS * 32>(p, c, b, sh);
        load(warp * 16 * TILES - lead, pre);
        waitForPreviousKernel();
        allowNextKernel();
        stageBlock<T, C, D, WARPS * 32, true>(p, c, b, kvh, group, sh);
        if (c.owner) {  // this step's row, as the owner wrote it (fromFloat of sh.k / sh.v), where loaded stale
            int const own = c.qPos - c.begin;
            int const base = warp * 16 * TILES - lead;
#pragma unroll
            for (int u = 0; u < TILES; ++u) {
                int const tile = base + 16 * u;
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    if (tile + 8 * j + g != own) continue;
#pragma unroll
                    for (int i = 0; i < KP; ++i) pre.kq[u][j][i] = packOf<T>(sh.k + t * 8 + i * 32);
                }
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    if (tile + (r / 2) * 8 + 2 * t + (r % 2) != own) continue;
#pragma unroll
                    for (int i = 0; i < VP; ++i) pre.vq[u][r][i] = packOf<T>(sh.v + g * 8 + i * 64);
                }
            }
        }
    } else {
        stageBlock<T, C, D, WARPS * 32>(p, c, b, kvh, group, sh);
    }

    // Q as the B operand of every k-step (column g: head g), in the permuted dim order.
    uint32_t qa[KC][2];
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
        int const d0 = kCodes ? (kc / 4) * 64 + t * 16 + (kc % 4) * 4 : (kc / 2) * 32 + t * 8 + (kc % 2) * 4;
        float const* row = sh.q + g * D + d0;
        qa[kc][0] = g < group ? packPair<M>(row[0], row[1]) : 0u;
        qa[kc][1] = g < group ? packPair<M>(row[2], row[3]) : 0u;
    }
    // Codes: a K operand is (code value * kvHalfUnit), its value code * kScale.
    float const kMul = kCodes ? p.kvScale[0] / kvHalfUnit<C>() : 1.f;
    float const vMul = kCodes ? p.kvScale[1] / kvHalfUnit<C>() : 1.f;
    float const scoreScale = p.scale * kMul * kLog2e;  // scores in log2 units: exp2f below
    float slope[2];  // heads 2t, 2t+1 (this lane's S^T columns)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        int const head = 2 * t + h;
        slope[h] = (p.alibiSlopes != nullptr && head < group) ? p.alibiSlopes[kvh * group + head] * kLog2e : 0.f;
    }

    // O^T (dims x heads), m-tile i: rows g and g+8 are this lane's output dims dimOf(i, 0 / 1),
    // columns 2t and 2t+1 its heads; no rows wasted on absent heads.
    float acc[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    float m[2] = {-FLT_MAX, -FLT_MAX};  // running max of heads 2t, 2t+1 (log2 units), the same for every g
    float l[2] = {0.f, 0.f};            // this lane's part of their sums of exponentials

    auto compute = [&](int base, Tiles& x) {
#pragma unroll
        for (int u = 0; u < TILES; ++u) {
            int const tile = base + 16 * u;
            if (TILE_BLOCKS && !x.whole[u]) {  // V of masked positions (stale, maybe NaN) is zero: P V
#pragma unroll                                 // must not see 0 * NaN
                for (int r = 0; r < 4; ++r) {
                    int const pos = tile + (r / 2) * 8 + 2 * t + (r % 2);
                    if (!x.cached[u] || pos < 0 || pos >= c.n) {
#pragma unroll
                        for (int w = 0; w < (kCodes ? VW : 1); ++w) x.vw[u][r][w] = 0u;
#pragma unroll
                        for (int i = 0; i < (kCodes ? 1 : VP); ++i) x.vq[u][r][i] = make_uint4(0, 0, 0, 0);
                    }
                }
            }
            // S^T = K Q^T: A = K (rows: the tile's 16 positions, k: dims), B = Q^T (n: heads). s[0],
            // s[1]: position tile + g, heads 2t, 2t+1; s[2], s[3]: position tile + 8 + g, the same.
            float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int kc = 0; kc < KC; ++kc) {
                uint32_t a[4];
                if constexpr (kCodes) {
                    int const w = kc % 4;
                    kvCodesToHalf2<C>(reinterpret_cast<uint32_t const*>(&x.kq[u][0][kc / 4])[w], a[0], a[2]);
                    kvCodesToHalf2<C>(reinterpret_cast<uint32_t const*>(&x.kq[u][1][kc / 4])[w], a[1], a[3]);
                } else {
                    int const w = (kc % 2) * 2;
                    a[0] = reinterpret_cast<uint32_t const*>(&x.kq[u][0][kc / 2])[w];
                    a[2] = reinterpret_cast<uint32_t const*>(&x.kq[u][0][kc / 2])[w + 1];
                    a[1] = reinterpret_cast<uint32_t const*>(&x.kq[u][1][kc / 2])[w];
                    a[3] = reinterpret_cast<uint32_t const*>(&x.kq[u][1][kc / 2])[w + 1];
                }
                mma16816<M>(s, a, qa[kc][0], qa[kc][1]);
            }
            // Online softmax of heads 2t and 2t+1 over the tile's 16 positions: this lane has two
            // of them, the lanes of the same t (xor 4, 8, 16) the rest.
            float tileMax[2] = {-FLT_MAX, -FLT_MAX};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int const pos = tile + (e / 2) * 8 + g;
                bool const visible = TILE_BLOCKS ? x.whole[u] || (x.cached[u] && pos >= 0 && pos < c.n)
                                                 : pos < c.n && blockOf(c, sh.blocks, pos) >= 0;
                float const score = s[e] * scoreScale + slope[e % 2] * static_cast<float>(c.begin + pos - c.qPos);
                s[e] = visible ? score : -FLT_MAX;
                tileMax[e % 2] = fmaxf(tileMax[e % 2], s[e]);
            }
            float rescale[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int offset = 4; offset < 32; offset *= 2) {
                    tileMax[h] = fmaxf(tileMax[h], __shfl_xor_sync(0xffffffffu, tileMax[h], offset));
                }
                float const mNew = fmaxf(m[h], tileMax[h]);
                rescale[h] = mNew != -FLT_MAX ? exp2f(m[h] - mNew) : 1.f;
                m[h] = mNew;
                l[h] *= rescale[h];
            }
            float pr[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                pr[e] = s[e] != -FLT_MAX ? exp2f(s[e] - m[e % 2]) : 0.f;
                l[e % 2] += pr[e];
            }
            // This lane's output columns are its heads: once the maxima settle no rescale moves,
            // and the warp skips the multiplies by 1.
            if (__any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)) {
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    acc[i][0] *= rescale[0];
                    acc[i][1] *= rescale[1];
                    acc[i][2] *= rescale[0];
                    acc[i][3] *= rescale[1];
                }
            }
            // P^T as the B operand (k = positions, n = heads): lane (g, t) needs head g's
            // positions 2t, 2t+1 and 8+2t, 9+2t, the transposes of the 8 x 8 halves of P that the
            // S^T fragment left (positions g, g + 8; heads 2t, 2t+1).
            uint32_t const pb0 = transpose8x8(packPair<M>(pr[0], pr[1]));
            uint32_t const pb1 = transpose8x8(packPair<M>(pr[2], pr[3]));
            // O^T += V^T P^T: A = V^T (rows: dims, k: positions). Lane (g, t) holds dims
            // dimOf(i, h) of positions 2t, 2t+1, 8+2t, 9+2t. Values: dimOf = (idx / 8) * 64 + g * 8
            // + idx % 8 with idx = 2i + h: m-tile i reads word (i % 4) of piece i / 4, its low
            // halves for row g and its high halves for row g + 8. Codes: dimOf = g * D/8 + idx:
            // m-tile i takes bytes 2i % 4 and 2i % 4 + 1 of word i / 2 of each position, paired
            // across positions by a byte permute, then turned into half2 pairs.
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                if constexpr (kCodes) {
                    int const word = i / 2;
                    uint32_t const sel = i % 2 == 0 ? 0x5140u : 0x7362u;
                    uint32_t a[4];
                    kvCodesToHalf2<C>(__byte_perm(x.vw[u][0][word], x.vw[u][1][word], sel), a[0], a[1]);
                    kvCodesToHalf2<C>(__byte_perm(x.vw[u][2][word], x.vw[u][3][word], sel), a[2], a[3]);
                    mma16816<M>(acc[i], a, pb0, pb1);
                } else {
                    int const piece = i / 4;
                    int const word = i % 4;
                    uint32_t const v0 = reinterpret_cast<uint32_t const*>(&x.vq[u][0][piece])[word];
                    uint32_t const v1 = reinterpret_cast<uint32_t const*>(&x.vq[u][1][piece])[word];
                    uint32_t const v2 = reinterpret_cast<uint32_t const*>(&x.vq[u][2][piece])[word];
                    uint32_t const v3 = reinterpret_cast<uint32_t const*>(&x.vq[u][3][piece])[word];
                    uint32_t const a[4] = {__byte_perm(v0, v1, 0x5410u), __byte_perm(v0, v1, 0x7632u),
                                           __byte_perm(v2, v3, 0x5410u), __byte_perm(v2, v3, 0x7632u)};
                    mma16816<M>(acc[i], a, pb0, pb1);
                }
            }
        }
    };
    constexpr int kStride = WARPS * 16 * TILES;
    if constexpr (PIPE) {  // two sets of registers in turn (a copy from one to the other costs moves)
        Tiles a, b;
        int base = warp * 16 * TILES - lead;
        load(base, a);
        while (base < c.n) {
            load(base + kStride, b);  // past the chunk: nothing is read (TILE_BLOCKS: block 0, masked)
            compute(base, a);
            base += kStride;
            if (base >= c.n) break;
            load(base + kStride, a);
            compute(base, b);
            base += kStride;
        }
    } else {
        int base = warp * 16 * TILES - lead;
        if (early && base < c.n) {
            compute(base, pre);
            base += kStride;
        }
        for (; base < c.n; base += kStride) {
            Tiles cur;
            load(base, cur);
            compute(base, cur);
        }
    }

    // The sums over the lanes of a t, then this warp's partial into shared memory in the real
    // dim order.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int offset = 4; offset < 32; offset *= 2) l[h] += __shfl_xor_sync(0xffffffffu, l[h], offset);
    }
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int const idx = 2 * i + h;
            int const d = kCodes ? g * (D / 8) + idx : (idx / 8) * 64 + g * 8 + idx % 8;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                int const head = 2 * t + e;
                if (head < group) sh.acc[(warp * MAXG + head) * D + d] = acc[i][2 * h + e] * vMul;
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        int const head = 2 * t + h;
        if (g == 0 && head < group) {
            sh.stat[(warp * MAXG + head) * 2] = m[h] != -FLT_MAX ? m[h] / kLog2e : -FLT_MAX;  // natural-log units
            sh.stat[(warp * MAXG + head) * 2 + 1] = l[h];
        }
    }
    mergeAndStore<T, D, MAXG>(p, sh.acc, sh.stat, WARPS, b, kvh, split, c.splits, group);
}

// ---- launch --------------------------------------------------------------------------------

template <typename T, int D, int MAXG, int THREADS>
void launchGrouped(DecodeAttentionParams const& p, cudaStream_t stream) {
    using L = RowLayout<T, D>;
    constexpr int kGroups = THREADS / 32 * L::RPW;
    // Rows in flight per lane group, few enough that the registers (q, accumulators and the
    // loaded rows) fit without spilling.
    constexpr int U = MAXG * L::EPL >= 32 ? 2 : 4;
    size_t const smem = sharedBytes<D, MAXG>(p, kGroups);
    auto kernel = decodeAttentionKernel<T, D, MAXG, U, THREADS>;
    if (smem > 48 * 1024) {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    }
    dim3 grid(static_cast<unsigned>(p.kvHeads), static_cast<unsigned>(p.batch), static_cast<unsigned>(p.numSplits));
    launchKernel("decode_attention", kernel, grid, THREADS, smem, stream, p);
}

template <typename T, int D, int THREADS>
void launchCudaCore(DecodeAttentionParams const& p, cudaStream_t stream) {
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

template <typename T, typename C, int D, int WARPS, int TILES, int MINB, bool PIPE>
auto mmaKernel(DecodeAttentionParams const& p) {
    return p.tokensPerBlock >= 16 ? decodeAttentionMmaKernel<T, C, D, WARPS, TILES, MINB, PIPE, true>
                                  : decodeAttentionMmaKernel<T, C, D, WARPS, TILES, MINB, PIPE, false>;
}

template <typename T, typename C, int D, int WARPS, int TILES, int MINB, bool PIPE = false>
void launchMma(DecodeAttentionParams const& p, cudaStream_t stream) {
    size_t const smem = sharedBytes<D, kDecodeAttentionMaxGroup>(p, WARPS);
    auto kernel = mmaKernel<T, C, D, WARPS, TILES, MINB, PIPE>(p);
    if (smem > 48 * 1024) {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    }
    dim3 grid(static_cast<unsigned>(p.kvHeads), static_cast<unsigned>(p.batch), static_cast<unsigned>(p.numSplits));
    launchKernel("decode_attention", kernel, grid, WARPS * 32, smem, stream, p);
}

// Four-warp blocks of two tiles (1-byte codes: PIPE). Their registers leave room for two blocks an
// SM, so a grid of a little more than two an SM ran a second wave of a few blocks, each walking a
// whole sequence alone: on an H200 (132 SMs, the 8B shape: 8 KV heads, one split a sequence) the
// step from batch 33 (264 blocks) to 34 (272) took the bf16 walk at 2,080 positions from 73 to 112
// us. The same kernel held to 168 registers (MINB 3: three blocks an SM) is slower block for block
// (batch 32: 72 -> 95 us), but one wave of it beats two: bench_decode_attention.py, us, bf16 / FP8,
// two blocks -> three: b34 L2080 112.3 -> 97.4 / 67.1 -> 58.1, b40 L2080 121.1 -> 100.4 / 71.7 ->
// 60.3, b48 L2080 123.3 -> 113.8 / 73.8 -> 65.0, b40 L1024 65.4 -> 53.2 / 42.8 -> 35.1, b40 L200
// 19.6 -> 14.0 / 18.7 -> 13.4; beyond three an SM it loses (b50 124.5 -> 140.7, b64 138.3 ->
// 174.4). So grids between the two instances' capacities take the three-block one. (Splitting
// each sequence further to fill whole waves of the two-block instance was slower still: b40 L2080
// bf16 128 us, FP8 93 at three splits.)
template <typename T, typename C, int D>
void launchFourWarps(DecodeAttentionParams const& p, cudaStream_t stream) {
    constexpr bool kPipe = kIsKvCode<C>;
    size_t const smem = sharedBytes<D, kDecodeAttentionMaxGroup>(p, 4);
    int64_t const blocks = p.batch * p.kvHeads * p.numSplits, sms = multiprocessors();
    if (blocks > residentBlocks(mmaKernel<T, C, D, 4, 2, 1, kPipe>(p), 128, smem) * sms
        && blocks <= residentBlocks(mmaKernel<T, C, D, 4, 2, 3, kPipe>(p), 128, smem) * sms) {
        launchMma<T, C, D, 4, 2, 3, kPipe>(p, stream);
    } else {
        launchMma<T, C, D, 4, 2, 1, kPipe>(p, stream);
    }
}

// Which kernel and block size. Half-precision heads of 64 or 128 on sm_80+ take the tensor-core
// kernel. With several waves of blocks (large decode batches of short sequences) one-warp blocks
// of two tiles per iteration (224 registers, 8 blocks per multiprocessor): a block's fixed part
// (staging, merging) then holds up one warp only, and the other blocks' loads overlap it; with
// fewer blocks (long sequences, small batches: the caller's splits fill the GPU) four-warp blocks
// share a chunk, twelve-warp blocks where the pairs are few (below). Measured on an H100 (the 8B
// shape of benchmarks/bench_decode_attention.py, bf16, fused write + RoPE, tokens per block 32;
// microseconds at b512 L192 / b512 L96 / b512 L512 / b256 L192):
//   1 warp x 2 tiles, 8 blocks per SM   160.5 / 100.2 / 372.3 / 83.9   (chosen)
//   1 warp x 1 tile, 12 blocks          157.9 / 101.2 / 374.8 / 92.5
//   2 warps x 2 tiles                   168.8 / 116.7 / 381.2 / 89.5
//   2 warps x 1 tile, 6 blocks          167.5 / 100.4 / 387.5 / 86.5
//   4 warps x 1 tile, 3 blocks          168.8 / 120.7 / 385.3 / 92.7
// (before the O^T = V^T P^T layout and the one-round-trip staging, 2 warps x 2 tiles: 192.5 /
// 137.7 / 403.5 / 105). CUDA cores: 265 us at b512 L192 (64 threads); b32 L192 20.2 (256).
// With few (sequence, KV head) pairs (small batches; their splits then fill the GPU), eight (now
// twelve) warps share a chunk: each walks fewer tiles, and nothing else waits for the multiprocessor.
// H100, microseconds at b1 L160 / b1 L600 / b1 L2100 / b4 L200 / SmolLM2 b1 L150 (8 to 48 blocks
// at work), 4 warps -> 8 warps x 2 tiles: 8.51 -> 6.52 / 16.00 -> 12.12
// / 24.16 -> 16.22 / 9.10 -> 7.30 / 6.60 -> 5.08 (8 x 1 tile: 7.36 / 12.40 / 16.65 / 8.17 / 5.59;
// 16 x 1: 7.48 / 12.79 / 14.77 / 8.14 / 5.52); at b32 L2080 (256 pairs) 8 warps were slower,
// 99.7 -> 103.4, so more pairs keep four (eight: up to a quarter of the multiprocessors, b1-b4
// of the 8B shape, measured above). In the engine, where the step's first tiles are loaded before
// the wait (earlyCacheLoads), one tile a warp is the faster: H200, the INT4 g128 8B engine's batch-1
// graph (one engine captured both ways, ab_load_switches.py, medians of 8 rounds, ms), 8 x 2 -> 8 x
// 1 tiles at 129 positions 2.0383 -> 2.0159, 176 2.0403 -> 2.0292, 1,024 2.2950 -> 2.2762, 2,048
// 2.3691 -> 2.3445 (12 x 1 at the last three: 2.0481, 2.2878, 2.3537; at 129, 16 x 1, held to 128
// registers: 2.0644, and 4 x 2: 2.0769; at 176 and 1,024, 6 x 1 1.015x and 1.047x 8 x 1's, 4 x 1
// 1.030x and 1.116x). So half-precision caches took 8 x 1. 12 x 1 had no early loads then (the
// instance rule kept them to 256 threads); given them, and with the merge's part weights computed
// once a head, 12 x 1 is the faster (2026-12-02, H200, same method: 192 positions 1.7971 -> 1.7939,
// 1,024 positions 2.0535 -> 2.0509), so half-precision caches take 12 x 1, with or without the
// early loads (not measured without them): the two launches stay one kernel, the same bits. 1-byte
// codes, which have no early loads, keep 8 x 2.
// 1-byte codes between those two (b32 L2080: 256 pairs, two blocks of four warps per SM) load
// the next two tiles while they compute these (PIPE, 208 registers): 8 KB of codes a warp
// round is too little in flight to cover memory with eight warps an SM. H100, b32 L2080, FP8
// (with the sm_89+ conversion): 64 -> 58 us, INT8 66 -> 60 (bf16 99: its 16 KB a round already
// keeps memory busy, and two register sets of it spill). Then one block id a tile (TILE_BLOCKS)
// and S^T = K Q^T (half the score MMAs, no zero rows to rebuild): a round of 2 tiles from ~1,010
// to ~585 instructions on the common path; FP8 58.0 -> 54.3 us, INT8 60.1 -> 54.6, b256 L192 FP8
// 64.4 -> 60.2, bf16 unchanged (97-98). Tried and slower there: 4 tiles a
// round 73, 8 warps x 2 tiles 69, 4 x 1 tile pipelined 79, 2 or 3 splits a sequence 76-99 (these
// four before the conversion), a per-warp cp.async ring in shared memory instead of registers
// (2-4 rounds deep, 117-146 registers, up to three blocks an SM) 75-94.
template <typename T, int D>
void launchTyped(DecodeAttentionParams const& p, cudaStream_t stream) {
    bool const manyWaves = p.batch * p.kvHeads * p.numSplits >= 8LL * multiprocessors();
    // Few (sequence, KV head) pairs: at most a quarter of the multiprocessors, so even with
    // every split at work the grid is about one wave (numSplits is about multiprocessors / pairs).
    bool const fewPairs = 4 * p.batch * p.kvHeads <= multiprocessors();
    if constexpr (!std::is_same_v<T, float> && (D == 64 || D == 128)) {
        if (deviceAttribute(cudaDevAttrComputeCapabilityMajor) >= 8) {
            auto byCache = [&](auto codeTag) {
                using C = decltype(codeTag);
                if (manyWaves) {
                    launchMma<T, C, D, 1, 2, 8>(p, stream);
                } else if (fewPairs) {
                    if constexpr (kIsKvCode<C>) {
                        launchMma<T, C, D, 8, 2, 1>(p, stream);
                    } else {
                        launchMma<T, C, D, 12, 1, 1>(p, stream);
                    }
                } else {
                    launchFourWarps<T, C, D>(p, stream);
                }
            };
            if (p.cacheDtype == DType::kUInt8) {
                byCache(__nv_fp8_e4m3{});
            } else if (p.cacheDtype == DType::kInt8) {
                byCache(int8_t{});
            } else {
                byCache(T{});
            }
            return;
        }
    }
    if (p.cacheDtype != p.dtype) {
        throw std::invalid_argument("decode_attention: a quantized KV cache is read by the tensor-core kernel only "
                                    "(float16 / bfloat16 q, head_dim 64 or 128, sm_80 or newer)");
    }
    if (manyWaves) {
        launchCudaCore<T, D, 64>(p, stream);
    } else {
        launchCudaCore<T, D, 256>(p, stream);
    }
}

// Every head size of activation dtype T.
template <typename T>
void launchHeadSizes(DecodeAttentionParams const& p, cudaStream_t stream) {
    switch (p.headDim) {
        case 64: launchTyped<T, 64>(p, stream); break;
        case 128: launchTyped<T, 128>(p, stream); break;
        case 256: launchTyped<T, 256>(p, stream); break;
        default:
            throw std::invalid_argument("decode_attention: head_dim " + std::to_string(p.headDim)
                                        + " is not supported (64, 128 or 256)");
    }
}

} // namespace

// The launch of one activation dtype, each in a translation unit of its own
// (decode_attention_{float,half,bf16}.cu) so that their kernel instances compile in parallel: in
// one file they were the build's longest compile. decode_attention.cu dispatches on p.dtype.
void launchDecodeAttentionFloat(DecodeAttentionParams const& p, cudaStream_t stream);
void launchDecodeAttentionHalf(DecodeAttentionParams const& p, cudaStream_t stream);
void launchDecodeAttentionBFloat16(DecodeAttentionParams const& p, cudaStream_t stream);

} // namespace tensorrt_llm
