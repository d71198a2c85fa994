"""Fuzzing ModelRunner.generate's inputs and parameters: a result or a RequestError, nothing else."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tensorrt_llm.runtime import ModelRunner

from .harness import fuzz_settings, outcome

VOCAB = 96

numbers = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.booleans(), st.none(), st.text(max_size=4), st.integers(-3, 40))
small_ints = st.integers(-2, VOCAB + 2)
token = st.one_of(small_ints, st.integers(-2**64, 2**64), st.floats(-1e3, 1e3), st.booleans(),
                  st.sampled_from([2**32 + 5, 2**31, -2**31 - 1]))


@st.composite
def prompt(draw):
    kind = draw(st.sampled_from(["list", "tensor", "numpy", "nested", "empty", "odd"]))
    ids = draw(st.lists(token, min_size=1, max_size=20))
    if kind == "list":
        return ids
    if kind == "empty":
        return []
    if kind == "odd":
        return draw(st.one_of(st.text(max_size=5), st.none(), st.integers(), st.just({"a": 1})))
    try:
        dtype = draw(st.sampled_from(["int32", "int64", "float32", "bool", "int8", "uint8"]))
        with np.errstate(invalid="ignore", over="ignore"):  # wrapped-around ids are cases too
            arr = np.array([int(t) if not isinstance(t, float) else t for t in ids]).astype(dtype)
    except (OverflowError, ValueError):
        return ids
    if kind == "nested":
        arr = arr.reshape(1, -1)
    return torch.from_numpy(arr) if kind in ("tensor", "nested") else arr


word = st.lists(st.one_of(small_ints, st.integers(-5, 2**40)), min_size=0, max_size=3)
word_list = st.one_of(st.none(), st.lists(st.lists(word, max_size=4), min_size=1, max_size=3),
                      st.just([[[t] for t in range(VOCAB)]]), st.text(max_size=3))

params = st.fixed_dictionaries({}, optional={
    "max_new_tokens": st.one_of(numbers, st.integers(0, 40)),
    "end_id": st.one_of(numbers, small_ints),
    "pad_id": st.one_of(numbers, small_ints),
    "temperature": st.one_of(numbers, st.floats(0, 3)),
    "top_k": st.one_of(numbers, st.integers(0, VOCAB + 5)),
    "top_p": st.one_of(numbers, st.floats(0, 1)),
    "random_seed": st.one_of(numbers, st.integers(0, 2**64)),
    "num_beams": st.one_of(numbers, st.integers(1, 3)),
    "length_penalty": numbers,
    "repetition_penalty": st.one_of(numbers, st.floats(0.5, 2)),
    "presence_penalty": numbers,
    "frequency_penalty": numbers,
    "min_length": st.one_of(numbers, st.integers(0, 10)),
    "stop_words_list": word_list,
    "bad_words_list": word_list,
    "output_log_probs": st.booleans(),
    "streaming": st.booleans(),
})


SPOILABLE = ["max_new_tokens", "end_id", "pad_id", "temperature", "top_k", "top_p", "random_seed", "num_beams",
             "length_penalty", "repetition_penalty", "presence_penalty", "frequency_penalty", "min_length"]


@pytest.fixture(scope="module")
def runner(tiny_engine_dir):
    return ModelRunner.from_dir(tiny_engine_dir, device="cpu")


def check_generate(runner, prompts, kwargs) -> str:
    """One request: its result or a RequestError; either way every KV block is free after."""
    def case():
        out = runner.generate(prompts, **kwargs)
        if kwargs.get("streaming"):
            for _ in out:
                pass
    free_before = runner.kv_cache.num_free_blocks
    result = outcome(case, f"generate({prompts!r}, **{kwargs!r})")
    assert runner.kv_cache.num_free_blocks == free_before
    return result


@fuzz_settings(examples=3000)
@given(prompts=st.lists(prompt(), min_size=0, max_size=3), kwargs=params)
def test_generate_returns_a_result_or_a_request_error(runner, prompts, kwargs):
    check_generate(runner, prompts, kwargs)


valid_params = st.fixed_dictionaries({}, optional={
    "max_new_tokens": st.integers(1, 12),
    "end_id": st.integers(0, VOCAB - 1),
    "pad_id": st.integers(0, VOCAB - 1),
    "temperature": st.floats(0, 3),
    "top_k": st.integers(0, VOCAB),
    "top_p": st.floats(0, 1),
    "random_seed": st.integers(0, 2**63 - 1),
    "num_beams": st.integers(1, 2),
    "length_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.5, 2),
    "presence_penalty": st.floats(-1, 1),
    "frequency_penalty": st.floats(-1, 1),
    "min_length": st.integers(0, 6),
    "stop_words_list": st.lists(st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3),
                                         min_size=1, max_size=2), min_size=1, max_size=2),
    "bad_words_list": st.lists(st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=2),
                                        min_size=1, max_size=2), min_size=1, max_size=2),
    "output_log_probs": st.booleans(),
    "output_cum_log_probs": st.booleans(),
    "streaming": st.booleans(),
})


@fuzz_settings(examples=600)
@given(prompts=st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12), min_size=1, max_size=2),
       kwargs=valid_params, spoil=st.one_of(st.none(), st.tuples(st.sampled_from(SPOILABLE), numbers)))
def test_well_formed_requests_run_and_one_bad_field_is_a_request_error(runner, prompts, kwargs, spoil):
    """Requests a user would send (the deep paths: beams, word lists, penalties, streaming),
    sometimes with one field spoilt: each runs, or is a RequestError, and frees its blocks."""
    if spoil is not None:
        kwargs = dict(kwargs, **{spoil[0]: spoil[1]})
    check_generate(runner, prompts, kwargs)
