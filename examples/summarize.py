"""Summarise news articles with an engine and/or transformers; report ROUGE and tokens/s.

    python examples/summarize.py --engine_dir engines/smollm2 \
        --hf_model_dir DIR --hf_gguf_file SmolLM2-135M-Instruct.Q4_1.gguf \
        --test_trt_llm --test_hf --batch_size 2 --max_ite 4 --output_len 48 \
        --check_accuracy --tensorrt_llm_rouge1_threshold 15

Both backends get the same prompts (the tokenizer's chat template around "Summarize:" and
the article) and decode greedily, so a ROUGE difference between them measures the engine,
not the sampling. --engine_dir may be repeated to compare engines (float and quantized ones
of one model, issue #17): each is reported as "TensorRT-LLM (its folder)", with its ROUGE-1
difference from the first:

    python examples/summarize.py --test_trt_llm --engine_dir engines/float \
        --engine_dir engines/int8 --engine_dir engines/fp8 --tokenizer_dir ckpt/float

With its difference come the standard deviation and standard error of the per-summary
differences and how many summaries are token for token the first's: one changed token early
in a greedy summary changes the rest of it, so a few articles can move the mean by points.
--json writes every backend's scores, per-summary ROUGE-1, token ids and summaries.

The articles are examples/data/summarize_articles.jsonl (see the README there).
--check_accuracy exits with status 1 when the engine's ROUGE-1 is below
--tensorrt_llm_rouge1_threshold. A bad engine, model or data file ends in one "error:" line
(exit code 2); --debug shows its traceback.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/: eval_ppl's reader of the articles

from eval_ppl import ARTICLES, read_rows  # noqa: E402

PROG = "summarize.py"
ROUGE_KEYS = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def parse_args(argv=None) -> argparse.Namespace:
    from tensorrt_llm.cli import add_debug_argument
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine_dir", action="append", default=[],
                   help="engine folder (for --test_trt_llm); repeat to compare engines")
    p.add_argument("--hf_model_dir", help="Hugging Face model folder, or a .gguf file (for --test_hf)")
    p.add_argument("--hf_gguf_file", help="name of the GGUF file inside --hf_model_dir")
    p.add_argument("--tokenizer_dir", help="tokenizer folder or .gguf file (default: the engine "
                                           "folder if it holds one, else the Hugging Face model)")
    p.add_argument("--test_trt_llm", action="store_true", help="summarise with the engine")
    p.add_argument("--test_hf", action="store_true", help="summarise with transformers")
    p.add_argument("--data_file", default=str(ARTICLES), help="JSON lines with 'article' and 'highlights'")
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--max_ite", type=int, default=20, help="batches to run")
    p.add_argument("--output_len", type=int, default=100, help="new tokens at most per summary")
    p.add_argument("--max_input_length", type=int, default=400, help="article tokens kept at most")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--show_summaries", type=int, default=1, help="summaries to print per backend")
    p.add_argument("--json", default=None, help="write each backend's scores, per-summary ROUGE-1 and summaries here")
    p.add_argument("--check_accuracy", action="store_true")
    p.add_argument("--tensorrt_llm_rouge1_threshold", type=float, default=15.0)
    add_debug_argument(p)
    args = p.parse_args(argv)
    if not (args.test_trt_llm or args.test_hf):
        p.error("choose --test_trt_llm and/or --test_hf")
    if args.test_trt_llm and not args.engine_dir:
        p.error("--test_trt_llm needs --engine_dir")
    if args.test_hf and not args.hf_model_dir:
        p.error("--test_hf needs --hf_model_dir")
    if args.check_accuracy and not args.test_trt_llm:
        p.error("--check_accuracy checks the engine: add --test_trt_llm")
    if min(args.batch_size, args.max_ite, args.output_len, args.max_input_length) < 1:
        p.error("--batch_size, --max_ite, --output_len and --max_input_length must be >= 1")
    return args


def hf_source(args) -> tuple[str, str | None]:
    """(folder, GGUF file name or None) of the Hugging Face model."""
    path = Path(args.hf_model_dir)
    if path.suffix == ".gguf":
        return str(path.parent), path.name
    return str(path), args.hf_gguf_file


def load_tokenizer_for(args):
    from tensorrt_llm.errors import ConfigError
    from tensorrt_llm.tokenizer_utils import TOKENIZER_FILES, load_tokenizer
    if args.tokenizer_dir:
        return load_tokenizer(args.tokenizer_dir)
    if args.engine_dir and any((Path(args.engine_dir[0]) / n).is_file() for n in TOKENIZER_FILES):
        return load_tokenizer(args.engine_dir[0])
    if args.hf_model_dir:
        folder, gguf = hf_source(args)
        return load_tokenizer(Path(folder) / gguf if gguf else folder)
    raise ConfigError("no tokenizer: the engine folder has none; pass --tokenizer_dir")


def load_articles(path, count: int) -> list[dict]:
    """The first `count` rows of the data file (eval_ppl.py's reader), each with an article
    and its highlights."""
    rows = read_rows(path, ("article", "highlights"))
    if len(rows) < count:
        print(f"note: {path} has {len(rows)} articles, fewer than the {count} asked for", file=sys.stderr)
    return rows[:count]


def prompt_ids(tokenizer, article: str, max_input_length: int) -> list[int]:
    ids = tokenizer.encode(article, add_special_tokens=False)
    if len(ids) > max_input_length:
        article = tokenizer.decode(ids[:max_input_length])
    messages = [{"role": "user", "content": f"Summarize:\n{article}"}]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return tokenizer.encode(messages[0]["content"])


def until_end(tokens: list[int], end_id: int) -> list[int]:
    """The generated tokens up to and including the first end id (how both backends count)."""
    return tokens[:tokens.index(end_id) + 1] if end_id in tokens else tokens


def run_trt_llm(engine_dir, args, batches, end_id, pad_id, device):
    from tensorrt_llm.runtime import ModelRunner
    runner = ModelRunner.from_dir(engine_dir, device=device)
    outputs, seconds = [], 0.0
    for batch in batches:
        t0 = time.perf_counter()
        out = runner.generate([torch.tensor(p, dtype=torch.int32) for p in batch],
                              max_new_tokens=args.output_len, end_id=end_id, pad_id=pad_id, top_k=1)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - t0
        for b, p in enumerate(batch):
            n = int(out["sequence_lengths"][b, 0])
            outputs.append(until_end(out["output_ids"][b, 0, len(p):n].tolist(), end_id))
    return outputs, seconds


@torch.no_grad()
def run_hf(args, batches, end_id, pad_id, device):
    import transformers
    transformers.utils.logging.disable_progress_bar()  # GGUF dequantisation draws one per tensor
    folder, gguf = hf_source(args)
    kwargs = {"gguf_file": gguf} if gguf else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs)
    model = model.to(device).eval()
    outputs, seconds = [], 0.0
    for batch in batches:
        width = max(len(p) for p in batch)
        # Left padding: every prompt ends where generation starts.
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.output_len,
                             do_sample=False, top_k=None, top_p=None, temperature=None,
                             eos_token_id=end_id, pad_token_id=pad_id)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - t0
        outputs += [until_end(row[width:].tolist(), end_id) for row in out]
    return outputs, seconds


def rouge_per_summary(predictions: list[str], references: list[str]) -> list[dict[str, float]]:
    """Each summary's ROUGE F-measures, in points (0-100)."""
    from rouge_score import rouge_scorer
    scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)
    return [{k: 100 * s[k].fmeasure for k in ROUGE_KEYS}
            for s in (scorer.score(ref, pred) for pred, ref in zip(predictions, references))]


def rouge(predictions: list[str], references: list[str]) -> dict[str, float]:
    """Mean ROUGE F-measures, in points (0-100)."""
    scores = rouge_per_summary(predictions, references)
    return {k: sum(s[k] for s in scores) / len(scores) for k in ROUGE_KEYS}


def paired_spread(ours: list[float], base: list[float]) -> tuple[float, float]:
    """(standard deviation, standard error of the mean) of the per-summary differences."""
    diffs = [a - b for a, b in zip(ours, base)]
    mean = sum(diffs) / len(diffs)
    sd = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) ** 0.5 if len(diffs) > 1 else 0.0
    return sd, sd / len(diffs) ** 0.5


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tokenizer = load_tokenizer_for(args)
    end_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id
    articles = load_articles(args.data_file, args.batch_size * args.max_ite)
    prompts = [prompt_ids(tokenizer, a["article"], args.max_input_length) for a in articles]
    batches = [prompts[i:i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]
    references = [a["highlights"] for a in articles]
    print(f"{len(articles)} articles from {args.data_file}, {len(batches)} batch(es) of up to "
          f"{args.batch_size}, at most {args.output_len} new tokens, greedy, on {device}")

    backends = []
    if args.test_trt_llm:
        for engine_dir in args.engine_dir:
            name = "TensorRT-LLM" if len(args.engine_dir) == 1 else f"TensorRT-LLM ({engine_dir})"
            backends.append((name, functools.partial(run_trt_llm, engine_dir)))
    if args.test_hf:
        backends.append(("Hugging Face", run_hf))
    results = []  # one per backend, in the order run: an engine given twice is run twice
    for name, run in backends:
        outputs, seconds = run(args, batches, end_id, pad_id, device)
        summaries = [tokenizer.decode(t, skip_special_tokens=True).strip() for t in outputs]
        tokens = sum(len(t) for t in outputs)
        per_summary = rouge_per_summary(summaries, references)
        scores = {k: sum(s[k] for s in per_summary) / len(per_summary) for k in ROUGE_KEYS}
        results.append({"backend": name, "rouge": scores, "rouge1_per_summary": [s["rouge1"] for s in per_summary],
                        "output_tokens": tokens, "seconds": seconds, "token_ids": outputs, "summaries": summaries})
        for i in range(min(args.show_summaries, len(summaries))):
            print(f"{name} summary [{articles[i].get('id', i)}]: {summaries[i]}")
            print(f"  reference: {references[i]}")
        print(f"{name} (total latency: {seconds:.2f} sec)")
        print(f"{name} (total output tokens: {tokens})")
        print(f"{name} (tokens per second: {tokens / seconds:.1f})")
        print(f"{name} greedy result")
        for k in ROUGE_KEYS:
            print(f"  {k}: {scores[k]:.2f}")
    first = results[0]
    for r in results[1:]:
        sd, se = paired_spread(r["rouge1_per_summary"], first["rouge1_per_summary"])
        same = sum(a == b for a, b in zip(r["token_ids"], first["token_ids"]))
        print(f"ROUGE-1 difference ({r['backend']} - {first['backend']}): "
              f"{r['rouge']['rouge1'] - first['rouge']['rouge1']:+.2f} points (per-summary differences: "
              f"sd {sd:.2f}, standard error {se:.2f}; {same} of {len(articles)} summaries token for token the same)")
    if args.json:
        Path(args.json).write_text(json.dumps({"articles": len(articles), "output_len": args.output_len,
                                               "backends": results}, indent=1))
    rouge1 = [(r["backend"], r["rouge"]["rouge1"]) for r in results]
    if args.check_accuracy:
        threshold = args.tensorrt_llm_rouge1_threshold
        low = [(name, score) for name, score in rouge1 if name.startswith("TensorRT-LLM") and score < threshold]
        for name, score in low:
            print(f"accuracy check FAILED: {name} rouge1 {score:.2f} is below the threshold {threshold}",
                  file=sys.stderr)
        if low:
            return 1
        print(f"accuracy check passed: every engine's rouge1 >= {threshold}")
    return 0


def cli() -> int:
    from tensorrt_llm.cli import run_cli
    return run_cli(main, PROG)


if __name__ == "__main__":
    sys.exit(cli())
