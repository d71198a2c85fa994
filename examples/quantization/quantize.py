"""Quantizes a LLaMA-family model (Hugging Face folder or llama.cpp GGUF file) to FP8 (W8A8) or
weight-only INT8 / INT4 and writes our checkpoint folder (config.json with a `quantization`
section, rank0.safetensors, the tokenizer files), which trtllm-build builds:

    python examples/quantization/quantize.py --model_dir hf_model --qformat fp8 --output_dir ckpt
    python examples/quantization/quantize.py --model_dir SmolLM2-135M-Instruct.Q4_1.gguf \
        --qformat fp8 --calib_size 16 --output_dir ckpt
    trtllm-build --checkpoint_dir ckpt --output_dir engine

--qformat fp8: the linears (attention qkv and dense, mlp gate / up / down) get FP8 E4M3 weights, one scale
per tensor (--per_channel: per output channel; gate and up share one, so that the engine's fused
gate/up GEMM keeps it: models/quantize.py), and FP8 activations; the embedding, the norms
and the LM head stay in --dtype, as TensorRT-LLM leaves them by default. Activation scales are
static by default (quant_algo FP8): each linear's input max |x| over --calib_size calibration
samples, the first --calib_max_len tokens of --calib_data's texts (examples/data; no
download), run through the float model in transformers; --dynamic_activations
(FP8_PER_CHANNEL_PER_TOKEN) scales each token by its own max instead and needs no calibration.
Per-tensor static scales are the default because they are the fast ones on a GPU (one
tensor-wise FP8 GEMM; ops/fp8_linear.py). On SmolLM2-135M no mode is more accurate beyond the
spread of its own rounding: each costs +2.6 to +3.8% perplexity on average over equally valid
roundings, one engine anywhere from +0.7 to +5.3% (benchmarks/README.md, eighth session;
benchmarks/fp8_rounding_spread.py).

--algorithm gptq (any --qformat but none): the weights are rounded by GPTQ (Frantar et al.,
2022; tensorrt_llm/quantization/gptq.py) instead of to nearest, onto the same grid and scales:
each linear's calibration inputs X give H = 2 X^T X / n, and each input column's rounding
error is spread over the columns after it through the Cholesky factor of H^-1 (damping
--gptq_damp x mean diag). --gptq_inputs sequential (the default) takes each linear's H from
inputs that went through the already-quantized linears before it; float from the float
model's. For fp8, --gptq_quantized_activations takes H from FP8-rounded inputs (as the engine
computes). --gptq_act_order quantizes the inputs most active first (GPTQ's desc_act), with
the group scales of round-to-nearest fixed up front ("static groups"), so the checkpoint needs
no input permutation. It calibrates on --calib_data like the static scales (same samples).
On SmolLM2-135M (benchmarks/README.md, 2026-11-27) it took INT4 group 64 from +45% to +21%
perplexity and INT8 from +0.89% to -0.03%, and moved FP8 by less than the spread of equally
valid roundings (no mode within 1%); round-to-nearest stays the default. Keeping some linears
float does not rescue FP8 there either: its cost is spread over every linear, and only sets
holding half of the weights float get under 1% (benchmarks/fp8_rounding_spread.py
--exclude_modules).

Calibration texts (--calib_data) are by default examples/data/calibration_prose.jsonl,
prose written for the project and disjoint from the articles that eval_ppl.py measures.

--qformat int8_wo / int4_wo: W8A16 (per output channel, or groups of --group_size) / W4A16
(groups of --group_size, 128 by default) of the same linears, as convert_checkpoint.py
--use_weight_only quantizes a float source; no calibration.

--quantize_lm_head (any --qformat but none): the LM head in the same format too (a tied head gets
its own quantized copy of the embedding's rows; the embedding stays float). Its rounding costs
accuracy (an INT8 head alone about half a percent of SmolLM2's perplexity), but on an 8B model
with a 128K vocabulary the bfloat16 head is 1 GB, a fifth of an INT4 decode step's reads.
--algorithm gptq rounds it to nearest.

--qformat none: the weights stay in --dtype (for --kv_cache_dtype alone).

--kv_cache_dtype fp8 / int8 (with any --qformat): the KV cache holds FP8 E4M3 / INT8 codes, each
attention layer with a K and a V scale, amax / 448 (fp8) or amax / 127 (int8) of the K (after
the rotary embedding) and V values calibrated on the same samples, in the same pass, as FP8's
activation scales:

    python examples/quantization/quantize.py --model_dir hf_model --qformat fp8 --kv_cache_dtype fp8 \
        --output_dir ckpt

A GGUF file's weights are dequantized first (as convert_checkpoint.py does), so its float
model is the GGUF file's (convert_checkpoint.py --use_weight_only keeps its blocks instead).
FP8 runs on GPUs of compute capability 8.9 or newer (trtllm-build refuses older ones) and on
the CPU through the reference (exact FP8 arithmetic, slow).

The checkpoint is written into a new folder beside --output_dir and renamed into place when
complete. An error ends in one "error:" line (exit code 2); --debug shows its traceback.
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: eval_ppl's article texts

from eval_ppl import article_token_ids  # noqa: E402

from tensorrt_llm.cli import add_debug_argument, run_cli  # noqa: E402
from tensorrt_llm.models.calibrate import Calibration, collect_hessians  # noqa: E402
from tensorrt_llm.models.calibrate import calibrate as calibrate_amax
from tensorrt_llm.models.llama import convert  # noqa: E402
from tensorrt_llm.models.llama.model import LLaMAForCausalLM  # noqa: E402
from tensorrt_llm.models.modeling_utils import (  # noqa: E402
    MODEL_DTYPES,
    atomic_output_dir,
    check_output_dir,
    write_checkpoint,
)
from tensorrt_llm.models.quantize import (  # noqa: E402
    add_kv_cache_argument,
    add_quantize_lm_head_argument,
    excluded_modules,
    fp8_config,
    kv_cache_config,
    quantize_checkpoint,
    weight_only_config,
)
from tensorrt_llm.quantization.formats import (  # noqa: E402
    dequantize,
    fp8_scale_from_amax,
    quantize_fp8_activation,
)
from tensorrt_llm.quantization.gptq import quantize_gptq  # noqa: E402
from tensorrt_llm.tokenizer_utils import load_tokenizer, save_tokenizer  # noqa: E402

PROG = "quantize.py"
CALIB_DATA = Path(__file__).resolve().parents[1] / "data" / "calibration_prose.jsonl"
QFORMATS = {"fp8": None, "int8_wo": "int8", "int4_wo": "int4", "none": None}  # -> the weight-only precision


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_dir", type=Path, required=True, help="Hugging Face model folder, or a .gguf file")
    p.add_argument("--output_dir", type=Path, required=True)
    p.add_argument("--qformat", choices=list(QFORMATS), required=True)
    p.add_argument("--dtype", choices=["auto", *MODEL_DTYPES], default="auto",
                   help="dtype of the float parts and the activations (auto: the source's; float32 for GGUF)")
    p.add_argument("--per_channel", action="store_true", help="one weight scale per output channel")
    p.add_argument("--dynamic_activations", action="store_true",
                   help="per-token activation scales at run time (FP8_PER_CHANNEL_PER_TOKEN), no calibration")
    p.add_argument("--group_size", type=int, choices=[32, 64, 128], default=None,
                   help="int8_wo / int4_wo: inputs per quantization group")
    add_quantize_lm_head_argument(p)
    add_kv_cache_argument(p, calibrated=True)
    p.add_argument("--calib_size", type=int, default=None, help="calibration samples (default 16)")
    p.add_argument("--calib_max_len", type=int, default=512, help="tokens per calibration sample at most")
    p.add_argument("--calib_data", type=Path, default=CALIB_DATA,
                   help="JSON lines with an 'article' text each (default: the project's calibration prose, "
                        "disjoint from eval_ppl.py's articles)")
    p.add_argument("--algorithm", choices=["rtn", "gptq"], default="rtn",
                   help="how weights are rounded: rtn (to nearest) or gptq (error-compensating, calibrated)")
    p.add_argument("--gptq_inputs", choices=["sequential", "float"], default=None,
                   help="--algorithm gptq: each linear's Hessian from inputs through the quantized linears before "
                        "it (sequential, default) or from the float model's (float)")
    p.add_argument("--gptq_quantized_activations", action="store_true",
                   help="--algorithm gptq, --qformat fp8: Hessians from FP8-rounded inputs")
    p.add_argument("--gptq_act_order", action="store_true",
                   help="--algorithm gptq: quantize inputs in decreasing order of activity (GPTQ's desc_act), "
                        "group scales fixed up front from the float groups (no input permutation is stored)")
    p.add_argument("--gptq_damp", type=float, default=None, help="--algorithm gptq: damping, x mean diag(H) (0.01)")
    p.add_argument("--device", default=None, help="where calibration runs: cpu or cuda (default: cuda when present)")
    add_debug_argument(p)
    args = p.parse_args(argv)
    gguf = args.model_dir.suffix == ".gguf"
    if gguf and not args.model_dir.is_file():
        p.error(f"--model_dir {args.model_dir} is not a file")
    if not gguf and not args.model_dir.is_dir():
        p.error(f"--model_dir {args.model_dir} is neither a folder nor a .gguf file")
    fp8_only = [f for f in ("per_channel", "dynamic_activations") if getattr(args, f)]
    if args.qformat != "fp8" and fp8_only:
        p.error(f"--{fp8_only[0]} applies to --qformat fp8")
    if args.qformat == "none" and args.kv_cache_dtype is None:
        p.error("--qformat none quantizes nothing: give --kv_cache_dtype fp8 or int8")
    if args.qformat == "fp8" and args.group_size is not None:
        p.error("--group_size applies to --qformat int8_wo / int4_wo")
    gptq = args.algorithm == "gptq"
    if args.quantize_lm_head and args.qformat == "none":
        p.error("--quantize_lm_head needs a --qformat to quantize it to")
    if gptq and args.qformat == "none":
        p.error("--algorithm gptq rounds weights: --qformat none has none to quantize")
    gptq_only = [f for f in ("gptq_inputs", "gptq_damp") if getattr(args, f) is not None]
    gptq_only += [f for f in ("gptq_quantized_activations", "gptq_act_order") if getattr(args, f)]
    if gptq_only and not gptq:
        p.error(f"--{gptq_only[0]} applies to --algorithm gptq")
    if args.gptq_quantized_activations and args.qformat != "fp8":
        p.error("--gptq_quantized_activations applies to --qformat fp8 (weight-only formats keep float activations)")
    if args.gptq_damp is not None and not 0 <= args.gptq_damp <= 1:
        p.error(f"--gptq_damp must be in 0..1, got {args.gptq_damp}")
    args.gptq_inputs = args.gptq_inputs or "sequential"
    args.gptq_damp = 0.01 if args.gptq_damp is None else args.gptq_damp
    args.calibrate = ((args.qformat == "fp8" and not args.dynamic_activations) or args.kv_cache_dtype is not None
                      or gptq)
    if args.calib_size is not None and not args.calibrate:
        p.error("--calib_size calibrates static activation scales; --dynamic_activations has none" if
                args.dynamic_activations
                else "--calib_size applies to --qformat fp8, --kv_cache_dtype or --algorithm gptq")
    if args.calib_size is None:
        args.calib_size = 16
    if args.calib_size < 1 or args.calib_max_len < 2:
        p.error("--calib_size must be >= 1 and --calib_max_len >= 2")
    if args.calibrate and not args.calib_data.is_file():
        p.error(f"--calib_data {args.calib_data} is not a file")
    return args


def float_model(args):
    """(our config, our float weights) of the source, as convert_checkpoint.py reads it."""
    dtype = None if args.dtype == "auto" else args.dtype
    if args.model_dir.suffix == ".gguf":
        reader = convert.open_gguf(args.model_dir)
        config = convert.config_from_gguf(args.model_dir, dtype or "float32", reader=reader)
        return config, convert.load_weights_from_gguf(args.model_dir, config, reader=reader)
    config = convert.config_from_hf(args.model_dir, dtype)
    return config, convert.load_weights_from_hf(args.model_dir, config)


def transformers_model(source: Path, device: torch.device):
    """The source's float model in transformers (float32), for calibration; safetensors only:
    a pickled checkpoint is never loaded."""
    import transformers
    transformers.utils.logging.disable_progress_bar()
    if source.suffix == ".gguf":
        kwargs = dict(pretrained_model_name_or_path=str(source.parent), gguf_file=source.name)
    else:
        kwargs = dict(pretrained_model_name_or_path=str(source), use_safetensors=True)
    return transformers.LlamaForCausalLM.from_pretrained(**kwargs, dtype=torch.float32).to(device).eval()


def calibrate(args, config) -> tuple[Calibration, dict]:
    """(the calibrated maxima, GPTQ's Hessians by linear name: empty unless --algorithm gptq)."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    samples = article_token_ids(load_tokenizer(args.model_dir), args.calib_size, args.calib_max_len, args.calib_data)
    if len(samples) < args.calib_size:
        print(f"note: {args.calib_data} has {len(samples)} samples, fewer than the {args.calib_size} asked for",
              file=sys.stderr)
    print(f"calibrating on {len(samples)} samples ({sum(map(len, samples))} tokens) on {device}", flush=True)
    model = transformers_model(args.model_dir, device)

    def progress(done):
        print(f"\r  {done}/{len(samples)} samples", end="\n" if done == len(samples) else "", flush=True)
    calibration = calibrate_amax(model, samples, progress, kv_cache=args.kv_cache_dtype is not None)
    if args.algorithm != "gptq":
        return calibration, {}
    activation_quant = None
    if args.gptq_quantized_activations:
        def activation_quant(name, x):
            scale = None if args.dynamic_activations else fp8_scale_from_amax(calibration.input_amax[name]).to(x.device)
            q, s = quantize_fp8_activation(x, scale)
            return q.float() * s

    def quantize_group(name, w, h):  # a group of linears that share an input, as one weight
        return dequantize(quantize_gptq(w.cpu(), h, config.quant_config.layer(name), per_channel=args.per_channel,
                                        damp=args.gptq_damp, act_order=args.gptq_act_order))
    sequential = args.gptq_inputs == "sequential"
    layers = config.num_hidden_layers
    print(f"GPTQ Hessians ({args.gptq_inputs} inputs{', FP8-rounded' if activation_quant else ''})", flush=True)
    hessians = collect_hessians(
        model, samples, quantize_group if sequential else None, activation_quant,
        lambda done: print(f"\r  {done}/{layers if sequential else len(samples)} "
                           f"{'layers' if sequential else 'samples'}", end="", flush=True))
    print()
    return calibration, hessians


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    check_output_dir(args.output_dir, sources=[args.model_dir])
    print(f"reading {args.model_dir}", flush=True)
    config, weights = float_model(args)
    if args.qformat == "fp8":
        config = fp8_config(config, dynamic_activations=args.dynamic_activations,
                            exclude_modules=excluded_modules(args.quantize_lm_head))
        print(f"quantizing the linears to FP8 ({config.quant_config.quant_algo.value}, "
              f"{'per-channel' if args.per_channel else 'per-tensor'} weight scales)", flush=True)
    elif args.qformat != "none":
        config = weight_only_config(config, QFORMATS[args.qformat], args.group_size,
                                    excluded_modules(args.quantize_lm_head))
        print(f"quantizing the linears' weights ({config.quant_config.quant_algo.value})", flush=True)
    if args.algorithm == "gptq":
        print(f"rounding by GPTQ (damp {args.gptq_damp})", flush=True)
    config = kv_cache_config(config, args.kv_cache_dtype)
    LLaMAForCausalLM(config)  # its checks (a group size the widths do not divide) before any calibration
    calibration, hessians = calibrate(args, config) if args.calibrate else (Calibration(), {})
    if args.kv_cache_dtype is not None:
        print(f"KV cache in {args.kv_cache_dtype} (calibrated K/V scales per layer)", flush=True)
    weights = quantize_checkpoint(LLaMAForCausalLM, config, weights, per_channel=args.per_channel,
                                  input_amax=calibration.input_amax or None,
                                  kv_cache_amax=calibration.kv_cache_amax or None,
                                  hessians=hessians, gptq_damp=args.gptq_damp, gptq_act_order=args.gptq_act_order)
    with atomic_output_dir(args.output_dir, sources=[args.model_dir]) as tmp:
        write_checkpoint(tmp, config, [weights])
        tokenizer_files = save_tokenizer(args.model_dir, tmp)
    size = sum(t.numel() * t.element_size() for t in weights.values())
    print(f"wrote {args.output_dir}: {config.architecture}, {config.num_hidden_layers} layers, dtype {config.dtype}, "
          f"quantization {config.quant_config.quant_algo or 'none'}, KV cache "
          f"{config.quant_config.kv_cache_quant_algo or config.dtype}, {size / 2**20:.1f} MiB of weights")
    if not tokenizer_files:
        print(f"  warning: no tokenizer files found in {args.model_dir}", file=sys.stderr)
    print(f"  {time.perf_counter() - start:.1f} s")


def cli() -> int:
    return run_cli(main, PROG)


if __name__ == "__main__":
    sys.exit(cli())
