// What it costs every block of a GEMV to bring the whole of x (the previous kernel's output) into
// its shared memory, by the way it is brought. A CUDA graph of 64 dependent kernels under
// programmatic launch (each allowing the next right after its wait, as cpp/kernels/common.cuh's
// rule says); each kernel's blocks stage x (k bfloat16 values, in L2: the previous kernel wrote
// it), then block b copies the values i = b, b + blocks, ... of x from shared memory into the next
// kernel's x, so that every kernel depends on every block of the one before. Per way, microseconds
// a kernel (best of 5 replays of 10 graphs), after a check that the chain carried x unchanged:
//   0 each warp loads its eighth of x with plain 16-byte loads, two a lane in flight, one pass
//     after another (the INT4 pipelined GEMV's staging in its norm kernels; the others take four);
//   1 one bulk copy (TMA) of x a block, completed on an mbarrier;
//   2, 4 clusters of 2 or 4 blocks: each block copies its share of x to every block of its cluster
//     at once (multicast), so L2 gives out x once a cluster.
//
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o stage_x benchmarks/stage_x.cu
//   ./stage_x <k: a multiple of 64, at most 16,384> <blocks: a multiple of 4> <shared memory a block, KB>
// e.g. ./stage_x 4096 396 70 (qkv, gate_up: three blocks an SM) and ./stage_x 14336 256 100 (down).
// Figures, and what the same ways cost inside the GEMV: benchmarks/README.md, "Where a one-round
// GEMV's blocks land; what staging x costs the INT4 step".
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <vector>

#include "cuda_bench.cuh"

constexpr int kThreads = 256;
constexpr int kKernels = 64;
constexpr int kMaxK = 16384;

__device__ __forceinline__ uint32_t smemAddress(void const* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Way 0: warp w takes x's 16-byte vectors w x 32 + lane, + 256, ... two at a time.
__device__ __forceinline__ void stagePlain(uint4 const* x, uint4* xs, int vecs) {
    for (int base = threadIdx.x; base < vecs; base += 2 * kThreads) {
        uint4 a = __ldcg(x + base);
        uint4 b = base + kThreads < vecs ? __ldcg(x + base + kThreads) : make_uint4(0, 0, 0, 0);
        xs[base] = a;
        if (base + kThreads < vecs) xs[base + kThreads] = b;
    }
    __syncthreads();
}

// Ways 1, 2, 4: each block of a cluster of `ways` copies its share of x (bytes `share` apart)
// to the same place in every block of the cluster; every block waits on its own mbarrier for all
// of x. The mbarriers are set up (and the cluster met) before the previous kernel's wait.
__device__ __forceinline__ void stageBulk(void const* x, void* xs, int bytes, int ways, uint64_t* barrier) {
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smemAddress(barrier)),
                     "r"(bytes)
                     : "memory");
        unsigned rank = 0;
        if (ways > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
        int const share = bytes / ways;  // a multiple of 16: k is a multiple of 64
        char const* src = static_cast<char const*>(x) + rank * share;
        uint32_t const dst = smemAddress(static_cast<char*>(xs) + rank * share);
        if (ways == 1) {
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                "l"(src), "r"(share), "r"(smemAddress(barrier))
                : "memory");
        } else {
            uint16_t const mask = static_cast<uint16_t>((1u << ways) - 1);
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, "
                "[%3], %4;" ::"r"(dst),
                "l"(src), "r"(share), "r"(smemAddress(barrier)), "h"(mask)
                : "memory");
        }
    }
    uint32_t done = 0;
    while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(smemAddress(barrier))
            : "memory");
    }
    __syncthreads();
}

__global__ void __launch_bounds__(kThreads) step(__nv_bfloat16 const* x, __nv_bfloat16* next, int k, int way) {
    extern __shared__ __align__(128) unsigned char shared[];
    __shared__ __align__(8) uint64_t barrier;
    if (way > 0) {
        if (threadIdx.x == 0) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smemAddress(&barrier)) : "memory");
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        if (way > 1) {  // every block's mbarrier set up before any block's copy can reach it
            asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
        } else {
            __syncthreads();
        }
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    auto* xs = reinterpret_cast<__nv_bfloat16*>(shared);
    if (way == 0) {
        stagePlain(reinterpret_cast<uint4 const*>(x), reinterpret_cast<uint4*>(xs), k / 8);
    } else {
        stageBulk(x, xs, k * 2, way, &barrier);
    }
    // Every block has waited for the whole of x to land in it, so none leaves while a copy of its
    // cluster still writes to it.
    for (int i = blockIdx.x + gridDim.x * threadIdx.x; i < k; i += gridDim.x * kThreads) next[i] = xs[i];
}

int main(int argc, char** argv) {
    int const k = argc > 1 ? std::atoi(argv[1]) : 4096;
    int const blocks = argc > 2 ? std::atoi(argv[2]) : 396;
    int const smemKb = argc > 3 ? std::atoi(argv[3]) : 70;
    if (k <= 0 || k % 64 != 0 || k > kMaxK || blocks <= 0 || blocks % 4 != 0 || smemKb * 1024 < k * 2 ||
        smemKb > 200) {
        std::printf("k: a multiple of 64 up to %d; blocks: a multiple of 4; shared memory: x's 2k bytes to 200 KB\n",
                    kMaxK);
        return 1;
    }
    int const smem = smemKb * 1024;
    CHECK(cudaFuncSetAttribute(step, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    std::vector<__nv_bfloat16> host(k);
    for (int i = 0; i < k; ++i) host[i] = __float2bfloat16(static_cast<float>(i % 251));
    __nv_bfloat16* x[2];
    for (auto& b : x) {
        CHECK(cudaMalloc(&b, k * sizeof(__nv_bfloat16)));
        CHECK(cudaMemcpy(b, host.data(), k * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    }
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    int const ways[] = {0, 1, 2, 4};
    char const* names[] = {"plain loads, each warp", "one bulk copy a block", "multicast, cluster of 2",
                           "multicast, cluster of 4"};
    for (int w = 0; w < 4; ++w) {
        CHECK(cudaMemcpy(x[0], host.data(), k * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
        CHECK(cudaMemset(x[1], 0, k * sizeof(__nv_bfloat16)));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < kKernels; ++i) {
            cudaLaunchAttribute attributes[2];
            attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attributes[0].val.programmaticStreamSerializationAllowed = 1;
            attributes[1].id = cudaLaunchAttributeClusterDimension;
            attributes[1].val.clusterDim.x = ways[w] > 1 ? ways[w] : 1;
            attributes[1].val.clusterDim.y = 1;
            attributes[1].val.clusterDim.z = 1;
            cudaLaunchConfig_t const config = launchConfig(blocks, kThreads, smem, stream, attributes, 2);
            CHECK(cudaLaunchKernelEx(&config, step, static_cast<__nv_bfloat16 const*>(x[i % 2]), x[(i + 1) % 2], k,
                                     ways[w]));
        }
        CHECK(cudaStreamEndCapture(stream, &graph));
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CHECK(cudaGraphLaunch(exec, stream));
        CHECK(cudaStreamSynchronize(stream));
        std::vector<__nv_bfloat16> back(k);  // an even chain ends where it began
        CHECK(cudaMemcpy(back.data(), x[0], k * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
        if (std::memcmp(back.data(), host.data(), k * sizeof(__nv_bfloat16)) != 0) {
            std::printf("k %5d, %3d blocks, %-24s: x not carried through the chain\n", k, blocks, names[w]);
            return 1;
        }
        float const best = bestOfFive(stream, 10, [&] { CHECK(cudaGraphLaunch(exec, stream)); });
        std::printf("k %5d, %3d blocks, shared memory %3d KB a block, %-24s %6.2f us a kernel\n", k, blocks, smemKb,
                    names[w], best * 1e3f / 10 / kKernels);
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));
    }
    return 0;
}
