"""Which implementation runs each graph op on a given device.

The reference ops (plain PyTorch) are the meaning of every op and run everywhere; on a
GPU, ops with a compiled kernel are swapped for it when the compiled module is present.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..reference_ops import REFERENCE_OPS


def ops_for_device(device: torch.device) -> dict[str, Callable]:
    ops = dict(REFERENCE_OPS)
    if device.type == "cuda":
        from .cuda_ops import CUDA_OPS  # needs the compiled module only on a GPU
        ops.update(CUDA_OPS)
    return ops
