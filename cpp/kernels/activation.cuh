// The gated activations' nonlinearity, float32 in and out; shared by the kernels that apply it.
#pragma once

#include "tensorrt_llm/kernels.h"

#include <cuda_runtime.h>

namespace tensorrt_llm {

template <Activation A>
__device__ __forceinline__ float activate(float a) {
    if constexpr (A == Activation::kSilu) {
        return a / (1.f + expf(-a));
    } else if constexpr (A == Activation::kGelu) {
        return 0.5f * a * (1.f + erff(a * 0.70710678118654752f));
    } else {
        float const inner = 0.79788456080286536f * (a + 0.044715f * a * a * a);
        return 0.5f * a * (1.f + tanhf(inner));
    }
}

} // namespace tensorrt_llm
