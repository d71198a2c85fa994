"""Dtype names <-> torch dtypes, and small helpers shared across the package.

Graphs, configs and engines spell dtypes as strings; only this module maps them.
"""
from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path
from typing import Union

import torch

_STR_TO_TORCH = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
_TORCH_TO_STR = {v: k for k, v in _STR_TO_TORCH.items()}

# Common spellings from configs (Hugging Face `torch_dtype`, numpy) that mean the same.
_ALIASES = {"float": "float32", "fp32": "float32", "half": "float16", "fp16": "float16",
            "bf16": "bfloat16", "int": "int32", "long": "int64"}

DtypeLike = Union[str, torch.dtype]


def str_dtype_to_torch(dtype: str) -> torch.dtype:
    name = _ALIASES.get(dtype, dtype)
    if name not in _STR_TO_TORCH:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_STR_TO_TORCH)}")
    return _STR_TO_TORCH[name]


def torch_dtype_to_str(dtype: torch.dtype) -> str:
    if dtype not in _TORCH_TO_STR:
        raise ValueError(f"unsupported torch dtype {dtype}; expected one of {sorted(_STR_TO_TORCH)}")
    return _TORCH_TO_STR[dtype]


def canonical_dtype(dtype: DtypeLike) -> str:
    """The graph spelling of a dtype given either as a string or a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return torch_dtype_to_str(dtype)
    return torch_dtype_to_str(str_dtype_to_torch(dtype))


def dtype_size(dtype: DtypeLike) -> int:
    """Bytes per element."""
    return torch.empty((), dtype=str_dtype_to_torch(canonical_dtype(dtype))).element_size()


def is_floating(dtype: DtypeLike) -> bool:
    return str_dtype_to_torch(canonical_dtype(dtype)).is_floating_point


def keep_freed_host_memory(max_block_bytes: int = 1 << 26) -> bool:
    """Make glibc keep freed blocks of up to `max_block_bytes` in the heap.

    By default blocks over ~128 KiB are mmap'ed and unmapped on free, so every large
    temporary of an op faults its pages in afresh; in VMs where a page fault is slow this
    made a CPU decode step an order of magnitude slower. Process-wide; returns False where
    it does not apply (not Linux/glibc).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return (bool(libc.mallopt(m_mmap_threshold, max_block_bytes))
            and bool(libc.mallopt(m_trim_threshold, 4 * max_block_bytes)))


def read_json_object(path, error: type[Exception], advice: str = "") -> dict:
    """The JSON object in file `path`; `error` (with `advice` appended) when the file is not
    JSON or holds another JSON value. The file may be anyone's: nothing else escapes."""
    try:
        value = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path} is not valid JSON ({' '.join(str(e).split())}){advice}") from None
    if not isinstance(value, dict):
        raise error(f"{path} is a JSON {type(value).__name__}, not an object{advice}")
    return value
