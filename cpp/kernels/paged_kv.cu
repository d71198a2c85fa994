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
#include "common.cuh"

namespace tensorrt_llm {

template <typename T, int VEC>
__global__ void pagedKvWriteKernel(T const* __restrict__ key, T const* __restrict__ value, T* __restrict__ cache,
                                   int32_t const* __restrict__ blockTables, int32_t const* __restrict__ cuSeqlens,
                                   int32_t const* __restrict__ pastLengths, int batch, int64_t maxBlocks,
                                   int64_t numBlocks, int kvHeads, int64_t tokensPerBlock, int headDim,
                                   int64_t keyTokenStride, int64_t keyHeadStride, int64_t valueTokenStride,
                                   int64_t valueHeadStride) {
    using P = Pack<T, VEC>;
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
    T* kDst = cache + (block * 2 + 0) * kvHeads * headStride + slot * headDim;
    T* vDst = cache + (block * 2 + 1) * kvHeads * headStride + slot * headDim;
    int const packsPerHead = headDim / VEC;
    int const work = kvHeads * packsPerHead;
    for (int i = threadIdx.x; i < work; i += blockDim.x) {
        int const h = i / packsPerHead;
        int const d = (i - h * packsPerHead) * VEC;
        *reinterpret_cast<P*>(kDst + h * headStride + d) =
            *reinterpret_cast<P const*>(key + t * keyTokenStride + h * keyHeadStride + d);
        *reinterpret_cast<P*>(vDst + h * headStride + d) =
            *reinterpret_cast<P const*>(value + t * valueTokenStride + h * valueHeadStride + d);
    }
}

template <typename T, int VEC>
static void launch(PagedKvWriteParams const& p, cudaStream_t stream) {
    int64_t const work = p.kvHeads * (p.headDim / VEC);
    int const threads = std::min(256, std::max(32, roundUp(work, 32)));
    pagedKvWriteKernel<T, VEC><<<static_cast<unsigned>(p.tokens), threads, 0, stream>>>(
        static_cast<T const*>(p.key), static_cast<T const*>(p.value), static_cast<T*>(p.kvCache), p.blockTables,
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
        if (vec) {
            launch<T, V>(p, s);
        } else {
            launch<T, 1>(p, s);
        }
    });
    checkLaunch("paged_kv_write");
}

} // namespace tensorrt_llm
