"""trtllm-serve's command line and lifetime: the API key, a full queue, Ctrl-C / SIGTERM (running
requests finish, or are aborted past --shutdown_timeout; exit 0; no engine process left), a killed
engine process (open requests fail, /health 503), and bad options or models (one error line, exit
code 2). Its servers run the session's engine folder with runtime limits of one
sequence per step and a queue of one."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import requests

from .conftest import MODEL_NAME, ServerProcess, engine_pid, metric, wait_for

KEY = "test-key-6f1d"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = {"model": MODEL_NAME, "prompt": "Tell me a very long story.", "max_tokens": 400, "ignore_eos": True,
        "stream": True}


@pytest.fixture(scope="module")
def guarded(engine_dir, tmp_path_factory):
    proc = ServerProcess(engine_dir, "--served_model_name", MODEL_NAME, "--max_batch_size", "1",
                         "--max_queue_size", "1", "--api_key", KEY, "--log_level", "warning", "--device", "cpu",
                         "--shutdown_timeout", "120", log=tmp_path_factory.mktemp("guarded") / "server.log")
    yield proc
    proc.stop(signal.SIGKILL)


def _counters(url: str) -> dict[str, float]:
    names = ["trtllm_prompt_tokens_total", "trtllm_generation_tokens_total", "trtllm_time_to_first_token_seconds_count"]
    return {name: metric(url, name) for name in names}


def test_the_api_key_is_required_and_a_refusal_touches_nothing(guarded):
    url = guarded.url
    before = _counters(url)
    body = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}):
        r = requests.post(f"{url}/v1/completions", json=body, headers=headers, timeout=30)
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["WWW-Authenticate"] == "Bearer"
    # Refused before anything is read: a malformed body is still a 401, not a 400.
    r = requests.post(f"{url}/v1/chat/completions", data="{not json", headers={"Content-Type": "application/json"},
                      timeout=30)
    assert r.status_code == 401
    assert requests.get(f"{url}/v1/models", timeout=30).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
    assert _counters(url) == before
    # Probes and scrapers need no key; the right key works.
    assert requests.get(f"{url}/health", timeout=30).status_code == 200
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)
    assert client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2).usage.completion_tokens == 2


def test_a_full_queue_answers_503_with_retry_after(guarded):
    url = guarded.url
    running = requests.post(f"{url}/v1/completions", json=LONG, headers=AUTH, stream=True, timeout=120)
    waiting = None
    try:
        assert running.status_code == 200
        assert wait_for(lambda: metric(url, "trtllm_num_requests_running") == 1)
        waiting = requests.post(f"{url}/v1/completions", json=LONG, headers=AUTH, stream=True, timeout=120)
        assert waiting.status_code == 200  # queued behind the one running (max_batch_size 1)
        assert metric(url, "trtllm_num_requests_waiting") == 1
        r = requests.post(f"{url}/v1/completions", json={**LONG, "stream": False}, headers=AUTH, timeout=120)
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "1"
        error = r.json()["error"]
        assert error["code"] == "queue_full" and error["type"] == "server_error"
        assert "max_queue_size" in error["message"]
        assert metric(url, "trtllm_num_requests_running") == 1  # one sequence per step, as asked
    finally:
        running.close()
        if waiting is not None:
            waiting.close()
    assert wait_for(lambda: metric(url, "trtllm_kv_cache_blocks_used") == 0
                     and metric(url, "trtllm_num_requests_waiting") == 0)
    ok = requests.post(f"{url}/v1/completions", json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2},
                       headers=AUTH, timeout=120)
    assert ok.status_code == 200


def test_sigterm_lets_running_requests_finish_and_exits_0(guarded):
    url = guarded.url
    engine = engine_pid(guarded.proc.pid)
    stream = requests.post(f"{url}/v1/completions", headers=AUTH, stream=True, timeout=120, json={
        **LONG, "max_tokens": 24, "stream_options": {"include_usage": True}})
    lines = stream.iter_lines()
    assert next(lines).startswith(b"data: ")
    guarded.proc.send_signal(signal.SIGTERM)
    # It stops taking connections at once ...
    assert wait_for(lambda: not _accepts(url), timeout=15), "still accepting connections after SIGTERM"
    # ... and the running request still gets all of its answer.
    events = [line for line in lines if line.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]"
    assert b'"completion_tokens":24' in events[-2], events[-2]
    assert guarded.proc.wait(60) == 0, guarded.output()[-3000:]
    assert "trtllm-serve: stopped" in guarded.output()
    assert not Path(f"/proc/{engine}").exists()  # stopped and reaped


def _accepts(url: str) -> bool:
    try:
        requests.get(f"{url}/health", timeout=2)
        return True
    except requests.ConnectionError:
        return False


def test_ctrl_c_past_the_shutdown_timeout_aborts_and_exits_0(engine_dir, tmp_path):
    proc = ServerProcess(engine_dir, "--served_model_name", MODEL_NAME, "--log_level", "warning", "--device", "cpu",
                         "--shutdown_timeout", "1", log=tmp_path / "server.log")
    try:
        stream = requests.post(f"{proc.url}/v1/completions", json=LONG, stream=True, timeout=120)
        lines = stream.iter_lines()
        assert next(lines).startswith(b"data: ")
        start = time.monotonic()
        proc.proc.send_signal(signal.SIGINT)
        with pytest.raises(requests.exceptions.ChunkedEncodingError):
            list(lines)  # cut off: aborted, not run to its 400 tokens
        assert proc.proc.wait(60) == 0, proc.output()[-3000:]
        assert time.monotonic() - start < 30
    finally:
        proc.stop(signal.SIGKILL)


def test_a_killed_engine_fails_open_requests_and_health(engine_dir, tmp_path):
    proc = ServerProcess(engine_dir, "--served_model_name", MODEL_NAME, "--log_level", "warning", "--device", "cpu",
                         log=tmp_path / "server.log")
    try:
        assert requests.get(f"{proc.url}/health", timeout=30).status_code == 200
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(requests.post, f"{proc.url}/v1/completions", json={**LONG, "stream": False},
                                  timeout=120)
            assert wait_for(lambda: metric(proc.url, "trtllm_num_requests_running") == 1)
            os.kill(engine_pid(proc.proc.pid), signal.SIGKILL)
            start = time.monotonic()
            r = waiting.result(timeout=60)
        assert time.monotonic() - start < 30
        assert r.status_code == 500 and "engine process exited" in r.json()["error"]["message"], r.text
        assert requests.get(f"{proc.url}/health", timeout=30).status_code == 503
        r = requests.post(f"{proc.url}/v1/completions", json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2},
                          timeout=30)
        assert r.status_code == 503, r.text
        assert proc.stop() == 0, proc.output()[-3000:]
    finally:
        proc.stop(signal.SIGKILL)


def _serve(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensorrt_llm.commands.serve", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_bad_options_and_models_end_in_one_error_line(tmp_path, engine_dir):
    missing = _serve(str(tmp_path / "no-such-model"), "--port", "0")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert missing.stderr.startswith("trtllm-serve: error:") and "does not exist" in missing.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = _serve(str(engine_dir), "--port", str(port))
    assert taken.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in taken.stderr, taken.stderr
    assert "Traceback" not in taken.stderr
    for args, message in ((["--port", "70000"], "--port"), (["--max_queue_size", "0"], "--max_queue_size"),
                          (["--kv_cache_free_gpu_memory_fraction", "0"], "kv_cache_free_gpu_memory_fraction")):
        bad = _serve(str(engine_dir), *args)
        assert bad.returncode == 2 and message in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
    usage = _serve("--help")
    assert usage.returncode == 0 and "--served_model_name" in usage.stdout and "--api_key" in usage.stdout
