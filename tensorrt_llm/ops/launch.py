"""Calling the compiled kernels (`tensorrt_llm.bindings`) with torch tensors.

    launch("silu_and_mul", out, x)

calls the binding entry `silu_and_mul` with each torch.Tensor as the tuple the binding takes,
`(data_ptr, dtype_code, shape, strides, device)` (strides in elements, device -1 for host
memory), None and plain values as they are, and the current CUDA stream of the first tensor's
device as `stream` (host kernels, on CPU tensors, take none). The binding checks every argument
(cpp/bindings: each entry's argument spec) before anything reaches the kernel; nothing is
checked again here.

The module is loaded lazily, so that `import tensorrt_llm` never needs it.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import torch

_BUILD_HINT = ("build it with `python build_wheel.py` (or `make wheel`) from the repository root, "
               "or install a tensorrt_llm wheel")


@functools.lru_cache(maxsize=None)
def _load() -> tuple[Optional[Any], Optional[str]]:
    try:
        from tensorrt_llm import bindings  # noqa: PLC0415  (the compiled module)
    except ImportError as e:
        return None, f"tensorrt_llm.bindings cannot be imported ({e}); {_BUILD_HINT}"
    return bindings, None


def get_bindings():
    """The compiled module; ImportError with the way to build it when it is missing."""
    module, error = _load()
    if module is None:
        raise ImportError(error)
    return module


def bindings_available() -> bool:
    return _load()[0] is not None


def cuda_kernels_available() -> bool:
    """True when the compiled module holds the CUDA kernels (whether or not a GPU is present)."""
    module, _ = _load()
    return module is not None and bool(module.cuda_kernels_compiled)


def cuda_capability(device: "torch.device | int | None" = None) -> tuple[int, int]:
    """The compute capability (major, minor) of a CUDA device (None, or a device without an index:
    the current one), looked up once per device: the kernels' dispatch asks on every call."""
    if isinstance(device, torch.device):
        device = device.index
    return _capability(torch.cuda.current_device() if device is None else device)


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))


def build_info() -> dict:
    """`tensorrt_llm.bindings.build_info()`; ImportError when the module is not built."""
    return get_bindings().build_info()


_TORCH_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.int8: "int8",     # INT8 KV cache codes
    torch.uint8: "uint8",   # FP8 KV cache codes' bytes
}


@functools.lru_cache(maxsize=None)
def _dtype_codes() -> dict:
    """torch dtype -> the binding's code, for the dtypes this build's bindings take."""
    codes = get_bindings().DTYPES
    return {dtype: codes[name] for dtype, name in _TORCH_DTYPE_NAMES.items() if name in codes}


def dtype_code(dtype: torch.dtype) -> Optional[int]:
    """The binding's code for a torch dtype; None for a dtype no kernel takes."""
    return _dtype_codes().get(dtype)


def tensor_arg(t: torch.Tensor) -> tuple:
    """The (data_ptr, dtype_code, shape, strides, device) tuple the bindings take for a tensor."""
    code = _dtype_codes().get(t.dtype)
    if code is None:
        raise TypeError(f"tensorrt_llm kernels do not take {t.dtype} tensors")
    if not t.is_cuda:
        return (t.data_ptr(), code, tuple(t.shape), t.stride(), -1)
    device = t.device.index
    return (t.data_ptr(), code, tuple(t.shape), t.stride(), torch.cuda.current_device() if device is None else device)


def stream_of(t: torch.Tensor) -> int:
    """The raw handle of the current CUDA stream of t's device. Through torch's raw accessor, as
    Triton's launcher does: torch.cuda.current_stream builds a Stream object (a device lookup and
    a few us on the host each time), and a 2,048-token prompt step makes some 200 launches."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:  # a torch without it
        return torch.cuda.current_stream(t.device).cuda_stream
    return raw(t.device.index)


# While a host tape records a CPU decode step (runtime/host_tape.py): the list each call is
# appended to, as (binding function, converted positional args, converted named args, the
# tensors, which the tape keeps alive so that the recorded addresses stay theirs).
recording: Optional[list] = None


def launch(kernel: str, *args, **kwargs) -> None:
    """Call binding entry `kernel`: tensors as tensor tuples, on the current stream of the
    first tensor's device (see the module's docstring); a host kernel (CPU tensors) takes no
    stream. (A loop, not comprehensions: a CPU decode step makes some 200 launches.)"""
    # New names: args and kwargs keep the tensors alive through the call (a temporary argument's
    # host memory, once freed, is reused at once; CUDA memory only in stream order).
    first = None
    positional = []
    for a in args:
        if isinstance(a, torch.Tensor):
            first = a if first is None else first
            a = tensor_arg(a)
        positional.append(a)
    named = {}
    for name, a in kwargs.items():
        if isinstance(a, torch.Tensor):
            first = a if first is None else first
            a = tensor_arg(a)
        named[name] = a
    if first.is_cuda:
        named["stream"] = stream_of(first)
    fn = getattr(get_bindings(), kernel)
    if recording is not None:
        recording.append((fn, tuple(positional), named, (args, kwargs)))
    fn(*positional, **named)


def rows(t: torch.Tensor) -> torch.Tensor:
    """t viewed as [rows, last] with a unit last stride (copied only when no such view exists):
    the layout of the row-wise kernels (norms, gated activations). A 2D t that has it is returned
    as it is (a reshape costs a few us, and a CPU decode step makes some 200 such calls)."""
    if t.dim() == 2 and (t.shape[-1] <= 1 or t.stride(-1) == 1):
        return t
    t2 = t.reshape(-1, t.shape[-1])
    if t2.shape[-1] > 1 and t2.stride(-1) != 1:
        t2 = t2.contiguous()
    return t2
