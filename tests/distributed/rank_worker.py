"""One rank of a multi-rank test: `python rank_worker.py JOB.json` in a process whose environment
holds the launcher's variables (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, as torchrun
sets them). The job lists engines (each with its prompts and max_new_tokens); for each, this rank loads its part with
ModelRunner.from_dir and generates greedily; each rank writes its tokens to
`<out>.rank<N>.json`. `die_before_generate`: rank 1 exits at once instead (a dead rank)."""
import json
import os
import sys
import time

from tensorrt_llm.runtime import ModelRunner


def main(job_path: str) -> int:
    job = json.loads(open(job_path).read())
    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    results = {}
    for name, run in job["engines"].items():
        t0 = time.perf_counter()
        runner = ModelRunner.from_dir(run["dir"], device=job.get("device", "cpu"))
        if job.get("die_before_generate") and rank == 1:
            os._exit(3)
        out = runner.generate(run["prompts"], max_new_tokens=run["max_new_tokens"])
        rows = []
        for b, prompt in enumerate(run["prompts"]):
            n = int(out["sequence_lengths"][b, 0])
            rows.append(out["output_ids"][b, 0, len(prompt):n].tolist())
        results[name] = {"tokens": rows, "seconds": time.perf_counter() - t0}
    with open(f"{job['out']}.rank{rank}.json", "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
