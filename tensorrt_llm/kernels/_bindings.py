"""Loading tensorrt_llm.bindings lazily, so that `import tensorrt_llm` never needs it."""
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


def build_info() -> dict:
    """`tensorrt_llm.bindings.build_info()`; ImportError when the module is not built."""
    return get_bindings().build_info()


_TORCH_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.int64: "int64",
}


def tensor_arg(t: torch.Tensor) -> tuple:
    """The (data_ptr, dtype_code, shape, strides, device) tuple the bindings take for a tensor."""
    name = _TORCH_DTYPE_NAMES.get(t.dtype)
    if name is None:
        raise TypeError(f"tensorrt_llm kernels do not take {t.dtype} tensors")
    device = t.device.index if t.device.type == "cuda" else -1
    if t.device.type == "cuda" and device is None:
        device = torch.cuda.current_device()
    return (t.data_ptr(), get_bindings().DTYPES[name], tuple(t.shape), tuple(t.stride()), device)


def stream_of(t: torch.Tensor) -> int:
    """The raw handle of the current CUDA stream of t's device."""
    return torch.cuda.current_stream(t.device).cuda_stream
