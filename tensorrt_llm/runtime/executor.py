"""The in-flight batching executor: one engine, a request queue and the KV pool.

    executor.add_request(request)   # checked now; RequestError names what is wrong
    while executor.has_work:
        for request in executor.step():   # requests with new tokens, or finished
            ...
    executor.abort(request_id)      # its blocks return to the pool at once

Every `step()` is one forward pass: the scheduler (scheduler.py) picks one decode token for
every running request and prompt chunks up to the token budget; the step runner
(step_runner.py) runs them packed; the sampler (sampler.py) picks each request's next
token with its own parameters. A request leaves the batch the step it ends, and its blocks
return to the pool then.

Overlap: a step is launched before the host reads the previous step's tokens (the GPU
computes while the host does the bookkeeping); a decode row whose last token is still on
the device reads it there. A request that turns out to have ended computed one token more
than it needed, inside its own blocks. Requests whose sampling reads their token values
(penalties, multi-token bad words) make the executor wait for the tokens first.

Pipeline parallelism (`pipeline_stages` > 1): the running requests form one group per stage
(scheduler.py), and step() calls take the groups in turn, each launching one step of its
group whose logits come back from the last stage while the next groups' steps are computed
(stage 0 computes group g + 1 while the later stages compute group g). A group's turn first
samples its previous step's logits, then launches its next step (with overlap, from the
sampled tokens still on the device) and reads the tokens; every rank runs the same turns,
samples the same logits and so schedules the same steps.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..errors import RequestError
from .admission import Admission
from .decode_graphs import GreedyTokens
from .kv_cache_manager import KVCacheManager
from .pipeline import InFlightLogits
from .request import ModelLimits, Request, RequestState
from .sampler import Sampled, Sampler, draws_the_argmax
from .scheduler import ScheduledStep, Scheduler
from .step_runner import StepInput, StepRunner


@dataclass
class _Launched:
    """A step whose sampled tokens are on their way to the host."""
    requests: list[Request]                  # the rows that sampled, in order
    tokens: torch.Tensor                     # device int32 [R]
    host: dict = field(default_factory=dict)  # name -> host tensor being filled
    event: Optional[torch.cuda.Event] = None

    def index_of(self, request: Request) -> int:
        return self._index[request.request_id]

    def __post_init__(self):
        self._index = {r.request_id: i for i, r in enumerate(self.requests)}


@dataclass
class _Pipelined:
    """A pipelined step of one group whose logits are on their way from the last stage."""
    group: int
    scheduled: ScheduledStep
    inputs: list[StepInput]
    counts: list[int]
    sampled: list[Request]          # the rows that sample (ScheduledRow.samples, at launch)
    logits: InFlightLogits


@dataclass
class ExecutorStats:
    steps: int = 0
    decode_only_steps: int = 0                # steps of one decode token per request (CUDA graphs)
    peak_used_blocks: int = 0
    preemptions: int = 0
    reused_blocks: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    gpu_wait_s: float = 0.0                   # host time spent waiting for launched steps' tokens:
                                              # near zero means the host, not the GPU, sets the pace
    peak_in_flight: int = 0                   # pipelined steps launched whose logits were not
                                              # waited for yet, at most at once (pipeline_stages
                                              # when the stages overlap; 1 when they run in turn)


class Executor:

    def __init__(self, runner: StepRunner, kv_cache: KVCacheManager, limits: ModelLimits, *,
                 max_batch_size: Optional[int] = None, max_num_tokens: Optional[int] = None,
                 enable_chunked_context: bool = False, overlap: bool = True, pipeline_stages: int = 1):
        """pipeline_stages: the engine's pp_size; above 1 the runner moves the logits between
        the stages (StepRunner.launch) and up to that many steps are in flight."""
        self.runner = runner
        self.kv_cache = kv_cache
        self.limits = limits
        self.device = runner.device
        max_batch_size = min(max_batch_size or limits.max_batch_size, limits.max_batch_size)
        max_num_tokens = min(max_num_tokens or limits.max_num_tokens, limits.max_num_tokens)
        self.scheduler = Scheduler(kv_cache, max_batch_size, max_num_tokens, enable_chunked_context,
                                   num_groups=pipeline_stages)
        self.sampler = Sampler(limits.vocab_size)
        self.admission = Admission(limits, self.scheduler.max_num_tokens, enable_chunked_context,
                                   kv_cache.tokens_per_block, kv_cache.num_blocks)
        self.overlap = overlap and self.device.type == "cuda"
        self.requests: dict[int, Request] = {}
        self.stats = ExecutorStats()
        self._launched: Optional[_Launched] = None
        self.pipeline_stages = pipeline_stages
        self._in_flight: deque[_Pipelined] = deque()  # oldest first, at most one per group
        self._turn = 0                                 # the group the next step() launches
        self._idle_turns = 0

    # -- requests --------------------------------------------------------------------------

    def check(self, request: Request) -> None:
        """Every check of a request before it is queued: RequestError naming what is wrong."""
        self.admission.check(request)

    def add_request(self, request: Request) -> int:
        """Queue a request (checked first). Returns its id."""
        if request.request_id in self.requests:
            raise RequestError(f"request id {request.request_id} is already queued")
        self.check(request)
        self.requests[request.request_id] = request
        self.scheduler.add(request)
        return request.request_id

    def abort(self, request_id: int) -> Optional[Request]:
        """Stop a request now: it leaves the batch, its blocks return to the pool. Returns
        it (finish_reason "abort"), or None when it is not queued or running."""
        request = self.requests.get(request_id)
        if request is None or request.finished:
            return None
        self._finish(request, "abort")
        return request

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or self._launched is not None or bool(self._in_flight)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # -- the loop --------------------------------------------------------------------------

    def step(self) -> list[Request]:
        """One iteration. Returns the requests that got tokens or finished (in this call,
        a step late with overlap; with pipeline stages, the group whose turn it is)."""
        if self.pipeline_stages > 1:
            return self._pipelined_step()
        updated: list[Request] = []
        if self._launched is not None and (
                not self.overlap or any(r.needs_token_values for r in self.scheduler.running)):
            updated += self._resolve(self._launched)
            self._launched = None
        scheduled = self.scheduler.schedule()
        self.stats.preemptions += len(scheduled.preempted)
        launched = self._launch(scheduled) if scheduled.rows else None
        if self._launched is not None:
            updated += self._resolve(self._launched)
        self._launched = launched
        if launched is not None and not self.overlap:
            updated += self._resolve(launched)
            self._launched = None
        if launched is None and self.scheduler.has_work and not updated and not scheduled.preempted:
            # Admission checked that every request fits the pool alone, and an idle pool is
            # all free: a queue that cannot move is a bug, said rather than spun on.
            raise RuntimeError(f"the executor could not schedule any of {self.num_waiting} waiting "
                               f"requests with {self.kv_cache.num_free_blocks} free KV blocks")
        # Each request once, in order.
        return list(dict.fromkeys(updated))

    def _launch(self, scheduled: ScheduledStep) -> _Launched:
        rows = self._inputs(scheduled, self._launched)
        if all(row.samples and draws_the_argmax(row.request) for row in scheduled.rows):
            logits, counts, tokens = self.runner.run_greedy(rows)  # tokens: the step's argmax, or None
        else:
            (logits, counts), tokens = self.runner.run(rows), None
        self._computed(scheduled, rows)
        launched = self._sample(scheduled.rows, rows, logits, counts, tokens)
        self._pend(launched.requests)
        return launched

    def _inputs(self, scheduled: ScheduledStep, previous: Optional[_Launched]) -> list[StepInput]:
        """The step runner's rows of a scheduled step."""
        rows = []
        for row in scheduled.rows:
            r = row.request
            pending = None
            if r.num_pending:
                # The decode input is the token the previous step sampled, still on the device.
                pending = (previous.tokens, previous.index_of(r))
                tokens = []
            else:
                tokens = r.tokens[row.start:row.start + row.num_tokens]
            mode = "all" if self._wants_context(r, row) else ("last" if row.samples else "none")
            rows.append(StepInput(r.request_id, tokens, row.start, row.num_tokens, mode, pending))
        return rows

    def _computed(self, scheduled: ScheduledStep, rows: list[StepInput]) -> None:
        """The step's tokens are queued: count them computed, commit their full blocks."""
        for row in scheduled.rows:
            r = row.request
            r.num_computed += row.num_tokens
            # Its full blocks are reusable from the next step on: their K/V writes are queued
            # before anything a later step runs.
            self.kv_cache.commit(r.request_id, r.tokens, r.num_computed)
            if row.start < r.prompt_len:
                self.stats.prompt_tokens += min(row.num_tokens, r.prompt_len - row.start)
        self.stats.steps += 1
        self.stats.decode_only_steps += all(r.num_tokens == 1 for r in rows)
        self.stats.reused_blocks = self.kv_cache.reused_blocks
        self.stats.peak_used_blocks = max(self.stats.peak_used_blocks, self.kv_cache.num_used_blocks)

    def _sample(self, scheduled_rows, rows: list[StepInput], logits: torch.Tensor,
                counts: list[int], greedy_tokens: Optional[GreedyTokens] = None) -> _Launched:
        """The step's context logits collected and its sampling rows' tokens drawn (on their
        way to the host); `greedy_tokens`: every row's argmax, taken with the step (with a pinned
        host view the step fills itself: nothing is copied)."""
        sampling_rows, sampled = [], []
        offset = 0
        for row, step_input, count in zip(scheduled_rows, rows, counts):
            r = row.request
            if step_input.logits == "all":
                # The prompt positions not collected yet (a preempted request recomputes some).
                first = sum(t.shape[0] for t in r.context_logits) - row.start
                last = min(row.num_tokens, r.prompt_len - row.start)
                r.context_logits.append(logits[offset + first:offset + last].float().cpu())
            if row.samples:
                sampling_rows.append(offset + count - 1)
                sampled.append(r)
            offset += count
        if not sampled:
            return _Launched([], torch.empty(0, dtype=torch.int32, device=self.device))

        rows_logits = logits
        if len(sampling_rows) != logits.shape[0]:
            # Through pinned memory: a pageable copy would wait for the step just queued.
            index = self.runner.to_device(torch.tensor(sampling_rows, dtype=torch.int64))
            rows_logits = logits.index_select(0, index)
        if any(r.return_generation_logits for r in sampled):  # (a view per row costs ~20 us)
            for i, r in enumerate(sampled):
                if r.return_generation_logits:
                    r.generation_logits.append(rows_logits[i].float().clone())
        filled = {}  # name -> a host tensor the step fills itself
        if greedy_tokens is not None and len(sampling_rows) == greedy_tokens.device.shape[0]:
            out = Sampled(greedy_tokens.device)
            if greedy_tokens.host is not None:  # valid until the greedy step after next: read at resolve
                filled["tokens"] = greedy_tokens.host
        else:
            out = self.sampler.sample(rows_logits, sampled)
        launched = _Launched(sampled, out.tokens, filled)
        pin = self.device.type == "cuda"
        for name in ("tokens", "log_probs", "top_ids", "top_log_probs"):
            value = getattr(out, name)
            if value is not None and name not in filled:
                host = torch.empty(value.shape, dtype=value.dtype, pin_memory=pin)
                host.copy_(value, non_blocking=pin)
                launched.host[name] = host
        if pin:
            launched.event = torch.cuda.Event()
            launched.event.record()
        return launched

    def _pend(self, sampled: list[Request]) -> None:
        """Each sampling request's token is on its way; one that has all its tokens by count
        leaves the batch now."""
        for r in sampled:
            r.num_pending += 1
            if r.num_generated >= r.max_new_tokens:
                # Known without the token's value: it leaves the batch now.
                self._leave(r)

    # -- pipeline stages -------------------------------------------------------------------

    def _pipelined_step(self) -> list[Request]:
        group = self._turn
        self._turn = (group + 1) % self.pipeline_stages
        updated, previous = [], None
        if self._in_flight and self._in_flight[0].group == group:
            previous = self._sample_pipelined(self._in_flight.popleft())
            if not self.overlap or any(r.needs_token_values for r in self.scheduler.running):
                updated += self._resolve(previous)
                previous = None
        scheduled = self.scheduler.schedule(group)
        self.stats.preemptions += len(scheduled.preempted)
        if scheduled.rows:
            # With overlap, the group's decode inputs are its previous step's tokens, still on
            # the device: the host reads them once this step is queued behind them.
            rows = self._inputs(scheduled, previous)
            logits, counts = self.runner.launch(rows, slot=group)
            sampled = [row.request for row in scheduled.rows if row.samples]
            self._computed(scheduled, rows)
            self._pend(sampled)
            self._in_flight.append(_Pipelined(group, scheduled, rows, counts, sampled, logits))
            waiting = sum(not step.logits.waited for step in self._in_flight)
            self.stats.peak_in_flight = max(self.stats.peak_in_flight, waiting)
            self._idle_turns = 0
        if previous is not None:
            updated += self._resolve(previous)
        if not scheduled.rows and not updated and not scheduled.preempted and not self._in_flight:
            self._idle_turns += 1
            if self._idle_turns > self.pipeline_stages and self.scheduler.has_work:
                # Every group had a turn on an idle pipeline and none could start.
                raise RuntimeError(f"the executor could not schedule any of {self.num_waiting} waiting "
                                   f"requests with {self.kv_cache.num_free_blocks} free KV blocks")
        return list(dict.fromkeys(updated))

    def _sample_pipelined(self, step: _Pipelined) -> _Launched:
        """Wait for a pipelined step's logits (on a GPU the stream waits, not the host) and
        sample them as the one-rank executor would have at launch. Rows of requests that ended
        since (aborted, or stopped by a token read after this step was launched) are dropped."""
        logits = step.logits.wait()
        rows = [(row, step_input, count) for row, step_input, count
                in zip(step.scheduled.rows, step.inputs, step.counts) if not row.request.finished]
        if len(rows) < len(step.scheduled.rows):
            kept, offset = [], 0
            for row, count in zip(step.scheduled.rows, step.counts):
                if not row.request.finished:
                    kept.extend(range(offset, offset + count))
                offset += count
            logits = logits[torch.tensor(kept, dtype=torch.int64, device=logits.device)]
        sampled = [r for r in step.sampled if not r.finished]
        # The sampler sees each request as it was before this step's token (launch counted it).
        for r in sampled:
            r.num_pending -= 1
        launched = self._sample([row for row, _, _ in rows], [step_input for _, step_input, _ in rows],
                                logits, [count for _, _, count in rows])
        for r in sampled:
            r.num_pending += 1
        return launched

    @staticmethod
    def _wants_context(r: Request, row) -> bool:
        """Whether this row computes prompt positions whose logits r asked for and lacks."""
        if not r.return_context_logits:
            return False
        collected = sum(t.shape[0] for t in r.context_logits)
        return row.start <= collected < min(row.start + row.num_tokens, r.prompt_len)

    def _resolve(self, launched: _Launched) -> list[Request]:
        """The host reads a launched step's tokens: append, stop, finish."""
        if not launched.requests:
            return []
        if launched.event is not None:
            t = time.perf_counter()
            launched.event.synchronize()
            self.stats.gpu_wait_s += time.perf_counter() - t
        host = {k: v.tolist() for k, v in launched.host.items()}
        updated = []
        for i, r in enumerate(launched.requests):
            if r.finished or not r.num_pending:
                continue  # aborted, or stopped by an earlier token: this one is discarded
            token = host["tokens"][i]
            r.tokens.append(token)
            r.num_pending -= 1
            self.stats.generated_tokens += 1
            if r.logprobs:
                r.log_probs.append(host["log_probs"][i])
                if r.top_logprobs:
                    r.top_log_probs.append(dict(zip(host["top_ids"][i][:r.top_logprobs],
                                                    host["top_log_probs"][i][:r.top_logprobs])))
            updated.append(r)
            if r.stopped_by(token):
                self._finish(r, "stop")
            elif r.state is RequestState.LEAVING and not r.num_pending:
                self._finish(r, "length")  # its last token (a later step's) is in
            elif r.state is RequestState.RUNNING:  # the token's block may be full now
                self.kv_cache.commit(r.request_id, r.tokens, r.num_computed)
        return updated

    def _leave(self, r: Request) -> None:
        """Out of the batch and the pool now (its blocks committed at launch); its last
        token is still on its way."""
        self.scheduler.remove(r)
        r.state = RequestState.LEAVING

    def _finish(self, r: Request, reason: str) -> None:
        if r.state is not RequestState.LEAVING:
            self.scheduler.remove(r)
        r.state = RequestState.FINISHED
        r.finish_reason = reason
        r.num_pending = 0
        if len(r.context_logits) > 1:
            r.context_logits = [torch.cat(r.context_logits)]
        self.requests.pop(r.request_id, None)
