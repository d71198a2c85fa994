"""trtllm-refit: swap the weights of a built engine for a checkpoint's, without rebuilding.

    trtllm-refit --engine_dir engines/llama --checkpoint_dir ckpt_finetuned [--output_dir DIR]

The checkpoint must match what the engine was built from (config, weight names, shapes
and dtypes); anything else is refused and the engine is left as it was. An error ends in
one "trtllm-refit: error: ..." line (exit code 2); --debug shows its traceback.
"""
from __future__ import annotations

import argparse
import sys
import time

from ..cli import add_debug_argument, run_cli
from ..refit import refit_engine

PROG = "trtllm-refit"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine_dir", required=True, help="engine folder made by trtllm-build")
    p.add_argument("--checkpoint_dir", required=True, help="folder with config.json + rank*.safetensors")
    p.add_argument("--output_dir", default=None, help="where to write the refitted engine "
                                                     "(default: replace the engine in place)")
    add_debug_argument(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    report = refit_engine(args.engine_dir, args.checkpoint_dir, args.output_dir)
    print(f"Refitted engine written to {report['output_dir']}: {report['ranks']} rank(s), "
          f"{report['weights_replaced']} weights replaced, {report['weights_kept']} kept "
          f"(model constants), {time.perf_counter() - t0:.1f} s")
    return 0


def cli() -> int:
    """The trtllm-refit console script: main() through run_cli."""
    return run_cli(main, PROG)


if __name__ == "__main__":
    sys.exit(cli())
