"""Generate text from an engine folder.

    python examples/run.py --engine_dir engines/smollm2 --tokenizer_dir engines/smollm2 \
        --input_text "What is the capital of France?" --max_output_len 32
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from tensorrt_llm.runtime import ModelRunner
from tensorrt_llm.tokenizer_utils import load_tokenizer


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine_dir", required=True)
    p.add_argument("--tokenizer_dir", default=None,
                   help="tokenizer folder or .gguf file (default: the engine folder)")
    p.add_argument("--input_text", nargs="+", default=["What is the capital of France?"])
    p.add_argument("--max_output_len", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top_k", type=int, default=1, help="1 = greedy")
    p.add_argument("--top_p", type=float, default=0.0)
    p.add_argument("--random_seed", type=int, default=None)
    p.add_argument("--no_chat_template", action="store_true",
                   help="send the text as is, without the tokenizer's chat template")
    p.add_argument("--streaming", action="store_true")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    return p.parse_args(argv)


def encode(tokenizer, text: str, chat: bool) -> list[int]:
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return tokenizer.encode(text)


def main(argv=None) -> int:
    args = parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer_dir or args.engine_dir)
    runner = ModelRunner.from_dir(args.engine_dir, device=args.device)
    batch = [torch.tensor(encode(tokenizer, t, not args.no_chat_template), dtype=torch.int32)
             for t in args.input_text]
    end_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id
    kwargs = dict(max_new_tokens=args.max_output_len, end_id=end_id, pad_id=pad_id,
                  temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                  random_seed=args.random_seed)
    t0 = time.perf_counter()
    if args.streaming:
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
        n = int(out["sequence_lengths"][b, 0])
        new = out["output_ids"][b, 0, len(batch[b]):n].tolist()
        generated += len(new)
        print(f'Input [{b}]: "{text}"')
        print(f'Output [{b}]: "{tokenizer.decode(new, skip_special_tokens=True).strip()}"')
    print(f"({generated} tokens in {elapsed:.2f} s on {runner.device})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
