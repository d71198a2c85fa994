// The pybind11 module tensorrt_llm.bindings: one table row (an Entry, entry.h) per kernel.
//
// A row names the kernel's arguments with their checks, checks what relates them, and fills
// the kernel's params and launches it; the mechanism in entry.cpp runs every row the same way
// and raises ValueError / TypeError naming the tensors before anything reaches the GPU, so the
// launchers in cpp/kernels/ can rely on the shapes. The module never links libtorch: tensors
// come in as (data_ptr, dtype_code, shape, strides, device) tuples, the stream as an int.
#include "build_info.h"
#include "entry.h"
#include "tensor_arg.h"
#include "tensorrt_llm/kernels.h"

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

namespace py = pybind11;
using namespace tensorrt_llm;

namespace tensorrt_llm {
// weight_only_gemv.cu
void launchWeightOnlyGemv(void* out, void const* x, void const* qweight, void const* scales, void const* zeros,
                          void const* bias, int64_t m, int64_t n, int64_t k, int64_t xRowStride, int64_t outRowStride,
                          int bits, int64_t groupSize, bool tiled, bool gated, WeightOnlyNorm const* norm,
                          int64_t const* perm, DType dtype, DType scaleDtype, void* stream);
void launchWeightOnlyDequantize(void* out, void const* qweight, void const* scales, void const* zeros, int64_t n,
                                int64_t k, int bits, int64_t groupSize, bool tiled, DType dtype, DType scaleDtype,
                                void* stream);
void launchFp8Gemv(void* out, void const* x, void const* qweight, void const* weightScale, void const* inputScale,
                   void const* bias, int64_t m, int64_t n, int64_t k, int64_t xRowStride, int64_t outRowStride,
                   bool perChannel, bool gated, DType dtype, void* stream);
void launchFp8Quantize(void* codes, void* rowScales, void const* x, void const* inputScale, int64_t m, int64_t k,
                       int64_t xRowStride, DType dtype, void* stream);
} // namespace tensorrt_llm

namespace {

constexpr DType kInt32 = DType::kInt32;
constexpr DType kFloat32 = DType::kFloat32;

// The output of rms_norm / silu_and_mul / decode_attention (`out`), or of their *_fp8 entries
// (input_scale given): E4M3 codes, whose bytes the binding takes as int32 words. Sets out, its
// row stride (in elements of the output) and codeScale.
void setOutput(Call const& c, void*& out, int64_t& rowStride, float const*& codeScale) {
    if (c.has("input_scale")) {
        out = c["codes"].data();
        rowStride = c["codes"].stride(0) * 4;
        codeScale = static_cast<float const*>(c["input_scale"].data());
    } else {
        out = c["out"].data();
        rowStride = c["out"].stride(0);
    }
}

template <typename Params>
void setOutput(Call const& c, Params& p) {
    setOutput(c, p.out, p.outRowStride, p.codeScale);
}

// ---- rms_norm ----

void checkRmsNorm(Call& c) {
    c.together("residual", "residual_out");
    TensorArg const& x = c["x"];
    c.shape("weight", {x.size(1)});
    if (x.size(1) == 0) throw std::invalid_argument("x has an empty last dimension");
    c.finiteNonNegative("eps");
    c.fitsInt("rows", x.size(0));
}

// rms_norm's and host_rms_norm's params (rms_norm_fp8's: with its codes).
RmsNormParams rmsNormParams(Call const& c) {
    TensorArg const& x = c["x"];
    bool const residual = c.has("residual");
    RmsNormParams p{};
    setOutput(c, p);
    p.x = x.data();
    p.weight = c["weight"].data();
    p.residual = c.ptr("residual");
    p.residualOut = const_cast<void*>(c.ptr("residual_out"));
    p.rows = x.size(0);
    p.hidden = x.size(1);
    p.xRowStride = x.stride(0);
    p.residualRowStride = residual ? c["residual"].stride(0) : 0;
    p.residualOutRowStride = residual ? c["residual_out"].stride(0) : 0;
    p.eps = static_cast<float>(c.real("eps"));
    p.dtype = x.dtype;
    return p;
}

void launchRmsNormEntry(Call const& c) {
    RmsNormParams const p = rmsNormParams(c);
    if constexpr (kCudaKernels) launchRmsNorm(p, c.stream());
}

// ---- rms_norm_fp8 / silu_and_mul_fp8: the same kernels writing an FP8 linear's input codes ----

// A *_fp8 entry's codes: `rows` rows of `width` bytes as int32 words, and its static input scale.
void checkCodesOf(Call& c, int64_t rows, int64_t width) {
    c.shape("input_scale", {1});
    if (width % 4 != 0) throw std::invalid_argument("the output width " + std::to_string(width) + " must be a multiple of 4");
    c.shape("codes", {rows, width / 4});
}

void checkRmsNormFp8(Call& c) {
    checkRmsNorm(c);
    checkCodesOf(c, c["x"].size(0), c["x"].size(1));
}

// ---- rotary_embedding ----

void checkRotary(Call& c) {
    TensorArg const &q = c["q"], &k = c["k"], &positions = c["positions"], &cache = c["cos_sin_cache"];
    if (k.size(0) != q.size(0) || positions.size(0) != q.size(0)) {
        throw std::invalid_argument("token counts differ: q " + q.shapeStr() + ", k " + k.shapeStr() + ", positions "
                                    + positions.shapeStr());
    }
    if (k.size(2) != q.size(2)) {
        throw std::invalid_argument("head sizes differ: q " + q.shapeStr() + ", k " + k.shapeStr());
    }
    int64_t const rotaryDim = cache.size(1);
    if (rotaryDim % 2 != 0 || rotaryDim > q.size(2)) {
        throw std::invalid_argument("cos_sin_cache " + cache.shapeStr() + " needs an even rotary_dim <= head_dim "
                                    + std::to_string(q.size(2)));
    }
    c.fitsInt("tokens", q.size(0));
    c.fitsInt("heads * rotary_dim", (q.size(1) + k.size(1)) * rotaryDim);
}

void launchRotaryEntry(Call const& c) {
    TensorArg const &q = c["q"], &k = c["k"], &positions = c["positions"], &cache = c["cos_sin_cache"];
    RotaryParams p{};
    p.q = q.data();
    p.k = k.data();
    p.positions = positions.data();
    p.cosSinCache = static_cast<float const*>(cache.data());
    p.tokens = q.size(0);
    p.qHeads = q.size(1);
    p.kHeads = k.size(1);
    p.headDim = q.size(2);
    p.rotaryDim = cache.size(1);
    p.maxPositions = cache.size(0);
    p.qTokenStride = q.stride(0);
    p.qHeadStride = q.stride(1);
    p.kTokenStride = k.stride(0);
    p.kHeadStride = k.stride(1);
    p.isNeox = c.flag("is_neox");
    p.dtype = q.dtype;
    p.positionsDtype = positions.dtype;
    if constexpr (kCudaKernels) launchRotaryEmbedding(p, c.stream());
}

// ---- silu_and_mul / gelu_and_mul ----

void checkActAndMul(Call& c) {
    TensorArg const& x = c["x"];
    if (x.size(1) % 2 != 0) throw std::invalid_argument("the last dimension of x " + x.shapeStr() + " must be even");
    c.shape("out", {x.size(0), x.size(1) / 2});
}

void checkSiluAndMulFp8(Call& c) {
    TensorArg const& x = c["x"];
    if (x.size(1) % 2 != 0) throw std::invalid_argument("the last dimension of x " + x.shapeStr() + " must be even");
    checkCodesOf(c, x.size(0), x.size(1) / 2);
}

// silu_and_mul's / gelu_and_mul's params (their *_fp8 entries' and host_silu_and_mul's too).
ActAndMulParams actAndMulParams(Call const& c, Activation act) {
    TensorArg const& x = c["x"];
    ActAndMulParams p{};
    p.x = x.data();
    p.rows = x.size(0);
    p.inter = x.size(1) / 2;
    p.xRowStride = x.stride(0);
    setOutput(c, p);
    p.act = act;
    p.dtype = x.dtype;
    return p;
}

void launchActAndMulEntry(Call const& c, Activation act) {
    ActAndMulParams const p = actAndMulParams(c, act);
    if (p.inter == 0) return;
    if constexpr (kCudaKernels) launchActAndMul(p, c.stream());
}

Activation geluApproximation(std::string const& approximate) {
    if (approximate == "none") return Activation::kGelu;
    if (approximate == "tanh") return Activation::kGeluTanh;
    throw std::invalid_argument("approximate must be 'none' or 'tanh', got '" + approximate + "'");
}

// ---- the KV cache: values, or 1-byte codes with their scales ----

// The kv_cache's dtype: the activations' (no kv_scale), or int8 / uint8 (FP8 bytes) codes with
// kv_scale, float32 [2] (the K and V scales).
DType checkKvCache(Call& c, DType activations) {
    DType const cache = c["kv_cache"].dtype;
    bool const codes = cache == DType::kInt8 || cache == DType::kUInt8;
    if (!codes && cache != activations) {
        throw std::invalid_argument(std::string("kv_cache is ") + dtypeName(cache) + "; expected "
                                    + dtypeName(activations) + ", or int8 / uint8 codes with kv_scale");
    }
    if (codes && !c.has("kv_scale")) {
        throw std::invalid_argument("a kv_cache of int8 / uint8 codes needs kv_scale (float32 [2]: K and V scales)");
    }
    if (!codes && c.has("kv_scale")) {
        throw std::invalid_argument(std::string("kv_scale is given but kv_cache holds ") + dtypeName(cache)
                                    + " values, not codes");
    }
    c.shape("kv_scale", {2});
    return cache;
}

// ---- paged_kv_write ----

void checkPagedKvWrite(Call& c) {
    TensorArg const &key = c["key"], &cache = c["kv_cache"];
    checkKvCache(c, key.dtype);
    if (cache.size(1) != 2 || cache.size(2) != key.size(1) || cache.size(4) != key.size(2)) {
        throw std::invalid_argument("kv_cache " + cache.shapeStr()
                                    + " must be [num_blocks, 2, num_kv_heads, tokens_per_block, head_dim] with key "
                                    + key.shapeStr());
    }
    if (cache.size(3) == 0) throw std::invalid_argument("kv_cache has tokens_per_block = 0");
    int64_t const batch = c["block_tables"].size(0);
    c.shape("cu_seqlens", {batch + 1});
    c.shape("past_lengths", {batch});
    c.fitsInt("tokens", key.size(0));
    c.fitsInt("batch", batch);
}

void launchPagedKvWriteEntry(Call const& c) {
    TensorArg const &key = c["key"], &value = c["value"], &cache = c["kv_cache"], &tables = c["block_tables"];
    PagedKvWriteParams p{};
    p.key = key.data();
    p.value = value.data();
    p.kvCache = cache.data();
    p.kvScale = static_cast<float const*>(c.ptr("kv_scale"));
    p.cacheDtype = cache.dtype;
    p.blockTables = static_cast<int32_t const*>(tables.data());
    p.cuSeqlens = static_cast<int32_t const*>(c["cu_seqlens"].data());
    p.pastLengths = static_cast<int32_t const*>(c["past_lengths"].data());
    p.tokens = key.size(0);
    p.batch = tables.size(0);
    p.maxBlocks = tables.size(1);
    p.numBlocks = cache.size(0);
    p.kvHeads = key.size(1);
    p.tokensPerBlock = cache.size(3);
    p.headDim = key.size(2);
    p.keyTokenStride = key.stride(0);
    p.keyHeadStride = key.stride(1);
    p.valueTokenStride = value.stride(0);
    p.valueHeadStride = value.stride(1);
    p.dtype = key.dtype;
    if (p.maxBlocks == 0 || p.numBlocks == 0 || p.headDim == 0 || p.kvHeads == 0) return;
    if constexpr (kCudaKernels) launchPagedKvWrite(p, c.stream());
}

// ---- top_k_top_p_sample, argmax_rows ----

// The rows of logits [batch, vocab] both sampling kernels take (vocab within kSamplingMaxVocab).
int64_t checkSamplingLogits(Call& c) {
    TensorArg const& logits = c["logits"];
    if (logits.size(1) < 1 || logits.size(1) > kSamplingMaxVocab) {
        throw std::invalid_argument("logits " + logits.shapeStr() + " must have 1.."
                                    + std::to_string(kSamplingMaxVocab) + " tokens per row");
    }
    c.fitsInt("batch", logits.size(0));
    return logits.size(0);
}

// Fills the logits fields that both sampling kernels' params have.
template <typename Params>
void setSamplingLogits(Params& p, TensorArg const& logits) {
    p.logits = logits.data();
    p.batch = logits.size(0);
    p.vocab = logits.size(1);
    p.logitsRowStride = logits.stride(0);
    p.dtype = logits.dtype;
}

void checkTopKTopPSample(Call& c) {
    int64_t const batch = checkSamplingLogits(c);
    for (char const* name : {"out", "temperature", "top_k", "top_p", "uniform"}) c.shape(name, {batch});
}

void launchTopKTopPSampleEntry(Call const& c) {
    TopKTopPSampleParams p{};
    p.out = static_cast<int32_t*>(c["out"].data());
    setSamplingLogits(p, c["logits"]);
    p.temperatures = static_cast<float const*>(c["temperature"].data());
    p.topKs = static_cast<int32_t const*>(c["top_k"].data());
    p.topPs = static_cast<float const*>(c["top_p"].data());
    p.uniforms = static_cast<float const*>(c["uniform"].data());
    if (p.batch == 0) return;
    if constexpr (kCudaKernels) launchTopKTopPSample(p, c.stream());
}

// ---- host_weight_only_gemv ----

// The host kernels' `threads` (host_parallel.h), refused outside [1, 1024].
int hostThreads(Call const& c) {
    int64_t const threads = c.integer("threads");
    if (threads < 1 || threads > 1024) {
        throw std::invalid_argument("threads must be in [1, 1024], got " + std::to_string(threads));
    }
    return static_cast<int>(threads);
}

int hostWeightOnlyBits(Call const& c) {
    std::string const& format = c.text("weight_format");
    if (format != "int8" && format != "int4") {
        throw std::invalid_argument("weight_format must be 'int8' or 'int4', got '" + format + "'");
    }
    return format == "int4" ? 4 : 8;
}

void checkHostWeightOnlyGemv(Call& c) {
    int const bits = hostWeightOnlyBits(c);
    TensorArg const& x = c["x"];
    TensorArg const& qweight = c["qweight"];
    int64_t const m = x.size(0), k = x.size(1), n = qweight.size(0), group = c.integer("group_size");
    if (qweight.dtype != (bits == 4 ? DType::kUInt8 : DType::kInt8)) {
        throw std::invalid_argument(std::string("qweight must be ") + (bits == 4 ? "uint8" : "int8") + " codes of "
                                    + c.text("weight_format"));
    }
    if (group < 0 || (bits == 4 && group == 0)) {
        throw std::invalid_argument("group_size must be > 0 (INT4) or >= 0 (INT8, 0: per channel), got "
                                    + std::to_string(group));
    }
    hostThreads(c);
    if (!hostWeightOnlyGemvServes(bits, k, group)) {
        throw std::invalid_argument("no kernel for in_features " + std::to_string(k) + " in groups of "
                                    + std::to_string(group)
                                    + " (groups of a multiple of 32 inputs that divide in_features)");
    }
    c.shape("qweight", {n, bits == 4 ? k / 2 : k});
    int64_t const groups = group > 0 ? k / group : 1;
    if (c["scales"].numel() != n * groups) {
        throw std::invalid_argument(c["scales"].describe() + " must hold " + std::to_string(n * groups)
                                    + " scales ([out_features, in_features / group_size])");
    }
    if (bits == 4 && !c.has("zeros")) throw std::invalid_argument("INT4 takes zeros");
    if (bits == 8 && c.has("zeros")) throw std::invalid_argument("INT8 takes no zeros");
    if (c.has("zeros")) c.shape("zeros", c["scales"].shape);
    c.shape("out", {m, n});
    c.shape("bias", {n});
}

// The host GEMVs' common operands: out [m, n] and x [m, k] (float32), qweight's n rows, bias, threads.
template <typename P>
P hostGemvParams(Call const& c) {
    P p{};
    p.out = static_cast<float*>(c["out"].data());
    p.x = static_cast<float const*>(c["x"].data());
    p.bias = static_cast<float const*>(c.ptr("bias"));
    p.m = c["x"].size(0);
    p.n = c["qweight"].size(0);
    p.k = c["x"].size(1);
    p.xRowStride = c["x"].stride(0);
    p.outRowStride = c["out"].stride(0);
    p.threads = hostThreads(c);
    return p;
}

void launchHostWeightOnlyGemvEntry(Call const& c) {
    auto p = hostGemvParams<HostWeightOnlyGemvParams>(c);
    p.qweight = c["qweight"].data();
    p.scales = static_cast<float const*>(c["scales"].data());
    p.zeros = static_cast<float const*>(c.ptr("zeros"));
    p.groupSize = c.integer("group_size");
    p.bits = hostWeightOnlyBits(c);
    if (p.m == 0 || p.n == 0) return;
    hostWeightOnlyGemv(p);
}

// ---- host_fp8_gemv ----

void checkHostFp8Gemv(Call& c) {
    int64_t const m = c["x"].size(0), k = c["x"].size(1), n = c["qweight"].size(0);
    if (!hostFp8GemvServes(k)) {
        throw std::invalid_argument("no kernel for in_features " + std::to_string(k) + " (a multiple of 8)");
    }
    c.shape("qweight", {n, k});
    int64_t const ws = c["weight_scale"].numel(), xs = c["input_scale"].numel();
    if (ws != 1 && ws != n) {
        throw std::invalid_argument(c["weight_scale"].describe() + " must hold 1 or " + std::to_string(n)
                                    + " scales (per tensor or per output channel)");
    }
    if (xs != 1 && xs != m) {
        throw std::invalid_argument(c["input_scale"].describe() + " must hold 1 or " + std::to_string(m)
                                    + " scales (static or per token)");
    }
    hostThreads(c);
    c.shape("out", {m, n});
    c.shape("bias", {n});
}

void launchHostFp8GemvEntry(Call const& c) {
    auto p = hostGemvParams<HostFp8GemvParams>(c);
    p.qweight = static_cast<uint8_t const*>(c["qweight"].data());
    p.weightScale = static_cast<float const*>(c["weight_scale"].data());
    p.inputScale = static_cast<float const*>(c["input_scale"].data());
    p.weightPerRow = c["weight_scale"].numel() != 1;
    p.inputPerRow = c["input_scale"].numel() != 1;
    if (p.m == 0 || p.n == 0) return;
    hostFp8Gemv(p);
}

void checkArgmaxRows(Call& c) {
    int64_t const batch = checkSamplingLogits(c);
    c.shape("out", {batch});
    c.shape("workspace", {argmaxRowsWorkspace(batch, c["logits"].size(1))});
    if (c.has("advance")) c.shape("advance", {batch});
    c.together("host_out", "host_slot");
    if (c.has("host_out")) {
        TensorArg const& host = c["host_out"];
        if (host.size(0) != 2 || host.size(1) < batch) {
            throw std::invalid_argument(host.describe() + " must be [2, W] with W >= the " + std::to_string(batch)
                                        + " rows");
        }
        c.shape("host_slot", {1});
    }
}

void launchArgmaxRowsEntry(Call const& c) {
    ArgmaxRowsParams p{};
    p.out = static_cast<int32_t*>(c["out"].data());
    setSamplingLogits(p, c["logits"]);
    p.workspace = static_cast<unsigned long long*>(c["workspace"].data());
    p.advance = static_cast<int32_t*>(const_cast<void*>(c.ptr("advance")));
    p.hostOut = static_cast<int32_t*>(const_cast<void*>(c.ptr("host_out")));
    p.hostStride = c.has("host_out") ? c["host_out"].stride(0) : 0;
    p.hostSlot = static_cast<int32_t*>(const_cast<void*>(c.ptr("host_slot")));
    if (p.batch == 0) return;
    if constexpr (kCudaKernels) launchArgmaxRows(p, c.stream());
}

// ---- decode_attention ----

// What decode_attention and host_decode_attention check alike: shapes, batch, head packing,
// sliding window, the step's K/V rows and the rotary table.
void checkDecodeAttentionOperands(Call& c) {
    TensorArg const &q = c["q"], &cache = c["kv_cache"], &tables = c["block_tables"];
    int64_t const batch = q.size(0), numHeads = q.size(1), headDim = q.size(2), kvHeads = cache.size(2);
    int64_t const tpb = cache.size(3);
    if (cache.size(1) != 2 || cache.size(4) != headDim || kvHeads == 0 || tpb == 0) {
        throw std::invalid_argument("kv_cache " + cache.shapeStr()
                                    + " must be [num_blocks, 2, num_kv_heads, tokens_per_block, head_dim] with q "
                                    + q.shapeStr());
    }
    if (numHeads % kvHeads != 0) {
        throw std::invalid_argument(std::to_string(numHeads) + " query heads over " + std::to_string(kvHeads)
                                    + " KV heads: the group must be a whole number");
    }
    if (tables.size(0) != batch || c["sequence_lengths"].shape != std::vector<int64_t>{batch}) {
        throw std::invalid_argument("block_tables " + tables.shapeStr() + " and sequence_lengths "
                                    + c["sequence_lengths"].shapeStr() + " must have batch " + std::to_string(batch)
                                    + " (q " + q.shapeStr() + ")");
    }
    if (c.integer("sliding_window") < 0) throw std::invalid_argument("sliding_window must be >= 0");
    c.fitsInt("sliding_window", c.integer("sliding_window"));
    if (q.stride(1) != headDim || (c.has("out") && c["out"].stride(1) != headDim)) {
        throw std::invalid_argument("heads of q and out must be packed (stride(1) == head_dim)");
    }
    c.shape("alibi_slopes", {numHeads});
    c.together("k_new", "v_new");
    if (c.has("rotary_cos_sin") && !c.has("k_new")) {
        throw std::invalid_argument("rotary_cos_sin needs k_new and v_new");
    }
    c.shape("k_new", {batch, kvHeads, headDim});
    c.shape("v_new", {batch, kvHeads, headDim});
    if (c.has("k_new") && (c["k_new"].stride(1) != headDim || c["v_new"].stride(1) != headDim)) {
        throw std::invalid_argument("heads of k_new and v_new must be packed");
    }
    if (c.has("rotary_cos_sin")) {
        TensorArg const& cosSin = c["rotary_cos_sin"];
        if (cosSin.size(1) % 2 != 0 || cosSin.size(1) == 0 || cosSin.size(1) > headDim) {
            throw std::invalid_argument("rotary_cos_sin " + cosSin.shapeStr()
                                        + " needs an even rotary_dim in (0, head_dim]");
        }
    }
    c.fitsInt("batch", batch);
}

void checkDecodeAttention(Call& c) {
    checkDecodeAttentionOperands(c);
    TensorArg const &q = c["q"], &cache = c["kv_cache"], &tables = c["block_tables"];
    int64_t const numHeads = q.size(1), headDim = q.size(2), kvHeads = cache.size(2), tpb = cache.size(3);
    if (checkKvCache(c, q.dtype) != q.dtype
        && (q.dtype == DType::kFloat32 || (headDim != 64 && headDim != 128))) {
        throw std::invalid_argument("a kv_cache of codes is read by the tensor-core kernel only: float16 / bfloat16 q "
                                    "with head_dim 64 or 128, got " + std::string(dtypeName(q.dtype)) + " q "
                                    + q.shapeStr());
    }
    if (numHeads / kvHeads > kDecodeAttentionMaxGroup) {
        throw std::invalid_argument(std::to_string(numHeads / kvHeads) + " query heads a KV head: the kernel takes <= "
                                    + std::to_string(kDecodeAttentionMaxGroup));
    }
    if ((tpb & (tpb - 1)) != 0 || tpb > (1 << 20)) {
        throw std::invalid_argument("tokens_per_block " + std::to_string(tpb) + " must be a power of two");
    }
    if (!decodeAttentionSupportsHeadDim(headDim)) {
        throw std::invalid_argument("head_dim " + std::to_string(headDim) + " is not supported (64, 128 or 256)");
    }
    // A block stages the block ids of its chunk (at most split_size positions) in shared memory.
    int64_t const numSplits = c.integer("num_splits"), splitSize = c.integer("split_size");
    if (numSplits < 1 || splitSize < 1 || splitSize / tpb + 2 > kDecodeAttentionMaxChunkBlocks) {
        throw std::invalid_argument("need num_splits >= 1 and 1 <= split_size <= "
                                    + std::to_string((kDecodeAttentionMaxChunkBlocks - 2) * tpb)
                                    + " (tokens_per_block * " + std::to_string(kDecodeAttentionMaxChunkBlocks - 2)
                                    + "), got " + std::to_string(numSplits) + " and " + std::to_string(splitSize));
    }
    c.fitsInt("num_splits", numSplits);
    if (numSplits * splitSize < tables.size(1) * tpb) {
        throw std::invalid_argument("num_splits * split_size must cover the block table ("
                                    + std::to_string(tables.size(1) * tpb) + " positions)");
    }
    c.packed16("kv_cache");  // K/V rows are read 16 bytes at a time
    if (numSplits > 1) {
        int64_t const batch = q.size(0);
        if (!c.has("workspace")) throw std::invalid_argument("num_splits > 1 needs a workspace");
        if (!c.has("split_counters")) throw std::invalid_argument("num_splits > 1 needs split_counters");
        int64_t const need = batch * numHeads * numSplits * (headDim + 2);
        if (c["workspace"].numel() < need) {
            throw std::invalid_argument("workspace " + c["workspace"].shapeStr() + " holds fewer than "
                                        + std::to_string(need) + " floats");
        }
        if (c["split_counters"].numel() < batch * kvHeads) {
            throw std::invalid_argument("split_counters " + c["split_counters"].shapeStr() + " holds fewer than "
                                        + std::to_string(batch * kvHeads) + " counters (batch * num_kv_heads)");
        }
    }
}

// decode_attention's arguments: its output (out, or decode_attention_fp8's codes), the operands,
// then `extra` and the stream.
std::vector<Arg> decodeAttentionArgs(Arg output, std::vector<Arg> extra) {
    std::vector<Arg> args{
        std::move(output),
        tensor("q").rank(3).floats().lastDimContiguous(),
        tensor("kv_cache").rank(5).dtypes({kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt8, DType::kUInt8})
            .contiguous(),
        tensor("block_tables").rank(2).dtypes({kInt32}).contiguous(),
        tensor("sequence_lengths").rank(1).dtypes({kInt32}).contiguous(),
        optionalTensor("alibi_slopes").dtypes({kFloat32}).contiguous(),
        optionalTensor("workspace").dtypes({kFloat32}).contiguous(),
        optionalTensor("split_counters").dtypes({kInt32}).contiguous().written(), integer("num_splits"),
        integer("split_size"), real("scale"), integer("sliding_window"),
        optionalTensor("k_new").dtypeOf("q").lastDimContiguous(),
        optionalTensor("v_new").dtypeOf("q").lastDimContiguous(),
        optionalTensor("rotary_cos_sin").rank(2).dtypes({kFloat32}).contiguous(), flag("is_neox"),
        optionalTensor("kv_scale").dtypes({kFloat32}).contiguous(), flag("early_cache_loads")};
    for (Arg& a : extra) args.push_back(std::move(a));
    args.push_back(stream());
    return args;
}

void checkDecodeAttentionFp8(Call& c) {
    checkDecodeAttention(c);
    TensorArg const& q = c["q"];
    checkCodesOf(c, q.size(0), q.size(1) * q.size(2));
}

// decode_attention's and host_decode_attention's params (the host entry has no splits).
DecodeAttentionParams decodeAttentionParams(Call const& c) {
    TensorArg const &q = c["q"], &cache = c["kv_cache"], &tables = c["block_tables"];
    bool const fused = c.has("k_new"), rotary = c.has("rotary_cos_sin");
    DecodeAttentionParams p{};
    p.kNew = c.ptr("k_new");
    p.vNew = c.ptr("v_new");
    p.kNewTokenStride = fused ? c["k_new"].stride(0) : 0;
    p.vNewTokenStride = fused ? c["v_new"].stride(0) : 0;
    p.cosSin = static_cast<float const*>(c.ptr("rotary_cos_sin"));
    p.maxPositions = rotary ? c["rotary_cos_sin"].size(0) : 0;
    p.rotaryDim = rotary ? static_cast<int>(c["rotary_cos_sin"].size(1)) : 0;
    p.isNeox = c.flag("is_neox");
    setOutput(c, p.out, p.outTokenStride, p.codeScale);  // decode_attention_fp8: its codes
    p.q = q.data();
    p.kvCache = cache.data();
    p.kvScale = static_cast<float const*>(c.ptr("kv_scale"));
    p.cacheDtype = cache.dtype;
    p.blockTables = static_cast<int32_t const*>(tables.data());
    p.sequenceLengths = static_cast<int32_t const*>(c["sequence_lengths"].data());
    p.alibiSlopes = static_cast<float const*>(c.ptr("alibi_slopes"));
    p.batch = q.size(0);
    p.numHeads = q.size(1);
    p.kvHeads = cache.size(2);
    p.headDim = q.size(2);
    p.tokensPerBlock = cache.size(3);
    p.maxBlocks = tables.size(1);
    p.numBlocks = cache.size(0);
    p.qTokenStride = q.stride(0);
    p.slidingWindow = static_cast<int>(c.integer("sliding_window"));
    p.scale = static_cast<float>(c.real("scale"));
    p.dtype = q.dtype;
    return p;
}

void launchDecodeAttentionEntry(Call const& c) {
    DecodeAttentionParams p = decodeAttentionParams(c);
    bool const splits = c.integer("num_splits") > 1;
    p.workspace = splits ? static_cast<float*>(c["workspace"].data()) : nullptr;
    p.splitCounters = splits ? static_cast<int*>(c["split_counters"].data()) : nullptr;
    p.numSplits = static_cast<int>(c.integer("num_splits"));
    p.splitSize = static_cast<int>(c.integer("split_size"));
    p.earlyCacheLoads = c.flag("early_cache_loads");
    if (p.batch == 0 || p.maxBlocks == 0) return;
    if constexpr (kCudaKernels) launchDecodeAttention(p, c.stream());
}

void launchHostDecodeAttentionEntry(Call const& c) {
    DecodeAttentionParams const p = decodeAttentionParams(c);
    if (p.batch == 0) return;
    hostDecodeAttention(p, hostThreads(c));
}

// ---- gemv ----

GemvPrologue gemvPrologue(Call const& c) {
    int64_t const code = c.integer("prologue");
    if (code < 0 || code > static_cast<int>(GemvPrologue::kSiluAndMul)) {
        throw std::invalid_argument("unknown prologue " + std::to_string(code));
    }
    return static_cast<GemvPrologue>(code);
}

// The RMSNorm prologue's operands for `rows` rows of in_features k (gemv).
void checkPrologueOperands(Call& c, GemvPrologue prologue, int64_t rows, int64_t k) {
    c.together("residual", "residual_out");
    if (prologue == GemvPrologue::kRmsNorm) {
        if (!c.has("norm_weight")) throw std::invalid_argument("the RMSNorm prologue needs norm_weight");
        c.shape("norm_weight", {k});
        c.packed16("norm_weight");
        c.finiteNonNegative("eps");
        for (char const* name : {"residual", "residual_out"}) {
            c.shape(name, {rows, k});
            c.packed16(name);
        }
    } else if (c.has("residual") || c.has("norm_weight")) {
        throw std::invalid_argument("residual and norm_weight belong to the RMSNorm prologue only");
    }
}

void checkGemv(Call& c) {
    GemvPrologue const prologue = gemvPrologue(c);
    TensorArg const &x = c["x"], &weight = c["weight"];
    int64_t const rows = x.size(0), n = weight.size(0), k = weight.size(1);
    bool const gated = prologue == GemvPrologue::kSiluAndMul;
    if (x.size(1) != (gated ? 2 * k : k)) {
        throw std::invalid_argument("x " + x.shapeStr() + " does not match weight [n, k] " + weight.shapeStr()
                                    + (gated ? " (x must be [rows, 2k])" : ""));
    }
    c.shape("out", {rows, n});
    if (!gemvSupports(rows, k, x.dtype)) {
        throw std::invalid_argument(std::to_string(rows) + " rows of k = " + std::to_string(k) + " "
                                    + dtypeName(x.dtype) + " are not supported (rows 1.." + std::to_string(kGemvMaxRows)
                                    + ", k a multiple of 16 bytes, rows * k in shared memory)");
    }
    c.packed16("x");
    c.packed16("weight");
    c.shape("bias", {n});
    checkPrologueOperands(c, prologue, rows, k);
}

void launchGemvEntry(Call const& c) {
    TensorArg const &x = c["x"], &weight = c["weight"];
    GemvParams p{};
    p.out = c["out"].data();
    p.x = x.data();
    p.weight = weight.data();
    p.bias = c.ptr("bias");
    p.residual = c.ptr("residual");
    p.residualOut = const_cast<void*>(c.ptr("residual_out"));
    p.normWeight = c.ptr("norm_weight");
    p.rows = x.size(0);
    p.n = weight.size(0);
    p.k = weight.size(1);
    p.xRowStride = x.stride(0);
    p.outRowStride = c["out"].stride(0);
    p.residualRowStride = c.has("residual") ? c["residual"].stride(0) : 0;
    p.eps = static_cast<float>(c.real("eps"));
    p.prologue = gemvPrologue(c);
    p.dtype = x.dtype;
    if constexpr (kCudaKernels) launchGemv(p, c.stream());
}

// ---- weight_only_gemv / weight_only_dequantize ----
// The weight as the kernels read it: qweight's bytes (formats.py's INT8 [N, K] or INT4 [N, K / 2])
// viewed as int32 words [N, K * bits / 32], rows of whole 16-byte packs; `tiled`: those packs in
// tile order (ops/quantized_linear.py's tile_codes: N a multiple of 16, a row a multiple of 4 packs).

constexpr int64_t kWeightOnlyGemvMaxK = 32768;  // a row of x as float32 (and its pack sums) in shared memory

// What the pipelined kernel's fused forms (`gated`, the RMSNorm in front) take of x: at most
// kPipelinedMaxRows rows of float16 / bfloat16 on 16-byte boundaries within kPipelinedMaxX bytes
// (weight_only_gemv.cuh's kMaxPipeX).
constexpr int64_t kPipelinedMaxRows = 8;
constexpr int64_t kPipelinedMaxX = 64 * 1024;

bool pipelinedTakesX(TensorArg const& x) {
    bool const halfX = x.dtype == DType::kFloat16 || x.dtype == DType::kBFloat16;
    return x.size(0) <= kPipelinedMaxRows && halfX && x.size(0) * x.size(1) * dtypeSize(x.dtype) <= kPipelinedMaxX
           && x.ptr % 16 == 0 && (x.stride(0) * dtypeSize(x.dtype)) % 16 == 0;
}

std::string pipelinedXLimits(TensorArg const& x) {
    return "at most " + std::to_string(kPipelinedMaxRows) + " rows of float16 / bfloat16 x on 16-byte boundaries within "
           + std::to_string(kPipelinedMaxX) + " bytes (got " + x.describe() + ")";
}

// The GEMVs' `gated` (silu_and_mul in the epilogue; weight_only_gemv.cuh's Params::gated) is the
// pipelined kernel's: pipelinedTakesX, out_features a multiple of 16, and `served`, what else that
// kernel needs (`needs` says it).
void checkGated(TensorArg const& x, int64_t n, bool served, std::string const& needs) {
    if (n % 16 == 0 && pipelinedTakesX(x) && served) return;
    throw std::invalid_argument("gated takes out_features a multiple of 16 (got " + std::to_string(n) + "), "
                                + pipelinedXLimits(x) + (needs.empty() ? "" : ", " + needs));
}

struct WeightOnlyShape {
    int bits;
    int64_t n, k, groupSize;
};

WeightOnlyShape checkWeightOnlyWeight(Call& c) {
    std::string const& format = c.text("weight_format");
    int const bits = format == "int8" ? 8 : format == "int4" ? 4 : 0;
    if (bits == 0) throw std::invalid_argument("weight_format must be 'int8' or 'int4', got '" + format + "'");
    TensorArg const& q = c["qweight"];
    int64_t const n = q.size(0), k = q.size(1) * (32 / bits), codes = 128 / bits;
    if (q.size(1) % 4 != 0 || q.ptr % 16 != 0) {
        throw std::invalid_argument(q.describe() + " must start on a 16-byte boundary with rows of whole 16-byte packs ("
                                    + std::to_string(codes) + " codes: in_features a multiple of "
                                    + std::to_string(codes) + ")");
    }
    int64_t const group = c.integer("group_size");
    if (group == 0 && bits == 8) {
        c.shape("scales", {n});
    } else {
        if (group < codes || (group & (group - 1)) != 0 || k % group != 0) {
            throw std::invalid_argument("group_size " + std::to_string(group) + " must be a power of two >= "
                                        + std::to_string(codes) + " dividing in_features " + std::to_string(k));
        }
        c.shape("scales", {n, k / group});
    }
    if (bits == 4 && !c.has("zeros")) throw std::invalid_argument("INT4 weights need zeros");
    if (bits == 8 && c.has("zeros")) throw std::invalid_argument("INT8 weights are symmetric: no zeros");
    if (bits == 4) c.shape("zeros", {n, k / group});
    if (c.flag("tiled") && (n % 16 != 0 || q.size(1) % 16 != 0)) {
        throw std::invalid_argument("tiled codes need out_features a multiple of 16 (got " + std::to_string(n)
                                    + ") and rows of a multiple of 64 bytes (got " + std::to_string(q.size(1) * 4) + ")");
    }
    c.fitsInt("in_features", k);
    c.fitsInt("out_features", n);
    return {bits, n, k, group};
}

void checkWeightOnlyGemv(Call& c) {
    WeightOnlyShape const w = checkWeightOnlyWeight(c);
    TensorArg const& x = c["x"];
    if (x.size(1) != w.k) {
        throw std::invalid_argument("x " + x.shapeStr() + " does not match in_features " + std::to_string(w.k));
    }
    if (w.k > kWeightOnlyGemvMaxK) {
        throw std::invalid_argument("in_features " + std::to_string(w.k) + " is more than the GEMV's "
                                    + std::to_string(kWeightOnlyGemvMaxK) + " (use weight_only_dequantize)");
    }
    bool const gated = c.flag("gated");
    c.shape("out", {x.size(0), gated ? w.n / 2 : w.n});
    c.shape("bias", {w.n});
    c.fitsInt("rows", x.size(0));
    // The pipelined kernel's groups: whole k-steps of 4 packs (or one scale a row).
    bool const pipelined = c["scales"].dtype == kFloat32 && (w.groupSize == 0 || w.groupSize >= 512 / w.bits);
    std::string const needs = "float32 scales and groups of at least " + std::to_string(512 / w.bits) + " inputs";
    if (gated) checkGated(x, w.n, pipelined, needs);
    // The RMSNorm in front (kernels.h's WeightOnlyNorm): the pipelined INT4 kernel's, bfloat16 x as
    // pipelinedTakesX.
    c.together("residual", "residual_out");
    if (c.has("norm_weight")) {
        c.shape("norm_weight", {w.k});
        c.packed16("norm_weight");
        c.finiteNonNegative("eps");
        for (char const* name : {"residual", "residual_out"}) {
            c.shape(name, {x.size(0), w.k});
            c.packed16(name);
        }
        if (w.bits != 4 || x.dtype != DType::kBFloat16) {
            throw std::invalid_argument("norm_weight takes INT4 weights and bfloat16 x (got " + c.text("weight_format")
                                        + ", " + x.describe() + ")");
        }
        if (!pipelinedTakesX(x) || !pipelined) {
            throw std::invalid_argument("norm_weight takes " + pipelinedXLimits(x) + ", " + needs);
        }
    } else if (c.has("residual")) {
        throw std::invalid_argument("residual belongs to the RMSNorm in front (norm_weight) only");
    }
    // Act-order: the pipelined INT4 kernel's gather of x. Its values are the caller's to check
    // (the engine loader does: engine_check.check_constant_indices); a value out of [0, K) reads
    // out of x's row.
    if (c.has("perm")) {
        c.shape("perm", {w.k});
        if (w.bits != 4 || !pipelinedTakesX(x) || !pipelined) {
            throw std::invalid_argument("perm takes INT4 weights, " + pipelinedXLimits(x) + ", " + needs + " (got "
                                        + c.text("weight_format") + ")");
        }
    }
}

void launchWeightOnlyGemvEntry(Call const& c) {
    TensorArg const &x = c["x"], &out = c["out"], &q = c["qweight"];
    int const bits = c.text("weight_format") == "int8" ? 8 : 4;
    if constexpr (kCudaKernels) {
        WeightOnlyNorm norm{};
        if (c.has("norm_weight")) {
            norm.normWeight = c.ptr("norm_weight");
            norm.residual = c.ptr("residual");
            norm.residualRowStride = c.has("residual") ? c["residual"].stride(0) : 0;
            norm.residualOut = const_cast<void*>(c.ptr("residual_out"));
            norm.eps = static_cast<float>(c.real("eps"));
        }
        launchWeightOnlyGemv(out.data(), x.data(), q.data(), c["scales"].data(), c.ptr("zeros"), c.ptr("bias"),
                             x.size(0), q.size(0), x.size(1), x.stride(0), out.stride(0), bits, c.integer("group_size"),
                             c.flag("tiled"), c.flag("gated"), c.has("norm_weight") ? &norm : nullptr,
                             static_cast<int64_t const*>(c.ptr("perm")), x.dtype, c["scales"].dtype, c.stream());
    }
}

void checkWeightOnlyDequantize(Call& c) {
    WeightOnlyShape const w = checkWeightOnlyWeight(c);
    c.shape("out", {w.n, w.k});
    if (c["out"].ptr % 16 != 0) throw std::invalid_argument(c["out"].describe() + " must start on a 16-byte boundary");
}

void launchWeightOnlyDequantizeEntry(Call const& c) {
    TensorArg const &out = c["out"], &q = c["qweight"];
    int const bits = c.text("weight_format") == "int8" ? 8 : 4;
    if constexpr (kCudaKernels) {
        launchWeightOnlyDequantize(out.data(), q.data(), c["scales"].data(), c.ptr("zeros"), out.size(0), out.size(1),
                                   bits, c.integer("group_size"), c.flag("tiled"), out.dtype, c["scales"].dtype,
                                   c.stream());
    }
}

// ---- fp8_gemv ----
// FP8 (W8A8, E4M3) with a static input scale, a few rows of x: qweight's E4M3 bytes [N, K] viewed
// as int32 words [N, K / 4], rows of whole 16-byte packs (K a multiple of 16).

constexpr int64_t kFp8GemvMaxRows = 1 << 20;

// An FP8 weight's scale: [1] (per tensor) or [n] (per output channel).
void checkWeightScale(Call const& c, int64_t n) {
    TensorArg const& ws = c["weight_scale"];
    if (ws.size(0) != 1 && ws.size(0) != n) {
        throw std::invalid_argument(ws.describe() + " must be [1] (per tensor) or [" + std::to_string(n)
                                    + "] (per output channel)");
    }
}

void checkFp8Gemv(Call& c) {
    TensorArg const &x = c["x"], &q = c["qweight"];
    int64_t const n = q.size(0), k = q.size(1) * 4;
    if (q.size(1) % 4 != 0 || q.ptr % 16 != 0) {
        throw std::invalid_argument(q.describe() + " must start on a 16-byte boundary with rows of whole 16-byte packs "
                                    "(in_features a multiple of 16)");
    }
    if (x.size(1) != k) {
        throw std::invalid_argument("x " + x.shapeStr() + " does not match in_features " + std::to_string(k));
    }
    if (x.ptr % 16 != 0 || (x.stride(0) * dtypeSize(x.dtype)) % 16 != 0) {
        throw std::invalid_argument(x.describe() + " must start on a 16-byte boundary with 16-byte aligned rows");
    }
    checkWeightScale(c, n);
    c.shape("input_scale", {1});
    bool const gated = c.flag("gated");
    c.shape("out", {x.size(0), gated ? n / 2 : n});
    c.shape("bias", {n});
    c.fitsInt("in_features", k);
    c.fitsInt("out_features", n);
    if (x.size(0) > kFp8GemvMaxRows) throw std::invalid_argument("fp8_gemv: too many rows");
    if (gated) checkGated(x, n, true, "");
}

void launchFp8GemvEntry(Call const& c) {
    TensorArg const &x = c["x"], &out = c["out"], &q = c["qweight"], &ws = c["weight_scale"];
    if constexpr (kCudaKernels) {
        launchFp8Gemv(out.data(), x.data(), q.data(), ws.data(), c["input_scale"].data(), c.ptr("bias"), x.size(0),
                      q.size(0), q.size(1) * 4, x.stride(0), out.stride(0), ws.size(0) != 1, c.flag("gated"),
                      x.dtype, c.stream());
    }
}

// ---- fp8_gemm_wgmma ----
// out [M, N] = x @ W^T from x's E4M3 codes (int32 words [M, K / 4]) and W's (qweight [N, K / 4]):
// the Hopper kernel of few rows (kernels.h).

void checkFp8GemmWgmma(Call& c) {
    TensorArg const &codes = c["codes"], &q = c["qweight"];
    int64_t const n = q.size(0), k = q.size(1) * 4;
    if (n % 64 != 0 || k % 128 != 0 || k == 0) {
        throw std::invalid_argument("fp8_gemm_wgmma: out_features must be a multiple of 64 and in_features a positive "
                                    "multiple of 128, got " + q.describe());
    }
    c.shape("codes", {codes.size(0), q.size(1)});
    if (codes.size(0) > kFp8GemmWgmmaMaxRows) {
        throw std::invalid_argument("fp8_gemm_wgmma: at most " + std::to_string(kFp8GemmWgmmaMaxRows) + " rows of x, got "
                                    + std::to_string(codes.size(0)));
    }
    if (codes.ptr % 16 != 0 || q.ptr % 16 != 0) {
        throw std::invalid_argument("fp8_gemm_wgmma: codes and qweight must start on 16-byte boundaries");
    }
    checkWeightScale(c, n);
    c.shape("input_scale", {1});
    c.shape("out", {codes.size(0), n});
    c.shape("bias", {n});
    c.fitsInt("in_features", k);
    c.fitsInt("out_features", n);
}

void launchFp8GemmWgmmaEntry(Call const& c) {
    TensorArg const &codes = c["codes"], &out = c["out"], &q = c["qweight"], &ws = c["weight_scale"];
    if constexpr (kCudaKernels) {
        launchFp8GemmWgmma(out.data(), codes.data(), q.data(), ws.data(), c["input_scale"].data(), c.ptr("bias"),
                           codes.size(0), q.size(0), q.size(1) * 4, out.stride(0), ws.size(0) != 1, out.dtype,
                           c.stream());
    }
}

// ---- fp8_quantize ----
// x's E4M3 codes (bytes [M, K] viewed as int32 words [M, K / 4]) with the static input_scale or,
// without it, one scale per row written to row_scales.

void checkFp8Quantize(Call& c) {
    TensorArg const& x = c["x"];
    c.shape("codes", {x.size(0), x.size(1) / 4});
    if (x.size(1) % 4 != 0) throw std::invalid_argument(x.describe() + ": in_features must be a multiple of 4");
    bool const dynamic = c.ptr("row_scales") != nullptr;
    if (dynamic == (c.ptr("input_scale") != nullptr)) {
        throw std::invalid_argument("fp8_quantize: give input_scale (static) or row_scales (per row), not both");
    }
    c.shape("input_scale", {1});
    c.shape("row_scales", {x.size(0)});
}

void launchFp8QuantizeEntry(Call const& c) {
    TensorArg const& x = c["x"];
    if constexpr (kCudaKernels) {
        launchFp8Quantize(c["codes"].data(), const_cast<void*>(c.ptr("row_scales")), x.data(), c.ptr("input_scale"), x.size(0),
                          x.size(1), x.stride(0), x.dtype, c.stream());
    }
}

// ---- the table ----

std::vector<Entry> entries() {
    return {
        {"rms_norm",
         "out = rmsnorm(x [+ residual]) * weight over rows of [rows, hidden]; with a residual, residual_out = "
         "x + residual.",
         {tensor("out").dtypeOf("x").shapeOf("x").lastDimContiguous().written(),
          tensor("x").rank(2).floats().lastDimContiguous(), tensor("weight").dtypeOf("x").contiguous(), real("eps"),
          stream(), optionalTensor("residual").dtypeOf("x").shapeOf("x").lastDimContiguous(),
          optionalTensor("residual_out").dtypeOf("x").shapeOf("x").lastDimContiguous().written()},
         checkRmsNorm, launchRmsNormEntry},
        {"rms_norm_fp8",
         "codes = the E4M3 bytes of rms_norm's out (rounded to x's dtype, then times input_scale's float32 "
         "reciprocal, clamp to +-448, round to nearest) as int32 words [rows, hidden / 4]: rms_norm then "
         "fp8_quantize in one pass; residual / residual_out as rms_norm's.",
         {tensor("codes").rank(2).dtypes({kInt32}).contiguous().written(),
          tensor("x").rank(2).floats().lastDimContiguous(), tensor("weight").dtypeOf("x").contiguous(),
          tensor("input_scale").rank(1).dtypes({kFloat32}).contiguous(), real("eps"), stream(),
          optionalTensor("residual").dtypeOf("x").shapeOf("x").lastDimContiguous(),
          optionalTensor("residual_out").dtypeOf("x").shapeOf("x").lastDimContiguous().written()},
         checkRmsNormFp8, launchRmsNormEntry},
        {"rotary_embedding",
         "Rotary embedding in place on q [T, Hq, D] and k [T, KV, D]. Out-of-range positions leave the token "
         "unchanged.",
         {tensor("q").rank(3).floats().lastDimContiguous().written(),
          tensor("k").rank(3).dtypeOf("q").lastDimContiguous().written(),
          tensor("positions").rank(1).dtypes({kInt32, DType::kInt64}).contiguous(),
          tensor("cos_sin_cache").rank(2).dtypes({kFloat32}).contiguous(), flag("is_neox"), stream()},
         checkRotary, launchRotaryEntry},
        {"silu_and_mul", "out = silu(x[:, :I]) * x[:, I:]",
         {tensor("out").rank(2).dtypeOf("x").lastDimContiguous().written(),
          tensor("x").rank(2).floats().lastDimContiguous(), stream()},
         checkActAndMul, [](Call const& c) { launchActAndMulEntry(c, Activation::kSilu); }},
        {"host_silu_and_mul", "silu_and_mul on the host CPU (float32, one thread): out = silu(x[:, :I]) * x[:, I:]",
         {tensor("out").rank(2).dtypeOf("x").lastDimContiguous().written(),
          tensor("x").rank(2).dtypes({kFloat32}).lastDimContiguous()},
         checkActAndMul, [](Call const& c) { hostSiluAndMul(actAndMulParams(c, Activation::kSilu)); }, /*host=*/true},
        {"silu_and_mul_fp8",
         "codes = the E4M3 bytes of silu_and_mul's out (rounded to x's dtype, then as fp8_quantize with the "
         "static input_scale) as int32 words [rows, I / 4]: silu_and_mul then fp8_quantize in one pass.",
         {tensor("codes").rank(2).dtypes({kInt32}).contiguous().written(),
          tensor("x").rank(2).floats().lastDimContiguous(),
          tensor("input_scale").rank(1).dtypes({kFloat32}).contiguous(), stream()},
         checkSiluAndMulFp8, [](Call const& c) { launchActAndMulEntry(c, Activation::kSilu); }},
        {"gelu_and_mul", "out = gelu(x[:, :I]) * x[:, I:], approximate 'none' (erf) or 'tanh'",
         {tensor("out").rank(2).dtypeOf("x").lastDimContiguous().written(),
          tensor("x").rank(2).floats().lastDimContiguous(), text("approximate"), stream()},
         [](Call& c) {
             geluApproximation(c.text("approximate"));
             checkActAndMul(c);
         },
         [](Call const& c) { launchActAndMulEntry(c, geluApproximation(c.text("approximate"))); }},
        {"paged_kv_write",
         "Scatter new K/V rows into kv_cache [num_blocks, 2, KV, tpb, D] (of key's dtype, or int8 / uint8 FP8 "
         "codes under kv_scale [2]). Invalid block ids / positions are skipped (nothing written).",
         {tensor("key").rank(3).floats().lastDimContiguous(),
          tensor("value").dtypeOf("key").shapeOf("key").lastDimContiguous(),
          tensor("kv_cache").rank(5).dtypes({kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt8, DType::kUInt8})
              .contiguous(),
          tensor("block_tables").rank(2).dtypes({kInt32}).contiguous(),
          tensor("cu_seqlens").rank(1).dtypes({kInt32}).contiguous(),
          tensor("past_lengths").rank(1).dtypes({kInt32}).contiguous(),
          optionalTensor("kv_scale").dtypes({kFloat32}).contiguous(), stream()},
         checkPagedKvWrite, launchPagedKvWriteEntry},
        {"top_k_top_p_sample",
         "out[b] = the token row b of logits [B, V] draws with uniform[b] after temperature, top-k and top-p "
         "(per-row float32/int32/float32 device tensors [B]); greedy rows take the argmax.",
         {tensor("out").dtypes({kInt32}).contiguous(), tensor("logits").rank(2).floats().lastDimContiguous(),
          tensor("temperature").dtypes({kFloat32}).contiguous(), tensor("top_k").dtypes({kInt32}).contiguous(),
          tensor("top_p").dtypes({kFloat32}).contiguous(), tensor("uniform").dtypes({kFloat32}).contiguous(),
          stream()},
         checkTopKTopPSample, launchTopKTopPSampleEntry},
        {"host_weight_only_gemv",
         "out = x @ W^T + bias on the host CPU (AVX2 + FMA; W's rows over `threads` threads), W the INT8 / INT4 weight of qweight, scales "
         "(and zeros) as formats.py lays them out (INT4: uint8 [N, K / 2]; INT8: int8 [N, K]; group_size 0: per "
         "channel); x, out float32 [M, K] / [M, N].",
         {tensor("out").rank(2).dtypes({kFloat32}).lastDimContiguous().written(),
          tensor("x").rank(2).dtypes({kFloat32}).lastDimContiguous(),
          tensor("qweight").rank(2).dtypes({DType::kInt8, DType::kUInt8}).contiguous(),
          tensor("scales").dtypes({kFloat32}).contiguous(), optionalTensor("zeros").dtypes({kFloat32}).contiguous(),
          optionalTensor("bias").rank(1).dtypes({kFloat32}).contiguous(), text("weight_format"),
          integer("group_size"), integer("threads")},
         checkHostWeightOnlyGemv, launchHostWeightOnlyGemvEntry, /*host=*/true},
        {"host_fp8_gemv",
         "out = (x @ W^T) * input_scale * weight_scale + bias on the host CPU (AVX2 + FMA; W's rows over `threads` "
         "threads): x float32 [M, K] holding the activation's E4M3 values, qweight uint8 [N, K] E4M3 bytes, "
         "weight_scale float32 [1] or [N], input_scale float32 [1] or [M] (per token), out float32 [M, N].",
         {tensor("out").rank(2).dtypes({kFloat32}).lastDimContiguous().written(),
          tensor("x").rank(2).dtypes({kFloat32}).lastDimContiguous(),
          tensor("qweight").rank(2).dtypes({DType::kUInt8}).contiguous(),
          tensor("weight_scale").dtypes({kFloat32}).contiguous(), tensor("input_scale").dtypes({kFloat32}).contiguous(),
          optionalTensor("bias").rank(1).dtypes({kFloat32}).contiguous(), integer("threads")},
         checkHostFp8Gemv, launchHostFp8GemvEntry, /*host=*/true},
        {"host_rms_norm",
         "rms_norm on the host CPU (float32, one thread): out = rmsnorm(x [+ residual]) * weight over rows of [rows, "
         "hidden]; with a residual, residual_out = x + residual.",
         {tensor("out").dtypeOf("x").shapeOf("x").lastDimContiguous().written(),
          tensor("x").rank(2).dtypes({kFloat32}).lastDimContiguous(), tensor("weight").dtypeOf("x").contiguous(),
          real("eps"), optionalTensor("residual").dtypeOf("x").shapeOf("x").lastDimContiguous(),
          optionalTensor("residual_out").dtypeOf("x").shapeOf("x").lastDimContiguous().written()},
         checkRmsNorm, [](Call const& c) { hostRmsNorm(rmsNormParams(c)); }, /*host=*/true},
        {"host_decode_attention",
         "decode_attention on the host CPU (float32 q and cache; chunks of 64 positions over `threads` threads, "
         "the same bits for any count): one query token per sequence (q [B, H, D]) over its paged K/V cache; "
         "with k_new/v_new the step's rows are rotated (with rotary_cos_sin) and written into the cache first. "
         "Lengths and block ids outside the cache are refused.",
         {tensor("out").dtypeOf("q").shapeOf("q").lastDimContiguous().written(),
          tensor("q").rank(3).dtypes({kFloat32}).lastDimContiguous(),
          tensor("kv_cache").rank(5).dtypes({kFloat32}).contiguous().written(),
          tensor("block_tables").rank(2).dtypes({kInt32}).contiguous(),
          tensor("sequence_lengths").rank(1).dtypes({kInt32}).contiguous(),
          optionalTensor("alibi_slopes").dtypes({kFloat32}).contiguous(), real("scale"), integer("sliding_window"),
          optionalTensor("k_new").dtypeOf("q").lastDimContiguous(),
          optionalTensor("v_new").dtypeOf("q").lastDimContiguous(),
          optionalTensor("rotary_cos_sin").rank(2).dtypes({kFloat32}).contiguous(), flag("is_neox"),
          integer("threads")},
         [](Call& c) {
             checkDecodeAttentionOperands(c);
             hostThreads(c);
         },
         launchHostDecodeAttentionEntry, /*host=*/true},
        {"argmax_rows",
         "out[b] = the index of row b's first largest logit (logits [B, V]; NaN counts as the largest, as in "
         "torch.argmax): greedy decoding's token. workspace: int64 [B * ceil(V / 4096)], the rows' chunk maxima. "
         "advance (optional, int32 [B]): each entry + 1 by the same launch (a greedy step's sequence lengths). "
         "host_out (optional, int32 [2, W >= B], page-locked host memory) with host_slot (int32 [1]): out also "
         "written to host_out[host_slot % 2], and host_slot + 1 (successive launches alternate between the rows).",
         {tensor("out").dtypes({kInt32}).contiguous(), tensor("logits").rank(2).floats().lastDimContiguous(),
          tensor("workspace").dtypes({DType::kInt64}).contiguous().written(),
          optionalTensor("advance").dtypes({kInt32}).contiguous().written(), stream(),
          optionalTensor("host_out").dtypes({kInt32}).rank(2).lastDimContiguous().written().pinnedHost(),
          optionalTensor("host_slot").dtypes({kInt32}).contiguous().written()},
         checkArgmaxRows, launchArgmaxRowsEntry},
        {"decode_attention",
         "Attention of one query token per sequence (q [B, H, D]) over its paged K/V cache (q's dtype, or int8 / "
         "uint8 FP8 codes under kv_scale [2]); with k_new/v_new the step's rows are rotated (with rotary_cos_sin) "
         "and written into the cache by the same launch; early_cache_loads: the caller promises that every cached "
         "position before each query was written before this launch's stream work began (one decode step a CUDA "
         "graph), so the kernel may read them before the previous kernel ends.",
         decodeAttentionArgs(tensor("out").dtypeOf("q").shapeOf("q").lastDimContiguous().written(), {}),
         checkDecodeAttention, launchDecodeAttentionEntry},
        {"decode_attention_fp8",
         "codes = the E4M3 bytes of decode_attention's out (rounded to q's dtype, then times input_scale's float32 "
         "reciprocal, clamp to +-448, round to nearest) as int32 words [B, H * D / 4]: decode_attention then "
         "fp8_quantize in one launch, for the FP8 linear that reads the attention.",
         decodeAttentionArgs(tensor("codes").rank(2).dtypes({kInt32}).contiguous().written(),
                             {tensor("input_scale").rank(1).dtypes({kFloat32}).contiguous()}),
         checkDecodeAttentionFp8, launchDecodeAttentionEntry},
        {"gemv",
         "out = a @ weight.T (+ bias) for 1..4 rows, a computed from x by the prologue: 0 none, 1 RMSNorm "
         "(of x + residual, written to residual_out, when given), 2 SiLU-and-mul (x [rows, 2k]).",
         {tensor("out").rank(2).dtypeOf("x").lastDimContiguous().written(),
          tensor("x").rank(2).floats().lastDimContiguous(), tensor("weight").rank(2).dtypeOf("x").contiguous(),
          optionalTensor("bias").dtypeOf("x").contiguous(), integer("prologue"),
          optionalTensor("residual").dtypeOf("x").lastDimContiguous(),
          optionalTensor("residual_out").dtypeOf("x").contiguous().written(),
          optionalTensor("norm_weight").dtypeOf("x").contiguous(), real("eps"), stream()},
         checkGemv, launchGemvEntry},
        {"weight_only_gemv",
         "out = x @ W.T (+ bias) for a few rows of x, W the INT8 / INT4 weight of qweight (its bytes as int32 words), "
         "scales (and zeros): weight_format 'int8' (group_size 0: per channel) or 'int4'; tiled: the codes in tile "
         "order (tile_codes); gated (at most 8 rows, N a multiple of 16): out [M, N / 2] = silu(y[:, :N / 2]) * "
         "y[:, N / 2:] of that y rounded to x's dtype, as act_and_mul computes it; norm_weight (INT4, bfloat16 x, "
         "at most 8 rows): x becomes rms_norm(x (+ residual, written to residual_out), norm_weight, eps), as "
         "out = rsqrt(mean(s^2) + eps) * (s * norm_weight) @ W.T (+ bias); perm (INT4 act-order, int64 [K], "
         "values in [0, K), at most 8 rows): W's input j is x's input perm[j] (x[:, perm] @ W.T), gathered as x "
         "is staged.",
         {tensor("out").rank(2).dtypeOf("x").lastDimContiguous().written(),
          tensor("x").rank(2).floats().lastDimContiguous(),
          tensor("qweight").rank(2).dtypes({kInt32}).contiguous(), tensor("scales").floats().contiguous(),
          optionalTensor("zeros").dtypeOf("scales").contiguous(), optionalTensor("bias").dtypeOf("x").contiguous(),
          text("weight_format"), integer("group_size"), flag("tiled"), flag("gated"), real("eps"),
          optionalTensor("norm_weight").dtypeOf("x").contiguous(),
          optionalTensor("residual").dtypeOf("x").lastDimContiguous(),
          optionalTensor("residual_out").dtypeOf("x").contiguous().written(),
          optionalTensor("perm").rank(1).dtypes({DType::kInt64}).contiguous(), stream()},
         checkWeightOnlyGemv, launchWeightOnlyGemvEntry},
        {"weight_only_dequantize",
         "out [N, K] = the INT8 / INT4 weight of qweight (its bytes as int32 words), scales (and zeros) in out's "
         "dtype: W = code * scale (+ zero) in float32, rounded once; tiled: the codes in tile order (tile_codes).",
         {tensor("out").rank(2).floats().contiguous().written(), tensor("qweight").rank(2).dtypes({kInt32}).contiguous(),
          tensor("scales").floats().contiguous(), optionalTensor("zeros").dtypeOf("scales").contiguous(),
          text("weight_format"), integer("group_size"), flag("tiled"), stream()},
         checkWeightOnlyDequantize, launchWeightOnlyDequantizeEntry},
        {"fp8_gemv",
         "out = x @ W.T (+ bias) for a few rows of float16 / bfloat16 x, W the FP8 E4M3 weight of qweight (its bytes "
         "as int32 words [N, K / 4]) times weight_scale (float32 [1] or [N]), x quantized to E4M3 in the kernel "
         "with the static input_scale (float32 [1]) as formats.quantize_fp8_activation does; gated (at most 8 rows, "
         "N a multiple of 16): out [M, N / 2] = silu(y[:, :N / 2]) * y[:, N / 2:] of that y rounded to x's dtype, "
         "as act_and_mul computes it.",
         {tensor("out").rank(2).dtypeOf("x").lastDimContiguous().written(),
          tensor("x").rank(2).dtypes({DType::kFloat16, DType::kBFloat16}).lastDimContiguous(),
          tensor("qweight").rank(2).dtypes({kInt32}).contiguous(),
          tensor("weight_scale").rank(1).dtypes({kFloat32}).contiguous(),
          tensor("input_scale").rank(1).dtypes({kFloat32}).contiguous(),
          optionalTensor("bias").dtypeOf("x").contiguous(), flag("gated"), stream()},
         checkFp8Gemv, launchFp8GemvEntry},
        {"fp8_gemm_wgmma",
         "out [M, N] = (x @ W.T) * input_scale * weight_scale (+ bias) for at most 32 rows, x given as its E4M3 "
         "codes (int32 words [M, K / 4]), W as qweight (its E4M3 bytes as int32 words [N, K / 4]), weight_scale "
         "float32 [1] or [N], input_scale float32 [1]; N a multiple of 64, K of 128; Hopper only (TMA and wgmma: "
         "fp8_gemm_wgmma_compiled, compute capability 9.0).",
         {tensor("out").rank(2).dtypes({DType::kFloat16, DType::kBFloat16}).lastDimContiguous().written(),
          tensor("codes").rank(2).dtypes({kInt32}).contiguous(),
          tensor("qweight").rank(2).dtypes({kInt32}).contiguous(),
          tensor("weight_scale").rank(1).dtypes({kFloat32}).contiguous(),
          tensor("input_scale").rank(1).dtypes({kFloat32}).contiguous(),
          optionalTensor("bias").dtypeOf("out").contiguous(), stream()},
         checkFp8GemmWgmma, launchFp8GemmWgmmaEntry},
        {"fp8_quantize",
         "codes = the E4M3 bytes of x / scale (float32 division, clamp to +-448, round to nearest) as int32 words "
         "[M, K / 4], scale the static input_scale (float32 [1]) or, with row_scales (float32 [M], written), "
         "amax(|x|) / 448 of each row (1 for an all-zero row): formats.quantize_fp8_activation.",
         {tensor("codes").rank(2).dtypes({kInt32}).contiguous().written(), tensor("x").rank(2).floats().lastDimContiguous(),
          optionalTensor("input_scale").rank(1).dtypes({kFloat32}).contiguous(),
          optionalTensor("row_scales").rank(1).dtypes({kFloat32}).contiguous().written(), stream()},
         checkFp8Quantize, launchFp8QuantizeEntry},
    };
}

py::dict buildInfoDict() {
    BuildInfo const& b = buildInfo();
    py::dict info;
    info["version"] = b.version;
    info["git_commit"] = b.gitCommit;
    info["build_type"] = b.buildType;
    info["cxx_compiler"] = b.cxxCompiler;
    info["cuda"] = cudaKernelsCompiled();
    info["cuda_version"] = cudaKernelsCompiled() ? py::object(py::str(b.cudaVersion)) : py::object(py::none());
    py::list archs;
    if (cudaKernelsCompiled()) {
        std::string const list = b.cudaArchitectures;  // "sm_80;sm_90"
        size_t start = 0;
        while (start < list.size()) {
            size_t end = list.find(';', start);
            if (end == std::string::npos) end = list.size();
            if (end > start) archs.append(list.substr(start, end - start));
            start = end + 1;
        }
    }
    info["cuda_architectures"] = archs;
    info["pybind11_version"] = b.pybind11Version;
    return info;
}

} // namespace

PYBIND11_MODULE(bindings, m) {
    m.doc() = "tensorrt_llm compiled kernels (C++/CUDA, no libtorch). Use them through tensorrt_llm.kernels.";

    py::dict dtypes;
    for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt32, DType::kInt64, DType::kInt8,
                    DType::kUInt8}) {
        dtypes[dtypeName(d)] = static_cast<int>(d);
    }
    m.attr("DTYPES") = dtypes;
    m.attr("__version__") = buildInfo().version;
    m.attr("cuda_kernels_compiled") = cudaKernelsCompiled();
    m.attr("fp8_gemm_wgmma_compiled") = fp8GemmWgmmaCompiled();  // a CUDA build targeting sm_90
    m.attr("FP8_GEMM_WGMMA_MAX_ROWS") = kFp8GemmWgmmaMaxRows;
    m.attr("DECODE_ATTENTION_MAX_CHUNK_BLOCKS") = kDecodeAttentionMaxChunkBlocks;
    m.attr("ARGMAX_CHUNK") = kArgmaxChunk;  // argmax_rows: logits a block reduces, one workspace entry each
    m.def("host_fp8_gemv_available", &hostFp8GemvAvailable, "Whether this CPU runs host_fp8_gemv (AVX2 and FMA).");
    m.def("host_fp8_gemv_serves", &hostFp8GemvServes, py::arg("k"),
          "Whether host_fp8_gemv takes in_features k (a multiple of 8).");
    m.def("host_weight_only_gemv_available", &hostWeightOnlyGemvAvailable,
          "Whether this CPU runs host_weight_only_gemv (AVX2 and FMA).");
    m.def("host_weight_only_gemv_vnni", &hostWeightOnlyGemvVnni,
          "Whether host_weight_only_gemv has AVX-512 VNNI's int8 dot products here (two blocks of W a step).");
    m.def(
        "host_weight_only_gemv_serves",
        [](int bits, int64_t k, int64_t groupSize) { return hostWeightOnlyGemvServes(bits, k, groupSize); },
        py::arg("bits"), py::arg("k"), py::arg("group_size"),
        "Whether host_weight_only_gemv takes in_features k in groups of group_size (0: per channel, INT8).");

    m.def("build_info", &buildInfoDict,
          "Package version, git commit, CUDA version and compiled GPU architectures (empty for a CPU-only build).");
    m.def(
        "gemv_supports",
        [](int64_t rows, int64_t k, int dtype) { return gemvSupports(rows, k, static_cast<DType>(dtype)); },
        py::arg("rows"), py::arg("k"), py::arg("dtype"),
        "Whether gemv serves `rows` rows of k elements of this dtype code.");

    for (Entry& entry : entries()) define(m, std::move(entry));
    defineHostCalls(m);
}
