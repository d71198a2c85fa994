// weight_only_gemv.cuh's kernels for float activations.
#include "weight_only_gemv.cuh"

namespace tensorrt_llm::weight_only_gemv_detail {

void gemvFloat(Params const& p, int bits, DType scaleDtype, bool alignedX, cudaStream_t stream) {
    gemvTyped<float>(p, bits, scaleDtype, alignedX, stream);
}

void dequantizeFloat(void* out, void const* qweight, void const* scales, void const* zeros, int64_t n, int numPacks,
                     int groups, int shift, bool tiled, int bits, DType scaleDtype, cudaStream_t stream) {
    dequantizeTyped<float>(out, qweight, scales, zeros, n, numPacks, groups, shift, tiled, bits, scaleDtype, stream);
}

} // namespace tensorrt_llm::weight_only_gemv_detail
