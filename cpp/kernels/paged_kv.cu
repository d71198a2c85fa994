// Paged KV-cache write: scatter the new K/V rows of a packed batch into cache blocks.
//
// Token t of sequence b (cuSeqlens[b] <= t < cuSeqlens[b+1]) sits at position
// p = pastLengths[b] + t - cuSeqlens[b] and goes to block blockTables[b, p / tpb], slot
// p % tpb of kvCache [numBlocks, 2, kvHeads, tpb, headDim] (index 0 = K, 1 = V).
//
// Bad metadata cannot be reported from the kernel without a host sync, so it is SKIPPED:
// a token outside [cuSeqlens[0], cuSeqlens[batch]), a negative position, a block index past
// maxBlocks, or a block id outside [0, numBlocks) writes nothing. Every read of the metadata
// and every write into the cache stays inside the tensors' shapes.
//
// A quantized cache (cacheDtype kInt8 / kUInt8) takes each element's code under kvScale[0] (K)
// or kvScale[1] (V) instead (kv_codes.cuh): 16 bytes of K/V in, 8 bytes of codes out.
#include "kv_codes.cuh"

namespace tensorrt_llm {

template <typename C, typename T, int VEC>
__device__ __forceinline__ void storeRow(C* dst, T const* src, float const* kvScale, int which) {
    auto const in = *reinterpret_cast<Pack<T, VEC> const*>(src);
    if constexpr (std::is_same_v<C, T>) {
        *reinterpret_cast<Pack<T, VEC>*>(dst) = in;
    } else {
        float const scale = kvScale[which];
        Pack<C, VEC> out;
#pragma unroll
        for (int e = 0; e < VEC; ++e) out.v[e] = encodeKv<C>(toFloat(in.v[e]), scale);
        *reinterpret_cast<Pack<C, VEC>*>(dst) = out;
    }
}

template <typename T, typename C, int VEC>
__global__ void pagedKvWriteKernel(T const* __restrict__ key, T const* __restrict__ value, C* __restrict__ cache,
                                   float const* __restrict__ kvScale,
                                   int32_t const* __restrict__ blockTables, int32_t const* __restrict__ cuSeqlens,
                                   int32_t const* __restrict__ pastLengths, int batch, int64_t maxBlocks,
                                   int64_t numBlocks, int kvHeads, int64_t tokensPerBlock, int headDim,
                                   int64_t keyTokenStride, int64_t keyHeadStride, int64_t valueTokenStride,
                                   int64_t valueHeadStride) {
    waitForPreviousKernel();  // see launchKernel
    allowNextKernel();
    int64_t const t = blockIdx.x;

    // The sequence of token t: the last b with cuSeqlens[b] <= t (binary search over b+1 offsets).
    int lo = 0;
    int hi = batch;
    while (hi - lo > 1) {
        int const mid = (lo + hi) / 2;
        if (cuSeqlens[mid] <= t) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    int const b = lo;
    int64_t const start = cuSeqlens[b];
    if (t < start || t >= static_cast<int64_t>(cuSeqlens[b + 1])) return;
    int64_t const pos = static_cast<int64_t>(pastLengths[b]) + (t - start);
    if (pos < 0) return;
    int64_t const blockIdxInSeq = pos / tokensPerBlock;
    if (blockIdxInSeq >= maxBlocks) return;
    int64_t const block = blockTables[b * maxBlocks + blockIdxInSeq];
    if (block < 0 || block >= numBlocks) return;
    int64_t const slot = pos - blockIdxInSeq * tokensPerBlock;

    int64_t const headStride = tokensPerBlock * headDim;         // between heads in the cache
    C* kDst = cache + (block * 2 + 0) * kvHeads * headStride + slot * headDim;
    C* vDst = cache + (block * 2 + 1) * kvHeads * headStride + slot * headDim;
    int const packsPerHead = headDim / VEC;
    int const work = kvHeads * packsPerHead;
    for (int i = threadIdx.x; i < work; i += blockDim.x) {
        int const h = i / packsPerHead;
        int const d = (i - h * packsPerHead) * VEC;
        storeRow<C, T, VEC>(kDst + h * headStride + d, key + t * keyTokenStride + h * keyHeadStride + d, kvScale, 0);
        storeRow<C, T, VEC>(vDst + h * headStride + d, value + t * valueTokenStride + h * valueHeadStride + d,
                            kvScale, 1);
    }
}

template <typename T, typename C, int VEC>
static void launch(PagedKvWriteParams const& p, cudaStream_t stream) {
    int64_t const work = p.kvHeads * (p.headDim / VEC);
    int const threads = std::min(256, std::max(32, roundUp(work, 32)));
    launchKernel("paged_kv_write", pagedKvWriteKernel<T, C, VEC>, static_cast<unsigned>(p.tokens), threads, 0, stream,
        static_cast<T const*>(p.key), static_cast<T const*>(p.value), static_cast<C*>(p.kvCache), p.kvScale,
        p.blockTables,
        p.cuSeqlens, p.pastLengths, static_cast<int>(p.batch), p.maxBlocks, p.numBlocks, static_cast<int>(p.kvHeads),
        p.tokensPerBlock, static_cast<int>(p.headDim), p.keyTokenStride, p.keyHeadStride, p.valueTokenStride,
        p.valueHeadStride);
}

void launchPagedKvWrite(PagedKvWriteParams const& p, void* stream) {
    if (p.tokens == 0 || p.batch == 0) return;
    auto s = static_cast<cudaStream_t>(stream);
    dispatchFloat(p.dtype, "paged_kv_write", [&](auto tag) {
        using T = decltype(tag);
        constexpr int V = kVec16<T>;
        bool const vec = p.headDim % V == 0 && aligned16(p.key) && aligned16(p.value) && aligned16(p.kvCache)
                         && p.keyTokenStride % V == 0 && p.keyHeadStride % V == 0 && p.valueTokenStride % V == 0
                         && p.valueHeadStride % V == 0;
        auto byCache = [&](auto codeTag) {
            using C = decltype(codeTag);
            if (vec) {
                launch<T, C, V>(p, s);
            } else {
                launch<T, C, 1>(p, s);
            }
        };
        if (p.cacheDtype == DType::kUInt8) {
            byCache(__nv_fp8_e4m3{});
        } else if (p.cacheDtype == DType::kInt8) {
            byCache(int8_t{});
        } else {
            byCache(T{});
        }
    });
}

} // namespace tensorrt_llm
