"""The compiled kernels (tensorrt_llm.bindings) as torch.library custom ops, one by name.

    from tensorrt_llm import kernels
    out = kernels.rms_norm(x, weight, 1e-6)                 # torch.ops.trtllm.rms_norm
    out, summed = kernels.rms_norm(x, weight, 1e-6, residual)
    kernels.rotary_embedding_(q, k, positions, cos_sin_cache, is_neox=True)
    y = kernels.silu_and_mul(x); y = kernels.gelu_and_mul(x, "tanh")
    kernels.paged_kv_write_(key, value, kv_cache, block_tables, cu_seqlens, past_lengths)
    tokens = kernels.top_k_top_p_sample(logits, temperature, top_k, top_p, torch.rand(B))  # int32 [B]
    tokens = kernels.argmax_rows(logits)                    # greedy: int32 [B]
    y = kernels.gemv(x, w); y, summed = kernels.rms_norm_gemv(x, norm_w, w, None, 1e-6, residual)
    y = kernels.silu_and_mul_gemv(x, w)   # a linear layer of 1..4 rows with its input's op fused

CPU tensors run the references (the op's, in tensorrt_llm.ops, or kernels.reference for the
kernels that compute no op of their own); CUDA tensors run the compiled kernels.
`build_info()` says what the compiled module holds.
"""
from ..ops.launch import bindings_available, build_info, cuda_kernels_available, get_bindings
from ..ops.rotary import rope_cos_sin_cache
from . import reference
from .ops import (
    argmax_rows,
    decode_attention,
    gelu_and_mul,
    gemv,
    gemv_supported,
    paged_kv_write_,
    rms_norm,
    rms_norm_gemv,
    rotary_embedding_,
    silu_and_mul,
    silu_and_mul_gemv,
    top_k_top_p_sample,
)

__all__ = [
    "argmax_rows", "bindings_available", "build_info", "cuda_kernels_available", "decode_attention", "gelu_and_mul",
    "gemv", "gemv_supported", "get_bindings", "paged_kv_write_", "reference", "rms_norm", "rms_norm_gemv",
    "rope_cos_sin_cache", "rotary_embedding_", "silu_and_mul", "silu_and_mul_gemv", "top_k_top_p_sample",
]
