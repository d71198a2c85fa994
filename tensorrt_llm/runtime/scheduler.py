"""Which requests run in the next step, and how many of their tokens: no GPU work.

Policy, every step (iteration-level scheduling, as TensorRT-LLM's and vLLM's):
  1. running requests, oldest first, each get their next tokens: one for a decode, a chunk
     of the rest for a request still in prefill. A request whose next tokens need a block
     the pool does not have preempts the youngest running request (its blocks are freed;
     it waits at the head of the queue and is recomputed later), itself if it is the
     youngest;
  2. waiting requests, in arrival order, are admitted while the batch has room
     (`max_batch_size` sequences), the token budget has room (`max_num_tokens`) and the
     pool has the blocks for what they compute now plus a small reserve, so that admitting
     does not at once preempt someone. A prompt whose cached prefix the pool holds starts
     after it (block reuse). The first waiting request that does not fit stops admission
     (first come, first served).
Without chunked context a prompt is computed whole in one step (it must fit the budget);
with it, a prompt longer than what is left of the budget takes that much now and the rest
in later steps, while the running requests keep decoding.

Groups (a pipeline of `num_groups` stages): each running request belongs to the group it
was admitted into, and `schedule(group)` is one step of that group alone: its requests,
its preemptions (so a request of another group, whose step is in flight, is never touched)
and new requests while the group holds less than its share (`group_share`: the running and
waiting requests spread evenly over the groups; at most `max_batch_size`), so the groups
stay equally full and every stage's step is about as long.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .kv_cache_manager import KVCacheFullError, KVCacheManager
from .request import Request, RequestState


@dataclass
class ScheduledRow:
    request: Request
    start: int        # first token computed (== request.num_computed)
    num_tokens: int   # tokens computed this step

    @property
    def samples(self) -> bool:
        """Whether this step computes the request's last token, so its logits pick the next."""
        return self.start + self.num_tokens == self.request.num_tokens


@dataclass
class ScheduledStep:
    rows: list[ScheduledRow]           # decodes first, then prefill chunks
    preempted: list[Request]

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.rows)


class Scheduler:

    def __init__(self, kv_cache: KVCacheManager, max_batch_size: int, max_num_tokens: int,
                 enable_chunked_context: bool = False, reserve_fraction: float = 0.01,
                 num_groups: int = 1):
        self.kv = kv_cache
        self.num_groups = num_groups
        self.group_of: dict[int, int] = {}  # request id -> its group, while running (num_groups > 1)
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.enable_chunked_context = enable_chunked_context
        self.reserve_blocks = int(kv_cache.num_blocks * reserve_fraction)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []   # oldest first
        self._arrivals = 0

    # -- queue -----------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        request.arrival = self._arrivals
        self._arrivals += 1
        request.state = RequestState.WAITING
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Take a request out (finished or aborted); its blocks return to the pool."""
        if request in self.running:
            self.running.remove(request)
            self.group_of.pop(request.request_id, None)
            self.kv.free_sequence(request.request_id)
        elif request in self.waiting:
            self.waiting.remove(request)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step --------------------------------------------------------------------------

    def schedule(self, group: int = 0) -> ScheduledStep:
        budget = self.max_num_tokens
        decodes, chunks, preempted = [], [], []
        if self.num_groups == 1:
            running, room = list(self.running), self.max_batch_size
        else:
            sizes = [0] * self.num_groups
            for r in self.running:
                sizes[self.group_of[r.request_id]] += 1
            running = [r for r in self.running if self.group_of[r.request_id] == group]
            room = min(self.max_batch_size, group_share(sizes, group, len(self.waiting)))
        i = 0
        while i < len(running):
            req = running[i]
            n = req.num_tokens - req.num_computed
            if n > 1:  # prefill (chunked, or recomputing after preemption)
                n = min(n, budget) if self._chunks(req) else n
                if n == 0 or n > budget:
                    i += 1
                    continue
            elif budget == 0:
                i += 1
                continue
            if not self._grow(req, req.num_computed + n, running, preempted):
                continue  # req itself was preempted: running[i] is the next one now
            budget -= n
            (decodes if n == 1 and not req.in_prefill else chunks).append(
                ScheduledRow(req, req.num_computed, n))
            i += 1

        batch = len(decodes) + len(chunks)
        while self.waiting and batch < room and budget > 0:
            req = self.waiting[0]
            if req.num_pending:  # preempted this step: its last token is not known yet
                break
            # A request that returns its prompt's logits computes all of its prompt.
            shared = None if req.return_context_logits else req.tokens
            cached = len(self.kv.cached_prefix(shared)[0]) * self.kv.tokens_per_block if shared else 0
            n = req.num_tokens - cached
            if n > budget:
                if not self._chunks(req):
                    break
                n = budget
            needed = self.kv.blocks_needed(cached + n) - cached // self.kv.tokens_per_block
            if needed + self.reserve_blocks > self.kv.num_free_blocks and self.running:
                break
            try:
                reused = self.kv.add_sequence(req.request_id, cached + n, shared)
            except KVCacheFullError:
                break
            self.waiting.popleft()
            req.num_computed = reused
            req.reused_tokens = max(req.reused_tokens, reused)
            req.state = RequestState.RUNNING
            self.running.append(req)
            if self.num_groups > 1:
                self.group_of[req.request_id] = group
            chunks.append(ScheduledRow(req, reused, n))
            budget -= n
            batch += 1
        return ScheduledStep(decodes + chunks, preempted)

    def _chunks(self, req: Request) -> bool:
        """Whether the request's tokens may be computed over several steps: with chunked
        context, or when they can never fit one step (a preempted request recomputes what
        it generated too, and may have grown past max_num_tokens)."""
        return self.enable_chunked_context or req.num_tokens > self.max_num_tokens

    def _grow(self, req: Request, num_tokens: int, running: list[Request],
              preempted: list[Request]) -> bool:
        """Make room for `req` to hold `num_tokens` tokens, preempting the youngest running
        requests while the pool is short. False when `req` itself was preempted."""
        while True:
            try:
                self.kv.extend(req.request_id, num_tokens)
                return True
            except KVCacheFullError:
                victim = running[-1]
                self._preempt(victim)
                running.pop()
                preempted.append(victim)
                if victim is req:
                    return False

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.group_of.pop(req.request_id, None)
        self.kv.free_sequence(req.request_id)
        req.num_computed = 0
        req.num_preemptions += 1
        req.state = RequestState.WAITING
        self.waiting.appendleft(req)


def group_share(sizes: list[int], group: int, num_waiting: int) -> int:
    """How many requests `group` may hold when the running ones (`sizes`, per group) and the
    waiting ones are spread evenly over the groups: each holds total // groups, and as many
    groups as the remainder one more, the groups already above the even size first."""
    even, extra = divmod(sum(sizes) + num_waiting, len(sizes))
    above = sum(1 for g, n in enumerate(sizes) if g != group and n > even)
    return even + (above < extra)
