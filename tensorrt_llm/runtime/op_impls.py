"""Which implementation runs each graph op on a given device.

The reference ops (plain PyTorch) are the meaning of every op and run everywhere; on a
GPU, ops with a compiled kernel are swapped for it when the compiled module is present.
Where an op has several implementations, the builder may time them on the target device
(tensorrt_llm/timing_cache.py) and record its pick in the layer's attrs as
`implementation`; the Session then runs that one.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..engine_check import CUDA, REFERENCE
from ..reference_ops import REFERENCE_OPS


def implementations(device: torch.device) -> dict[str, dict[str, Callable]]:
    """op -> {implementation name: function} on `device`; the first name is the default."""
    table = {op: {REFERENCE: fn} for op, fn in REFERENCE_OPS.items()}
    if device.type == "cuda":
        from .cuda_ops import CUDA_OPS  # needs the compiled module only on a GPU
        for op, fn in CUDA_OPS.items():
            table[op] = {CUDA: fn, **table[op]}
    return table


def ops_for_device(device: torch.device) -> dict[str, Callable]:
    """The default implementation of every op on `device`."""
    return {op: next(iter(impls.values())) for op, impls in implementations(device).items()}
