"""Bad requests are refused with a clear message before any work, and leave the runner usable."""
import pytest

from ..models.llama_utils import engine_from_hf, generated, random_hf_llama, runner


@pytest.fixture(scope="module")
def small_runner(tmp_path_factory):
    hf = random_hf_llama(seed=0)
    return runner(engine_from_hf(hf, tmp_path_factory.mktemp("e") / "engine",
                                 max_batch_size=2, max_input_len=16, max_seq_len=24))


@pytest.mark.parametrize("batch, kwargs, message", [
    ([[1] * 17], {}, "max_input_len 16"),
    ([[1], [2], [3]], {}, "max_batch_size 2"),
    ([[1, 320]], {}, "token id 320, outside the vocabulary"),
    ([[1, -1]], {}, "token id -1"),
    ([[1] * 10], {"max_new_tokens": 15}, "max_seq_len 24"),
    ([[]], {}, "prompt 0 is empty"),
    ([[1]], {"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
])
def test_bad_requests_are_refused(small_runner, batch, kwargs, message):
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        small_runner.generate(batch, **kwargs)
    # The runner still works and holds no leftover KV-cache blocks.
    free = small_runner.kv_cache.num_free_blocks
    out = small_runner.generate([[1, 2, 3]], max_new_tokens=4)
    assert len(generated(out, 0, 3)) == 4
    assert small_runner.kv_cache.num_free_blocks == free
