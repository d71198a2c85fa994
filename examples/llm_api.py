"""Generate with the LLM API: a model (engine folder, checkpoint folder, Hugging Face folder or
GGUF file; the last three are built and cached on first use) and prompts in, text out.

    python examples/llm_api.py --model engines/smollm2 --prompt "What is the capital of France?"
    python examples/llm_api.py --model SmolLM2-135M-Instruct.Q4_1.gguf --prompt "Hi" "Bye" --no_chat

A bad model or request ends in one "error:" line (exit code 2); --debug shows its traceback.
"""
from __future__ import annotations

import argparse
import sys

from tensorrt_llm.cli import add_debug_argument, run_cli

PROG = "llm_api.py"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", default=None, help="tokenizer folder or .gguf file (default: the model's)")
    p.add_argument("--prompt", nargs="+", default=["What is the capital of France?"])
    p.add_argument("--max_tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=None, help="unset: greedy")
    p.add_argument("--top_p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no_chat", action="store_true", help="send the text as is, without the chat template")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    add_debug_argument(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from tensorrt_llm import LLM, SamplingParams
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            seed=args.seed)
    with LLM(args.model, tokenizer=args.tokenizer, device=args.device) as llm:
        prompts = args.prompt if args.no_chat else [
            llm.apply_chat_template([{"role": "user", "content": text}]) for text in args.prompt]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        for i, (text, out) in enumerate(zip(args.prompt, outputs)):
            print(f'Input [{i}]: "{text}"')
            print(f'Output [{i}]: "{out.outputs[0].text.strip()}"')
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, PROG))
