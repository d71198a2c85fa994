// What the host kernels (kernels/host_*.cpp) may use of the CPU: AVX2 + FMA code is compiled
// per function (TRTLLM_AVX2) and runs only where hostAvx2() says the CPU has both.
#pragma once

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define TRTLLM_HOST_AVX2 1
#define TRTLLM_AVX2 __attribute__((target("avx2,fma")))
#include <immintrin.h>
#else
#define TRTLLM_HOST_AVX2 0  // elsewhere (aarch64) the plain loops, or the ops keep PyTorch's kernels
#define TRTLLM_AVX2
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

} // namespace tensorrt_llm
