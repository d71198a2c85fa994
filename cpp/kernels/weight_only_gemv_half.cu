// weight_only_gemv.cuh's kernels for __half activations.
#include "weight_only_gemv.cuh"

namespace tensorrt_llm::weight_only_gemv_detail {

void gemvHalf(Params const& p, int bits, DType scaleDtype, bool alignedX, cudaStream_t stream) {
    gemvTyped<__half>(p, bits, scaleDtype, alignedX, stream);
}

void fp8GemvHalf(Params const& p, cudaStream_t stream) { launchGemvMma<__half, float, 8, true>(p, stream); }

void dequantizeHalf(void* out, void const* qweight, void const* scales, void const* zeros, int64_t n, int numPacks,
                    int groups, int shift, bool tiled, int bits, DType scaleDtype, cudaStream_t stream) {
    dequantizeTyped<__half>(out, qweight, scales, zeros, n, numPacks, groups, shift, tiled, bits, scaleDtype, stream);
}

} // namespace tensorrt_llm::weight_only_gemv_detail
