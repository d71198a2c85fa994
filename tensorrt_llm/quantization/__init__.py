"""Quantization: the checkpoint `quantization` section, the quantized-weight formats, loaders
for AWQ / GPTQ / GGUF weights, and CPU weight-only linears.

- `mode`: `QuantAlgo`, `QuantConfig` (read / written as a checkpoint's `quantization`),
  `LayerQuant`, `check_device_support`.
- `formats`: `Int8Weight`, `Int4Weight`, `Fp8Weight` (layouts in its docstring), quantizers,
  `dequantize`, `quantized_linear_reference` (what every kernel must compute), KV-cache
  quantization, checkpoint tensor names.
- `awq_gptq`: AutoAWQ (GEMM) and AutoGPTQ folders -> INT4, exactly.
- `gguf_quant`: GGUF Q8_0, Q4_0, Q4_1, Q4_K, Q6_K blocks -> INT8 / INT4, exactly.
- `cpu`: `int8_weight_only_linear`, `int4_weight_only_linear` over torch's CPU kernels.

This package imports only torch, numpy, safetensors (gguf is not needed) and the foundation
layer (`errors`).
"""
from .formats import (
    Fp8Weight,
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
    dequantize,
    from_state_dict,
    quantize,
    quantize_fp8,
    quantize_int4,
    quantize_int8,
    quantized_linear_reference,
    to_state_dict,
)
from .mode import LayerQuant, QuantAlgo, QuantConfig, check_device_support

__all__ = [
    "LayerQuant", "QuantAlgo", "QuantConfig", "check_device_support",
    "Fp8Weight", "Int4Weight", "Int8Weight", "QuantizedWeight", "dequantize", "from_state_dict",
    "quantize", "quantize_fp8", "quantize_int4", "quantize_int8", "quantized_linear_reference",
    "to_state_dict",
]
