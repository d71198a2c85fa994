// SiLU-and-mul on the host CPU, float32: out = silu(x[:, :I]) * x[:, I:] with silu(g) =
// g / (1 + e^-g), a row at a time: the CPU engines' silu_and_mul (ops/activation.py), in every op
// that applies it on the CPU, fused with a linear or not, so that the builder's fusions keep a CPU
// engine's outputs bit for bit.
//
// Why ours: PyTorch's is two calls (silu, then mul into a third tensor), each 7-15 us of dispatch
// in a SmolLM2 decode step for a microsecond of arithmetic; this is one host call, which the
// step's tape replays among the host kernels around it (runtime/host_tape.py). e^-g takes AVX2's
// 8 lanes a step (expAvx2, host_simd.h), std::exp for a row's last few elements and on CPUs
// without AVX2: the two may differ in the last bit, each the same for an element wherever its row is.
#include "host_simd.h"
#include "tensorrt_llm/kernels.h"

#include <cmath>
#include <stdexcept>

namespace tensorrt_llm {

namespace {

inline float siluAndMul(float g, float u) { return g / (1.f + std::exp(-g)) * u; }

#if TRTLLM_HOST_AVX2
TRTLLM_AVX2 int64_t siluAndMulAvx2(float const* gate, float const* up, float* out, int64_t n) {
    __m256 const one = _mm256_set1_ps(1.f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 const g = _mm256_loadu_ps(gate + i);
        __m256 const e = expAvx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    return i;
}
#endif

} // namespace

void hostSiluAndMul(ActAndMulParams const& p) {
    if (p.dtype != DType::kFloat32 || p.act != Activation::kSilu || p.codeScale != nullptr) {
        throw std::invalid_argument("the host kernel takes float32 rows, SiLU, and writes no FP8 codes");
    }
    for (int64_t r = 0; r < p.rows; ++r) {
        float const* gate = static_cast<float const*>(p.x) + r * p.xRowStride;
        float const* up = gate + p.inter;
        float* out = static_cast<float*>(p.out) + r * p.outRowStride;
        int64_t i = 0;
#if TRTLLM_HOST_AVX2
        if (hostAvx2()) i = siluAndMulAvx2(gate, up, out, p.inter);
#endif
        for (; i < p.inter; ++i) out[i] = siluAndMul(gate[i], up[i]);
    }
}

} // namespace tensorrt_llm
