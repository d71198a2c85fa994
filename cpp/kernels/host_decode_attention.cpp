// Decode attention on the host CPU, float32, one thread: the CPU engine's decode step, as the
// CUDA decode_attention does it on a GPU, from the same DecodeAttentionParams.
//
// Why ours: PyTorch's path for one query token per sequence (rotate q and k, write the step's
// K/V rows into their blocks, gather the blocks in use, dequantize nothing but still copy, SDPA,
// regroup the heads) is some 25 small tensor operations a layer, most of a CPU decode step's
// time outside its linears on a small model (SmolLM2: 30 layers). Here each sequence is one
// loop: its query heads rotated once, its new K/V rows rotated and written into their slot,
// then each KV head's rows read in place through the block table, once for all the query heads
// of its group (scores, a float32 softmax, the weighted sum of V).
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
TRTLLM_AVX2 float dotAvx2(float const* a, float const* b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float sum = _mm_cvtss_f32(s);
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

TRTLLM_AVX2 void axpyAvx2(float w, float const* x, float* y, int64_t n) {
    __m256 const wv = _mm256_set1_ps(w);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += w * x[i];
}
#endif

float dot(float const* a, float const* b, int64_t n) {
#if TRTLLM_HOST_AVX2
    if (hostAvx2()) return dotAvx2(a, b, n);
#endif
    return dotPlain(a, b, n);
}

void axpy(float w, float const* x, float* y, int64_t n) {
#if TRTLLM_HOST_AVX2
    if (hostAvx2()) return axpyAvx2(w, x, y, n);
#endif
    axpyPlain(w, x, y, n);
}

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

} // namespace

void hostDecodeAttention(DecodeAttentionParams const& p) {
    if (p.dtype != DType::kFloat32 || p.cacheDtype != DType::kFloat32) {
        throw std::invalid_argument("the host kernel takes float32 q and a float32 cache");
    }
    int64_t const D = p.headDim, tpb = p.tokensPerBlock, group = p.numHeads / p.kvHeads;
    int64_t const rowStride = tpb * D;               // between a block's K (or V) rows of one head: one row
    int64_t const blockStride = 2 * p.kvHeads * tpb * D;
    float* cache = static_cast<float*>(p.kvCache);
    std::vector<float> q(static_cast<size_t>(p.numHeads * D)), scores;
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
    for (int64_t b = 0; b < p.batch; ++b) {
        int64_t const length = p.sequenceLengths[b];
        int32_t const* table = p.blockTables + b * p.maxBlocks;
        auto blockOf = [&](int64_t position) {  // K row of head 0 at this position
            return cache + table[position / tpb] * blockStride + (position % tpb) * D;
        };
        int64_t const position = length - 1;
        bool const rotary = p.cosSin != nullptr && position < p.maxPositions;
        float const* cs = rotary ? p.cosSin + position * p.rotaryDim : nullptr;
        float const* qIn = static_cast<float const*>(p.q) + b * p.qTokenStride;
        std::copy(qIn, qIn + p.numHeads * D, q.begin());
        if (rotary) rotate(q.data(), p.numHeads, D, cs, p.rotaryDim, p.isNeox);
        if (p.kNew != nullptr) {
            float* slot = blockOf(position);
            float const* kIn = static_cast<float const*>(p.kNew) + b * p.kNewTokenStride;
            float const* vIn = static_cast<float const*>(p.vNew) + b * p.vNewTokenStride;
            for (int64_t h = 0; h < p.kvHeads; ++h) {
                float* k = slot + h * rowStride;
                std::copy(kIn + h * D, kIn + (h + 1) * D, k);
                if (rotary) rotate(k, 1, D, cs, p.rotaryDim, p.isNeox);
                std::copy(vIn + h * D, vIn + (h + 1) * D, slot + (p.kvHeads + h) * rowStride);
            }
        }
        int64_t const start = p.slidingWindow > 0 ? std::max<int64_t>(0, length - p.slidingWindow) : 0;
        int64_t const keys = length - start;
        scores.resize(static_cast<size_t>(group * keys));
        float* out = static_cast<float*>(p.out) + b * p.outTokenStride;
        for (int64_t kvh = 0; kvh < p.kvHeads; ++kvh) {
            // Scores of the group's query heads, each K row read once for all of them.
            for (int64_t j = 0; j < keys; ++j) {
                float const* k = blockOf(start + j) + kvh * rowStride;
                for (int64_t g = 0; g < group; ++g) {
                    int64_t const h = kvh * group + g;
                    float s = dot(q.data() + h * D, k, D) * p.scale;
                    if (p.alibiSlopes != nullptr) s += p.alibiSlopes[h] * static_cast<float>(start + j - position);
                    scores[g * keys + j] = s;
                }
            }
            for (int64_t g = 0; g < group; ++g) {
                float* s = scores.data() + g * keys;
                float const top = *std::max_element(s, s + keys);
                float sum = 0.f;
                for (int64_t j = 0; j < keys; ++j) sum += (s[j] = std::exp(s[j] - top));
                float const inverse = 1.f / sum;
                for (int64_t j = 0; j < keys; ++j) s[j] *= inverse;
                std::fill(out + (kvh * group + g) * D, out + (kvh * group + g + 1) * D, 0.f);
            }
            for (int64_t j = 0; j < keys; ++j) {
                float const* v = blockOf(start + j) + (p.kvHeads + kvh) * rowStride;
                for (int64_t g = 0; g < group; ++g) axpy(scores[g * keys + j], v, out + (kvh * group + g) * D, D);
            }
        }
    }
}

} // namespace tensorrt_llm
