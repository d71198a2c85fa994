"""Pipeline-parallel engines with their stages at work at once (executor.py, "Pipeline
parallelism"): PP2 and PP4 ranks on the CPU (gloo) give the one-rank engine's greedy tokens
over pipeline_worker.py's scenarios (mixed prompt lengths, chunked prompts, a pool that forces
preemption, requests arriving over time, an abort mid-run, steps launched from tokens still
on the device with stops by value) and its beams, keep pp_size steps
in flight, and end with every KV block back in every rank's pool. The scheduler's groups are tested alone.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tensorrt_llm.builder import BuildConfig
from tensorrt_llm.commands.build import build_checkpoint
from tensorrt_llm.mapping import Mapping
from tensorrt_llm.models.llama.convert import config_from_hf, load_weights_from_hf
from tensorrt_llm.models.modeling_utils import write_checkpoint
from tensorrt_llm.runtime import ModelRunner
from tensorrt_llm.runtime.kv_cache_manager import KVCacheManager
from tensorrt_llm.runtime.request import Request
from tensorrt_llm.runtime.scheduler import Scheduler, group_share

from ..models.llama_utils import random_hf_llama
from .pipeline_worker import ABORTED, SCENARIOS, prompts, run_beams, run_scenario
from .test_multi_rank import launch

WORKER = Path(__file__).resolve().parent / "pipeline_worker.py"
BUILD = dict(max_batch_size=4, max_beam_width=2, max_input_len=48, max_seq_len=96, tokens_per_block=8,
             target_device="any")


def build_engine(hf, mapping: Mapping, root: Path, name: str | None = None) -> Path:
    config = config_from_hf(hf.config, dtype="float32", mapping=mapping)
    name = name or f"pp{mapping.pp_size}"
    write_checkpoint(root / f"ckpt_{name}", config,
                     (load_weights_from_hf(hf, config, mapping.with_rank(r)) for r in range(mapping.world_size)))
    build_checkpoint(root / f"ckpt_{name}", root / name, BuildConfig(**BUILD), log=lambda line: None)
    return root / name


def scenarios_on(device: str, engine: Path) -> dict:
    results = {name: run_scenario(ModelRunner.from_dir(engine, device=device, **options), name)
               for name, (options, _) in SCENARIOS.items()}
    results["beams"] = run_beams(ModelRunner.from_dir(engine, device=device))
    return results


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A random 4-layer Llama: its one-rank, PP2, PP4 and uneven PP2 (3 + 1 layers) engines,
    and the one-rank engine's results of every scenario."""
    root = tmp_path_factory.mktemp("pipeline")
    hf = random_hf_llama(vocab_size=301, num_hidden_layers=4)
    engines = {pp: build_engine(hf, Mapping(world_size=pp, pp_size=pp), root) for pp in (1, 2, 4)}
    engines["pp2_3+1"] = build_engine(hf, Mapping(world_size=2, pp_size=2, pp_partition=[3, 1]), root, "pp2_31")
    expected = scenarios_on("cpu", engines[1])
    assert expected["preempt"]["preemptions"] > 0  # the scenario is what it says
    assert expected["abort"]["aborted_mid_run"]
    assert "stop" in expected["overlap"]["finish"] and "length" in expected["overlap"]["finish"]
    return {"engines": engines, "expected": expected}


def check_ranks(job: Path, world: int, expected: dict) -> None:
    for rank in range(world):
        got = json.loads(Path(f"{job.with_suffix('')}.rank{rank}.json").read_text())
        for name, want in expected.items():
            res = got[name]
            where = f"rank {rank}, scenario {name}"
            kept = range(len(want["tokens"]))
            if name == "abort":
                assert res["aborted_mid_run"] and res["finish"][ABORTED] == "abort", where
                kept = [i for i in kept if i != ABORTED]
            assert [res["tokens"][i] for i in kept] == [want["tokens"][i] for i in kept], where
            assert res["used_blocks"] == 0, where  # every block back in this rank's pool
            assert res.get("finish") == want.get("finish") or name == "abort", where
        # Every group had a step in flight at once: the stages did not run in turn.
        assert got["mixed"]["peak_in_flight"] == world, rank
        assert got["preempt"]["preemptions"] > 0, rank


@pytest.mark.parametrize("pp", [2, 4])
def test_pipeline_stages_give_one_ranks_tokens(llama, tmp_path, pp):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"engine": str(llama["engines"][pp]), "scenarios": list(SCENARIOS),
                               "out": str(job.with_suffix(""))}))
    procs = launch(pp, job, worker=WORKER)
    assert [p.returncode for p in procs] == [0] * pp, "".join(p.stderr[-2000:] for p in procs)
    check_ranks(job, pp, llama["expected"])


def test_uneven_pipeline_stages_give_one_ranks_tokens(llama, tmp_path):
    # Stage 0 runs layers 0-2, stage 1 layer 3 (mapping.pp_partition [3, 1]): each rank's KV
    # pool holds its own stage's layers, and the tokens are the one-rank engine's.
    engine = llama["engines"]["pp2_3+1"]
    mapping = json.loads((engine / "config.json").read_text())["pretrained_config"]["mapping"]
    assert mapping == {"world_size": 2, "tp_size": 1, "pp_size": 2, "pp_partition": [3, 1]}
    names = ["mixed", "preempt", "overlap"]
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"engine": str(engine), "scenarios": names, "out": str(job.with_suffix(""))}))
    procs = launch(2, job, worker=WORKER)
    assert [p.returncode for p in procs] == [0, 0], "".join(p.stderr[-2000:] for p in procs)
    check_ranks(job, 2, {name: llama["expected"][name] for name in [*names, "beams"]})


def test_llm_api_runs_a_pipeline_engine_folder(llama):
    # The LLM's engine processes (one per stage) step the pipelined executor in lockstep.
    from tensorrt_llm import LLM, SamplingParams
    with LLM(str(llama["engines"][2]), progress=None) as llm:
        outs = llm.generate(prompts(301), SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [t[:4] for t in llama["expected"]["mixed"]["tokens"]]


def test_the_one_rank_executor_has_no_pipeline(llama):
    assert all(llama["expected"][name]["peak_in_flight"] == 0 for name in SCENARIOS)


def scheduler(num_groups: int, num_blocks: int = 64, max_num_tokens: int = 64) -> Scheduler:
    kv = KVCacheManager(num_blocks, tokens_per_block=4, max_blocks_per_seq=16)
    return Scheduler(kv, max_batch_size=8, max_num_tokens=max_num_tokens, enable_chunked_context=True,
                     num_groups=num_groups)


def launched(step) -> None:
    """What the executor does with a scheduled step's rows, less the sampled tokens' values."""
    for row in step.rows:
        row.request.num_computed += row.num_tokens
        if row.samples:
            row.request.tokens.append(1)


def test_groups_split_the_requests_evenly_and_keep_each_request_in_its_group():
    s = scheduler(num_groups=3)
    reqs = [Request([1] * n, max_new_tokens=4) for n in (5, 9, 3, 7, 4, 6, 8)]
    for r in reqs:
        s.add(r)
    groups = {}
    for turn in range(12):
        g = turn % 3
        step = s.schedule(g)
        for row in step.rows:
            groups.setdefault(row.request.request_id, g)
            assert groups[row.request.request_id] == g  # never scheduled in another group
        launched(step)
    assert [list(groups.values()).count(g) for g in range(3)] == [3, 2, 2] and len(groups) == len(reqs)


def test_chunks_and_preemptions_stay_in_the_group_whose_turn_it_is():
    # 12 blocks of 4 tokens cannot hold the three requests at their full lengths (7 + 3 + 6
    # blocks): the scheduler preempts, and only ever a request of the group being scheduled.
    s = scheduler(num_groups=2, num_blocks=12, max_num_tokens=8)
    reqs = [Request([1] * 20, max_new_tokens=8), Request([2] * 4, max_new_tokens=8),
            Request([3] * 4, max_new_tokens=20)]
    for r in reqs:
        s.add(r)
    group_of, prompt_chunks, preempted = {}, {r.request_id: [] for r in reqs}, 0
    for turn in range(200):
        g = turn % 2
        step = s.schedule(g)
        for victim in step.preempted:
            assert group_of.pop(victim.request_id) == g
            prompt_chunks[victim.request_id] = []
            preempted += 1
        for row in step.rows:
            assert group_of.setdefault(row.request.request_id, g) == g
            if row.start < row.request.prompt_len:
                prompt_chunks[row.request.request_id].append((row.start, row.num_tokens))
        assert step.num_tokens <= 8
        launched(step)
        for r in reqs:
            if r.num_generated >= r.max_new_tokens and r in s.running:
                s.remove(r)
                group_of.pop(r.request_id)
        if not s.has_work:
            break
    assert not s.has_work and preempted > 0
    # Each prompt was computed in consecutive chunks from its start, the last one ending it.
    for r in reqs:
        chunks = prompt_chunks[r.request_id]
        assert [start for start, _ in chunks] == [sum(n for _, n in chunks[:i]) for i in range(len(chunks))]
        assert sum(n for _, n in chunks) >= r.prompt_len


def test_group_share_spreads_requests_evenly():
    assert group_share([0, 0, 0], 0, 7) == 3
    assert group_share([3, 0, 0], 1, 4) == 2  # group 0 took the one extra already
    assert group_share([3, 2, 0], 2, 2) == 2
    assert group_share([1, 0], 0, 1) == 1     # the new request goes to the other group
    assert group_share([1, 0], 1, 1) == 1
    assert group_share([0, 0, 0, 0], 3, 1) == 1


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_pp2_on_two_gpus_with_cuda_graphs_gives_one_ranks_tokens(llama, tmp_path):
    # Decode steps replay CUDA graphs holding the hidden-state send / recv; the logits come
    # back outside them, on the pipeline's second communicator.
    expected = scenarios_on("cuda", llama["engines"][1])
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"engine": str(llama["engines"][2]), "scenarios": list(SCENARIOS),
                               "out": str(job.with_suffix("")), "device": "cuda"}))
    procs = launch(2, job, worker=WORKER)
    assert [p.returncode for p in procs] == [0, 0], procs[0].stderr[-3000:] + procs[1].stderr[-3000:]
    check_ranks(job, 2, expected)
