"""The logits' way back from the last pipeline stage to the earlier ones, outside the graph.

A stage's network ends at its hidden-state send (a non-last stage) or its logits (the last):
nothing in it waits for a later stage. The executor then moves each step's logits itself:
the last stage `isend`s them to every earlier stage of its pipeline group and each earlier
stage `irecv`s them, both on the group that `distributed.init` made for the logits alone.
`start` returns at once; `InFlightLogits.wait` is where a stage waits, so a stage computes
the next steps while the logits of the earlier ones travel (docs/architecture.md,
"Pipeline parallelism with in-flight batching").

Each step in flight has a slot (its group of requests): gloo matches messages by (peer, tag),
and the slot is the tag; NCCL keeps one communicator's messages in issue order, which every
rank shares, since every rank runs the same steps in the same order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import distributed
from .._utils import str_dtype_to_torch
from ..mapping import Mapping


@dataclass
class InFlightLogits:
    """A step's logits [rows, V] and the transfers that fill them (an earlier stage) or read
    them (the last)."""
    logits: torch.Tensor
    works: list
    waited: bool = False  # wait() was called: the stage no longer computes ahead of them

    def wait(self) -> torch.Tensor:
        """The logits, once they are here (an earlier stage) or sent (the last; on a GPU, the
        current stream waits instead of the host)."""
        try:
            for work in self.works:
                work.wait()
        except Exception as e:
            raise distributed.failed("moving a step's logits", e) from None
        self.works, self.waited = [], True
        return self.logits


class LogitsExchange:

    def __init__(self, mapping: Mapping, vocab_size: int, logits_dtype: str, device: torch.device):
        self.is_last = mapping.is_last_pp_rank()
        self.last = mapping.last_pp_rank()
        self.earlier = mapping.pp_group[:-1]
        self.group = distributed.logits_group()
        self.vocab_size = vocab_size
        self.dtype = str_dtype_to_torch(logits_dtype)
        self.device = device

    def start(self, output: torch.Tensor, rows: int, slot: int) -> InFlightLogits:
        """Start moving one step's `rows` rows of logits: on the last stage `output` is them
        (copied: a CUDA graph's output is overwritten by its next replay), elsewhere it is
        ignored and a buffer receives them."""
        logits = torch.empty((rows, self.vocab_size), dtype=self.dtype, device=self.device)
        if self.is_last:
            logits.copy_(output)
        if rows == 0:
            return InFlightLogits(logits, [])
        try:
            if self.is_last:
                works = [torch.distributed.isend(logits, dst=peer, group=self.group, tag=slot)
                         for peer in self.earlier]
            else:
                works = [torch.distributed.irecv(logits, src=self.last, group=self.group, tag=slot)]
        except Exception as e:
            raise distributed.failed("moving a step's logits", e) from None
        return InFlightLogits(logits, works)
