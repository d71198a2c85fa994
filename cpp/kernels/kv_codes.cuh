// The 1-byte codes of a quantized KV cache (tensorrt_llm/quantization/formats.py): stored value
// = code * scale, one float32 scale for K and one for V per layer. A cache element type C is the
// activation type itself (no quantization), __nv_fp8_e4m3 (FP8 E4M3 bytes) or int8_t (INT8).
#pragma once

#include "common.cuh"

#include <cuda_fp8.h>

#include <type_traits>

namespace tensorrt_llm {

template <typename C>
constexpr bool kIsKvCode = std::is_same_v<C, __nv_fp8_e4m3> || std::is_same_v<C, int8_t>;

// The code of x under `scale`, as the reference quantizes: x / scale correctly rounded (not
// x * (1 / scale), which can round to another code), then FP8: clamped to +-448 and rounded to
// E4M3 (nearest even); INT8: rounded half to even, clamped to -127..127.
template <typename C>
__device__ __forceinline__ C encodeKv(float x, float scale);
template <>
__device__ __forceinline__ __nv_fp8_e4m3 encodeKv<__nv_fp8_e4m3>(float x, float scale) {
    return __nv_fp8_e4m3(fminf(fmaxf(__fdiv_rn(x, scale), -448.f), 448.f));
}
template <>
__device__ __forceinline__ int8_t encodeKv<int8_t>(float x, float scale) {
    return static_cast<int8_t>(fminf(fmaxf(rintf(__fdiv_rn(x, scale)), -127.f), 127.f));
}

// Four codes (the bytes of w, lowest first) as two half2 words, exactly: lo = (byte 0, byte 1),
// hi = (byte 2, byte 3), each half worth kvHalfUnit<C>() times the code's value.
//  FP8 on sm_89+: the hardware's pair conversion (cvt.rn.f16x2.e4m3x2), the code's value itself.
//  FP8 before sm_89: E4M3's sign, exponent and mantissa bits moved into a half's (s eeee mmm ->
//       s 0eeee mmm0000000): the same number with an exponent bias of 15 for 7, i.e. code * 2^-8,
//       subnormals included; three logic ops per pair. (At batch 32 x 2,080 positions on an H100
//       the conversion instead of the logic ops took the kernel from 72 to 64 us: the walk over
//       1-byte codes is bound by its instructions, not only by memory.)
//  INT8: code + 128 (as a byte) in the low mantissa bits of 1024.0h, minus 1152.0h.
// The two FP8 forms differ by a power of two, so a kernel's results are the same bits on either.
template <typename C>
__device__ __forceinline__ constexpr float kvHalfUnit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    return 1.f;
#else
    return std::is_same_v<C, __nv_fp8_e4m3> ? 1.f / 256.f : 1.f;
#endif
}

template <typename C>
__device__ __forceinline__ void kvCodesToHalf2(uint32_t w, uint32_t& lo, uint32_t& hi) {
    if constexpr (std::is_same_v<C, __nv_fp8_e4m3>) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
        asm("{ .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n cvt.rn.f16x2.e4m3x2 %1, b;\n }"
            : "=r"(lo), "=r"(hi)
            : "r"(w));
#else
        uint32_t const a = __byte_perm(w, 0u, 0x1404u);  // bytes 0, 1 in the high bytes of the halves
        uint32_t const b = __byte_perm(w, 0u, 0x3424u);  // bytes 2, 3
        lo = (a & 0x80008000u) | ((a & 0x7f007f00u) >> 1);
        hi = (b & 0x80008000u) | ((b & 0x7f007f00u) >> 1);
#endif
    } else {
        static_assert(std::is_same_v<C, int8_t>, "a KV code type");
        uint32_t const u = w ^ 0x80808080u;
        uint32_t a = __byte_perm(u, 0x64646464u, 0x4140u);
        uint32_t b = __byte_perm(u, 0x64646464u, 0x4342u);
        __half2 const bias = __half2half2(__ushort_as_half(0x6480u));  // 1152
        __half2 x = __hsub2(*reinterpret_cast<__half2*>(&a), bias);
        __half2 y = __hsub2(*reinterpret_cast<__half2*>(&b), bias);
        lo = *reinterpret_cast<uint32_t*>(&x);
        hi = *reinterpret_cast<uint32_t*>(&y);
    }
}

} // namespace tensorrt_llm
