"""trtllm-refit: swap the weights of a built engine for a checkpoint's, without rebuilding.

    trtllm-refit --engine_dir engines/llama --checkpoint_dir ckpt_finetuned [--output_dir DIR]

The checkpoint must match what the engine was built from (config, weight names, shapes
and dtypes); anything else is refused and the engine is left as it was.
"""
from __future__ import annotations

import argparse
import sys
import time

from ..builder import EngineError
from ..refit import refit_engine


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trtllm-refit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine_dir", required=True, help="engine folder made by trtllm-build")
    p.add_argument("--checkpoint_dir", required=True, help="folder with config.json + rank*.safetensors")
    p.add_argument("--output_dir", default=None, help="where to write the refitted engine "
                                                     "(default: replace the engine in place)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    try:
        report = refit_engine(args.engine_dir, args.checkpoint_dir, args.output_dir)
    except (ValueError, FileNotFoundError, EngineError) as e:
        print(f"trtllm-refit: {e}", file=sys.stderr)
        return 2
    print(f"Refitted engine written to {report['output_dir']}: {report['ranks']} rank(s), "
          f"{report['weights_replaced']} weights replaced, {report['weights_kept']} kept "
          f"(model constants), {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
