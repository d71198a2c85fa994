#include "tensor_arg.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace py = pybind11;

namespace tensorrt_llm {

char const* dtypeName(DType dtype) {
    switch (dtype) {
        case DType::kFloat32: return "float32";
        case DType::kFloat16: return "float16";
        case DType::kBFloat16: return "bfloat16";
        case DType::kInt32: return "int32";
        case DType::kInt64: return "int64";
        case DType::kInt8: return "int8";
        case DType::kUInt8: return "uint8";
    }
    return "unknown";
}

int dtypeSize(DType dtype) {
    switch (dtype) {
        case DType::kFloat32: return 4;
        case DType::kFloat16: return 2;
        case DType::kBFloat16: return 2;
        case DType::kInt32: return 4;
        case DType::kInt64: return 8;
        case DType::kInt8: return 1;
        case DType::kUInt8: return 1;
    }
    return 0;
}

int64_t TensorArg::numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
}

// Plain string building, no iostreams: an ostringstream in this module crashed (SIGSEGV in
// basic_ostream::_M_insert<long>) on the GPU machine's Python 3.12/PyTorch process, where two
// C++ runtimes' locale objects met.
static std::string listStr(std::vector<int64_t> const& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
}

std::string TensorArg::shapeStr() const { return listStr(shape); }

std::string TensorArg::describe() const {
    std::string dev = device < 0 ? "cpu" : "cuda:" + std::to_string(device);
    return name + " (" + dtypeName(dtype) + " " + shapeStr() + " on " + dev + ")";
}

static std::vector<int64_t> toIntVector(py::handle obj, std::string const& what) {
    if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj)) {
        throw py::type_error(what + " must be a sequence of ints");
    }
    std::vector<int64_t> out;
    for (py::handle item : py::reinterpret_borrow<py::sequence>(obj)) {
        if (!py::isinstance<py::int_>(item)) throw py::type_error(what + " must be a sequence of ints");
        out.push_back(item.cast<int64_t>());
    }
    return out;
}

TensorArg toTensorArg(py::handle obj, char const* name) {
    if (!py::isinstance<py::tuple>(obj) || py::len(obj) != 5) {
        throw py::type_error(std::string(name)
                             + " must be a tuple (data_ptr, dtype_code, shape, strides, device); "
                               "use tensorrt_llm.kernels, which builds it from a torch.Tensor");
    }
    auto tup = py::reinterpret_borrow<py::tuple>(obj);
    TensorArg t;
    t.name = name;
    if (!py::isinstance<py::int_>(tup[0]) || !py::isinstance<py::int_>(tup[1]) || !py::isinstance<py::int_>(tup[4])) {
        throw py::type_error(std::string(name) + ": data_ptr, dtype_code and device must be ints");
    }
    t.ptr = tup[0].cast<uintptr_t>();
    int const code = tup[1].cast<int>();
    if (code < 0 || code > static_cast<int>(DType::kUInt8)) {
        throw py::type_error(std::string(name) + ": unknown dtype code " + std::to_string(code));
    }
    t.dtype = static_cast<DType>(code);
    t.shape = toIntVector(tup[2], std::string(name) + " shape");
    t.strides = toIntVector(tup[3], std::string(name) + " strides");
    t.device = tup[4].cast<int>();
    if (t.shape.size() != t.strides.size()) {
        throw std::invalid_argument(t.name + ": shape " + t.shapeStr() + " and strides " + listStr(t.strides)
                                    + " differ in length");
    }
    for (size_t i = 0; i < t.shape.size(); ++i) {
        if (t.shape[i] < 0) throw std::invalid_argument(t.name + ": negative size in shape " + t.shapeStr());
        if (t.strides[i] < 0) throw std::invalid_argument(t.name + ": negative stride in " + listStr(t.strides));
    }
    if (t.ptr == 0 && t.numel() > 0) throw std::invalid_argument(t.name + ": null data pointer");
    return t;
}

void checkDim(TensorArg const& t, int dim) {
    if (t.dim() != dim) {
        throw std::invalid_argument(t.name + " must have " + std::to_string(dim) + " dimensions, got shape "
                                    + t.shapeStr());
    }
}

void checkShape(TensorArg const& t, std::vector<int64_t> const& expected) {
    if (t.shape != expected) {
        throw std::invalid_argument(t.name + " must have shape " + listStr(expected) + ", got " + t.shapeStr());
    }
}

void checkSameShape(TensorArg const& a, TensorArg const& b) {
    if (a.shape != b.shape) {
        throw std::invalid_argument(b.name + " has shape " + b.shapeStr() + " but " + a.name + " has shape "
                                    + a.shapeStr());
    }
}

void checkDtype(TensorArg const& t, std::vector<DType> const& allowed) {
    for (DType d : allowed) {
        if (t.dtype == d) return;
    }
    std::string names;
    for (DType d : allowed) names += (names.empty() ? "" : ", ") + std::string(dtypeName(d));
    throw py::type_error(t.name + " must be one of {" + names + "}, got " + dtypeName(t.dtype));
}

void checkSameDtype(TensorArg const& a, TensorArg const& b) {
    if (a.dtype != b.dtype) {
        throw py::type_error(b.name + " is " + dtypeName(b.dtype) + " but " + a.name + " is " + dtypeName(a.dtype));
    }
}

void checkLastDimContiguous(TensorArg const& t) {
    if (t.dim() > 0 && t.size(-1) > 1 && t.stride(-1) != 1) {
        throw std::invalid_argument(t.name + " must be contiguous in its last dimension, got strides "
                                    + listStr(t.strides));
    }
}

void checkContiguous(TensorArg const& t) {
    int64_t expected = 1;
    for (int d = t.dim() - 1; d >= 0; --d) {
        if (t.shape[d] != 1 && t.strides[d] != expected) {
            throw std::invalid_argument(t.name + " must be contiguous, got shape " + t.shapeStr() + " strides "
                                        + listStr(t.strides));
        }
        expected *= t.shape[d];
    }
}

void checkNonOverlapping(TensorArg const& t) {
    if (t.numel() <= 1) return;
    std::vector<int> order;
    for (int d = 0; d < t.dim(); ++d) {
        if (t.shape[d] > 1) order.push_back(d);
    }
    std::sort(order.begin(), order.end(), [&](int a, int b) { return t.strides[a] < t.strides[b]; });
    int64_t span = 1;  // elements covered by the dimensions seen so far
    for (int d : order) {
        if (t.strides[d] < span) {
            throw std::invalid_argument(t.name + " has overlapping elements (shape " + t.shapeStr() + ", strides "
                                        + listStr(t.strides) + "); it is written in place");
        }
        span = t.strides[d] * (t.shape[d] - 1) + span;
    }
}

int checkSameCudaDevice(char const* op, std::vector<TensorArg const*> const& tensors) {
    int device = -2;
    TensorArg const* first = nullptr;
    for (TensorArg const* t : tensors) {
        if (t->pinnedHost) {
            if (t->device >= 0) {
                throw std::invalid_argument(std::string(op) + ": " + t->describe()
                                            + " must be a pinned host (CPU) tensor");
            }
            continue;
        }
        if (t->device < 0) {
            throw std::invalid_argument(std::string(op) + ": " + t->describe() + " must be a CUDA tensor");
        }
        if (first == nullptr) {
            first = t;
            device = t->device;
        } else if (t->device != device) {
            throw std::invalid_argument(std::string(op) + ": " + t->describe() + " and " + first->describe()
                                        + " are on different devices");
        }
    }
    return device;
}

DeviceScope::DeviceScope(int device, std::vector<TensorArg const*> const& tensors, uintptr_t stream) {
    std::vector<NamedPointer> pointers;
    for (TensorArg const* t : tensors) {
        int64_t bytes = 0;  // pinnedHost: the span the kernel may reach, first to last element
        if (t->numel() > 0) {
            bytes = dtypeSize(t->dtype);
            for (int d = 0; d < t->dim(); ++d) bytes += (t->shape[d] - 1) * t->strides[d] * dtypeSize(t->dtype);
        }
        pointers.push_back({t->name, t->numel() > 0 ? t->data() : nullptr, t->pinnedHost, bytes});
    }
    previous_ = prepareDevice(device, pointers, reinterpret_cast<void*>(stream));
}

} // namespace tensorrt_llm
