// The pybind11 module tensorrt_llm.bindings.
//
// Each kernel function checks its arguments here (shapes, dtypes, strides, devices) and raises
// ValueError / TypeError naming the tensors before anything reaches the GPU; the launchers
// in cpp/kernels/ can then rely on the shapes. The module never links libtorch: tensors come
// in as (data_ptr, dtype_code, shape, strides, device) tuples, the stream as an int.
#include "build_info.h"
#include "tensor_arg.h"
#include "tensorrt_llm/kernels.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <limits>
#include <string>

namespace py = pybind11;
using namespace tensorrt_llm;

namespace {

constexpr std::initializer_list<DType> kFloatTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// Runs fn, prefixing the messages of argument errors with the op name ("rms_norm: ...").
template <typename Fn>
void withOpName(char const* op, Fn&& fn) {
    auto prefixed = [op](char const* what) {
        std::string msg = what;
        std::string const prefix = std::string(op) + ": ";
        return msg.rfind(prefix, 0) == 0 ? msg : prefix + msg;
    };
    try {
        fn();
    } catch (py::type_error const& e) {
        throw py::type_error(prefixed(e.what()));
    } catch (std::invalid_argument const& e) {
        throw std::invalid_argument(prefixed(e.what()));
    } catch (std::runtime_error const& e) {
        throw std::runtime_error(prefixed(e.what()));
    }
}

void checkFitsInt(char const* op, char const* what, int64_t v) {
    if (v > std::numeric_limits<int32_t>::max()) {
        throw std::invalid_argument(std::string(op) + ": " + what + " = " + std::to_string(v) + " is too large");
    }
}

// The tensor starts on a 16-byte boundary and its rows are whole 16-byte packs (kernels that
// load 16 bytes at a time).
void checkPacked16(char const* op, TensorArg const& t) {
    int64_t const perPack = 16 / dtypeSize(t.dtype);
    bool ok = t.ptr % 16 == 0;
    for (int d = 0; d + 1 < t.dim(); ++d) ok = ok && t.stride(d) % perPack == 0;
    if (!ok) {
        throw std::invalid_argument(std::string(op) + ": " + t.describe()
                                    + " must start on a 16-byte boundary with row strides of whole 16-byte packs");
    }
}

void rmsNorm(py::handle outObj, py::handle xObj, py::handle weightObj, double eps, uintptr_t stream,
             py::handle residualObj, py::handle residualOutObj) {
    char const* op = "rms_norm";
    TensorArg out = toTensorArg(outObj, "out");
    TensorArg x = toTensorArg(xObj, "x");
    TensorArg weight = toTensorArg(weightObj, "weight");
    bool const hasResidual = !residualObj.is_none();
    if (hasResidual != !residualOutObj.is_none()) {
        throw std::invalid_argument("rms_norm: residual and residual_out must be given together");
    }
    checkDim(x, 2);
    checkDtype(x, kFloatTypes);
    checkSameDtype(x, weight);
    checkSameDtype(x, out);
    checkShape(weight, {x.size(1)});
    checkSameShape(x, out);
    if (x.size(1) == 0) throw std::invalid_argument("rms_norm: x has an empty last dimension");
    if (!(eps >= 0.0) || !std::isfinite(eps)) {
        throw std::invalid_argument("rms_norm: eps must be finite and >= 0, got " + std::to_string(eps));
    }
    checkLastDimContiguous(x);
    checkContiguous(weight);
    checkLastDimContiguous(out);
    checkNonOverlapping(out);
    checkFitsInt(op, "rows", x.size(0));
    std::vector<TensorArg const*> all = {&out, &x, &weight};
    TensorArg residual, residualOut;
    if (hasResidual) {
        residual = toTensorArg(residualObj, "residual");
        residualOut = toTensorArg(residualOutObj, "residual_out");
        checkSameDtype(x, residual);
        checkSameDtype(x, residualOut);
        checkSameShape(x, residual);
        checkSameShape(x, residualOut);
        checkLastDimContiguous(residual);
        checkLastDimContiguous(residualOut);
        checkNonOverlapping(residualOut);
        all.push_back(&residual);
        all.push_back(&residualOut);
    }
    int const device = checkSameCudaDevice(op, all);
    DeviceScope scope(device, all, stream);

    RmsNormParams p{};
    p.out = out.data();
    p.x = x.data();
    p.weight = weight.data();
    p.residual = hasResidual ? residual.data() : nullptr;
    p.residualOut = hasResidual ? residualOut.data() : nullptr;
    p.rows = x.size(0);
    p.hidden = x.size(1);
    p.xRowStride = x.stride(0);
    p.outRowStride = out.stride(0);
    p.residualRowStride = hasResidual ? residual.stride(0) : 0;
    p.residualOutRowStride = hasResidual ? residualOut.stride(0) : 0;
    p.eps = static_cast<float>(eps);
    p.dtype = x.dtype;
    py::gil_scoped_release release;
    launchRmsNorm(p, reinterpret_cast<void*>(stream));
}

void rotaryEmbedding(py::handle qObj, py::handle kObj, py::handle positionsObj, py::handle cacheObj, bool isNeox,
                     uintptr_t stream) {
    char const* op = "rotary_embedding";
    TensorArg q = toTensorArg(qObj, "q");
    TensorArg k = toTensorArg(kObj, "k");
    TensorArg positions = toTensorArg(positionsObj, "positions");
    TensorArg cache = toTensorArg(cacheObj, "cos_sin_cache");
    checkDim(q, 3);
    checkDim(k, 3);
    checkDim(positions, 1);
    checkDim(cache, 2);
    checkDtype(q, kFloatTypes);
    checkSameDtype(q, k);
    checkDtype(positions, {DType::kInt32, DType::kInt64});
    checkDtype(cache, {DType::kFloat32});
    if (k.size(0) != q.size(0) || positions.size(0) != q.size(0)) {
        throw std::invalid_argument("rotary_embedding: token counts differ: q " + q.shapeStr() + ", k " + k.shapeStr()
                                    + ", positions " + positions.shapeStr());
    }
    if (k.size(2) != q.size(2)) {
        throw std::invalid_argument("rotary_embedding: head sizes differ: q " + q.shapeStr() + ", k " + k.shapeStr());
    }
    int64_t const headDim = q.size(2);
    int64_t const rotaryDim = cache.size(1);
    if (rotaryDim % 2 != 0 || rotaryDim > headDim) {
        throw std::invalid_argument("rotary_embedding: cos_sin_cache " + cache.shapeStr()
                                    + " needs an even rotary_dim <= head_dim " + std::to_string(headDim));
    }
    checkLastDimContiguous(q);
    checkLastDimContiguous(k);
    checkNonOverlapping(q);
    checkNonOverlapping(k);
    checkContiguous(positions);
    checkContiguous(cache);
    checkFitsInt(op, "tokens", q.size(0));
    checkFitsInt(op, "heads * rotary_dim", (q.size(1) + k.size(1)) * rotaryDim);
    std::vector<TensorArg const*> all = {&q, &k, &positions, &cache};
    int const device = checkSameCudaDevice(op, all);
    DeviceScope scope(device, all, stream);

    RotaryParams p{};
    p.q = q.data();
    p.k = k.data();
    p.positions = positions.data();
    p.cosSinCache = static_cast<float const*>(cache.data());
    p.tokens = q.size(0);
    p.qHeads = q.size(1);
    p.kHeads = k.size(1);
    p.headDim = headDim;
    p.rotaryDim = rotaryDim;
    p.maxPositions = cache.size(0);
    p.qTokenStride = q.stride(0);
    p.qHeadStride = q.stride(1);
    p.kTokenStride = k.stride(0);
    p.kHeadStride = k.stride(1);
    p.isNeox = isNeox;
    p.dtype = q.dtype;
    p.positionsDtype = positions.dtype;
    py::gil_scoped_release release;
    launchRotaryEmbedding(p, reinterpret_cast<void*>(stream));
}

void actAndMul(char const* op, Activation act, py::handle outObj, py::handle xObj, uintptr_t stream) {
    TensorArg out = toTensorArg(outObj, "out");
    TensorArg x = toTensorArg(xObj, "x");
    checkDim(x, 2);
    checkDim(out, 2);
    checkDtype(x, kFloatTypes);
    checkSameDtype(x, out);
    if (x.size(1) % 2 != 0) {
        throw std::invalid_argument(std::string(op) + ": the last dimension of x " + x.shapeStr() + " must be even");
    }
    checkShape(out, {x.size(0), x.size(1) / 2});
    checkLastDimContiguous(x);
    checkLastDimContiguous(out);
    checkNonOverlapping(out);
    std::vector<TensorArg const*> all = {&out, &x};
    int const device = checkSameCudaDevice(op, all);
    DeviceScope scope(device, all, stream);

    ActAndMulParams p{};
    p.out = out.data();
    p.x = x.data();
    p.rows = x.size(0);
    p.inter = x.size(1) / 2;
    p.xRowStride = x.stride(0);
    p.outRowStride = out.stride(0);
    p.act = act;
    p.dtype = x.dtype;
    if (p.inter == 0) return;
    py::gil_scoped_release release;
    launchActAndMul(p, reinterpret_cast<void*>(stream));
}

void pagedKvWrite(py::handle keyObj, py::handle valueObj, py::handle cacheObj, py::handle blockTablesObj,
                  py::handle cuSeqlensObj, py::handle pastLengthsObj, uintptr_t stream) {
    char const* op = "paged_kv_write";
    TensorArg key = toTensorArg(keyObj, "key");
    TensorArg value = toTensorArg(valueObj, "value");
    TensorArg cache = toTensorArg(cacheObj, "kv_cache");
    TensorArg blockTables = toTensorArg(blockTablesObj, "block_tables");
    TensorArg cuSeqlens = toTensorArg(cuSeqlensObj, "cu_seqlens");
    TensorArg pastLengths = toTensorArg(pastLengthsObj, "past_lengths");
    checkDim(key, 3);
    checkDim(cache, 5);
    checkDim(blockTables, 2);
    checkDim(cuSeqlens, 1);
    checkDim(pastLengths, 1);
    checkDtype(key, kFloatTypes);
    checkSameDtype(key, value);
    checkSameDtype(key, cache);
    checkDtype(blockTables, {DType::kInt32});
    checkDtype(cuSeqlens, {DType::kInt32});
    checkDtype(pastLengths, {DType::kInt32});
    checkSameShape(key, value);
    int64_t const kvHeads = key.size(1);
    int64_t const headDim = key.size(2);
    if (cache.size(1) != 2 || cache.size(2) != kvHeads || cache.size(4) != headDim) {
        throw std::invalid_argument("paged_kv_write: kv_cache " + cache.shapeStr()
                                    + " must be [num_blocks, 2, num_kv_heads, tokens_per_block, head_dim] with key "
                                    + key.shapeStr());
    }
    if (cache.size(3) == 0) throw std::invalid_argument("paged_kv_write: kv_cache has tokens_per_block = 0");
    int64_t const batch = blockTables.size(0);
    checkShape(cuSeqlens, {batch + 1});
    checkShape(pastLengths, {batch});
    checkLastDimContiguous(key);
    checkLastDimContiguous(value);
    checkContiguous(cache);
    checkContiguous(blockTables);
    checkContiguous(cuSeqlens);
    checkContiguous(pastLengths);
    checkFitsInt(op, "tokens", key.size(0));
    checkFitsInt(op, "batch", batch);
    std::vector<TensorArg const*> all = {&key, &value, &cache, &blockTables, &cuSeqlens, &pastLengths};
    int const device = checkSameCudaDevice(op, all);
    DeviceScope scope(device, all, stream);

    PagedKvWriteParams p{};
    p.key = key.data();
    p.value = value.data();
    p.kvCache = cache.data();
    p.blockTables = static_cast<int32_t const*>(blockTables.data());
    p.cuSeqlens = static_cast<int32_t const*>(cuSeqlens.data());
    p.pastLengths = static_cast<int32_t const*>(pastLengths.data());
    p.tokens = key.size(0);
    p.batch = batch;
    p.maxBlocks = blockTables.size(1);
    p.numBlocks = cache.size(0);
    p.kvHeads = kvHeads;
    p.tokensPerBlock = cache.size(3);
    p.headDim = headDim;
    p.keyTokenStride = key.stride(0);
    p.keyHeadStride = key.stride(1);
    p.valueTokenStride = value.stride(0);
    p.valueHeadStride = value.stride(1);
    p.dtype = key.dtype;
    if (p.maxBlocks == 0 || p.numBlocks == 0 || headDim == 0 || kvHeads == 0) return;
    py::gil_scoped_release release;
    launchPagedKvWrite(p, reinterpret_cast<void*>(stream));
}

// ---- top_k_top_p_sample ----
void topKTopPSample(py::handle outObj, py::handle logitsObj, py::handle temperatureObj, py::handle topKObj,
                    py::handle topPObj, py::handle uniformObj, uintptr_t stream) {
    char const* op = "top_k_top_p_sample";
    TensorArg out = toTensorArg(outObj, "out");
    TensorArg logits = toTensorArg(logitsObj, "logits");
    TensorArg temperature = toTensorArg(temperatureObj, "temperature");
    TensorArg topK = toTensorArg(topKObj, "top_k");
    TensorArg topP = toTensorArg(topPObj, "top_p");
    TensorArg uniform = toTensorArg(uniformObj, "uniform");
    checkDim(logits, 2);
    checkDtype(logits, kFloatTypes);
    int64_t const batch = logits.size(0);
    int64_t const vocab = logits.size(1);
    if (vocab < 1 || vocab > kSamplingMaxVocab) {
        throw std::invalid_argument("top_k_top_p_sample: logits " + logits.shapeStr() + " must have 1.."
                                    + std::to_string(kSamplingMaxVocab) + " tokens per row");
    }
    checkLastDimContiguous(logits);
    checkFitsInt(op, "batch", batch);
    checkDtype(out, {DType::kInt32});
    checkDtype(temperature, {DType::kFloat32});
    checkDtype(topK, {DType::kInt32});
    checkDtype(topP, {DType::kFloat32});
    checkDtype(uniform, {DType::kFloat32});
    for (TensorArg const* t : {&out, &temperature, &topK, &topP, &uniform}) {
        checkShape(*t, {batch});
        checkContiguous(*t);
    }
    std::vector<TensorArg const*> all = {&out, &logits, &temperature, &topK, &topP, &uniform};
    int const device = checkSameCudaDevice(op, all);
    DeviceScope scope(device, all, stream);

    TopKTopPSampleParams p{};
    p.out = static_cast<int32_t*>(out.data());
    p.logits = logits.data();
    p.temperatures = static_cast<float const*>(temperature.data());
    p.topKs = static_cast<int32_t const*>(topK.data());
    p.topPs = static_cast<float const*>(topP.data());
    p.uniforms = static_cast<float const*>(uniform.data());
    p.batch = batch;
    p.vocab = vocab;
    p.logitsRowStride = logits.stride(0);
    p.dtype = logits.dtype;
    if (batch == 0) return;
    py::gil_scoped_release release;
    launchTopKTopPSample(p, reinterpret_cast<void*>(stream));
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

void decodeAttention(py::handle outObj, py::handle qObj, py::handle cacheObj, py::handle blockTablesObj,
                     py::handle seqLensObj, py::handle alibiObj, py::handle workspaceObj, py::handle countersObj,
                     int numSplits,
                     int splitSize, double scale, int slidingWindow, py::handle kNewObj, py::handle vNewObj,
                     py::handle cosSinObj, bool isNeox, uintptr_t stream) {
    char const* op = "decode_attention";
    TensorArg out = toTensorArg(outObj, "out");
    TensorArg q = toTensorArg(qObj, "q");
    TensorArg cache = toTensorArg(cacheObj, "kv_cache");
    TensorArg blockTables = toTensorArg(blockTablesObj, "block_tables");
    TensorArg seqLens = toTensorArg(seqLensObj, "sequence_lengths");
    checkDim(q, 3);
    checkDim(cache, 5);
    checkDim(blockTables, 2);
    checkDim(seqLens, 1);
    checkDtype(q, kFloatTypes);
    checkSameDtype(q, out);
    checkSameDtype(q, cache);
    checkSameShape(q, out);
    checkDtype(blockTables, {DType::kInt32});
    checkDtype(seqLens, {DType::kInt32});
    int64_t const batch = q.size(0);
    int64_t const numHeads = q.size(1);
    int64_t const headDim = q.size(2);
    int64_t const kvHeads = cache.size(2);
    if (cache.size(1) != 2 || cache.size(4) != headDim || kvHeads == 0 || cache.size(3) == 0) {
        throw std::invalid_argument("decode_attention: kv_cache " + cache.shapeStr()
                                    + " must be [num_blocks, 2, num_kv_heads, tokens_per_block, head_dim] with q "
                                    + q.shapeStr());
    }
    if (numHeads % kvHeads != 0 || numHeads / kvHeads > kDecodeAttentionMaxGroup) {
        throw std::invalid_argument("decode_attention: " + std::to_string(numHeads) + " query heads over "
                                    + std::to_string(kvHeads) + " KV heads: the group must be a whole number <= "
                                    + std::to_string(kDecodeAttentionMaxGroup));
    }
    if ((cache.size(3) & (cache.size(3) - 1)) != 0 || cache.size(3) > (1 << 20)) {
        throw std::invalid_argument("decode_attention: tokens_per_block " + std::to_string(cache.size(3))
                                    + " must be a power of two");
    }
    if (!decodeAttentionSupportsHeadDim(headDim)) {
        throw std::invalid_argument("decode_attention: head_dim " + std::to_string(headDim)
                                    + " is not supported (64, 128 or 256)");
    }
    checkShape(blockTables, {batch, blockTables.size(1)});
    checkShape(seqLens, {batch});
    // A block stages the block ids of its chunk (at most split_size positions) in shared memory.
    if (numSplits < 1 || splitSize < 1 || splitSize / cache.size(3) + 2 > kDecodeAttentionMaxChunkBlocks) {
        throw std::invalid_argument("decode_attention: need num_splits >= 1 and 1 <= split_size <= "
                                    + std::to_string((kDecodeAttentionMaxChunkBlocks - 2) * cache.size(3))
                                    + " (tokens_per_block * " + std::to_string(kDecodeAttentionMaxChunkBlocks - 2)
                                    + "), got " + std::to_string(numSplits) + " and " + std::to_string(splitSize));
    }
    if (static_cast<int64_t>(numSplits) * splitSize < blockTables.size(1) * cache.size(3)) {
        throw std::invalid_argument("decode_attention: num_splits * split_size must cover the block table ("
                                    + std::to_string(blockTables.size(1) * cache.size(3)) + " positions)");
    }
    if (slidingWindow < 0) throw std::invalid_argument("decode_attention: sliding_window must be >= 0");
    checkLastDimContiguous(q);
    checkLastDimContiguous(out);
    checkNonOverlapping(out);
    if (q.stride(1) != headDim || out.stride(1) != headDim) {
        throw std::invalid_argument("decode_attention: heads of q and out must be packed (stride(1) == head_dim)");
    }
    checkContiguous(cache);
    checkPacked16("decode_attention", cache);  // K/V rows are read 16 bytes at a time
    checkContiguous(blockTables);
    checkContiguous(seqLens);
    std::vector<TensorArg const*> all = {&out, &q, &cache, &blockTables, &seqLens};
    TensorArg alibi, workspace, counters;
    if (!alibiObj.is_none()) {
        alibi = toTensorArg(alibiObj, "alibi_slopes");
        checkDtype(alibi, {DType::kFloat32});
        checkShape(alibi, {numHeads});
        checkContiguous(alibi);
        all.push_back(&alibi);
    }
    if (numSplits > 1) {
        if (workspaceObj.is_none()) throw std::invalid_argument("decode_attention: num_splits > 1 needs a workspace");
        workspace = toTensorArg(workspaceObj, "workspace");
        checkDtype(workspace, {DType::kFloat32});
        checkContiguous(workspace);
        int64_t const need = batch * numHeads * numSplits * (headDim + 2);
        if (workspace.numel() < need) {
            throw std::invalid_argument("decode_attention: workspace " + workspace.shapeStr() + " holds fewer than "
                                        + std::to_string(need) + " floats");
        }
        all.push_back(&workspace);
        if (countersObj.is_none()) {
            throw std::invalid_argument("decode_attention: num_splits > 1 needs split_counters");
        }
        counters = toTensorArg(countersObj, "split_counters");
        checkDtype(counters, {DType::kInt32});
        checkContiguous(counters);
        if (counters.numel() < batch * kvHeads) {
            throw std::invalid_argument("decode_attention: split_counters " + counters.shapeStr() + " holds fewer than "
                                        + std::to_string(batch * kvHeads) + " counters (batch * num_kv_heads)");
        }
        checkNonOverlapping(counters);
        all.push_back(&counters);
    }
    TensorArg kNew, vNew, cosSin;
    bool const fused = !kNewObj.is_none();
    if (fused != !vNewObj.is_none()) throw std::invalid_argument("decode_attention: k_new and v_new go together");
    if (!cosSinObj.is_none() && !fused) {
        throw std::invalid_argument("decode_attention: rotary_cos_sin needs k_new and v_new");
    }
    if (fused) {
        kNew = toTensorArg(kNewObj, "k_new");
        vNew = toTensorArg(vNewObj, "v_new");
        checkSameDtype(q, kNew);
        checkSameDtype(q, vNew);
        checkShape(kNew, {batch, kvHeads, headDim});
        checkShape(vNew, {batch, kvHeads, headDim});
        checkLastDimContiguous(kNew);
        checkLastDimContiguous(vNew);
        if (kNew.stride(1) != headDim || vNew.stride(1) != headDim) {
            throw std::invalid_argument("decode_attention: heads of k_new and v_new must be packed");
        }
        all.push_back(&kNew);
        all.push_back(&vNew);
        if (!cosSinObj.is_none()) {
            cosSin = toTensorArg(cosSinObj, "rotary_cos_sin");
            checkDim(cosSin, 2);
            checkDtype(cosSin, {DType::kFloat32});
            checkContiguous(cosSin);
            if (cosSin.size(1) % 2 != 0 || cosSin.size(1) == 0 || cosSin.size(1) > headDim) {
                throw std::invalid_argument("decode_attention: rotary_cos_sin " + cosSin.shapeStr()
                                            + " needs an even rotary_dim in (0, head_dim]");
            }
            all.push_back(&cosSin);
        }
    }
    checkFitsInt(op, "batch", batch);
    int const device = checkSameCudaDevice(op, all);
    DeviceScope scope(device, all, stream);

    DecodeAttentionParams p{};
    p.kNew = fused ? kNew.data() : nullptr;
    p.vNew = fused ? vNew.data() : nullptr;
    p.kNewTokenStride = fused ? kNew.stride(0) : 0;
    p.vNewTokenStride = fused ? vNew.stride(0) : 0;
    p.cosSin = cosSinObj.is_none() ? nullptr : static_cast<float const*>(cosSin.data());
    p.maxPositions = cosSinObj.is_none() ? 0 : cosSin.size(0);
    p.rotaryDim = cosSinObj.is_none() ? 0 : static_cast<int>(cosSin.size(1));
    p.isNeox = isNeox;
    p.out = out.data();
    p.q = q.data();
    p.kvCache = cache.data();
    p.blockTables = static_cast<int32_t const*>(blockTables.data());
    p.sequenceLengths = static_cast<int32_t const*>(seqLens.data());
    p.alibiSlopes = alibiObj.is_none() ? nullptr : static_cast<float const*>(alibi.data());
    p.workspace = numSplits > 1 ? static_cast<float*>(workspace.data()) : nullptr;
    p.splitCounters = numSplits > 1 ? static_cast<int*>(counters.data()) : nullptr;
    p.batch = batch;
    p.numHeads = numHeads;
    p.kvHeads = kvHeads;
    p.headDim = headDim;
    p.tokensPerBlock = cache.size(3);
    p.maxBlocks = blockTables.size(1);
    p.numBlocks = cache.size(0);
    p.qTokenStride = q.stride(0);
    p.outTokenStride = out.stride(0);
    p.numSplits = numSplits;
    p.splitSize = splitSize;
    p.slidingWindow = slidingWindow;
    p.scale = static_cast<float>(scale);
    p.dtype = q.dtype;
    if (batch == 0 || p.maxBlocks == 0) return;
    py::gil_scoped_release release;
    launchDecodeAttention(p, reinterpret_cast<void*>(stream));
}

// ---- gemv ----
void gemv(py::handle outObj, py::handle xObj, py::handle weightObj, py::handle biasObj, int prologueCode,
          py::handle residualObj, py::handle residualOutObj, py::handle normWeightObj, double eps,
          uintptr_t stream) {
    char const* op = "gemv";
    if (prologueCode < 0 || prologueCode > static_cast<int>(GemvPrologue::kSiluAndMul)) {
        throw std::invalid_argument("gemv: unknown prologue " + std::to_string(prologueCode));
    }
    auto const prologue = static_cast<GemvPrologue>(prologueCode);
    TensorArg out = toTensorArg(outObj, "out");
    TensorArg x = toTensorArg(xObj, "x");
    TensorArg weight = toTensorArg(weightObj, "weight");
    checkDim(x, 2);
    checkDim(weight, 2);
    checkDim(out, 2);
    checkDtype(x, kFloatTypes);
    checkSameDtype(x, weight);
    checkSameDtype(x, out);
    int64_t const rows = x.size(0);
    int64_t const n = weight.size(0);
    int64_t const k = weight.size(1);
    int64_t const xCols = prologue == GemvPrologue::kSiluAndMul ? 2 * k : k;
    if (x.size(1) != xCols) {
        throw std::invalid_argument("gemv: x " + x.shapeStr() + " does not match weight [n, k] " + weight.shapeStr()
                                    + (prologue == GemvPrologue::kSiluAndMul ? " (x must be [rows, 2k])" : ""));
    }
    checkShape(out, {rows, n});
    if (!gemvSupports(rows, k, x.dtype)) {
        throw std::invalid_argument("gemv: " + std::to_string(rows) + " rows of k = " + std::to_string(k) + " "
                                    + dtypeName(x.dtype) + " are not supported (rows 1.."
                                    + std::to_string(kGemvMaxRows)
                                    + ", k a multiple of 16 bytes, rows * k in shared memory)");
    }
    checkContiguous(weight);
    checkLastDimContiguous(x);
    checkLastDimContiguous(out);
    checkNonOverlapping(out);
    checkPacked16(op, x);
    checkPacked16(op, weight);
    std::vector<TensorArg const*> all = {&out, &x, &weight};
    TensorArg bias, residual, residualOut, normWeight;
    if (!biasObj.is_none()) {
        bias = toTensorArg(biasObj, "bias");
        checkSameDtype(x, bias);
        checkShape(bias, {n});
        checkContiguous(bias);
        all.push_back(&bias);
    }
    bool const hasResidual = !residualObj.is_none();
    if (hasResidual != !residualOutObj.is_none()) {
        throw std::invalid_argument("gemv: residual and residual_out must be given together");
    }
    if (prologue == GemvPrologue::kRmsNorm) {
        normWeight = toTensorArg(normWeightObj, "norm_weight");
        checkSameDtype(x, normWeight);
        checkShape(normWeight, {k});
        checkContiguous(normWeight);
        checkPacked16(op, normWeight);
        all.push_back(&normWeight);
        if (!(eps >= 0.0) || !std::isfinite(eps)) {
            throw std::invalid_argument("gemv: eps must be finite and >= 0, got " + std::to_string(eps));
        }
        if (hasResidual) {
            residual = toTensorArg(residualObj, "residual");
            residualOut = toTensorArg(residualOutObj, "residual_out");
            for (TensorArg* t : {&residual, &residualOut}) {
                checkSameDtype(x, *t);
                checkShape(*t, {rows, k});
                checkLastDimContiguous(*t);
                checkPacked16(op, *t);
                all.push_back(t);
            }
            checkContiguous(residualOut);
            checkNonOverlapping(residualOut);
        }
    } else if (hasResidual || !normWeightObj.is_none()) {
        throw std::invalid_argument("gemv: residual and norm_weight belong to the RMSNorm prologue only");
    }
    int const device = checkSameCudaDevice(op, all);
    DeviceScope scope(device, all, stream);

    GemvParams p{};
    p.out = out.data();
    p.x = x.data();
    p.weight = weight.data();
    p.bias = biasObj.is_none() ? nullptr : bias.data();
    p.residual = hasResidual ? residual.data() : nullptr;
    p.residualOut = hasResidual ? residualOut.data() : nullptr;
    p.normWeight = prologue == GemvPrologue::kRmsNorm ? normWeight.data() : nullptr;
    p.rows = rows;
    p.n = n;
    p.k = k;
    p.xRowStride = x.stride(0);
    p.outRowStride = out.stride(0);
    p.residualRowStride = hasResidual ? residual.stride(0) : 0;
    p.eps = static_cast<float>(eps);
    p.prologue = prologue;
    p.dtype = x.dtype;
    py::gil_scoped_release release;
    launchGemv(p, reinterpret_cast<void*>(stream));
}

} // namespace

PYBIND11_MODULE(bindings, m) {
    m.doc() = "tensorrt_llm compiled kernels (C++/CUDA, no libtorch). Use them through tensorrt_llm.kernels.";

    py::dict dtypes;
    for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt32, DType::kInt64}) {
        dtypes[dtypeName(d)] = static_cast<int>(d);
    }
    m.attr("DTYPES") = dtypes;
    m.attr("__version__") = buildInfo().version;
    m.attr("cuda_kernels_compiled") = cudaKernelsCompiled();
    m.attr("DECODE_ATTENTION_MAX_CHUNK_BLOCKS") = kDecodeAttentionMaxChunkBlocks;

    m.def("build_info", &buildInfoDict,
          "Package version, git commit, CUDA version and compiled GPU architectures (empty for a CPU-only build).");

    m.def(
        "rms_norm",
        [](py::handle out, py::handle x, py::handle weight, double eps, uintptr_t stream, py::handle residual,
           py::handle residualOut) {
            withOpName("rms_norm", [&] { rmsNorm(out, x, weight, eps, stream, residual, residualOut); });
        },
        py::arg("out"), py::arg("x"), py::arg("weight"), py::arg("eps"), py::arg("stream"),
          py::arg("residual") = py::none(), py::arg("residual_out") = py::none(),
          "out = rmsnorm(x [+ residual]) * weight over rows of [rows, hidden]; with a residual, residual_out = "
          "x + residual.");
    m.def(
        "rotary_embedding",
        [](py::handle q, py::handle k, py::handle positions, py::handle cache, bool isNeox, uintptr_t stream) {
            withOpName("rotary_embedding", [&] { rotaryEmbedding(q, k, positions, cache, isNeox, stream); });
        },
        py::arg("q"), py::arg("k"), py::arg("positions"),
          py::arg("cos_sin_cache"), py::arg("is_neox"), py::arg("stream"),
          "Rotary embedding in place on q [T, Hq, D] and k [T, KV, D]. Out-of-range positions leave the token "
          "unchanged.");
    m.def(
        "silu_and_mul",
        [](py::handle out, py::handle x, uintptr_t stream) {
            withOpName("silu_and_mul", [&] { actAndMul("silu_and_mul", Activation::kSilu, out, x, stream); });
        },
        py::arg("out"), py::arg("x"), py::arg("stream"), "out = silu(x[:, :I]) * x[:, I:]");
    m.def(
        "gelu_and_mul",
        [](py::handle out, py::handle x, std::string const& approximate, uintptr_t stream) {
            withOpName("gelu_and_mul", [&] {
                Activation act;
                if (approximate == "none") {
                    act = Activation::kGelu;
                } else if (approximate == "tanh") {
                    act = Activation::kGeluTanh;
                } else {
                    throw std::invalid_argument("approximate must be 'none' or 'tanh', got '" + approximate + "'");
                }
                actAndMul("gelu_and_mul", act, out, x, stream);
            });
        },
        py::arg("out"), py::arg("x"), py::arg("approximate"), py::arg("stream"),
        "out = gelu(x[:, :I]) * x[:, I:]");
    m.def(
        "paged_kv_write",
        [](py::handle key, py::handle value, py::handle cache, py::handle blockTables, py::handle cuSeqlens,
           py::handle pastLengths, uintptr_t stream) {
            withOpName("paged_kv_write",
                       [&] { pagedKvWrite(key, value, cache, blockTables, cuSeqlens, pastLengths, stream); });
        },
        py::arg("key"), py::arg("value"), py::arg("kv_cache"),
          py::arg("block_tables"), py::arg("cu_seqlens"), py::arg("past_lengths"), py::arg("stream"),
          "Scatter new K/V rows into kv_cache [num_blocks, 2, KV, tpb, D]. Invalid block ids / positions are "
          "skipped (nothing written).");
    m.def(
        "top_k_top_p_sample",
        [](py::handle out, py::handle logits, py::handle temperature, py::handle topK, py::handle topP,
           py::handle uniform, uintptr_t stream) {
            withOpName("top_k_top_p_sample",
                       [&] { topKTopPSample(out, logits, temperature, topK, topP, uniform, stream); });
        },
        py::arg("out"), py::arg("logits"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
        py::arg("uniform"), py::arg("stream"),
        "out[b] = the token row b of logits [B, V] draws with uniform[b] after temperature, top-k and top-p "
        "(per-row float32/int32/float32 device tensors [B]); greedy rows take the argmax.");
    m.def(
        "decode_attention",
        [](py::handle out, py::handle q, py::handle cache, py::handle blockTables, py::handle seqLens,
           py::handle alibi, py::handle workspace, py::handle counters, int numSplits, int splitSize, double scale,
           int slidingWindow, py::handle kNew, py::handle vNew, py::handle cosSin, bool isNeox, uintptr_t stream) {
            withOpName("decode_attention", [&] {
                decodeAttention(out, q, cache, blockTables, seqLens, alibi, workspace, counters, numSplits, splitSize,
                                scale, slidingWindow, kNew, vNew, cosSin, isNeox, stream);
            });
        },
        py::arg("out"), py::arg("q"), py::arg("kv_cache"), py::arg("block_tables"), py::arg("sequence_lengths"),
        py::arg("alibi_slopes"), py::arg("workspace"), py::arg("split_counters"), py::arg("num_splits"),
        py::arg("split_size"),
        py::arg("scale"), py::arg("sliding_window"), py::arg("k_new"), py::arg("v_new"), py::arg("rotary_cos_sin"),
        py::arg("is_neox"), py::arg("stream"),
        "Attention of one query token per sequence (q [B, H, D]) over its paged K/V cache; with k_new/v_new "
        "the step's rows are rotated (with rotary_cos_sin) and written into the cache by the same launch.");
    m.def(
        "gemv",
        [](py::handle out, py::handle x, py::handle weight, py::handle bias, int prologue, py::handle residual,
           py::handle residualOut, py::handle normWeight, double eps, uintptr_t stream) {
            withOpName("gemv", [&] {
                gemv(out, x, weight, bias, prologue, residual, residualOut, normWeight, eps, stream);
            });
        },
        py::arg("out"), py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("prologue"), py::arg("residual"),
        py::arg("residual_out"), py::arg("norm_weight"), py::arg("eps"), py::arg("stream"),
        "out = a @ weight.T (+ bias) for 1..4 rows, a computed from x by the prologue: 0 none, 1 RMSNorm "
        "(of x + residual, written to residual_out, when given), 2 SiLU-and-mul (x [rows, 2k]).");
    m.def(
        "gemv_supports",
        [](int64_t rows, int64_t k, int dtype) { return gemvSupports(rows, k, static_cast<DType>(dtype)); },
        py::arg("rows"), py::arg("k"), py::arg("dtype"),
        "Whether gemv serves `rows` rows of k elements of this dtype code.");
}
