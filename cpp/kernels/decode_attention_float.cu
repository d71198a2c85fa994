// decode_attention.cuh's kernels for float activations.
#include "decode_attention.cuh"

namespace tensorrt_llm {

void launchDecodeAttentionFloat(DecodeAttentionParams const& p, cudaStream_t stream) {
    launchHeadSizes<float>(p, stream);
}

} // namespace tensorrt_llm
