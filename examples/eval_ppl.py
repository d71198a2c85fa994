"""Perplexity of engines over the project's articles (examples/data/summarize_articles.jsonl):
the accuracy measure of quantized engines against the float one (issue #17).

    python examples/eval_ppl.py --engine_dir engines/float --engine_dir engines/fp8 \
        --tokenizer_dir ckpt/float

Each article's first --max_tokens tokens (all of them by default: 80-125 in SmolLM2's
tokenizer) go through one context pass; the perplexity is exp of the mean next-token cross
entropy over every predicted token of every article (teacher forcing). The first engine is the
baseline: each other engine's perplexity is also given relative to it. The tokenizer is the
first engine folder's when it holds one, else --tokenizer_dir's.

This module is also the one home of the perplexity and of the article texts that
benchmarks/bench_generation.py, examples/quantization/quantize.py (calibration) and
examples/summarize.py (articles and highlights) read.
A bad engine, tokenizer or data file ends in one "error:" line (exit code 2); --debug shows
its traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

PROG = "eval_ppl.py"
ARTICLES = Path(__file__).resolve().parent / "data" / "summarize_articles.jsonl"


def read_rows(path=ARTICLES, fields=("article",)) -> list[dict]:
    """The objects of a JSON-lines file, each with a text under every name in `fields`
    (ConfigError, one line, naming a bad line); examples/summarize.py reads its articles and
    highlights through it too."""
    from tensorrt_llm.errors import ConfigError
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path} line {number} is not valid JSON ({e})") from None
            if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in fields):
                texts = f"an {fields[0]!r} text" if len(fields) == 1 else " and ".join(map(repr, fields)) + " texts"
                raise ConfigError(f"{path} line {number} is not an object with {texts}")
            rows.append(row)
    if not rows:
        raise ConfigError(f"{path} holds no articles")
    return rows


def read_articles(path=ARTICLES) -> list[str]:
    """The `article` texts of a JSON-lines file."""
    return [row["article"] for row in read_rows(path)]


def article_token_ids(tokenizer, count: int | None = None, max_tokens: int | None = None,
                      path=ARTICLES) -> list[list[int]]:
    """The first `max_tokens` token ids (all when None) of the first `count` articles (all)."""
    return [tokenizer(text)["input_ids"][:max_tokens] for text in read_articles(path)[:count]]


def perplexity(runner, prompts) -> float:
    """exp of the mean next-token cross entropy over the prompts (teacher forcing: one
    context pass each, its logits)."""
    return perplexity_of(
        lambda prompt: runner.generate([prompt], max_new_tokens=1, return_context_logits=True)["context_logits"][0],
        prompts)


def perplexity_of(context_logits, prompts) -> float:
    """perplexity() with the logits of each prompt's positions [len, vocab] from `context_logits(prompt)`
    (an engine's context pass, or another model's forward)."""
    total, tokens = 0.0, 0
    for prompt in prompts:
        logits = context_logits(prompt)
        target = torch.as_tensor(prompt[1:], dtype=torch.long)
        total += float(torch.nn.functional.cross_entropy(logits[:-1].float().cpu(), target, reduction="sum"))
        tokens += len(target)
    return float(torch.exp(torch.tensor(total / tokens)))


def parse_args(argv=None) -> argparse.Namespace:
    from tensorrt_llm.cli import add_debug_argument
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine_dir", action="append", required=True,
                   help="engine folder; repeat to compare engines (the first is the baseline)")
    p.add_argument("--tokenizer_dir", help="tokenizer folder or .gguf file (default: the first engine folder)")
    p.add_argument("--data_file", default=str(ARTICLES), help="JSON lines with an 'article' text each")
    p.add_argument("--num_articles", type=int, default=None, help="the first N articles (default: all)")
    p.add_argument("--max_tokens", type=int, default=None, help="tokens kept per article (default: all)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--json", default=None, help="write the results here as JSON")
    add_debug_argument(p)
    args = p.parse_args(argv)
    for name in ("num_articles", "max_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 2:
            p.error(f"--{name} must be >= 2")
    return args


def main(argv=None) -> int:
    from tensorrt_llm.errors import ConfigError
    from tensorrt_llm.runtime import ModelRunner
    from tensorrt_llm.tokenizer_utils import TOKENIZER_FILES, load_tokenizer
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    first = Path(args.engine_dir[0])
    if args.tokenizer_dir:
        tokenizer = load_tokenizer(args.tokenizer_dir)
    elif any((first / n).is_file() for n in TOKENIZER_FILES):
        tokenizer = load_tokenizer(first)
    else:
        raise ConfigError(f"no tokenizer: {first} has none; pass --tokenizer_dir")
    prompts = article_token_ids(tokenizer, args.num_articles, args.max_tokens, args.data_file)
    predicted = sum(len(p) - 1 for p in prompts)
    print(f"{len(prompts)} articles from {args.data_file}, {predicted} predicted tokens, on {device}")
    results = []  # (engine folder, perplexity), in the order given
    for engine_dir in args.engine_dir:
        runner = ModelRunner.from_dir(engine_dir, device=device)
        results.append((engine_dir, perplexity(runner, prompts)))
        del runner
        (base_dir, base), ppl = results[0], results[-1][1]
        change = f" ({100 * (ppl / base - 1):+.2f}% vs {base_dir})" if len(results) > 1 else ""
        print(f"{engine_dir}: perplexity {ppl:.3f}{change}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"tokens": predicted, "engines": [
            {"engine_dir": d, "perplexity": p} for d, p in results]}, indent=2))
    return 0


def cli() -> int:
    from tensorrt_llm.cli import run_cli
    return run_cli(main, PROG)


if __name__ == "__main__":
    sys.exit(cli())
