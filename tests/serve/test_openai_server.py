"""trtllm-serve against the real `openai` client and raw HTTP, on a loopback port: completions and
chat equal the LLM API's answers, streaming adds up, every bad request gets its status and
OpenAI's error body before it reaches the engine, 64 concurrent streaming clients each get
their whole answer, and a client that leaves frees its KV blocks."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import openai
import pytest
import requests

from tensorrt_llm import SamplingParams

from .conftest import MODEL_NAME, metric, wait_for

PROMPTS = ["The capital of France is", "Once upon a time, in a small village by the sea, there lived",
           "1, 2, 3, 4,"]
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _stream_text(stream) -> tuple[dict[int, str], dict[int, str], object]:
    """Texts and finish reasons by choice index, and the usage of the last chunk."""
    texts, finish, usage = {}, {}, None
    for chunk in stream:
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
        for c in chunk.choices:
            piece = c.text if hasattr(c, "text") else (c.delta.content or "")
            texts[c.index] = texts.get(c.index, "") + piece
            if c.finish_reason is not None:
                assert c.index not in finish, "two finish reasons for one choice"
                finish[c.index] = c.finish_reason
    return texts, finish, usage


def test_models_health_version(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    assert requests.get(f"{server.url}/health", timeout=30).json() == {"status": "ok"}
    import tensorrt_llm
    assert requests.get(f"{server.url}/version", timeout=30).json() == {"version": tensorrt_llm.__version__}
    schema = requests.get(f"{server.url}/openapi.json", timeout=30).json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"} <= set(schema["paths"])


def test_completions_equal_llm_generate(client, reference_llm):
    for prompt in PROMPTS:
        got = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0)
        want = reference_llm.generate(prompt, SamplingParams(max_tokens=12), use_tqdm=False)
        assert got.choices[0].text == want.outputs[0].text
        assert got.choices[0].finish_reason == want.outputs[0].finish_reason
        assert got.usage.prompt_tokens == len(want.prompt_token_ids)
        assert got.usage.completion_tokens == len(want.outputs[0].token_ids)
        assert got.usage.total_tokens == got.usage.prompt_tokens + got.usage.completion_tokens
    # Several prompts in one request (a choice each, in order), and a prompt of token ids.
    batch = client.completions.create(model=MODEL_NAME, prompt=PROMPTS, max_tokens=12, temperature=0)
    want = reference_llm.generate(PROMPTS, SamplingParams(max_tokens=12), use_tqdm=False)
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == [w.outputs[0].text for w in want]
    ids = reference_llm.tokenizer.encode(PROMPTS[0])
    by_ids = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=12, temperature=0)
    assert by_ids.choices[0].text == want[0].outputs[0].text


def test_sampling_parameters_reach_the_engine(client, reference_llm):
    """Seeded sampling with every knob equals the LLM API's with the same parameters."""
    got = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=10, temperature=0.8,
                                    top_p=0.9, seed=7, n=2, presence_penalty=0.5, frequency_penalty=0.3,
                                    extra_body={"top_k": 40})
    want = reference_llm.generate(PROMPTS[1], SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=7, n=2,
                                                             presence_penalty=0.5, frequency_penalty=0.3, top_k=40),
                                  use_tqdm=False)
    assert [c.text for c in got.choices] == [o.text for o in want.outputs]
    assert got.choices[0].text != got.choices[1].text  # n streams of one seed differ
    assert got.usage.completion_tokens == 20


def test_chat_equals_llm_chat(client, reference_llm):
    got = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=24, temperature=0)
    want = reference_llm.chat(MESSAGES, SamplingParams(max_tokens=24))
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want.outputs[0].text
    assert "Paris" in got.choices[0].message.content
    assert got.choices[0].finish_reason == want.outputs[0].finish_reason
    assert got.usage.prompt_tokens == len(want.prompt_token_ids)
    # No max_tokens: the rest of the context; the model ends its turn (EOS) long before.
    free = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0)
    assert free.choices[0].finish_reason == "stop" and free.choices[0].message.content.startswith(
        got.choices[0].message.content[:10])
    developer = client.chat.completions.create(
        model=MODEL_NAME, temperature=0, max_tokens=8,
        messages=[{"role": "developer", "content": "Answer in one word."},
                  {"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]}])
    assert developer.choices[0].message.content


def test_streaming_adds_up_to_the_whole_answer(client):
    whole = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=16, temperature=0)
    texts, finish, usage = _stream_text(client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert texts == {0: whole.choices[0].text} and finish == {0: "length"}
    assert usage.model_dump() == whole.usage.model_dump()

    chat = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=16, n=2, seed=3,
                                          temperature=0.9)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=16, n=2, seed=3,
                                            temperature=0.9, stream=True, stream_options={"include_usage": True})
    texts, finish, usage = _stream_text(stream)
    assert texts == {c.index: c.message.content for c in chat.choices}
    assert finish == {c.index: c.finish_reason for c in chat.choices}
    assert usage.model_dump() == chat.usage.model_dump()
    # Without include_usage there is no usage chunk.
    assert _stream_text(client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2, stream=True))[2] is None


def test_stop_strings_streamed_and_whole(client, reference_llm):
    # ", 5" spans two tokens: its "," must not be streamed before the stop string shows.
    want = reference_llm.generate("1, 2, 3,", SamplingParams(max_tokens=16, stop=[", 5", "xyz"]), use_tqdm=False)
    assert want.outputs[0].text == " 4" and want.outputs[0].finish_reason == "stop"
    whole = client.completions.create(model=MODEL_NAME, prompt="1, 2, 3,", max_tokens=16, temperature=0,
                                      stop=[", 5", "xyz"])
    assert whole.choices[0].text == " 4" and whole.choices[0].finish_reason == "stop"
    texts, finish, _ = _stream_text(client.completions.create(
        model=MODEL_NAME, prompt="1, 2, 3,", max_tokens=16, temperature=0, stop=[", 5", "xyz"], stream=True))
    assert texts == {0: " 4"} and finish == {0: "stop"}


def test_streamed_text_never_splits_a_character(client):
    prompt = "日本語の文章: 今日は天気が"
    whole = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0)
    chunks = [c.choices[0].text for c in client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0, stream=True)]
    assert "".join(chunks) == whole.choices[0].text
    assert all("\ufffd" not in c for c in chunks)
    assert sum(len(c.encode()) > len(c) for c in chunks) >= 3, chunks  # multi-byte characters came
    assert whole.usage.completion_tokens > len([c for c in chunks if c]), "no character spanned tokens"


def test_logprobs_and_echo(client, reference_llm):
    got = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=6, temperature=0, logprobs=2)
    want = reference_llm.generate(PROMPTS[0], SamplingParams(max_tokens=6, logprobs=2), use_tqdm=False).outputs[0]
    lp = got.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == got.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    assert sum(lp.token_logprobs) == pytest.approx(want.cumulative_logprob, abs=1e-4)
    for token, top, chosen in zip(lp.tokens, lp.top_logprobs, lp.token_logprobs):
        assert len(top) == 2 and max(top.values()) >= chosen and token in top  # greedy: the best is chosen

    echo = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=4, temperature=0, echo=True,
                                     logprobs=1)
    n_prompt = echo.usage.prompt_tokens
    assert echo.choices[0].text == PROMPTS[0] + got.choices[0].text[:len(echo.choices[0].text) - len(PROMPTS[0])]
    lp = echo.choices[0].logprobs
    assert len(lp.tokens) == n_prompt + 4 and "".join(lp.tokens) == echo.choices[0].text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    streamed, _, _ = _stream_text(client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=4,
                                                            temperature=0, echo=True, stream=True))
    assert streamed == {0: echo.choices[0].text}

    chat = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=8, temperature=0,
                                          logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens == 8
    # The tokens' bytes spell the text (and the end-of-turn token, which the text leaves out).
    spelled = bytes(b for t in content for b in t.bytes).decode()
    assert spelled.removesuffix(reference_llm.tokenizer.eos_token) == chat.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob >= t.logprob for t in content)
    texts, _, _ = _stream_text(client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3, stream=True))
    assert texts == {0: chat.choices[0].message.content}


LONG_PROMPT = "hello " * 600  # 600+ tokens: over the engine's max_input_len (512)

BAD_REQUESTS = [
    # (name, path, body: a dict, or raw text, status, param)
    ("malformed JSON", "/v1/completions", '{"model": "smollm2", "prompt": ', 400, None),
    ("a JSON array", "/v1/completions", "[1, 2]", 400, None),
    ("no body", "/v1/completions", "", 400, None),
    ("no model", "/v1/completions", {"prompt": "Hi"}, 400, "model"),
    ("max_tokens as a string", "/v1/completions", {"prompt": "Hi", "max_tokens": "5"}, 400, "max_tokens"),
    ("temperature as a string", "/v1/completions", {"prompt": "Hi", "temperature": "hot"}, 400, "temperature"),
    ("stream as a string", "/v1/completions", {"prompt": "Hi", "stream": "yes"}, 400, "stream"),
    ("prompt as a number", "/v1/completions", {"prompt": 5}, 400, "prompt"),
    ("token ids as floats", "/v1/completions", {"prompt": [1.5, 2]}, 400, "prompt"),
    ("an unknown field", "/v1/completions", {"prompt": "Hi", "frobnicate": 1}, 400, "frobnicate"),
    ("an unknown model", "/v1/completions", {"model": "gpt-9", "prompt": "Hi"}, 404, "model"),
    ("an unknown chat model", "/v1/chat/completions", {"model": "gpt-9", "messages": MESSAGES}, 404, "model"),
    ("a prompt over max_input_len", "/v1/completions", {"prompt": LONG_PROMPT}, 400, None),
    ("a chat prompt over max_input_len", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": LONG_PROMPT}]}, 400, None),
    ("prompt + max_tokens over max_seq_len", "/v1/completions", {"prompt": "Hi", "max_tokens": 100000}, 400, None),
    ("a token id outside the vocabulary", "/v1/completions", {"prompt": [1, 2, 10**9]}, 400, None),
    ("an empty prompt", "/v1/completions", {"prompt": ""}, 400, None),
    ("no prompts", "/v1/completions", {"prompt": []}, 400, "prompt"),
    ("max_tokens 0", "/v1/completions", {"prompt": "Hi", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens -1", "/v1/completions", {"prompt": "Hi", "max_tokens": -1}, 400, "max_tokens"),
    ("chat max_tokens 0", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 0}, 400, "max_tokens"),
    ("temperature < 0", "/v1/completions", {"prompt": "Hi", "temperature": -0.5}, 400, "temperature"),
    ("top_p 0", "/v1/completions", {"prompt": "Hi", "top_p": 0}, 400, "top_p"),
    ("top_p > 1", "/v1/chat/completions", {"messages": MESSAGES, "top_p": 1.5}, 400, "top_p"),
    ("five stop strings", "/v1/completions", {"prompt": "Hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("an empty stop string", "/v1/completions", {"prompt": "Hi", "stop": ""}, 400, "stop"),
    ("an empty messages list", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("a message without content", "/v1/chat/completions", {"messages": [{"role": "user"}]}, 400,
     "messages.0.content"),
    ("an unknown role", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "Hi"}]}, 400,
     "messages.0.role"),
    ("n 0", "/v1/completions", {"prompt": "Hi", "n": 0}, 400, "n"),
    ("logprobs 21", "/v1/completions", {"prompt": "Hi", "logprobs": 21}, 400, "logprobs"),
    ("top_logprobs without logprobs", "/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, 400,
     "top_logprobs"),
    ("stream_options without stream", "/v1/completions", {"prompt": "Hi", "stream_options": {"include_usage": True}},
     400, "stream_options"),
    ("logit_bias", "/v1/completions", {"prompt": "Hi", "logit_bias": {"1": 5.0}}, 400, "logit_bias"),
    ("presence_penalty 3", "/v1/completions", {"prompt": "Hi", "presence_penalty": 3}, 400, "presence_penalty"),
    ("echo with logprobs, streaming", "/v1/completions",
     {"prompt": "Hi", "echo": True, "logprobs": 1, "stream": True}, 400, "echo"),
]


@pytest.mark.parametrize("name, path, body, status, param", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_their_status_and_openai_error(server, name, path, body, status, param):
    if isinstance(body, dict):
        body = json.dumps({"model": MODEL_NAME, **body} if "model" not in body and name != "no model" else body)
    before = metric(server.url, "trtllm_prompt_tokens_total")
    r = requests.post(server.url + path, data=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()
    assert set(error) == {"error"} and set(error["error"]) == {"message", "type", "param", "code"}, error
    assert error["error"]["type"] == "invalid_request_error" and error["error"]["message"]
    assert error["error"]["param"] == param, error
    assert "Traceback" not in r.text
    # Refused before the engine: no prompt token was admitted.
    assert metric(server.url, "trtllm_prompt_tokens_total") == before


def test_unknown_paths_and_methods(server):
    r = requests.get(f"{server.url}/v1/nothing", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    r = requests.get(f"{server.url}/v1/completions", timeout=30)
    assert r.status_code == 405 and "error" in r.json()
    r = requests.get(f"{server.url}/v1/models/gpt-9", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_the_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-9", prompt="Hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="max_seq_len"):
        client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=100000)


NUM_CLIENTS = 64
DISTINCT_PROMPTS = [f"Question {i}: what is {i} plus {i + 1}? Answer:" for i in range(8)] + PROMPTS + [
    "The best way to learn a language is", "def fibonacci(n):", "My favourite colour is", "Water boils at",
    "The three primary colours are"]
CONCURRENT_TIMEOUT = 300


def test_64_concurrent_streaming_clients_get_their_whole_answers(server, reference_llm):
    """Every client streams at once; each answer equals its prompt run alone (the LLM API, one
    prompt at a time), none is lost, and the engine ends with nothing running and no block held."""
    prompts = [DISTINCT_PROMPTS[i % len(DISTINCT_PROMPTS)] for i in range(NUM_CLIENTS)]
    alone = {p: reference_llm.generate(p, SamplingParams(max_tokens=12), use_tqdm=False).outputs[0]
             for p in DISTINCT_PROMPTS}

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=240)

        async def one(prompt):
            stream = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0,
                                                     stream=True, stream_options={"include_usage": True})
            text, finish, usage = "", None, None
            async for chunk in stream:
                usage = chunk.usage or usage
                for c in chunk.choices:
                    text += c.text
                    finish = c.finish_reason or finish
            return text, finish, usage

        try:
            return await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts), return_exceptions=True),
                                          CONCURRENT_TIMEOUT)
        finally:
            await client.close()

    start = time.perf_counter()
    answers = asyncio.run(run())
    wall = time.perf_counter() - start
    failed = [a for a in answers if isinstance(a, BaseException)]
    assert not failed, failed[:3]
    complete = sum(finish is not None and usage is not None for _, finish, usage in answers)
    equal = sum(text == alone[p].text and finish == alone[p].finish_reason
                and usage.completion_tokens == len(alone[p].token_ids)
                for p, (text, finish, usage) in zip(prompts, answers))
    tokens = sum(usage.completion_tokens for _, _, usage in answers)
    print(f"\n64 concurrent streaming clients: {len(prompts)} requests sent, {len(answers)} answered, "
          f"{complete} complete, {equal} equal to the prompt alone, {len(failed)} lost; {tokens} tokens in "
          f"{wall:.1f} s wall ({tokens / wall:.0f} tokens/s)")
    assert len(answers) == NUM_CLIENTS and complete == NUM_CLIENTS and equal == NUM_CLIENTS
    assert metric(server.url, "trtllm_num_requests_running") == 0
    assert metric(server.url, "trtllm_kv_cache_blocks_used") == 0


STREAMING_CLIENT = """
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0)
stream = client.completions.create(model=sys.argv[2], prompt="Tell me a very long story.", max_tokens=400,
                                   temperature=0, stream=True, extra_body={"ignore_eos": True})
for chunk in stream:
    print(repr(chunk.choices[0].text), flush=True)
"""


def test_a_client_killed_mid_stream_frees_its_blocks(server):
    aborted = 'trtllm_request_finished_total{finish_reason="abort"}'
    before = metric(server.url, aborted)
    proc = subprocess.Popen([sys.executable, "-c", STREAMING_CLIENT, f"{server.url}/v1", MODEL_NAME],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(5):  # it is streaming
            assert proc.stdout.readline(), proc.stderr.read()
        assert metric(server.url, "trtllm_num_requests_running") == 1
        assert metric(server.url, "trtllm_kv_cache_blocks_used") >= 1
    finally:
        proc.kill()  # SIGKILL: the client's socket closes under it
        proc.wait()
    assert wait_for(lambda: metric(server.url, "trtllm_kv_cache_blocks_used") == 0), "blocks still held"
    assert metric(server.url, "trtllm_num_requests_running") == 0
    assert metric(server.url, aborted) == before + 1
    assert metric(server.url, "trtllm_num_requests_waiting") == 0


def test_a_non_streaming_client_that_leaves_frees_its_blocks(server):
    aborted = 'trtllm_request_finished_total{finish_reason="abort"}'
    before = metric(server.url, aborted)
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(f"{server.url}/v1/completions", timeout=1.5, json={
            "model": MODEL_NAME, "prompt": "Tell me a very long story.", "max_tokens": 400, "ignore_eos": True})
    assert wait_for(lambda: metric(server.url, aborted) == before + 1), "the request was not aborted"
    assert wait_for(lambda: metric(server.url, "trtllm_kv_cache_blocks_used") == 0)
    assert metric(server.url, "trtllm_num_requests_running") == 0


def test_metrics(server, client):
    client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=3, temperature=0)
    text = requests.get(f"{server.url}/metrics", timeout=30).text
    for name in ("trtllm_num_requests_running", "trtllm_num_requests_waiting", "trtllm_kv_cache_blocks_used",
                 "trtllm_kv_cache_blocks_total", "trtllm_prompt_tokens_total", "trtllm_generation_tokens_total",
                 "trtllm_time_to_first_token_seconds_bucket", "trtllm_time_per_output_token_seconds_bucket",
                 "trtllm_e2e_request_latency_seconds_count"):
        assert name in text, name
    assert metric(server.url, "trtllm_kv_cache_blocks_total") > 0
    assert metric(server.url, "trtllm_time_to_first_token_seconds_count") >= 1
    assert metric(server.url, "trtllm_generation_tokens_total") >= 3
