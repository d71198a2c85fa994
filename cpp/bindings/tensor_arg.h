// TensorArg: what the bindings receive for a tensor, and the checks run on it before any
// kernel launch (entry.h says which, for each argument of each kernel). Python passes each tensor as a tuple
//   (data_ptr: int, dtype_code: int, shape: sequence[int], strides: sequence[int], device: int)
// with strides in elements and device -1 for host memory.
#pragma once

#include "tensorrt_llm/kernels.h"

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tensorrt_llm {

struct TensorArg {
    std::string name;
    uintptr_t ptr = 0;
    DType dtype = DType::kFloat32;
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;
    int device = -1;
    bool pinnedHost = false;  // an argument the kernel reaches in page-locked host memory (Arg::pinnedHost)

    int dim() const { return static_cast<int>(shape.size()); }
    int64_t numel() const;
    int64_t size(int d) const { return shape.at(d < 0 ? d + dim() : d); }
    int64_t stride(int d) const { return strides.at(d < 0 ? d + dim() : d); }
    void* data() const { return reinterpret_cast<void*>(ptr); }
    std::string shapeStr() const;
    std::string describe() const;  // "x (float16 [37, 1000] on cuda:0)"
};

// Parses the Python tuple; ValueError/TypeError when it is malformed.
TensorArg toTensorArg(pybind11::handle obj, char const* name);

// All raise ValueError (std::invalid_argument) or TypeError (pybind11::type_error) naming the
// tensor(s) involved.
void checkDim(TensorArg const& t, int dim);
void checkShape(TensorArg const& t, std::vector<int64_t> const& expected);
void checkSameShape(TensorArg const& a, TensorArg const& b);
void checkDtype(TensorArg const& t, std::vector<DType> const& allowed);
void checkSameDtype(TensorArg const& a, TensorArg const& b);
void checkLastDimContiguous(TensorArg const& t);
void checkContiguous(TensorArg const& t);
// The elements of t do not overlap (required for tensors a kernel writes).
void checkNonOverlapping(TensorArg const& t);
// Every tensor is CUDA memory of one device; returns that device.
int checkSameCudaDevice(char const* op, std::vector<TensorArg const*> const& tensors);
// For the lifetime of the scope: the tensors' device is current and their pointers have been
// checked with the driver (see prepareDevice); the previous device is restored at the end.
class DeviceScope {
public:
    DeviceScope(int device, std::vector<TensorArg const*> const& tensors, uintptr_t stream);
    ~DeviceScope() { restoreDevice(previous_); }
    DeviceScope(DeviceScope const&) = delete;
    DeviceScope& operator=(DeviceScope const&) = delete;

private:
    int previous_ = -1;
};

} // namespace tensorrt_llm
