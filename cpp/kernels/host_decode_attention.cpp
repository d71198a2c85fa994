// Decode attention on the host CPU, float32: the CPU engine's decode step, as the CUDA
// decode_attention does it on a GPU, from the same DecodeAttentionParams.
//
// Why ours: PyTorch's path for one query token per sequence (rotate q and k, write the step's
// K/V rows into their blocks, gather the blocks in use, dequantize nothing but still copy, SDPA,
// regroup the heads) is some 25 small tensor operations a layer, most of a CPU decode step's
// time outside its linears on a small model (SmolLM2: 30 layers). Here each sequence's query
// heads are rotated once and its new K/V rows rotated and written into their slot; then each KV
// head's rows are read in place through the block table, once for all the query heads of its
// group (scores, a float32 softmax, the weighted sum of V).
//
// The walk over the rows is split into chunks of kChunk positions, each a unit of work for the
// threads (host_parallel.h), whose partial softmax (maximum, sum, unnormalized weighted sum of V)
// are merged in chunk order: the split depends on a sequence's length only, so its output is the
// same bits whatever sequences share the call and however many threads run it. Within a unit the
// K rows a few positions ahead, and the chunk's V rows, are prefetched: a decode step's weights
// stream through the caches between two layers' attention, so its K / V rows come from memory
// (SmolLM2, 2 cores, one thread: 23-29 us a call with them in cache, 44-91 us after a layer's
// weights), and a block's rows end where the hardware prefetcher stops following them.
#include "host_parallel.h"
#include "host_simd.h"
#include "tensorrt_llm/kernels.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace tensorrt_llm {

namespace {

float dotPlain(float const* a, float const* b, int64_t n) {
    float s = 0.f;
    for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

void axpyPlain(float w, float const* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += w * x[i];
}

#if TRTLLM_HOST_AVX2
TRTLLM_AVX2 void axpyAvx2(float w, float const* x, float* y, int64_t n) {
    __m256 const wv = _mm256_set1_ps(w);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += w * x[i];
}
#endif

using DotFn = float (*)(float const*, float const*, int64_t);
using AxpyFn = void (*)(float, float const*, float*, int64_t);

// Rotates the first rotaryDim dims of x [heads, D] in place by the angles cs = [cos, sin]: NeoX
// pairs (j, j + r/2), GPT-J pairs (2j, 2j + 1); as rotary_embedding's reference (float32).
void rotate(float* x, int64_t heads, int64_t headDim, float const* cs, int rotaryDim, bool isNeox) {
    int const half = rotaryDim / 2;
    for (int64_t h = 0; h < heads; ++h) {
        float* v = x + h * headDim;
        for (int j = 0; j < half; ++j) {
            int const a = isNeox ? j : 2 * j;
            int const b = isNeox ? j + half : 2 * j + 1;
            float const x1 = v[a], x2 = v[b];
            v[a] = x1 * cs[j] - x2 * cs[half + j];
            v[b] = x2 * cs[j] + x1 * cs[half + j];
        }
    }
}

constexpr int64_t kChunk = 64;      // positions a unit of work walks
constexpr int64_t kAheadRows = 4;   // K rows prefetched ahead of the one being read
constexpr int64_t kLine = 64;       // bytes a prefetch brings

void prefetchRow(float const* row, int64_t headDim) {
#if TRTLLM_HOST_AVX2
    char const* bytes = reinterpret_cast<char const*>(row);
    for (int64_t i = 0; i < headDim * static_cast<int64_t>(sizeof(float)); i += kLine) {
        _mm_prefetch(bytes + i, _MM_HINT_T0);
    }
#else
    (void)row;
    (void)headDim;
#endif
}

// One unit: a chunk of one sequence's keys for the query heads of one KV head.
struct Unit {
    int64_t b, kvh, begin, end;  // positions [begin, end)
    float* partial;              // per query head of the group: max, sum, then headDim weighted V sums
};

} // namespace

void hostDecodeAttention(DecodeAttentionParams const& p, int threads) {
    if (p.dtype != DType::kFloat32 || p.cacheDtype != DType::kFloat32) {
        throw std::invalid_argument("the host kernel takes float32 q and a float32 cache");
    }
    int64_t const D = p.headDim, tpb = p.tokensPerBlock, group = p.numHeads / p.kvHeads;
    int64_t const rowStride = tpb * D;               // between a block's K (or V) rows of one head: one row
    int64_t const blockStride = 2 * p.kvHeads * tpb * D;
    float* cache = static_cast<float*>(p.kvCache);
    // Every length and every block id a sequence reads, checked before anything is read or written.
    for (int64_t b = 0; b < p.batch; ++b) {
        int64_t const length = p.sequenceLengths[b];
        if (length < 1 || length > p.maxBlocks * tpb) {
            throw std::invalid_argument("sequence " + std::to_string(b) + " has length " + std::to_string(length)
                                        + ", outside [1, " + std::to_string(p.maxBlocks * tpb)
                                        + "] (its block table's positions)");
        }
        for (int64_t i = 0; i < (length + tpb - 1) / tpb; ++i) {
            int32_t const id = p.blockTables[b * p.maxBlocks + i];
            if (id < 0 || id >= p.numBlocks) {
                throw std::invalid_argument("sequence " + std::to_string(b) + ": block id " + std::to_string(id)
                                            + " outside the cache's " + std::to_string(p.numBlocks) + " blocks");
            }
        }
    }
    DotFn dot = dotPlain;
    AxpyFn axpy = axpyPlain;
#if TRTLLM_HOST_AVX2
    if (hostAvx2()) {
        dot = dotAvx2;
        axpy = axpyAvx2;
    }
#endif
    auto rowOf = [&](int64_t b, int64_t position) {  // K row of head 0 at this position
        return cache + p.blockTables[b * p.maxBlocks + position / tpb] * blockStride + (position % tpb) * D;
    };
    auto firstKey = [&](int64_t length) {
        return p.slidingWindow > 0 ? std::max<int64_t>(0, length - p.slidingWindow) : 0;
    };
    // The rotated queries, the step's K/V rows in their slots, and the units.
    std::vector<float> q(static_cast<size_t>(p.batch * p.numHeads * D));
    std::vector<Unit> units;
    int64_t const partialFloats = group * (D + 2);
    for (int64_t b = 0; b < p.batch; ++b) {
        int64_t const length = p.sequenceLengths[b], position = length - 1;
        bool const rotary = p.cosSin != nullptr && position < p.maxPositions;
        float const* cs = rotary ? p.cosSin + position * p.rotaryDim : nullptr;
        float const* qIn = static_cast<float const*>(p.q) + b * p.qTokenStride;
        float* qb = q.data() + b * p.numHeads * D;
        std::copy(qIn, qIn + p.numHeads * D, qb);
        if (rotary) rotate(qb, p.numHeads, D, cs, p.rotaryDim, p.isNeox);
        if (p.kNew != nullptr) {
            float* slot = rowOf(b, position);
            float const* kIn = static_cast<float const*>(p.kNew) + b * p.kNewTokenStride;
            float const* vIn = static_cast<float const*>(p.vNew) + b * p.vNewTokenStride;
            for (int64_t h = 0; h < p.kvHeads; ++h) {
                float* k = slot + h * rowStride;
                std::copy(kIn + h * D, kIn + (h + 1) * D, k);
                if (rotary) rotate(k, 1, D, cs, p.rotaryDim, p.isNeox);
                std::copy(vIn + h * D, vIn + (h + 1) * D, slot + (p.kvHeads + h) * rowStride);
            }
        }
        for (int64_t kvh = 0; kvh < p.kvHeads; ++kvh) {
            for (int64_t begin = firstKey(length); begin < length; begin += kChunk) {
                units.push_back({b, kvh, begin, std::min(length, begin + kChunk), nullptr});
            }
        }
    }
    std::vector<float> partials(units.size() * static_cast<size_t>(partialFloats));
    for (size_t u = 0; u < units.size(); ++u) units[u].partial = partials.data() + u * partialFloats;

    auto walk = [&](Unit const& unit, float* scores) {
        int64_t const keys = unit.end - unit.begin, position = p.sequenceLengths[unit.b] - 1;
        float const* qg = q.data() + (unit.b * p.numHeads + unit.kvh * group) * D;
        float const* kBase = cache + unit.kvh * rowStride;  // + a row's offset from rowOf
        int64_t const vOffset = p.kvHeads * rowStride;
        for (int64_t j = 0; j < std::min(kAheadRows, keys); ++j) prefetchRow(rowOf(unit.b, unit.begin + j) + unit.kvh * rowStride, D);
        // Scores of the group's query heads, each K row read once for all of them.
        for (int64_t j = 0; j < keys; ++j) {
            int64_t const at = rowOf(unit.b, unit.begin + j) - cache;
            if (j + kAheadRows < keys) prefetchRow(rowOf(unit.b, unit.begin + j + kAheadRows) + unit.kvh * rowStride, D);
            prefetchRow(kBase + at + vOffset, D);
            float const* k = kBase + at;
            for (int64_t g = 0; g < group; ++g) {
                int64_t const h = unit.kvh * group + g;
                float s = dot(qg + g * D, k, D) * p.scale;
                if (p.alibiSlopes != nullptr) s += p.alibiSlopes[h] * static_cast<float>(unit.begin + j - position);
                scores[g * keys + j] = s;
            }
        }
        for (int64_t g = 0; g < group; ++g) {
            float* s = scores + g * keys;
            float* part = unit.partial + g * (D + 2);
            float const top = *std::max_element(s, s + keys);
            float sum = 0.f;
            for (int64_t j = 0; j < keys; ++j) sum += (s[j] = std::exp(s[j] - top));
            part[0] = top;
            part[1] = sum;
            std::fill(part + 2, part + 2 + D, 0.f);
        }
        for (int64_t j = 0; j < keys; ++j) {
            float const* v = kBase + (rowOf(unit.b, unit.begin + j) - cache) + vOffset;
            for (int64_t g = 0; g < group; ++g) axpy(scores[g * keys + j], v, unit.partial + g * (D + 2) + 2, D);
        }
    };
    int64_t const count = static_cast<int64_t>(units.size());
    int const parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, count)));
    hostParallel(parts, [&](int part) {
        std::vector<float> scores(static_cast<size_t>(group * kChunk));
        for (int64_t u = count * part / parts; u < count * (part + 1) / parts; ++u) walk(units[u], scores.data());
    });

    // Each query head's chunks merged in order: out = sum_c e^(max_c - M) acc_c / sum_c e^(max_c - M) sum_c.
    for (int64_t first = 0; first < count;) {
        Unit const& unit = units[first];
        int64_t last = first + 1;
        while (last < count && units[last].b == unit.b && units[last].kvh == unit.kvh) ++last;
        for (int64_t g = 0; g < group; ++g) {
            float* out = static_cast<float*>(p.out) + unit.b * p.outTokenStride + (unit.kvh * group + g) * D;
            float top = -INFINITY;
            for (int64_t u = first; u < last; ++u) top = std::max(top, units[u].partial[g * (D + 2)]);
            float sum = 0.f;
            std::fill(out, out + D, 0.f);
            for (int64_t u = first; u < last; ++u) {
                float const* part = units[u].partial + g * (D + 2);
                float const weight = std::exp(part[0] - top);
                sum += weight * part[1];
                axpy(weight, part + 2, out, D);
            }
            float const inverse = 1.f / sum;
            for (int64_t i = 0; i < D; ++i) out[i] *= inverse;
        }
        first = last;
    }
}

} // namespace tensorrt_llm
