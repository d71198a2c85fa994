// Kernel entry points of tensorrt_llm.bindings.
//
// Plain C++ (no CUDA or pybind11 headers) so that the bindings can be compiled by the host
// compiler. Every launcher takes raw device pointers, sizes and strides in elements, and the
// CUDA stream as an opaque pointer. Its arguments are checked by its binding entry
// (cpp/bindings/entry.h) before it runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tensorrt_llm {

// Dtype codes shared with Python (tensorrt_llm/ops/launch.py reads them from the
// module's DTYPES dict, never hard-codes them).
enum class DType : int {
    kFloat32 = 0,
    kFloat16 = 1,
    kBFloat16 = 2,
    kInt32 = 3,
    kInt64 = 4,
    kInt8 = 5,   // INT8 KV cache codes
    kUInt8 = 6,  // FP8 E4M3 KV cache codes, as their bytes
};

char const* dtypeName(DType dtype);
int dtypeSize(DType dtype);

// True when this build contains the CUDA kernels.
bool cudaKernelsCompiled();

// The FP8 GEMM of at most 32 rows on Hopper (kernels/sm90a/fp8_gemm_wgmma.cu: TMA and wgmma, in a
// CUDA build that targets sm_90; runs on compute capability 9.0 only): out[M, N] = (codes .
// W^T) * inputScale * weightScale (+ bias), codes x's E4M3 bytes [M, K], W's [N, K], both
// contiguous on 16-byte boundaries, N a multiple of 64, K of 128; out float16 / bfloat16.
constexpr int64_t kFp8GemmWgmmaMaxRows = 32;
bool fp8GemmWgmmaCompiled();
void launchFp8GemmWgmma(void* out, void const* codes, void const* qweight, void const* weightScale,
                        void const* inputScale, void const* bias, int64_t m, int64_t n, int64_t k,
                        int64_t outRowStride, bool perChannel, DType dtype, void* stream);

// Makes `device` current for the calling thread and checks that every pointer is device (or
// managed) memory of that device; launches nothing. Returns the device that was current before
// (give it to restoreDevice after the launch: PyTorch's runtime shares the thread's current
// context). Throws std::invalid_argument naming the tensor when a pointer is not on `device`,
// std::runtime_error on CUDA errors (no GPU, no driver, ...). A pointer marked `pinnedHost` must
// instead be page-locked host memory (which a kernel writes over the bus), all `bytes` of it.
struct NamedPointer {
    std::string name;
    void const* ptr;
    bool pinnedHost = false;
    int64_t bytes = 0;
};
int prepareDevice(int device, std::vector<NamedPointer> const& pointers, void* stream);
void restoreDevice(int previous) noexcept;

struct RmsNormParams {
    void* out;                 // [rows, hidden] of dtype, or of E4M3 bytes when codeScale is given
    void const* x;             // [rows, hidden]
    void const* weight;        // [hidden], contiguous
    void const* residual;      // [rows, hidden] or nullptr
    void* residualOut;         // [rows, hidden] (x + residual) or nullptr
    int64_t rows;
    int64_t hidden;
    int64_t xRowStride;
    int64_t outRowStride;
    int64_t residualRowStride;
    int64_t residualOutRowStride;
    float eps;
    DType dtype;
    float const* codeScale;    // [1], an FP8 linear's static input scale, or nullptr
};
void launchRmsNorm(RmsNormParams const& p, void* stream);
void hostRmsNorm(RmsNormParams const& p);  // on the host CPU: float32, no codeScale (kernels/host_rms_norm.cpp)

struct RotaryParams {
    void* q;                   // [tokens, qHeads, headDim], last dim contiguous
    void* k;                   // [tokens, kHeads, headDim], last dim contiguous
    void const* positions;     // [tokens], int32 or int64, contiguous
    float const* cosSinCache;  // [maxPositions, rotaryDim], float32, contiguous
    int64_t tokens;
    int64_t qHeads;
    int64_t kHeads;
    int64_t headDim;
    int64_t rotaryDim;
    int64_t maxPositions;
    int64_t qTokenStride;
    int64_t qHeadStride;
    int64_t kTokenStride;
    int64_t kHeadStride;
    bool isNeox;
    DType dtype;
    DType positionsDtype;
};
void launchRotaryEmbedding(RotaryParams const& p, void* stream);

enum class Activation : int {
    kSilu = 0,
    kGelu = 1,      // exact, erf
    kGeluTanh = 2,  // tanh approximation
};

struct ActAndMulParams {
    void* out;                 // [rows, inter] of dtype, or of E4M3 bytes when codeScale is given
    void const* x;             // [rows, 2 * inter]
    int64_t rows;
    int64_t inter;
    int64_t xRowStride;
    int64_t outRowStride;
    Activation act;
    DType dtype;
    float const* codeScale;    // [1], an FP8 linear's static input scale, or nullptr
};
void launchActAndMul(ActAndMulParams const& p, void* stream);
void hostSiluAndMul(ActAndMulParams const& p);  // on the host CPU: float32, SiLU, no codeScale (kernels/host_activation.cpp)

struct PagedKvWriteParams {
    void const* key;           // [tokens, kvHeads, headDim], last dim contiguous
    void const* value;         // [tokens, kvHeads, headDim], last dim contiguous
    void* kvCache;             // [numBlocks, 2, kvHeads, tokensPerBlock, headDim], contiguous
    float const* kvScale;      // [2] (K, V scales) when kvCache holds codes (cacheDtype kInt8 / kUInt8)
    DType cacheDtype;          // dtype, or kInt8 / kUInt8: rows are quantized as written (kv_codes.cuh)
    int32_t const* blockTables;  // [batch, maxBlocks], contiguous
    int32_t const* cuSeqlens;    // [batch + 1]
    int32_t const* pastLengths;  // [batch]
    int64_t tokens;
    int64_t batch;
    int64_t maxBlocks;
    int64_t numBlocks;
    int64_t kvHeads;
    int64_t tokensPerBlock;
    int64_t headDim;
    int64_t keyTokenStride;
    int64_t keyHeadStride;
    int64_t valueTokenStride;
    int64_t valueHeadStride;
    DType dtype;
};
void launchPagedKvWrite(PagedKvWriteParams const& p, void* stream);

// Top-k / top-p sampling of one token per row with one uniform number per row (the rule is in
// cpp/kernels/sampling.cu). Every per-row parameter lives in device memory (CUDA-graph safe).
// Token masses are 2^40 fixed point, so the vocabulary is kept below 2^23 (sums stay below 2^63).
constexpr int64_t kSamplingMaxVocab = (int64_t{1} << 23) - 1;
struct TopKTopPSampleParams {
    int32_t* out;               // [batch] token ids
    void const* logits;         // [batch, vocab], row stride logitsRowStride, last dim contiguous
    float const* temperatures;  // [batch]; <= 0: greedy
    int32_t const* topKs;       // [batch]; 0 or >= vocab: no limit, 1: greedy
    float const* topPs;         // [batch]; outside (0, 1): no limit
    float const* uniforms;      // [batch], in [0, 1)
    int64_t batch;
    int64_t vocab;
    int64_t logitsRowStride;
    DType dtype;
};
void launchTopKTopPSample(TopKTopPSampleParams const& p, void* stream);

// Each row's first largest logit (torch.argmax: NaN the largest): each chunk of a row reduced by
// a block into the workspace, then the best chunk of each row.
struct ArgmaxRowsParams {
    int32_t* out;                   // [batch] token ids
    int32_t* advance;               // [batch] or null: each entry + 1 (a greedy step's sequence lengths)
    // hostOut null, or out is also written to row *hostSlot % 2 of hostOut ([2][hostStride], page-locked
    // host memory: the host reads the tokens once the launch is done, with no copy queued after it),
    // and *hostSlot (device) + 1, so that successive launches alternate between the rows.
    int32_t* hostOut;
    int64_t hostStride;
    int32_t* hostSlot;
    void const* logits;             // [batch, vocab], row stride logitsRowStride, last dim contiguous
    unsigned long long* workspace;  // [argmaxRowsWorkspace(batch, vocab)]
    int64_t batch;
    int64_t vocab;
    int64_t logitsRowStride;
    DType dtype;
};
constexpr int64_t kArgmaxChunk = 4096;  // logits a block reduces
inline int64_t argmaxRowsWorkspace(int64_t batch, int64_t vocab) { return batch * ((vocab + kArgmaxChunk - 1) / kArgmaxChunk); }
void launchArgmaxRows(ArgmaxRowsParams const& p, void* stream);

// Weight-only INT8 / INT4 GEMV on the host CPU (AVX2 + FMA; kernels/host_weight_only_gemv.cpp),
// compiled in every build: out = x @ W^T + bias in float32, W = code * scale (+ zero, INT4) as
// formats.py's layouts (INT4: [n, k / 2] bytes, input 2j in the low nibble; INT8: int8 [n, k]).
struct HostWeightOnlyGemvParams {
    float* out;            // [m, n], row stride outRowStride
    float const* x;        // [m, k], row stride xRowStride
    void const* qweight;   // contiguous
    float const* scales;   // [n, k / G] contiguous (per channel: [n])
    float const* zeros;    // INT4: [n, k / G]
    float const* bias;     // [n] or nullptr
    int64_t m, n, k, xRowStride, outRowStride;
    int64_t groupSize;     // G; 0: per channel (INT8)
    int bits;              // 4 or 8
    int threads;           // threads over W's rows (1: this one only)
};
bool hostWeightOnlyGemvAvailable();  // this CPU runs it (AVX2 and FMA)
bool hostWeightOnlyGemvVnni();       // and has AVX-512 VNNI, which it uses
bool hostWeightOnlyGemvServes(int bits, int64_t k, int64_t groupSize);  // its shapes: G a multiple of 32
void hostWeightOnlyGemv(HostWeightOnlyGemvParams const& p);

// FP8 (E4M3) linear on the host CPU (kernels/host_fp8_gemv.cpp): out = (x @ W^T) * input scale *
// weight scale + bias, x the activation's E4M3 codes as their float32 values.
struct HostFp8GemvParams {
    float* out;                // [m, n], row stride outRowStride
    float const* x;            // [m, k], row stride xRowStride: E4M3 values
    uint8_t const* qweight;    // [n, k] E4M3 bytes, contiguous
    float const* weightScale;  // [n] (weightPerRow) or [1]
    float const* inputScale;   // [m] (inputPerRow: per token) or [1]
    float const* bias;         // [n] or nullptr
    int64_t m, n, k, xRowStride, outRowStride;
    bool weightPerRow, inputPerRow;
    int threads;               // threads over W's rows (1: this one only)
};
bool hostFp8GemvAvailable();           // this CPU runs it (AVX2 and FMA)
bool hostFp8GemvServes(int64_t k);     // in_features a multiple of 8
void hostFp8Gemv(HostFp8GemvParams const& p);

// Decode attention over the paged cache: one query token per sequence at position
// sequenceLengths[b] - 1, all query heads of a KV head together. With kNew/vNew, the step's
// K/V rows are written into the cache by the same launch (rotated first when cosSin is given,
// q too); without them the cache must already hold them.
constexpr int kDecodeAttentionMaxGroup = 8;  // query heads per KV head served by one block
constexpr int kDecodeAttentionMaxChunkBlocks = 4096;  // cache blocks one block's chunk may span
struct DecodeAttentionParams {
    void* out;                       // [batch, numHeads, headDim], row stride outTokenStride; E4M3 bytes with codeScale
    float const* codeScale;          // [1], the static input scale of the FP8 linear reading out, or nullptr
    void const* q;                   // [batch, numHeads, headDim], row stride qTokenStride
    void* kvCache;                   // [numBlocks, 2, kvHeads, tokensPerBlock, headDim], contiguous
    float const* kvScale;            // [2] (K, V scales) when kvCache holds codes
    DType cacheDtype;                // dtype, or kInt8 / kUInt8 codes (tensor-core kernel only)
    int32_t const* blockTables;      // [batch, maxBlocks]
    int32_t const* sequenceLengths;  // [batch]
    float const* alibiSlopes;        // [numHeads] or nullptr
    float* workspace;                // [batch, numHeads, numSplits, headDim + 2] when numSplits > 1
    int* splitCounters;              // [batch * kvHeads], all zero, when numSplits > 1 (left zero)
    void const* kNew;                // [batch, kvHeads, headDim] rows of this step, or nullptr
    void const* vNew;                // [batch, kvHeads, headDim], with kNew
    int64_t kNewTokenStride;
    int64_t vNewTokenStride;
    float const* cosSin;             // [maxPositions, rotaryDim] or nullptr: no rotation
    int64_t maxPositions;
    int rotaryDim;
    bool isNeox;
    int64_t batch;
    int64_t numHeads;
    int64_t kvHeads;
    int64_t headDim;
    int64_t tokensPerBlock;
    int64_t maxBlocks;
    int64_t numBlocks;
    int64_t qTokenStride;
    int64_t outTokenStride;
    int numSplits;      // chunks of splitSize positions; fixed per engine so launches can be captured
    int splitSize;
    int slidingWindow;  // 0: none
    float scale;
    DType dtype;
    // The caller's promise that every cached position before each query was written before this
    // launch's stream work began (a decode step of its own CUDA graph): the tensor-core kernel then
    // issues its first K/V loads before waitForPreviousKernel (fused form, a cache of T).
    bool earlyCacheLoads;
};
bool decodeAttentionSupportsHeadDim(int64_t headDim);
void launchDecodeAttention(DecodeAttentionParams const& p, void* stream);
// On the host CPU (kernels/host_decode_attention.cpp): float32 q and cache, no splits (numSplits,
// splitSize, workspace and splitCounters unused: the host kernel splits by a fixed chunk of
// positions over `threads` threads); lengths and block ids are checked before anything is read.
void hostDecodeAttention(DecodeAttentionParams const& p, int threads);

// Linear layer of a few rows (decode steps of small batches) as one pass over the weights,
// with the op that produces its input fused in front (the prologue):
//   kNone:       a = x                                   x [rows, k]
//   kRmsNorm:    a = rmsnorm(s) * normWeight, s = x (+ residual, written to residualOut)
//   kSiluAndMul: a = silu(x[:, :k]) * x[:, k:]           x [rows, 2k]
//   out[r, n] = sum_k a[r, k] * weight[n, k] (+ bias[n])
// Every block computes a into shared memory, so rows * k elements must fit there
// (gemvSupports); weight rows are contiguous and k a multiple of 16 bytes' elements.
enum class GemvPrologue : int {
    kNone = 0,
    kRmsNorm = 1,
    kSiluAndMul = 2,
};
constexpr int kGemvMaxRows = 4;
struct GemvParams {
    void* out;                  // [rows, n], row stride outRowStride
    void const* x;              // [rows, k] ([rows, 2k] for kSiluAndMul), row stride xRowStride
    void const* weight;         // [n, k], contiguous
    void const* bias;           // [n] or nullptr
    void const* residual;       // [rows, k] or nullptr (kRmsNorm)
    void* residualOut;          // [rows, k], contiguous, with residual
    void const* normWeight;     // [k] (kRmsNorm)
    int64_t rows;
    int64_t n;
    int64_t k;
    int64_t xRowStride;
    int64_t outRowStride;
    int64_t residualRowStride;
    float eps;
    GemvPrologue prologue;
    DType dtype;
};
bool gemvSupports(int64_t rows, int64_t k, DType dtype);
void launchGemv(GemvParams const& p, void* stream);

// The RMSNorm in front of a weight-only GEMV (weight_only_gemv.cu, INT4 bfloat16, up to 8 rows):
// a = rmsnorm(s) * normWeight of s = x (+ residual, then written to residualOut), computed as
// out = inv(s) * (W (s * normWeight)) + bias, inv(s) = rsqrt(mean(s^2) + eps): each warp scales
// only the x it stages, and the row's mean square meets in the epilogue's reduction (no pass
// over the whole row before the first product). So out differs from the norm kernel then the GEMV
// by the rounding of s * normWeight to bfloat16 in place of s * inv * normWeight.
struct WeightOnlyNorm {
    void const* residual;       // [rows, k] or nullptr
    int64_t residualRowStride;
    void* residualOut;          // [rows, k], contiguous, with residual
    void const* normWeight;     // [k]
    float eps;
};


} // namespace tensorrt_llm
