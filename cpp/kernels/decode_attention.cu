// Paged decode attention's entry point: the kernels and their launches are decode_attention.cuh,
// compiled once per activation dtype (decode_attention_{float,half,bf16}.cu).
#include "decode_attention.cuh"

#include <type_traits>

namespace tensorrt_llm {

bool decodeAttentionSupportsHeadDim(int64_t headDim) {
    return headDim == 64 || headDim == 128 || headDim == 256;
}

void launchDecodeAttention(DecodeAttentionParams const& p, void* stream) {
    if (p.batch == 0) return;
    auto s = static_cast<cudaStream_t>(stream);
    dispatchFloat(p.dtype, "decode_attention", [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, float>) {
            launchDecodeAttentionFloat(p, s);
        } else if constexpr (std::is_same_v<T, __half>) {
            launchDecodeAttentionHalf(p, s);
        } else {
            launchDecodeAttentionBFloat16(p, s);
        }
    });
}

} // namespace tensorrt_llm
