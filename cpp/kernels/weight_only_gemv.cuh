// Weight-only INT8 / INT4 linear layers: y[M, N] = x[M, K] @ W^T (+ bias), W in the layouts of
// tensorrt_llm/quantization/formats.py (INT8 [N, K] with per-channel or group scales; INT4
// [N, K / 2], two codes a byte, with group scales and zeros), read as 16-byte packs of int32
// words (16 INT8 or 32 INT4 codes).
//
// The GEMV (decode, up to 32 rows of x per read of the weight, 16 for INT4; more rows loop over tiles).
// INT8 / INT4, up to 8 rows with float32 scales: the pipelined kernel (weightOnlyGemvPipelinedKernel,
// described above it), the codes streamed through shared memory; INT4 at one row takes two tiles of
// 16 rows at a time where n allows (its DUAL form, launchPipelinedGemv says why). Elsewhere:
// float16 / bfloat16 activations take the tensor-core kernel (weightOnlyGemvMmaKernel, described
// above it): x read straight from L1 / L2 (INT4 with at most 16 KB of x: from a copy in shared
// memory, SHARED_X), each lane's 16-byte packs
// of U k-steps (and their scales) loaded before any is used, codes turned into exact float16 /
// bfloat16 integers with magic-number ORs and one packed FMA per two codes, mma.sync summing
// the exact products in float32, the group's scale (and zero times the sum of x, from a second
// mma with A = ones) applied once per group and k-step in float32; 8 warps of a block split K
// and meet in shared memory. It replaced (2026-11-24) a kernel that staged x in shared memory
// as float32 and did a float FMA per code and row (8 bytes of x read from shared memory per byte
// of INT4 weight), which was not bound by the weight's bytes. H100, batch 1, fraction of the
// layer's bytes floor, previous -> this kernel: INT4 group 128 qkv 31.6 -> 40.0%, o 26.0 ->
// 37.8%, gate_up 52.6 -> 53.2%, down 31.5 -> 53.5%; INT8 per channel qkv 54.7 -> 61.4%, o
// 44.1 -> 61.6%, gate_up 85.2 -> 83.8%, down 52.5 -> 77.6%; 16 rows 0.1-0.25x -> 1.2-1.6x
// bfloat16's matmul.
// float32 activations (and x rows off 16-byte boundaries) still take that kernel
// (weightOnlyGemvKernel): a block stores its tile of x in shared memory as float32, then each
// warp owns whole output rows, a lane loads kUnroll packs of the row with their group's scale
// (and zero) before using any, turns the codes into floats in registers, and a warp reduction
// ends the row.
//
// FP8 (W8A8, E4M3, static input scale; launchFp8Gemv, fp8_linear's few-row path) is the same
// kernels with an FP8 flavour (their FP8 template flag; up to 8 rows the pipelined one), on INT8's
// [N, K] byte layout: weight bytes to float16 (every E4M3 value is exact there) by
// cvt.rn.f16x2.e4m3x2, x quantized as formats.quantize_fp8_activation does (float32 x /
// input_scale, correctly rounded; clamp to +-448 and round to nearest E4M3, cvt satfinite) and
// back to exact float16, mma.sync in float16 whatever x's dtype (the products of two E4M3 values
// are exact in float32), input_scale x weight_scale (per tensor or channel) once per output, then
// bias.
// Figures and commands (NVIDIA H100 80GB HBM3, `python benchmarks/bench_weight_only_gemv.py`,
// engines with bench_generation.py): benchmarks/README.md's weight-only section.
//
// In both, a group is applied once per group's part of the codes a lane (float32 kernel: a pack)
// or a k-step (tensor-core kernel) covers:
//     sum_k x_k (c_k * s + z) = s * sum_k x_k c_k + z * sum_k x_k.
// That is formats.py's W = code * scale + zero up to the float32 rounding of the sums (the
// reference rounds each W to float32 and sums in cuBLAS's order): both far below the
// output's float16 / bfloat16 rounding. Codes become floats without conversion instructions:
// OR-ing an 8-bit value u into the mantissa of 2^23 gives the float 2^23 + u exactly, and one
// subtraction leaves u (INT8 codes are offset by 128 first); likewise 1024 + u in float16 and
// 128 + u in bfloat16 (4-bit u).
//
// The dequantization (prompt steps, more rows than the GEMV serves): W in the activation dtype,
// W = code * scale + zero in float32 exactly as formats.py (two roundings, no fused
// multiply-add), rounded once to the dtype, for a tensor-core matmul by the caller.
#pragma once
#include "activation.cuh"
#include "common.cuh"

#include <cuda_fp8.h>

#include <algorithm>
#include <limits>
#include <type_traits>

namespace tensorrt_llm {

namespace weight_only_gemv_detail {

struct Params {
    void* out;
    void const* x;
    uint4 const* qweight;  // [n, numPacks] packs
    void const* scales;    // [n, groups]
    void const* zeros;     // [n, groups] (INT4) or nullptr
    void const* bias;      // [n] or nullptr
    int64_t m, n, k, xRowStride, outRowStride;
    int groups;            // scales per row (1: per channel)
    int groupShift;        // the pack's group is pack >> groupShift
    // FP8 (W8A8): scales is the float32 weight scale, [1] (scaleStride 0) or [n] (scaleStride 1);
    // inputScale the float32 static activation scale [1].
    float const* inputScale;
    int64_t scaleStride;
    // INT8 / INT4: the codes in tile order (packIndex) instead of row order.
    bool tiled;
    // Up to 8 rows (the pipelined kernel's GATED; n a multiple of 16): the weight's rows [0, n / 2)
    // are a gated MLP's gate and [n / 2, n) its up projection, and out [m, n / 2] is silu(gate) * up.
    bool gated;
    // The pipelined INT4 kernel's NORM (bfloat16 x): the RMSNorm in front (kernels.h's WeightOnlyNorm).
    bool normed;
    WeightOnlyNorm norm;
    // INT4 act-order (GPTQ desc_act), the pipelined INT4 kernel only: stored input j is x's input
    // perm[j] ([k], int64, each in [0, k): the caller checks), gathered as x is staged (from the
    // rows in shared memory, stageRawX). nullptr: x in stored order.
    int64_t const* perm;
};

} // namespace weight_only_gemv_detail

namespace {

using weight_only_gemv_detail::Params;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <int BITS>
constexpr int kCodes = 128 / BITS;  // codes per 16-byte pack

// A 16-byte shared-memory load (addr: a shared-memory address) where `pred`; elsewhere the
// registers keep whatever they held, with no instruction to zero them. For lanes whose values
// reach only the mma's columns of no row of x, which no tile's end stores or reads.
__device__ __forceinline__ uint4 loadSharedWhere(bool pred, uint32_t addr) {
    uint4 v;
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n @p ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "r"(addr), "r"(static_cast<int>(pred)));
    return v;
}
// 16-byte weight packs a lane has in flight: 128 codes (4 INT4 or 8 INT8 packs); half as many
// for tiles of 8 rows, whose accumulators take the registers (and which reuse each pack 8 times).
template <int BITS, int MT>
constexpr int kUnroll = 128 / kCodes<BITS> / (MT > 4 ? 2 : 1);
constexpr size_t kMaxSmem = 160 * 1024;    // x tile and pack sums; fits sm_80's 163 KB


__device__ __forceinline__ uint4 loadStreaming(uint4 const* ptr) {
    // Weights are read once per step: keep them from evicting what is reused (x, the KV cache).
    return __ldcs(ptr);
}

// Where pack `pack` of weight row `row` is, in 16-byte packs from qweight. Row order: row * numPacks +
// pack. Tile order (ops/quantized_linear.py's tile_codes; n a multiple of 16, numPacks of 4): the
// packs as [n / 16][numPacks / 4][2][8][4], i.e. (tile of 16 rows, k-step of 4 packs, half, row
// in the half, pack in the k-step): the 1 KB a warp of the tensor-core kernels reads for one tile
// and k-step (lane 4g + t: rows g and g + 8, pack t) is contiguous, and so is a tile's whole row
// block. Read in row order, a k-step is 16 pieces of 64 bytes, one per row, 2 KB to 28 KB apart.
__device__ __forceinline__ int64_t packIndex(Params const& p, int64_t row, int pack, int numPacks) {
    if (!p.tiled) return row * numPacks + pack;
    int64_t const tile = row >> 4;
    int const r = static_cast<int>(row & 15);
    return (((tile * (numPacks >> 2) + (pack >> 2)) * 2 + (r >> 3)) * 8 + (r & 7)) * 4 + (pack & 3);
}

// Inputs 4j .. 4j + 3 of a pack as exact floats (the codes; INT8 codes are signed).
template <int BITS>
__device__ __forceinline__ void unpack4(uint4 const& w, int j, float (&f)[4]) {
    uint32_t const words[4] = {w.x, w.y, w.z, w.w};
    if constexpr (BITS == 4) {
        // Word i holds inputs 8i .. 8i + 7 in nibbles 0 .. 7.
        uint32_t const word = words[j / 2] >> (16 * (j % 2));
#pragma unroll
        for (int e = 0; e < 4; ++e) f[e] = __uint_as_float(((word >> (4 * e)) & 0xFu) | 0x4B000000u) - 8388608.f;
    } else {
        // Word j holds inputs 4j .. 4j + 3 in bytes 0 .. 3; b ^ 0x80 = b + 128 as an unsigned byte.
        uint32_t const u = words[j] ^ 0x80808080u;
#pragma unroll
        for (int e = 0; e < 4; ++e) f[e] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440u + e)) - 8388736.f;
    }
}

// Shared memory of a tile: x as float4 chunks [MT][kCodes / 4][numPacks] (chunk j of pack p holds
// inputs kCodes * p + 4j .. + 3), then for INT4 the sum of x over each pack [MT][numPacks].
size_t smemBytes(int mt, int64_t k, int bits) {
    int64_t const perRow = k + (bits == 4 ? k / kCodes<4> : 0);
    return static_cast<size_t>(mt) * static_cast<size_t>(perRow) * sizeof(float);
}

template <typename T, int BITS, int MT>
__device__ __forceinline__ void loadTile(Params const& p, int64_t m0, float* xs, float* packSums) {
    constexpr int C = kCodes<BITS>;
    int const k = static_cast<int>(p.k);
    int const numPacks = k / C;
    T const* x = static_cast<T const*>(p.x);
    // kBatch loads in flight per thread before any store: the tile comes from L2, and one load at
    // a time would cost a latency per element.
    constexpr int kBatch = 8;
    for (int i0 = threadIdx.x; i0 < MT * k; i0 += kThreads * kBatch) {
        float v[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            int const i = i0 + b * kThreads;
            int const r = i / k;
            v[b] = i < MT * k && m0 + r < p.m ? toFloat(x[(m0 + r) * p.xRowStride + (i - r * k)]) : 0.f;
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            int const i = i0 + b * kThreads;
            int const r = i / k, col = i - r * k;
            int const pack = col / C, e = col % C;
            if (i < MT * k) xs[((r * (C / 4) + e / 4) * numPacks + pack) * 4 + e % 4] = v[b];
        }
    }
    if constexpr (BITS == 4) {
        __syncthreads();
        float4 const* xs4 = reinterpret_cast<float4 const*>(xs);
        for (int i = threadIdx.x; i < MT * numPacks; i += kThreads) {
            int const r = i / numPacks, pack = i - r * numPacks;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < C / 4; ++j) {
                float4 const v = xs4[(r * (C / 4) + j) * numPacks + pack];
                sum += (v.x + v.y) + (v.z + v.w);
            }
            packSums[i] = sum;
        }
    }
}

template <typename T, typename S, int BITS, int MT>
// Tiles of 8 rows need more than 128 registers: one block per SM is enough for them.
__global__ void __launch_bounds__(kThreads, MT == 8 ? 1 : 2) weightOnlyGemvKernel(Params p) {
    waitForPreviousKernel();  // see launchKernel
    allowNextKernel();
    constexpr int C = kCodes<BITS>;
    extern __shared__ __align__(16) unsigned char smem[];
    float* xs = reinterpret_cast<float*>(smem);
    float4 const* xs4 = reinterpret_cast<float4 const*>(smem);
    int const numPacks = static_cast<int>(p.k / C);
    float* packSums = xs + MT * p.k;
    int const lane = threadIdx.x % 32;
    S const* scales = static_cast<S const*>(p.scales);
    S const* zeros = static_cast<S const*>(p.zeros);
    int64_t const totalWarps = static_cast<int64_t>(gridDim.x) * kWarps;

    for (int64_t m0 = 0; m0 < p.m; m0 += MT) {
        if (m0 > 0) __syncthreads();  // every warp is done with the previous tile
        loadTile<T, BITS, MT>(p, m0, xs, packSums);
        __syncthreads();

        for (int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; n < p.n; n += totalWarps) {
            int64_t const groupRow = n * p.groups;
            float acc[MT];
#pragma unroll
            for (int r = 0; r < MT; ++r) acc[r] = 0.f;
            for (int pack0 = lane; pack0 < numPacks; pack0 += 32 * kUnroll<BITS, MT>) {
                constexpr int U = kUnroll<BITS, MT>;
                uint4 w[U];
                float s[U], z[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    int const pack = pack0 + u * 32;
                    if (pack < numPacks) {
                        w[u] = loadStreaming(p.qweight + packIndex(p, n, pack, numPacks));
                        int64_t const g = groupRow + (pack >> p.groupShift);
                        s[u] = toFloat(scales[g]);
                        if constexpr (BITS == 4) z[u] = toFloat(zeros[g]);
                    }
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    int const pack = pack0 + u * 32;
                    if (pack >= numPacks) break;
                    float dot[MT];
#pragma unroll
                    for (int r = 0; r < MT; ++r) dot[r] = 0.f;
#pragma unroll
                    for (int j = 0; j < C / 4; ++j) {
                        float f[4];
                        unpack4<BITS>(w[u], j, f);
#pragma unroll
                        for (int r = 0; r < MT; ++r) {
                            float4 const v = xs4[(r * (C / 4) + j) * numPacks + pack];
                            dot[r] += v.x * f[0];
                            dot[r] += v.y * f[1];
                            dot[r] += v.z * f[2];
                            dot[r] += v.w * f[3];
                        }
                    }
#pragma unroll
                    for (int r = 0; r < MT; ++r) {
                        acc[r] += s[u] * dot[r];
                        if constexpr (BITS == 4) acc[r] += z[u] * packSums[r * numPacks + pack];
                    }
                }
            }
            float const bias = p.bias ? toFloat(static_cast<T const*>(p.bias)[n]) : 0.f;
#pragma unroll
            for (int r = 0; r < MT; ++r) {
                float const sum = warpReduceSum(acc[r]);
                if (lane == 0 && m0 + r < p.m) {
                    static_cast<T*>(p.out)[(m0 + r) * p.outRowStride + n] = fromFloat<T>(sum + bias);
                }
            }
        }
    }
}

// Rows of x per weight read: M rounded up to a power of two, at most 8, as shared memory allows.
int tileRows(int64_t m, int64_t k, int bits) {
    int mt = m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : 8;
    while (mt > 1 && smemBytes(mt, k, bits) > kMaxSmem) mt /= 2;
    return mt;
}

template <typename T, typename S, int BITS, int MT>
void launchGemvInstance(Params const& p, cudaStream_t stream) {
    auto kernel = weightOnlyGemvKernel<T, S, BITS, MT>;
    size_t const smem = smemBytes(MT, p.k, BITS);
    if (smem > 48 * 1024) {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    }
    unsigned const blocks = rowPerWarpBlocks(kernel, kThreads, smem, p.n);
    launchKernel("weight_only_gemv", kernel, blocks, kThreads, smem, stream, p);
}

template <typename T, typename S, int BITS>
void launchGemvTile(Params const& p, cudaStream_t stream) {
    switch (tileRows(p.m, p.k, BITS)) {
        case 1: launchGemvInstance<T, S, BITS, 1>(p, stream); break;
        case 2: launchGemvInstance<T, S, BITS, 2>(p, stream); break;
        case 4: launchGemvInstance<T, S, BITS, 4>(p, stream); break;
        default: launchGemvInstance<T, S, BITS, 8>(p, stream); break;
    }
}

// ---- The tensor-core GEMV (float16 / bfloat16 activations) ----
// A block owns 16 output features and its 8 warps split K: a k-step is 4 consecutive packs of
// each of the 16 rows (128 INT4 / 64 INT8 codes), warp w takes k-steps w, w + 8, ... Lane
// (g, t) = (lane / 4, lane % 4) loads pack 4 * step + t of rows g and g + 8, U k-steps at once
// before using any, with their scales (and zeros). The codes become exact small integers in x's
// dtype (magic-number ORs and one fused multiply-add per two codes), they are mma.sync's A
// (16 rows x 16 inputs), and x, read straight from global memory (L1 / L2: no shared-memory
// prologue) is B (16 inputs x 8 rows of x), in the same order of inputs. The tensor core sums
// the exact products in float32; a second mma with A = ones gives the sum of x over the same
// inputs, so that each k-step's group (a k-step lies in one group when a group is 4 packs or
// more) is applied once in float32: acc += s * sum(x c) + z * sum(x). Groups of 1 or 2 packs
// mask B by group instead (one pass per group of the k-step). The warps' sums meet in shared
// memory at the end. Up to 32 rows of x per read of the weight for byte codes (four mma n-tiles),
// 16 for INT4 (two).
constexpr int kMmaWarps = 8;
constexpr int kMmaRows = 16;  // output features per block
// x a block stages (SHARED_X): more (down's 28 KB, 8 rows) delays the first k-step by more than
// it saves. Within the 48 KB of dynamic shared memory a launch gets without opting in.
constexpr size_t kMaxSharedX = 16 * 1024;
static_assert(kMaxSharedX <= 48 * 1024, "SHARED_X beyond 48 KB needs cudaFuncAttributeMaxDynamicSharedMemorySize");

template <typename T>
struct MmaTraits;
template <>
struct MmaTraits<__half> {
    static constexpr uint32_t kOne = 0x3C003C00u;       // 1, 1
    static constexpr uint32_t kMagic4 = 0x64006400u;    // 1024, 1024: | nibble = 1024 + code
    static constexpr uint32_t kNegMagic4 = 0xE400E400u; // -1024, -1024
    static constexpr float kOffset4 = 1024.f;
};
template <>
struct MmaTraits<__nv_bfloat16> {
    static constexpr uint32_t kOne = 0x3F803F80u;
    static constexpr uint32_t kMagic4 = 0x43004300u;    // 128, 128: | nibble = 128 + code
    static constexpr uint32_t kNegMagic4 = 0xC300C300u; // -128, -128
    static constexpr float kOffset4 = 128.f;
};

// a * b + c on two halves of T (exact here: small integers).
template <typename T>
__device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    if constexpr (std::is_same_v<T, __half>) {
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    } else {
        asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    }
    return d;
}

// d += A (16 x 16, row) * B (16 x 8, col), float32 accumulators.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    if constexpr (std::is_same_v<T, __half>) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

__device__ __forceinline__ uint32_t word(uint4 const& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// INT4 pair P (as codePair below) as kOffset4 + code, two exact values of T: the magic number's
// mantissa ORed with the nibbles, one instruction short of the codes themselves.
template <typename T>
__device__ __forceinline__ uint32_t biasedCodePair4(uint4 const& w, int pair) {
    uint32_t d;  // (w >> 4e) & 0x000F000F | magic in one lop3 (the compiler made it two)
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;"
        : "=r"(d)
        : "r"(word(w, pair / 4) >> (4 * (pair % 4))), "n"(0x000F000F), "r"(MmaTraits<T>::kMagic4));
    return d;
}

// Pair P of a pack's codes as two exact values of T (low half, high half): INT4 pair 4j + e holds
// codes 8j + e and 8j + e + 4 (nibbles e and e + 4 of word j); INT8 pair P codes 2P and 2P + 1.
// FP8: bytes 2P and 2P + 1 (E4M3) as float16 (T is then __half: every E4M3 value is exact in
// float16), one cvt.rn.f16x2.e4m3x2 on sm_89+.
template <typename T, int BITS, bool FP8 = false>
__device__ __forceinline__ uint32_t codePair(uint4 const& w, int pair) {
    using Tr = MmaTraits<T>;
    if constexpr (FP8) {
        static_assert(std::is_same_v<T, __half> && BITS == 8, "FP8 codes go to float16");
        __half2_raw const h = __nv_cvt_fp8x2_to_halfraw2(
            static_cast<__nv_fp8x2_storage_t>(word(w, pair / 2) >> (16 * (pair % 2))), __NV_E4M3);
        return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
    } else if constexpr (BITS == 4) {
        return fma2<T>(biasedCodePair4<T>(w, pair), Tr::kOne, Tr::kNegMagic4);
    } else {
        uint32_t const u = word(w, pair / 2) ^ 0x80808080u;  // code + 128 as unsigned bytes
        int const h = pair % 2;
        if constexpr (std::is_same_v<T, __half>) {
            // 0x64 | byte = 1024 + code + 128; minus 1152 (0x6480).
            return fma2<T>(__byte_perm(u, 0x64646464u, h ? 0x4342u : 0x4140u), Tr::kOne, 0xE480E480u);
        } else {
            // bfloat16 has 8 significant bits: through float32 (2^23 + byte), exact, then packed.
            float const f0 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440u + 2 * h)) - 8388736.f;
            float const f1 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441u + 2 * h)) - 8388736.f;
            __nv_bfloat162 const b = __floats2bfloat162_rn(f0, f1);
            return *reinterpret_cast<uint32_t const*>(&b);
        }
    }
}

// The x values of codePair's pair (xs: the pack's inputs of one row of x, 8 per uint4).
template <int BITS>
__device__ __forceinline__ uint32_t xPair(uint4 const (&xs)[16 / BITS], int pair) {
    if constexpr (BITS == 4) {
        uint4 const& v = xs[pair / 4];
        int const e = pair % 4;
        uint32_t const lo = e < 2 ? v.x : v.y, hi = e < 2 ? v.z : v.w;
        return __byte_perm(lo, hi, e % 2 ? 0x7632u : 0x5410u);
    } else {
        return word(xs[pair / 4], pair % 4);
    }
}

// FP8: one row's 8 x values of a uint4 (T) quantized as formats.quantize_fp8_activation does it
// (float32 x times inverseScale, input_scale's correctly rounded reciprocal: a multiply, where a
// division per element made the kernel bound by arithmetic; clamp to +-448 and round to nearest
// E4M3: cvt's satfinite does both), each code back as its exact float16, in the same places:
// word j holds the codes of inputs 2j, 2j + 1.
template <typename T>
__device__ __forceinline__ void quantizeX(uint4& v, float inverseScale) {
    uint32_t* words = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        Pack<T, 2> const pair = *reinterpret_cast<Pack<T, 2> const*>(&words[j]);
        float2 const f =
            make_float2(__fmul_rn(toFloat(pair.v[0]), inverseScale), __fmul_rn(toFloat(pair.v[1]), inverseScale));
        __half2_raw const h = __nv_cvt_fp8x2_to_halfraw2(__nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3),
                                                         __NV_E4M3);
        words[j] = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
    }
}

// FP8: the codes of both operands, exact in float16; their products are exact in float32 and
// the scales come once, at the end: the sums go straight into acc.
template <int NT>
__device__ __forceinline__ void mmaStepFp8(uint4 const& wa, uint4 const& wb, uint4 const (&xs)[NT][2],
                                           float (&acc)[NT][4]) {
#pragma unroll
    for (int i = 0; i < kCodes<8> / 4; ++i) {
        uint32_t const a0 = codePair<__half, 8, true>(wa, 2 * i), a1 = codePair<__half, 8, true>(wb, 2 * i);
        uint32_t const a2 = codePair<__half, 8, true>(wa, 2 * i + 1);
        uint32_t const a3 = codePair<__half, 8, true>(wb, 2 * i + 1);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            mma16816<__half>(acc[nt], a0, a1, a2, a3, xPair<8>(xs[nt], 2 * i), xPair<8>(xs[nt], 2 * i + 1));
        }
    }
}

template <typename T, typename S, int BITS, int NT, bool MASKED>
__device__ __forceinline__ void mmaStep(uint4 const& wa, uint4 const& wb, uint4 const (&xs)[NT][16 / BITS], float sa,
                                        float sb, float za, float zb, int q, int groupShift, float (&acc)[NT][4]) {
    constexpr int kPairs = kCodes<BITS> / 2;
    int const lane = threadIdx.x % 32;
    bool const mine = !MASKED || ((lane % 4) >> groupShift) == q;
    if constexpr (MASKED) {
        int const src = (lane & ~3) | (q << groupShift);  // a lane of the group's packs
        sa = __shfl_sync(0xffffffffu, sa, src);
        sb = __shfl_sync(0xffffffffu, sb, src);
        za = __shfl_sync(0xffffffffu, za, src);
        zb = __shfl_sync(0xffffffffu, zb, src);
    }
    float d[NT][4], xsum[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) d[nt][e] = xsum[nt][e] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < kPairs / 2; ++i) {
        uint32_t const a0 = codePair<T, BITS>(wa, 2 * i), a1 = codePair<T, BITS>(wb, 2 * i);
        uint32_t const a2 = codePair<T, BITS>(wa, 2 * i + 1), a3 = codePair<T, BITS>(wb, 2 * i + 1);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            uint32_t const b0 = mine ? xPair<BITS>(xs[nt], 2 * i) : 0u;
            uint32_t const b1 = mine ? xPair<BITS>(xs[nt], 2 * i + 1) : 0u;
            mma16816<T>(d[nt], a0, a1, a2, a3, b0, b1);
            if constexpr (BITS == 4) {
                constexpr uint32_t one = MmaTraits<T>::kOne;
                mma16816<T>(xsum[nt], one, one, one, one, b0, b1);
            }
        }
    }
    // d[nt]: rows g, g, g + 8, g + 8 of the block; columns (rows of x) 2t, 2t + 1, 2t, 2t + 1.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        acc[nt][0] += sa * d[nt][0];
        acc[nt][1] += sa * d[nt][1];
        acc[nt][2] += sb * d[nt][2];
        acc[nt][3] += sb * d[nt][3];
        if constexpr (BITS == 4) {
            acc[nt][0] += za * xsum[nt][0];
            acc[nt][1] += za * xsum[nt][1];
            acc[nt][2] += zb * xsum[nt][2];
            acc[nt][3] += zb * xsum[nt][3];
        }
    }
}

// 16 bytes global -> shared without registers (sm_80+), and the wait for all of a thread's copies.
__device__ __forceinline__ void copyAsync16(void* dst, void const* src) {
    uint32_t const d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void copyAsyncWaitAll() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// The same with zeros in place of the bytes when !valid (src then unread); the end of a group of
// copies, and the wait until at most N of a thread's groups are still in flight.
// dst: a shared-memory address (__cvta_generic_to_shared), which a loop can advance by additions.
// `.L2::128B`: a miss brings the whole 128-byte line into L2, not just the sectors asked for. In
// row order a warp's k-step asks for 64 bytes of each of 16 rows, and the other half of each line
// is the next warp's k-step: without the hint those halves were fetched from DRAM apart. H200,
// FP8 (row order), 1 row, us, without / with: gate_up 33.3 / 31.1, down 17.6 / 16.5, qkv 8.35 /
// 8.07 (tile order: 30.2, 16.1, 7.89); the FP8 8B engine's batch-1 step 2.874 / 2.746 ms (medians
// of six). Tile order, whose k-step is one 1 KB run, is unchanged (INT4 / INT8, within 0.1 us).
__device__ __forceinline__ void copyAsync16Or0(uint32_t dst, void const* src, bool valid) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void copyAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void copyAsyncWait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// x's p.m rows to shared memory ([p.m][k], contiguous), every thread of a block of kMmaWarps
// warps copying some of their 16-byte packs (cp.async: the caller waits).
template <typename T>
__device__ __forceinline__ void copyXToShared(Params const& p, T* xShared) {
    int const vecs = static_cast<int>(p.k / 8);  // 16-byte packs of a row (8 values of T)
    for (int i = threadIdx.x; i < p.m * vecs; i += kMmaWarps * 32) {
        int const r = i / vecs, v = i - r * vecs;
        copyAsync16(xShared + r * p.k + v * 8, static_cast<T const*>(p.x) + r * p.xRowStride + v * 8);
    }
}

// x of k-step `step` for lane (g, t): pack 4 * step + t of rows g (+ 8 nt) of x; zeros outside.
// x is p.x, or with SHARED its rows' copy in shared memory ([p.m][k], SHARED_X).
template <typename T, int BITS, int NT, bool SHARED = false>
__device__ __forceinline__ void loadX(Params const& p, T const* x, int step, int numPacks,
                                      uint4 (&xs)[NT][16 / BITS]) {
    constexpr int C = kCodes<BITS>;
    int64_t const rowStride = SHARED ? p.k : p.xRowStride;
    int const lane = threadIdx.x % 32;
    int const pack = 4 * step + lane % 4;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        int const m = nt * 8 + lane / 4;
        bool const ok = pack < numPacks && m < p.m;
        uint4 const* src = reinterpret_cast<uint4 const*>(x + m * rowStride + static_cast<int64_t>(pack) * C);
#pragma unroll
        for (int j = 0; j < 16 / BITS; ++j) {
            xs[nt][j] = !ok ? make_uint4(0, 0, 0, 0) : SHARED ? src[j] : __ldg(src + j);
        }
    }
}

// The end of a tile of 16 output features, every thread of the block: the warps' sums (acc, lane
// (g, t) of each mma n-tile) meet in red, then each output is their sum (FP8: times input_scale x
// weight_scale), plus bias, rounded to T. Leaves red to be read: the caller syncs before the
// next tile writes it.
// NORM's inverse RMS of row m (< p.m) from sqSum (pairXForWarp; every warp's sums visible: after a
// block barrier), the k-steps' sums added in order, so every block gets the same value.
__device__ __forceinline__ float normScale(Params const& p, float const* sqSum, int kSteps, int m) {
    float sum = 0.f;
    for (int step = 0; step < kSteps; ++step) sum += sqSum[step * 8 + m];
    return rsqrtf(sum / static_cast<float>(p.k) + p.norm.eps);
}

// A tile's end in two halves, a block barrier between them (storeTile): each warp's sums into red,
// then the reduction; DUAL tiles write both halves' sums before one barrier.
template <int NT>
__device__ __forceinline__ void writeTileSums(float (&red)[kMmaWarps][NT * 8][kMmaRows], float const (&acc)[NT][4]) {
    int const lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        red[warp][nt * 8 + 2 * t][g] = acc[nt][0];
        red[warp][nt * 8 + 2 * t + 1][g] = acc[nt][1];
        red[warp][nt * 8 + 2 * t][g + 8] = acc[nt][2];
        red[warp][nt * 8 + 2 * t + 1][g + 8] = acc[nt][3];
    }
}

// NORM: each sum times its row's inverse RMS (normScale of sqSum's kSteps; worked out on the
// block's first tile into `inv`, which starts negative, and kept).
template <typename T, bool FP8, int NT, bool NORM = false>
__device__ __forceinline__ void reduceTile(Params const& p, float const (&red)[kMmaWarps][NT * 8][kMmaRows], int64_t n0,
                                           float inputScale, float const* sqSum, int kSteps, float* inv) {
    int const r = threadIdx.x % kMmaRows;
    int64_t const n = n0 + r;
    for (int m = threadIdx.x / kMmaRows; m < p.m && m < NT * 8 && n < p.n; m += kMmaWarps * 32 / kMmaRows) {
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < kMmaWarps; ++w) sum += red[w][m][r];
        if constexpr (NORM) {
            if (*inv < 0.f) *inv = normScale(p, sqSum, kSteps, m);
            sum *= *inv;
        }
        if constexpr (FP8) sum *= inputScale * static_cast<float const*>(p.scales)[n * p.scaleStride];
        if (p.bias) sum += toFloat(static_cast<T const*>(p.bias)[n]);
        static_cast<T*>(p.out)[m * p.outRowStride + n] = fromFloat<T>(sum);
    }
}

template <typename T, bool FP8, int NT, bool NORM = false>
__device__ __forceinline__ void storeTile(Params const& p, float (&red)[kMmaWarps][NT * 8][kMmaRows],
                                          float const (&acc)[NT][4], int64_t n0, float inputScale,
                                          float const* sqSum = nullptr, int kSteps = 0, float* inv = nullptr) {
    writeTileSums<NT>(red, acc);
    __syncthreads();
    reduceTile<T, FP8, NT, NORM>(p, red, n0, inputScale, sqSum, kSteps, inv);
}

// GATED's end of a tile: its rows 0..7 are the gate rows base .. base + 7 and its rows 8..15
// the up rows n / 2 + base .. (issued so by the kernel's rowOf). Each output is reduced, scaled
// and rounded as reduceTile does (after writeTileSums and a block barrier), and output feature
// base + r is silu(gate) * up of the rounded pair, as act_and_mul computes it: the same bits as
// the linear, then the activation kernel.
template <typename T, bool FP8, bool NORM = false>
__device__ __forceinline__ void reduceGatedTile(Params const& p, float const (&red)[kMmaWarps][8][kMmaRows],
                                                int64_t base, float inputScale, float const* sqSum, int kSteps,
                                                float* inv) {
    // Thread (m, r) of the block's 16 x 16: x row m, tile row r. Every thread takes part in the
    // shuffle; rows of x past 7 compute row 7's sums and store nothing.
    static_assert(kMmaWarps * 32 == 16 * kMmaRows, "one thread per x row (of 16) and tile row");
    int const r = threadIdx.x % kMmaRows, m = threadIdx.x / kMmaRows;
    int const mr = m < 8 ? m : 7;
    int64_t const n = r < 8 ? base + r : p.n / 2 + base + r - 8;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) sum += red[w][mr][r];
    if constexpr (NORM) {
        if (*inv < 0.f) *inv = normScale(p, sqSum, kSteps, mr < p.m ? mr : 0);
        sum *= *inv;
    }
    if constexpr (FP8) sum *= inputScale * static_cast<float const*>(p.scales)[n * p.scaleStride];
    if (p.bias) sum += toFloat(static_cast<T const*>(p.bias)[n]);
    float const v = toFloat(fromFloat<T>(sum));
    float const up = __shfl_down_sync(0xffffffffu, v, 8);  // thread (m, r + 8): the up row of feature base + r
    if (r < 8 && m < p.m) {
        static_cast<T*>(p.out)[m * p.outRowStride + base + r] = fromFloat<T>(activate<Activation::kSilu>(v) * up);
    }
}

// MASKED: groups of 1 or 2 packs (a k-step spans several groups); its own instance, as the masked
// passes take registers the plain one needs for its loads.
// FP8: W8A8 E4M3 (BITS 8, S float): weight bytes to float16 codes, x quantized in registers
// (quantizeX), mma.sync in float16 whatever x's dtype, input_scale x weight_scale once per output.
// ONE_WAVE (FP8, one n-tile): 3 blocks an SM at U = 3 (72 registers) instead of 2 at U = 4, for
// grids of 2-3 blocks per multiprocessor (qkv's 384 blocks on 132 SMs), which then run as one
// wave instead of 1.45. Other grids keep U = 4: o and down (256 blocks) have 2 blocks an SM
// either way, and U = 3 only left fewer bytes in flight. H100, batch 1, 3 blocks for every grid
// -> this choice: qkv 12.43 -> 12.16 us, o 11.70 -> 9.67, down 33.92 -> 25.21; the engine's
// step 4.08 ms, 0.770 of its floor (was 0.708-0.782 on four machines). INT8 at 3 blocks: no
// faster on qkv (14.13 -> 13.97 us), slower over the step before (4.22 -> 4.36 ms): it keeps 2.
// SHARED_X (INT4, one n-tile): the block copies x's rows to shared memory (cp.async, under the
// first weight loads) and each k-step reads its x there when it uses it, instead of holding two
// k-steps of x in registers (32 a lane, mostly zeros at batch 1): the registers go to one more
// k-step of codes in flight (U = 4). H100 batch 1, INT4 group 128, before -> after: qkv 11.24 ->
// 10.80 us, o 7.66 -> 6.76, gate_up 40.47 -> 38.50; engine step 3.586 -> 3.473 ms (0.577 -> 0.589
// of its floor; different machines). down (28 KB of x) and 8 rows (64 KB) were slower staged.
template <typename T, typename S, int BITS, int NT, bool MASKED, bool FP8 = false, bool ONE_WAVE = false,
          bool SHARED_X = false>
__global__ void __launch_bounds__(kMmaWarps * 32, ONE_WAVE ? 3 : 2) weightOnlyGemvMmaKernel(Params p) {
    int const numPacks = static_cast<int>(p.k / kCodes<BITS>);
    int64_t const firstRow = static_cast<int64_t>(blockIdx.x) * kMmaRows;
    // The block's (first) weight rows (contiguous) towards L2 while the previous kernel ends.
    if (threadIdx.x == 0) prefetchRowsToL2(p.qweight, firstRow, kMmaRows, p.n, numPacks * int64_t{sizeof(uint4)});
    waitForPreviousKernel();
    allowNextKernel();  // see launchKernel: after the wait
    constexpr int XW = 16 / BITS;     // uint4 of x per pack per row of x
    // k-steps in flight per warp (16 INT8 / 32 INT4 weight bytes a k-step per lane), within 128 registers
    constexpr int U = BITS == 8 ? (NT == 1 ? (ONE_WAVE ? 3 : 4) : NT == 2 ? 2 : 1)
                                : NT == 1 ? (MASKED ? 2 : SHARED_X ? 4 : 3) : 1;
    static_assert(!SHARED_X || (BITS == 4 && NT == 1), "SHARED_X: INT4, one n-tile");
    extern __shared__ __align__(16) unsigned char sharedX[];
    T* xShared = reinterpret_cast<T*>(sharedX);  // [p.m][k] (SHARED_X)
    if constexpr (SHARED_X) copyXToShared(p, xShared);
    bool xPending = SHARED_X;  // until this thread has waited for the copies and the block met
    static_assert(BITS == 8 || NT <= 2, "INT4 tiles of 32 rows: x alone would take 64 registers");
    static_assert(!ONE_WAVE || (FP8 && NT == 1), "ONE_WAVE: FP8, one n-tile");
    __shared__ float red[kMmaWarps][NT * 8][kMmaRows];
    int const lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    int const kSteps = (numPacks + 3) / 4;
    S const* scales = static_cast<S const*>(p.scales);
    S const* zeros = static_cast<S const*>(p.zeros);
    float const inputScale = FP8 ? *p.inputScale : 0.f;
    float const inverseScale = FP8 ? __frcp_rn(inputScale) : 0.f;

    // LOOP: a grid of the blocks that fit at once, each looping over tiles of 16 output features
    // (launchGemvMmaTile), so what a block does once (staging x) is done once per block, and a
    // layer of many tiles launches no further waves of blocks; else one tile per block.
    // H100 batch 1, one tile a block -> LOOP: FP8 gate_up 52.0 -> 46.1 us, INT4 gate_up 40.0 -> 36.3; INT8
    // was slower (qkv, 384 tiles on 264 blocks, 13.7 -> 16.0; down 27.3 -> 28.9) and keeps a tile a block.
    constexpr bool LOOP = SHARED_X || (FP8 && NT == 1 && !ONE_WAVE);
    int64_t const tileStride = int64_t{gridDim.x} * kMmaRows;
    for (int64_t n0 = firstRow; n0 < p.n; n0 = LOOP ? n0 + tileStride : p.n) {
        int64_t const rowA = n0 + g, rowB = n0 + g + 8;
        bool const okA = rowA < p.n, okB = rowB < p.n;

        float acc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
        }

        for (int step0 = warp; step0 < kSteps; step0 += kMmaWarps * U) {
            uint4 wa[U], wb[U];
            float sa[U], sb[U], za[U], zb[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                int const pack = 4 * (step0 + u * kMmaWarps) + t;
                bool const in = pack < numPacks;
                wa[u] = in && okA ? loadStreaming(p.qweight + packIndex(p, rowA, pack, numPacks)) : make_uint4(0, 0, 0, 0);
                wb[u] = in && okB ? loadStreaming(p.qweight + packIndex(p, rowB, pack, numPacks)) : make_uint4(0, 0, 0, 0);
                // The k-step's group (every lane the same; masked: the group of the lane's own pack, which
                // the lanes of each group read from its first lane).
                if constexpr (FP8) continue;  // scales once per output, at the end
                int const scalePack = MASKED ? pack : 4 * (step0 + u * kMmaWarps);
                bool const sIn = scalePack < numPacks;
                int const group = scalePack >> p.groupShift;
                sa[u] = sIn && okA ? toFloat(scales[rowA * p.groups + group]) : 0.f;
                sb[u] = sIn && okB ? toFloat(scales[rowB * p.groups + group]) : 0.f;
                if constexpr (BITS == 4) {
                    za[u] = sIn && okA ? toFloat(zeros[rowA * p.groups + group]) : 0.f;
                    zb[u] = sIn && okB ? toFloat(zeros[rowB * p.groups + group]) : 0.f;
                } else {
                    za[u] = zb[u] = 0.f;
                }
            }
            if constexpr (SHARED_X) {
                if (xPending) {  // the first k-steps' codes are on their way
                    copyAsyncWaitAll();
                    __syncthreads();
                    xPending = false;
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    int const step = step0 + u * kMmaWarps;
                    if (step >= kSteps) break;  // the same for the whole warp
                    uint4 xs[NT][XW];
                    loadX<T, BITS, NT, true>(p, xShared, step, numPacks, xs);
                    if constexpr (!MASKED) {
                        mmaStep<T, S, BITS, NT, false>(wa[u], wb[u], xs, sa[u], sb[u], za[u], zb[u], 0, 0, acc);
                    } else {
                        int const groupsPerStep = 4 >> p.groupShift;
                        for (int q = 0; q < groupsPerStep; ++q) {
                            mmaStep<T, S, BITS, NT, true>(wa[u], wb[u], xs, sa[u], sb[u], za[u], zb[u], q, p.groupShift,
                                                          acc);
                        }
                    }
                }
                continue;
            }
            uint4 xs[2][NT][XW];
            loadX<T, BITS, NT>(p, static_cast<T const*>(p.x), step0, numPacks, xs[0]);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                int const step = step0 + u * kMmaWarps;
                if (step >= kSteps) break;  // the same for the whole warp
                if (u + 1 < U) {
                    loadX<T, BITS, NT>(p, static_cast<T const*>(p.x), step + kMmaWarps, numPacks, xs[(u + 1) % 2]);
                }
                if constexpr (FP8) {
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                        for (int j = 0; j < XW; ++j) quantizeX<T>(xs[u % 2][nt][j], inverseScale);
                    }
                    mmaStepFp8<NT>(wa[u], wb[u], xs[u % 2], acc);
                } else if constexpr (!MASKED) {
                    mmaStep<T, S, BITS, NT, false>(wa[u], wb[u], xs[u % 2], sa[u], sb[u], za[u], zb[u], 0, 0, acc);
                } else {
                    int const groupsPerStep = 4 >> p.groupShift;
                    for (int q = 0; q < groupsPerStep; ++q) {
                        mmaStep<T, S, BITS, NT, true>(wa[u], wb[u], xs[u % 2], sa[u], sb[u], za[u], zb[u], q,
                                                      p.groupShift, acc);
                    }
                }
            }
        }

        if (xPending) {  // a warp with no k-step still meets the block (SHARED_X)
            copyAsyncWaitAll();
            __syncthreads();
        }
        storeTile<T, FP8, NT>(p, red, acc, n0, inputScale);
        if (LOOP && n0 + tileStride < p.n) __syncthreads();  // red is read before the next tile writes it
    }
}

// ---- The pipelined GEMV (up to 8 rows of x, float32 scales) ----
// The kernel above loads U k-steps of codes into registers, waits for them, uses them, and only
// then loads the next ones: a warp has bytes in flight for part of its time, and at K = 4,096
// (4 k-steps a warp) a tile of 16 features waits a whole DRAM latency. Here each warp streams
// its k-steps, across the block's tiles, through a ring of STAGES slots of shared memory
// (cp.async: no registers held while the bytes travel), keeping STAGES - 1 k-steps of codes in
// flight while it computes one. The first slots are filled before waitForPreviousKernel (codes
// are no kernel's output); x's rows are copied to shared memory once per block (INT4: the parts
// each warp reads, by that warp: pairXForWarp); the grid is the
// blocks that fit at once, each looping over tiles of 16 features. INT8's scales are read where
// they are used, from L1: a tile ahead, the block asks for its next tile's scale lines (per
// channel: read once per tile). In the ring they cost more than they saved: 16 rows' scale and
// zero are 32 cache lines a k-step, and INT4 gate_up took 52 us, bound by L1 (80% busy). INT4's
// (STAGED, since 2026-12-01): a tile ahead, the whole block copies the next tile's 16 scale and
// 16 zero rows into shared memory (16-byte cp.async, each row's lines whole, joining a k-step's
// group of copies), and a k-step reads them there, one wavefront a load where each L1 load had
// touched 8 rows' lines. The INT4 g128 8B engine's batch-1 graph on an H200, one engine captured
// both ways (ab_load_switches.py), 8 rounds of 64 replays, medians: 2.0182 -> 1.9648 ms, the
// same logits. Where the buffers do not fit beside the rest (act-order at K near 32,768), L1 as
// before.
// INT8: per lane, the same products as the kernel above (mmaStep), in the same order. INT4: the
// codes enter the mma as offset + code (biasedCodePair4: no subtraction), x's rows are staged in
// the mma's pair order (pairXForWarp: no permutes per k-step) with each k-step's sum of x, and
// the offset and zero come out as (z - offset * s) times that sum: no second mma for the sum of
// x, a third of the instructions a k-step. Every place advances by additions, and rows past p.n
// read the last row instead of predicating each load: the first form of this kernel spent two
// thirds of its ~340 instructions a k-step (INT4) on divisions and 64-bit indices and predicates,
// the schedulers issuing on 62% of cycles with the DRAM 41% busy (ncu, INT4 gate_up).
// H100, batch 1, each layer alone (`bench_weight_only_gemv.py --rows 1`, microseconds), the
// kernel above -> this: INT4 group 128 qkv 11.00 -> 9.19, o 6.68 -> 6.35, gate_up 34.17 ->
// 29.42 (76% of the copy bandwidth), down 21.12 -> 17.95; INT8 per channel qkv 13.80 -> 10.23, o
// 8.82 -> 8.59, gate_up 49.61 -> 47.11, down 27.45 -> 26.93. The engine's step
// (`bench_generation.py --batch_sizes 1`, both kernels on one machine): INT4 3.163 -> 2.885 ms,
// INT8 4.070 -> 3.576. FP8 (up to 8 rows) since 2026-11-29: see fp8XForMma.
// The k-step's scale and zero addresses are 32-bit offsets from each tile's rows, and the ring's
// counters unsigned: the compiler had recomputed 64-bit row products at every k-step (223 -> 175
// instructions a k-step, INT4 bfloat16, 3 blocks an SM). H100, batch 1, one machine, before ->
// after: INT4 g128 qkv 9.05 -> 8.57 us, o 6.63 -> 6.12, gate_up 29.6 -> 28.6, down 20.2 -> 16.9,
// lm_head 125.7 -> 122.0; the INT4 engine's step 2.798 -> 2.501 ms; INT8 unchanged.
// Since 2026-11-30 the next tile's codes are an addition away (sameAdvance), a copy past k goes
// out with its own address (src-size 0), and INT4's x rows are padded to whole k-steps: 167 -> 157
// instructions a k-step on the common path (INT4 gated + norm, bfloat16; cuobjdump). H200, the INT4
// g128 8B engine's batch-1 graph, one engine captured both ways, eight rounds each, medians:
// 2.1006 -> 2.0652 ms (same logits, bit for bit). What remains most is L1's: rows g and g + 8's
// scale and zero (4 loads, each across 8 rows' cache lines: 32 wavefronts a k-step, more than the
// codes' 16). Timing-only probes on that engine: every lane reading one row's scales 1.958 ms;
// one 16-byte load a k-step from a layout of (scale, zero) per tile, group and row pair 1.976 ms.
// PAIRS (INT8 layers of few tiles): the warp takes two k-steps at a time, their loads, unpacking
// and mma chains independent until acc (which adds them in order: the same bits), from a ring of
// 8 slots with 6 k-steps in flight.
constexpr int kPipeStages = 4;
// x a block stages: up to 8 rows at K = 4,096 (64 KB), down's K = 14,336 at 2 rows.
constexpr size_t kMaxPipeX = 64 * 1024;
// The ring: per warp, STAGES slots of the codes of rows g and g + 8 ([2][32] uint4).
__host__ __device__ constexpr size_t pipeRingBytes(int stages) { return size_t{kMmaWarps} * stages * 64 * sizeof(uint4); }
// PAIRS (see the kernel): 8 slots, 6 k-steps in flight.
template <bool PAIRS>
constexpr int kPipeSlots = PAIRS ? 8 : kPipeStages;
// STAGED (INT4): a tile's scales and zeros, [2][16][stagedStride(groups)] floats, two such buffers
// (this tile's and the next's). The row stride is 4 mod 32 floats: the 8 rows g of a load fall on
// 8 distinct banks (their 4 lanes t read one word), and rows stay 16-byte aligned for cp.async.
__host__ __device__ constexpr int stagedStride(int groups) {
    int const s = (groups + 3) / 4 * 4;
    return s + ((4 - s) % 32 + 32) % 32;
}
__host__ __device__ constexpr size_t stagedScaleBytes(int groups) {
    return size_t{2} * 2 * kMmaRows * static_cast<size_t>(stagedStride(groups)) * sizeof(float);
}


// NORM: 8 bfloat16 values of x plus the residual's (as packs), as rms_norm.cu rounds the sum: a sum
// of two bfloat16 values is exact in float32 (or, exponents more than 15 apart, rounds to the
// larger either way), so the packed add, rounding once, gives its bits.
__device__ __forceinline__ uint4 addResidualPack(uint4 a, uint4 const& b) {
    auto* v = reinterpret_cast<__nv_bfloat162*>(&a);
    auto const* r = reinterpret_cast<__nv_bfloat162 const*>(&b);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __hadd2(v[i], r[i]);
    return a;
}

// NORM with a residual: block 0 writes the sum (x + residual) of row `row`'s pack `vec`.
__device__ __forceinline__ void storeResidualSum(Params const& p, int row, int vec, uint4 const& sum) {
    if (blockIdx.x == 0) {
        reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.norm.residualOut) + static_cast<int64_t>(row) * p.k)[vec] =
            sum;
    }
}

// Act-order (Params::perm), every thread of the block: x's rows (plus the residual, NORM, rounded
// as rms_norm.cu rounds the sum; block 0 writes that sum to residualOut) into raw [m][k], in x's
// own order, with 16-byte loads; each block then gathers from shared memory. Gathering from
// global memory (every block asking L2 for each 2-byte value) took the 8B engine's gate_up from
// 29 to 90 us at batch 1.
template <typename T, bool NORM>
__device__ __forceinline__ void stageRawX(Params const& p, T* raw) {
    int const vecs = static_cast<int>(p.k / 8);
    bool const residual = NORM && p.norm.residual != nullptr;
    for (int i = threadIdx.x; i < static_cast<int>(p.m) * vecs; i += blockDim.x) {
        int const row = i / vecs, vec = i - row * vecs;
        uint4 a = __ldcg(reinterpret_cast<uint4 const*>(static_cast<T const*>(p.x) + row * p.xRowStride) + vec);
        if constexpr (NORM) {
            if (residual) {
                a = addResidualPack(a, __ldcg(reinterpret_cast<uint4 const*>(static_cast<T const*>(p.norm.residual) +
                                                                               row * p.norm.residualRowStride) + vec));
                storeResidualSum(p, row, vec, a);
            }
        }
        reinterpret_cast<uint4*>(raw)[i] = a;
    }
    __syncthreads();
}

// Act-order: the 8 inputs of stored pack `vec` of row `row`, from raw (stageRawX) at their
// permuted places, and the norm weight's (NORM), as the contiguous loads would give them.
template <typename T, bool NORM>
__device__ __forceinline__ void gatherPack(Params const& p, T const* raw, int row, int vec, bool ok, uint4& a,
                                           uint4& w) {
    static_assert(sizeof(T) == 2, "the pipelined INT4 kernel stages 16-bit x");
    Pack<T, 8> x{}, nw{};
    if (ok) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            int const at = static_cast<int>(__ldg(p.perm + 8 * vec + e));
            x.v[e] = raw[row * p.k + at];
            if constexpr (NORM) nw.v[e] = static_cast<T const*>(p.norm.normWeight)[at];
        }
    }
    a = *reinterpret_cast<uint4 const*>(&x);
    w = *reinterpret_cast<uint4 const*>(&nw);
}

// INT4 (T float16 / bfloat16): the rows of x that a warp's k-steps read (warp, warp + 8, ...: the
// same in every tile) as the mma wants them, and those k-steps' sums of x, staged by that warp
// alone straight from global memory. Each 8-value vector of a row becomes xPair's four pairs ((v0,
// v4), (v1, v5), (v2, v6), (v3, v7)), so a k-step reads its B operands as words; xSum[step][r] is
// the sum of row r's 128 inputs of the k-step (rows p.m .. 7: left as they are: they reach only the
// mma's columns of no row, which no tile's end stores or reads), one float32 sum in a fixed
// order (each vector's, then over the k-step's 16 lanes). No warp reads another's, so no block
// barrier waits for x, nor a cp.async wait for the block's first codes (STAGED's one barrier after
// the staging is for tile 0's scales); a lane loads up to U vectors before it uses any.
// H200, batch 1, each layer alone, us, x copied and paired by the whole block -> by each warp (two
// rounds): INT4 g128 qkv 7.48 / 7.45 -> 6.91 / 6.93, o 5.77 / 5.77 -> 5.23 / 5.26, gate_up 23.84 /
// 23.79 -> 22.93 / 23.12, down 14.32 / 14.39 -> 13.80 / 13.82, lm_head 99.2 / 99.6 -> 97.8 / 97.0;
// 4 rows qkv 10.8 -> 9.7, o 8.2 -> 7.7. The same staging for INT8 and FP8 was slower (one warp's
// vectors of K = 14,336 take several round trips where the block's cp.async had them all in flight
// at once: FP8 down 16.6 -> 17.6; INT8's bfloat16 instance went past 80 registers, two blocks an SM
// instead of three: qkv 8.2 -> 9.5), so they keep the block's copy.
//
// NORM (kernels.h's WeightOnlyNorm): each vector is s = x (+ residual, rounded to T; block 0 writes
// it to residualOut) times the norm's weight, rounded to T, and sqSum[step][r] (laid out as xSum)
// gets the k-step's sum of s's squares, in the same order as xSum's; the epilogue turns the sums
// into the row's inverse RMS (normScale). No warp waits for the whole row: the previous attempts,
// a norm over the row in front of every block's first product, lost to the norm's own kernel.
// H200, the INT4 g128 8B engine's batch-1 step (one engine, its graph captured both ways, six
// rounds each, medians): the norm kernel then the GEMV 2.289 ms, NORM 2.157 ms (65 norms).
template <typename T, bool NORM = false>
__device__ __forceinline__ void pairXForWarp(Params const& p, T* xShared, float* xSum, float* sqSum, int kSteps,
                                             int warp, int lane, T* raw, int xStride) {
    // Vectors a lane has in flight: 2 (a warp's share of a row at K = 4,096) where the norm's
    // residual and weight take registers too (4: more registers); 4 where there is none: no more
    // registers than 2, and down (K = 14,336) waits on two passes instead of four. H200, the INT4
    // g128 8B engine's batch-1 graph, one engine captured each way (ab_load_switches.py), two
    // turns, ms: 2 -> 4 vectors 2.0411 / 2.0391 -> 2.0299 / 2.0270 (the same logits); 8 (80
    // registers, a spill) 2.0855 / 2.0860.
    constexpr int U = NORM ? 2 : 4;
    int const m = static_cast<int>(p.m);
    int const vecs = static_cast<int>(p.k / 8);
    int const perStep = m * 16;  // vectors of one k-step over the rows
    int const mine = warp < kSteps ? (kSteps - warp + kMmaWarps - 1) / kMmaWarps : 0;
    int const total = mine * perStep;
    bool const gathered = p.perm != nullptr;  // act-order: x (+ residual) staged in raw, gathered from there
    if (gathered) stageRawX<T, NORM>(p, raw);
    bool const residual = NORM && p.norm.residual != nullptr && !gathered;  // gathered: added in raw
    // Item i = base + 32 u + lane is vector rest = i % perStep of the warp's k-step c = i / perStep,
    // both kept by additions (i grows by 32 an item; perStep = 16 m, m <= 8): a division an item,
    // and 64-bit row offsets (launchPipelinedGemv keeps them below 2^31), had taken about 50 of the
    // ~330 instructions each warp spends here before its first k-step (see the kernel).
    int cNext = m == 1 ? lane >> 4 : 0;
    int restNext = lane - cNext * perStep;
    int const cStep = m == 1 ? 2 : m == 2 ? 1 : 0, restStep = 32 - cStep * perStep;
    int const xStride32 = static_cast<int>(p.xRowStride);
    int const rStride32 = NORM ? static_cast<int>(p.norm.residualRowStride) : 0;
    for (int base = 0; base < total; base += 32 * U) {  // whole warps: the shuffles
        uint4 a[U], b[U], w[U];
        int row[U], vec[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int const i = base + 32 * u + lane, c = cNext, rest = restNext;
            cNext += cStep;
            restNext += restStep;
            if (restNext >= perStep) {
                restNext -= perStep;
                ++cNext;
            }
            row[u] = rest / 16;
            vec[u] = 16 * (warp + kMmaWarps * c) + rest % 16;
            ok[u] = i < total && vec[u] < vecs;
            if (gathered) {  // act-order: the pack's 8 inputs from their own places
                gatherPack<T, NORM>(p, raw, row[u], vec[u], ok[u], a[u], w[u]);
                b[u] = make_uint4(0, 0, 0, 0);
                continue;
            }
            int const xOff = row[u] * xStride32;
            a[u] = ok[u] ? __ldcg(reinterpret_cast<uint4 const*>(static_cast<T const*>(p.x) + xOff) + vec[u])
                         : make_uint4(0, 0, 0, 0);
            if constexpr (NORM) {
                int const rOff = row[u] * rStride32;
                b[u] = ok[u] && residual
                           ? __ldcg(reinterpret_cast<uint4 const*>(static_cast<T const*>(p.norm.residual) + rOff) + vec[u])
                           : make_uint4(0, 0, 0, 0);
                w[u] = ok[u] ? __ldg(reinterpret_cast<uint4 const*>(p.norm.normWeight) + vec[u]) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (base + 32 * u >= total) break;  // the same for the whole warp
            float sq = 0.f;
            if constexpr (NORM) {
                // Packed bfloat16 arithmetic (addResidualPack; the norm weight's product, of two bfloat16
                // values, is exact in float32 too): four instructions where the float form took ~40. The
                // INT4 8B engine's batch-1 step (one process, both forms): 2.0502 -> 2.0419 ms, same logits.
                if (residual) a[u] = addResidualPack(a[u], b[u]);
                if (residual && ok[u]) storeResidualSum(p, row[u], vec[u], a[u]);
                auto* v = reinterpret_cast<__nv_bfloat162*>(&a[u]);
                auto const* nw = reinterpret_cast<__nv_bfloat162 const*>(&w[u]);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    float2 const f = __bfloat1622float2(v[i]);
                    sq += f.x * f.x;
                    sq += f.y * f.y;
                }
#pragma unroll
                for (int i = 0; i < 4; ++i) v[i] = __hmul2(v[i], nw[i]);
            }
            Pack<T, 8> const vals = *reinterpret_cast<Pack<T, 8> const*>(&a[u]);
            float s = 0.f;
#pragma unroll
            for (int e = 0; e < 8; ++e) s += toFloat(vals.v[e]);
#pragma unroll
            for (int o = 8; o > 0; o /= 2) {
                s += __shfl_xor_sync(0xffffffffu, s, o);
                if constexpr (NORM) sq += __shfl_xor_sync(0xffffffffu, sq, o);
            }
            if (base + 32 * u + lane < total) {  // zeros past k (ok false): the k-steps read no predicate
                reinterpret_cast<uint4*>(xShared + row[u] * xStride)[vec[u]] =
                    make_uint4(__byte_perm(a[u].x, a[u].z, 0x5410u), __byte_perm(a[u].x, a[u].z, 0x7632u),
                               __byte_perm(a[u].y, a[u].w, 0x5410u), __byte_perm(a[u].y, a[u].w, 0x7632u));
            }
            if (base + 32 * u + lane < total && lane % 16 == 0) {
                xSum[(vec[u] / 16) * 8 + row[u]] = s;
                if constexpr (NORM) sqSum[(vec[u] / 16) * 8 + row[u]] = sq;
            }
        }
    }
    __syncwarp();
}

// INT8 with bfloat16 x (HALF_X; launchPipelined says when): the mma takes x as float16, whose byte
// codes become operands in two instructions a pair (codePair<__half, 8>) where bfloat16's take five
// (8 significant bits do not hold 1152 + code, so they go through float32): that unpacking kept
// the integer pipe 70% busy (ncu, H200, INT8 gate_up at batch 1). Each k-step's 64 inputs of a row
// are scaled by the power of two that puts their largest magnitude in [2^14, 2^15), so no value
// overflows float16 and every bfloat16 value down to 2^-24 of that largest keeps all of its bits;
// xScale[step][r] (rows p.m .. 7: zero) is the inverse power of two, which the k-step multiplies
// into the weight's scale: the products and sums are the bfloat16 path's times a power of two, and
// acc gets the same bits. Every block converts the whole of x, so the cost grows with the rows:
// beyond 2 rows the bfloat16 path is faster on the 8B shape's qkv and o (as fast on down), but not
// on layers of many tiles a block (gate_up, the LM head), which take HALF_X up to 8 rows. H200, each
// layer alone, us, bfloat16 path -> HALF_X: 1 row qkv 8.75 -> 8.10, o 7.87 -> 7.33, gate_up 36.19
// -> 31.18, down 19.52 -> 16.76, lm_head 148.4 -> 138.0 (two calls); 4 rows (one call) qkv 9.50 ->
// 11.24, o 8.09 -> 9.18, gate_up 36.23 -> 34.26, lm_head 149.4 -> 129.2. The INT8 engine's batch-1
// step: 2.960 -> 2.763 ms (one engine captured both ways). benchmarks/README.md has the tables.
// In place, after the copy of x.
constexpr int kHalfXRows = 2;
constexpr int kHalfXTilesPerSm = 4;  // and any rows (up to the kernel's 8) from this many tiles an SM

template <typename T>
__device__ __forceinline__ void halfXForMma(Params const& p, T* xShared, float* xScale, int kSteps) {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "bfloat16 x");
    int const lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int const vecs = static_cast<int>(p.k / 8);
    int const perRow = kSteps * 8;  // vectors of a row, padded to whole k-steps: 8 lanes a k-step
    int const m = static_cast<int>(p.m);
    for (int r = 0; r < m; ++r) {
        uint4* row = reinterpret_cast<uint4*>(xShared + static_cast<int64_t>(r) * p.k);
        for (int j = warp * 32 + lane; j - lane < perRow; j += kMmaWarps * 32) {  // whole warps: the shuffles
            bool const ok = j < vecs;
            uint4 const a = ok ? row[j] : make_uint4(0, 0, 0, 0);
            uint32_t const words[4] = {a.x, a.y, a.z, a.w};
            float f[8];
            float amax = 0.f;
#pragma unroll
            for (int i = 0; i < 4; ++i) {  // a bfloat16 is the top half of its float32
                f[2 * i] = __uint_as_float(words[i] << 16);
                f[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
                amax = fmaxf(amax, fmaxf(fabsf(f[2 * i]), fabsf(f[2 * i + 1])));
            }
#pragma unroll
            for (int o = 4; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            // amax in [2^e, 2^(e + 1)): times 2^(14 - e). Zero, subnormal or non-finite maxima keep the
            // powers within float's normal range (zeros stay zeros, infinities and NaN stay so).
            int const shift = min(126, 141 - (__float_as_int(amax) >> 23));
            if (ok) {
                float const up = __int_as_float((127 + shift) << 23);
                uint32_t h[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    __half2 const v = __floats2half2_rn(f[2 * i] * up, f[2 * i + 1] * up);
                    h[i] = *reinterpret_cast<uint32_t const*>(&v);
                }
                row[j] = make_uint4(h[0], h[1], h[2], h[3]);
            }
            if (ok && j % 8 == 0) {  // the k-step's 8 scales: zero for the mma's columns of no row
                float* at = xScale + (j / 8) * 8;
                if (r == 0) {
                    reinterpret_cast<float4*>(at)[0] = make_float4(0.f, 0.f, 0.f, 0.f);
                    reinterpret_cast<float4*>(at)[1] = make_float4(0.f, 0.f, 0.f, 0.f);
                }
                at[r] = __int_as_float((127 - shift) << 23);
            }
        }
    }
}

// FP8 (W8A8 E4M3 on INT8's byte layout): x's rows quantized once per block in shared memory, as
// quantizeX does it in the kernel above (float16 codes in place); each k-step then takes
// mmaStepFp8's products, and the tile's end input_scale x weight_scale: the same sums in the same
// order as the kernel above, so the same bits. H200, batch 1, each layer alone, us, the kernel
// above -> this: qkv 12.13 -> 8.25, o 9.50 -> 6.72, gate_up 41.82 -> 35.49, down 23.52 -> 17.85,
// lm_head 167.0 -> 148.8. An RMSNorm computed in front by every block, as the kernel above could,
// cost more here than the norm's own kernel (gate_up 44.3 us fused, 36.8 with the norm kernel
// before it, 35.5 alone; with the norm's weight prefetched and 3 or 4 blocks an SM alike). The FP8
// engine's batch-1 step, one engine captured three ways: the kernel above with the norm in front
// of qkv and gate_up 3.27-3.31 ms, this kernel with it 3.13-3.19, this kernel after the norm's own
// kernels 2.86-2.87. So both kernels now take x as it is.
template <typename T>
__device__ __forceinline__ void fp8XForMma(Params const& p, T* xShared, float inverseScale) {
    uint4* v = reinterpret_cast<uint4*>(xShared);
    int const packs = static_cast<int>(p.m * p.k / 8);
    for (int i = threadIdx.x; i < packs; i += kMmaWarps * 32) {
        uint4 a = v[i];
        quantizeX<T>(a, inverseScale);
        v[i] = a;
    }
}

template <typename T, int BITS, int MINB, bool PAIRS, bool HALF_X, bool FP8 = false, bool GATED = false,
          bool NORM = false, bool STAGED = false, bool DUAL = false>
__global__ void __launch_bounds__(kMmaWarps * 32, MINB) weightOnlyGemvPipelinedKernel(Params p) {
    static_assert(!FP8 || (BITS == 8 && !HALF_X), "FP8: byte codes, its own x");
    static_assert(!STAGED || (BITS == 4 && !PAIRS), "STAGED: INT4's group scales and zeros");
    static_assert(!DUAL || STAGED, "DUAL: the STAGED kernel's tiles two at a time");
    // DUAL: the block's unit is two adjacent tiles of 16 rows (sub-tiles 0 and 1; n a multiple of
    // 32), each k-step's codes of both in one item, both summed against the same x and x sums.
    constexpr int SUBS = DUAL ? 2 : 1;
    constexpr int kUnitRows = SUBS * kMmaRows;
    static_assert(!NORM || (BITS == 4 && std::is_same_v<T, __nv_bfloat16>), "NORM: INT4, bfloat16 x");
    constexpr int STAGES = kPipeSlots<PAIRS>;
    constexpr int AHEAD = PAIRS ? STAGES - 2 : STAGES - 1;  // items issued beyond the next one used
    constexpr int XW = 16 / BITS;  // uint4 of x per pack per row of x
    int const numPacks = static_cast<int>(p.k / kCodes<BITS>);
    int const kSteps = (numPacks + 3) / 4;
    // x's row stride in shared memory: INT4 rows padded with zeros to whole k-steps (pairXForWarp)
    int const xStride = BITS == 4 ? kSteps * 4 * kCodes<BITS> : static_cast<int>(p.k);
    int const lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    // The warp's k-steps of a tile (warp, warp + 8, ...), the block's tiles, and so its items.
    int const perTile = warp < kSteps ? (kSteps - warp + kMmaWarps - 1) / kMmaWarps : 0;
    int64_t const firstRow = static_cast<int64_t>(blockIdx.x) * kUnitRows;
    int64_t const tileStride = int64_t{gridDim.x} * kUnitRows;
    int const tiles = firstRow < p.n ? static_cast<int>((p.n - firstRow + tileStride - 1) / tileStride) : 0;
    int const items = tiles * perTile;

    extern __shared__ __align__(16) unsigned char pipeShared[];
    static_assert((STAGES & (STAGES - 1)) == 0, "slots counted modulo a power of two");
    uint4 const* ring = reinterpret_cast<uint4 const*>(pipeShared) + warp * STAGES * 64 * SUBS;
    // The lane's place in the warp's slot 0, as cp.async's shared-memory address.
    uint32_t const ringLane = static_cast<uint32_t>(__cvta_generic_to_shared(ring + lane));
    // STAGED: the tiles' scales and zeros (stagedScaleBytes) after the ring, then x
    int const sStride = stagedStride(p.groups);
    int const subFloats = 2 * kMmaRows * sStride;  // a sub-tile's scale and zero rows in a buffer
    float* staged = reinterpret_cast<float*>(pipeShared + SUBS * pipeRingBytes(STAGES));
    T* xShared = reinterpret_cast<T*>(pipeShared + SUBS * pipeRingBytes(STAGES) +
                                      (STAGED ? SUBS * stagedScaleBytes(p.groups) : 0));
    float* xSum = reinterpret_cast<float*>(xShared + p.m * xStride);  // INT4: [kSteps][8]; HALF_X: xScale
    float* sqSum = xSum + kSteps * 8;                                 // NORM: [kSteps][8]
    float inv = -1.f;                                                 // NORM: this thread's row's, once known
    __shared__ float red[SUBS][kMmaWarps][8][kMmaRows];
    float const* scales = static_cast<float const*>(p.scales);
    float const* zeros = static_cast<float const*>(p.zeros);

    // Rows past p.n read row p.n - 1 (their sums are never stored), so that no load needs a
    // predicate of its row. The block's tile `tile` row `r` (0 .. 15); GATED (n a multiple of 16):
    // tile i's rows are the gate rows 8i .. 8i + 7 and the up rows n / 2 + 8i .., so that one
    // tile holds both halves of its 8 outputs, and the tiles balance over the blocks as before.
    // DUAL: r in [0, 32), sub-tile r / 16.
    auto rowOf = [&](int tile, int r) {
        int64_t const tileRow = firstRow + tile * tileStride + (DUAL ? r / kMmaRows * kMmaRows : 0);
        int const rr = DUAL ? r % kMmaRows : r;
        int64_t const row = tileRow + rr;
        if constexpr (GATED) {
            int64_t const base = tileRow / 2;
            return rr < 8 ? base + rr : p.n / 2 + base + rr - 8;
        }
        return row < p.n ? row : p.n - 1;
    };

    // Item i: k-step warp + 8 (i % perTile) of tile i / perTile, into slot i % STAGES; one commit
    // group per item (empty past the last), so that "item i has landed" is a count of groups. The
    // next item's codes advance by additions (a division per item was a tenth of the loop).
    // Unsigned counters: slot = count % STAGES is then a mask (signed, it took five instructions).
    unsigned issued = 0;
    int issueC = 0, issueTile = 0;
    int issuePack = 4 * warp + t;  // the lane's pack of the next item's k-step
    int const advance = 4 * kMmaWarps * (p.tiled ? 16 : 1);  // the warp's next k-step of a tile
    uint4 const* issueA = p.qweight + packIndex(p, rowOf(0, g), issuePack, numPacks);  // rows g, g + 8
    uint4 const* issueB = p.qweight + packIndex(p, rowOf(0, g + 8), issuePack, numPacks);
    // The next tile's first codes by an addition where the step from tile to tile is the same for
    // every tile: tile order (n a multiple of 16; GATED with an even grid, whose tiles advance by
    // whole stored tiles), row order with no row clamped (GATED, or n of whole tiles). Elsewhere
    // rowOf and packIndex again (64-bit arithmetic, ~60 instructions a warp and tile).
    bool const sameAdvance = p.tiled ? !GATED || gridDim.x % 2 == 0 : GATED || p.n % kMmaRows == 0;
    int64_t const tileAdvanceA =
        packIndex(p, rowOf(1, g), issuePack, numPacks) - packIndex(p, rowOf(0, g), issuePack, numPacks);
    int64_t const tileAdvanceB =
        packIndex(p, rowOf(1, g + 8), issuePack, numPacks) - packIndex(p, rowOf(0, g + 8), issuePack, numPacks);
    uint4 const* tileA = issueA;
    uint4 const* tileB = issueB;
    // DUAL: sub-tile 1's codes from sub-tile 0's, the same distance at every tile and k-step (n a
    // multiple of 32: GATED's gate and up rows of a unit are whole halves of stored tiles)
    int64_t const subDeltaA =
        DUAL ? packIndex(p, rowOf(0, kMmaRows + g), issuePack, numPacks) - packIndex(p, rowOf(0, g), issuePack, numPacks) : 0;
    int64_t const subDeltaB = DUAL ? packIndex(p, rowOf(0, kMmaRows + g + 8), issuePack, numPacks) -
                                         packIndex(p, rowOf(0, g + 8), issuePack, numPacks)
                                   : 0;
    auto issue = [&]() {
        if (issued < static_cast<unsigned>(items)) {
            bool const inK = issuePack < numPacks;
            uint32_t const slot = ringLane + (issued % STAGES) * (SUBS * 64 * sizeof(uint4));
            // past k: src-size 0 reads nothing, so the address need not be valid
            copyAsync16Or0(slot, issueA, inK);
            copyAsync16Or0(slot + 32 * sizeof(uint4), issueB, inK);
            if constexpr (DUAL) {
                copyAsync16Or0(slot + 64 * sizeof(uint4), issueA + subDeltaA, inK);
                copyAsync16Or0(slot + 96 * sizeof(uint4), issueB + subDeltaB, inK);
            }
            if (++issueC == perTile) {
                issueC = 0;
                ++issueTile;
                issuePack = 4 * warp + t;
                if (sameAdvance) {
                    issueA = tileA += tileAdvanceA;
                    issueB = tileB += tileAdvanceB;
                } else {
                    issueA = p.qweight + packIndex(p, rowOf(issueTile, g), issuePack, numPacks);
                    issueB = p.qweight + packIndex(p, rowOf(issueTile, g + 8), issuePack, numPacks);
                }
            } else {
                issueA += advance;
                issueB += advance;
                issuePack += 4 * kMmaWarps;
            }
        }
        ++issued;
        copyAsyncCommit();
    };
    // The scale (and zero) lines of a tile's 16 rows, towards L1.
    auto prefetchScales = [&](int tile) {
        if (FP8 || STAGED || tile >= tiles) return;  // FP8: one weight scale an output, at the tile's end
        int const lines = (p.groups * static_cast<int>(sizeof(float)) + 127) / 128;
        int const perArray = kMmaRows * lines;
        for (int e = threadIdx.x; e < perArray * (BITS == 4 ? 2 : 1); e += kMmaWarps * 32) {
            int const which = e / perArray, rest = e - which * perArray;
            float const* line = (which ? zeros : scales) + rowOf(tile, rest / lines) * p.groups + (rest % lines) * 32;
            asm volatile("prefetch.global.L1 [%0];" ::"l"(line));
        }
    };
    // STAGED: tile `tile`'s scale and zero rows into its buffer, by the whole block: thread i copies
    // pieces i % 8, + 8, ... of row i / 8 of the 32 (16 scale rows, then 16 zero rows), 16 bytes a
    // piece where rows are whole 16-byte pieces, else 4; the caller commits.
    static_assert(kMmaWarps * 32 == 8 * 2 * kMmaRows, "8 threads a staged row");
    auto stageScales = [&](int tile) {
        if (!STAGED || tile >= tiles) return;
        int const which = threadIdx.x / (8 * kMmaRows), r = threadIdx.x / 8 % kMmaRows;
        bool const wide = p.groups % 4 == 0;
        int const pieces = wide ? p.groups >> 2 : p.groups;
#pragma unroll
        for (int sub = 0; sub < SUBS; ++sub) {
            float const* src = (which ? zeros : scales) + rowOf(tile, sub * kMmaRows + r) * p.groups;
            float* dst = staged + ((tile & 1) * SUBS + sub) * subFloats + (which * kMmaRows + r) * sStride;
            for (int c = threadIdx.x % 8; c < pieces; c += 8) {
                if (wide) {
                    copyAsync16(dst + 4 * c, src + 4 * c);
                } else {
                    uint32_t const d = static_cast<uint32_t>(__cvta_generic_to_shared(dst + c));
                    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src + c) : "memory");
                }
            }
        }
    };
    if constexpr (STAGED) {
        // Tile 0's scales before the wait (no kernel's output), in a group of their own ahead of the
        // codes' (waited for after x's staging, below).
        stageScales(0);
        copyAsyncCommit();
    }
#pragma unroll
    for (int i = 0; i < AHEAD; ++i) issue();
    prefetchScales(0);
    waitForPreviousKernel();
    allowNextKernel();  // see launchKernel: after the wait

    float const inputScale = FP8 ? *p.inputScale : 0.f;
    float const inverseScale = FP8 ? __frcp_rn(inputScale) : 0.f;
    if constexpr (BITS == 4) {
        // act-order's raw rows (stageRawX) after the k-steps' sums
        T* raw = reinterpret_cast<T*>(xSum + (NORM ? 2 : 1) * kSteps * 8);
        pairXForWarp<T, NORM>(p, xShared, xSum, sqSum, kSteps, warp, lane, raw, xStride);
        if constexpr (STAGED) {
            // Tile 0's scales landed (their group is older than the AHEAD codes' ones) and every
            // thread's copies shared. Here rather than before the wait, where a block that
            // becomes resident only as the previous kernel's blocks leave (most of gate_up's,
            // qkv's and down's) would wait for their DRAM latency and then for x's staging in
            // turn: H200, the INT4 g128 8B engine's batch-1 graph, one engine captured both ways,
            // 1.8096 -> 1.7973 ms, the same logits.
            copyAsyncWait<AHEAD>();
            __syncthreads();
        }
    } else {
        copyXToShared(p, xShared);
        copyAsyncCommit();
        copyAsyncWait<0>();
        __syncthreads();
    }
    if constexpr (FP8) {
        fp8XForMma(p, xShared, inverseScale);
        __syncthreads();
    } else if constexpr (HALF_X) {
        halfXForMma(p, xShared, xSum, kSteps);
        __syncthreads();
    }
    // The lane's x: row g (zeros past p.m), from its pack of each k-step.
    // INT4's rows are padded to whole k-steps, so only the lanes past p.m skip their loads. Those
    // lanes reading row 0 instead (no predicate at all) cost more than they saved: shared memory's
    // wavefronts, 8 lanes' x where 1 lane's was read (INT4 gate_up 23.5 -> 27.3 us at batch 1).
    bool const xOk = g < p.m;
    uint4 const* xLane = reinterpret_cast<uint4 const*>(xShared + (xOk ? g : 0) * xStride) + t * XW;
    uint32_t const xLaneShared = static_cast<uint32_t>(__cvta_generic_to_shared(xLane));  // STAGED's x loads

    unsigned used = 0;
    for (int tile = 0; tile < tiles; ++tile) {
        prefetchScales(tile + 1);
        // STAGED: the next tile's scales join this tile's first k-step's group of copies, landed by
        // its k-step AHEAD (or, for warps of fewer k-steps a tile, by the wait at the tile's end).
        stageScales(tile + 1);
        // STAGED: row g's scales (DUAL: sub-tile 1's subFloats further on)
        float const* sRowA = staged + (tile & 1) * SUBS * subFloats + g * sStride;
        // Where rows g and g + 8 start in scales and zeros, as 32-bit element offsets (launchPipelinedGemv
        // keeps n x groups below 2^31): the k-steps' loads add their group to them. From 64-bit row
        // pointers the compiler recomputed two 64-bit products every k-step, out of registers.
        int const offA = static_cast<int>(rowOf(tile, g)) * p.groups;
        int const offB = static_cast<int>(rowOf(tile, g + 8)) * p.groups;
        // One scale a row: read once per tile (INT4 has groups; FP8 applies its own at the end).
        bool const perChannel = BITS == 8 && !FP8 && p.groups == 1;
        float sa = perChannel ? __ldg(scales + offA) : 0.f, sb = perChannel ? __ldg(scales + offB) : 0.f;
        float accs[SUBS][1][4] = {};
        // The codes (of each sub-tile) and x of item `item` (k-step `step` of this tile), into registers.
        auto load = [&](unsigned item, int step, uint4 (&wa)[SUBS], uint4 (&wb)[SUBS], uint4 (&xs)[1][XW]) {
            uint4 const* slot = ring + lane + (item % STAGES) * 64 * SUBS;
#pragma unroll
            for (int sub = 0; sub < SUBS; ++sub) {
                wa[sub] = slot[64 * sub];
                wb[sub] = slot[64 * sub + 32];
            }
            // INT4's rows are padded to whole k-steps; INT8's past k read zeros
            bool const inK = BITS == 4 || 4 * step + t < numPacks;
            if constexpr (STAGED) {
                // The lanes past p.m keep what their registers held (loadSharedWhere): the 8
                // instructions a k-step that zeroed them cost 2.9% of the INT4 8B engine's batch-1
                // step (H200, one engine captured both ways: 1.8652 -> 1.8104 ms, the same logits).
                // Not in the L1 fallback, whose gated instance then spilled.
                uint32_t const at = xLaneShared + 4 * XW * step * static_cast<uint32_t>(sizeof(uint4));
#pragma unroll
                for (int j = 0; j < XW; ++j) xs[0][j] = loadSharedWhere(xOk, at + j * sizeof(uint4));
            } else {
#pragma unroll
                for (int j = 0; j < XW; ++j) xs[0][j] = xOk && inK ? xLane[4 * XW * step + j] : make_uint4(0, 0, 0, 0);
            }
        };
        // k-step `step`'s sum, added to acc (STAGED: scales from sRow).
        auto accumulate = [&](float (&acc)[1][4], float const* sRow, uint4 const& wa, uint4 const& wb,
                              uint4 const (&xs)[1][XW], int step) {
            if constexpr (FP8) {
                mmaStepFp8<1>(wa, wb, xs, acc);  // x staged as codes
                return;
            }
            int const group = (4 * step) >> p.groupShift;
            int const ia = offA + group, ib = offB + group;  // the k-step's scale (and zero) of rows g, g + 8
            if (STAGED) {
                sa = sRow[group];
                sb = sRow[8 * sStride + group];
            } else if (!perChannel) {
                sa = __ldg(scales + ia);
                sb = __ldg(scales + ib);
            }
            if constexpr (BITS == 4) {
                // Codes as offset + code, with no subtraction (see biasedCodePair4):
                //     sum_k x_k (c_k s + z) = s sum_k x_k (c_k + O) + (z - O s) sum_k x_k.
                constexpr float O = MmaTraits<T>::kOffset4;
                float const ca = (STAGED ? sRow[kMmaRows * sStride + group] : __ldg(zeros + ia)) - O * sa;
                float const cb = (STAGED ? sRow[(kMmaRows + 8) * sStride + group] : __ldg(zeros + ib)) - O * sb;
                float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    uint32_t const a0 = biasedCodePair4<T>(wa, 2 * i), a1 = biasedCodePair4<T>(wb, 2 * i);
                    uint32_t const a2 = biasedCodePair4<T>(wa, 2 * i + 1), a3 = biasedCodePair4<T>(wb, 2 * i + 1);
                    mma16816<T>(d, a0, a1, a2, a3, word(xs[0][i / 2], 2 * (i % 2)), word(xs[0][i / 2], 2 * (i % 2) + 1));
                }
                float2 const xsum = *reinterpret_cast<float2 const*>(xSum + step * 8 + 2 * t);  // rows 2t, 2t + 1
                acc[0][0] = fmaf(sa, d[0], fmaf(ca, xsum.x, acc[0][0]));
                acc[0][1] = fmaf(sa, d[1], fmaf(ca, xsum.y, acc[0][1]));
                acc[0][2] = fmaf(sb, d[2], fmaf(cb, xsum.x, acc[0][2]));
                acc[0][3] = fmaf(sb, d[3], fmaf(cb, xsum.y, acc[0][3]));
            } else if constexpr (HALF_X) {
                // mmaStep's products and order in float16 (see halfXForMma); (s x xScale) x d is
                // s x (the bfloat16 sum) exactly, so acc gets the same roundings.
                float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int i = 0; i < kCodes<8> / 4; ++i) {
                    uint32_t const a0 = codePair<__half, 8>(wa, 2 * i), a1 = codePair<__half, 8>(wb, 2 * i);
                    uint32_t const a2 = codePair<__half, 8>(wa, 2 * i + 1), a3 = codePair<__half, 8>(wb, 2 * i + 1);
                    mma16816<__half>(d, a0, a1, a2, a3, xPair<8>(xs[0], 2 * i), xPair<8>(xs[0], 2 * i + 1));
                }
                float2 const xScale = *reinterpret_cast<float2 const*>(xSum + step * 8 + 2 * t);  // rows 2t, 2t + 1
                acc[0][0] = fmaf(sa * xScale.x, d[0], acc[0][0]);
                acc[0][1] = fmaf(sa * xScale.y, d[1], acc[0][1]);
                acc[0][2] = fmaf(sb * xScale.x, d[2], acc[0][2]);
                acc[0][3] = fmaf(sb * xScale.y, d[3], acc[0][3]);
            } else {
                mmaStep<T, float, BITS, 1, false>(wa, wb, xs, sa, sb, 0.f, 0.f, 0, 0, acc);
            }
        };
        int c = 0;
        if constexpr (PAIRS) {
            // Two k-steps at a time: their loads, unpacking and mma chains independent until acc,
            // which takes them in order (the same sums, bit for bit, as one at a time).
            for (; c + 1 < perTile; c += 2, used += 2) {
                issue();  // into the slots of the pair before
                issue();
                copyAsyncWait<AHEAD>();
                int const step = warp + kMmaWarps * c;
                uint4 wa0[SUBS], wb0[SUBS], wa1[SUBS], wb1[SUBS], xs0[1][XW], xs1[1][XW];
                load(used, step, wa0, wb0, xs0);
                load(used + 1, step + kMmaWarps, wa1, wb1, xs1);
                accumulate(accs[0], sRowA, wa0[0], wb0[0], xs0, step);
                accumulate(accs[0], sRowA, wa1[0], wb1[0], xs1, step + kMmaWarps);
            }
        }
        for (; c < perTile; ++c, ++used) {
            issue();  // into the slot used last
            copyAsyncWait<AHEAD>();
            int const step = warp + kMmaWarps * c;
            uint4 wa[SUBS], wb[SUBS], xs[1][XW];
            load(used, step, wa, wb, xs);
#pragma unroll
            for (int sub = 0; sub < SUBS; ++sub) accumulate(accs[sub], sRowA + sub * subFloats, wa[sub], wb[sub], xs, step);
        }
        int64_t const tileRow = firstRow + tile * tileStride;
        // Every sub-tile's sums, one barrier, every sub-tile's reduction.
#pragma unroll
        for (int sub = 0; sub < SUBS; ++sub) writeTileSums<1>(red[sub], accs[sub]);
        __syncthreads();
#pragma unroll
        for (int sub = 0; sub < SUBS; ++sub) {
            int64_t const subRow = tileRow + sub * kMmaRows;
            if constexpr (GATED) {
                reduceGatedTile<T, FP8, NORM>(p, red[sub], subRow / 2, inputScale, sqSum, kSteps, &inv);
            } else {
                reduceTile<T, FP8, 1, NORM>(p, red[sub], subRow, inputScale, sqSum, kSteps, &inv);
            }
        }
        if (STAGED && perTile <= AHEAD) {  // the next tile's scales (see stageScales above) landed
            copyAsyncCommit();
            copyAsyncWait<0>();
        }
        __syncthreads();  // red is read before the next tile writes it; STAGED: the next tile's scales are in
    }
}

// Whether INT4 layers take the STAGED kernel's DUAL form (two tiles a block at a time) where it
// serves: yes unless TRTLLM_GEMV_DUAL=0. Read at every launch, so that ab_load_switches can put the
// two forms side by side in one process.
bool dualGemvWanted() {
    char const* env = std::getenv("TRTLLM_GEMV_DUAL");
    return env == nullptr || std::strcmp(env, "0") != 0;
}

// Whether INT8 / INT4 GEMVs of up to 8 rows may take the pipelined kernel: yes unless TRTLLM_GEMV_PIPELINE=0
// (for comparing the two kernels in one build).
bool pipelinedGemvEnabled() {
    static bool const enabled = [] {
        char const* env = std::getenv("TRTLLM_GEMV_PIPELINE");
        return env == nullptr || std::strcmp(env, "0") != 0;
    }();
    return enabled;
}

// The pipelined kernel's dynamic shared memory for q: the ring, STAGED's scale buffers, x, the
// k-steps' sums, act-order's raw rows (the kernel's carving, in that order).
template <typename T, int BITS, bool PAIRS, bool HALF_X, bool NORM, bool STAGED, bool DUAL = false>
size_t pipeSharedBytes(Params const& q) {
    constexpr size_t kSubs = DUAL ? 2 : 1;
    int64_t const kSteps = (q.k / kCodes<BITS> + 3) / 4;
    // INT4: x's rows padded with zeros to whole k-steps (the kernel's xStride)
    int64_t const xRow = BITS == 4 ? kSteps * 4 * kCodes<BITS> : q.k;
    size_t const xBytes = static_cast<size_t>(q.m) * static_cast<size_t>(xRow) * sizeof(T);
    constexpr bool kPerStep = BITS == 4 || HALF_X;  // xSum (INT4) or xScale (HALF_X)
    size_t const sumBytes = kPerStep ? (NORM ? 2 : 1) * static_cast<size_t>(kSteps) * 8 * sizeof(float) : 0;
    // act-order's rows in x's order (stageRawX)
    size_t const rawBytes = q.perm != nullptr ? static_cast<size_t>(q.m) * static_cast<size_t>(q.k) * sizeof(T) : 0;
    size_t const stagedBytes = STAGED ? kSubs * stagedScaleBytes(q.groups) : 0;
    return kSubs * pipeRingBytes(kPipeSlots<PAIRS>) + stagedBytes + xBytes + sumBytes + rawBytes;
}

// The pipelined kernel compiled for at least MINB blocks an SM, on a grid of the blocks that fit at
// once (at most one a tile); blocksPerSm > 0: no more than that many an SM (by shared memory).
template <typename T, int BITS, bool FP8, int MINB, bool PAIRS, bool HALF_X = false, bool GATED = false,
          bool NORM = false, bool STAGED = false, bool DUAL = false>
void launchPipelined(Params const& q, unsigned tiles, cudaStream_t stream, int blocksPerSm = 0) {
    if constexpr (BITS == 8 && !FP8 && std::is_same_v<T, __nv_bfloat16> && !HALF_X) {
        if (q.m <= kHalfXRows || tiles >= int64_t{kHalfXTilesPerSm} * multiprocessors()) {
            return launchPipelined<T, BITS, FP8, MINB, PAIRS, true, GATED>(q, tiles, stream, blocksPerSm);
        }
    }
    auto kernel = weightOnlyGemvPipelinedKernel<T, BITS, MINB, PAIRS, HALF_X, FP8, GATED, NORM, STAGED, DUAL>;
    constexpr size_t ring = (DUAL ? 2 : 1) * pipeRingBytes(kPipeSlots<PAIRS>);
    constexpr bool kPerStep = BITS == 4 || HALF_X;  // xSum (INT4) or xScale (HALF_X)
    constexpr size_t kSums = NORM ? 2 : 1;           // NORM: sqSum after xSum
    size_t smem = pipeSharedBytes<T, BITS, PAIRS, HALF_X, NORM, STAGED, DUAL>(q);
    if (blocksPerSm > 0) smem = sharedBytesForBlocksPerSm(kernel, smem, blocksPerSm);
    constexpr size_t kMaxSum =
        kPerStep ? kSums * (kMaxPipeX / sizeof(T) / (4 * kCodes<BITS>)) * 8 * sizeof(float) : 0;
    constexpr size_t kMaxRaw = BITS == 4 ? kMaxPipeX : 0;
    // INT4's padding: under a k-step (128 values) a row, 8 rows
    constexpr size_t kMaxX = kMaxPipeX + (BITS == 4 ? 8 * 4 * kCodes<BITS> * sizeof(T) : 0);
    static_assert(ring + kMaxX + kMaxSum + kMaxRaw + (DUAL ? 2 : 1) * sizeof(float) * kMmaWarps * 8 * kMmaRows <= 227 * 1024,
                  "the pipelined GEMV's shared memory beyond an H100 block's");
    // STAGED: launchPipelinedGemv has checked that smem fits. The kernel's limit is the most any call
    // takes, within what the device lets a block opt into beside the static `red`: on an A100 (163 KB)
    // that most is beyond it, and a refused limit would leave every launch above 48 KB refused too.
    // On H100 / H200 (227 KB) the static_assert above keeps the most within it: no clamp.
    static size_t const staticBytes = [&] {
        cudaFuncAttributes attributes{};
        cudaFuncGetAttributes(&attributes, kernel);
        return attributes.sharedSizeBytes;
    }();
    size_t const optIn = static_cast<size_t>(deviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
    size_t const cap = optIn > staticBytes ? optIn - staticBytes : 0;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(std::max(smem, std::min(ring + kMaxX + kMaxSum + kMaxRaw, cap))));
    unsigned const blocks = static_cast<unsigned>(
        std::min<int64_t>(tiles, int64_t{residentBlocks(kernel, kMmaWarps * 32, smem)} * multiprocessors()));
    launchKernel(FP8 ? "fp8_gemv" : "weight_only_gemv", kernel, blocks, kMmaWarps * 32, smem, stream, q);
}

// Launches the pipelined kernel where it serves: INT8 / INT4 with float32 scales, groups of whole
// k-steps (or per channel), and FP8, up to 8 rows whose x fits kMaxPipeX. False elsewhere.
// GATED (which no other kernel serves) ignores TRTLLM_GEMV_PIPELINE.
template <typename T, typename S, int BITS, bool FP8, bool MASKED, bool GATED = false, bool NORM = false>
bool launchPipelinedGemv(Params const& q, unsigned tiles, cudaStream_t stream) {
    if constexpr (!std::is_same_v<S, float> || MASKED) {
        return false;
    } else {
        size_t const xBytes = static_cast<size_t>(q.m) * static_cast<size_t>(q.k) * sizeof(T);
        if ((!GATED && !NORM && q.perm == nullptr && !pipelinedGemvEnabled()) || q.m > 8 || xBytes > kMaxPipeX) {
            return false;
        }
        // the kernel's 32-bit offsets: scales and zeros, INT4's rows of x (and NORM's residual)
        int64_t const rowsSpan = q.m * std::max(q.xRowStride, NORM ? q.norm.residualRowStride : int64_t{0});
        if (q.n * q.groups > std::numeric_limits<int32_t>::max() || rowsSpan > std::numeric_limits<int32_t>::max()) {
            return false;
        }
        // Three blocks an SM (at most 80 registers a thread) where two a SM would leave tiles for a
        // second round: INT4 beyond 2 tiles an SM, INT8 (whose kernel keeps fewer codes in flight
        // within 80 registers) beyond 8. H100, batch 1, codes in tile order, 2 -> 3 blocks an SM,
        // us: INT4 qkv (384 tiles) 9.79 -> 8.98, gate_up 29.80 -> 29.40, lm_head 139.7 -> 124.7, but
        // o and down (256 tiles, one round either way) 6.61 -> 7.78 and 20.41 -> 23.78; INT8 gate_up
        // 43.06 -> 41.68, lm_head 206.7 -> 205.9, qkv 9.31 -> 11.08. Deeper rings (6 or 8 slots) and
        // four blocks an SM (64 registers) were no faster anywhere.
        // Why o and down lost (inferred, not traced): a kernel's blocks fill each SM as far as they
        // fit, as the previous kernel's blocks leave it, so 256 blocks that fit three an SM run on
        // about 86 SMs. INT4's layers of one round now take the 80-register kernel held to two
        // blocks an SM by its shared memory: the third block's room then holds one block of the
        // next kernel (gate_up after o, qkv after down), which under programmatic launch starts
        // loading its weights before o or down ends; the 94-register kernel's two blocks filled
        // the registers. H200, the INT4 g128 8B engine's batch-1 graph, one engine captured each
        // way (ab_load_switches.py), 8 rounds each, medians, ms, two calls: two blocks of 94
        // registers 2.0439 / 2.0452, of 80 held to two 2.0284 / 2.0327 (the same logits); three of
        // 80 (the packing above) 2.1988.
        int64_t const twoRounds = int64_t{BITS == 4 ? 2 : 8} * multiprocessors();
        // INT8 layers of at most two tiles an SM (the 8B shape's o and down) take k-steps in pairs
        // with 6 in flight (PAIRS). H200, batch 1, us, one k-step at a time -> pairs: INT8 down 23.07
        // -> 19.25, o 8.03 -> 7.77; but INT4 o 5.73 -> 5.87 and down unchanged (14.2), and INT8 qkv
        // (384 tiles, where the larger ring leaves two blocks an SM instead of three) 8.64 -> 11.85.
        if constexpr (BITS == 4 && !FP8) {
            // STAGED where its buffers fit beside the rest (with the static `red`) in a block's 227 KB,
            // and where scales and zeros start on 16-byte boundaries (its copies of whole rows)
            auto const address = [](void const* ptr) { return reinterpret_cast<uintptr_t>(ptr); };
            bool const aligned = ((address(q.scales) | address(q.zeros)) & 15u) == 0;
            size_t const staged = pipeSharedBytes<T, 4, false, false, NORM, true>(q);
            // DUAL at one row of x where n is whole units of 32 rows (two blocks an SM: a unit's ring
            // slots and scale buffers are twice a tile's). A unit's k-step is 2 KB of codes for one
            // set of x loads, x sums, ring waits and loop counters, and its end one barrier pair for
            // 32 rows: the gated k-step's SASS went from ~160 to ~115 instructions a KB of codes.
            // o and down (256 tiles) become 128 units, one block on each of 128 SMs, with room beside
            // it for the next kernel's blocks to start under programmatic launch. H200, the INT4 g128
            // 8B engine's batch-1 graph (ab_load_switches.py, 8 rounds of 64 replays, medians, ms,
            // logits equal), single tiles -> DUAL: 1.7987 -> 1.7547, 1.7995 -> 1.7541, 1.7993 ->
            // 1.7549; DUAL only where a layer has more than 8 tiles an SM (gate_up, the LM head)
            // 1.7906. Alone (bench_weight_only_gemv.py, us): qkv 6.74 -> 6.28, o 4.99 -> 4.91,
            // gate_up 19.9 -> 18.9, down and the LM head unchanged. At 4 rows DUAL was slower (the
            // engine's batch-4 graph 2.3378 -> 2.4347 ms), so more rows keep single tiles.
            size_t const dualStaged = pipeSharedBytes<T, 4, false, false, NORM, true, true>(q);
            if (aligned && q.m == 1 && q.n % (2 * kMmaRows) == 0 && dualGemvWanted() &&
                dualStaged + 2 * sizeof(float) * kMmaWarps * 8 * kMmaRows <= 227 * 1024) {
                launchPipelined<T, BITS, FP8, 2, false, false, GATED, NORM, true, true>(q, tiles / 2, stream);
                return true;
            }
            if (aligned && staged + sizeof(float) * kMmaWarps * 8 * kMmaRows <= 227 * 1024) {
                launchPipelined<T, BITS, FP8, 3, false, false, GATED, NORM, true>(q, tiles, stream,
                                                                                 tiles > twoRounds ? 0 : 2);
                return true;
            }
        }
        if (tiles > twoRounds) {
            launchPipelined<T, BITS, FP8, 3, false, false, GATED, NORM>(q, tiles, stream);
        } else if constexpr (BITS == 8) {
            if (tiles <= 2 * static_cast<int64_t>(multiprocessors())) {
                launchPipelined<T, BITS, FP8, 2, true, false, GATED>(q, tiles, stream);
            } else {
                launchPipelined<T, BITS, FP8, 2, false, false, GATED>(q, tiles, stream);
            }
        } else {
            launchPipelined<T, BITS, FP8, 3, false, false, GATED, NORM>(q, tiles, stream, 2);
        }
        return true;
    }
}

// Tiles of rows of x, each one pass over the weight: up to 32 rows (4 mma n-tiles) for byte
// codes, 16 for INT4 (whose x takes twice the registers per input).
template <typename T, typename S, int BITS, bool FP8, bool MASKED>
void launchGemvMmaTile(Params const& q, unsigned blocks, cudaStream_t stream) {
    auto kernel = q.m <= 8    ? weightOnlyGemvMmaKernel<T, S, BITS, 1, MASKED, FP8>
                  : q.m <= 16 ? weightOnlyGemvMmaKernel<T, S, BITS, 2, MASKED, FP8>
                              : weightOnlyGemvMmaKernel<T, S, BITS, BITS == 8 ? 4 : 2, MASKED, FP8>;
    if (launchPipelinedGemv<T, S, BITS, FP8, MASKED>(q, blocks, stream)) return;
    size_t smem = 0;
    int64_t const sms = multiprocessors();
    bool loops = FP8 && q.m <= 8;  // the kernel's LOOP
    if constexpr (FP8) {
        bool const oneWave = q.m <= 8 && blocks > 2 * sms && blocks <= 3 * sms;
        if (oneWave) {
            kernel = weightOnlyGemvMmaKernel<T, S, 8, 1, false, true, true>;
            loops = false;
        }
    }
    if constexpr (BITS == 4) {
        size_t const xBytes = static_cast<size_t>(q.m) * static_cast<size_t>(q.k) * sizeof(T);
        if (q.m <= 8 && xBytes <= kMaxSharedX) {
            kernel = weightOnlyGemvMmaKernel<T, S, 4, 1, MASKED, false, false, true>;
            smem = xBytes;
            loops = true;
        }
    }
    if (loops) {
        // As many blocks as run at once (the kernel's LOOP: what a block does once, it does once per
        // block, not per tile).
        blocks = static_cast<unsigned>(std::min<int64_t>(blocks, residentBlocks(kernel, kMmaWarps * 32, smem) * sms));
    }
    launchKernel(FP8 ? "fp8_gemv" : "weight_only_gemv", kernel, blocks, kMmaWarps * 32, smem, stream, q);
}

template <typename T, typename S, int BITS, bool FP8 = false>
void launchGemvMma(Params p, cudaStream_t stream) {
    constexpr int64_t kTileRows = BITS == 8 ? 32 : 16;
    unsigned const blocks = static_cast<unsigned>((p.n + kMmaRows - 1) / kMmaRows);
    bool const masked = !FP8 && p.groupShift < 2;  // groups of 1 or 2 packs
    if (p.normed) {  // the RMSNorm in front: the pipelined INT4 kernel only (the bindings check what it serves)
        bool launched = false;
        if constexpr (BITS == 4 && !FP8 && std::is_same_v<T, __nv_bfloat16>) {
            if (!masked) {
                launched = p.gated ? launchPipelinedGemv<T, S, BITS, FP8, false, true, true>(p, blocks, stream)
                                   : launchPipelinedGemv<T, S, BITS, FP8, false, false, true>(p, blocks, stream);
            }
        }
        if (!launched) {
            throw std::invalid_argument("norm: INT4 with bfloat16 x, at most 8 rows within 64 KB, float32 scales, "
                                        "groups of whole k-steps");
        }
        return;
    }
    if (p.perm != nullptr && !p.gated) {  // act-order: the pipelined INT4 kernel only (the bindings check it)
        if (BITS != 4 || FP8 || masked || !launchPipelinedGemv<T, S, BITS, FP8, false>(p, blocks, stream)) {
            throw std::invalid_argument("perm: INT4, at most 8 rows of x within 64 KB, float32 scales, groups of "
                                        "whole k-steps");
        }
        return;
    }
    if (p.gated) {  // one launch of the pipelined kernel (the bindings check what it serves)
        if (masked || !launchPipelinedGemv<T, S, BITS, FP8, false, true>(p, blocks, stream)) {
            throw std::invalid_argument("gated: at most 8 rows of x within 64 KB, float32 scales, groups of whole "
                                        "k-steps");
        }
        return;
    }
    for (int64_t m0 = 0; m0 < p.m; m0 += kTileRows) {
        Params q = p;
        q.m = std::min(kTileRows, p.m - m0);
        q.x = static_cast<T const*>(p.x) + m0 * p.xRowStride;
        q.out = static_cast<T*>(p.out) + m0 * p.outRowStride;
        if (masked) {
            launchGemvMmaTile<T, S, BITS, FP8, !FP8>(q, blocks, stream);
        } else {
            launchGemvMmaTile<T, S, BITS, FP8, false>(q, blocks, stream);
        }
    }
}

// One thread per pack: its codes, scale and zero to kCodes values of T (16-byte stores).
template <typename T, typename S, int BITS>
__global__ void weightOnlyDequantizeKernel(T* __restrict__ out, uint4 const* __restrict__ qweight,
                                           S const* __restrict__ scales, S const* __restrict__ zeros, int64_t n,
                                           int numPacks, int groups, int groupShift, bool tiled) {
    waitForPreviousKernel();  // see launchKernel
    allowNextKernel();
    constexpr int C = kCodes<BITS>;
    int64_t const total = n * numPacks;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
        // Pack i of the storage (packIndex's inverse in tile order): read in order, written where it goes.
        int64_t row;
        int pack;
        if (tiled) {
            int64_t const block = i >> 6;  // (tile, k-step)
            int64_t const tile = block / (numPacks >> 2);
            row = tile * 16 + ((i >> 5) & 1) * 8 + ((i >> 2) & 7);
            pack = static_cast<int>(block - tile * (numPacks >> 2)) * 4 + static_cast<int>(i & 3);
        } else {
            row = i / numPacks;
            pack = static_cast<int>(i - row * numPacks);
        }
        int64_t const g = row * groups + (pack >> groupShift);
        float const s = toFloat(scales[g]);
        uint4 const w = loadStreaming(qweight + i);
        float const z = BITS == 4 ? toFloat(zeros[g]) : 0.f;
        float v[C];
#pragma unroll
        for (int j = 0; j < C / 4; ++j) {
            float f[4];
            unpack4<BITS>(w, j, f);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float const sv = __fmul_rn(f[e], s);
                v[4 * j + e] = BITS == 4 ? __fadd_rn(sv, z) : sv;
            }
        }
        constexpr int V = kVec16<T>;
        Pack<T, V>* dst = reinterpret_cast<Pack<T, V>*>(out + (row * numPacks + pack) * C);
#pragma unroll
        for (int c = 0; c < C / V; ++c) {
            Pack<T, V> o;
#pragma unroll
            for (int e = 0; e < V; ++e) o.v[e] = fromFloat<T>(v[c * V + e]);
            dst[c] = o;
        }
    }
}

// log2 of the packs in a group; per channel (groupSize 0) a shift that maps every pack to 0.
int groupShiftOf(int64_t groupSize, int bits) {
    if (groupSize == 0) return 31;
    int64_t const codes = 128 / bits;
    int shift = 0;
    while ((codes << shift) < groupSize) ++shift;
    return shift;
}

// The operands and shapes both GEMVs (weight-only, FP8) share; the caller sets the rest.
Params gemvParams(void* out, void const* x, void const* qweight, void const* scales, void const* bias, int64_t m,
                  int64_t n, int64_t k, int64_t xRowStride, int64_t outRowStride) {
    Params p{};
    p.out = out;
    p.x = x;
    p.qweight = static_cast<uint4 const*>(qweight);
    p.scales = scales;
    p.bias = bias;
    p.m = m;
    p.n = n;
    p.k = k;
    p.xRowStride = xRowStride;
    p.outRowStride = outRowStride;
    return p;
}

// Calls fn(std::integral_constant<int, BITS>{}) for the format's bits (4 or 8).
template <typename Fn>
void dispatchBits(int bits, char const* what, Fn&& fn) {
    if (bits == 4) {
        fn(std::integral_constant<int, 4>{});
    } else if (bits == 8) {
        fn(std::integral_constant<int, 8>{});
    } else {
        throw std::invalid_argument(std::string(what) + ": bits must be 4 or 8");
    }
}

// The launches of one activation dtype T (weight_only_gemv_{float,half,bf16}.cu instantiate them).
template <typename T>
void gemvTyped(Params const& p, int bits, DType scaleDtype, bool alignedX, cudaStream_t st) {
    dispatchFloat(scaleDtype, "weight_only_gemv", [&](auto s) {
        using S = decltype(s);
        auto launch = [&](auto b) {
            // The tensor-core kernel reads x as 16-byte packs of float16 / bfloat16; float32
            // activations (and x rows off 16-byte boundaries) take the float32 kernel.
            if constexpr (std::is_same_v<T, float>) {
                launchGemvTile<T, S, decltype(b)::value>(p, st);
            } else if (alignedX) {
                launchGemvMma<T, S, decltype(b)::value>(p, st);
            } else {
                launchGemvTile<T, S, decltype(b)::value>(p, st);
            }
        };
        dispatchBits(bits, "weight_only_gemv", launch);
    });
}

template <typename T>
void dequantizeTyped(void* out, void const* qweight, void const* scales, void const* zeros, int64_t n, int numPacks,
                     int groups, int shift, bool tiled, int bits, DType scaleDtype, cudaStream_t st) {
    int64_t const total = n * numPacks;
    int const blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, int64_t{multiprocessors()} * 8));
    dispatchFloat(scaleDtype, "weight_only_dequantize", [&](auto s) {
        using S = decltype(s);
        auto launch = [&](auto b) {
            launchKernel("weight_only_dequantize", weightOnlyDequantizeKernel<T, S, decltype(b)::value>, blocks, 256, 0,
                         st, static_cast<T*>(out), static_cast<uint4 const*>(qweight), static_cast<S const*>(scales),
                         static_cast<S const*>(zeros), n, numPacks, groups, shift, tiled);
        };
        dispatchBits(bits, "weight_only_dequantize", launch);
    });
}

} // namespace


namespace weight_only_gemv_detail {

// The launches of one activation dtype, each in a translation unit of its own
// (weight_only_gemv_{float,half,bf16}.cu) so that their kernel instances compile in parallel: in
// one file (206 s for sm_80 + sm_90 on one core) they were the build's longest compile.
// weight_only_gemv.cu dispatches on the dtype.
void gemvFloat(Params const& p, int bits, DType scaleDtype, bool alignedX, cudaStream_t stream);
void gemvHalf(Params const& p, int bits, DType scaleDtype, bool alignedX, cudaStream_t stream);
void gemvBFloat16(Params const& p, int bits, DType scaleDtype, bool alignedX, cudaStream_t stream);
void fp8GemvHalf(Params const& p, cudaStream_t stream);
void fp8GemvBFloat16(Params const& p, cudaStream_t stream);
void dequantizeFloat(void* out, void const* qweight, void const* scales, void const* zeros, int64_t n, int numPacks,
                     int groups, int shift, bool tiled, int bits, DType scaleDtype, cudaStream_t stream);
void dequantizeHalf(void* out, void const* qweight, void const* scales, void const* zeros, int64_t n, int numPacks,
                    int groups, int shift, bool tiled, int bits, DType scaleDtype, cudaStream_t stream);
void dequantizeBFloat16(void* out, void const* qweight, void const* scales, void const* zeros, int64_t n,
                        int numPacks, int groups, int shift, bool tiled, int bits, DType scaleDtype,
                        cudaStream_t stream);

} // namespace weight_only_gemv_detail

} // namespace tensorrt_llm
