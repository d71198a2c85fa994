// FP8 (E4M3) linear on the host CPU for decode rows, with AVX2 and FMA, W's rows split over
// `threads` threads (host_parallel.h): out = (x_codes @ W_codes^T) * input_scale * weight_scale
// + bias, x's codes already made by the caller (formats.quantize_fp8_activation, given here as
// their exact float32 values).
//
// Why ours: no CPU multiplies E4M3, and PyTorch's CPU paths for it were the bottleneck of an FP8
// engine there: fp8_linear's reference converts the whole weight to float32 on every call (12 ms
// for SmolLM2's 1536 x 576 gate_up on one thread of the 2-core AMD EPYC, against 0.4 ms for the
// same product from float32 weights; a decode step 0.68 s), and torch._scaled_mm's CPU kernel
// took 200 ms for that one product.
//
// Each code becomes the exact integer code * 2^9 in integer lanes (E4M3 normals (8 + m) << (e - 1),
// subnormals m, the sign applied after), converted to float32: no table, no denormal floats (a
// denormals-are-zero mode left by another library cannot change them), every value exact. The
// products with x's codes (4 significant bits each) are exact in float32; the sums are float32
// FMAs over 8 lanes, then 2^-9 and the two scales once per output. The one difference from
// formats.py's (x * s_x) @ (W * s_w)^T is where the scales' roundings fall. The NaN codes
// (0x7F, 0xFF), which quantize.py never writes, read as +-480 here.
#include "host_parallel.h"
#include "host_simd.h"
#include "tensorrt_llm/kernels.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tensorrt_llm {

namespace {

constexpr int kXRows = 4;              // rows of x a pass over W's rows serves (each code decoded once for them)
constexpr int kWRows = 2;              // rows of W a pass takes: kXRows x kWRows independent FMA chains
constexpr int64_t kRowsPerPart = 64;   // the least rows of W worth a thread
constexpr int64_t kSliceRows = 16;     // rows of W taken against every row of x before moving on (stay cached)
constexpr int64_t kStep = 8;           // inputs a step (one AVX2 register of floats)

#if TRTLLM_HOST_AVX2
// 8 E4M3 codes as the floats code * 2^9 (exact integers up to 245,760).
TRTLLM_AVX2 inline __m256 decode8(uint8_t const* codes) {
    __m256i const v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<__m128i const*>(codes)));
    __m256i const e = _mm256_and_si256(_mm256_srli_epi32(v, 3), _mm256_set1_epi32(15));
    __m256i const normal = _mm256_min_epi32(e, _mm256_set1_epi32(1));  // 1 where e >= 1
    __m256i const mantissa = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(7)), _mm256_slli_epi32(normal, 3));
    __m256i const magnitude = _mm256_sllv_epi32(mantissa, _mm256_sub_epi32(e, normal));
    // The code's sign bit on top of its lane: negative codes negated; zero codes are zero anyway.
    return _mm256_cvtepi32_ps(_mm256_sign_epi32(magnitude, _mm256_slli_epi32(v, 24)));
}

// R rows of W from row n against M rows of x (x[i], out[i]): out[i][n + r].
template <int R, int M>
TRTLLM_AVX2 void rows(HostFp8GemvParams const& p, float const* const* x, float* const* out, float const* inputScale,
                      int64_t n) {
    __m256 acc[M][R];
    for (int m = 0; m < M; ++m) {
        for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
    }
    uint8_t const* codes = p.qweight + n * p.k;
    for (int64_t k = 0; k < p.k; k += kStep) {
        __m256 w[R];
        for (int r = 0; r < R; ++r) w[r] = decode8(codes + r * p.k + k);
        for (int m = 0; m < M; ++m) {
            __m256 const xv = _mm256_loadu_ps(x[m] + k);
            for (int r = 0; r < R; ++r) acc[m][r] = _mm256_fmadd_ps(w[r], xv, acc[m][r]);
        }
    }
    for (int r = 0; r < R; ++r) {
        float const ws = p.weightScale[p.weightPerRow ? n + r : 0] * 0x1p-9f;  // exact: a power of two
        float const bias = p.bias ? p.bias[n + r] : 0.f;
        for (int m = 0; m < M; ++m) out[m][n + r] = std::fma(horizontalSum(acc[m][r]), ws * inputScale[m], bias);
    }
}

template <int M>
TRTLLM_AVX2 void rowRange(HostFp8GemvParams const& p, float const* const* x, float* const* out,
                          float const* inputScale, int64_t n, int64_t end) {
    for (; n + kWRows <= end; n += kWRows) rows<kWRows, M>(p, x, out, inputScale, n);
    for (; n < end; ++n) rows<1, M>(p, x, out, inputScale, n);
}
#endif

} // namespace

bool hostFp8GemvAvailable() { return hostAvx2(); }

bool hostFp8GemvServes(int64_t k) { return k > 0 && k % kStep == 0; }

void hostFp8Gemv(HostFp8GemvParams const& p) {
    if (!hostFp8GemvAvailable()) {
        throw std::runtime_error("host_fp8_gemv: this CPU has no AVX2 + FMA (use fp8_linear's reference)");
    }
#if TRTLLM_HOST_AVX2
    using RowRange = void (*)(HostFp8GemvParams const&, float const* const*, float* const*, float const*, int64_t,
                              int64_t);
    static constexpr RowRange kRanges[kXRows] = {rowRange<1>, rowRange<2>, rowRange<3>, rowRange<4>};
    hostParallelRows(p.n, p.threads, kRowsPerPart, kWRows, [&](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; n += kSliceRows) {
            int64_t const sliceEnd = std::min(end, n + kSliceRows);
            for (int64_t r = 0; r < p.m; r += kXRows) {
                int const count = static_cast<int>(std::min<int64_t>(kXRows, p.m - r));
                float const* x[kXRows];
                float* out[kXRows];
                float inputScale[kXRows];
                for (int i = 0; i < count; ++i) {
                    x[i] = p.x + (r + i) * p.xRowStride;
                    out[i] = p.out + (r + i) * p.outRowStride;
                    inputScale[i] = p.inputScale[p.inputPerRow ? r + i : 0];
                }
                kRanges[count - 1](p, x, out, inputScale, n, sliceEnd);
            }
        }
    });
#endif
}

} // namespace tensorrt_llm
