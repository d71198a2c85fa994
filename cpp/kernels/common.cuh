// Small device helpers shared by the kernels: dtype conversion, 16-byte packs, reductions,
// dtype dispatch, the launch of every kernel (launchKernel, with programmatic dependent launch)
// and the grid of the row-per-warp GEMVs.
#pragma once

#include "tensorrt_llm/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace tensorrt_llm {

// ---- float <-> storage type ----
template <typename T>
__device__ __forceinline__ float toFloat(T v);
template <>
__device__ __forceinline__ float toFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ float toFloat<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float toFloat<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T fromFloat(float v);
template <>
__device__ __forceinline__ float fromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half fromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// An activation's FP8 E4M3 code as formats.quantize_fp8_activation makes it: x times the scale's
// correctly rounded float32 reciprocal (`inverse`, __frcp_rn), then cvt's satfinite rounding to
// nearest (ties to even) with the clamp to +-448. The quantize kernel and the norm / activation
// kernels that write codes all round through this.
__device__ __forceinline__ uint8_t fp8Code(float x, float inverse) {
    return __nv_cvt_float_to_fp8(__fmul_rn(x, inverse), __NV_SATFINITE, __NV_E4M3);
}

// A kernel's output element of value v (rounded to T): v itself (O = T) or, for an FP8 linear's
// input (O = uint8_t), its E4M3 code under the static scale whose codeInverse is `inverse`.
template <typename O, typename T>
__device__ __forceinline__ O outputOf(T v, float inverse) {
    if constexpr (std::is_same_v<O, T>) {
        return v;
    } else {
        return fp8Code(toFloat(v), inverse);
    }
}

// Calls fn(O{}) with O the output element of such a kernel: uint8_t codes when it is given the
// static scale of the FP8 linear it feeds, else T.
template <typename T, typename Fn>
void dispatchOutput(void const* codeScale, Fn&& fn) {
    if (codeScale) {
        fn(uint8_t{});
    } else {
        fn(T{});
    }
}

// The `inverse` outputOf takes: the static scale's correctly rounded reciprocal when O holds codes.
template <typename O, typename T>
__device__ __forceinline__ float codeInverse(float const* codeScale) {
    if constexpr (std::is_same_v<O, T>) {
        return 1.f;
    } else {
        return __frcp_rn(*codeScale);
    }
}

// N elements of T loaded or stored as one access (16 bytes when N = 16 / sizeof(T)).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
    T v[N];
};

// Elements per 16-byte access.
template <typename T>
constexpr int kVec16 = 16 / sizeof(T);

inline bool aligned16(void const* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---- reductions ----
struct SumOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename Op>
__device__ __forceinline__ float warpReduce(float v, Op op) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}

// Over the block; every thread gets the result. blockDim.x must be a multiple of 32; `identity`
// fills the lanes of warps that do not exist.
template <typename Op>
__device__ __forceinline__ float blockReduce(float v, Op op, float identity) {
    __shared__ float partial[32];
    __shared__ float total;
    int const lane = threadIdx.x % 32;
    int const warp = threadIdx.x / 32;
    v = warpReduce(v, op);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int const numWarps = blockDim.x / 32;
        float s = lane < numWarps ? partial[lane] : identity;
        s = warpReduce(s, op);
        if (lane == 0) total = s;
    }
    __syncthreads();
    return total;
}

__device__ __forceinline__ float warpReduceSum(float v) { return warpReduce(v, SumOp{}); }
__device__ __forceinline__ float blockReduceSum(float v) { return blockReduce(v, SumOp{}, 0.f); }

inline int roundUp(int64_t x, int m) { return static_cast<int>((x + m - 1) / m * m); }

// Throws with the CUDA error string after a launch (launch configuration errors, missing
// kernel image for the device, ...).
inline void checkLaunch(char const* kernel) {
    cudaError_t const err = cudaGetLastError();
    if (err != cudaSuccess) {
        throw std::runtime_error(std::string(kernel) + ": CUDA error: " + cudaGetErrorName(err) + ": "
                                 + cudaGetErrorString(err));
    }
}

// ---- programmatic dependent launch (sm_90 and later) ----
// A decode step of a small batch is a chain of ~170-260 short kernels, each reading what the one
// before wrote. Launched by launchKernel, a kernel may start while the previous one still runs
// (on Hopper: once every block of the previous kernel has called allowNextKernel or ended): it
// does what needs no earlier kernel's output (the GEMVs send their weights towards L2, where
// the DRAM would otherwise idle through the previous kernel's tail) and then waits in
// waitForPreviousKernel until every earlier kernel has finished and its writes are visible.
// The contract, for every kernel launched through launchKernel: each block calls
// waitForPreviousKernel before it reads anything an earlier kernel wrote, writes any global
// memory, or returns; before that it may only read memory no kernel writes (weights, scales).
// Every kernel calls allowNextKernel right after its wait, not at its start: allowed at the start,
// a chain of kernels whose blocks fit beside each other launches grids several deep, each waiting,
// and runs slower (benchmarks/launch_chain.cu, H200, 256 dependent kernels of 256 blocks each
// reading the last one's 16 KB and 8 MB of weights of its own: 4.15 us a kernel allowed at the
// start, 3.17 after the wait, 4.26 launched the ordinary way; with the blocks held to three an SM
// by their shared memory, 3.63 and 3.79). The batch-1 decode step, one engine captured both ways
// (medians of 8 rounds, the same bits): INT4 g128 2.124 -> 2.117 ms, INT8 2.625 -> 2.622, bf16
// 4.258 -> 4.256.
// Both calls do nothing in a kernel launched the ordinary way (or built for an older GPU).
__device__ __forceinline__ void waitForPreviousKernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allowNextKernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks the memory system to bring `bytes` at `ptr` into L2, without waiting for them (a hint:
// nothing when ptr is off a 16-byte boundary; the bulk prefetch takes whole 16-byte units).
__device__ __forceinline__ void prefetchToL2(void const* ptr, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if ((reinterpret_cast<uintptr_t>(ptr) & 15u) != 0 || bytes < 16) return;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(ptr), "r"(bytes & ~15u) : "memory");
#endif
}

// Rows [first, first + count) of a row-major matrix of `total` rows of `rowBytes` bytes each,
// clipped to the matrix, towards L2: a GEMV block's weight rows, before waitForPreviousKernel.
__device__ __forceinline__ void prefetchRowsToL2(void const* base, int64_t first, int64_t count, int64_t total,
                                                 int64_t rowBytes) {
    if (first >= total) return;
    int64_t const rows = total - first < count ? total - first : count;
    prefetchToL2(static_cast<char const*>(base) + first * rowBytes, static_cast<uint32_t>(rows * rowBytes));
}

// An attribute of the current device, asked once per device and attribute (launches are
// captured in CUDA graphs and come from one thread at a time: the GIL).
inline int deviceAttribute(cudaDeviceAttr attribute) {
    int device = 0;
    cudaGetDevice(&device);
    static std::unordered_map<int64_t, int> cache;
    int64_t const key = (static_cast<int64_t>(device) << 32) | static_cast<int64_t>(attribute);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    int value = 0;
    cudaDeviceGetAttribute(&value, attribute, device);
    return cache[key] = value;
}

inline int multiprocessors() { return deviceAttribute(cudaDevAttrMultiProcessorCount); }

// Whether launches on the current device use programmatic dependent launch: compute capability
// 9.0 or later, unless TRTLLM_ENABLE_PDL=0 (for comparing, or ruling it out).
inline bool programmaticLaunch() {
    static bool const enabled = [] {
        char const* env = std::getenv("TRTLLM_ENABLE_PDL");
        return env == nullptr || std::strcmp(env, "0") != 0;
    }();
    return enabled && deviceAttribute(cudaDevAttrComputeCapabilityMajor) >= 9;
}

// Every kernel of the library is launched here (see the contract above), then checked; `cluster`
// (launchClusterKernel): blocks scheduled together as thread block clusters, whose shared memory
// each other's blocks can read (sm_90).
template <typename... Params, typename... Args>
void launchKernelIn(char const* name, void (*kernel)(Params...), dim3 grid, dim3 const* cluster, dim3 block,
                    size_t smem, cudaStream_t stream, Args&&... args) {
    cudaLaunchAttribute attribute[2];
    unsigned attributes = 0;
    if (programmaticLaunch()) {
        attribute[attributes].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute[attributes++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster != nullptr) {
        attribute[attributes].id = cudaLaunchAttributeClusterDimension;
        attribute[attributes].val.clusterDim.x = cluster->x;
        attribute[attributes].val.clusterDim.y = cluster->y;
        attribute[attributes++].val.clusterDim.z = cluster->z;
    }
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attribute;
    config.numAttrs = attributes;
    cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
    checkLaunch(name);
}

template <typename... Params, typename... Args>
void launchKernel(char const* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                  cudaStream_t stream, Args&&... args) {
    launchKernelIn(name, kernel, grid, nullptr, block, smem, stream, std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
void launchClusterKernel(char const* name, void (*kernel)(Params...), dim3 grid, dim3 cluster, dim3 block,
                         size_t smem, cudaStream_t stream, Args&&... args) {
    launchKernelIn(name, kernel, grid, &cluster, block, smem, stream, std::forward<Args>(args)...);
}

// Blocks of `kernel` (`threads` threads, `smem` bytes of dynamic shared memory) that one
// multiprocessor holds at once, as its registers and shared memory allow; at least 1.
template <typename Kernel>
int residentBlocks(Kernel kernel, int threads, size_t smem) {
    int blocks = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem);
    return std::max(1, blocks);
}

// Dynamic shared memory of at least `smem` bytes with which at most `blocks` blocks of `kernel`
// fit on a multiprocessor (what its registers allow may be more). A kernel's blocks fill each
// multiprocessor as far as they fit, so a grid of one round that registers would let pack densely
// runs on fewer multiprocessors and leaves no room for the next kernel's blocks (which, under
// programmatic launch, start their own loads beside it).
template <typename Kernel>
size_t sharedBytesForBlocksPerSm(Kernel kernel, size_t smem, int blocks) {
    cudaFuncAttributes attributes{};
    cudaFuncGetAttributes(&attributes, kernel);
    size_t const perSm = static_cast<size_t>(deviceAttribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor));
    size_t const reserved = static_cast<size_t>(deviceAttribute(cudaDevAttrReservedSharedMemoryPerBlock));
    size_t const fixed = attributes.sharedSizeBytes + reserved;
    size_t const share = perSm / static_cast<size_t>(blocks + 1) + 1;  // a block's whole share that keeps out one more
    return std::max(smem, share > fixed ? (share - fixed + 127) / 128 * 128 : size_t{0});
}

// Blocks of `threads` threads for a GEMV whose warps own whole output rows, taking the `rows`
// (> 0) in turn: at most as many warps as fit on the GPU at once (the kernel's occupancy with
// `smem` bytes of dynamic shared memory), and of those the fewest that keep the most-loaded
// warp at the same number of rows (equal rows per warp).
template <typename Kernel>
unsigned rowPerWarpBlocks(Kernel kernel, int threads, size_t smem, int64_t rows) {
    int const warpsPerBlock = threads / 32;
    int64_t const maxWarps = int64_t{residentBlocks(kernel, threads, smem)} * multiprocessors() * warpsPerBlock;
    int64_t const rowsPerWarp = (rows + maxWarps - 1) / maxWarps;
    int64_t const warps = (rows + rowsPerWarp - 1) / rowsPerWarp;
    return static_cast<unsigned>((warps + warpsPerBlock - 1) / warpsPerBlock);
}

// Calls fn(T{}) with T the storage type of a floating dtype.
template <typename Fn>
void dispatchFloat(DType dtype, char const* what, Fn&& fn) {
    switch (dtype) {
        case DType::kFloat32: fn(float{}); break;
        case DType::kFloat16: fn(__half{}); break;
        case DType::kBFloat16: fn(__nv_bfloat16{}); break;
        default: throw std::invalid_argument(std::string(what) + ": unsupported dtype " + dtypeName(dtype));
    }
}

} // namespace tensorrt_llm
