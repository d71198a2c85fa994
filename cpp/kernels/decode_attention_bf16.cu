// decode_attention.cuh's kernels for __nv_bfloat16 activations.
#include "decode_attention.cuh"

namespace tensorrt_llm {

void launchDecodeAttentionBFloat16(DecodeAttentionParams const& p, cudaStream_t stream) {
    launchHeadSizes<__nv_bfloat16>(p, stream);
}

} // namespace tensorrt_llm
