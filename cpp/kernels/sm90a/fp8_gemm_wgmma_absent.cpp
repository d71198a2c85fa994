// A CUDA build that does not target sm_90: no Hopper FP8 GEMM (fp8_gemm_wgmma.cu is sm_90a code).
// fp8_linear then takes cuBLASLt's FP8 GEMM for every row count the FP8 GEMV does not serve.
#include "tensorrt_llm/kernels.h"

#include <stdexcept>

namespace tensorrt_llm {

bool fp8GemmWgmmaCompiled() { return false; }

void launchFp8GemmWgmma(void*, void const*, void const*, void const*, void const*, void const*, int64_t, int64_t,
                        int64_t, int64_t, bool, DType, void*) {
    throw std::runtime_error("fp8_gemm_wgmma: this build does not target sm_90 (rebuild with -a \"90-real\")");
}

} // namespace tensorrt_llm
