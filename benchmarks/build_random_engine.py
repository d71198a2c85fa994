"""An engine folder of a benchmark shape with random weights, servable by trtllm-serve.

    python benchmarks/build_random_engine.py --model llama-8b --dtype bf16 --max_batch_size 512 \
        --output_dir engines/llama-8b-random
    python benchmarks/bench_serving.py --model engines/llama-8b-random --request_rate 8 inf

The server needs a tokenizer; a random model has none, so the folder gets a word-level one
whose vocabulary is the model's (token i is the word "t<i>", the last id is the end token).
Prompts of token ids and generated ids then round-trip through text exactly. The weights are
those of bench_generation.py and bench_throughput.py (same seed), so the figures compare.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import MODEL_DTYPES, SHAPES, dtype_arg, random_models  # noqa: E402

from tensorrt_llm.builder import BuildConfig, build  # noqa: E402


def save_word_tokenizer(vocab_size: int, output_dir: Path) -> None:
    """Hugging Face tokenizer files of the words t0 .. t<vocab_size - 2> and the end token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {f"t{i}": i for i in range(vocab_size - 1)}
    vocab["</s>"] = vocab_size - 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="</s>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>").save_pretrained(str(output_dir))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(SHAPES), default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16", type=dtype_arg, choices=MODEL_DTYPES)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--max_batch_size", type=int, default=256)
    p.add_argument("--max_input_len", type=int, default=1024)
    p.add_argument("--max_seq_len", type=int, default=2048)
    p.add_argument("--max_num_tokens", type=int, default=8192)
    p.add_argument("--tokens_per_block", type=int, default=64)
    p.add_argument("--output_dir", required=True)
    args = p.parse_args()
    dtype = args.dtype
    out = Path(args.output_dir)
    t = time.perf_counter()
    model, _ = random_models(args.model, dtype, torch.device(args.device), with_hf=False)
    bc = BuildConfig(max_batch_size=args.max_batch_size, max_input_len=args.max_input_len,
                     max_seq_len=args.max_seq_len, max_num_tokens=args.max_num_tokens,
                     tokens_per_block=args.tokens_per_block)
    build(model, bc).save(str(out))
    save_word_tokenizer(SHAPES[args.model]["vocab_size"], out)
    print(f"{args.model} ({dtype}, random weights) -> {out} in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
