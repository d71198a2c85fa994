"""The executor on a thread of its own: requests come in from any thread or event loop,
tokens go out to each request's consumer.

One thread at a time steps the executor, holding the step lock: the loop thread, or a
synchronous caller that `drive`s it until its own requests are done. `submit` and `abort`
queue operations that the stepping thread applies between steps. After each step it hands every updated request's
new tokens to that request's `sink` (a callable run on the loop thread; consumers put the
update on their own queue, see llm.py). Detokenising and stop strings are the consumers'
work, off this thread, so the GPU is fed without waiting for text.
"""
from __future__ import annotations

import contextlib
import queue
import threading
import time
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

    def __init__(self, executor: Executor):
        self.executor = executor
        self._ops: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = False
        self._sinks: dict[int, tuple[Request, Callable[[Update], None], list[int]]] = {}
        self._step_lock = threading.Lock()  # held by whoever steps the executor
        self._callers = 0                    # callers waiting to drive
        self._thread = threading.Thread(target=self._run, name="trtllm-engine", daemon=True)
        self.error: Optional[str] = None
        self._thread.start()

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
        """One iteration (the caller holds the step lock). False when there was no work."""
        self.executor.driver = threading.get_ident()
        self._apply_ops()
        if not self.executor.has_work:
            return False
        for request in self.executor.step():
            self._deliver(request)
        return True

    def drive(self, done: Callable[[], bool], on_step: Callable[[], None] = lambda: None) -> None:
        """Step the executor in the caller's thread until `done()`, the loop thread waiting
        meanwhile. Synchronous callers use it: torch's CPU ops run fastest on the thread
        that ran the model's earlier ops (on a small CPU, another thread's OpenMP team would
        compete with this one's spinning workers)."""
        self._callers += 1  # the loop thread stands back while a caller wants to drive
        try:
            self._step_lock.acquire()
        finally:
            self._callers -= 1
        with _released(self._step_lock):
            try:
                while not done() and not self._stop:
                    if not self._iterate():
                        self._wake.wait(0.01)
                        self._wake.clear()
                    on_step()
            except Exception as e:
                self._fail(e)
                raise

    def _run(self) -> None:
        try:
            while not self._stop:
                if self._callers:  # a lock is not fair: leave it to the waiting caller
                    time.sleep(0.001)
                    continue
                with self._step_lock:
                    busy = self._iterate()
                if not busy:
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


@contextlib.contextmanager
def _released(lock: threading.Lock):
    """Release a lock acquired before the block, when the block ends."""
    try:
        yield
    finally:
        lock.release()
