"""One engine loaded under several settings of the switches a runner reads when it loads (or a
kernel reads when it is launched), their batch-1 (or --batch) decode graphs replayed in turns in
one process.

    python benchmarks/ab_load_switches.py --model llama-8b --quant int4_wo --quantize_lm_head \
        --switch TRTLLM_TILE_CODES=1 --switch TRTLLM_TILE_CODES=0

Between processes, and more between machines, the same graph's replay differs by up to ~0.08 ms
a step on the 8B shape (benchmarks/README.md): more than most changes of one kernel are worth.
Here the engine is built once, saved, and loaded once per --switch (NAME=VALUE[,NAME=VALUE...]:
the environment while that runner loads and captures its decode graph; the first is the
baseline), each runner's decode graph is captured by a short generate and set to the same step
(every row at the full length), then every round replays each runner's graph --replays times in
turn. Printed: per setting the median over --rounds of the milliseconds per replay, its ratio to
the baseline, each round's figure, and whether its logits equal the baseline's bit for bit.
Every runner holds its own copy of the weights. A switch a process reads once and keeps
(TRTLLM_GEMV_PIPELINE) cannot be compared this way.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import MODEL_DTYPES, QUANTS, SHAPES, dtype_arg, quantized_model, random_models  # noqa: E402

from tensorrt_llm.builder import BuildConfig, build  # noqa: E402
from tensorrt_llm.runtime import ModelRunner  # noqa: E402


def parse_switch(text: str) -> dict[str, str]:
    """NAME=VALUE[,NAME=VALUE...] as a dict; a malformed item is an argparse error."""
    settings = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"a switch is NAME=VALUE[,NAME=VALUE...], got {text!r}")
        settings[name] = value
    return settings


@contextmanager
def environment(settings: dict[str, str]):
    """`settings` in the environment for the block, restored afterwards."""
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(SHAPES), default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16", type=dtype_arg, choices=MODEL_DTYPES)
    p.add_argument("--quant", choices=list(QUANTS), default="none")
    p.add_argument("--group_size", type=int, default=128, help="INT4 weight-only group")
    p.add_argument("--quantize_lm_head", action="store_true", help="the --quant engine's LM head quantized too")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--input_len", type=int, default=128)
    p.add_argument("--switch", type=parse_switch, action="append", required=True,
                   help="NAME=VALUE[,NAME=VALUE...] while a runner loads; give it two or more times")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--replays", type=int, default=64)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if len(args.switch) < 2:
        p.error("give --switch at least twice: a baseline and a setting to compare with it")
    if args.quantize_lm_head and QUANTS[args.quant] is None:
        p.error("--quantize_lm_head applies to a --quant engine")
    if not torch.cuda.is_available():
        sys.exit("ab_load_switches.py times CUDA graphs: it needs a CUDA GPU")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model, _ = random_models(args.model, args.dtype, dev, with_hf=False)
    prompts = [torch.randint(100, 1000, (args.input_len,), dtype=torch.int32) for _ in range(args.batch)]
    if QUANTS[args.quant] is not None:
        model = quantized_model(model, args.quant, args.group_size, False, None, prompts,
                                quantize_lm_head=args.quantize_lm_head)
    steps = 8
    bc = BuildConfig(max_batch_size=args.batch, max_input_len=args.input_len,
                     max_seq_len=args.input_len + steps + 8)
    blocks_per_seq = -(-bc.max_seq_len // bc.tokens_per_block)
    pool = dict(max_tokens_in_paged_kv_cache=args.batch * blocks_per_seq * bc.tokens_per_block)
    with tempfile.TemporaryDirectory() as tmp:
        build(model, bc).save(tmp)
        del model
        torch.cuda.empty_cache()
        runners = []
        for settings in args.switch:
            with environment(settings):
                runner = ModelRunner.from_dir(tmp, device=dev, **pool)
                runner.generate(prompts, max_new_tokens=steps)  # the first steps' lazy set-up
                # The plain decode graph replayed below (greedy steps replay a graph of their own):
                # captured here, where a switch read at a kernel's launch is set.
                runner.executor.runner.decode_graphs.capture([args.batch])
            runners.append(runner)
    n = args.batch
    graphs, logits = [], []
    for runner in runners:
        decode_graphs = runner.executor.runner.decode_graphs
        # The same step for every runner: each row at the full length on blocks of its own.
        out = decode_graphs.step(torch.zeros(n, dtype=torch.int32, device=dev),
                                 torch.full((n,), args.input_len + steps, dtype=torch.int32, device=dev),
                                 torch.arange(n * blocks_per_seq, dtype=torch.int32, device=dev).view(n, -1))
        graphs.append(decode_graphs.graphs[decode_graphs.bucket(n)])
        logits.append(out.float().clone())
    times = [[] for _ in runners]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.rounds):
        for i, graph in enumerate(graphs):
            graph.replay()
            start.record()
            for _ in range(args.replays):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            times[i].append(start.elapsed_time(end) / args.replays)
    base = statistics.median(times[0])
    print(f"{args.model} {args.dtype} {args.quant} batch {n} on {torch.cuda.get_device_name(dev)}: "
          f"{args.rounds} rounds of {args.replays} replays, ms a replay")
    results = []
    for settings, t, lg in zip(args.switch, times, logits):
        label = ",".join(f"{k}={v}" for k, v in settings.items())
        med = statistics.median(t)
        same = bool(torch.equal(lg, logits[0]))
        print(f"  {label:40s} median {med:.4f}  {med / base:.4f}x  logits equal: {same}  "
              f"rounds {' '.join(f'{x:.4f}' for x in t)}")
        results.append({"switch": settings, "median_ms": med, "ratio": med / base, "rounds_ms": t,
                        "logits_equal": same})
    result = {"model": args.model, "dtype": args.dtype, "quant": args.quant, "batch": n,
              "device_name": torch.cuda.get_device_name(dev), "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
