// Weight-only INT8 / INT4 GEMV on the host CPU (decode rows), with AVX2 and FMA, its output rows
// split over `threads` threads (host_parallel.h).
//
// Why ours: PyTorch's CPU int4pack / int8pack kernels are vectorized for AVX-512; on an AVX2-only
// CPU (an AMD EPYC of the 2-core machine) they were slower than float32 F.linear on every decoder
// layer of SmolLM2 (qkv 161 / 142 us against 98.5), so a quantized engine decoded barely faster
// than float32. A first form of this kernel, codes to floats and float32 FMAs (x kept float32),
// was bound by those conversions: qkv 90 us, no faster than float32 either.
//
// So, as llama.cpp does for its Q4 / Q8 dot products: each row of x is quantized per block of 32
// inputs to int8 (scale = the block's largest |x| / 127), and each block's 32 products are summed
// in integers (maddubs + madd: unsigned INT4 codes, or |INT8 code| against x with the code's sign),
// then scaled once by weight scale x block scale in a float32 FMA; INT4's zeros meet the float
// sums of x per group. x's rounding is the one difference from formats.py's W x: a relative error
// of at most 1/254 of each block's largest |x| per input (PyTorch's CPU path rounds x to bfloat16).
// INT4 bytes hold inputs 2j (low nibble) and 2j + 1 (high): x's codes are staged with each
// block's even inputs first, then its odd ones, the order of the nibbles of a block's 16 bytes.
//
// Where the CPU has AVX-512 with its int8 dot product (VNNI: vpdpbusd sums 64 unsigned x signed
// byte products by fours into 16 int32 in one instruction), a step takes two blocks of a row
// of W in one 512-bit register, in about half the AVX2 path's instructions (per 64 INT8 codes:
// load, abs, sign mask, x negated under it, dot, convert, scale, FMA; AVX2: twice its eight).
// The integer block sums are the same; their float sums are taken over 16 lanes instead of 8,
// so the two paths' outputs differ by float32 roundings (each path's the same for a row of x
// whatever rows are beside it).
#include "host_parallel.h"
#include "host_simd.h"
#include "tensorrt_llm/kernels.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace tensorrt_llm {

namespace {

constexpr int64_t kBlock = 32;  // inputs of x per int8 scale
// Rows of x a pass over W serves (each block of W loaded once for them), and rows of W a pass
// takes for M rows of x: 4 x 1 or 4 x 2 (or 2 x 3, 2 x 4) accumulators of 8 floats, with the
// blocks' codes, within AVX2's 16 registers.
constexpr int kXRows = 4;
constexpr int kRowsFor(int m) { return m <= 2 ? 4 : 2; }
constexpr int64_t kRowsPerPart = 128;  // the least rows of W worth a thread (a few us)
// Rows of W a thread takes against all rows of x before moving on (a multiple of every R): their
// codes stay in L1 / L2 between the passes over x's rows.
constexpr int64_t kSliceRows = 16;
// How far ahead of the rows being read their successors' codes are prefetched. R rows are R
// interleaved streams of a few hundred bytes each, which the hardware prefetcher does not follow:
// without it INT8 SmolLM2's GEMVs read 4-7 GB/s on the 2-core AMD EPYC (a plain sum reads 17.7),
// with it 12-21 (INT8 per step 21.2 -> 9.7 ms). 2 KB: about 100 ns of a thread's reading there.
constexpr int64_t kPrefetchBytes = 2048;
constexpr int64_t kLine = 64;  // bytes a prefetch brings

// A row of x as int8 codes per block of kBlock inputs (llama.cpp's Q8_0: scale = the block's
// largest |x| / 127, codes round(x / scale)), in the order the weight's codes meet them, and
// (INT4) its float sums per weight group for the zeros. The AVX-512 path also takes each pair
// of blocks' scales spread over the 16 lanes its block sums come in (pairScales).
struct XBlocks {
    std::vector<int8_t> codes;
    std::vector<float> scales, groupSums, pairScales;
};

// Where input i of a block (in a pair of blocks, the second: second = 1) is staged, relative to
// the block (kEvenOdd) or to the pair (kPairs):
//   kPlain: i (INT8's codes are in input order);
//   kEvenOdd: the block's even inputs, then its odd ones (the low nibbles of INT4's 16 bytes,
//       then the high ones: the AVX2 path);
//   kPairs (AVX-512): INT8 as kPlain, two blocks a step; INT4 the pair's low nibbles (even
//       inputs of the first block, then of the second), then its high ones, the order in which
//       its 32 bytes unpack into a 512-bit register.
enum class Order { kPlain, kEvenOdd, kPairs };

void quantizeX(float const* x, int64_t k, int64_t group, Order order, bool int4, XBlocks& out) {
    out.codes.resize(static_cast<size_t>(k));
    out.scales.resize(static_cast<size_t>(k / kBlock));
    out.groupSums.assign(static_cast<size_t>(k / group), 0.f);
    bool const pairs = order == Order::kPairs && int4;
    for (int64_t b = 0; b < k / kBlock; ++b) {
        float const* v = x + b * kBlock;
        float amax = 0.f;
        for (int i = 0; i < kBlock; ++i) {
            amax = std::max(amax, std::fabs(v[i]));
            out.groupSums[b * kBlock / group] += v[i];
        }
        float const scale = amax / 127.f;
        float const inverse = scale > 0.f ? 1.f / scale : 0.f;
        out.scales[b] = scale;
        int8_t* q = out.codes.data() + (pairs ? (b / 2) * 2 * kBlock : b * kBlock);
        int const second = static_cast<int>(b % 2);
        for (int i = 0; i < kBlock; ++i) {
            int const place = pairs ? (i % 2) * kBlock + second * (kBlock / 2) + i / 2
                              : order == Order::kEvenOdd ? (i % 2) * (kBlock / 2) + i / 2
                                                         : i;
            q[place] = static_cast<int8_t>(std::lrintf(v[i] * inverse));
        }
    }
    if (order == Order::kPairs) {
        // INT8: lanes 0-7 hold the first block's sums, 8-15 the second's; INT4: lanes 0-3 and 8-11
        // the first's, 4-7 and 12-15 the second's.
        out.pairScales.resize(static_cast<size_t>(k / kBlock * 8));
        for (int64_t b = 0; b < k / kBlock; ++b) {
            float* lanes = out.pairScales.data() + (b / 2) * 16;
            for (int i = 0; i < 8; ++i) {
                int const lane = int4 ? (i / 4) * 8 + (b % 2) * 4 + i % 4 : static_cast<int>(b % 2) * 8 + i;
                lanes[lane] = out.scales[b];
            }
        }
    }
}

#if TRTLLM_HOST_AVX2
// The 8 int32 sums of 4 adjacent products of 32 unsigned bytes u and 32 signed bytes v, as floats.
TRTLLM_AVX2 inline __m256 dot32(__m256i u, __m256i v) {
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1)));
}

// One block of a row of W: `load` its codes as 32 bytes, `dot` them against x's codes xv (its
// 32 products summed in integers by fours, as 8 floats). INT4: 16 bytes, the block's even inputs
// in the low nibbles, the odd ones in the high nibbles (x's codes are staged in that order),
// loaded as 32 unsigned values.
struct Int4Block {
    static constexpr int64_t kBytes = kBlock / 2;
    TRTLLM_AVX2 static __m256i load(uint8_t const* codes) {
        __m128i const low = _mm_set1_epi8(0x0F);
        __m128i const bytes = _mm_loadu_si128(reinterpret_cast<__m128i const*>(codes));
        __m128i const lo = _mm_and_si128(bytes, low);                     // inputs 0, 2, .., 30
        __m128i const hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);  // inputs 1, 3, .., 31
        return _mm256_set_m128i(hi, lo);
    }
    TRTLLM_AVX2 static __m256 dot(__m256i w, __m256i xv) { return dot32(w, xv); }
};

// INT8: 32 signed codes; maddubs takes one unsigned operand, so |c| against x with c's sign.
struct Int8Block {
    static constexpr int64_t kBytes = kBlock;
    TRTLLM_AVX2 static __m256i load(uint8_t const* codes) {
        return _mm256_loadu_si256(reinterpret_cast<__m256i const*>(codes));
    }
    TRTLLM_AVX2 static __m256 dot(__m256i c, __m256i xv) {
        return dot32(_mm256_sign_epi8(c, c), _mm256_sign_epi8(xv, c));
    }
};

// R rows of W (groups of G codes; INT8 per channel: G = k), rowBytes apart, against M quantized
// rows of x: each (x row, W row)'s sum over blocks of block products x weight scale x block
// scale, as 8 floats in total[m][r]. Each block of W is loaded (and INT4 unpacked) once for the
// M rows of x, which share it from registers: W is read once per M rows of x, and the FMAs have
// M x R independent chains. One loop over the blocks, the group's scales advanced by a countdown
// (an index division a block, or a loop a group of one block, cost as much as the block's
// products). ahead: the codes of R rows a few rows further on (or nullptr), prefetched R * kBytes
// a block.
template <int R, int M, typename Block>
TRTLLM_AVX2 void blockRows(uint8_t const* codes, int64_t rowBytes, float const* scales, int64_t groups,
                           XBlocks const* x, int64_t blocksPerGroup, uint8_t const* ahead,
                           __m256 (&total)[M][R]) {
    for (int m = 0; m < M; ++m) {
        for (int r = 0; r < R; ++r) total[m][r] = _mm256_setzero_ps();
    }
    int8_t const* xCodes[M];
    float const* xScales[M];
    for (int m = 0; m < M; ++m) {
        xCodes[m] = x[m].codes.data();
        xScales[m] = x[m].scales.data();
    }
    int64_t const blocks = groups * blocksPerGroup;
    float const* s = scales;
    int64_t left = blocksPerGroup;
    for (int64_t b = 0; b < blocks; ++b) {
        if (ahead) {
            for (int64_t i = 0; i < R * Block::kBytes; i += kLine) {
                _mm_prefetch(reinterpret_cast<char const*>(ahead + b * R * Block::kBytes + i), _MM_HINT_T0);
            }
        }
        __m256i xv[M];
        float xs[M];
        for (int m = 0; m < M; ++m) {
            xv[m] = _mm256_loadu_si256(reinterpret_cast<__m256i const*>(xCodes[m] + b * kBlock));
            xs[m] = xScales[m][b];
        }
        for (int r = 0; r < R; ++r) {
            __m256i const w = Block::load(codes + r * rowBytes + b * Block::kBytes);
            for (int m = 0; m < M; ++m) {
                total[m][r] = _mm256_fmadd_ps(Block::dot(w, xv[m]), _mm256_set1_ps(s[r * groups] * xs[m]), total[m][r]);
            }
        }
        if (--left == 0) {
            left = blocksPerGroup;
            ++s;
        }
    }
}

// R rows of W from row n: their codes and groups, and (prefetch) the codes of rows at least
// kPrefetchBytes further on, if W has them, whose scales and zeros are prefetched now and whose
// codes the block loop prefetches while it reads these rows.
struct RowsOfW {
    int64_t groups, blocksPerGroup, rowBytes;
    uint8_t const* codes;
    uint8_t const* ahead;  // or nullptr
};

TRTLLM_AVX2 RowsOfW rowsOfW(HostWeightOnlyGemvParams const& p, int64_t n, int R, bool prefetch) {
    int64_t const group = p.groupSize > 0 ? p.groupSize : p.k;
    RowsOfW w;
    w.groups = p.k / group;
    w.blocksPerGroup = group / kBlock;
    w.rowBytes = p.bits == 4 ? p.k / 2 : p.k;
    w.codes = static_cast<uint8_t const*>(p.qweight) + n * w.rowBytes;
    w.ahead = nullptr;
    int64_t const aheadRows = (kPrefetchBytes + R * w.rowBytes - 1) / (R * w.rowBytes) * R;
    if (prefetch && n + aheadRows + R <= p.n) {
        w.ahead = w.codes + aheadRows * w.rowBytes;
        for (float const* t : {p.scales, p.zeros}) {
            if (!t) continue;
            float const* first = t + (n + aheadRows) * w.groups;
            for (int64_t i = 0; i < R * w.groups; i += kLine / 4) _mm_prefetch(reinterpret_cast<char const*>(first + i), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<char const*>(first + R * w.groups - 1), _MM_HINT_T0);
        }
    }
    return w;
}

// out[m][n + r] = sums[m][r], the block sums of R rows of W against M rows of x; INT4's zeros meet
// x's float sums per group.
template <int R, int M>
TRTLLM_AVX2 void storeRows(HostWeightOnlyGemvParams const& p, XBlocks const* x, int64_t n, int64_t groups,
                           float const (&sums)[M][R], float* const* out) {
    for (int m = 0; m < M; ++m) {
        for (int r = 0; r < R; ++r) {
            out[m][n + r] = p.bits == 4 ? sums[m][r] + dotAvx2(p.zeros + (n + r) * groups, x[m].groupSums.data(), groups)
                                        : sums[m][r];
        }
    }
}

// R rows of W from row n against M quantized rows of x (x[m] is out row m's), into out[m][n..n + R).
// prefetch: this call brings the next rows' codes (the first call over these rows of W; later ones
// find them in cache).
template <int R, int M>
TRTLLM_AVX2 void rows(HostWeightOnlyGemvParams const& p, XBlocks const* x, int64_t n, float* const* out,
                      bool prefetch) {
    RowsOfW const w = rowsOfW(p, n, R, prefetch);
    float const* scales = p.scales + n * w.groups;
    __m256 total[M][R];
    if (p.bits == 4) {
        blockRows<R, M, Int4Block>(w.codes, w.rowBytes, scales, w.groups, x, w.blocksPerGroup, w.ahead, total);
    } else {
        blockRows<R, M, Int8Block>(w.codes, w.rowBytes, scales, w.groups, x, w.blocksPerGroup, w.ahead, total);
    }
    float sums[M][R];
    for (int m = 0; m < M; ++m) {
        for (int r = 0; r < R; ++r) sums[m][r] = horizontalSum(total[m][r]);
    }
    storeRows<R, M>(p, x, n, w.groups, sums, out);
}

// Rows n..end of W against the M rows of x from x[0] (M <= kXRows), R rows of W at a time.
template <int M>
TRTLLM_AVX2 void rowRange(HostWeightOnlyGemvParams const& p, XBlocks const* x, int64_t n, int64_t end,
                          float* const* out, bool prefetch) {
    constexpr int R = kRowsFor(M);
    for (; n + R <= end; n += R) rows<R, M>(p, x, n, out, prefetch);
    for (; n < end; ++n) rows<1, M>(p, x, n, out, prefetch);
}

// ---- AVX-512 VNNI: two blocks of W a step ------------------------------------------------

// Two blocks of a row of W as 64 unsigned bytes, and x's 64 codes signed to match, for
// vpdpbusd. INT4: its 32 bytes' low nibbles (the two blocks' even inputs), then the high ones
// (Order::kPairs stages x so). INT8: |codes|, with x negated where a code is negative.
struct Int4Pair {
    static constexpr int64_t kBytes = kBlock;  // two blocks' codes
    // Lanes of the W scales: 0-3 and 8-11 the first block's, 4-7 and 12-15 the second's.
    TRTLLM_AVX512_VNNI static __m512i scaleLanes() {
        return _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
    }
    TRTLLM_AVX512_VNNI static __m512i load(uint8_t const* codes, __mmask64& negative) {
        __m256i const low = _mm256_set1_epi8(0x0F);
        __m256i const bytes = _mm256_loadu_si256(reinterpret_cast<__m256i const*>(codes));
        __m256i const lo = _mm256_and_si256(bytes, low);
        __m256i const hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
        negative = 0;
        return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    TRTLLM_AVX512_VNNI static __m512i signedX(__m512i xv, __mmask64) { return xv; }
};

struct Int8Pair {
    static constexpr int64_t kBytes = 2 * kBlock;
    TRTLLM_AVX512_VNNI static __m512i scaleLanes() {
        return _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    }
    TRTLLM_AVX512_VNNI static __m512i load(uint8_t const* codes, __mmask64& negative) {
        __m512i const c = _mm512_loadu_si512(codes);
        negative = _mm512_movepi8_mask(c);
        return _mm512_abs_epi8(c);
    }
    TRTLLM_AVX512_VNNI static __m512i signedX(__m512i xv, __mmask64 negative) {
        return _mm512_mask_sub_epi8(xv, negative, _mm512_setzero_si512(), xv);
    }
};

// blockRows, two blocks a step (the block count is even). PAIR_SCALES: groups of one block,
// whose two W scales a step are adjacent; otherwise both blocks of a step lie in one group
// (blocks per group even, or one group a row).
template <int R, int M, typename Pair, bool PAIR_SCALES>
TRTLLM_AVX512_VNNI void pairRows(uint8_t const* codes, int64_t rowBytes, float const* scales, int64_t groups,
                                 XBlocks const* x, int64_t blocksPerGroup, uint8_t const* ahead,
                                 __m512 (&total)[M][R]) {
    for (int m = 0; m < M; ++m) {
        for (int r = 0; r < R; ++r) total[m][r] = _mm512_setzero_ps();
    }
    int8_t const* xCodes[M];
    float const* xScales[M];
    for (int m = 0; m < M; ++m) {
        xCodes[m] = x[m].codes.data();
        xScales[m] = x[m].pairScales.data();
    }
    __m512i const lanes = Pair::scaleLanes();
    int64_t const steps = groups * blocksPerGroup / 2;
    float const* s = scales;
    int64_t left = blocksPerGroup / 2;
    for (int64_t b = 0; b < steps; ++b) {
        if (ahead) {
            for (int64_t i = 0; i < R * Pair::kBytes; i += kLine) {
                _mm_prefetch(reinterpret_cast<char const*>(ahead + b * R * Pair::kBytes + i), _MM_HINT_T0);
            }
        }
        __m512i xv[M];
        __m512 xs[M];
        for (int m = 0; m < M; ++m) {
            xv[m] = _mm512_loadu_si512(xCodes[m] + b * 2 * kBlock);
            xs[m] = _mm512_loadu_ps(xScales[m] + b * 16);
        }
        for (int r = 0; r < R; ++r) {
            __mmask64 negative;
            __m512i const w = Pair::load(codes + r * rowBytes + b * Pair::kBytes, negative);
            __m512 ws;
            if constexpr (PAIR_SCALES) {
                __m128 const two = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<double const*>(s + r * groups + 2 * b)));
                ws = _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(two));
            } else {
                ws = _mm512_set1_ps(s[r * groups]);
            }
            for (int m = 0; m < M; ++m) {
                __m512i const sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, Pair::signedX(xv[m], negative));
                total[m][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(ws, xs[m]), total[m][r]);
            }
        }
        if (!PAIR_SCALES && --left == 0) {
            left = blocksPerGroup / 2;
            ++s;
        }
    }
}

// rows, through pairRows.
template <int R, int M>
TRTLLM_AVX512_VNNI void pairRowsOut(HostWeightOnlyGemvParams const& p, XBlocks const* x, int64_t n,
                                    float* const* out, bool prefetch) {
    RowsOfW const w = rowsOfW(p, n, R, prefetch);
    float const* scales = p.scales + n * w.groups;
    bool const single = w.blocksPerGroup == 1;
    __m512 total[M][R];
    if (p.bits == 4) {
        if (single) {
            pairRows<R, M, Int4Pair, true>(w.codes, w.rowBytes, scales, w.groups, x, w.blocksPerGroup, w.ahead, total);
        } else {
            pairRows<R, M, Int4Pair, false>(w.codes, w.rowBytes, scales, w.groups, x, w.blocksPerGroup, w.ahead, total);
        }
    } else {
        if (single) {
            pairRows<R, M, Int8Pair, true>(w.codes, w.rowBytes, scales, w.groups, x, w.blocksPerGroup, w.ahead, total);
        } else {
            pairRows<R, M, Int8Pair, false>(w.codes, w.rowBytes, scales, w.groups, x, w.blocksPerGroup, w.ahead, total);
        }
    }
    float sums[M][R];
    for (int m = 0; m < M; ++m) {
        for (int r = 0; r < R; ++r) sums[m][r] = _mm512_reduce_add_ps(total[m][r]);
    }
    storeRows<R, M>(p, x, n, w.groups, sums, out);
}

// rowRange, through pairRowsOut: 4 rows of W a pass for up to 4 rows of x (16 accumulators of
// AVX-512's 32 registers).
template <int M>
TRTLLM_AVX512_VNNI void pairRowRange(HostWeightOnlyGemvParams const& p, XBlocks const* x, int64_t n,
                                     int64_t end, float* const* out, bool prefetch) {
    constexpr int R = 4;
    for (; n + R <= end; n += R) pairRowsOut<R, M>(p, x, n, out, prefetch);
    for (; n < end; ++n) pairRowsOut<1, M>(p, x, n, out, prefetch);
}
#endif

} // namespace

bool hostWeightOnlyGemvAvailable() { return hostAvx2(); }

bool hostWeightOnlyGemvVnni() { return hostAvx512Vnni(); }

bool hostWeightOnlyGemvServes(int bits, int64_t k, int64_t groupSize) {
    int64_t const group = groupSize > 0 ? groupSize : k;
    return (bits == 4 || bits == 8) && k > 0 && group > 0 && k % group == 0 && group % kBlock == 0
           && (bits == 8 || groupSize > 0);
}

void hostWeightOnlyGemv(HostWeightOnlyGemvParams const& p) {
    if (!hostWeightOnlyGemvAvailable()) {
        throw std::runtime_error("host_weight_only_gemv: this CPU has no AVX2 + FMA (use PyTorch's CPU kernels)");
    }
#if TRTLLM_HOST_AVX2
    int64_t const group = p.groupSize > 0 ? p.groupSize : p.k;
    int64_t const blocksPerGroup = group / kBlock;
    // Two blocks a step: an even number of blocks, each step's two in one group (groups of 64
    // and up, per channel) or in groups of one (32).
    bool const pairs = hostAvx512Vnni() && (p.k / kBlock) % 2 == 0 && (blocksPerGroup == 1 || blocksPerGroup % 2 == 0);
    Order const order = pairs ? Order::kPairs : p.bits == 4 ? Order::kEvenOdd : Order::kPlain;
    std::vector<XBlocks> xs(static_cast<size_t>(p.m));
    std::vector<float*> out(static_cast<size_t>(p.m));
    for (int64_t r = 0; r < p.m; ++r) {
        quantizeX(p.x + r * p.xRowStride, p.k, group, order, p.bits == 4, xs[r]);
        out[r] = p.out + r * p.outRowStride;
    }
    // The row ranges for 1 .. kXRows rows of x, of the path this CPU takes.
    using RowRange = void (*)(HostWeightOnlyGemvParams const&, XBlocks const*, int64_t, int64_t, float* const*, bool);
    static constexpr RowRange kPlainRanges[kXRows] = {rowRange<1>, rowRange<2>, rowRange<3>, rowRange<4>};
    static constexpr RowRange kPairRanges[kXRows] = {pairRowRange<1>, pairRowRange<2>, pairRowRange<3>, pairRowRange<4>};
    RowRange const* ranges = pairs ? kPairRanges : kPlainRanges;
    // Whole passes of the widest R, so that every part but the last has no single rows.
    hostParallelRows(p.n, p.threads, kRowsPerPart, kRowsFor(1), [&](int64_t begin, int64_t end) {
        // A slice of W's rows against every row of x in turn, kXRows at a time: the slice (a few
        // KB) is read from memory by the first pass and from cache by the others.
        for (int64_t n = begin; n < end; n += kSliceRows) {
            int64_t const sliceEnd = std::min(end, n + kSliceRows);
            for (int64_t r = 0; r < p.m; r += kXRows) {
                int64_t const rows = std::min<int64_t>(kXRows, p.m - r);
                ranges[rows - 1](p, xs.data() + r, n, sliceEnd, out.data() + r, /*prefetch=*/r == 0);
            }
        }
    });
    if (p.bias) {
        for (int64_t r = 0; r < p.m; ++r) {
            for (int64_t i = 0; i < p.n; ++i) out[r][i] += p.bias[i];
        }
    }
#endif
}

} // namespace tensorrt_llm
