// The cost of a kernel boundary: a CUDA graph of 256 dependent kernels, each block reading the
// whole 16 KB vector the previous kernel wrote (x) and a slice of weights of its own (loaded
// before its dependency wait), writing 16 outputs of the next x. Per launch mode, microseconds a
// kernel (best of 5 replays of 20 graphs):
//   0 ordinary launches (the graph orders each kernel after the last);
//   1 programmatic dependent launch, each block allowing the next kernel at its start;
//   2 programmatic launch, the dependency kept by a counter per kernel that each block adds one
//     to when done (release) and the next kernel's blocks spin on (acquire), no griddepcontrol.wait;
//   3 programmatic launch, each block allowing the next kernel right after its wait
//     (cpp/kernels/common.cuh's rule);
//   4 programmatic launch, no allowance (the next kernel launches as blocks end);
//   5 no boundary: one persistent kernel takes the 256 steps in turn, each block loading its step's
//     weights, then waiting at a grid barrier (a counter every block adds one to after each step)
//     for the step before it (one cooperative launch a chain, no graph); skipped where the blocks
//     do not all fit at once. What a kernel that holds a whole decoder layer would pay at each of
//     its phases.
//
//   nvcc -O3 -arch=sm_90 -o launch_chain benchmarks/launch_chain.cu
//   ./launch_chain <16-byte weight loads a thread, 0-8> <dynamic shared memory a block, KB>
// Figures: benchmarks/README.md, "Where a kernel boundary's time goes" (modes 0-4) and "A grid
// barrier against a kernel boundary" (mode 5).
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#include "cuda_bench.cuh"

constexpr int kK = 4096;       // x's length
constexpr int kThreads = 256;
constexpr int kKernels = 256;  // a graph's chain
constexpr int kBlocks = kK / 16;

struct Step {
    float const* x;
    float* y;
    float4 const* w;
    int loads;               // 16-byte weight loads a thread
    unsigned const* waitOn;  // mode 2: the previous kernel's counter
    unsigned* signal;        // mode 2: this kernel's
    unsigned target;
    int mode;
};

// The block's weights of a step, into registers.
__device__ __forceinline__ void loadWeights(float4 const* w, int loads, float4 (&r)[8]) {
    float4 const* mine = w + static_cast<size_t>(blockIdx.x) * kThreads * loads + threadIdx.x;
#pragma unroll
    for (int i = 0; i < 8; ++i) r[i] = i < loads ? __ldg(mine + i * kThreads) : make_float4(0, 0, 0, 0);
}

// A step's work once its input is there: the whole of x, 16 outputs a block.
// sync: a barrier at the end (mode 2 before its signal; mode 5 before the block's next step reuses red).
__device__ __forceinline__ void reduceStep(float const* x, float* y, float4 const (&w)[8], bool sync) {
    float acc = 0.f;
    for (int k = threadIdx.x; k < kK; k += kThreads) acc += x[k] * (w[k / kThreads % 8].x + 1.f);
#pragma unroll
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(~0u, acc, o);
    __shared__ float red[kThreads / 32];
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x < 16) {
        float s = 0.f;
        for (int i = 0; i < kThreads / 32; ++i) s += red[i];
        y[blockIdx.x * 16 + threadIdx.x] = s * 1e-4f + threadIdx.x;
    }
    if (sync) __syncthreads();
}

__global__ void __launch_bounds__(kThreads) step(Step p) {
    extern __shared__ float unused[];  // only to limit the blocks an SM
    if (p.mode == 1 || p.mode == 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    float4 w[8];
    loadWeights(p.w, p.loads, w);
    if (p.mode == 1 || p.mode >= 3) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (p.mode == 3) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (p.mode == 2) {
        if (threadIdx.x == 0) {
            unsigned v;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p.waitOn));
            } while (v < p.target);
        }
        __syncthreads();
    }
    reduceStep(p.x, p.y, w, p.mode == 2);
    if (p.mode == 2) {
        if (threadIdx.x == 0) {
            __threadfence();
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p.signal) : "memory");
        }
    }
}

// Mode 5: the whole chain in one kernel; step i's weights are loaded before the barrier that
// waits for every block's step i - 1 (counter at i x blocks), as mode 3 loads them before its wait.
__global__ void __launch_bounds__(kThreads) persistentChain(float* x0, float* x1, float4 const* w, size_t perKernel,
                                                            int loads, unsigned* counter) {
    extern __shared__ float unused[];
    for (int i = 0; i < kKernels; ++i) {
        float4 r[8];
        loadWeights(w + perKernel * i, loads, r);
        if (i > 0) {
            if (threadIdx.x == 0) {
                unsigned v;
                do {
                    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter));
                } while (v < static_cast<unsigned>(i) * gridDim.x);
            }
            __syncthreads();
        }
        reduceStep(i % 2 ? x1 : x0, i % 2 ? x0 : x1, r, true);
        if (threadIdx.x == 0) {
            __threadfence();
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
        }
    }
}

int main(int argc, char** argv) {
    int const loads = argc > 1 ? std::atoi(argv[1]) : 8;
    int const smem = (argc > 2 ? std::atoi(argv[2]) : 0) * 1024;
    if (loads < 0 || loads > 8) {
        std::printf("weight loads a thread: 0 to 8\n");
        return 1;
    }
    CHECK(cudaFuncSetAttribute(step, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    float* x[2];
    for (auto& b : x) {
        CHECK(cudaMalloc(&b, kK * sizeof(float)));
        CHECK(cudaMemset(b, 0, kK * sizeof(float)));
    }
    size_t const perKernel = size_t{kBlocks} * kThreads * 8;  // float4s
    float4* w;
    CHECK(cudaMalloc(&w, perKernel * kKernels * sizeof(float4)));  // 2 GB: no kernel's weights in L2
    CHECK(cudaMemset(w, 0, perKernel * kKernels * sizeof(float4)));
    unsigned* counters;
    CHECK(cudaMalloc(&counters, (kKernels + 1) * sizeof(unsigned)));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    char const* names[] = {"ordinary",      "allowed at start", "counters", "allowed after wait",
                           "never allowed", "one kernel"};
    CHECK(cudaFuncSetAttribute(persistentChain, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    int perSm = 0, sms = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, persistentChain, kThreads, smem));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    for (int mode = 0; mode < 6; ++mode) {
        if (mode == 5 && perSm * sms < kBlocks) {  // its barrier needs every block resident at once
            std::printf("shared memory %3d KB a block, %-18s skipped: %d blocks do not fit at once\n", smem / 1024,
                        names[mode], kBlocks);
            continue;
        }
        // Modes 0-4: the chain captured as a graph. Mode 5: the counter's reset and one cooperative
        // launch (all blocks resident at once, or an error rather than a hang), outside any graph.
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        if (mode != 5) {
            CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            if (mode == 2) CHECK(cudaMemsetAsync(counters, 0, (kKernels + 1) * sizeof(unsigned), stream));
            for (int i = 0; i < kKernels; ++i) {
                Step p{x[i % 2], x[(i + 1) % 2], w + perKernel * i, loads, counters + i, counters + i + 1,
                       i == 0 ? 0u : unsigned{kBlocks}, mode};
                cudaLaunchAttribute attribute{};
                attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
                attribute.val.programmaticStreamSerializationAllowed = 1;
                cudaLaunchConfig_t const config =
                    launchConfig(kBlocks, kThreads, smem, stream, &attribute, mode == 0 ? 0 : 1);
                CHECK(cudaLaunchKernelEx(&config, step, p));
            }
            CHECK(cudaStreamEndCapture(stream, &graph));
            CHECK(cudaGraphInstantiate(&exec, graph, 0));
        }
        auto chain = [&] {
            if (mode != 5) {
                CHECK(cudaGraphLaunch(exec, stream));
                return;
            }
            CHECK(cudaMemsetAsync(counters, 0, sizeof(unsigned), stream));
            cudaLaunchAttribute cooperative{};
            cooperative.id = cudaLaunchAttributeCooperative;
            cooperative.val.cooperative = 1;
            cudaLaunchConfig_t const config = launchConfig(kBlocks, kThreads, smem, stream, &cooperative, 1);
            CHECK(cudaLaunchKernelEx(&config, persistentChain, x[0], x[1], static_cast<float4 const*>(w), perKernel,
                                     loads, counters));
        };
        for (int i = 0; i < 5; ++i) chain();
        float const best = bestOfFive(stream, 20, chain);
        std::printf("weights %5zu KB a kernel, shared memory %3d KB a block, %-18s %6.2f us a kernel\n",
                    size_t{kBlocks} * kThreads * loads * 16 / 1024, smem / 1024, names[mode],
                    best * 1e3f / 20 / kKernels);
        if (exec != nullptr) {
            CHECK(cudaGraphExecDestroy(exec));
            CHECK(cudaGraphDestroy(graph));
        }
    }
    return 0;
}
