// FP8 E4M3 activation quantization in one pass over x (fp8_linear's cuBLASLt path, where
// several PyTorch kernels with a float32 intermediate took longer than the FP8 GEMM saved):
// codes = E4M3(x * (1 / scale)), the reciprocal correctly rounded in float32 and the product in
// float32, then cvt's satfinite rounding to nearest (ties to even) with the clamp to +-448:
// formats.quantize_fp8_activation bit for bit. The scale is static (input_scale) or per row: amax(|x|) / 448 (exact in x's dtype,
// then one float32 division), 1 for an all-zero row, written to rowScales. A block per row; the
// dynamic row is read twice (its second read hits L1 / L2).
#include "common.cuh"

namespace tensorrt_llm {
namespace {

constexpr int kQuantizeThreads = 256;
constexpr float kFp8Max = 448.f;

template <typename T, int V>
__global__ void __launch_bounds__(kQuantizeThreads)
    fp8QuantizeKernel(uint8_t* __restrict__ codes, float* __restrict__ rowScales, T const* __restrict__ x,
                      float const* __restrict__ inputScale, int64_t k, int64_t xRowStride) {
    waitForPreviousKernel();  // see launchKernel
    allowNextKernel();
    using XPack = Pack<T, V>;
    using CodePack = Pack<uint8_t, V>;
    XPack const* xr = reinterpret_cast<XPack const*>(x + blockIdx.x * xRowStride);
    CodePack* cr = reinterpret_cast<CodePack*>(codes + blockIdx.x * k);
    int64_t const packs = k / V;
    float scale;
    if (inputScale) {
        scale = *inputScale;
    } else {
        float amax = 0.f;
        for (int64_t i = threadIdx.x; i < packs; i += kQuantizeThreads) {
            XPack const p = xr[i];
#pragma unroll
            for (int j = 0; j < V; ++j) amax = fmaxf(amax, fabsf(toFloat(p.v[j])));
        }
        amax = blockReduce(amax, MaxOp{}, 0.f);
        scale = amax == 0.f ? 1.f : __fdiv_rn(amax, kFp8Max);
        if (threadIdx.x == 0) rowScales[blockIdx.x] = scale;
    }
    float const inverse = __frcp_rn(scale);
    for (int64_t i = threadIdx.x; i < packs; i += kQuantizeThreads) {
        XPack const p = xr[i];
        CodePack c;
#pragma unroll
        for (int j = 0; j < V; ++j) {
            c.v[j] = fp8Code(toFloat(p.v[j]), inverse);
        }
        cr[i] = c;
    }
}

} // namespace

void launchFp8Quantize(void* codes, void* rowScales, void const* x, void const* inputScale, int64_t m, int64_t k,
                       int64_t xRowStride, DType dtype, void* stream) {
    if (m == 0 || k == 0) return;
    auto const st = static_cast<cudaStream_t>(stream);
    dispatchFloat(dtype, "fp8_quantize", [&](auto t) {
        using T = decltype(t);
        constexpr int V = kVec16<T>;
        // 16-byte loads when every row starts on a 16-byte boundary (the codes' rows then too).
        bool const vec = aligned16(x) && (xRowStride * sizeof(T)) % 16 == 0 && k % V == 0;
        auto kernel = vec ? fp8QuantizeKernel<T, V> : fp8QuantizeKernel<T, 1>;
        launchKernel("fp8_quantize", kernel, static_cast<unsigned>(m), kQuantizeThreads, 0, st,
            static_cast<uint8_t*>(codes), static_cast<float*>(rowScales), static_cast<T const*>(x),
            static_cast<float const*>(inputScale), k, xRowStride);
    });
}

} // namespace tensorrt_llm
