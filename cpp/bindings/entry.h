// A binding entry: one kernel as tensorrt_llm.bindings.<name>, described by a table row, not code.
//
//   Entry{"silu_and_mul", "out = silu(x[:, :I]) * x[:, I:]",
//         {tensor("out").rank(2).dtypeOf("x").lastDimContiguous().written(),
//          tensor("x").rank(2).floats().lastDimContiguous(), stream()},
//         [](Call& c) { ... relations between the arguments ... },
//         [](Call const& c) { ... fill the kernel's params, launch ... }}
//
// Every entry goes through the one mechanism (run in entry.cpp), which
//   1. binds the Python call to the arguments (positional or by name; an optional tensor may
//      be None or left out) and parses each tensor tuple (TensorArg),
//   2. checks each tensor as its Arg says: rank, dtype, same dtype / shape as another,
//   3. runs the entry's check (the relations the Args cannot state: shapes in terms of other
//      arguments' sizes, scalars' ranges, what the kernel supports),
//   4. checks each tensor's layout: last dim contiguous, contiguous, not overlapping if written,
//   5. checks that every tensor is CUDA memory of one device and makes it current (a host entry:
//      that every tensor is host memory),
//   6. releases the GIL and runs the entry's launch.
// Errors are ValueError / TypeError / RuntimeError whose message starts with the entry's name.
#pragma once

#include "tensor_arg.h"
#include "tensorrt_llm/kernels.h"

#include <pybind11/pybind11.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#ifndef TRTLLM_CUDA_KERNELS
#define TRTLLM_CUDA_KERNELS 1
#endif

namespace tensorrt_llm {

// Whether this build compiles the kernel sources. A launch writes `if constexpr (kCudaKernels)`
// before its launcher call, so that the CPU-only build, which compiles none of them, needs no
// definition of it; that build refuses in step 5 before any launch.
constexpr bool kCudaKernels = TRTLLM_CUDA_KERNELS != 0;

// One argument of an entry and the checks the mechanism runs on it (built as
// tensor("x").rank(2).floats().lastDimContiguous()).
class Arg {
public:
    enum class Kind { kTensor, kReal, kInteger, kFlag, kText, kStream };
    enum class Layout { kAny, kLastDimContiguous, kContiguous };

    Arg(std::string name, Kind kind, bool optional = false) : name_(std::move(name)), kind_(kind), optional_(optional) {}

    Arg& rank(int r) { rank_ = r; return *this; }
    Arg& dtypes(std::initializer_list<DType> allowed) { dtypes_ = allowed; return *this; }
    Arg& floats() { return dtypes({DType::kFloat32, DType::kFloat16, DType::kBFloat16}); }
    Arg& dtypeOf(char const* other) { dtypeOf_ = other; return *this; }     // the same dtype as `other`
    Arg& shapeOf(char const* other) { shapeOf_ = other; return *this; }     // the same shape as `other`
    Arg& lastDimContiguous() { layout_ = Layout::kLastDimContiguous; return *this; }
    Arg& contiguous() { layout_ = Layout::kContiguous; return *this; }
    Arg& written() { written_ = true; return *this; }  // the kernel writes it: no overlapping elements
    // A CPU tensor in page-locked memory, which the kernel writes over the bus (checked with the driver).
    Arg& pinnedHost() { pinnedHost_ = true; return *this; }

private:
    friend class Binder;
    std::string name_;
    Kind kind_;
    bool optional_;  // a tensor that may be None or left out (its checks are then skipped)
    int rank_ = -1;  // -1: any
    std::vector<DType> dtypes_;  // empty: any
    std::string dtypeOf_, shapeOf_;
    Layout layout_ = Layout::kAny;
    bool written_ = false;
    bool pinnedHost_ = false;
};

Arg tensor(char const* name);
Arg optionalTensor(char const* name);
Arg real(char const* name);      // a Python float (or int), as double
Arg integer(char const* name);   // a Python int, as int64_t
Arg flag(char const* name);      // a Python bool
Arg text(char const* name);      // a Python str
Arg stream();                    // the CUDA stream handle (an int), named "stream"

// The bound, parsed arguments of one call.
class Call {
public:
    TensorArg const& operator[](std::string const& name) const;  // a tensor (given)
    bool has(std::string const& name) const;                     // an optional tensor given
    void const* ptr(std::string const& name) const;              // its data, nullptr when absent
    double real(std::string const& name) const;
    int64_t integer(std::string const& name) const;
    bool flag(std::string const& name) const;
    std::string const& text(std::string const& name) const;
    void* stream() const { return reinterpret_cast<void*>(stream_); }

    // Checks for an entry's check function.
    void shape(std::string const& name, std::vector<int64_t> const& expected) const;  // given tensors only
    void together(std::string const& a, std::string const& b) const;  // both given or neither
    void fitsInt(char const* what, int64_t value) const;              // <= INT32_MAX
    void finiteNonNegative(std::string const& name) const;            // a real
    void packed16(std::string const& name) const;  // 16-byte aligned, row strides whole 16-byte packs

private:
    friend class Binder;
    std::map<std::string, TensorArg> tensors_;
    std::map<std::string, double> reals_;
    std::map<std::string, int64_t> integers_;
    std::map<std::string, bool> flags_;
    std::map<std::string, std::string> texts_;
    uintptr_t stream_ = 0;
};

struct Entry {
    char const* name;
    char const* doc;
    std::vector<Arg> args;
    std::function<void(Call&)> check;         // may be empty
    std::function<void(Call const&)> launch;  // runs without the GIL
    bool host = false;  // a host (CPU) kernel: every tensor host memory, no device or stream (step 5)
};

// Adds the entry to the module as a function named entry.name.
void define(pybind11::module_& m, Entry entry);

// Adds `prepare_host_calls`, `HostCalls` and `HOST_ENTRIES` to the module (after every define): host entries'
// calls bound and checked once (steps 1-5), then run again and again on the same tensors by one
// call from Python (step 6 for each, in order, the GIL released once). A CPU decode step's tape
// (runtime/host_tape.py) makes some 200 host calls a step, each of which spent several
// microseconds binding and checking its arguments again.
void defineHostCalls(pybind11::module_& m);

} // namespace tensorrt_llm
