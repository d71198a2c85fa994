// FP8 E4M3 GEMM of few rows on Hopper: out[M, N] = (x . W^T) * inputScale * weightScale (+ bias),
// x the E4M3 codes of M <= 32 rows (the norm / activation / attention kernels write them), W the
// FP8 weight [N, K] in row order. The batch-32 decode step's linears, where cuBLASLt's FP8 GEMM
// spent about 3 us a call above the weight's bytes (benchmarks/README.md).
//
// A block (one warpgroup) owns 64 output features and a part of K: the tensor memory accelerator
// copies 64 weight rows x BK bytes and the 32 rows of x (rows past M read as zeros) into a ring of
// STAGES slots of shared memory in the 128-byte swizzle the tensor cores read, each slot's arrival
// counted by an mbarrier; wgmma.m64n32k32 (A = the weight slice, B = x, both K-major, float32
// accumulators) consumes a slot, then the slot is refilled. The weight's first slots are requested
// before waitForPreviousKernel (programmatic dependent launch): the weight is no kernel's output,
// so its bytes travel while the previous kernel ends. Layers of at most 8,192 features split K in
// two over a cluster of two blocks (64 features a block would leave half the SMs idle), the
// second block's partial sums read by the first through distributed shared memory.
//
// Compiled for sm_90a only (wgmma and the tensor maps are Hopper's): a separate object of the
// build (cpp/CMakeLists.txt), present when the build targets sm_90.
#include "../common.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <stdexcept>
#include <string>

namespace tensorrt_llm {
namespace {

constexpr int kFeatures = 64;  // rows of W a block owns: wgmma's M
constexpr int kRows = static_cast<int>(kFp8GemmWgmmaMaxRows);  // rows of x: wgmma's N
static_assert(kRows == 32, "the kernel's wgmma is m64n32k32, its accumulators 16 a thread");
constexpr int kThreads = 128;  // one warpgroup
constexpr int kStages = 4;
constexpr int kSwizzle = 128;  // bytes of K one tensor-map box spans (the swizzle's row)

__device__ __forceinline__ uint32_t sharedAddress(void const* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A wgmma operand in shared memory: K-major rows of 128 bytes in the 128-byte swizzle, groups of
// 8 rows 1,024 bytes apart (the stride); the leading offset is unused in this layout.
__device__ __forceinline__ uint64_t operandDescriptor(uint32_t address) {
    return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32)
           | (uint64_t{1} << 62);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wgmma64x32x32(float (&d)[16], uint64_t a, uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a), "l"(b));
}

__device__ __forceinline__ void barrierInit(uint64_t* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sharedAddress(bar)) : "memory");
}
__device__ __forceinline__ void barrierExpect(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sharedAddress(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void barrierWait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n}\n" ::"r"(sharedAddress(bar)),
        "r"(parity)
        : "memory");
}
// The box at (column x in bytes, row y) of `map` into dst, counted on bar.
__device__ __forceinline__ void copyBox(void* dst, CUtensorMap const* map, int x, int y, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            sharedAddress(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(sharedAddress(bar))
        : "memory");
}
__device__ __forceinline__ void clusterSync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
#endif

struct GemmArgs {
    void* out;
    float const* weightScale;  // [1] or [n]
    float const* inputScale;   // [1]
    void const* bias;          // [n] of T, or nullptr
    int64_t outRowStride;
    int m, n, k, splits;
    bool perChannel;
};

// BK: bytes of K a slot holds (multiples of the 128-byte box).
template <typename T, int BK>
__global__ void __launch_bounds__(kThreads) fp8GemmWgmmaKernel(const __grid_constant__ CUtensorMap weightMap,
                                                               const __grid_constant__ CUtensorMap xMap, GemmArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int kWeightBytes = kFeatures * BK, kXBytes = kRows * BK, kBoxes = BK / kSwizzle;
    extern __shared__ uint8_t sharedRaw[];
    // The swizzle is of address bits: slots start on 1,024-byte boundaries.
    uint8_t* const ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(sharedRaw) + 1023) & ~uintptr_t{1023});
    uint8_t* const weightSlots = ring;
    uint8_t* const xSlots = ring + kStages * kWeightBytes;
    __shared__ uint64_t full[kStages];
    int const tid = threadIdx.x;
    int const feature0 = blockIdx.x * kFeatures;
    int const kPart = a.k / a.splits;
    int const kBegin = blockIdx.y * kPart;
    int const steps = kPart / BK;
    if (tid == 0) {
        for (int s = 0; s < kStages; ++s) barrierInit(&full[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto requestWeight = [&](int slot, int step) {
        barrierExpect(&full[slot], kWeightBytes + kXBytes);
        for (int j = 0; j < kBoxes; ++j) {
            copyBox(weightSlots + slot * kWeightBytes + j * kFeatures * kSwizzle, &weightMap,
                    kBegin + step * BK + j * kSwizzle, feature0, &full[slot]);
        }
    };
    auto requestX = [&](int slot, int step) {
        for (int j = 0; j < kBoxes; ++j) {
            copyBox(xSlots + slot * kXBytes + j * kRows * kSwizzle, &xMap, kBegin + step * BK + j * kSwizzle, 0,
                    &full[slot]);
        }
    };
    if (tid == 0) {
        for (int s = 0; s < kStages && s < steps; ++s) requestWeight(s, s);
    }
    waitForPreviousKernel();  // see launchKernel: x is the previous kernel's output
    allowNextKernel();
    if (tid == 0) {
        for (int s = 0; s < kStages && s < steps; ++s) requestX(s, s);
    }
    float acc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = 0.f;
    for (int step = 0; step < steps; ++step) {
        int const slot = step % kStages;
        barrierWait(&full[slot], (step / kStages) & 1);
        uint32_t const w0 = sharedAddress(weightSlots + slot * kWeightBytes);
        uint32_t const x0 = sharedAddress(xSlots + slot * kXBytes);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < BK / 32; ++kk) {
            // k-step kk: box kk / 4, 32 bytes further along its swizzled rows per step
            int const box = kk / (kSwizzle / 32), within = (kk % (kSwizzle / 32)) * 32;
            wgmma64x32x32(acc, operandDescriptor(w0 + box * kFeatures * kSwizzle + within),
                          operandDescriptor(x0 + box * kRows * kSwizzle + within));
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        __syncthreads();  // every warp is done with the slot before it is refilled
        if (tid == 0 && step + kStages < steps) {
            requestWeight(slot, step + kStages);
            requestX(slot, step + kStages);
        }
    }

    if (a.splits > 1) {
        // Each block leaves its partial sums in its own ring (all slots consumed); block 0 of the
        // cluster adds the others' through distributed shared memory, then writes.
        float* const partial = reinterpret_cast<float*>(ring);
#pragma unroll
        for (int i = 0; i < 16; ++i) partial[i * kThreads + tid] = acc[i];
        clusterSync();
        uint32_t rank;
        asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
        if (rank == 0) {
            for (int r = 1; r < a.splits; ++r) {
#pragma unroll
                for (int i = 0; i < 16; ++i) {
                    uint32_t remote;
                    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                                 : "=r"(remote)
                                 : "r"(sharedAddress(partial + i * kThreads + tid)), "r"(r));
                    float v;
                    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
                    acc[i] += v;
                }
            }
        }
        clusterSync();  // the others' shared memory stays until block 0 has read it
        if (rank != 0) return;
    }
    // acc[4j + e]: feature 16 * warp + lane / 4 (+ 8 for e >= 2), row of x 8j + 2 (lane % 4) (+ 1 for odd e)
    int const warp = tid / 32, lane = tid % 32;
    float const inputScale = *a.inputScale;
    T* const out = static_cast<T*>(a.out);
    T const* const bias = static_cast<T const*>(a.bias);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int const feature = feature0 + 16 * warp + lane / 4 + (e >= 2 ? 8 : 0);
            int const row = 8 * j + 2 * (lane % 4) + (e & 1);
            if (row < a.m) {
                float v = acc[4 * j + e] * inputScale * a.weightScale[a.perChannel ? feature : 0];
                if (bias) v += toFloat(bias[feature]);  // the product rounded to float32, then the bias
                out[row * a.outRowStride + feature] = fromFloat<T>(v);
            }
        }
    }
#endif
}

PFN_cuTensorMapEncodeTiled_v12000 encodeTiled() {
    static PFN_cuTensorMapEncodeTiled_v12000 const fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult found{};
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
        return found == cudaDriverEntryPointSuccess ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p) : nullptr;
    }();
    if (fn == nullptr) throw std::runtime_error("fp8_gemm_wgmma: the CUDA driver has no cuTensorMapEncodeTiled");
    return fn;
}

// `rows` rows of `cols` bytes, `rowStride` bytes apart, in boxes of boxRows x 128 bytes (128-byte
// swizzle); rows past the end read as zeros.
CUtensorMap byteMatrixMap(void const* base, int64_t rows, int64_t cols, int64_t rowStride, int boxRows) {
    CUtensorMap map;
    cuuint64_t const dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
    cuuint64_t const strides[1] = {static_cast<cuuint64_t>(rowStride)};
    cuuint32_t const box[2] = {kSwizzle, static_cast<cuuint32_t>(boxRows)};
    cuuint32_t const elementStrides[2] = {1, 1};
    CUresult const r = encodeTiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box,
                                     elementStrides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) throw std::runtime_error("fp8_gemm_wgmma: cuTensorMapEncodeTiled failed (" + std::to_string(r) + ")");
    return map;
}

template <typename T, int BK>
void launchAs(CUtensorMap const& weightMap, CUtensorMap const& xMap, GemmArgs const& a, cudaStream_t stream) {
    auto kernel = fp8GemmWgmmaKernel<T, BK>;
    size_t const smem = size_t{kStages} * (kFeatures + kRows) * BK + 1024;  // + the alignment of the ring
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    launchClusterKernel("fp8_gemm_wgmma", kernel, dim3(a.n / kFeatures, a.splits), dim3(1, a.splits), kThreads,
                        smem, stream, weightMap, xMap, a);
}

} // namespace

bool fp8GemmWgmmaCompiled() { return true; }

void launchFp8GemmWgmma(void* out, void const* codes, void const* qweight, void const* weightScale,
                        void const* inputScale, void const* bias, int64_t m, int64_t n, int64_t k,
                        int64_t outRowStride, bool perChannel, DType dtype, void* stream) {
    if (m == 0) return;
    GemmArgs a{};
    a.out = out;
    a.weightScale = static_cast<float const*>(weightScale);
    a.inputScale = static_cast<float const*>(inputScale);
    a.bias = bias;
    a.outRowStride = outRowStride;
    a.m = static_cast<int>(m);
    a.n = static_cast<int>(n);
    a.k = static_cast<int>(k);
    a.perChannel = perChannel;
    // H200, the 8B shapes at 32 rows, each alone (weights cycled past L2): a K part of 256 bytes a
    // slot, 512 for down's K = 14,336 (fewer, longer steps), 128 for gate_up's 28,672 features
    // (448 blocks: smaller slots, more blocks an SM); split K in two up to 8,192 features.
    a.splits = n <= 8192 && k % 256 == 0 ? 2 : 1;
    int bk = k > 8192 ? 512 : (n > 16384 ? 128 : 256);
    while (bk > kSwizzle && (k / a.splits) % bk != 0) bk /= 2;
    CUtensorMap const weightMap = byteMatrixMap(qweight, n, k, k, kFeatures);
    CUtensorMap const xMap = byteMatrixMap(codes, m, k, k, kRows);
    auto const st = static_cast<cudaStream_t>(stream);
    auto launchBk = [&](auto t) {
        using T = decltype(t);
        switch (bk) {
            case 512: launchAs<T, 512>(weightMap, xMap, a, st); break;
            case 256: launchAs<T, 256>(weightMap, xMap, a, st); break;
            default: launchAs<T, 128>(weightMap, xMap, a, st); break;
        }
    };
    if (dtype == DType::kFloat16) {
        launchBk(__half{});
    } else {
        launchBk(__nv_bfloat16{});
    }
}

} // namespace tensorrt_llm
