// Linear layer of a few rows with its input's producer fused in front (see GemvParams).
//
// A decode step of a small batch reads every weight once and does little else, so its linear
// layers are bandwidth-bound matrix-vector products. cuBLAS does those well, but each one
// follows a small kernel (RMSNorm, SiLU-and-mul) whose launch and ramp cost as much as the
// work. Here every block first computes the layer's input rows into shared memory (the
// prologue, from x in L2), then its warps stream weight rows: a warp owns whole output rows,
// each lane loads 16-byte packs, kUnroll packs in flight before any is used, and a warp
// reduction ends each row. The grid gives every warp the same number of rows, as many warps
// as fit on the GPU at once.
#include "common.cuh"
#include "gemv_prologue.cuh"

namespace tensorrt_llm {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 8;                        // weight packs a lane has in flight
constexpr size_t kMaxSmem = 200 * 1024;          // for the input rows

template <typename T, int V>
__device__ __forceinline__ Pack<T, V> loadStreaming(Pack<T, V> const* ptr) {
    // Weights are read once per step: keep them from evicting what is reused (x, the KV cache).
    uint4 const raw = __ldcs(reinterpret_cast<uint4 const*>(ptr));
    return *reinterpret_cast<Pack<T, V> const*>(&raw);
}

// a[r, :] for r < rows into shared memory (rows up to MAXM are zero-filled, so the main loop
// needs no row test): x's rows, or their prologue (gemv_prologue.cuh). Block 0 also writes
// x + residual to residualOut.
template <typename T, int MAXM, GemvPrologue PRO>
__device__ __forceinline__ void computeInput(GemvParams const& p, T* a) {
    constexpr int V = kVec16<T>;
    using P = Pack<T, V>;
    int const k = static_cast<int>(p.k);
    int const numVec = k / V;
    int const rows = static_cast<int>(p.rows);
#pragma unroll
    for (int r = 0; r < MAXM; ++r) {
        P* aRow = reinterpret_cast<P*>(a + r * k);
        if (r >= rows) {
            P zero;
#pragma unroll
            for (int e = 0; e < V; ++e) zero.v[e] = fromFloat<T>(0.f);
            for (int i = threadIdx.x; i < numVec; i += kThreads) aRow[i] = zero;
            continue;
        }
        if constexpr (PRO == GemvPrologue::kNone) {
            P const* xRow = reinterpret_cast<P const*>(static_cast<T const*>(p.x) + r * p.xRowStride);
            for (int i = threadIdx.x; i < numVec; i += kThreads) aRow[i] = xRow[i];
        } else {
            prologueRow<T, PRO, kThreads, 1>(p, r, aRow, [&](int i, P const& o) { aRow[i] = o; });
        }
    }
}

template <typename T, int MAXM, GemvPrologue PRO>
__global__ void __launch_bounds__(kThreads) gemvKernel(GemvParams p) {
    // The block's first kWarps weight rows (contiguous) towards L2 while the previous kernel ends.
    if (threadIdx.x == 0) {
        prefetchRowsToL2(p.weight, int64_t{blockIdx.x} * kWarps, kWarps, p.n, p.k * int64_t{sizeof(T)});
    }
    waitForPreviousKernel();
    allowNextKernel();  // see launchKernel: after the wait
    constexpr int V = kVec16<T>;
    using P = Pack<T, V>;
    extern __shared__ __align__(16) unsigned char smemBytes[];
    T* a = reinterpret_cast<T*>(smemBytes);  // [MAXM][k]
    int const k = static_cast<int>(p.k);
    int const numVec = k / V;
    int const lane = threadIdx.x % 32;

    computeInput<T, MAXM, PRO>(p, a);
    __syncthreads();

    int64_t const totalWarps = static_cast<int64_t>(gridDim.x) * kWarps;
    for (int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; n < p.n; n += totalWarps) {
        P const* wRow = reinterpret_cast<P const*>(static_cast<T const*>(p.weight) + n * p.k);
        float acc[MAXM];
#pragma unroll
        for (int r = 0; r < MAXM; ++r) acc[r] = 0.f;
        for (int v0 = lane; v0 < numVec; v0 += 32 * kUnroll) {
            P w[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                if (v0 + u * 32 < numVec) w[u] = loadStreaming(wRow + v0 + u * 32);
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                int const v = v0 + u * 32;
                if (v >= numVec) break;
                float wf[V];
#pragma unroll
                for (int e = 0; e < V; ++e) wf[e] = toFloat(w[u].v[e]);
#pragma unroll
                for (int r = 0; r < MAXM; ++r) {
                    P const x = reinterpret_cast<P const*>(a + r * k)[v];
#pragma unroll
                    for (int e = 0; e < V; ++e) acc[r] += wf[e] * toFloat(x.v[e]);
                }
            }
        }
        float const bias = p.bias ? toFloat(static_cast<T const*>(p.bias)[n]) : 0.f;
#pragma unroll
        for (int r = 0; r < MAXM; ++r) {
            float const sum = warpReduceSum(acc[r]);
            if (lane == 0 && r < p.rows) static_cast<T*>(p.out)[r * p.outRowStride + n] = fromFloat<T>(sum + bias);
        }
    }
}

size_t smemBytesFor(int maxRows, int64_t k, int elementSize) {
    return static_cast<size_t>(maxRows) * static_cast<size_t>(k) * static_cast<size_t>(elementSize);
}

int maxRowsInstance(int64_t rows) { return rows <= 1 ? 1 : rows <= 2 ? 2 : 4; }

template <typename T, int MAXM, GemvPrologue PRO>
void launchInstance(GemvParams const& p, cudaStream_t stream) {
    auto kernel = gemvKernel<T, MAXM, PRO>;
    size_t const smem = smemBytesFor(MAXM, p.k, sizeof(T));
    if (smem > 48 * 1024) {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    }
    unsigned const blocks = rowPerWarpBlocks(kernel, kThreads, smem, p.n);
    launchKernel("gemv", kernel, blocks, kThreads, smem, stream, p);
}

template <typename T, int MAXM>
void launchRows(GemvParams const& p, cudaStream_t stream) {
    switch (p.prologue) {
        case GemvPrologue::kNone: launchInstance<T, MAXM, GemvPrologue::kNone>(p, stream); break;
        case GemvPrologue::kRmsNorm: launchInstance<T, MAXM, GemvPrologue::kRmsNorm>(p, stream); break;
        case GemvPrologue::kSiluAndMul: launchInstance<T, MAXM, GemvPrologue::kSiluAndMul>(p, stream); break;
        default: throw std::invalid_argument("gemv: unknown prologue");
    }
}

} // namespace

bool gemvSupports(int64_t rows, int64_t k, DType dtype) {
    if (dtype != DType::kFloat32 && dtype != DType::kFloat16 && dtype != DType::kBFloat16) return false;
    int const size = dtypeSize(dtype);
    return rows >= 1 && rows <= kGemvMaxRows && k > 0 && k % (16 / size) == 0
           && smemBytesFor(maxRowsInstance(rows), k, size) <= kMaxSmem;
}

void launchGemv(GemvParams const& p, void* stream) {
    if (p.n == 0) return;
    auto s = static_cast<cudaStream_t>(stream);
    dispatchFloat(p.dtype, "gemv", [&](auto tag) {
        using T = decltype(tag);
        switch (maxRowsInstance(p.rows)) {
            case 1: launchRows<T, 1>(p, s); break;
            case 2: launchRows<T, 2>(p, s); break;
            default: launchRows<T, 4>(p, s); break;
        }
    });
}

} // namespace tensorrt_llm
