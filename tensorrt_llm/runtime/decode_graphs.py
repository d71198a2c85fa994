"""Decode steps replayed, one recording per batch-size bucket: CUDA graphs on a GPU, host
tapes (host_tape.py) on the CPU.

A decode step runs the same kernels with the same shapes every time for a given batch
size, so it is captured once and replayed: on a GPU the launch cost of hundreds of small
kernels becomes one graph launch; on the CPU the Python around each op's host kernel goes.
Inputs live in static buffers that every recording reads; a step copies the new tokens,
lengths and block tables into them (from pinned host memory straight into the buffers; the
block tables are updated in place) and replays the recording of the smallest bucket that
holds the batch; a CUDA graph computes the positions from the lengths itself. Rows of the
bucket past the real batch are padding: they point at a scratch KV block of their own, so
they never touch another sequence's cache.

Greedy steps (`step_greedy`, CUDA): a second graph of the bucket also takes each row's argmax,
writes it into the token buffer, where the next step reads its input, and adds one to each
row's length: a batch that goes on decoding greedily needs no copy of its tokens, no sampling
launches and, while no row gains a KV block, no copy of its lengths or block tables between
replays. The buffers' contents are tracked on the host (what the queued work leaves in them),
and a step copies only what differs. Between two replays of a batch-1 step of the INT4 8B
engine there had been ten small GPU operations (copies, the positions, the argmax's two
kernels), 31.5 us of a 2.08 ms step. The argmax also writes the tokens into pinned host memory
(two rows, used in turn), so no copy to the host follows the replay: that copy and its event
had cost ~10 us a step (H200, the INT4 8B engine's greedy graph at batch 1: 1.8036 ms a replay
alone, 1.8118 with them).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..logger import logger
from ..ops.attention_cuda import cache_written_before_launch
from ..ops.launch import cuda_kernels_available
from .host_tape import HostTape, TapeRefused
from .sampling import argmax_rows
from .session import Session

# The first replays of each host tape are checked against the step run as usual (a value the
# step read into Python unseen would be frozen into the tape: host_tape.py).
VERIFY_STEPS = 2


class GreedyTokens(NamedTuple):
    """A greedy step's tokens: on the device (the next step's input buffer) and, where the graph
    writes them there too, a pinned host view, filled once the step's work is done and valid
    until the greedy step after next (None: copy them)."""
    device: torch.Tensor
    host: Optional[torch.Tensor]


def batch_buckets(max_batch_size: int, small=(1, 2, 4)) -> list[int]:
    """The sizes in `small`, 8, then every multiple of 8 up to max_batch_size (and max_batch_size
    itself). On the CPU, where a padding row costs as much as a real one, small is 1 to 8."""
    sizes = [b for b in small if b < max_batch_size]
    sizes += list(range(8, max_batch_size, 8))
    return sorted(set(sizes + [max_batch_size]))


class DecodeGraphs:
    """The decode recordings of one session (a CUDA or a CPU one)."""

    def __init__(self, session: Session, kv_cache_pool: torch.Tensor, max_batch_size: int,
                 max_blocks_per_seq: int, scratch_block: int):
        dev = session.device
        self.session = session
        self.on_cpu = dev.type == "cpu"
        self.buckets = batch_buckets(max_batch_size, range(1, 9) if self.on_cpu else (1, 2, 4))
        n = max_batch_size
        self.input_ids = torch.zeros(n, dtype=torch.int32, device=dev)
        self.position_ids = torch.zeros(n, dtype=torch.int32, device=dev)
        self.last_token_ids = torch.arange(n, dtype=torch.int64, device=dev)
        self.sequence_lengths = torch.ones(n, dtype=torch.int32, device=dev)
        self.context_lengths = torch.ones(n, dtype=torch.int32, device=dev)
        self.host_context_lengths = torch.ones(n, dtype=torch.int32)
        # Read by no decode path (values would be frozen into the graph); present because
        # the network declares it.
        self.host_sequence_lengths = torch.ones(n, dtype=torch.int32)
        self.block_tables = torch.full((n, max_blocks_per_seq), scratch_block, dtype=torch.int32, device=dev)
        self.scratch_block = scratch_block
        self.kv_cache_pool = kv_cache_pool
        self.max_batch_size = max_batch_size
        self.graphs: dict[int, torch.cuda.CUDAGraph | HostTape] = {}
        self.greedy_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # CUDA: the step, then its argmax
        # The greedy graphs' tokens, also in pinned host memory: row token_slot % 2 of host_tokens,
        # token_slot then + 1 (on the device, by the argmax); _greedy_replays counts the same on the host.
        self.host_tokens = self.token_slot = None
        if not self.on_cpu and cuda_kernels_available():
            self.host_tokens = torch.zeros((2, n), dtype=torch.int32, pin_memory=True)
            self.token_slot = torch.zeros(1, dtype=torch.int32, device=dev)
        self._greedy_replays = 0
        self.memory_pool = None if self.on_cpu else torch.cuda.graph_pool_handle()
        # (rows, lengths, block tables) as host tensors: what rows [:rows] of the input buffers
        # hold once the queued work is done (a greedy replay leaves the lengths one higher), an
        # entry None where that is not known (inputs given on the device, a direct replay).
        self._held: tuple[int, torch.Tensor | None, torch.Tensor | None] | None = None
        self.plan_only: set[int] = set()  # CPU buckets whose step a tape refused: run as usual
        self.unverified: dict[int, int] = {}  # CPU buckets: replays still to check
        # Every graph ends by copying its output into this one buffer [max_batch_size, ...]
        # (made at the first capture): a buffer per graph would hold [bucket, vocab] float32
        # logits for each of up to ~70 buckets, 8.5 GB at max_batch_size 512 and Llama 3's
        # vocabulary. The copy costs about 1% of a 512-row step.
        self.output: torch.Tensor | None = None

    def _feed(self, b: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.input_ids[:b],
            "position_ids": self.position_ids[:b],
            "last_token_ids": self.last_token_ids[:b],
            "kv_cache_pool": self.kv_cache_pool,
            "block_tables": self.block_tables[:b],
            "sequence_lengths": self.sequence_lengths[:b],
            "context_lengths": self.context_lengths[:b],
            "host_context_lengths": self.host_context_lengths[:b],
            "host_sequence_lengths": self.host_sequence_lengths[:b],
        }

    def _run(self, b: int) -> torch.Tensor:
        """The bucket's step run as usual, op by op: its network output."""
        return self.session.run(self._feed(b), check=False)[self.session.network.outputs[0]]

    def _capture(self, b: int, greedy: bool = False):
        if self.on_cpu:
            self._capture_tape(b)
            return
        feed = self._feed(b)
        # Warm-up outside the graph (lazy initialisation, autotuning), on a side stream as
        # capture requires.
        stream = torch.cuda.Stream(self.session.device)
        stream.wait_stream(torch.cuda.current_stream(self.session.device))
        name = self.session.network.outputs[0]
        with torch.cuda.stream(stream):
            for _ in range(2):
                torch.sub(self.sequence_lengths[:b], 1, out=self.position_ids[:b])
                output = self.session.run(feed, check=False)[name]
                if greedy:
                    argmax_rows(output)
        torch.cuda.current_stream(self.session.device).wait_stream(stream)
        if self.output is None:
            self.output = torch.empty((self.max_batch_size, *output.shape[1:]), dtype=output.dtype,
                                      device=output.device)
        del output
        graph = torch.cuda.CUDAGraph()
        # One step a graph: its attention may read the cache before its predecessor kernel ends.
        with torch.cuda.graph(graph, pool=self.memory_pool), cache_written_before_launch():
            torch.sub(self.sequence_lengths[:b], 1, out=self.position_ids[:b])
            # The logits, or the hidden states a non-last pipeline stage sends (the graph
            # holds that send and the previous stage's receive, not the logits' way back).
            # Its own output is freed after capture: later graphs of the pool may reuse that
            # memory, as the copy has taken what this graph's step needs.
            self.output[:b].copy_(self.session.run(feed, check=False)[name])
            if greedy:  # the next step's input tokens and lengths (and the tokens for the host)
                argmax_rows(self.output[:b], out=self.input_ids[:b], advance=self.sequence_lengths[:b],
                            host_out=self.host_tokens, host_slot=self.token_slot)
        (self.greedy_graphs if greedy else self.graphs)[b] = graph

    def _capture_tape(self, b: int):
        self._run(b)  # warm-up: what an op makes at its first call (weight packs)
        tape = HostTape()
        try:
            tape.capture(lambda: self._run(b), self.session.plan_globals)
        except TapeRefused as e:
            logger.info(f"decode steps of {b} rows run without a host tape: {e}")
            self.plan_only.add(b)
            return
        self.graphs[b] = tape
        self.unverified[b] = VERIFY_STEPS

    def _replay_tape(self, b: int) -> torch.Tensor:
        """The bucket's output from its tape; while the tape is unverified, the step is run as
        usual too, and the tape dropped at the first difference (that step's output returned)."""
        tape = self.graphs[b]
        tape.replay()
        output = tape.output
        if self.unverified.get(b, 0) > 0:
            expected = self._run(b)
            if not torch.equal(expected, output):
                logger.warning(f"decode steps of {b} rows run without a host tape: its replay differed from the step")
                del self.graphs[b]
                self.plan_only.add(b)
                return expected
            self.unverified[b] -= 1
        return output

    def capture(self, buckets=None) -> None:
        """Capture the graphs of `buckets` (default: every bucket; on a GPU the plain and the
        greedy one of each) now instead of at their first step, so that a timed or
        latency-bound run does not pay for captures."""
        for b in sorted(buckets or self.buckets, reverse=True):
            b = self.bucket(b)
            if b not in self.graphs and b not in self.plan_only:
                self._capture(b)
            if not self.on_cpu and b not in self.greedy_graphs:
                self._capture(b, greedy=True)

    def bucket(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"batch of {n} exceeds the largest bucket {self.buckets[-1]}")

    def step(self, input_ids: torch.Tensor, sequence_lengths: torch.Tensor,
             block_tables: torch.Tensor) -> torch.Tensor:
        """Logits [n, vocab] of one decode step of n sequences (a view, valid until the next
        step; a non-last pipeline stage's hidden states [n, hidden]). Lengths and block tables
        on the host (copied where they differ from what the buffers hold) or the device;
        `input_ids` may be `step_greedy`'s tokens."""
        n, b = self._inputs(input_ids, sequence_lengths, block_tables)
        if b not in self.graphs and b not in self.plan_only:
            self._capture(b)
        if self.on_cpu:
            if b in self.plan_only:
                return self._run(b)[:n]
            return self._replay_tape(b)[:n]
        self.graphs[b].replay()
        return self.output[:n]

    def step_greedy(self, input_ids: torch.Tensor, sequence_lengths: torch.Tensor,
                    block_tables: torch.Tensor) -> tuple[torch.Tensor, GreedyTokens]:
        """`step` with each row's argmax taken in the graph (CUDA): logits [n, vocab] (a view
        valid until the next step) and the tokens, int32 [n]: on the device, the token buffer the
        next step reads (passed back as its `input_ids`, not copied), and in pinned host memory."""
        if self.on_cpu:
            raise ValueError("step_greedy replays CUDA graphs")
        n, b = self._inputs(input_ids, sequence_lengths, block_tables)
        if b not in self.greedy_graphs:
            self._capture(b, greedy=True)
        self.greedy_graphs[b].replay()
        host = self._greedy_replayed()
        if self._held is not None and self._held[1] is not None:  # the graph advanced them
            self._held = (n, self._held[1] + 1, self._held[2])
        return self.output[:n], GreedyTokens(self.input_ids[:n], None if host is None else host[:n])

    def _greedy_replayed(self) -> Optional[torch.Tensor]:
        """After a greedy replay: the host row its argmax writes."""
        if self.host_tokens is None:
            return None
        row = self.host_tokens[self._greedy_replays % 2]
        self._greedy_replays += 1
        return row

    def replay(self, b: int, greedy: bool = False) -> None:
        """Replay bucket b's graph on whatever its buffers hold (benchmarks: the inputs set by a
        `step` before). A greedy replay advances the lengths each time."""
        self._held = None
        (self.greedy_graphs if greedy else self.graphs)[b].replay()
        if greedy:
            self._greedy_replayed()

    def _inputs(self, input_ids, sequence_lengths, block_tables) -> tuple[int, int]:
        """The step's inputs into the buffers: (rows, bucket). Host lengths and tables equal to
        what the buffers already hold are not copied."""
        n = input_ids.shape[0]
        b = self.bucket(n)
        if input_ids.data_ptr() != self.input_ids.data_ptr():  # else: the last greedy step's tokens
            self.input_ids[:n].copy_(input_ids, non_blocking=True)
        held = self._held if self._held is not None and self._held[0] == n else (n, None, None)
        lengths = self._held_or_copied(sequence_lengths, held[1], self.sequence_lengths[:n])
        tables = self._held_or_copied(block_tables, held[2], self.block_tables[:n])
        self._held = (n, lengths, tables)
        if b > n:  # padding rows: one token at position 0 of the scratch block
            self.input_ids[n:b].zero_()
            self.sequence_lengths[n:b].fill_(1)
            self.block_tables[n:b].fill_(self.scratch_block)
        if self.on_cpu:  # a CUDA graph computes the positions itself
            torch.sub(self.sequence_lengths[:b], 1, out=self.position_ids[:b])
        return n, b

    def _held_or_copied(self, value: torch.Tensor, held: torch.Tensor | None,
                        buffer: torch.Tensor) -> torch.Tensor | None:
        """Copy `value` into `buffer` unless it equals `held` (what the buffer holds). Returns
        what the buffer holds afterwards as a host tensor, or None when `value` is on the GPU."""
        on_host = value.device.type == "cpu"
        if on_host and held is not None and torch.equal(value, held):
            return held
        if not on_host:
            buffer.copy_(value, non_blocking=True)
            return None
        # A copy of our own, which the caller cannot change afterwards; on a GPU in pinned memory,
        # since a copy from pageable memory would wait for the queued steps.
        if self.on_cpu or value.is_pinned():  # (pin_memory() keeps a pinned tensor as it is)
            value = value.clone()
        if not self.on_cpu:
            value = value.pin_memory()
        buffer.copy_(value, non_blocking=True)
        return value
