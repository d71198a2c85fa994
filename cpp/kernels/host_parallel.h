// Splitting a host kernel's work over the CPU's cores (kernels/host_parallel.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

namespace tensorrt_llm {

// Runs fn(part) for every part in [0, parts): part 0 on the calling thread, the others on
// workers of a pool kept between calls, and returns when every part is done. Workers spin for a
// short while after a job (a decode step's kernels come tens of microseconds apart), then
// sleep. One call runs at a time (another caller waits); parts <= 1 runs fn(0) here. fn must
// not throw (a worker cannot pass an exception back).
void hostParallel(int parts, std::function<void(int)> const& fn);

// Rows [0, n) of a GEMV's weight over at most `threads` parts of at least minRows rows each, each
// part but the last a whole number of `multiple` rows (the kernel's widest pass): fn(begin, end)
// for every part, through hostParallel.
template <typename Fn>
void hostParallelRows(int64_t n, int threads, int64_t minRows, int64_t multiple, Fn const& fn) {
    int const parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n / minRows)));
    int64_t const perPart = ((n + parts - 1) / parts + multiple - 1) / multiple * multiple;
    hostParallel(parts, [&](int part) {
        int64_t const begin = part * perPart;
        fn(begin, std::min(n, begin + perPart));
    });
}

} // namespace tensorrt_llm
