"""One forward pass of the engine over any mix of prompts, prompt chunks and decodes.

A row computes tokens [start, start + n) of its sequence: the feed packs every row's
tokens, tells attention how many are new (`context_lengths`, n) and how long each sequence
is once they are added (`sequence_lengths`), and asks for the logits of the rows that
sample (their last token) or want their prompt's logits (all of them). The feed is
truthful for every mix, host copies included, so each attention path can read what it
needs. A step of decodes only replays a CUDA graph of its batch bucket.

Tokens sampled by the previous step may still be on the device: `pending` gives, for a
decode row, the device tensor and index its input token is read from, so the step can be
launched before the host has seen that token.

A pipeline stage's network ends at its hidden-state send or its logits; the logits of a
step reach every stage through the runner's `LogitsExchange` (pipeline.py): `run` waits for
them, `launch` returns them in flight, so a stage computes the next step meanwhile.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .decode_graphs import DecodeGraphs, GreedyTokens
from .kv_cache_manager import KVCacheManager
from .pipeline import InFlightLogits, LogitsExchange
from .session import Session


@dataclass
class StepInput:
    """What one row computes: `tokens` (known values; for a pending decode, empty), its
    KV sequence id, the first position and the count."""
    seq_id: object
    tokens: list[int]
    start: int
    num_tokens: int
    logits: str = "last"          # "last", "all" (context logits) or "none"
    pending: Optional[tuple[torch.Tensor, int]] = None   # (device tokens, index) of the input


class StepRunner:

    def __init__(self, session: Session, kv_cache: KVCacheManager, kv_cache_pool: torch.Tensor,
                 decode_graphs: Optional[DecodeGraphs] = None,
                 logits_exchange: Optional[LogitsExchange] = None):
        self.session = session
        self.kv_cache = kv_cache
        self.kv_cache_pool = kv_cache_pool
        self.decode_graphs = decode_graphs
        self.logits_exchange = logits_exchange
        self.device = session.device
        self._pin = self.device.type == "cuda"
        # "logits", or the hidden states a non-last pipeline stage sent.
        self._output = session.network.outputs[0]

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor on the runner's device without waiting for queued work (pinned)."""
        if self._pin:
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def run(self, rows: list[StepInput]) -> tuple[torch.Tensor, list[int]]:
        """Logits [L, V] and, per row, how many of those rows are its (0, 1, or n for
        "all"), in row order."""
        output, counts, _ = self._forward(rows)
        if self.logits_exchange is not None:
            output = self.logits_exchange.start(output, sum(counts), slot=0).wait()
        return output, counts

    def run_greedy(self, rows: list[StepInput]) -> tuple[torch.Tensor, list[int], Optional[GreedyTokens]]:
        """`run` for rows that all sample greedily from unprocessed logits: also each row's
        argmax (decode_graphs.GreedyTokens: int32 [L] on the device, a view valid until the next
        step, and its pinned host copy) where a CUDA graph of the step took it (decodes only, one
        pipeline stage), else None (the caller samples)."""
        if self.logits_exchange is not None:
            return (*self.run(rows), None)
        return self._forward(rows, greedy=True)

    def launch(self, rows: list[StepInput], slot: int) -> tuple[InFlightLogits, list[int]]:
        """`run` of a pipeline stage that does not wait for the logits: they travel in `slot`
        (one per step in flight)."""
        output, counts, _ = self._forward(rows)
        return self.logits_exchange.start(output, sum(counts), slot), counts

    def _forward(self, rows: list[StepInput], greedy: bool = False):
        """The network's output for `rows` (a non-last pipeline stage's: the hidden states it
        sent), the logits counts per row, and (greedy, a decode step replayed on a GPU) each
        row's argmax, else None."""
        counts = [r.num_tokens if r.logits == "all" else int(r.logits == "last") for r in rows]
        decode_only = all(r.num_tokens == 1 and r.logits == "last" for r in rows)
        input_ids = self._input_ids(rows)
        host_tables = self.kv_cache.get_block_table([r.seq_id for r in rows])
        if decode_only:
            host_lengths = torch.tensor([r.start + 1 for r in rows], dtype=torch.int32)
            graphs = self.decode_graphs
            if graphs is not None:  # from the host straight into the recordings' inputs, where they differ
                if greedy and not graphs.on_cpu:
                    logits, tokens = graphs.step_greedy(input_ids, host_lengths, host_tables)
                    return logits, counts, tokens
                return graphs.step(input_ids, host_lengths, host_tables), counts, None
            return self._decode(input_ids, self.to_device(host_lengths), self.to_device(host_tables),
                                host_lengths), counts, None
        tables = self.to_device(host_tables)

        starts = torch.tensor([r.start for r in rows], dtype=torch.int32)
        new = torch.tensor([r.num_tokens for r in rows], dtype=torch.int32)
        ends = torch.cumsum(new.to(torch.int64), 0)
        positions = torch.cat([torch.arange(r.start, r.start + r.num_tokens, dtype=torch.int32) for r in rows])
        wanted = []
        for r, end, count in zip(rows, ends.tolist(), counts):
            wanted.extend(range(end - count, end))
        if not wanted:  # no row needs logits (prompt chunks only): compute one, unused
            wanted = [int(ends[-1]) - 1]
        lengths = starts + new
        feed = {
            "input_ids": input_ids,
            "position_ids": self.to_device(positions),
            "last_token_ids": self.to_device(torch.tensor(wanted, dtype=torch.int64)),
            "kv_cache_pool": self.kv_cache_pool,
            "block_tables": tables,
            "sequence_lengths": self.to_device(lengths),
            "context_lengths": self.to_device(new),
            "host_context_lengths": new,
            "host_sequence_lengths": lengths,
        }
        output = self.session.run(feed, check=False)[self._output]
        if sum(counts) == 0:
            output = output[:0]
        return output, counts, None

    def _input_ids(self, rows: list[StepInput]) -> torch.Tensor:
        """The packed input tokens on the device; pending ones gathered there."""
        ids = []
        pending_at, pending_src = [], []
        offset = 0
        for r in rows:
            if r.pending is not None:
                pending_at.append(offset)
                pending_src.append(r.pending)
                ids.append(0)
            else:
                ids.extend(r.tokens)
            offset += r.num_tokens
        if pending_at:
            source = pending_src[0][0]
            if any(src is not source for src, _ in pending_src):
                raise ValueError("pending tokens must all come from the previous step")
            if (len(pending_at) == len(ids) == offset == source.shape[0] and source.dtype == torch.int32
                    and all(i == j for j, (_, i) in enumerate(pending_src))):
                # Every row decodes the token it sampled last step, in the same order (the
                # steady state of a batch): those tokens are the input as they are. Five fewer
                # copies and gathers on the device before each step.
                return source
        out = self.to_device(torch.tensor(ids, dtype=torch.int32))
        if pending_at:
            index = self.to_device(torch.tensor([i for _, i in pending_src], dtype=torch.int64))
            at = self.to_device(torch.tensor(pending_at, dtype=torch.int64))
            out.index_copy_(0, at, source.index_select(0, index).to(torch.int32))
        return out

    # -- the two shapes beam search drives directly ----------------------------------------

    def context(self, seq_ids: list, prompts: list[list[int]], return_context_logits: bool):
        """Fresh prompts of the sequences `seq_ids` (a `run` of whole prompts). Returns (logits
        of each prompt's last token [B, V], each prompt's logits when return_context_logits
        else None)."""
        mode = "all" if return_context_logits else "last"
        logits, counts = self.run([StepInput(s, p, 0, len(p), mode) for s, p in zip(seq_ids, prompts)])
        if not return_context_logits:
            return logits, None
        last = torch.cumsum(torch.tensor(counts), 0) - 1
        return logits[last.to(logits.device)], list(torch.split(logits, counts))

    def decode(self, tokens: torch.Tensor, lengths: torch.Tensor, block_tables: torch.Tensor,
               host_lengths: torch.Tensor, use_graphs: bool = True) -> torch.Tensor:
        """Logits [n, V] of one decode step: `tokens` [n] (device) of sequences holding
        `lengths` [n] tokens once these are added (`host_lengths`: the same on the host), in
        `block_tables` (device). A replay of the runner's decode recording when it has them
        (a CUDA graph, or a host tape on the CPU: the logits are then a view valid until the
        next step; the recording reads lengths on the device only)."""
        output = self._decode(tokens, lengths, block_tables, host_lengths, use_graphs)
        if self.logits_exchange is not None:
            output = self.logits_exchange.start(output, tokens.numel(), slot=0).wait()
        return output

    def _decode(self, tokens, lengths, block_tables, host_lengths, use_graphs: bool = True):
        """`decode`'s network output (a non-last pipeline stage's: the hidden states it sent)."""
        if self.decode_graphs is not None and use_graphs:
            return self.decode_graphs.step(tokens, lengths, block_tables)
        n = tokens.numel()
        ones = torch.ones(n, dtype=torch.int32)
        feed = {
            "input_ids": tokens,
            "position_ids": lengths - 1,
            "last_token_ids": torch.arange(n, dtype=torch.int64, device=self.device),
            "kv_cache_pool": self.kv_cache_pool,
            "block_tables": block_tables,
            "sequence_lengths": lengths.clone(),
            "context_lengths": self.to_device(ones),
            "host_context_lengths": ones,
            "host_sequence_lengths": host_lengths,
        }
        return self.session.run(feed, check=False)[self._output]
