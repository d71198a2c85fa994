"""Bad requests are refused with a clear message before any work, and leave the runner usable."""
import numpy as np
import pytest
import torch

from tensorrt_llm.errors import RequestError

from ..models.llama_utils import engine_from_hf, generated, random_hf_llama, runner

VOCAB = 320  # random_hf_llama's


@pytest.fixture(scope="module")
def small_runner(tmp_path_factory):
    hf = random_hf_llama(seed=0)
    return runner(engine_from_hf(hf, tmp_path_factory.mktemp("e") / "engine",
                                 max_batch_size=2, max_input_len=16, max_seq_len=24))


ALL_BANNED = [[t] for t in range(VOCAB)]


@pytest.mark.parametrize("batch, kwargs, message", [
    ([[1] * 17], {}, "max_input_len 16"),
    ([[1], [2], [3]], {}, "max_batch_size 2"),
    ([[1, 320]], {}, "token id 320, outside the vocabulary"),
    ([[1, -1]], {}, "token id -1"),
    ([[1] * 10], {"max_new_tokens": 15}, "max_seq_len 24"),
    ([[]], {}, "prompt 0 is empty"),
    ([[1]], {"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
    # Ids are checked before the cast to int32: 2**32 + 504 must not run as 504.
    ([torch.tensor([1, 2**32 + 504], dtype=torch.int64)], {}, "prompt 0 holds token id 4294967800"),
    ([np.array([1, 2**32 + 504], dtype=np.int64)], {}, "prompt 0 holds token id 4294967800"),
    ([[1, 2**32 + 504]], {}, "prompt 0 holds token id 4294967800"),
    ([[1, 2**70]], {}, f"prompt 0 holds token id {2**70}"),
    ([[1, 2], torch.tensor([3, -2**40])], {}, "prompt 1 holds token id -1099511627776"),
    # Floats and bools are not token ids.
    ([[1, 2.0]], {}, r"prompt 0 holds 2.0 \(float\) at position 1; token ids must be integers"),
    ([[1, 2], torch.tensor([1.0, 2.0])], {}, "prompt 1 is a float32 tensor; token ids must be integers"),
    ([np.array([1.5, 2.5])], {}, "prompt 0 is a float64 numpy array"),
    ([[True, 2]], {}, r"prompt 0 holds True \(bool\) at position 0"),
    ([torch.tensor([True, False])], {}, "prompt 0 is a bool tensor"),
    # One prompt is 1-D; a 2-D prompt is not silently flattened.
    ([torch.tensor([[1, 2, 3]])], {}, r"prompt 0 has shape \[1, 3\]: each prompt must be a 1-D"),
    ([[[1, 2], [3, 4]]], {}, r"prompt 0 has shape \[2, 2\]"),
    ([1, 2, 3], {}, "prompt 0 is a single token id, not a sequence"),
    (torch.tensor([1, 2, 3]), {}, r"batch_input_ids is a tensor of shape \[3\]"),
    ("hello", {}, "batch_input_ids must be a list of prompts"),
    # Every numeric parameter's type and range, at submission.
    ([[1]], {"max_new_tokens": 2.5}, "max_new_tokens must be >= 1 and an integer, got 2.5"),
    ([[1]], {"max_new_tokens": True}, "max_new_tokens must be >= 1 and an integer, got True"),
    ([[1]], {"temperature": -1}, "SamplingConfig.temperature must be a finite number >= 0, got -1"),
    ([[1]], {"top_p": 1.5}, r"SamplingConfig.top_p must be a number in \[0, 1\], got 1.5"),
    ([[1]], {"top_k": 2.5}, "SamplingConfig.top_k must be an int >= 0"),
    ([[1]], {"repetition_penalty": 0}, "SamplingConfig.repetition_penalty must be a finite number > 0"),
    ([[1]], {"num_beams": 0}, "SamplingConfig.num_beams must be an int >= 1"),
    ([[1]], {"num_beams": 2}, "max_beam_width 1"),
    ([[1]], {"min_length": 1.5, "end_id": 2}, "SamplingConfig.min_length must be an int >= 0"),
    ([[1]], {"random_seed": 1.5}, "SamplingConfig.random_seed must be None or an int"),
    ([[1]], {"no_such_option": 1}, "unknown option.*no_such_option"),
    # pad_id / end_id are tokens of the vocabulary.
    ([[1]], {"end_id": 320}, r"end_id 320 is outside the vocabulary \[0, 320\)"),
    ([[1]], {"end_id": 2, "pad_id": 1000}, r"pad_id 1000 is outside the vocabulary \[0, 320\)"),
    # Bad words that ban every token would leave nothing to generate.
    ([[1]], {"bad_words_list": ALL_BANNED}, r"bad_words_list bans every token of the vocabulary \(320\)"),
    ([[1]], {"bad_words_list": [[1.0]]}, r"bad_words_list holds 1.0 \(float\)"),
])
def test_bad_requests_are_refused(small_runner, batch, kwargs, message):
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(RequestError, match=message) as caught:
        small_runner.generate(batch, **kwargs)
    assert isinstance(caught.value, ValueError)  # callers catching ValueError keep working
    assert "\n" not in str(caught.value)
    # The runner still works and holds no leftover KV-cache blocks.
    free = small_runner.kv_cache.num_free_blocks
    out = small_runner.generate([[1, 2, 3]], max_new_tokens=4)
    assert len(generated(out, 0, 3)) == 4
    assert small_runner.kv_cache.num_free_blocks == free


def test_a_streamed_request_is_checked_when_submitted(small_runner):
    with pytest.raises(RequestError, match="max_new_tokens"):
        small_runner.generate([[1, 2]], max_new_tokens=2.5, streaming=True)


def test_accepted_id_forms_give_the_same_tokens(small_runner):
    want = small_runner.generate([[5, 6, 7], [8, 9, 10]], max_new_tokens=4)["output_ids"]
    forms = [
        [torch.tensor([5, 6, 7], dtype=torch.int64), np.array([8, 9, 10], dtype=np.int32)],
        [[np.int64(5), 6, torch.tensor(7)], (8, 9, 10)],
        torch.tensor([[5, 6, 7], [8, 9, 10]]),  # a 2-D tensor: its rows are the prompts
        np.array([[5, 6, 7], [8, 9, 10]], dtype=np.uint16),
    ]
    for batch in forms:
        assert torch.equal(small_runner.generate(batch, max_new_tokens=4)["output_ids"], want)
    # Numpy scalars are accepted as numbers; bad words short of the whole vocabulary too.
    out = small_runner.generate([[5, 6, 7]], max_new_tokens=np.int64(4), top_p=np.float32(1.0),
                                bad_words_list=ALL_BANNED[:-1])
    assert generated(out, 0, 3) == [VOCAB - 1] * 4
