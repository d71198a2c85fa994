// The host kernels' thread pool (host_parallel.h).
//
// Why our own: the module does not link libtorch (one wheel for every PyTorch), and a second
// OpenMP runtime beside PyTorch's would keep its own spinning threads. A decode step's GEMVs are
// 20 to 200 us each, so a worker must start in well under that: it spins on the job counter for
// kSpin after its last job, then sleeps on a condition variable (waking one costs tens of us).
#include "host_parallel.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TRTLLM_PAUSE() _mm_pause()
#else
#define TRTLLM_PAUSE() std::this_thread::yield()
#endif

namespace tensorrt_llm {

namespace {

constexpr auto kSpin = std::chrono::microseconds(200);

class Pool {
public:
    void run(int parts, std::function<void(int)> const& fn) {
        std::lock_guard<std::mutex> call(callMutex_);
        grow(parts - 1);
        int const workers = static_cast<int>(workers_.size());
        job_ = &fn;
        parts_ = parts;
        next_.store(1, std::memory_order_relaxed);
        pending_.store(workers, std::memory_order_relaxed);
        {
            std::lock_guard<std::mutex> sleep(sleepMutex_);
            generation_.fetch_add(1, std::memory_order_release);
        }
        wake_.notify_all();
        for (int part = 0; part < parts; part = next_.fetch_add(1, std::memory_order_relaxed)) fn(part);
        // Every worker checks in for every job (each sees each generation once), even when it
        // has no part of it; then the job's memory (fn) may go.
        while (pending_.load(std::memory_order_acquire) != 0) TRTLLM_PAUSE();
    }

private:
    void grow(int workers) {
        while (static_cast<int>(workers_.size()) < workers) {
            uint64_t const seen = generation_.load(std::memory_order_acquire);
            workers_.emplace_back([this, seen] { work(seen); });
        }
    }

    void work(uint64_t seen) {
        for (;;) {
            auto const idle = std::chrono::steady_clock::now();
            for (int spins = 1; generation_.load(std::memory_order_acquire) == seen; ++spins) {
                TRTLLM_PAUSE();
                if (spins % 256 == 0 && std::chrono::steady_clock::now() - idle > kSpin) {
                    std::unique_lock<std::mutex> sleep(sleepMutex_);
                    wake_.wait(sleep, [&] { return generation_.load(std::memory_order_acquire) != seen; });
                }
            }
            ++seen;  // the caller starts no new job before this one is checked in
            for (int part; (part = next_.fetch_add(1, std::memory_order_relaxed)) < parts_;) (*job_)(part);
            pending_.fetch_sub(1, std::memory_order_release);
        }
    }

    std::mutex callMutex_, sleepMutex_;
    std::condition_variable wake_;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> next_{0}, pending_{0};
    std::function<void(int)> const* job_ = nullptr;
    int parts_ = 0;
    std::vector<std::thread> workers_;
};

} // namespace

void hostParallel(int parts, std::function<void(int)> const& fn) {
    if (parts <= 1) {
        fn(0);
        return;
    }
    // A child of fork() has none of its parent's threads, and its copy of the pool's condition
    // variable may still count the parent's sleeping workers (a broadcast would wait for them):
    // it makes a pool of its own. Pools are never destroyed (their workers outlive static
    // destructors, and a forked child must not join threads it does not have).
    static std::mutex guard;
    static Pool* pool = nullptr;
    static pid_t owner = -1;
    Pool* current;
    {
        std::lock_guard<std::mutex> lock(guard);
        if (owner != getpid()) {
            pool = new Pool();
            owner = getpid();
        }
        current = pool;
    }
    current->run(parts, fn);
}

} // namespace tensorrt_llm
