"""Calibration of FP8 static activation scales for a LLaMA-family model: the max |x| of each
quantizable linear's input over calibration texts, in our module names (models/quantize.py
turns each into an `input_scale`, formats.fp8_scale_from_amax).

It runs the float model as transformers does (a `LlamaForCausalLM`, e.g. the Hugging Face
folder or GGUF file the checkpoint is converted from) with a forward hook on each of its
linears, as TensorRT-LLM's quantization tooling calibrates. Q, K and V read one input, so
their maxima meet in our fused `qkv`.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch

# Hugging Face Llama module (within a layer) -> ours.
_LINEARS = {"self_attn.q_proj": "attention.qkv", "self_attn.k_proj": "attention.qkv",
            "self_attn.v_proj": "attention.qkv", "self_attn.o_proj": "attention.dense",
            "mlp.gate_proj": "mlp.gate", "mlp.up_proj": "mlp.fc", "mlp.down_proj": "mlp.proj"}


def our_linear_name(hf_name: str) -> Optional[str]:
    """`model.layers.3.mlp.down_proj` -> `transformer.layers.3.mlp.proj`; `lm_head` -> itself;
    None for a module that is no quantizable linear."""
    if hf_name == "lm_head":
        return hf_name
    if not hf_name.startswith("model.layers."):
        return None
    layer, _, module = hf_name.removeprefix("model.layers.").partition(".")
    return f"transformer.layers.{layer}.{_LINEARS[module]}" if module in _LINEARS else None


@torch.no_grad()
def calibrate_input_amax(hf_model: torch.nn.Module, samples: Iterable[list[int]],
                         progress: Callable[[int], None] = lambda done: None) -> dict[str, torch.Tensor]:
    """Our linear name -> float32 [1], the max |x| its input reached over `samples` (token id
    lists, one forward pass each); `progress(samples done)` after each."""
    amax: dict[str, torch.Tensor] = {}
    hooks = []

    def record(name):
        def hook(module, inputs):
            seen = inputs[0].detach().abs().amax().float().reshape(1).cpu()
            amax[name] = torch.maximum(amax[name], seen) if name in amax else seen
        return hook

    for hf_name, module in hf_model.named_modules():
        if isinstance(module, torch.nn.Linear) and (name := our_linear_name(hf_name)) is not None:
            hooks.append(module.register_forward_pre_hook(record(name)))
    device = next(hf_model.parameters()).device
    try:
        done = 0
        for ids in samples:
            hf_model(input_ids=torch.tensor([ids], dtype=torch.long, device=device))
            done += 1
            progress(done)
    finally:
        for h in hooks:
            h.remove()
    if not done:
        raise ValueError("calibration needs at least one sample")
    return amax
