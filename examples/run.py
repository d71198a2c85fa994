"""Generate text from an engine folder.

    python examples/run.py --engine_dir engines/smollm2 --tokenizer_dir engines/smollm2 \
        --input_text "What is the capital of France?" --max_output_len 32

A bad engine, tokenizer or request ends in one "error:" line (exit code 2); --debug shows
its traceback.

A multi-rank (tensor- or pipeline-parallel) engine runs one process per rank; rank 0 alone
prints:

    torchrun --nproc_per_node 2 examples/run.py --engine_dir engines/tp2 ...
    mpirun -n 2 python examples/run.py --engine_dir engines/tp2 ...
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from tensorrt_llm.cli import add_debug_argument, run_cli
from tensorrt_llm.runtime import ModelRunner
from tensorrt_llm.tokenizer_utils import load_tokenizer

PROG = "run.py"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine_dir", required=True)
    p.add_argument("--tokenizer_dir", default=None,
                   help="tokenizer folder or .gguf file (default: the engine folder)")
    p.add_argument("--input_text", nargs="+", default=["What is the capital of France?"])
    p.add_argument("--max_output_len", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top_k", type=int, default=1, help="1 = greedy")
    p.add_argument("--top_p", type=float, default=0.0)
    p.add_argument("--random_seed", type=int, default=None)
    p.add_argument("--num_beams", type=int, default=1,
                   help="beam search with this many beams (up to the engine's max_beam_width)")
    p.add_argument("--length_penalty", type=float, default=1.0,
                   help="beam search: a finished beam scores sum_logprob / length ** this")
    p.add_argument("--early_stopping", choices=["true", "false", "never"], default="false",
                   help="beam search: stop once num_beams beams finished (true), when no "
                        "running beam can do better (false), or judge that at max length (never)")
    p.add_argument("--repetition_penalty", type=float, default=1.0)
    p.add_argument("--presence_penalty", type=float, default=0.0)
    p.add_argument("--frequency_penalty", type=float, default=0.0)
    p.add_argument("--min_length", type=int, default=0, help="new tokens before the end token may come")
    p.add_argument("--stop_words", nargs="+", default=None,
                   help="texts that end the output when it ends with one (kept in the output)")
    p.add_argument("--bad_words", nargs="+", default=None, help="texts never to generate")
    p.add_argument("--output_log_probs", action="store_true",
                   help="print the log-probability of every generated token")
    p.add_argument("--output_cum_log_probs", action="store_true",
                   help="print the summed log-probability of every output")
    p.add_argument("--no_chat_template", action="store_true",
                   help="send the text as is, without the tokenizer's chat template")
    p.add_argument("--streaming", action="store_true")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    add_debug_argument(p)
    return p.parse_args(argv)


def encode(tokenizer, text: str, chat: bool) -> list[int]:
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return tokenizer.encode(text)


def word_list(tokenizer, texts):
    """Texts as the token sequences generate expects, shared by all prompts."""
    if not texts:
        return None
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def main(argv=None) -> int:
    args = parse_args(argv)
    # The engine first: a folder that is no engine is said as such, not as "no tokenizer".
    runner = ModelRunner.from_dir(args.engine_dir, device=args.device)
    tokenizer = load_tokenizer(args.tokenizer_dir or args.engine_dir)
    batch = [torch.tensor(encode(tokenizer, t, not args.no_chat_template), dtype=torch.int32)
             for t in args.input_text]
    end_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id
    kwargs = dict(max_new_tokens=args.max_output_len, end_id=end_id, pad_id=pad_id,
                  temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                  random_seed=args.random_seed, num_beams=args.num_beams,
                  length_penalty=args.length_penalty,
                  early_stopping={"true": True, "false": False}.get(args.early_stopping, "never"),
                  repetition_penalty=args.repetition_penalty,
                  presence_penalty=args.presence_penalty,
                  frequency_penalty=args.frequency_penalty, min_length=args.min_length,
                  stop_words_list=word_list(tokenizer, args.stop_words),
                  bad_words_list=word_list(tokenizer, args.bad_words),
                  output_log_probs=args.output_log_probs,
                  output_cum_log_probs=args.output_cum_log_probs)
    # Every rank computes the same tokens; rank 0 alone shows them.
    if not runner.is_first_rank:
        runner.generate(batch, streaming=False, **kwargs)
        return 0
    t0 = time.perf_counter()
    if args.streaming and args.num_beams > 1:
        # Beams are re-ranked at every step: show the best one so far.
        for out in runner.generate(batch, streaming=True, **kwargs):
            for b in range(len(batch)):
                n = int(out["sequence_lengths"][b, 0])
                best = out["output_ids"][b, 0, len(batch[b]):n].tolist()
                print(f"[{b}] " + tokenizer.decode(best, skip_special_tokens=True), flush=True)
    elif args.streaming:
        shown = [len(ids) for ids in batch]
        for out in runner.generate(batch, streaming=True, **kwargs):
            for b in range(len(batch)):
                n = int(out["sequence_lengths"][b, 0])
                new = out["output_ids"][b, 0, shown[b]:n].tolist()
                if new:
                    print(f"[{b}] " + tokenizer.decode(new, skip_special_tokens=True), flush=True)
                shown[b] = n
    else:
        out = runner.generate(batch, **kwargs)
    elapsed = time.perf_counter() - t0
    generated = 0
    for b, text in enumerate(args.input_text):
        print(f'Input [{b}]: "{text}"')
        for k in range(out["output_ids"].shape[1]):  # beams, best first
            n = int(out["sequence_lengths"][b, k])
            new = out["output_ids"][b, k, len(batch[b]):n].tolist()
            generated += len(new)
            beam = f" beam {k}" if args.num_beams > 1 else ""
            print(f'Output [{b}]{beam}: "{tokenizer.decode(new, skip_special_tokens=True).strip()}"')
            if "cum_log_probs" in out:
                print(f"  cum_log_prob: {float(out['cum_log_probs'][b, k]):.4f}")
            if "log_probs" in out:
                lps = out["log_probs"][b, k, :len(new)].tolist()
                print("  log_probs: " + " ".join(f"{lp:.3f}" for lp in lps))
    print(f"({generated} tokens in {elapsed:.2f} s on {runner.device})", file=sys.stderr)
    return 0


def cli() -> int:
    return run_cli(main, PROG)


if __name__ == "__main__":
    sys.exit(cli())
