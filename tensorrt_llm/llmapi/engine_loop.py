"""The executor on a thread of its own: requests come in from any thread or event loop,
tokens go out to each request's consumer.

The loop thread does all of the engine's torch work: it loads the engine (`start`) and is the
only thread that steps the executor. On a small CPU that matters: each thread that runs
torch's CPU ops keeps an OpenMP team, and while two live teams share the cores libgomp
throttles the second one's workers (a linear layer took 1.45x as long on 2 cores); callers
only submit and wait. `submit` and `abort` queue operations that the loop thread applies
between steps. After each step it hands every updated request's new tokens to that request's
`sink` (a callable run on the loop thread; consumers put the update on their own queue, see
llm.py). Detokenising and stop strings are the consumers' work, off this thread, so the GPU
is fed without waiting for text.
"""
from __future__ import annotations

import queue
import threading
import traceback
from dataclasses import dataclass
from typing import Callable, Optional

from ..logger import logger
from ..runtime.executor import Executor
from ..runtime.request import Request


@dataclass
class Update:
    """New since the last update of one request."""
    request_id: int
    token_ids: list[int]
    log_probs: list[float]
    top_log_probs: list[dict]
    finished: bool
    finish_reason: Optional[str]
    error: Optional[str] = None


class EngineLoop:

    def __init__(self, start: Callable[[], Executor]):
        """Runs `start` (which loads the engine and returns its executor) on the new loop
        thread and returns once it has; what `start` raises is raised here."""
        self.executor: Optional[Executor] = None
        self._ops: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = False
        self._sinks: dict[int, tuple[Request, Callable[[Update], None], list[int]]] = {}
        self.error: Optional[str] = None
        self._start_error: Optional[BaseException] = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(start,), name="trtllm-engine", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            error, self._start_error = self._start_error, None
            raise error

    def submit(self, request: Request, sink: Callable[[Update], None]) -> None:
        """Queue a request; it is checked here, in the caller's thread (RequestError)."""
        if self._stop or not self._thread.is_alive():
            raise RuntimeError(f"the engine is not running ({self.error or 'shut down'})")
        self.executor.check(request)
        self._ops.put(("add", request, sink))
        self._wake.set()

    def abort(self, request_id: int) -> None:
        self._ops.put(("abort", request_id, None))
        self._wake.set()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Abort what runs, stop the thread."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)

    @property
    def stats(self):
        return self.executor.stats

    @property
    def running(self) -> bool:
        """Whether requests are taken: not shut down, and the thread has not failed."""
        return not self._stop and self._thread.is_alive()

    def _apply_ops(self) -> None:
        while True:
            try:
                op, value, sink = self._ops.get_nowait()
            except queue.Empty:
                return
            if op == "add":
                try:
                    self.executor.add_request(value)
                except Exception as e:  # refused late (e.g. an id clash): tell that request only
                    sink(Update(value.request_id, [], [], [], True, "error", str(e)))
                    continue
                self._sinks[value.request_id] = (value, sink, [0])
            elif op == "abort":
                request = self.executor.abort(value)
                if request is not None:
                    self._deliver(request)

    def _deliver(self, request: Request) -> None:
        entry = self._sinks.get(request.request_id)
        if entry is None:
            return
        _, sink, sent = entry
        out = request.output_token_ids
        n = sent[0]
        update = Update(request.request_id, out[n:], request.log_probs[n:], request.top_log_probs[n:],
                        request.finished, request.finish_reason)
        sent[0] = len(out)
        if request.finished:
            del self._sinks[request.request_id]
        if update.token_ids or update.finished:
            sink(update)

    def _iterate(self) -> bool:
        """One iteration. False when there was no work."""
        self.executor.driver = threading.get_ident()
        self._apply_ops()
        if not self.executor.has_work:
            return False
        for request in self.executor.step():
            self._deliver(request)
        return True

    def _run(self, start: Callable[[], Executor]) -> None:
        try:
            self.executor = start()
        except BaseException as e:  # noqa: BLE001 - raised again in the constructor's thread
            self._start_error = e
            self._stop = True
            self._started.set()
            return
        self._started.set()
        try:
            while not self._stop:
                if not self._iterate():
                    self._wake.wait(0.05)
                    self._wake.clear()
        except Exception as e:
            self._fail(e)
        self._fail(None)

    def _fail(self, error: Optional[Exception]) -> None:
        """The engine stops (failed, or shut down): every request hears it, nothing hangs."""
        if error is not None:
            self.error = f"{type(error).__name__}: {error}"
            logger.error(f"engine loop stopped: {self.error}\n{traceback.format_exc()}")
        for request_id in list(self._sinks):
            request, sink, _ = self._sinks.pop(request_id)
            self.executor.driver = threading.get_ident()
            self.executor.abort(request_id)
            sink(Update(request_id, [], [], [], True, "error" if self.error else "abort", self.error))
        self.executor.driver = None
        self._stop = True
