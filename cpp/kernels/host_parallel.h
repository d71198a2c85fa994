// Splitting a host kernel's work over the CPU's cores (kernels/host_parallel.cpp).
#pragma once

#include <functional>

namespace tensorrt_llm {

// Runs fn(part) for every part in [0, parts): part 0 on the calling thread, the others on
// workers of a pool kept between calls, and returns when every part is done. Workers spin for a
// short while after a job (a decode step's kernels come tens of microseconds apart), then
// sleep. One call runs at a time (another caller waits); parts <= 1 runs fn(0) here. fn must
// not throw (a worker cannot pass an exception back).
void hostParallel(int parts, std::function<void(int)> const& fn);

} // namespace tensorrt_llm
