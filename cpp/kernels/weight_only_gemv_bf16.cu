// weight_only_gemv.cuh's kernels for __nv_bfloat16 activations.
#include "weight_only_gemv.cuh"

namespace tensorrt_llm::weight_only_gemv_detail {

void gemvBFloat16(Params const& p, int bits, DType scaleDtype, bool alignedX, cudaStream_t stream) {
    gemvTyped<__nv_bfloat16>(p, bits, scaleDtype, alignedX, stream);
}

void fp8GemvBFloat16(Params const& p, cudaStream_t stream) { launchGemvMma<__nv_bfloat16, float, 8, true>(p, stream); }

void dequantizeBFloat16(void* out, void const* qweight, void const* scales, void const* zeros, int64_t n, int numPacks,
                        int groups, int shift, bool tiled, int bits, DType scaleDtype, cudaStream_t stream) {
    dequantizeTyped<__nv_bfloat16>(out, qweight, scales, zeros, n, numPacks, groups, shift, tiled, bits, scaleDtype, stream);
}

} // namespace tensorrt_llm::weight_only_gemv_detail
