"""ModelRunner: load an engine folder and generate from it, the way run.py users expect."""
from __future__ import annotations

import dataclasses
import os
import secrets
from pathlib import Path
from typing import Optional

import torch

from .. import distributed
from ..engine import Engine, check_config_copy, read_engine_config
from ..errors import ConfigError, RequestError
from ..graph_rewriting import tile_weight_only_codes
from ..kv_cache_layout import KVCacheLayout
from ..logger import logger
from ..mapping import Mapping
from ..ops.launch import cuda_kernels_available
from .decode_graphs import DecodeGraphs
from .executor import Executor
from .generation import GenerationSession
from .kv_cache_manager import KVCacheConfig, KVCacheManager, allocate_pool
from .pipeline import LogitsExchange
from .request import ModelLimits
from .sampling import SamplingConfig
from .session import Session
from .step_runner import StepRunner

_cpu_notice_shown = False


def default_device() -> torch.device:
    """The GPU where there is one; otherwise the CPU, said once in one line."""
    global _cpu_notice_shown
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if not _cpu_notice_shown:
        print("[tensorrt_llm] No GPU found: running on the CPU with the reference kernels.")
        _cpu_notice_shown = True
    return torch.device("cpu")


def _device(device) -> torch.device:
    """`device` as a torch.device; ConfigError for a name that is none, or a GPU there is not."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"{device!r} is not a device: {' '.join(str(e).split())}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device} asked for, but no CUDA GPU is available here")
    return device


def tile_order_enabled() -> bool:
    """Whether runners on a GPU put weight-only codes in tile order: yes unless TRTLLM_TILE_CODES=0
    (for comparing the two orders in one build, as TRTLLM_GEMV_PIPELINE=0 compares the GEMVs)."""
    return os.environ.get("TRTLLM_TILE_CODES", "1") != "0"


class ModelRunner:

    def __init__(self, engine: Engine, device: torch.device,
                 kv_cache_free_gpu_mem_fraction: float = 0.9,
                 max_tokens_in_paged_kv_cache: Optional[int] = None,
                 use_cuda_graph: Optional[bool] = None, enable_chunked_context: bool = False,
                 enable_block_reuse: bool = False, max_batch_size: Optional[int] = None,
                 max_num_tokens: Optional[int] = None, use_host_tape: Optional[bool] = None):
        """An engine on `device` with its KV pool, executor and static generate.

        max_batch_size / max_num_tokens: the executor's limits per step (sequences, tokens),
        at most the engine's (its default). enable_chunked_context: prompts longer than what
        is left of a step's token budget are computed over several steps.
        enable_block_reuse: requests share the cached KV blocks of a common prompt prefix.
        use_cuda_graph (default: on a GPU) / use_host_tape (default: on the CPU, one rank):
        decode steps replayed from a recording per batch bucket (decode_graphs.py).
        """
        self.engine = engine
        self.device = device
        cfg = engine.pretrained_config
        # A multi-rank engine: this process's rank and groups (distributed.init, by from_dir).
        self.mapping = Mapping.from_dict(dict(cfg["mapping"], rank=engine.rank))
        self.rank = engine.rank
        if self.mapping.world_size != distributed.world_size():
            raise ConfigError(f"rank {engine.rank} of an engine of {self.mapping.world_size} ranks needs the "
                              f"others: load it with ModelRunner.from_dir in each of {self.mapping.world_size} "
                              f"processes (torchrun or mpirun)")
        bc = engine.build_config
        self.config = cfg
        self.build_config = bc
        if torch.device(device).type == "cuda" and cuda_kernels_available() and tile_order_enabled():
            # Weight-only codes in the order the GPU kernels read them fastest (in place).
            tile_weight_only_codes(engine.network)
        self.session = Session.from_engine(engine, device)
        if not self.mapping.is_last_pp_rank() and "logits" in engine.network.outputs:
            raise ConfigError(f"rank {engine.rank} is a pipeline stage built to wait for the logits inside its "
                              f"network (an engine of an older version): build the engine again")

        layout = KVCacheLayout.of_engine(cfg, bc.tokens_per_block, rank=engine.rank)
        num_layers, num_kv_heads, head_dim = layout.num_layers, layout.num_kv_heads, layout.head_dim
        dtype = layout.dtype
        tpb = bc.tokens_per_block
        max_blocks_per_seq = -(-bc.max_seq_len // tpb)
        # Every beam of every request may hold a whole sequence; a pipeline keeps a batch per
        # stage running (executor.py).
        max_sequences = bc.max_batch_size * bc.max_beam_width * self.mapping.pp_size
        num_blocks = KVCacheConfig(kv_cache_free_gpu_mem_fraction, max_tokens_in_paged_kv_cache).num_blocks(
            device, num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
            tokens_per_block=tpb, dtype=dtype, max_batch_size=max_sequences, max_seq_len=bc.max_seq_len)
        # The ranks of one engine schedule the same steps: one pool size, the smallest any
        # rank's memory allows.
        num_blocks = distributed.agree_min(num_blocks)
        self.kv_cache = KVCacheManager(num_blocks, tpb, max_blocks_per_seq, enable_block_reuse)
        # One block past the manager's: the scratch block that padding rows of a CUDA-graph
        # bucket write into.
        self.kv_cache_pool = allocate_pool(num_blocks + 1, num_layers, num_kv_heads, tpb, head_dim,
                                           dtype, device)
        if use_cuda_graph is None:
            use_cuda_graph = device.type == "cuda"
        if use_cuda_graph and device.type != "cuda":
            raise ValueError("use_cuda_graph needs a CUDA device")
        # Host tapes replay the recorded calls of one process; a multi-rank step's collectives
        # are not theirs to repeat.
        if use_host_tape is None:
            use_host_tape = device.type == "cpu" and self.mapping.world_size == 1
        if use_host_tape and (device.type != "cpu" or self.mapping.world_size != 1):
            raise ValueError("use_host_tape needs the CPU and an engine of one rank")
        graphs = None
        if use_cuda_graph or use_host_tape:
            graphs = DecodeGraphs(self.session, self.kv_cache_pool, bc.max_batch_size, max_blocks_per_seq,
                                  scratch_block=num_blocks)
        limits = ModelLimits(vocab_size=cfg["vocab_size"], max_batch_size=bc.max_batch_size,
                             max_input_len=bc.max_input_len, max_seq_len=bc.max_seq_len,
                             max_num_tokens=bc.max_num_tokens, max_beam_width=bc.max_beam_width)
        exchange = None
        if self.mapping.pp_size > 1:
            exchange = LogitsExchange(self.mapping, cfg["vocab_size"], cfg["logits_dtype"], device)
        step_runner = StepRunner(self.session, self.kv_cache, self.kv_cache_pool, graphs, exchange)
        self.executor = Executor(step_runner, self.kv_cache, limits, max_batch_size=max_batch_size,
                                 max_num_tokens=max_num_tokens, enable_chunked_context=enable_chunked_context,
                                 pipeline_stages=self.mapping.pp_size)
        self.generation = GenerationSession(self.executor)
        logger.info(f"engine on {device}: KV cache of {num_blocks} blocks x {tpb} tokens")

    @classmethod
    def from_dir(cls, engine_dir: str | Path, rank: Optional[int] = None, device=None,
                 **kwargs) -> "ModelRunner":
        """The engine's rank that this process is. A multi-rank engine's processes are started
        by torchrun or mpirun, one per rank: each finds its rank in the launcher's environment
        (distributed.launch_info), checks that there are as many processes as the engine has
        ranks, takes its local GPU (or the CPU) and joins the others (distributed.init).
        `rank`: load that rank of a single-rank launch (a one-rank engine's 0)."""
        engine_dir = Path(engine_dir)
        mapping = Mapping.from_dict(read_engine_config(engine_dir)["pretrained_config"]["mapping"])
        info = distributed.launch_info()
        if mapping.world_size != info.world_size:
            check_config_copy(engine_dir)  # an edited config.json is the problem to name then
            how = (f"launched as {info.world_size} process(es) by {info.launcher}"
                   if info.launcher != "none" else "launched as one process")
            raise ConfigError(
                f"{engine_dir} is an engine of {mapping.world_size} rank(s) (tp_size {mapping.tp_size}, "
                f"pp_size {mapping.pp_size}), {how}: run it with `mpirun -n {mapping.world_size} ...` "
                f"or `torchrun --nproc_per_node {mapping.world_size} ...`")
        if rank is not None and rank != info.rank:
            raise ConfigError(f"rank {rank} asked for, but this process is rank {info.rank} of {info.world_size}")
        if mapping.world_size > 1:
            if device is None and not torch.cuda.is_available() and info.rank == 0:
                default_device()  # the one-line CPU notice, once
            device = distributed.device_for(info, _device(device) if device is not None else None)
        else:
            device = _device(device) if device is not None else default_device()
        mapping = mapping.with_rank(info.rank)
        distributed.init(mapping, device, info)
        engine = Engine.from_dir(engine_dir, rank=info.rank, device=device)
        return cls(engine, device, **kwargs)

    @property
    def is_first_rank(self) -> bool:
        """Rank 0: the one that prints (every rank returns the same tokens)."""
        return self.rank == 0

    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    def generate(self, batch_input_ids, max_new_tokens: int = 32, end_id: Optional[int] = None,
                 pad_id: Optional[int] = None, temperature: float = 1.0, top_k: int = 1,
                 top_p: float = 0.0, random_seed: Optional[int] = None, streaming: bool = False,
                 return_dict: bool = True, output_generation_logits: bool = False,
                 return_context_logits: bool = False, stop_words_list=None, bad_words_list=None,
                 output_log_probs: bool = False, output_cum_log_probs: bool = False,
                 **sampling_kwargs):
        """Generate for a list of prompts, each a 1-D sequence of token ids (a list of ints,
        an integer tensor or numpy array), or for one 2-D integer tensor [batch, tokens] whose
        rows are the prompts, taken whole (GenerationSession.check_request).

        Returns `{"output_ids": [B, beams, max_prompt + max_new_tokens], "sequence_lengths":
        [B, beams]}` (beams = num_beams, best first; beam search adds `sequences_scores`
        [B, beams]), plus logits and log-probs when asked; with `streaming=True` a generator
        of such dicts, one per step. `sampling_kwargs` are SamplingConfig's other fields
        (num_beams, length_penalty, early_stopping, penalties, min_length); the word lists
        and log-probs are GenerationSession.generate's.

        The whole request is checked here, before any work and before a stream is read: a
        bad id, prompt, parameter or word list raises RequestError (a ValueError) in one line.
        """
        unknown = sorted(set(sampling_kwargs) - _SAMPLING_FIELDS)
        if unknown:
            raise RequestError(f"generate() got unknown option(s) {', '.join(unknown)}; sampling "
                               f"options are {', '.join(sorted(_SAMPLING_FIELDS))}")
        if random_seed is None and self.mapping.world_size > 1:
            # The ranks draw the same tokens: rank 0's random seed for all.
            random_seed = distributed.broadcast_object(secrets.randbits(63))
        sampling = SamplingConfig(end_id=end_id, pad_id=pad_id,
                                  temperature=temperature, top_k=top_k, top_p=top_p,
                                  random_seed=random_seed, **sampling_kwargs)
        steps = self.generation.generate(batch_input_ids, sampling, max_new_tokens,
                                         output_generation_logits, return_context_logits,
                                         stop_words_list=stop_words_list,
                                         bad_words_list=bad_words_list,
                                         output_log_probs=output_log_probs,
                                         output_cum_log_probs=output_cum_log_probs,
                                         every_step=streaming)
        if streaming:
            return (_shape(out, return_dict) for out in steps)
        out = None
        for out in steps:
            pass
        return _shape(out, return_dict)


_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingConfig)}


def _shape(out: dict, return_dict: bool):
    out = {k: v for k, v in out.items() if k != "done"}
    return out if return_dict else out["output_ids"]
