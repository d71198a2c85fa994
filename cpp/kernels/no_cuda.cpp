// CPU-only build: no kernel source is compiled. The bindings refuse every launch in
// prepareDevice (their launch calls are compiled out: entry.h, kCudaKernels); what their
// checks ask of the kernels is answered here as the CUDA build would.
#include "tensorrt_llm/kernels.h"

#include <stdexcept>

namespace tensorrt_llm {

bool cudaKernelsCompiled() { return false; }
bool fp8GemmWgmmaCompiled() { return false; }
int prepareDevice(int, std::vector<NamedPointer> const&, void*) {
    throw std::runtime_error("prepare_device: tensorrt_llm.bindings was built without CUDA kernels (CPU-only build); "
                             "rebuild with `python build_wheel.py` on a machine with nvcc");
}
void restoreDevice(int) noexcept {}
bool decodeAttentionSupportsHeadDim(int64_t headDim) { return headDim == 64 || headDim == 128 || headDim == 256; }
bool gemvSupports(int64_t, int64_t, DType) { return false; }

} // namespace tensorrt_llm
