// What the standalone CUDA benchmarks here (launch_chain.cu, stage_x.cu) share: a check of every
// CUDA call, a launch's configuration, and the best of five timings of a launch repeated on a
// stream.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(x)                                                                                 \
    do {                                                                                         \
        cudaError_t e = (x);                                                                     \
        if (e != cudaSuccess) {                                                                  \
            std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));                \
            std::exit(1);                                                                        \
        }                                                                                        \
    } while (0)

// A launch of `grid` blocks of `block` threads with `count` attributes.
inline cudaLaunchConfig_t launchConfig(unsigned grid, unsigned block, int smem, cudaStream_t stream,
                                       cudaLaunchAttribute* attrs, unsigned count) {
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attrs;
    config.numAttrs = count;
    return config;
}

// Milliseconds that `times` calls of launch() take on `stream`: the best of five rounds.
template <typename Launch>
float bestOfFive(cudaStream_t stream, int times, Launch&& launch) {
    cudaEvent_t start, end;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&end));
    float best = 1e30f;
    for (int r = 0; r < 5; ++r) {
        CHECK(cudaEventRecord(start, stream));
        for (int i = 0; i < times; ++i) launch();
        CHECK(cudaEventRecord(end, stream));
        CHECK(cudaEventSynchronize(end));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, start, end));
        best = ms < best ? ms : best;
    }
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(end));
    return best;
}
