"""Executor scenarios that the one-rank engine runs in the test's process and each rank of a
pipeline-parallel engine runs in its own (`python pipeline_worker.py JOB.json`, with the
launcher's environment as rank_worker.py has it). Every rank writes, per scenario, each
request's tokens and finish reason and its executor's counters to `<out>.rank<N>.json`,
and the beams of a beam search (`run_beams`).

Requests arrive by step() call (every rank makes the same calls), so every rank admits and
aborts at the same step; the tokens are greedy, so they do not depend on how the requests
were batched, grouped or preempted.
"""
import json
import os
import sys

import numpy as np

PROMPT_LENS = [3, 17, 9, 30, 5, 12, 24, 7]
NEW_TOKENS = [6, 9, 4, 7, 12, 5, 8, 10]
ABORTED = 4  # the request the "abort" scenario stops mid-run, at step ABORT_STEP
ABORT_STEP = 9

# Each scenario: the ModelRunner's options, and every how many steps a request arrives.
SCENARIOS = {
    "mixed": ({}, 0),
    "chunked": ({"enable_chunked_context": True, "max_num_tokens": 16}, 0),
    "preempt": ({"max_tokens_in_paged_kv_cache": 64}, 0),
    "arrivals": ({"enable_chunked_context": True, "max_num_tokens": 24}, 3),
    "abort": ({}, 0),
    # Steps launched from the previous step's tokens still on the device (a GPU's default,
    # forced here), and requests stopped by a token's value: they compute a token more.
    "overlap": ({"enable_chunked_context": True, "max_num_tokens": 16}, 2),
}


def prompts(vocab_size: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(1, vocab_size, n).tolist() for n in PROMPT_LENS]


def run_scenario(runner, name: str) -> dict:
    from tensorrt_llm.runtime.request import Request
    ex = runner.executor
    arrive_every = SCENARIOS[name][1]
    stop = ()
    if name == "overlap":
        ex.overlap = True
        stop = tuple(range(0, runner.vocab_size, 9))
    reqs = [Request(p, max_new_tokens=n, stop_token_ids=stop) for p, n in zip(prompts(runner.vocab_size), NEW_TOKENS)]
    added = steps = 0
    aborted = None
    while added < len(reqs) or ex.has_work:
        while added < len(reqs) and added * arrive_every <= steps:
            ex.add_request(reqs[added])
            added += 1
        if name == "abort" and steps == ABORT_STEP:
            aborted = ex.abort(reqs[ABORTED].request_id)
        ex.step()
        steps += 1
    return {"tokens": [r.output_token_ids for r in reqs], "finish": [r.finish_reason for r in reqs],
            "aborted_mid_run": aborted is not None, "preemptions": ex.stats.preemptions,
            "peak_in_flight": ex.stats.peak_in_flight, "used_blocks": runner.kv_cache.num_used_blocks}


def run_beams(runner) -> dict:
    """Beam search, which drives the step runner itself (its logits waited for at each step)."""
    out = runner.generate(prompts(runner.vocab_size)[:3], max_new_tokens=5, num_beams=2)
    return {"tokens": out["output_ids"].tolist(), "used_blocks": runner.kv_cache.num_used_blocks}


def main(job_path: str) -> int:
    from tensorrt_llm.runtime import ModelRunner
    job = json.loads(open(job_path).read())
    rank = int(os.environ["RANK"])
    device = job.get("device", "cpu")
    results = {name: run_scenario(ModelRunner.from_dir(job["engine"], device=device, **SCENARIOS[name][0]), name)
               for name in job["scenarios"]}
    results["beams"] = run_beams(ModelRunner.from_dir(job["engine"], device=device))
    with open(f"{job['out']}.rank{rank}.json", "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
