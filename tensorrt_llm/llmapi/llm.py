"""The LLM API: a model in, text out, on the in-flight batching executor.

    from tensorrt_llm import LLM, SamplingParams
    with LLM("SmolLM2-135M-Instruct.Q4_1.gguf") as llm:
        for out in llm.generate(["The capital of France is"], SamplingParams(max_tokens=16)):
            print(out.outputs[0].text)

`model` is an engine folder, a checkpoint folder, a Hugging Face folder or a GGUF file;
the last three are built into an engine once and cached (model_loader.py). The engine runs in
a process of its own (engine_process.py); this process tokenizes, sends requests, and turns
the tokens that come back into text. `generate` blocks until all are done, `generate_async`
returns a `GenerationResult` to await or to iterate as it streams.

The engine process is started with multiprocessing's "spawn", which imports the script that
made the LLM again in the new process: a script that makes an LLM at its top level keeps that
under `if __name__ == "__main__":`, as multiprocessing asks.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import os
import queue
import threading
import weakref
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from ..errors import ConfigError, RequestError
from ..tokenizer_utils import load_tokenizer
from .detokenizer import IncrementalDetokenizer
from .engine_process import EngineProcess, EngineStats, Update
from .model_loader import detect_kind, folder_split, local_path, resolve_engine
from .sampling_params import SamplingParams

Prompt = Union[str, Sequence[int]]


class _Mailbox:
    """Updates from the engine's receiver thread for the results of one event loop: the loop is woken
    once per batch of updates (one step's worth, for every request it serves), not once per
    update; each wake-up of a loop from another thread is a system call and a GIL hand-over."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._items: collections.deque = collections.deque()
        self._scheduled = False

    def post(self, target: asyncio.Queue, update: Update) -> None:
        """From any thread."""
        self._items.append((target, update))
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        """On the loop: hand out everything posted so far (later posts schedule another)."""
        self._scheduled = False
        while self._items:
            target, update = self._items.popleft()
            target.put_nowait(update)


_mailboxes: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox]" = weakref.WeakKeyDictionary()


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    box = _mailboxes.get(loop)
    if box is None:
        box = _mailboxes[loop] = _Mailbox(loop)
    return box


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[list[dict[int, float]]] = None   # per token: {token: logprob} (chosen + top k)
    finish_reason: Optional[str] = None                  # "stop", "length", "abort" or "error"
    stop_reason: Union[int, str, None] = None            # the stop string or token that ended it
    text_diff: str = ""                                  # new since the previous streamed output
    token_ids_diff: list[int] = field(default_factory=list)
    generation_logits: Optional[object] = None

    @property
    def length(self) -> int:
        return len(self.token_ids)


@dataclass
class RequestOutput:
    request_id: int
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    context_logits: Optional[object] = None
    error: Optional[str] = None


class GenerationResult:
    """One prompt's request(s) as they run: `result()` waits for the end; iterating (sync or
    async) yields a RequestOutput after every update (streaming). One consumer at a time."""

    def __init__(self, llm: "LLM", prompt: Optional[str], prompt_token_ids: list[int],
                 params: SamplingParams, streaming: bool):
        self._llm = llm
        self.params = params
        self.streaming = streaming
        self.requests = params.to_requests(prompt_token_ids, llm.tokenizer)
        self.request_id = self.requests[0].request_id
        self._index = {r.request_id: i for i, r in enumerate(self.requests)}
        self.output = RequestOutput(self.request_id, prompt, list(prompt_token_ids),
                                    [CompletionOutput(i) for i in range(len(self.requests))])
        detok = params.detokenize and llm.tokenizer is not None
        self._detok = [IncrementalDetokenizer(llm.tokenizer, prompt_token_ids, params.skip_special_tokens)
                       if detok else None for _ in self.requests]
        self._open = len(self.requests)
        self._stop_hold = max((len(s) for s in params.stop_strings), default=1)
        self._emitted = [0] * len(self.requests)  # characters of each text streamed so far
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._loop = loop
        self._mailbox = _mailbox(loop) if loop is not None else None
        self._queue = asyncio.Queue() if loop is not None else queue.SimpleQueue()

    # -- from the engine's receiver thread ---------------------------------------------------

    def _sink(self, update: Update) -> None:
        if self._mailbox is not None:
            try:
                self._mailbox.post(self._queue, update)
            except RuntimeError:
                # The consumer's event loop has closed (e.g. asyncio.run returned while a
                # stop string's abort was on its way): nobody is left to tell, and the receiver
                # thread must not die of it.
                pass
        else:
            self._queue.put(update)

    # -- consumer side ---------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self._open == 0

    def _apply(self, update: Update, new_diff: bool = True) -> None:
        """Apply one update; the outputs' diffs are what it added (new_diff) or grow by it."""
        if new_diff:
            for o in self.output.outputs:
                o.token_ids_diff, o.text_diff = [], ""
        i = self._index[update.request_id]
        out = self.output.outputs[i]
        if out.finish_reason is not None:
            return  # ended here (a stop string) before the engine heard of it
        if update.context_logits is not None and i == 0:
            self.output.context_logits = update.context_logits
        if update.generation_logits is not None:
            out.generation_logits = out.generation_logits or []
            out.generation_logits.extend(update.generation_logits)
        out.token_ids_diff = out.token_ids_diff + update.token_ids
        out.token_ids.extend(update.token_ids)
        if update.log_probs:
            out.cumulative_logprob = (out.cumulative_logprob or 0.0) + sum(update.log_probs)
            out.logprobs = out.logprobs or []
            for token, lp, top in zip(update.token_ids, update.log_probs,
                                      update.top_log_probs or [{}] * len(update.token_ids)):
                out.logprobs.append({**top, token: lp})
        text_diff = ""
        detok = self._detok[i]
        if detok is not None:
            new_text = detok.add(update.token_ids)
            if update.finished:
                new_text += detok.flush()
            self._apply_stop_strings(out, new_text)
            # Stream only text that no stop string can take back: the last characters wait
            # until it is clear whether they begin one.
            done = update.finished or out.finish_reason is not None
            upto = len(out.text) if done else max(self._emitted[i], len(out.text) - self._stop_hold + 1)
            text_diff, self._emitted[i] = out.text[self._emitted[i]:upto], upto
        out.text_diff += text_diff
        if update.finished and out.finish_reason is None:
            out.finish_reason = update.finish_reason
            if update.finish_reason == "stop" and out.token_ids:
                out.stop_reason = out.token_ids[-1]
            self.output.error = self.output.error or update.error
        if out.finish_reason is not None:
            self._open -= 1
        self.output.finished = self._open == 0

    def _apply_stop_strings(self, out: CompletionOutput, new_text: str) -> None:
        """Append new text, cut at a stop string it completes (the string itself kept when
        asked); such a request is ended here and aborted in the engine."""
        stops = self.params.stop_strings
        before = len(out.text)
        out.text += new_text
        if not stops or not new_text:
            return
        # Only a stop string that the new text completes can start this late.
        start = max(0, before - self._stop_hold)
        hits = [(out.text.find(s, start), s) for s in stops]
        hits = [(pos, s) for pos, s in hits if pos >= 0]
        if not hits:
            return
        pos, s = min(hits)
        out.text = out.text[:pos + len(s) if self.params.include_stop_str_in_output else pos]
        out.finish_reason, out.stop_reason = "stop", s
        self._llm._engine.abort(self.requests[out.index].request_id)

    def _next_sync(self, timeout: Optional[float] = None) -> RequestOutput:
        self._apply(self._queue.get(timeout=timeout))
        return self.output

    def result(self, timeout: Optional[float] = None) -> RequestOutput:
        """Wait until every completion is done (sync callers)."""
        if self._loop is not None:
            raise RuntimeError("this result belongs to an event loop: use `await result.aresult()`")
        while not self.finished:
            self._next_sync(timeout)
        return self.output

    async def aresult(self) -> RequestOutput:
        while not self.finished:
            self._apply(await self._queue.get())
        return self.output

    def __iter__(self):
        while not self.finished:
            yield self._next_sync()

    def __aiter__(self):
        return self._stream()

    async def _stream(self):
        while not self.finished:
            self._apply(await self._queue.get())
            # A consumer that fell behind takes every update waiting at once: one output (one
            # server event) for several tokens, so it catches up instead of falling further.
            while not self._queue.empty() and not self.finished:
                self._apply(self._queue.get_nowait(), new_diff=False)
            if self.streaming or self.finished:
                yield self.output

    def abort(self) -> None:
        for r in self.requests:
            self._llm._engine.abort(r.request_id)


def _load_engine(progress, *, model, device, build: dict, runtime: dict):
    """In the engine process (rank 0): resolve (build once, cache) and load the engine; returns
    its executor and the resolved model (engine_process.EngineProcess's `start`). With several
    ranks, the others (_follow_engine) learn the engine folder from it once it is built."""
    from .. import distributed
    from ..runtime.model_runner import ModelRunner, _device, default_device
    resolved = resolve_engine(model, progress=progress, **build)
    info = distributed.launch_info()
    if info.world_size > 1:
        device = distributed.device_for(info, _device(device) if device is not None else None)
        distributed.join(device, info)
        distributed.broadcast_object(str(resolved.engine_dir))
    else:
        device = _device(device) if device is not None else default_device()
    return ModelRunner.from_dir(resolved.engine_dir, device=device, **runtime).executor, resolved


def _follow_engine(*, device, runtime: dict):
    """In an engine process of rank > 0: the engine folder rank 0 resolved, this rank of it
    loaded; returns its executor (engine_process's `follow`)."""
    from .. import distributed
    from ..runtime.model_runner import ModelRunner, _device
    info = distributed.launch_info()
    device = distributed.device_for(info, _device(device) if device is not None else None)
    distributed.join(device, info)
    engine_dir = distributed.broadcast_object(None)
    return ModelRunner.from_dir(engine_dir, device=device, **runtime).executor


class LLM:
    """An engine (in a process of its own) with its tokenizer. Build options (max_batch_size,
    max_seq_len, max_num_tokens, ...) apply when an engine is built from `model`; the
    runtime ones (kv_cache_free_gpu_memory_fraction, max_tokens_in_paged_kv_cache,
    enable_chunked_context, enable_block_reuse) to every model. max_batch_size and
    max_num_tokens also limit the executor's steps, so an engine folder takes them as
    runtime limits (at most what it was built for). `progress` is called here with each line
    the engine's build says. tensor_parallel_size / pipeline_parallel_size: the engine is split
    over that many ranks (a Hugging Face folder or GGUF file is converted so; an engine or
    checkpoint folder must be; with neither given, one of those folders keeps its own split and
    the others take one rank), one engine process per rank, all started here (rank 0 talks to
    this process and sends the others each step's requests)."""

    def __init__(self, model, tokenizer=None, *, dtype: str = "auto", device=None,
                 max_batch_size: Optional[int] = None, max_input_len: Optional[int] = None,
                 max_seq_len: Optional[int] = None, max_num_tokens: Optional[int] = None,
                 kv_cache_free_gpu_memory_fraction: float = 0.9,
                 max_tokens_in_paged_kv_cache: Optional[int] = None,
                 enable_chunked_context: bool = True, enable_block_reuse: bool = False,
                 cache_dir=None, progress=print, tensor_parallel_size: Optional[int] = None,
                 pipeline_parallel_size: Optional[int] = None):
        self._engine: Optional[EngineProcess] = None
        self._lock = threading.Lock()
        # An engine folder is used as built, but its executor may take fewer sequences or
        # tokens per step than it was built for: for it, these two are runtime limits only.
        step_limits = dict(max_batch_size=max_batch_size, max_num_tokens=max_num_tokens)
        build_limits = {} if detect_kind(local_path(model)) == "engine" else step_limits
        start = functools.partial(
            _load_engine, model=model, device=device,
            build=dict(dtype=dtype, max_input_len=max_input_len, max_seq_len=max_seq_len, cache_dir=cache_dir,
                       tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size,
                       **build_limits),
            runtime=dict(kv_cache_free_gpu_mem_fraction=kv_cache_free_gpu_memory_fraction,
                         max_tokens_in_paged_kv_cache=max_tokens_in_paged_kv_cache,
                         enable_chunked_context=enable_chunked_context, enable_block_reuse=enable_block_reuse,
                         **step_limits))
        # Bad sizes are refused by resolve_engine in the engine process, with one rank.
        try:
            world = folder_split(model, tensor_parallel_size, pipeline_parallel_size).world_size
        except ConfigError:
            world = 1
        follow = functools.partial(_follow_engine, device=device, runtime=start.keywords["runtime"])
        self._engine = EngineProcess(start, progress, world_size=world, follow=follow)
        info = self._engine.info
        self.engine_dir = info.engine_dir
        self.admission = info.admission            # the limits and checks every request meets
        self.max_batch_size = info.max_batch_size  # sequences per step
        source = tokenizer if tokenizer is not None else info.tokenizer_source
        try:
            # a folder or .gguf file; else a tokenizer object
            self.tokenizer = load_tokenizer(source) if isinstance(source, (str, os.PathLike)) else source
        except BaseException:
            self.shutdown()
            raise

    # -- requests --------------------------------------------------------------------------

    def _prompt_ids(self, prompt: Prompt) -> tuple[Optional[str], list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("a text prompt needs a tokenizer: pass tokenizer= or token ids")
            return prompt, self.tokenizer.encode(prompt)
        return None, list(prompt)

    def generate_async(self, prompt: Prompt, sampling_params: Optional[SamplingParams] = None,
                       streaming: bool = False) -> GenerationResult:
        """Submit one prompt (text or token ids); checked now (RequestError)."""
        return self.generate_many_async([prompt], sampling_params, streaming)[0]

    def generate_many_async(self, prompts: Sequence[Prompt],
                            sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                            streaming: bool = False) -> list[GenerationResult]:
        """Submit prompts together (one SamplingParams for all, or one each): all are checked
        first (RequestError: none is submitted), then they start in the same engine step, so
        their answers do not hang on when each reached the engine."""
        if isinstance(sampling_params, Sequence):
            if len(sampling_params) != len(prompts):
                raise RequestError(f"{len(sampling_params)} sampling params for {len(prompts)} prompts")
            params = list(sampling_params)
        else:
            params = [sampling_params or SamplingParams()] * len(prompts)
        results = []
        for prompt, p in zip(prompts, params):
            text, ids = self._prompt_ids(prompt)
            results.append(GenerationResult(self, text, ids, p or SamplingParams(), streaming))
        self._engine.submit([(r, result._sink) for result in results for r in result.requests])
        return results

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]],
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = True) -> Union[RequestOutput, list[RequestOutput]]:
        """Run prompts to the end, all submitted at once. One prompt (a string or a list of
        ids) gives one RequestOutput; a list of prompts a list, in order."""
        single = isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts
                                              and isinstance(prompts[0], int))
        batch = [prompts] if single else list(prompts)
        results = self.generate_many_async(batch, sampling_params)
        outputs = self._wait_all(results, use_tqdm)
        return outputs[0] if single else outputs

    def _wait_all(self, results: list[GenerationResult], use_tqdm: bool) -> list[RequestOutput]:
        bar = None
        if use_tqdm and len(results) > 1:
            from tqdm import tqdm
            bar = tqdm(total=len(results), desc="Processed requests", unit="req")
        for r in results:
            r.result()
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        return [r.output for r in results]

    def chat(self, messages: list[dict], sampling_params: Optional[SamplingParams] = None) -> RequestOutput:
        """One reply to a conversation ([{"role": ..., "content": ...}]) through the
        tokenizer's chat template."""
        return self.generate_async(self.apply_chat_template(messages), sampling_params).result()

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise RequestError("this model's tokenizer has no chat template")
        if not messages:
            raise RequestError("messages is empty")
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as e:  # a malformed message list: the template's own words
            raise RequestError(f"messages do not fit the chat template: {e}") from None
        # The template writes the special tokens itself.
        return self.tokenizer.encode(text, add_special_tokens=False)

    # -- lifetime --------------------------------------------------------------------------

    @property
    def stats(self) -> EngineStats:
        """The executor's counters, running/waiting requests and KV blocks after the engine's
        latest step."""
        return self._engine.stats

    @property
    def engine_pid(self) -> Optional[int]:
        return self._engine.pid if self._engine is not None else None

    @property
    def running(self) -> bool:
        """Whether the engine takes requests (not shut down, its process alive): a health check."""
        return self._engine is not None and self._engine.running

    @property
    def error(self) -> Optional[str]:
        """Why the engine stopped, when it failed."""
        return self._engine.error if self._engine is not None else None

    def shutdown(self) -> None:
        """Stop the engine process (its requests are aborted) and wait for it to exit."""
        with self._lock:
            if self._engine is not None:
                self._engine.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:
            pass
