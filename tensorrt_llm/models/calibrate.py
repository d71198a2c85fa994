"""Calibration of FP8 static activation scales and KV cache scales for a LLaMA-family model: the
max |x| of each quantizable linear's input over calibration texts, in our module names
(models/quantize.py turns each into an `input_scale`, formats.fp8_scale_from_amax), and, in the
same pass, each attention layer's K and V maxima (into its `kv_cache_scale`,
formats.kv_cache_scale_from_amax).

The cache holds K after the rotary embedding, which transformers applies outside any module,
so K's maximum is taken over k_proj's output as the largest norm of a rotated pair (dims j and
j + head_dim / 2, the pairs Llama rotates): no rotation of a pair makes either element larger.

It runs the float model as transformers does (a `LlamaForCausalLM`, e.g. the Hugging Face
folder or GGUF file the checkpoint is converted from) with a forward hook on each of its
linears, as TensorRT-LLM's quantization tooling calibrates. Q, K and V read one input, so
their maxima meet in our fused `qkv`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
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


@dataclass
class Calibration:
    """input_amax: our linear name -> float32 [1], the max |x| of its input. kv_cache_amax: our
    attention name (`transformer.layers.N.attention`) -> float32 [2], the max |k| (rotated) and
    |v| its cache would hold."""
    input_amax: dict[str, torch.Tensor] = field(default_factory=dict)
    kv_cache_amax: dict[str, torch.Tensor] = field(default_factory=dict)


def _rotated_pair_amax(k: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The largest sqrt(k[j]^2 + k[j + D/2]^2) over the heads of k [..., heads * D]."""
    heads = k.float().reshape(-1, head_dim)
    half = head_dim // 2
    return torch.hypot(heads[:, :half], heads[:, half:]).amax()


@torch.no_grad()
def calibrate(hf_model: torch.nn.Module, samples: Iterable[list[int]],
              progress: Callable[[int], None] = lambda done: None, kv_cache: bool = False) -> Calibration:
    """The maxima of a calibration run over `samples` (token id lists, one forward pass each;
    `progress(samples done)` after each): every quantizable linear's input, and with
    `kv_cache` every attention layer's K and V."""
    result = Calibration()
    hooks = []
    cfg = hf_model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    def keep_max(table, name, seen):
        seen = seen.detach().float().reshape(-1).cpu()
        table[name] = torch.maximum(table[name], seen) if name in table else seen

    def record_input(name):
        def hook(module, inputs):
            keep_max(result.input_amax, name, inputs[0].detach().abs().amax())
        return hook

    def record_kv(name, which):
        def hook(module, inputs, output):
            seen = _rotated_pair_amax(output, head_dim) if which == 0 else output.detach().abs().amax()
            current = result.kv_cache_amax.setdefault(name, torch.zeros(2))
            current[which] = max(float(current[which]), float(seen))
        return hook

    for hf_name, module in hf_model.named_modules():
        if isinstance(module, torch.nn.Linear) and (name := our_linear_name(hf_name)) is not None:
            hooks.append(module.register_forward_pre_hook(record_input(name)))
            kind = hf_name.rpartition(".")[2]
            if kv_cache and kind in ("k_proj", "v_proj"):
                attention = name.removesuffix(".qkv")
                hooks.append(module.register_forward_hook(record_kv(attention, 0 if kind == "k_proj" else 1)))
    if not _forward_samples(hf_model, samples, hooks, progress):
        raise ValueError("calibration needs at least one sample")
    return result


def _forward_samples(hf_model: torch.nn.Module, samples: Iterable[list[int]], hooks: list,
                     progress: Callable[[int], None]) -> int:
    """One forward pass of `hf_model` per sample (a token id list) with `hooks` (the handles of
    the hooks that record what the calibration keeps) registered, `progress(samples done)`
    after each; the hooks are removed at the end. Returns the number of samples."""
    device = next(hf_model.parameters()).device
    done = 0
    try:
        for ids in samples:
            hf_model(input_ids=torch.tensor([ids], dtype=torch.long, device=device), use_cache=False)
            done += 1
            progress(done)
    finally:
        for h in hooks:
            h.remove()
    return done


def calibrate_input_amax(hf_model: torch.nn.Module, samples: Iterable[list[int]],
                         progress: Callable[[int], None] = lambda done: None) -> dict[str, torch.Tensor]:
    """Our linear name -> float32 [1], the max |x| its input reached over `samples` (calibrate)."""
    return calibrate(hf_model, samples, progress).input_amax


# ------------------------------------------------------------------------------ GPTQ Hessians

# Our linears that share one input (so one Hessian), by the first HF module of each group, in
# the order a decoder layer runs them.
_GROUPS = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.o_proj",),
           ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",))


class _Stop(Exception):
    pass


def _linear_groups(layer_index: int, layer: torch.nn.Module):
    """[(our names, HF modules)] of a decoder layer, one entry a shared input."""
    out = []
    for group in _GROUPS:
        modules = [layer.get_submodule(m) for m in group]
        names = sorted({our_linear_name(f"model.layers.{layer_index}.{m}") for m in group})
        out.append((names, modules))
    return out


@torch.no_grad()
def collect_hessians(hf_model: torch.nn.Module, samples: Iterable[list[int]],
                     quantize_group: Optional[Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]] = None,
                     activation_quant: Optional[Callable[[str, torch.Tensor], torch.Tensor]] = None,
                     progress: Callable[[int], None] = lambda layer: None) -> dict[str, torch.Tensor]:
    """GPTQ's Hessians, our linear name -> float32 [K, K], 2 X^T X / n of its inputs over
    `samples` (one per decoder-layer linear; linears that read one input share it).

    Without `quantize_group`, from the float model in one pass. With it, sequentially (the
    paper's way): layer by layer, and within a layer linear group by group (qkv, dense,
    gate / up, proj), each group's Hessian is taken from inputs that went through every group
    quantized before it; `quantize_group(our name of the group's first linear, the group's
    weights concatenated [N, K] in HF's row order, H)` returns them quantized (dequantized,
    float32, same rows), and they replace the float weights in `hf_model` (which is changed).
    `activation_quant(our name, x)`, when given, is applied to each linear's input before its
    Hessian is taken (and, sequentially, before a quantized linear computes): the W8A8 engine
    computes with FP8-rounded activations."""
    from ..quantization.gptq import HessianAccumulator
    layers = hf_model.model.layers
    device = next(hf_model.parameters()).device
    acc: dict[str, HessianAccumulator] = {}

    def record(names):
        def hook(module, inputs):
            x = inputs[0].detach()
            if activation_quant is not None:
                x = activation_quant(names[0], x)
            acc.setdefault(names[0], HessianAccumulator(x.shape[-1])).add(x)
        return hook

    result: dict[str, torch.Tensor] = {}

    def finish(names):
        h = acc.pop(names[0]).hessian()
        for name in names:
            result[name] = h
        return h

    if quantize_group is None:
        groups = [g for i, layer in enumerate(layers) for g in _linear_groups(i, layer)]
        _forward_samples(hf_model, samples, [modules[0].register_forward_pre_hook(record(names))
                                             for names, modules in groups], progress)
        for names, _ in groups:
            finish(names)
        return result

    # Sequential: each sample's input of layer 0 (and its keyword arguments), then layer by layer.
    cache = []

    def capture(module, args, kwargs):
        cache.append((args[0] if args else kwargs.pop("hidden_states"), {k: v for k, v in kwargs.items()}))
        raise _Stop

    handle = layers[0].register_forward_pre_hook(capture, with_kwargs=True)
    try:
        for ids in samples:
            try:
                hf_model(input_ids=torch.tensor([ids], dtype=torch.long, device=device), use_cache=False)
            except _Stop:
                pass
    finally:
        handle.remove()
    if not cache:
        raise ValueError("calibration needs at least one sample")

    def run_layer(layer, hidden, kwargs):
        out = layer(hidden, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    for i, layer in enumerate(layers):
        for names, modules in _linear_groups(i, layer):
            handle = modules[0].register_forward_pre_hook(record(names))
            try:
                for hidden, kwargs in cache:
                    run_layer(layer, hidden, kwargs)
            finally:
                handle.remove()
            h = finish(names)
            weight = torch.cat([m.weight.float() for m in modules])
            quantized = quantize_group(names[0], weight, h).to(weight.device)
            for m, part in zip(modules, torch.split(quantized, [m.weight.shape[0] for m in modules])):
                m.weight.copy_(part.to(m.weight.dtype))
                if activation_quant is not None:
                    m.forward = _quantized_input_forward(m, names[0], activation_quant)
        cache = [(run_layer(layer, hidden, kwargs), kwargs) for hidden, kwargs in cache]
        progress(i + 1)
    return result


def _quantized_input_forward(module: torch.nn.Linear, name: str, activation_quant):
    def forward(x):
        return torch.nn.functional.linear(activation_quant(name, x).to(x.dtype), module.weight, module.bias)
    return forward
