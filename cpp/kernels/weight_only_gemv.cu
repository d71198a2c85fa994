// Weight-only INT8 / INT4 linear layers: y[M, N] = x[M, K] @ W^T (+ bias), W in the layouts of
// tensorrt_llm/quantization/formats.py (INT8 [N, K] with per-channel or group scales; INT4
// [N, K / 2], two codes a byte, with group scales and zeros), read as 16-byte packs of int32
// words (16 INT8 or 32 INT4 codes).
//
// The GEMV (decode, a few rows). Decode is bound by the bytes of the weights, so the weight is
// streamed once for up to MT rows of x (more rows loop over tiles of MT, rereading it). A block
// first stores its tile of x in shared memory as float32, laid out so that lanes reading
// consecutive packs read consecutive banks, and for INT4 each pack's sum of x. Then each warp
// owns whole output rows: a lane loads kUnroll packs of the row with their group's scale (and
// zero) before using any, turns the codes into floats in registers, and a warp reduction ends
// the row. The grid is as many blocks as fit on the GPU at once; warps take rows in turn.
//
// A pack lies in one group (a group is a whole number of packs), so a lane applies the group's
// scale once per pack:
//     sum_k x_k (c_k * s + z) = s * sum_k x_k c_k + z * sum_k x_k.
// That is formats.py's W = code * scale + zero up to the float32 rounding of the sums (the
// reference rounds each W to float32 and sums in cuBLAS's order): both far below the
// output's float16 / bfloat16 rounding. Codes become floats without conversion instructions:
// OR-ing an 8-bit value u into the mantissa of 2^23 gives the float 2^23 + u exactly, and one
// subtraction leaves u (INT8 codes are offset by 128 first).
//
// The dequantization (prompt steps, more rows than the GEMV serves): W in the activation dtype,
// W = code * scale + zero in float32 exactly as formats.py (two roundings, no fused
// multiply-add), rounded once to the dtype, for a tensor-core matmul by the caller.
#include "common.cuh"

#include <algorithm>
#include <type_traits>

namespace tensorrt_llm {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <int BITS>
constexpr int kCodes = 128 / BITS;  // codes per 16-byte pack
// 16-byte weight packs a lane has in flight: 128 codes (4 INT4 or 8 INT8 packs); half as many
// for tiles of 8 rows, whose accumulators take the registers (and which reuse each pack 8 times).
template <int BITS, int MT>
constexpr int kUnroll = 128 / kCodes<BITS> / (MT > 4 ? 2 : 1);
constexpr size_t kMaxSmem = 160 * 1024;    // x tile and pack sums; fits sm_80's 163 KB

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
};

__device__ __forceinline__ uint4 loadStreaming(uint4 const* ptr) {
    // Weights are read once per step: keep them from evicting what is reused (x, the KV cache).
    return __ldcs(ptr);
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
            uint4 const* wRow = p.qweight + n * numPacks;
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
                        w[u] = loadStreaming(wRow + pack);
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
    kernel<<<blocks, kThreads, smem, stream>>>(p);
    checkLaunch("weight_only_gemv");
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

// One thread per pack: its codes, scale and zero to kCodes values of T (16-byte stores).
template <typename T, typename S, int BITS>
__global__ void weightOnlyDequantizeKernel(T* __restrict__ out, uint4 const* __restrict__ qweight,
                                           S const* __restrict__ scales, S const* __restrict__ zeros, int64_t n,
                                           int numPacks, int groups, int groupShift) {
    constexpr int C = kCodes<BITS>;
    int64_t const total = n * numPacks;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
        int64_t const row = i / numPacks;
        int const pack = static_cast<int>(i - row * numPacks);
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
        Pack<T, V>* dst = reinterpret_cast<Pack<T, V>*>(out + i * C);
#pragma unroll
        for (int c = 0; c < C / V; ++c) {
            Pack<T, V> o;
#pragma unroll
            for (int e = 0; e < V; ++e) o.v[e] = fromFloat<T>(v[c * V + e]);
            dst[c] = o;
        }
    }
}

// Calls fn(T{}, S{}, std::integral_constant<int, BITS>{}) for the activation dtype, the scales'
// dtype and the format.
template <typename Fn>
void dispatch(DType dtype, DType scaleDtype, int bits, char const* what, Fn&& fn) {
    dispatchFloat(dtype, what, [&](auto t) {
        dispatchFloat(scaleDtype, what, [&](auto s) {
            if (bits == 4) {
                fn(t, s, std::integral_constant<int, 4>{});
            } else if (bits == 8) {
                fn(t, s, std::integral_constant<int, 8>{});
            } else {
                throw std::invalid_argument(std::string(what) + ": bits must be 4 or 8");
            }
        });
    });
}

// log2 of the packs in a group; per channel (groupSize 0) a shift that maps every pack to 0.
int groupShiftOf(int64_t groupSize, int bits) {
    if (groupSize == 0) return 31;
    int64_t const codes = 128 / bits;
    int shift = 0;
    while ((codes << shift) < groupSize) ++shift;
    return shift;
}

} // namespace

void launchWeightOnlyGemv(void* out, void const* x, void const* qweight, void const* scales, void const* zeros,
                          void const* bias, int64_t m, int64_t n, int64_t k, int64_t xRowStride, int64_t outRowStride,
                          int bits, int64_t groupSize, DType dtype, DType scaleDtype, void* stream) {
    if (m == 0 || n == 0) return;
    Params p{};
    p.out = out;
    p.x = x;
    p.qweight = static_cast<uint4 const*>(qweight);
    p.scales = scales;
    p.zeros = zeros;
    p.bias = bias;
    p.m = m;
    p.n = n;
    p.k = k;
    p.xRowStride = xRowStride;
    p.outRowStride = outRowStride;
    p.groups = groupSize == 0 ? 1 : static_cast<int>(k / groupSize);
    p.groupShift = groupShiftOf(groupSize, bits);
    dispatch(dtype, scaleDtype, bits, "weight_only_gemv", [&](auto t, auto s, auto b) {
        launchGemvTile<decltype(t), decltype(s), decltype(b)::value>(p, static_cast<cudaStream_t>(stream));
    });
}

void launchWeightOnlyDequantize(void* out, void const* qweight, void const* scales, void const* zeros, int64_t n,
                                int64_t k, int bits, int64_t groupSize, DType dtype, DType scaleDtype, void* stream) {
    if (n == 0) return;
    int const numPacks = static_cast<int>(k / (128 / bits));
    int const groups = groupSize == 0 ? 1 : static_cast<int>(k / groupSize);
    int const shift = groupShiftOf(groupSize, bits);
    int64_t const total = n * numPacks;
    int const blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, int64_t{multiprocessors()} * 8));
    dispatch(dtype, scaleDtype, bits, "weight_only_dequantize", [&](auto t, auto s, auto b) {
        using T = decltype(t);
        using S = decltype(s);
        weightOnlyDequantizeKernel<T, S, decltype(b)::value><<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<T*>(out), static_cast<uint4 const*>(qweight), static_cast<S const*>(scales),
            static_cast<S const*>(zeros), n, numPacks, groups, shift);
    });
    checkLaunch("weight_only_dequantize");
}

} // namespace tensorrt_llm
