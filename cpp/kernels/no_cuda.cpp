// CPU-only build: the same entry points, each refusing with a clear message.
#include "tensorrt_llm/kernels.h"

#include <stdexcept>

namespace tensorrt_llm {

namespace {
[[noreturn]] void noCuda(char const* what) {
    throw std::runtime_error(std::string(what)
                             + ": tensorrt_llm.bindings was built without CUDA kernels (CPU-only build); "
                               "rebuild with `python build_wheel.py` on a machine with nvcc");
}
} // namespace

bool cudaKernelsCompiled() { return false; }
int prepareDevice(int, std::vector<NamedPointer> const&, void*) { noCuda("prepare_device"); }
void restoreDevice(int) noexcept {}
void launchRmsNorm(RmsNormParams const&, void*) { noCuda("rms_norm"); }
void launchRotaryEmbedding(RotaryParams const&, void*) { noCuda("rotary_embedding"); }
void launchTopKTopPSample(TopKTopPSampleParams const&, void*) { noCuda("top_k_top_p_sample"); }
void launchActAndMul(ActAndMulParams const&, void*) { noCuda("act_and_mul"); }
void launchPagedKvWrite(PagedKvWriteParams const&, void*) { noCuda("paged_kv_write"); }
bool decodeAttentionSupportsHeadDim(int64_t headDim) { return headDim == 64 || headDim == 128 || headDim == 256; }
void launchDecodeAttention(DecodeAttentionParams const&, void*) { noCuda("decode_attention"); }
bool gemvSupports(int64_t, int64_t, DType) { return false; }
void launchGemv(GemvParams const&, void*) { noCuda("gemv"); }

} // namespace tensorrt_llm
