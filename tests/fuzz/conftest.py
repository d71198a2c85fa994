"""A tiny random-Llama engine and checkpoint shared by the fuzzers (built once per session)."""
from __future__ import annotations

import pytest

from tests.models.llama_utils import engine_from_hf, random_hf_llama


@pytest.fixture(scope="session")
def tiny_hf_model():
    return random_hf_llama(seed=3, vocab_size=96, hidden_size=32, intermediate_size=48,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture(scope="session")
def tiny_engine_dir(tmp_path_factory, tiny_hf_model):
    return engine_from_hf(tiny_hf_model, tmp_path_factory.mktemp("fuzz-engine") / "engine",
                          max_batch_size=2, max_input_len=16, max_seq_len=32, tokens_per_block=8)
