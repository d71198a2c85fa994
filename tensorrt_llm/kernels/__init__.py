"""Compiled kernels (tensorrt_llm.bindings) as torch.library custom ops, with their references.

    from tensorrt_llm import kernels
    out = kernels.rms_norm(x, weight, 1e-6)                 # torch.ops.trtllm.rms_norm
    out, summed = kernels.rms_norm(x, weight, 1e-6, residual)
    kernels.rotary_embedding_(q, k, positions, cos_sin_cache, is_neox=True)
    y = kernels.silu_and_mul(x); y = kernels.gelu_and_mul(x, "tanh")
    kernels.paged_kv_write_(key, value, kv_cache, block_tables, cu_seqlens, past_lengths)

CPU tensors run the PyTorch references (kernels.reference); CUDA tensors run the compiled
kernels. `build_info()` says what the compiled module holds.
"""
from . import reference
from ._bindings import bindings_available, build_info, cuda_kernels_available, get_bindings
from .ops import decode_attention, gelu_and_mul, paged_kv_write_, rms_norm, rotary_embedding_, silu_and_mul
from .reference import rope_cos_sin_cache

__all__ = [
    "bindings_available", "build_info", "cuda_kernels_available", "decode_attention", "gelu_and_mul", "get_bindings",
    "paged_kv_write_", "reference", "rms_norm", "rope_cos_sin_cache", "rotary_embedding_", "silu_and_mul",
]
