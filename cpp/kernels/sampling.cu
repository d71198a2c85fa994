// Top-k / top-p sampling of one token per row: one thread block per row, radix selects over the
// logits instead of a sort of the vocabulary. Also greedy decoding's argmax (argmax_rows, below).
//
// The rule (tensorrt_llm/kernels/reference.py, top_k_top_p_sample, states it in PyTorch):
//  - Logits are read as float32, NaN counting as -inf and -0 as +0. Greedy rows (temperature <= 0
//    or top_k == 1) take the argmax, the lowest index among equal maxima.
//  - Token i weighs q_i = floor(2^40 * exp((l_i - max) / T)), the tokens equal to the maximum
//    exactly 2^40 (so a row whose maximum is +-inf shares its mass among the tokens at it).
//    Integer masses make every sum exact and independent of the order of the additions, so a
//    row draws the same token on every run whatever the thread scheduling.
//  - top-k (0 < k < V) keeps the tokens whose logit is >= the k-th largest logit.
//  - top-p (0 < p < 1) keeps, of those, the tokens whose strictly larger kept logits weigh less
//    than P = max(1, floor(p * Qk)), Qk the mass top-k keeps.
//    Both keep every token tied at the threshold (transformers' TopKLogitsWarper does the same).
//  - With u the row's uniform number in [0, 1), R = min(floor(u * Qkept), Qkept - 1); the token
//    drawn is the kept token whose interval [S_i, S_i + q_i) holds R, S_i being the kept mass
//    before i in vocabulary order.
//
// A threshold is found by a radix select over the order-preserving 32-bit keys of the logits:
// up to three passes of 11, 11 and 10 bits, each a histogram in shared memory (counts for top-k,
// masses for top-p) of the next digit of the keys that share the digits chosen so far. The
// search stops early once the chosen bin is known to be kept whole (top-k: it holds exactly the
// tokens still missing; top-p: it holds one token). Each pass reads the row again (from L2 for
// the most part); nothing is sorted. Every parameter is read from device memory, so a launch
// depends on no host value and can be captured in a CUDA graph.
#include "common.cuh"

namespace tensorrt_llm {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
static_assert(kWarps == 32, "blockInclusiveScan scans the warp totals with one warp");
constexpr int kBins = 2048;  // 11-bit digits
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kPasses = 3;
constexpr unsigned kFullMask = 0xffffffffu;

using Mass = unsigned long long;
constexpr Mass kMaxMass = Mass{1} << 40;       // q of the tokens equal to the row maximum
constexpr float kMassScale = 1099511627776.f;  // 2^40

__device__ __forceinline__ int digitShift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }
__device__ __forceinline__ int digitBits(int pass) { return pass == 2 ? 10 : 11; }

// Keys order like the floats they come from: negative floats have their bits flipped, positive
// ones their sign bit set. NaN is read as -inf and -0 as +0 so that equal values have equal keys.
__device__ __forceinline__ uint32_t orderKey(float x) {
    if (x != x) x = -INFINITY;
    if (x == 0.f) x = 0.f;
    uint32_t const bits = __float_as_uint(x);
    return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

__device__ __forceinline__ float keyValue(uint32_t key) {
    return __uint_as_float((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}

template <typename T>
__device__ __forceinline__ uint32_t keyAt(T const* row, int64_t i) {
    return orderKey(toFloat(row[i]));
}

struct RowScale {
    uint32_t maxKey;
    float maxValue;
    float temperature;
};

__device__ __forceinline__ Mass massOf(uint32_t key, RowScale const& r) {
    if (key == r.maxKey) return kMaxMass;  // also the rows whose maximum is +-inf
    float const e = expf((keyValue(key) - r.maxValue) / r.temperature);
    return e > 0.f ? __float2ull_rz(e * kMassScale) : 0;  // e * 2^40 is exact; NaN weighs 0
}

struct Choice {
    uint32_t digit;
    uint32_t count;  // tokens in the chosen bin
    Mass above;      // weight of the range above the chosen bin
    Mass mass;       // mass of the chosen bin (mass histograms only)
};

struct SharedState {
    uint32_t counts[kBins];
    Mass masses[kBins];
    Mass stage[kWarps][32];  // one value per lane, for the warp-aggregated histogram updates
    Mass warpValues[kWarps];
    Choice choice;
    int64_t token;
};

// Inclusive prefix sum over the block in thread order; `total` gets the block's sum.
__device__ Mass blockInclusiveScan(SharedState& s, Mass v, Mass& total) {
    int const lane = threadIdx.x % 32;
    int const warp = threadIdx.x / 32;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
        Mass const n = __shfl_up_sync(kFullMask, v, offset);
        if (lane >= offset) v += n;
    }
    if (lane == 31) s.warpValues[warp] = v;
    __syncthreads();
    if (warp == 0) {
        Mass w = s.warpValues[lane];
#pragma unroll
        for (int offset = 1; offset < 32; offset <<= 1) {
            Mass const n = __shfl_up_sync(kFullMask, w, offset);
            if (lane >= offset) w += n;
        }
        s.warpValues[lane] = w;
    }
    __syncthreads();
    Mass const result = v + (warp > 0 ? s.warpValues[warp - 1] : 0);
    total = s.warpValues[kWarps - 1];
    __syncthreads();  // warpValues is reused by the next reduction
    return result;
}

__device__ Mass blockSum(SharedState& s, Mass v) {
    Mass total;
    blockInclusiveScan(s, v, total);
    return total;
}

// A (key, index) pair in 64 bits whose unsigned order is the larger key, then the lower index: the
// key in the high half, the complement of the index in the low half.
__device__ __forceinline__ Mass packKeyIndex(uint32_t key, int64_t i) {
    return (Mass{key} << 32) | (0xffffffffu - static_cast<uint32_t>(i));
}
__device__ __forceinline__ int64_t indexOf(Mass packed) { return 0xffffffffu - static_cast<uint32_t>(packed); }

__device__ __forceinline__ Mass warpMax(Mass v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        Mass const other = __shfl_xor_sync(kFullMask, v, offset);
        v = other > v ? other : v;
    }
    return v;
}

__device__ Mass blockMax(SharedState& s, Mass v) {
    v = warpMax(v);
    if (threadIdx.x % 32 == 0) s.warpValues[threadIdx.x / 32] = v;
    __syncthreads();
    v = s.warpValues[0];
    for (int w = 1; w < kWarps; ++w) v = s.warpValues[w] > v ? s.warpValues[w] : v;
    __syncthreads();
    return v;
}

__device__ void clearHistogram(SharedState& s) {
    for (int i = threadIdx.x; i < kBins; i += kThreads) {
        s.counts[i] = 0;
        s.masses[i] = 0;
    }
    __syncthreads();
}

// Adds one token of mass `mass` to bin `bin` (bin < 0: adds nothing). Every lane of the warp must
// call it. Lanes of one bin are added by one shared atomic: most keys of a pass share few bins
// (the first digit is the sign and exponent), and same-address atomics would serialise.
__device__ void histogramAdd(SharedState& s, int bin, Mass mass, bool withMass) {
    int const lane = threadIdx.x % 32;
    Mass* stage = s.stage[threadIdx.x / 32];
    unsigned const peers = __match_any_sync(kFullMask, bin);
    if (withMass) stage[lane] = mass;
    __syncwarp();
    if (bin >= 0 && lane == __ffs(peers) - 1) {
        atomicAdd(&s.counts[bin], static_cast<uint32_t>(__popc(peers)));
        if (withMass) {
            Mass sum = 0;
            for (unsigned m = peers; m != 0; m &= m - 1) sum += stage[__ffs(m) - 1];
            atomicAdd(&s.masses[bin], sum);
        }
    }
    __syncwarp();  // the stage is rewritten by the next call
}

// Histogram of digit `pass` of the keys >= floorKey whose higher digits equal those of `prefix`
// (masses too when withMass). Returns this thread's share of the mass added.
template <typename T>
__device__ Mass histogramPass(SharedState& s, T const* row, int64_t vocab, int pass, uint32_t prefix,
                              uint32_t floorKey, RowScale const& scale, bool withMass) {
    clearHistogram(s);
    int const shift = digitShift(pass);
    int const highShift = shift + digitBits(pass);
    uint32_t const digitMask = (1u << digitBits(pass)) - 1;
    Mass added = 0;
    for (int64_t base = 0; base < vocab; base += kThreads) {  // the same trip count in every thread
        int64_t const i = base + threadIdx.x;
        int bin = -1;
        Mass q = 0;
        if (i < vocab) {
            uint32_t const key = keyAt(row, i);
            bool const inRange = key >= floorKey && (highShift >= 32 || (key >> highShift) == (prefix >> highShift));
            if (inRange) {
                bin = static_cast<int>((key >> shift) & digitMask);
                if (withMass) {
                    q = massOf(key, scale);
                    added += q;
                }
            }
        }
        histogramAdd(s, bin, q, withMass);
    }
    __syncthreads();
    return added;
}

// The bin where the weight (counts, or masses when byMass) accumulated from the highest bin down
// reaches `target`: above + weight of the higher bins < target <= that + weight of the bin. The
// bin is unique (an empty bin cannot satisfy both) and exists while above < target <= above +
// the histogram's total, which the callers keep; otherwise the choice defaults to bin 0.
__device__ Choice chooseBin(SharedState& s, Mass above, Mass target, bool byMass) {
    int const top = kBins - 1 - static_cast<int>(threadIdx.x) * kBinsPerThread;  // this thread's highest bin
    Mass weights[kBinsPerThread];
    Mass local = 0;
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) {
        weights[j] = byMass ? s.masses[top - j] : s.counts[top - j];
        local += weights[j];
    }
    if (threadIdx.x == 0) s.choice = Choice{0, 0, above, 0};
    Mass total;
    Mass acc = above + blockInclusiveScan(s, local, total) - local;  // weight of the bins above this thread's
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) {
        if (acc < target && target <= acc + weights[j]) {
            s.choice = Choice{static_cast<uint32_t>(top - j), s.counts[top - j], acc, s.masses[top - j]};
        }
        acc += weights[j];
    }
    __syncthreads();
    return s.choice;
}

// One block per row. Registers are capped for 1024 threads (one block per multiprocessor).
template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    topKTopPSampleKernel(int32_t* __restrict__ out, T const* __restrict__ logits, int64_t vocab, int64_t rowStride,
                         float const* __restrict__ temperatures, int32_t const* __restrict__ topKs,
                         float const* __restrict__ topPs, float const* __restrict__ uniforms) {
    waitForPreviousKernel();  // see launchKernel
    allowNextKernel();
    __shared__ SharedState s;
    int64_t const rowIndex = blockIdx.x;
    T const* row = logits + rowIndex * rowStride;
    float const temperature = temperatures[rowIndex];
    int32_t const topK = topKs[rowIndex];
    float const topP = topPs[rowIndex];
    // Block-uniform decisions: every branch below is taken by the whole block.
    bool const greedy = !(temperature > 0.f) || topK == 1;
    bool const limitK = !greedy && topK > 0 && topK < vocab;
    bool const limitP = !greedy && topP > 0.f && topP < 1.f;

    // Pass 1: the argmax (the largest key, then the lowest index: packKeyIndex), with the first
    // digit's counts for top-k.
    if (limitK) clearHistogram(s);
    Mass best = 0;
    for (int64_t base = 0; base < vocab; base += kThreads) {
        int64_t const i = base + threadIdx.x;
        int bin = -1;
        if (i < vocab) {
            uint32_t const key = keyAt(row, i);
            Mass const packed = packKeyIndex(key, i);
            best = packed > best ? packed : best;
            bin = static_cast<int>(key >> digitShift(0));
        }
        if (limitK) histogramAdd(s, bin, 0, false);
    }
    best = blockMax(s, best);  // its barrier also completes the histogram
    int64_t const argmax = indexOf(best);
    if (greedy) {
        if (threadIdx.x == 0) out[rowIndex] = static_cast<int32_t>(argmax);
        return;
    }
    uint32_t const maxKey = static_cast<uint32_t>(best >> 32);
    RowScale const scale{maxKey, keyValue(maxKey), temperature};

    // Top-k: the k-th largest key, by counts. A bin that holds exactly the tokens still missing is
    // kept whole, and its lowest key value serves as the threshold.
    uint32_t floorKey = 0;  // keys below it are dropped
    if (limitK) {
        uint32_t prefix = 0;
        Mass above = 0;
        for (int pass = 0;; ++pass) {
            if (pass > 0) histogramPass(s, row, vocab, pass, prefix, 0, scale, false);
            Choice const c = chooseBin(s, above, static_cast<Mass>(topK), false);
            prefix |= c.digit << digitShift(pass);
            above = c.above;
            if (pass == kPasses - 1 || c.above + c.count == static_cast<Mass>(topK)) break;
        }
        floorKey = prefix;
    }

    // Top-p: the key where the mass of the top-k tokens, accumulated from the largest key down,
    // reaches P. A bin holding a single token ends the search.
    uint32_t threshold = floorKey;
    Mass keptMass;
    if (limitP) {
        Mass const massK = blockSum(s, histogramPass(s, row, vocab, 0, 0, floorKey, scale, true));
        Mass target = __double2ull_rz(static_cast<double>(topP) * static_cast<double>(massK));
        target = target > 0 ? target : 1;
        uint32_t prefix = 0;
        Mass above = 0;
        for (int pass = 0;; ++pass) {
            if (pass > 0) histogramPass(s, row, vocab, pass, prefix, floorKey, scale, true);
            Choice const c = chooseBin(s, above, target, true);
            prefix |= c.digit << digitShift(pass);
            above = c.above;
            keptMass = c.above + c.mass;
            if (pass == kPasses - 1 || c.count == 1) break;
        }
        threshold = prefix > floorKey ? prefix : floorKey;
    } else {
        Mass local = 0;
        for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
            uint32_t const key = keyAt(row, i);
            if (key >= floorKey) local += massOf(key, scale);
        }
        keptMass = blockSum(s, local);
    }

    // The draw: walk the vocabulary in chunks of kThreads tokens, a block scan of the kept masses
    // giving each token its interval, until the interval holding R has been passed.
    float u = uniforms[rowIndex];
    u = u >= 0.f ? u : 0.f;  // NaN too
    Mass draw = __double2ull_rz(static_cast<double>(u) * static_cast<double>(keptMass));
    draw = keptMass == 0 ? 0 : draw < keptMass ? draw : keptMass - 1;
    if (threadIdx.x == 0) s.token = argmax;  // kept only if no interval held R, which cannot happen
    __syncthreads();
    Mass offset = 0;  // kept mass of the chunks before this one
    for (int64_t base = 0; base < vocab; base += kThreads) {
        int64_t const i = base + threadIdx.x;
        Mass q = 0;
        if (i < vocab) {
            uint32_t const key = keyAt(row, i);
            if (key >= threshold) q = massOf(key, scale);
        }
        Mass chunkMass;
        Mass const end = offset + blockInclusiveScan(s, q, chunkMass);
        if (q > 0 && end - q <= draw && draw < end) s.token = i;
        offset += chunkMass;
        if (offset > draw) break;  // block-uniform: chunkMass is the same in every thread
    }
    __syncthreads();
    if (threadIdx.x == 0) out[rowIndex] = static_cast<int32_t>(s.token);
}

// ---- argmax_rows: greedy decoding's token ----
// Each row's first largest logit, torch.argmax's answer: NaN counts as the largest (unlike the
// sampling rule above, which reads it as -inf), -0 equals +0, the lowest index wins a tie. Two
// launches where PyTorch's two-pass argmax took five (two reductions, a gather, an add, a cast):
// blocks of kArgmaxThreads each reduce a chunk of kArgmaxChunk logits of a row to its best (key,
// lowest index) packed in 64 bits as pass 1 above, then one warp a row takes the best of its
// chunks. One block a row was slower: 19.3 us for a 128,256-logit row on an H100 (one
// multiprocessor pulling half a megabyte), against 17 for the five launches. With `advance`, the
// second launch also adds one to each row's entry: a greedy decode step replayed from a CUDA
// graph leaves the next step's sequence lengths in place, with no copy from the host. With
// `hostOut`, the second launch is one block that also writes the tokens into page-locked host
// memory, the row *hostSlot % 2, and adds one to *hostSlot once every warp has read it: the
// host reads a greedy graph's tokens with no copy between replays (a copy to the host and its
// event after each replay had cost the INT4 8B engine's batch-1 step ~10 us on an H200).
constexpr int kArgmaxThreads = 256;

__device__ __forceinline__ Mass argmaxPacked(float v, int64_t i) {
    return packKeyIndex(v != v ? 0xffffffffu : orderKey(v), i);  // NaN above everything
}

template <typename T>
__global__ void __launch_bounds__(kArgmaxThreads)
    argmaxChunksKernel(Mass* __restrict__ best, T const* __restrict__ logits, int64_t vocab, int64_t rowStride,
                       int chunks) {
    waitForPreviousKernel();  // see launchKernel
    allowNextKernel();
    __shared__ Mass warpBest[kArgmaxThreads / 32];
    int64_t const row = blockIdx.x / chunks;
    int64_t const first = (blockIdx.x - row * chunks) * int64_t{kArgmaxChunk};
    T const* x = logits + row * rowStride;
    constexpr int U = kArgmaxChunk / kArgmaxThreads;  // every load of the chunk in flight at once
    float v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        int64_t const i = first + u * kArgmaxThreads + threadIdx.x;
        v[u] = i < vocab ? toFloat(x[i]) : 0.f;
    }
    Mass b = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        int64_t const i = first + u * kArgmaxThreads + threadIdx.x;
        Mass const packed = argmaxPacked(v[u], i);
        if (i < vocab && packed > b) b = packed;
    }
    b = warpMax(b);
    if (threadIdx.x % 32 == 0) warpBest[threadIdx.x / 32] = b;
    __syncthreads();
    if (threadIdx.x < 32) {
        b = warpMax(threadIdx.x < kArgmaxThreads / 32 ? warpBest[threadIdx.x] : 0);
        if (threadIdx.x == 0) best[blockIdx.x] = b;
    }
}

__global__ void argmaxFinishKernel(int32_t* __restrict__ out, int32_t* __restrict__ advance,
                                   Mass const* __restrict__ best, int64_t rows, int chunks,
                                   int32_t* __restrict__ hostOut, int64_t hostStride, int32_t* __restrict__ hostSlot) {
    waitForPreviousKernel();  // see launchKernel
    allowNextKernel();
    int const lane = threadIdx.x % 32;
    int32_t* const host = hostOut != nullptr ? hostOut + (*hostSlot & 1) * hostStride : nullptr;
    int64_t const warps = int64_t{gridDim.x} * (blockDim.x / 32);
    for (int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32; row < rows; row += warps) {
        Mass b = 0;
        for (int c = lane; c < chunks; c += 32) b = best[row * chunks + c] > b ? best[row * chunks + c] : b;
        b = warpMax(b);
        if (lane == 0) {
            int32_t const token = static_cast<int32_t>(indexOf(b));
            out[row] = token;
            if (advance != nullptr) advance[row] += 1;
            if (host != nullptr) host[row] = token;
        }
    }
    if (hostOut != nullptr) {  // one block (launchArgmaxRows): the slot moves on once every warp has read it
        __syncthreads();
        if (threadIdx.x == 0) *hostSlot += 1;
    }
}

} // namespace

void launchArgmaxRows(ArgmaxRowsParams const& p, void* stream) {
    if (p.batch == 0) return;
    int64_t const chunks = (p.vocab + kArgmaxChunk - 1) / kArgmaxChunk;
    if (p.batch * chunks > 0x7fffffffLL) throw std::invalid_argument("argmax_rows: too many rows for one launch");
    auto const s = static_cast<cudaStream_t>(stream);
    dispatchFloat(p.dtype, "argmax_rows", [&](auto tag) {
        using T = decltype(tag);
        launchKernel("argmax_rows", argmaxChunksKernel<T>, static_cast<unsigned>(p.batch * chunks), kArgmaxThreads,
                     0, s, p.workspace, static_cast<T const*>(p.logits), p.vocab, p.logitsRowStride,
                     static_cast<int>(chunks));
    });
    constexpr int kRowsPerBlock = 8;  // a warp a row
    // hostOut: one block of up to 32 warps, each taking rows warp, warp + 32, ...
    unsigned const blocks =
        p.hostOut != nullptr ? 1u : static_cast<unsigned>((p.batch + kRowsPerBlock - 1) / kRowsPerBlock);
    unsigned const threads =
        p.hostOut != nullptr ? static_cast<unsigned>(std::min<int64_t>(p.batch, 32) * 32) : kRowsPerBlock * 32;
    launchKernel("argmax_rows", argmaxFinishKernel, blocks, threads, 0, s, p.out, p.advance,
                 static_cast<Mass const*>(p.workspace), p.batch, static_cast<int>(chunks), p.hostOut, p.hostStride,
                 p.hostSlot);
}

void launchTopKTopPSample(TopKTopPSampleParams const& p, void* stream) {
    if (p.batch == 0) return;
    if (p.batch > 0x7fffffffLL) throw std::invalid_argument("top_k_top_p_sample: too many rows for one launch");
    auto s = static_cast<cudaStream_t>(stream);
    dispatchFloat(p.dtype, "top_k_top_p_sample", [&](auto tag) {
        using T = decltype(tag);
        launchKernel("top_k_top_p_sample", topKTopPSampleKernel<T>, static_cast<unsigned>(p.batch), kThreads, 0, s,
            p.out, static_cast<T const*>(p.logits), p.vocab, p.logitsRowStride, p.temperatures, p.topKs, p.topPs,
            p.uniforms);
    });
}

} // namespace tensorrt_llm
