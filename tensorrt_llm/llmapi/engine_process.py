"""The executor in a process of its own: the front end (the caller's process: LLM API,
tokenizer, detokenising, stop strings, HTTP) only sends requests and receives tokens.

Why a process: the executor's step is heavy Python (scheduling, feed, sampling). On a thread
of the front end it shares one GIL with the HTTP event loop, whose socket sends then wait for
it; in a process of its own it does not (vLLM's "engine core" split). It also keeps all of the
engine's torch work on one thread of one process: on a small CPU, each thread that runs
torch's CPU ops keeps an OpenMP team, and while two live teams share the cores libgomp
throttles the second one's workers (a linear layer took 1.45x as long on 2 cores).

    engine = EngineProcess(start, progress=print)   # returns once the engine is loaded
    engine.submit([(request, sink), ...])            # checked here (RequestError), then sent
    engine.abort(request_id)
    engine.shutdown()

The child ("spawn": a fresh interpreter, the parent's environment) runs `start` (which
resolves, builds and loads the engine and returns its executor; the progress lines it says
come back to the front end's `progress`), then one loop on its main thread: take what the
pipe brought (add, abort, shutdown), step the executor, and send ONE message per step that
carries every updated request's new tokens and a snapshot of the engine's counters
(`EngineStats`). Most updates are new tokens only: they travel as (request id, token ids)
pairs, which pickle ~10x smaller and faster than `Update` objects (the front end's time is the
HTTP server's); the rest (finished, log probs, logits, errors) as `Update`s. A receiver
thread in the front end hands each update to its request's `sink` (consumers put it on their
own queue, see llm.py); it does no torch work.

Requests are checked in the caller's thread with the executor's own rules (`Admission`,
which the front end gets at start), so a bad request raises RequestError before it is sent.
When the child dies, every open request ends with finish_reason "error" and `running` turns
false; when the front end dies, the child reads the end of its pipe and exits. The child
ignores SIGINT: Ctrl-C reaches the front end, which shuts the engine down in order.

The pipe is private to our two processes, so its messages are pickled.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..logger import logger
from ..runtime.admission import Admission
from ..runtime.executor import Executor, ExecutorStats
from ..runtime.request import Request

JOIN_TIMEOUT_S = 30.0


@dataclass(slots=True)
class Update:
    """New since the last update of one request. Logits travel only when the request asked
    for them: the prompt's once, with its first token; the generated tokens' with them."""
    request_id: int
    token_ids: list[int]
    log_probs: Sequence[float] = ()
    top_log_probs: Sequence[dict] = ()
    finished: bool = False
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    context_logits: Any = None      # torch.Tensor [prompt_len, V]
    generation_logits: Any = None   # list of torch.Tensor [V], one per new token


@dataclass
class EngineStats(ExecutorStats):
    """The executor's counters and the engine's state after its latest step."""
    num_running: int = 0              # requests in the running batch
    num_waiting: int = 0              # requests queued in the executor
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    requests_received: int = 0        # requests the engine process has taken in


@dataclass
class EngineInfo:
    """What the front end learns when the engine has loaded."""
    admission: Admission              # the executor's checks of a request (its limits, pool size)
    max_batch_size: int               # sequences per step (the scheduler's)
    engine_dir: Path
    tokenizer_source: Optional[Path]  # see model_loader.ResolvedModel
    stats: EngineStats = field(default_factory=EngineStats)


class EngineProcess:
    """The front end's handle on the engine process."""

    def __init__(self, start: Callable[[Callable[[str], None]], tuple[Executor, Any]],
                 progress: Optional[Callable[[str], None]] = print, world_size: int = 1,
                 follow: Optional[Callable[[], Executor]] = None):
        """Starts the child, which runs `start(progress)` (picklable; returns the executor and
        the model_loader.ResolvedModel it loaded); returns once it has. What `start` raises is
        raised here. world_size > 1: a multi-rank engine; the child is rank 0, and world_size - 1
        more children (ranks 1...) run `follow()` (picklable; returns their executor) and then
        do what rank 0 sends them each step. They meet on a free port of this host."""
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        launch = [{}] * world_size
        if world_size > 1:
            port = _free_port()
            launch = [{"RANK": str(r), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(r),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)} for r in range(world_size)]
        self._process = ctx.Process(target=_engine_main, args=(child_conn, start, launch[0]), name="trtllm-engine",
                                    daemon=True)
        self._followers = [ctx.Process(target=_follower_main, args=(follow, launch[r]), name=f"trtllm-engine-{r}",
                                       daemon=True) for r in range(1, world_size)]
        self._process.start()
        for p in self._followers:
            p.start()
        child_conn.close()  # ours is gone, so the child's end of the pipe closes when it exits
        self._send_lock = threading.Lock()
        self._sinks: dict[int, Callable[[Update], None]] = {}
        self._sinks_lock = threading.Lock()
        self._alive = True
        self._stopping = False
        self.error: Optional[str] = None
        try:
            self.info = self._wait_started(progress)
        except BaseException:
            self._stop_process(timeout=5.0)
            raise
        self.stats: EngineStats = self.info.stats
        self.admission = self.info.admission
        self._receiver = threading.Thread(target=self._receive, name="trtllm-engine-receiver", daemon=True)
        self._receiver.start()

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid

    @property
    def running(self) -> bool:
        """Whether requests are taken: not shut down, and the engine process is alive."""
        return self._alive and not self._stopping

    def submit(self, entries: Sequence[tuple[Request, Callable[[Update], None]]]) -> None:
        """Check requests here, in the caller's thread (RequestError: none is sent), then send
        them in one message: the engine queues them together, so they start in the same step
        (a prompt's n choices, a batch of prompts: which step each starts in changes the rows
        it is computed with, and the CPU kernels' roundings differ with the rows)."""
        if not self.running:
            raise RuntimeError(f"the engine is not running ({self.error or 'shut down'})")
        for request, _ in entries:
            self.admission.check(request)
        with self._sinks_lock:
            if not self._alive:  # died since the check above: the receiver has told its sinks
                raise RuntimeError(f"the engine is not running ({self.error})")
            for request, sink in entries:
                self._sinks[request.request_id] = sink
        try:
            self._send(("add", [request for request, _ in entries]))
        except OSError:
            with self._sinks_lock:
                for request, _ in entries:
                    self._sinks.pop(request.request_id, None)
            raise RuntimeError(f"the engine is not running ({self.error or 'its process has exited'})") from None

    def abort(self, request_id: int) -> None:
        try:
            self._send(("abort", request_id))
        except OSError:
            pass  # the engine is gone: its requests have ended already

    def shutdown(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Abort what runs, stop the engine process and join it (terminated past `timeout`)."""
        if self._stopping:
            return
        self._stopping = True
        try:
            self._send(("shutdown",))
        except OSError:
            pass
        self._stop_process(timeout)
        self._receiver.join(timeout)
        self._conn.close()

    # -- the pipe ---------------------------------------------------------------------------

    def _send(self, message: tuple) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            self._conn.send_bytes(data)

    def _wait_started(self, progress: Optional[Callable[[str], None]]) -> EngineInfo:
        while True:
            try:
                kind, body = pickle.loads(self._conn.recv_bytes())
            except EOFError:
                self._process.join(JOIN_TIMEOUT_S)
                raise RuntimeError(f"the engine process exited (code {self._process.exitcode}) while loading "
                                   f"the engine; its error is above (a script that makes an LLM keeps that "
                                   f"under `if __name__ == '__main__':`)") from None
            if kind == "progress":
                if progress is not None:
                    progress(body)
            elif kind == "failed":
                error, remote_traceback = body
                error.__cause__ = _RemoteTraceback(remote_traceback)
                raise error
            else:
                return body

    def _receive(self) -> None:
        """The receiver thread: each step's updates to their sinks, until the pipe ends."""
        try:
            while True:
                kind, body = pickle.loads(self._conn.recv_bytes())
                if kind == "step":
                    tokens, updates, self.stats = body
                    for request_id, token_ids in tokens:
                        self._deliver(Update(request_id, token_ids))
                    for update in updates:
                        self._deliver(update)
                elif kind == "stopped":
                    self.error = body
        except (EOFError, OSError):
            pass
        except Exception as e:  # a message not understood (a bug): the engine cannot be heard, so it goes
            self.error = f"the engine's messages cannot be read: {type(e).__name__}: {e}"
            logger.error(f"{self.error}\n{traceback.format_exc()}")
            self._process.kill()
        if not self._stopping and self.error is None:
            self._process.join(1.0)
            self.error = f"the engine process exited (code {self._process.exitcode})"
        with self._sinks_lock:
            self._alive = False
            sinks, self._sinks = self._sinks, {}
        for request_id, sink in sinks.items():
            sink(Update(request_id, [], finished=True, finish_reason="error" if self.error else "abort",
                        error=self.error))

    def _deliver(self, update: Update) -> None:
        with self._sinks_lock:
            sink = self._sinks.pop(update.request_id) if update.finished else self._sinks.get(update.request_id)
        if sink is not None:
            sink(update)

    def _stop_process(self, timeout: float) -> None:
        for p in [self._process, *self._followers]:
            p.join(timeout)
            if p.is_alive():
                logger.warning(f"the engine process {p.name} did not stop within {timeout} s; terminating it")
                p.terminate()
                p.join(5.0)
                if p.is_alive():
                    p.kill()
                    p.join()


class _RemoteTraceback(Exception):
    """Where an error raised in the engine process came from (its traceback, as text)."""

    def __str__(self) -> str:
        return f"\n\nin the engine process:\n{self.args[0]}"


# -- the engine process ---------------------------------------------------------------------

def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# How often an idle rank 0 tells the other ranks it is still there (well within any collective timeout).
HEARTBEAT_S = 5.0


def _engine_main(conn, start, launch: dict) -> None:
    """The child's entry point (rank 0 of a multi-rank engine: `launch` holds its rank's
    environment)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the front end's to handle
    os.environ.update(launch)
    send = _Sender(conn)
    try:
        executor, resolved = start(lambda line: send(("progress", line)))
    except BaseException as e:  # noqa: BLE001 - raised again in the front end
        send(("failed", (_portable(e), traceback.format_exc())))
        return
    core = _EngineCore(executor, send, followers=bool(launch))
    send(("started", EngineInfo(executor.admission, executor.scheduler.max_batch_size, resolved.engine_dir,
                                resolved.tokenizer_source, core.stats())))
    core.run(conn)


class _Sender:

    def __init__(self, conn):
        self.conn = conn

    def __call__(self, message: tuple) -> None:
        self.conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _portable(error: BaseException) -> BaseException:
    """`error` if it survives pickling, else a RuntimeError with its words."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def _follower_main(follow, launch: dict) -> None:
    """A rank > 0 of a multi-rank engine: load its part, then apply what rank 0 applied and
    step when it steps (the executors stay in lockstep: the same requests in the same order
    give the same schedule), until rank 0 says shutdown or goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(launch)
    from .. import distributed
    try:
        executor = follow()
        while True:
            commands, step = distributed.broadcast_object(None)
            for kind, *args in commands:
                if kind == "add":
                    for request in args[0]:
                        try:
                            executor.add_request(request)
                        except Exception:  # refused on rank 0 too, which tells its request
                            pass
                elif kind == "abort":
                    executor.abort(args[0])
                elif kind == "shutdown":
                    return
            if step:
                executor.step()
    except Exception as e:  # rank 0 is gone (its error is reported there), or this rank failed
        logger.error(f"engine rank {os.environ.get('RANK')} stopped: {type(e).__name__}: {e}")


class _EngineCore:
    """The child's loop: requests in, the executor stepped, one message out per step. With
    followers (the other ranks of a multi-rank engine), each turn of the loop first sends them
    the messages it applied and whether it steps."""

    def __init__(self, executor: Executor, send: _Sender, followers: bool = False):
        self.executor = executor
        self.send = send
        self.followers = followers
        self._applied: list[tuple] = []  # this turn's messages, for the followers
        self._open: dict[int, list] = {}   # request id -> [request, tokens sent, generation logits sent]
        self._tokens: list[tuple[int, list[int]]] = []  # this step's plain updates: new tokens only
        self._updates: list[Update] = []                # and the others
        self._received = 0
        self._stop = False

    def stats(self) -> EngineStats:
        ex, kv = self.executor, self.executor.kv_cache
        return EngineStats(**asdict(ex.stats), num_running=ex.num_running, num_waiting=ex.num_waiting,
                           kv_blocks_used=kv.num_used_blocks, kv_blocks_total=kv.num_blocks,
                           requests_received=self._received)

    def run(self, conn) -> None:
        try:
            while not self._stop:
                # Idle, wait for the front end; else take only what has arrived.
                self._apply(conn, block=not self.executor.has_work)
                stepped = self.executor.has_work and not self._stop
                if self.followers:
                    from .. import distributed
                    applied, self._applied = self._applied, []
                    distributed.broadcast_object((applied, stepped))
                if stepped:
                    for request in self.executor.step():
                        self._collect(request)
                if self._stop:
                    self._end_all(None)
                if stepped or self._tokens or self._updates:
                    self._send_step()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            return  # the front end is gone: nobody is left to tell
        except Exception as e:  # a bug: every request hears it, the front end too
            error = f"{type(e).__name__}: {e}"
            logger.error(f"the engine stopped: {error}\n{traceback.format_exc()}")
            self._end_all(error)
            try:
                self._send_step()
                self.send(("stopped", error))
            except OSError:
                pass

    def _send_step(self) -> None:
        tokens, updates, self._tokens, self._updates = self._tokens, self._updates, [], []
        self.send(("step", (tokens, updates, self.stats())))

    def _apply(self, conn, block: bool) -> None:
        # Idle with followers: wake up now and then, so they hear from rank 0 within their timeout.
        if not conn.poll((HEARTBEAT_S if self.followers else None) if block else 0):
            return
        while True:
            message = pickle.loads(conn.recv_bytes())
            if self.followers:
                self._applied.append(message)
            kind, *args = message
            if kind == "add":
                for request in args[0]:
                    self._add(request)
            elif kind == "abort":
                request = self.executor.abort(args[0])
                if request is not None:
                    self._collect(request)
            elif kind == "shutdown":
                self._stop = True
                return
            if not conn.poll(0):
                return

    def _add(self, request: Request) -> None:
        self._received += 1
        try:
            self.executor.add_request(request)
        except Exception as e:  # refused late (e.g. an id clash): tell that request only
            self._updates.append(Update(request.request_id, [], finished=True, finish_reason="error", error=str(e)))
            return
        self._open[request.request_id] = [request, 0, 0]

    def _collect(self, request: Request) -> None:
        entry = self._open.get(request.request_id)
        if entry is None:
            return
        _, n, n_logits = entry
        out = request.output_token_ids
        entry[1] = len(out)
        update = Update(request.request_id, out[n:], request.log_probs[n:], request.top_log_probs[n:],
                        request.finished, request.finish_reason, request.error)
        if request.return_context_logits and n == 0 and out and request.context_logits:
            import torch
            update.context_logits = torch.cat(request.context_logits)  # the prompt's chunks
        if request.return_generation_logits:
            update.generation_logits, entry[2] = request.generation_logits[n_logits:], len(request.generation_logits)
        if request.finished:
            del self._open[request.request_id]
            self._updates.append(update)
        elif update.token_ids:
            plain = not (update.log_probs or update.context_logits is not None or request.return_generation_logits)
            if plain:
                self._tokens.append((update.request_id, update.token_ids))
            else:
                self._updates.append(update)

    def _end_all(self, error: Optional[str]) -> None:
        """Every open request ends: aborted at a shutdown (error None), else with the error
        (the executor is not touched again after it failed)."""
        for request_id in list(self._open):
            if error is None:
                request = self.executor.abort(request_id)
                if request is not None:
                    self._collect(request)
            if self._open.pop(request_id, None) is not None:
                self._updates.append(Update(request_id, [], finished=True,
                                            finish_reason="error" if error else "abort", error=error))
