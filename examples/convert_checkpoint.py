"""Converts a Hugging Face model folder into our checkpoint folder: config.json,
rank{N}.safetensors for each tensor-parallel rank, and the tokenizer files.

    python examples/convert_checkpoint.py --model_type gpt2 --model_dir gpt2 --output_dir ckpt
    python examples/convert_checkpoint.py --model_type bloom --model_dir bloom-560m \
        --output_dir ckpt --dtype float16 --tp_size 2

--model_type picks the converter (tensorrt_llm/models/<type>/convert.py): gpt2, opt, phi,
bloom or llama. --dtype auto (the default) keeps the dtype the Hugging Face config records
(float32 if none). examples/llama/convert_checkpoint.py also reads GGUF files.

The checkpoint is written into a new folder beside --output_dir and renamed into place
when complete: a failed conversion leaves an earlier --output_dir as it was. An error ends
in one "error:" line (exit code 2); --debug shows its traceback.
"""
import argparse
import importlib
import sys
import time
from pathlib import Path

from tensorrt_llm.cli import add_debug_argument, run_cli
from tensorrt_llm.mapping import Mapping
from tensorrt_llm.models.modeling_utils import MODEL_DTYPES, atomic_output_dir, check_output_dir, write_checkpoint
from tensorrt_llm.quantization.awq_gptq import awq_gptq_method
from tensorrt_llm.tokenizer_utils import save_tokenizer

PROG = "convert_checkpoint.py"

# --model_type -> the package under tensorrt_llm.models whose convert module handles it.
CONVERTERS = {"gpt2": "gpt", "opt": "opt", "phi": "phi", "bloom": "bloom", "llama": "llama"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_type", choices=list(CONVERTERS), required=True)
    parser.add_argument("--model_dir", type=Path, required=True, help="Hugging Face model folder")
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--dtype", choices=["auto", *MODEL_DTYPES], default="auto")
    parser.add_argument("--tp_size", type=int, default=1, help="tensor-parallel ranks to write")
    add_debug_argument(parser)
    args = parser.parse_args(argv)
    if not args.model_dir.is_dir():
        parser.error(f"--model_dir {args.model_dir} is not a folder")
    if args.tp_size < 1:
        parser.error("--tp_size must be >= 1")
    method = awq_gptq_method(args.model_dir)
    if method is not None:  # this script reads float weights only
        parser.error(f"{args.model_dir} is an {method.upper()} checkpoint: convert it with "
                     "examples/llama/convert_checkpoint.py --model_dir (LLaMA family), which keeps its INT4 weights")
    return args


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    check_output_dir(args.output_dir, sources=[args.model_dir])
    convert = importlib.import_module(f"tensorrt_llm.models.{CONVERTERS[args.model_type]}.convert")
    mapping = Mapping(world_size=args.tp_size, tp_size=args.tp_size)
    config = convert.config_from_hf(args.model_dir, None if args.dtype == "auto" else args.dtype,
                                    mapping)
    # A generator: each rank is converted, written and freed before the next.
    ranks = (convert.load_weights_from_hf(args.model_dir, config, mapping.with_rank(r))
             for r in range(mapping.world_size))
    with atomic_output_dir(args.output_dir, sources=[args.model_dir]) as tmp:
        write_checkpoint(tmp, config, ranks)
        tokenizer_files = save_tokenizer(args.model_dir, tmp)

    print(f"wrote {args.output_dir}: {config.architecture}, {config.num_hidden_layers} layers, "
          f"hidden {config.hidden_size}, vocab {config.vocab_size}, dtype {config.dtype}, "
          f"tp_size {mapping.tp_size}")
    if tokenizer_files:
        print(f"  tokenizer: {', '.join(p.name for p in tokenizer_files)}")
    else:
        print(f"  warning: no tokenizer files found in {args.model_dir}", file=sys.stderr)
    print(f"  {time.perf_counter() - start:.1f} s")


def cli() -> int:
    return run_cli(main, PROG)


if __name__ == "__main__":
    sys.exit(cli())
