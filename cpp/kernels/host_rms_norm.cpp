// RMSNorm on the host CPU, float32, one thread: out = x / sqrt(mean(x^2) + eps) * weight per row,
// of x + residual (written to residualOut) when a residual is given; the CUDA rms_norm's params.
//
// Why ours: PyTorch's CPU rms_norm is six operations (pow, mean, add, rsqrt, two muls), about
// 55 us a row of 576 on the 2-core machine, and a decode step of SmolLM2 runs 61 of them.
#include "tensorrt_llm/kernels.h"

#include <cmath>
#include <stdexcept>

namespace tensorrt_llm {

void hostRmsNorm(RmsNormParams const& p) {
    if (p.dtype != DType::kFloat32 || p.codeScale != nullptr) {
        throw std::invalid_argument("the host kernel takes float32 rows and writes no FP8 codes");
    }
    float const* weight = static_cast<float const*>(p.weight);
    for (int64_t r = 0; r < p.rows; ++r) {
        float const* x = static_cast<float const*>(p.x) + r * p.xRowStride;
        float* out = static_cast<float*>(p.out) + r * p.outRowStride;
        if (p.residual != nullptr) {  // the sum, once, then normalised from where it was written
            float const* residual = static_cast<float const*>(p.residual) + r * p.residualRowStride;
            float* sum = static_cast<float*>(p.residualOut) + r * p.residualOutRowStride;
            for (int64_t i = 0; i < p.hidden; ++i) sum[i] = x[i] + residual[i];
            x = sum;
        }
        double squares = 0.0;  // float64: the mean of squares exact enough for any hidden size
        for (int64_t i = 0; i < p.hidden; ++i) squares += static_cast<double>(x[i]) * x[i];
        float const inverse = 1.f / std::sqrt(static_cast<float>(squares / static_cast<double>(p.hidden)) + p.eps);
        for (int64_t i = 0; i < p.hidden; ++i) out[i] = x[i] * inverse * weight[i];
    }
}

} // namespace tensorrt_llm
