// Rotary position embedding, in place on Q and K.
//
// cosSinCache row p = cat(cos(p * inv_freq), sin(p * inv_freq)), rotaryDim / 2 each.
// Pair j (0 <= j < rotaryDim / 2) of a head is (x[j], x[j + rotaryDim/2]) in the GPT-NeoX
// layout and (x[2j], x[2j+1]) in the GPT-J layout; it becomes
//   (x1 * cos - x2 * sin, x2 * cos + x1 * sin).
// Dimensions past rotaryDim are left alone. One block per token; threads walk the
// (head, pair) grid of Q then K. Q and K may be strided views of a packed QKV buffer.
//
// A position outside [0, maxPositions) cannot be reported from the kernel without a host
// sync: that token's Q and K are left unchanged (nothing is read or written out of bounds).
#include "common.cuh"

namespace tensorrt_llm {

template <typename T, typename PosT>
__global__ void rotaryKernel(T* __restrict__ q, T* __restrict__ k, PosT const* __restrict__ positions,
                             float const* __restrict__ cosSin, int64_t maxPositions, int rotaryDim, int qHeads,
                             int kHeads, int64_t qTokenStride, int64_t qHeadStride, int64_t kTokenStride,
                             int64_t kHeadStride, bool isNeox) {
    waitForPreviousKernel();  // see launchKernel
    allowNextKernel();
    int64_t const token = blockIdx.x;
    int64_t const pos = static_cast<int64_t>(positions[token]);
    if (pos < 0 || pos >= maxPositions) return;

    int const half = rotaryDim / 2;
    float const* cosRow = cosSin + pos * rotaryDim;
    float const* sinRow = cosRow + half;
    int const work = (qHeads + kHeads) * half;
    for (int i = threadIdx.x; i < work; i += blockDim.x) {
        int const head = i / half;
        int const j = i - head * half;
        T* x = head < qHeads ? q + token * qTokenStride + head * qHeadStride
                             : k + token * kTokenStride + (head - qHeads) * kHeadStride;
        int const i1 = isNeox ? j : 2 * j;
        int const i2 = isNeox ? j + half : 2 * j + 1;
        float const c = cosRow[j];
        float const s = sinRow[j];
        float const x1 = toFloat(x[i1]);
        float const x2 = toFloat(x[i2]);
        x[i1] = fromFloat<T>(x1 * c - x2 * s);
        x[i2] = fromFloat<T>(x2 * c + x1 * s);
    }
}

template <typename T, typename PosT>
static void launch(RotaryParams const& p, cudaStream_t stream) {
    int64_t const work = (p.qHeads + p.kHeads) * (p.rotaryDim / 2);
    int const threads = std::min(512, std::max(32, roundUp(work, 32)));
    launchKernel("rotary_embedding", rotaryKernel<T, PosT>, static_cast<unsigned>(p.tokens), threads, 0, stream,
        static_cast<T*>(p.q), static_cast<T*>(p.k), static_cast<PosT const*>(p.positions), p.cosSinCache,
        p.maxPositions, static_cast<int>(p.rotaryDim), static_cast<int>(p.qHeads), static_cast<int>(p.kHeads),
        p.qTokenStride, p.qHeadStride, p.kTokenStride, p.kHeadStride, p.isNeox);
}

void launchRotaryEmbedding(RotaryParams const& p, void* stream) {
    if (p.tokens == 0 || p.rotaryDim == 0) return;
    auto s = static_cast<cudaStream_t>(stream);
    dispatchFloat(p.dtype, "rotary_embedding", [&](auto tag) {
        using T = decltype(tag);
        if (p.positionsDtype == DType::kInt32) {
            launch<T, int32_t>(p, s);
        } else if (p.positionsDtype == DType::kInt64) {
            launch<T, int64_t>(p, s);
        } else {
            throw std::invalid_argument("rotary_embedding: positions must be int32 or int64");
        }
    });
}

} // namespace tensorrt_llm
