// Gated activations: out = act(x[..., :I]) * x[..., I:], act = SiLU, GELU (erf) or GELU (tanh).
//
// The grid is (rows x chunks of the I columns) flattened into blockIdx.x so large token
// counts and wide MLPs both fill the GPU. Math in float32, one rounding per output element.
#include "activation.cuh"
#include "common.cuh"

namespace tensorrt_llm {

// O: T, or uint8_t for E4M3 codes (codeScale given).
template <typename T, typename O, int VEC, Activation A>
__global__ void actAndMulKernel(O* __restrict__ out, T const* __restrict__ x, int64_t inter, int64_t xRowStride,
                                int64_t outRowStride, int64_t chunksPerRow, float const* __restrict__ codeScale) {
    waitForPreviousKernel();  // see launchKernel
    allowNextKernel();
    using P = Pack<T, VEC>;
    int64_t const row = blockIdx.x / chunksPerRow;
    int64_t const chunk = blockIdx.x - row * chunksPerRow;
    int64_t const i = chunk * blockDim.x + threadIdx.x;  // index in packs of VEC
    if (i * VEC >= inter) return;
    T const* xRow = x + row * xRowStride;
    P const a = reinterpret_cast<P const*>(xRow)[i];
    P const b = reinterpret_cast<P const*>(xRow + inter)[i];
    using OutPack = Pack<O, VEC>;
    OutPack o;
    float const inverse = codeInverse<O, T>(codeScale);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        o.v[j] = outputOf<O>(fromFloat<T>(activate<A>(toFloat(a.v[j])) * toFloat(b.v[j])), inverse);
    }
    reinterpret_cast<OutPack*>(out + row * outRowStride)[i] = o;
}

template <typename T, typename O, int VEC, Activation A>
static void launch(ActAndMulParams const& p, cudaStream_t stream) {
    int64_t const numVec = p.inter / VEC;
    int const threads = std::min(256, std::max(32, roundUp(numVec, 32)));
    int64_t const chunks = (numVec + threads - 1) / threads;
    int64_t const blocks = p.rows * chunks;
    if (blocks > 0x7fffffffLL) throw std::invalid_argument("act_and_mul: too many rows for one launch");
    launchKernel("act_and_mul", actAndMulKernel<T, O, VEC, A>, static_cast<unsigned>(blocks), threads, 0, stream,
                 static_cast<O*>(p.out), static_cast<T const*>(p.x), p.inter, p.xRowStride, p.outRowStride, chunks,
                 p.codeScale);
}

template <typename T, typename O, int VEC>
static void launchAct(ActAndMulParams const& p, cudaStream_t stream) {
    switch (p.act) {
        case Activation::kSilu: launch<T, O, VEC, Activation::kSilu>(p, stream); break;
        case Activation::kGelu: launch<T, O, VEC, Activation::kGelu>(p, stream); break;
        case Activation::kGeluTanh: launch<T, O, VEC, Activation::kGeluTanh>(p, stream); break;
        default: throw std::invalid_argument("act_and_mul: unknown activation");
    }
}

template <typename T, int VEC>
static void launchOut(ActAndMulParams const& p, cudaStream_t stream) {
    dispatchOutput<T>(p.codeScale, [&](auto out) { launchAct<T, decltype(out), VEC>(p, stream); });
}

void launchActAndMul(ActAndMulParams const& p, void* stream) {
    if (p.rows == 0) return;
    auto s = static_cast<cudaStream_t>(stream);
    dispatchFloat(p.dtype, "act_and_mul", [&](auto tag) {
        using T = decltype(tag);
        constexpr int V = kVec16<T>;
        bool const vec = p.inter % V == 0 && aligned16(p.x) && aligned16(p.out) && p.xRowStride % V == 0
                         && p.outRowStride % V == 0;
        if (vec) {
            launchOut<T, V>(p, s);
        } else {
            launchOut<T, 1>(p, s);
        }
    });
}

} // namespace tensorrt_llm
