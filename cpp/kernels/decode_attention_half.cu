// decode_attention.cuh's kernels for __half activations.
#include "decode_attention.cuh"

namespace tensorrt_llm {

void launchDecodeAttentionHalf(DecodeAttentionParams const& p, cudaStream_t stream) {
    launchHeadSizes<__half>(p, stream);
}

} // namespace tensorrt_llm
