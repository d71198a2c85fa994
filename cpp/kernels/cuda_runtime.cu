// Device selection and pointer checks for the bindings (CUDA build).
#include "common.cuh"

#include <stdexcept>
#include <string>

namespace tensorrt_llm {

bool cudaKernelsCompiled() { return true; }

static void throwCuda(cudaError_t err, std::string const& what) {
    throw std::runtime_error(what + ": CUDA error: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

int prepareDevice(int device, std::vector<NamedPointer> const& pointers, void* stream) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        cudaGetLastError();  // clear the sticky-free error so later calls start clean
        throwCuda(err, "tensorrt_llm.bindings: cannot use CUDA");
    }
    if (device < 0 || device >= count) {
        throw std::invalid_argument("tensorrt_llm.bindings: device " + std::to_string(device) + " does not exist ("
                                    + std::to_string(count) + " CUDA device(s) visible)");
    }
    int current = -1;
    err = cudaGetDevice(&current);
    if (err != cudaSuccess) throwCuda(err, "cudaGetDevice");
    if (current != device) {
        // PyTorch has its own CUDA runtime; the driver's current context is shared. Follow the
        // tensors' device for the launch; the caller restores `current` afterwards.
        err = cudaSetDevice(device);
        if (err != cudaSuccess) throwCuda(err, "cudaSetDevice(" + std::to_string(device) + ")");
    }
    struct Restore {  // on a failed check below, put the previous device back
        int previous;
        int device;
        bool armed = true;
        ~Restore() {
            if (armed && previous != device) restoreDevice(previous);
        }
    } restore{current, device};

    // Pointer checks query the driver; skip them while the stream is being captured into a CUDA
    // graph (the Python wrapper has checked the tensors' devices, and pinned ones, already).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    err = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture);
    if (err != cudaSuccess) throwCuda(err, "cudaStreamIsCapturing (is the stream valid?)");
    if (capture != cudaStreamCaptureStatusNone) {
        restore.armed = false;
        return current;
    }

    for (auto const& np : pointers) {
        if (np.ptr == nullptr) continue;  // empty tensors
        if (np.pinnedHost) {  // its first and last bytes: page-locked host memory (pageable memory: cudaMemoryTypeUnregistered)
            for (char const* at : {static_cast<char const*>(np.ptr), static_cast<char const*>(np.ptr) + np.bytes - 1}) {
                cudaPointerAttributes attr{};
                err = cudaPointerGetAttributes(&attr, at);
                if (err != cudaSuccess) {
                    cudaGetLastError();
                    throwCuda(err, np.name + ": cudaPointerGetAttributes");
                }
                if (attr.type != cudaMemoryTypeHost) {
                    throw std::invalid_argument(np.name + " is not page-locked host memory (pin it: tensor.pin_memory())");
                }
            }
            continue;
        }
        cudaPointerAttributes attr{};
        err = cudaPointerGetAttributes(&attr, np.ptr);
        if (err != cudaSuccess) {
            cudaGetLastError();
            throwCuda(err, np.name + ": cudaPointerGetAttributes");
        }
        bool const onDevice = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
        if (!onDevice) {
            throw std::invalid_argument(np.name + " is not CUDA device memory (a host pointer was given)");
        }
        if (attr.type == cudaMemoryTypeDevice && attr.device != device) {
            throw std::invalid_argument(np.name + " is on cuda:" + std::to_string(attr.device) + ", expected cuda:"
                                        + std::to_string(device));
        }
    }
    restore.armed = false;
    return current;
}

void restoreDevice(int previous) noexcept {
    int current = -1;
    if (previous >= 0 && cudaGetDevice(&current) == cudaSuccess && current != previous) {
        cudaSetDevice(previous);
    }
}

} // namespace tensorrt_llm
