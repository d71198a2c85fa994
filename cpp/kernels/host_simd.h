// What the host kernels (kernels/host_*.cpp) may use of the CPU: AVX2 + FMA code is compiled
// per function (TRTLLM_AVX2) and runs only where hostAvx2() says the CPU has both; AVX-512 with
// its int8 dot products (VNNI) likewise (TRTLLM_AVX512_VNNI, hostAvx512Vnni()).
#pragma once

#include <cstdint>
#include <limits>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define TRTLLM_HOST_AVX2 1
#define TRTLLM_AVX2 __attribute__((target("avx2,fma")))
#define TRTLLM_AVX512_VNNI __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#include <immintrin.h>
#else
#define TRTLLM_HOST_AVX2 0  // elsewhere (aarch64) the plain loops, or the ops keep PyTorch's kernels
#define TRTLLM_AVX2
#define TRTLLM_AVX512_VNNI
#endif

namespace tensorrt_llm {

inline bool hostAvx2() {
#if TRTLLM_HOST_AVX2
    static bool const available = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return available;
#else
    return false;
#endif
}

inline bool hostAvx512Vnni() {
#if TRTLLM_HOST_AVX2
    static bool const available = hostAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                                  && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
                                  && __builtin_cpu_supports("avx512vnni");
    return available;
#else
    return false;
#endif
}

#if TRTLLM_HOST_AVX2
// The sum of v's 8 lanes.
TRTLLM_AVX2 inline float horizontalSum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// sum over i < n of a[i] * b[i]: 8 lanes of FMAs, their sum, then the tail in order.
TRTLLM_AVX2 inline float dotAvx2(float const* a, float const* b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float sum = horizontalSum(acc);
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

// e^x in 8 lanes, within 2 ulp of expf for x in [-87.3, 88.3]; 0 below (expf's denormals there
// are 0 here) and +inf above: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r keeps its
// bits), e^r by the Cephes polynomial, 2^n through the exponent's bits.
TRTLLM_AVX2 inline __m256 expAvx2(__m256 in) {
    __m256 const lo = _mm256_set1_ps(-87.3365f), hi = _mm256_set1_ps(88.3762f);
    __m256 const x = _mm256_min_ps(_mm256_max_ps(in, lo), hi);
    __m256 const n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    // n in [-126, 127] (the clamp's ends): 2^n is a normal float.
    __m256i const bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 const e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    __m256 const below = _mm256_andnot_ps(_mm256_cmp_ps(in, lo, _CMP_LT_OQ), e);
    return _mm256_blendv_ps(below, _mm256_set1_ps(std::numeric_limits<float>::infinity()), _mm256_cmp_ps(in, hi, _CMP_GT_OQ));
}
#endif

} // namespace tensorrt_llm
