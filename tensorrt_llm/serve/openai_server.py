"""The OpenAI-compatible HTTP app: FastAPI routes over an LLM (whose engine runs in a process of its own).

    server = OpenAIServer(llm, model_name="smollm2", max_queue_size=64)
    uvicorn.run(server.app)            # what trtllm-serve does (commands/serve.py)

A request is validated against openai_protocol.py by FastAPI, then refused here if it names
another model or the queue is full, then submitted through `LLM.generate_async`, whose request
checks (the engine's limits) refuse what the engine cannot run, before anything is sent to it. The
handler runs in the event loop; the engine steps in its own process (so this event loop does not
share a GIL with it), and a receiver thread hands each step's updates to the requests' asyncio
queues (one wake-up of the loop per step). The gauges of /metrics are the engine's counters as of
its latest step. Non-streaming requests are collected; streaming ones are sent as server-sent events
as text arrives. A client that disconnects (or a shutdown that times out) aborts its requests,
which frees their KV blocks at once.

Text is taken from each completion's accumulated text, never its per-update diffs: while a stop
string may be forming, its first characters are held back (the LLM cuts the text where a stop
string starts, which may be in text an earlier update brought).
"""
from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Optional, Union

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from ..llmapi import LLM, CompletionOutput, GenerationResult, SamplingParams
from ..version import __version__
from .auth import BearerAuthMiddleware
from .errors import OpenAIError, install_error_handlers
from .logprobs import TokenText, chat_logprobs, completion_logprobs, prompt_logprobs
from .metrics import ServerMetrics
from .openai_protocol import (
    ChatChoiceLogProbs,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatResponseMessage,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
    DeltaMessage,
    ErrorResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    SamplingRequest,
    UsageInfo,
    VersionResponse,
    random_id,
)

ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 404, 500, 503)}
RETRY_AFTER_SECONDS = 1


class _Choice:
    """One completion as the server follows it: what was sent, and when its tokens came."""

    def __init__(self, index: int, output: CompletionOutput):
        self.index = index
        self.output = output
        self.sent_chars = 0
        self.sent_tokens = 0
        self.counted_tokens = 0
        self.first_token_at: Optional[float] = None
        self.done = False           # finished, as the server counts (metrics, the queue)
        self.last_sent = False      # its last chunk went out (streaming)


class _Generation:
    """The completions of one HTTP request while they run: n per prompt, one GenerationResult
    per prompt. Keeps the server's count of admitted completions and the metrics."""

    def __init__(self, server: "OpenAIServer", results: list[GenerationResult], arrival: float):
        self.server = server
        self.results = results
        self.arrival = arrival
        n = len(results[0].output.outputs)
        self.choices = [_Choice(k * n + i, out) for k, r in enumerate(results)
                        for i, out in enumerate(r.output.outputs)]
        # Characters held back while a stop string may be forming (its first len-1 characters).
        self.hold = max((len(s) for s in results[0].params.stop_strings), default=1) - 1
        server.admitted += len(self.choices)

    @property
    def finished(self) -> bool:
        return all(c.done for c in self.choices)

    def _account(self) -> None:
        now = time.perf_counter()
        metrics = self.server.metrics
        for c in self.choices:
            if c.done:
                continue
            n = len(c.output.token_ids)
            if n > c.counted_tokens:
                metrics.generation_tokens.inc(n - c.counted_tokens)
                c.counted_tokens = n
                if c.first_token_at is None:
                    c.first_token_at = now
                    metrics.on_first_token(now - self.arrival)
            if c.output.finish_reason is not None:
                self._close(c, c.output.finish_reason, now)

    def _close(self, c: _Choice, reason: str, now: float) -> None:
        c.done = True
        self.server.admitted -= 1
        ttft = None if c.first_token_at is None else c.first_token_at - self.arrival
        self.server.metrics.on_finish(reason, c.counted_tokens, ttft, now - self.arrival)

    async def updates(self) -> AsyncIterator[None]:
        """Wakes after every update of any of the results, until all have finished."""
        queue: asyncio.Queue = asyncio.Queue()

        async def follow(result: GenerationResult):
            try:
                async for _ in result:
                    queue.put_nowait(None)
            except Exception as e:  # noqa: BLE001 - handed to the consumer, raised there
                queue.put_nowait(e)
            queue.put_nowait(StopAsyncIteration())

        tasks = [asyncio.ensure_future(follow(r)) for r in self.results]
        open_ = len(tasks)
        try:
            while open_:
                item = await queue.get()
                if isinstance(item, StopAsyncIteration):
                    open_ -= 1
                elif isinstance(item, Exception):
                    raise item
                self._account()
                yield
        finally:
            for t in tasks:
                t.cancel()

    async def run_to_end(self) -> None:
        async for _ in self.updates():
            pass

    def abort(self) -> None:
        """Stop what still runs (the client left, or the server stops); its blocks are freed."""
        if self.finished:
            return
        for r in self.results:
            r.abort()
        now = time.perf_counter()
        for c in self.choices:
            if not c.done:
                self._close(c, "abort", now)

    def new_text(self, c: _Choice) -> str:
        """The text not yet sent that no stop string can take back."""
        text = c.output.text
        end = len(text) if c.output.finish_reason is not None else max(c.sent_chars, len(text) - self.hold)
        new = text[c.sent_chars:end]
        c.sent_chars = end
        return new

    def new_tokens(self, c: _Choice) -> tuple[list[int], list[dict[int, float]]]:
        out = c.output
        start, c.sent_tokens = c.sent_tokens, len(out.token_ids)
        return out.token_ids[start:], (out.logprobs or [])[start:]

    def failure(self) -> Optional[OpenAIError]:
        """Why the request could not finish, when it could not."""
        for c in self.choices:
            if c.output.finish_reason == "error":
                error = self.results[c.index // len(self.results[0].output.outputs)].output.error
                return OpenAIError(500, f"the engine failed: {error or 'unknown error'}")
            if c.output.finish_reason == "abort":
                return OpenAIError(503, "the request was aborted: the server is stopping")
        return None

    def usage(self) -> UsageInfo:
        prompt = sum(len(r.output.prompt_token_ids) for r in self.results)
        completion = sum(len(c.output.token_ids) for c in self.choices)
        return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


class _AbortingStream(StreamingResponse):
    """Server-sent events that abort what still runs however the response ends: sent whole,
    the client gone, or cancelled at shutdown (even before its first event, when the events'
    generator never started and so could not clean up itself)."""

    def __init__(self, generation: _Generation, events: AsyncIterator[str]):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.generation = generation

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.generation.abort()


def _sse(chunk) -> str:
    exclude = {"usage"} if getattr(chunk, "usage", True) is None else None
    return f"data: {chunk.model_dump_json(exclude=exclude)}\n\n"


async def _disconnected(request: Request) -> None:
    """Returns when the client closes its connection."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class OpenAIServer:
    """The FastAPI app (`.app`) of one LLM, served as `model_name`.

    max_queue_size: completions admitted but not yet in the running batch beyond which a request
    is refused (503, Retry-After); None: no limit. api_key: required on /v1/... when set.
    """

    def __init__(self, llm: LLM, model_name: str, *, max_queue_size: Optional[int] = None,
                 api_key: Optional[str] = None):
        self.llm = llm
        self.model_name = model_name
        self.max_queue_size = max_queue_size
        self.created = int(time.time())
        self.admitted = 0  # completions submitted and not yet finished (event-loop thread only)
        self._token_text = TokenText(llm.tokenizer) if llm.tokenizer is not None else None
        self.metrics = ServerMetrics(self._engine_gauges)
        self.app = self._build_app(api_key)

    # -- what the engine can take ------------------------------------------------------------

    @property
    def max_seq_len(self) -> int:
        return self.llm.admission.limits.max_seq_len

    def num_waiting(self) -> int:
        """Completions admitted and not in the running batch (queued in the executor, or on
        their way to it)."""
        return max(0, self.admitted - self.llm.stats.num_running)

    def _engine_gauges(self) -> dict[str, tuple[str, float]]:
        """As of the engine's latest step."""
        stats = self.llm.stats
        return {
            "num_requests_running": ("completions in the running batch", stats.num_running),
            "num_requests_waiting": ("completions admitted, not yet in the running batch", self.num_waiting()),
            "kv_cache_blocks_used": ("KV-cache blocks held by requests", stats.kv_blocks_used),
            "kv_cache_blocks_total": ("KV-cache blocks in the pool", stats.kv_blocks_total),
        }

    def _context_tokens(self) -> int:
        """The most tokens one sequence may hold: max_seq_len, or the whole KV pool if smaller."""
        admission = self.llm.admission
        return min(self.max_seq_len, admission.num_blocks * admission.tokens_per_block)

    # -- admission -------------------------------------------------------------------------

    def _check_common(self, request: SamplingRequest) -> None:
        if request.model != self.model_name:
            raise OpenAIError(404, f"the model '{request.model}' does not exist; this server serves "
                                   f"'{self.model_name}' (GET /v1/models)", param="model", code="model_not_found")
        if request.stream_options is not None and not request.stream:
            raise OpenAIError(400, "stream_options is only allowed when stream is true", param="stream_options")
        if request.logit_bias:
            raise OpenAIError(400, "logit_bias is not supported", param="logit_bias")
        if self.llm.tokenizer is None:
            raise OpenAIError(400, "this server has no tokenizer (start it with --tokenizer)")

    def _start(self, prompts: list[Union[str, list[int]]], params: SamplingParams) -> _Generation:
        """Submit every prompt, or none."""
        if not self.llm.running:
            raise OpenAIError(503, "the engine is not running")
        if self.max_queue_size is not None and self.num_waiting() >= self.max_queue_size:
            raise OpenAIError(503, f"the server is busy: {self.num_waiting()} requests are queued "
                                   f"(--max_queue_size {self.max_queue_size}); retry later",
                              code="queue_full", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        arrival = time.perf_counter()
        # One submission: all prompts checked, then queued together (a RequestError, the
        # engine's checks, becomes a 400: errors.py).
        results = self.llm.generate_many_async(prompts, params, streaming=True)
        self.metrics.prompt_tokens.inc(sum(len(r.output.prompt_token_ids) for r in results))
        return _Generation(self, results, arrival)

    async def _respond(self, raw: Request, generation: _Generation, stream: bool,
                       events: AsyncIterator[str], collect) -> Response:
        """Stream the events, or wait for the end and answer `collect()`; either way, a client
        that leaves (or a cancelled handler) aborts what still runs."""
        if stream:
            return _AbortingStream(generation, events)
        try:
            run = asyncio.ensure_future(generation.run_to_end())
            left = asyncio.ensure_future(_disconnected(raw))
            await asyncio.wait({run, left}, return_when=asyncio.FIRST_COMPLETED)
            left.cancel()
            if not run.done():
                run.cancel()
                return Response(status_code=499)  # nobody is listening
            run.result()
        finally:
            generation.abort()
        failure = generation.failure()
        if failure is not None:
            raise failure
        return Response(collect().model_dump_json(), media_type="application/json")

    # -- completions -----------------------------------------------------------------------

    async def completions(self, request: CompletionRequest, raw: Request) -> Response:
        self._check_common(request)
        if request.suffix is not None:
            raise OpenAIError(400, "suffix is not supported", param="suffix")
        if request.best_of is not None and request.best_of != request.n:
            raise OpenAIError(400, "best_of is not supported (other than best_of == n)", param="best_of")
        prompts = request.prompts()
        if not prompts:
            raise OpenAIError(400, "prompt is empty", param="prompt")
        echo_logprobs = request.echo and request.logprobs is not None
        if echo_logprobs and request.stream:
            raise OpenAIError(400, "echo with logprobs is not supported when streaming", param="echo")
        params = request.sampling_params(request.max_tokens, request.logprobs, prompt_logits=echo_logprobs)
        generation = self._start(prompts, params)
        rid, created = random_id("cmpl"), int(time.time())
        k = request.logprobs

        def echo_text(result: GenerationResult) -> str:
            if not request.echo:
                return ""
            if result.output.prompt is not None:
                return result.output.prompt
            return self.llm.tokenizer.decode(result.output.prompt_token_ids)

        def result_of(c: _Choice) -> GenerationResult:
            return generation.results[c.index // request.n]

        def collect() -> CompletionResponse:
            choices = []
            for c in generation.choices:
                result, out = result_of(c), c.output
                prefix = echo_text(result)
                logprobs = None
                if k is not None:
                    ids, lps = list(out.token_ids), list(out.logprobs or [])
                    if echo_logprobs:
                        prompt_ids = result.output.prompt_token_ids
                        ids = list(prompt_ids) + ids
                        lps = prompt_logprobs(prompt_ids, result.output.context_logits, k) + lps
                    logprobs = completion_logprobs(self._token_text, ids, lps, k)
                choices.append(CompletionChoice(index=c.index, text=prefix + out.text, logprobs=logprobs,
                                                finish_reason=out.finish_reason))
            return CompletionResponse(id=rid, created=created, model=self.model_name, choices=choices,
                                      usage=generation.usage())

        async def events() -> AsyncIterator[str]:
            def chunk(c: _Choice, text: str, logprobs=None, finish=None) -> str:
                return _sse(CompletionStreamResponse(id=rid, created=created, model=self.model_name, choices=[
                    CompletionChoice(index=c.index, text=text, logprobs=logprobs, finish_reason=finish)]))
            offsets = {}
            if request.echo:
                for c in generation.choices:
                    prefix = echo_text(result_of(c))
                    offsets[c.index] = len(prefix)
                    yield chunk(c, prefix)
            async for event in self._stream(generation, k is not None):
                if isinstance(event, str):
                    yield event
                    continue
                c, text, ids, lps, finish = event
                logprobs = None
                if k is not None:
                    logprobs = completion_logprobs(self._token_text, ids, lps, k, offsets.get(c.index, 0))
                    offsets[c.index] = offsets.get(c.index, 0) + sum(len(t) for t in logprobs.tokens)
                yield chunk(c, text, logprobs, finish)
            if request.stream_options is not None and request.stream_options.include_usage:
                yield _sse(CompletionStreamResponse(id=rid, created=created, model=self.model_name, choices=[],
                                                    usage=generation.usage()))
            yield "data: [DONE]\n\n"

        return await self._respond(raw, generation, request.stream, events(), collect)

    # -- chat completions ------------------------------------------------------------------

    async def chat_completions(self, request: ChatCompletionRequest, raw: Request) -> Response:
        self._check_common(request)
        if request.top_logprobs is not None and not request.logprobs:
            raise OpenAIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        prompt_ids = self.llm.apply_chat_template([m.for_template() for m in request.messages])
        max_tokens = request.max_completion_tokens or request.max_tokens
        if max_tokens is None:  # the rest of the context (at least 1: the engine explains a full one)
            max_tokens = max(1, self._context_tokens() - len(prompt_ids))
        k = (request.top_logprobs or 0) if request.logprobs else None
        generation = self._start([prompt_ids], request.sampling_params(max_tokens, k))
        rid, created = random_id("chatcmpl"), int(time.time())

        def logprobs_of(ids, lps) -> Optional[ChatChoiceLogProbs]:
            if k is None:
                return None
            return ChatChoiceLogProbs(content=chat_logprobs(self._token_text, ids, lps, k))

        def collect() -> ChatCompletionResponse:
            choices = [ChatCompletionChoice(index=c.index, message=ChatResponseMessage(content=c.output.text),
                                            logprobs=logprobs_of(c.output.token_ids, c.output.logprobs or []),
                                            finish_reason=c.output.finish_reason)
                       for c in generation.choices]
            return ChatCompletionResponse(id=rid, created=created, model=self.model_name, choices=choices,
                                          usage=generation.usage())

        async def events() -> AsyncIterator[str]:
            def chunk(c: _Choice, delta: DeltaMessage, logprobs=None, finish=None) -> str:
                return _sse(ChatCompletionStreamResponse(id=rid, created=created, model=self.model_name, choices=[
                    ChatCompletionStreamChoice(index=c.index, delta=delta, logprobs=logprobs, finish_reason=finish)]))
            for c in generation.choices:
                yield chunk(c, DeltaMessage(role="assistant", content=""))
            async for event in self._stream(generation, k is not None):
                if isinstance(event, str):
                    yield event
                    continue
                c, text, ids, lps, finish = event
                yield chunk(c, DeltaMessage(content=text or None), logprobs_of(ids, lps), finish)
            if request.stream_options is not None and request.stream_options.include_usage:
                yield _sse(ChatCompletionStreamResponse(id=rid, created=created, model=self.model_name, choices=[],
                                                        usage=generation.usage()))
            yield "data: [DONE]\n\n"

        return await self._respond(raw, generation, request.stream, events(), collect)

    async def _stream(self, generation: _Generation, with_logprobs: bool):
        """(choice, new text, new token ids, their logprobs, finish reason) whenever a choice has
        something to send (new text, its end, or tokens whose logprobs were asked for); an error
        event (a str) when the request cannot finish."""
        async for _ in generation.updates():
            for c in generation.choices:
                finish = c.output.finish_reason
                if c.last_sent or finish not in (None, "stop", "length"):
                    continue  # done, or failed (reported below)
                text = generation.new_text(c)
                ids, lps = generation.new_tokens(c)
                if text or finish is not None or (with_logprobs and ids):
                    c.last_sent = finish is not None
                    yield c, text, ids, lps, finish
        failure = generation.failure()
        if failure is not None:
            yield f"data: {failure.body().model_dump_json()}\n\n"

    # -- the app ---------------------------------------------------------------------------

    def _build_app(self, api_key: Optional[str]) -> FastAPI:
        app = FastAPI(title="tensorrt_llm OpenAI-compatible server", version=__version__)
        install_error_handlers(app)
        if api_key:
            app.add_middleware(BearerAuthMiddleware, api_key=api_key)

        @app.get("/health", response_model=HealthResponse, responses={503: {"model": ErrorResponse}})
        async def health():
            """200 while the engine runs (the server listens only once it is loaded)."""
            if not self.llm.running:
                raise OpenAIError(503, "the engine is not running")
            return HealthResponse(status="ok")

        @app.get("/version", response_model=VersionResponse)
        async def version():
            return VersionResponse(version=__version__)

        @app.get("/metrics", response_class=Response)
        async def metrics():
            """Prometheus' text format."""
            return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

        def card() -> ModelCard:
            return ModelCard(id=self.model_name, created=self.created, max_model_len=self.max_seq_len)

        @app.get("/v1/models", response_model=ModelList, responses=ERRORS)
        async def models():
            return ModelList(data=[card()])

        @app.get("/v1/models/{model}", response_model=ModelCard, responses=ERRORS)
        async def model(model: str):
            if model != self.model_name:
                raise OpenAIError(404, f"the model '{model}' does not exist", param="model", code="model_not_found")
            return card()

        @app.post("/v1/completions", response_model=CompletionResponse, responses=ERRORS)
        async def completions(request: CompletionRequest, raw: Request):
            return await self.completions(request, raw)

        @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=ERRORS)
        async def chat_completions(request: ChatCompletionRequest, raw: Request):
            return await self.chat_completions(request, raw)

        return app
