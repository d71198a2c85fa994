// RMSNorm with an optional fused residual add.
//
//   s   = x + residual            (rounded to the storage dtype, written to residualOut)
//   out = s * rsqrt(mean(s^2) + eps) * weight
//
// One block per row; float32 accumulation; a warp-shuffle block reduction. Rows are read
// twice (the second read hits L1/L2); 16-byte accesses when sizes, strides and pointers allow.
// With codeScale (an FP8 linear's static input scale), out holds the E4M3 codes of `out` as
// rounded to the storage dtype (fp8Code): the rms_norm kernel then fp8_quantize, bit for bit, in
// one pass that writes a byte an element instead of two.
#include "common.cuh"

namespace tensorrt_llm {

// O: T, or uint8_t for E4M3 codes (codeScale given).
template <typename T, typename O, int VEC>
__global__ void rmsNormKernel(O* __restrict__ out, T const* __restrict__ x, T const* __restrict__ weight,
                              T const* __restrict__ residual, T* __restrict__ residualOut, int64_t hidden,
                              int64_t xRowStride, int64_t outRowStride, int64_t resRowStride, int64_t resOutRowStride,
                              float eps, float const* __restrict__ codeScale) {
    waitForPreviousKernel();  // see launchKernel
    allowNextKernel();
    using P = Pack<T, VEC>;
    int64_t const row = blockIdx.x;
    int64_t const numVec = hidden / VEC;
    P const* xRow = reinterpret_cast<P const*>(x + row * xRowStride);
    P const* resRow = residual ? reinterpret_cast<P const*>(residual + row * resRowStride) : nullptr;
    P* resOutRow = residualOut ? reinterpret_cast<P*>(residualOut + row * resOutRowStride) : nullptr;

    // Pass 1: (optional) residual add and the sum of squares.
    float sumSq = 0.f;
    for (int64_t i = threadIdx.x; i < numVec; i += blockDim.x) {
        P a = xRow[i];
        if (resRow) {
            P const b = resRow[i];
#pragma unroll
            for (int j = 0; j < VEC; ++j) a.v[j] = fromFloat<T>(toFloat(a.v[j]) + toFloat(b.v[j]));
            resOutRow[i] = a;
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            float const f = toFloat(a.v[j]);
            sumSq += f * f;
        }
    }
    float const inv = rsqrtf(blockReduceSum(sumSq) / static_cast<float>(hidden) + eps);

    // Pass 2: normalise and scale. Each thread re-reads exactly the elements it wrote above.
    P const* src = resOutRow ? resOutRow : xRow;
    P const* w = reinterpret_cast<P const*>(weight);
    using OutPack = Pack<O, VEC>;
    OutPack* outRow = reinterpret_cast<OutPack*>(out + row * outRowStride);
    float const inverse = codeInverse<O, T>(codeScale);
    for (int64_t i = threadIdx.x; i < numVec; i += blockDim.x) {
        P const a = src[i];
        P const g = w[i];
        OutPack o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            o.v[j] = outputOf<O>(fromFloat<T>(toFloat(a.v[j]) * inv * toFloat(g.v[j])), inverse);
        }
        outRow[i] = o;
    }
}

template <typename T, typename O, int VEC>
static void launchAs(RmsNormParams const& p, cudaStream_t stream) {
    int64_t const numVec = p.hidden / VEC;
    int const threads = std::min(1024, std::max(32, roundUp(numVec, 32)));
    launchKernel("rms_norm", rmsNormKernel<T, O, VEC>, static_cast<unsigned>(p.rows), threads, 0, stream,
        static_cast<O*>(p.out), static_cast<T const*>(p.x), static_cast<T const*>(p.weight),
        static_cast<T const*>(p.residual), static_cast<T*>(p.residualOut), p.hidden, p.xRowStride, p.outRowStride,
        p.residualRowStride, p.residualOutRowStride, p.eps, p.codeScale);
}

template <typename T, int VEC>
static void launch(RmsNormParams const& p, cudaStream_t stream) {
    dispatchOutput<T>(p.codeScale, [&](auto out) { launchAs<T, decltype(out), VEC>(p, stream); });
}

void launchRmsNorm(RmsNormParams const& p, void* stream) {
    if (p.rows == 0) return;
    auto s = static_cast<cudaStream_t>(stream);
    dispatchFloat(p.dtype, "rms_norm", [&](auto tag) {
        using T = decltype(tag);
        constexpr int V = kVec16<T>;
        // (codes: V bytes a pack, so out needs V-byte alignment; 16-byte alignment covers it)
        bool vec = p.hidden % V == 0 && aligned16(p.out) && aligned16(p.x) && aligned16(p.weight)
                   && p.xRowStride % V == 0 && p.outRowStride % V == 0;
        if (p.residual) {
            vec = vec && aligned16(p.residual) && aligned16(p.residualOut) && p.residualRowStride % V == 0
                  && p.residualOutRowStride % V == 0;
        }
        if (vec) {
            launch<T, V>(p, s);
        } else {
            launch<T, 1>(p, s);
        }
    });
}

} // namespace tensorrt_llm
