// Weight-only INT8 / INT4 and FP8 GEMVs' entry points: the kernels and their launches are
// weight_only_gemv.cuh, compiled once per activation dtype (weight_only_gemv_{float,half,bf16}.cu).
#include "weight_only_gemv.cuh"

namespace tensorrt_llm {

using namespace weight_only_gemv_detail;

void launchWeightOnlyGemv(void* out, void const* x, void const* qweight, void const* scales, void const* zeros,
                          void const* bias, int64_t m, int64_t n, int64_t k, int64_t xRowStride, int64_t outRowStride,
                          int bits, int64_t groupSize, bool tiled, bool gated, WeightOnlyNorm const* norm,
                          int64_t const* perm, DType dtype, DType scaleDtype, void* stream) {
    if (m == 0 || n == 0) return;
    Params p = gemvParams(out, x, qweight, scales, bias, m, n, k, xRowStride, outRowStride);
    p.zeros = zeros;
    p.perm = perm;
    p.tiled = tiled;
    p.gated = gated;
    if (norm != nullptr) {
        p.normed = true;
        p.norm = *norm;
    }
    p.groups = groupSize == 0 ? 1 : static_cast<int>(k / groupSize);
    p.groupShift = groupShiftOf(groupSize, bits);
    auto const st = static_cast<cudaStream_t>(stream);
    int64_t const elementBytes = dtype == DType::kFloat32 ? 4 : 2;
    bool const alignedX = aligned16(x) && (xRowStride * elementBytes) % 16 == 0;
    switch (dtype) {
        case DType::kFloat32: gemvFloat(p, bits, scaleDtype, alignedX, st); break;
        case DType::kFloat16: gemvHalf(p, bits, scaleDtype, alignedX, st); break;
        case DType::kBFloat16: gemvBFloat16(p, bits, scaleDtype, alignedX, st); break;
        default: throw std::invalid_argument(std::string("weight_only_gemv: unsupported dtype ") + dtypeName(dtype));
    }
}

// FP8 (W8A8, E4M3) with a static input scale: the tensor-core GEMVs with FP8 codes; gated: out
// [m, n / 2] = silu(gate) * up of the weight's halves (Params::gated).
void launchFp8Gemv(void* out, void const* x, void const* qweight, void const* weightScale, void const* inputScale,
                   void const* bias, int64_t m, int64_t n, int64_t k, int64_t xRowStride, int64_t outRowStride,
                   bool perChannel, bool gated, DType dtype, void* stream) {
    if (m == 0 || n == 0) return;
    Params p = gemvParams(out, x, qweight, weightScale, bias, m, n, k, xRowStride, outRowStride);
    p.gated = gated;
    p.groups = 1;
    p.groupShift = 31;
    p.inputScale = static_cast<float const*>(inputScale);
    p.scaleStride = perChannel ? 1 : 0;
    auto const st = static_cast<cudaStream_t>(stream);
    if (dtype == DType::kFloat16) {
        fp8GemvHalf(p, st);
    } else if (dtype == DType::kBFloat16) {
        fp8GemvBFloat16(p, st);
    } else {
        throw std::invalid_argument("fp8_gemv: x must be float16 or bfloat16");
    }
}

void launchWeightOnlyDequantize(void* out, void const* qweight, void const* scales, void const* zeros, int64_t n,
                                int64_t k, int bits, int64_t groupSize, bool tiled, DType dtype, DType scaleDtype,
                                void* stream) {
    if (n == 0) return;
    int const numPacks = static_cast<int>(k / (128 / bits));
    int const groups = groupSize == 0 ? 1 : static_cast<int>(k / groupSize);
    int const shift = groupShiftOf(groupSize, bits);
    auto const st = static_cast<cudaStream_t>(stream);
    switch (dtype) {
        case DType::kFloat32:
            dequantizeFloat(out, qweight, scales, zeros, n, numPacks, groups, shift, tiled, bits, scaleDtype, st);
            break;
        case DType::kFloat16:
            dequantizeHalf(out, qweight, scales, zeros, n, numPacks, groups, shift, tiled, bits, scaleDtype, st);
            break;
        case DType::kBFloat16:
            dequantizeBFloat16(out, qweight, scales, zeros, n, numPacks, groups, shift, tiled, bits, scaleDtype, st);
            break;
        default:
            throw std::invalid_argument(std::string("weight_only_dequantize: unsupported dtype ") + dtypeName(dtype));
    }
}

} // namespace tensorrt_llm
