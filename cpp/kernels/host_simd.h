// What the host kernels (kernels/host_*.cpp) may use of the CPU: AVX2 + FMA code is compiled
// per function (TRTLLM_AVX2) and runs only where hostAvx2() says the CPU has both; AVX-512 with
// its int8 dot products (VNNI) likewise (TRTLLM_AVX512_VNNI, hostAvx512Vnni()).
#pragma once

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

} // namespace tensorrt_llm
