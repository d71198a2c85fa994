"""Converts a LLaMA-family model (Hugging Face folder, llama.cpp GGUF file or Meta checkpoint) into our
checkpoint folder: config.json, rank{N}.safetensors for each rank (tensor-parallel ranks of each
pipeline stage, rank = pp_rank * tp_size + tp_rank), and the
tokenizer files.

    python examples/llama/convert_checkpoint.py --gguf_file model.gguf --output_dir ckpt
    python examples/llama/convert_checkpoint.py --model_dir hf_model --output_dir ckpt \
        --dtype float16 --tp_size 2
    python examples/llama/convert_checkpoint.py --meta_ckpt_dir Llama-2-7b --output_dir ckpt

--dtype auto (the default) keeps the source's precision: the dtype a Hugging Face config
records (float32 if none), and float32 for GGUF, whose dequantised weights are exact only
in float32.

--use_weight_only writes a weight-only quantized checkpoint (the linears' weights INT8 or
INT4, activations in --dtype; the config's `quantization` section says which):

    python examples/llama/convert_checkpoint.py --model_dir hf_model --output_dir ckpt \
        --use_weight_only --weight_only_precision int4 --group_size 64
    python examples/llama/convert_checkpoint.py --gguf_file model.gguf --output_dir ckpt --use_weight_only

A float source is quantized here (INT8 per output channel unless --group_size; INT4 in
groups of --group_size, 128 by default), its LM head left float as TensorRT-LLM leaves it
(--quantize_lm_head quantizes it too); a
GGUF file keeps its Q4_0 / Q4_1 / Q4_K blocks as INT4 and Q8_0 / Q6_K as INT8, exactly
(--weight_only_precision does not apply), and dequantizes the rest; a tied Q8_0 embedding gives
the LM head its own INT8 copy (the embedding stays float).

A Hugging Face folder of an AutoAWQ (GEMM layout) or AutoGPTQ checkpoint (its config.json's
quantization_config, or quant_config.json / quantize_config.json, names awq or gptq) is always
converted that way, with or without --use_weight_only: each 4-bit linear keeps its codes, zero
points and scales as INT4, exactly (W4A16_AWQ / W4A16_GPTQ), the rest is read as usual:

    python examples/llama/convert_checkpoint.py --model_dir Llama-3.1-8B-Instruct-AWQ --output_dir ckpt

FP8 (W8A8) checkpoints, which need calibration, are written by examples/quantization/quantize.py.

--kv_cache_dtype fp8 stores the KV cache as FP8 E4M3 codes with scales 1.0 (no calibration), with
any of the above; calibrated scales, and int8 (which needs them), come from
examples/quantization/quantize.py --kv_cache_dtype.

--pp_size N splits the decoder layers over N pipeline stages, the last of which also runs
the LM head: by default the stages get the layer counts that even out their weights, the
LM head's included (a Llama-3.1-8B at --pp_size 2: 17 and 15 layers); --pp_partition 16,16
chooses them by hand (one count per stage, summing to the model's layers). config.json's
mapping records the split (pp_partition).

The checkpoint is written into a new folder beside --output_dir and renamed into place
when complete: a failed conversion leaves an earlier --output_dir as it was. An error ends
in one "error:" line (exit code 2); --debug shows its traceback.
"""
import argparse
import sys
import time
from pathlib import Path

from tensorrt_llm.cli import add_debug_argument, run_cli
from tensorrt_llm.errors import ConfigError
from tensorrt_llm.mapping import Mapping, parse_pp_partition
from tensorrt_llm.models.llama import convert
from tensorrt_llm.models.llama.model import LLaMAForCausalLM
from tensorrt_llm.models.modeling_utils import (
    MODEL_DTYPES,
    atomic_output_dir,
    check_output_dir,
    with_pp_partition,
    write_checkpoint,
)
from tensorrt_llm.models.quantize import (
    add_kv_cache_argument,
    add_kv_cache_scales,
    add_weight_only_arguments,
    excluded_modules,
    kv_cache_config,
    quantize_checkpoint,
    weight_only_config,
)
from tensorrt_llm.quantization.awq_gptq import awq_gptq_method
from tensorrt_llm.tokenizer_utils import save_tokenizer

PROG = "convert_checkpoint.py"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model_dir", type=Path, help="Hugging Face model folder")
    source.add_argument("--gguf_file", type=Path, help="llama.cpp GGUF file")
    source.add_argument("--meta_ckpt_dir", type=Path,
                        help="Meta checkpoint folder (params.json + consolidated.NN.pth)")
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--dtype", choices=["auto", *MODEL_DTYPES], default="auto")
    parser.add_argument("--tp_size", type=int, default=1, help="tensor-parallel ranks to write")
    parser.add_argument("--pp_size", type=int, default=1,
                        help="pipeline stages (the layers split between them); tp_size x pp_size rank files")
    parser.add_argument("--pp_partition", metavar="N,N,...",
                        help="decoder layers of each pipeline stage, e.g. 17,15 (one per stage, summing to "
                             "the model's layers); default: the split that evens out the stages' weights, "
                             "the last stage's LM head included")
    add_weight_only_arguments(parser)
    add_kv_cache_argument(parser, calibrated=False)
    add_debug_argument(parser)
    args = parser.parse_args(argv)
    if args.model_dir is not None and not args.model_dir.is_dir():
        parser.error(f"--model_dir {args.model_dir} is not a folder")
    if args.gguf_file is not None and not args.gguf_file.is_file():
        parser.error(f"--gguf_file {args.gguf_file} is not a file")
    if args.meta_ckpt_dir is not None and not args.meta_ckpt_dir.is_dir():
        parser.error(f"--meta_ckpt_dir {args.meta_ckpt_dir} is not a folder")
    if args.tp_size < 1:
        parser.error("--tp_size must be >= 1")
    if args.pp_size < 1:
        parser.error("--pp_size must be >= 1")
    given = [f for f in ("weight_only_precision", "group_size") if getattr(args, f) is not None]
    given += ["quantize_lm_head"] if args.quantize_lm_head else []
    if given and not args.use_weight_only:
        parser.error(f"--{given[0]} needs --use_weight_only")
    if args.use_weight_only and args.gguf_file is not None and given:
        parser.error(f"--{given[0]} does not apply to a GGUF file: its blocks keep their own precision and group")
    if args.use_weight_only and args.gguf_file is not None and args.tp_size * args.pp_size != 1:
        parser.error("--use_weight_only of a GGUF file writes one rank (--tp_size 1 --pp_size 1)")
    # An AutoAWQ / AutoGPTQ folder keeps its 4-bit weights: INT4, exactly (--use_weight_only implied).
    args.awq_gptq = args.model_dir is not None and awq_gptq_method(args.model_dir)
    if args.awq_gptq:
        if given:
            parser.error(f"--{given[0]} does not apply to an {args.awq_gptq.upper()} checkpoint: its weights keep "
                         "their own 4-bit codes and groups")
        if args.tp_size * args.pp_size != 1:
            parser.error(f"an {args.awq_gptq.upper()} checkpoint converts to one rank (--tp_size 1 --pp_size 1)")
        args.use_weight_only = True
    if args.kv_cache_dtype == "int8":
        parser.error("--kv_cache_dtype int8 needs calibrated scales: use examples/quantization/quantize.py "
                     "--kv_cache_dtype int8")
    args.weight_only_precision = args.weight_only_precision or "int8"
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.pp_partition is not None:  # its sum is checked once the model's config is read
        args.pp_partition = parse_pp_partition(args.pp_partition, args.pp_size)
    start = time.perf_counter()
    check_output_dir(args.output_dir, sources=[args.model_dir or args.gguf_file or args.meta_ckpt_dir])
    mapping = Mapping(world_size=args.tp_size * args.pp_size, tp_size=args.tp_size, pp_size=args.pp_size)
    dtype = None if args.dtype == "auto" else args.dtype
    if args.gguf_file is not None:
        source = args.gguf_file
        reader = convert.open_gguf(source)
        config = convert.config_from_gguf(source, dtype or "float32", mapping, reader=reader)

        if args.use_weight_only:
            config, quantized = convert.load_weight_only_from_gguf(source, config, reader=reader)

            def rank_weights(rank):
                return quantized
        else:
            def rank_weights(rank):
                return convert.load_weights_from_gguf(source, source_config, mapping.with_rank(rank),
                                                      reader=reader)
    elif args.meta_ckpt_dir is not None:
        source = args.meta_ckpt_dir
        meta_ckpt = convert.MetaCheckpoint(source)
        config = meta_ckpt.config(dtype, mapping)

        def rank_weights(rank):
            return meta_ckpt.rank_weights(source_config, mapping.with_rank(rank))
    elif args.awq_gptq:
        source = args.model_dir
        config = convert.config_from_hf(source, dtype, mapping)
        config, quantized = convert.load_weight_only_from_awq_gptq(source, config)

        def rank_weights(rank):
            return quantized
    else:
        source = args.model_dir
        config = convert.config_from_hf(source, dtype, mapping)

        def rank_weights(rank):
            return convert.load_weights_from_hf(source, source_config, mapping.with_rank(rank))

    try:  # the layers of each stage, recorded in config.json (the sum checked against the model's)
        config = with_pp_partition(config, args.pp_partition)
    except ConfigError as e:
        if args.pp_partition is None:
            raise
        raise ConfigError(f"--pp_partition {','.join(map(str, args.pp_partition))}: "
                          f"{str(e).removeprefix('PretrainedConfig: ')}") from None
    mapping = config.mapping
    source_config = config  # what the loaders above read with (a tied head stays tied there)
    if args.use_weight_only and args.gguf_file is None and not args.awq_gptq:
        float_weights = rank_weights
        config = weight_only_config(source_config, args.weight_only_precision, args.group_size,
                                    excluded_modules(args.quantize_lm_head))

        def rank_weights(rank, config=config):
            return quantize_checkpoint(LLaMAForCausalLM, config, float_weights(rank))
    if args.kv_cache_dtype is not None:
        unscaled = rank_weights
        config = kv_cache_config(config, args.kv_cache_dtype)

        def rank_weights(rank, config=config):
            return add_kv_cache_scales(LLaMAForCausalLM, config, unscaled(rank))

    stats = {"tensors": 0, "elements": 0, "bytes": 0}

    def counted(weights):
        stats["tensors"] += len(weights)
        stats["elements"] += sum(t.numel() for t in weights.values())
        stats["bytes"] += sum(t.numel() * t.element_size() for t in weights.values())
        return weights

    # A generator: each rank is converted, written and freed before the next.
    with atomic_output_dir(args.output_dir, sources=[source]) as tmp:
        write_checkpoint(tmp, config, (counted(rank_weights(r)) for r in range(mapping.world_size)))
        tokenizer_files = save_tokenizer(source, tmp)

    print(f"wrote {args.output_dir}: {config.architecture}, {config.num_hidden_layers} layers, "
          f"hidden {config.hidden_size}, vocab {config.vocab_size}, dtype {config.dtype}, "
          f"tp_size {mapping.tp_size}, pp_size {mapping.pp_size}"
          + (f" (layers per stage: {', '.join(map(str, mapping.stage_layer_counts(config.num_hidden_layers)))})"
             if mapping.pp_size > 1 else ""))
    if config.quant_config.quantizes_weights:
        print(f"  quantization: {config.quant_config.summary()}")
    if config.quant_config.quantizes_kv_cache:
        print(f"  KV cache: {config.quant_config.kv_cache_quant_algo.value} codes, scales 1.0")
    print(f"  {stats['tensors']} tensors, {stats['elements'] / 1e6:.1f}M elements, "
          f"{stats['bytes'] / 2**20:.1f} MiB over {mapping.world_size} rank file(s)")
    if tokenizer_files:
        print(f"  tokenizer: {', '.join(p.name for p in tokenizer_files)}")
    else:
        print(f"  warning: no tokenizer files found in {source}", file=sys.stderr)
    print(f"  {time.perf_counter() - start:.1f} s")


def cli() -> int:
    return run_cli(main, PROG)


if __name__ == "__main__":
    sys.exit(cli())
