"""What the server needed from the LLM API: an engine folder takes max_batch_size/max_num_tokens as
runtime limits, `LLM.running` says whether the engine takes requests, and a consumer whose event
loop has closed no longer kills the receiver thread."""
from __future__ import annotations

import asyncio
import time

import pytest

from tensorrt_llm import LLM, SamplingParams
from tensorrt_llm.errors import ConfigError

from .conftest import BUILD


def test_an_engine_folder_takes_step_limits_at_run_time(engine_dir):
    with LLM(engine_dir, device="cpu", max_batch_size=2, max_num_tokens=64, progress=None) as llm:
        assert (llm.max_batch_size, llm.admission.max_num_tokens) == (2, 64)
        outs = llm.generate(["1, 2, 3,", "Hello", "The sky is"], SamplingParams(max_tokens=3), use_tqdm=False)
        assert all(len(o.outputs[0].token_ids) == 3 for o in outs)
    with LLM(engine_dir, device="cpu", max_batch_size=10**6, progress=None) as llm:  # at most the engine's
        assert llm.max_batch_size == BUILD["max_batch_size"]
    with pytest.raises(ConfigError, match="used as it was built"):  # a build option still cannot change
        LLM(engine_dir, device="cpu", max_seq_len=BUILD["max_seq_len"] // 2, progress=None)


def test_running_and_a_closed_consumer_loop(reference_llm):
    llm = reference_llm
    assert llm.running

    async def stream_until_a_stop_string():
        result = llm.generate_async("1, 2, 3,", SamplingParams(max_tokens=32, stop=", 5"), streaming=True)
        async for out in result:
            pass
        return out

    # The stop string ends the request here; the engine's abort update arrives after asyncio.run
    # has closed the loop the result belonged to.
    out = asyncio.run(stream_until_a_stop_string())
    assert out.outputs[0].finish_reason == "stop"
    time.sleep(0.5)
    assert llm.running, llm.error
    assert len(llm.generate("Hi", SamplingParams(max_tokens=2), use_tqdm=False).outputs[0].token_ids) == 2


def test_running_is_false_after_shutdown(engine_dir):
    llm = LLM(engine_dir, device="cpu", progress=None)
    assert llm.running
    llm.shutdown()
    assert not llm.running
