"""LLaMA end to end: Hugging Face weights -> engine -> logits and greedy tokens equal to transformers."""
import pytest
import torch

from .llama_utils import DEVICES, engine_from_hf, generated, hf_greedy, random_hf_llama, runner

SHAPES = {
    "mha_untied": dict(),
    "gqa_tied_d64": dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "gqa_d128_group4": dict(hidden_size=512, num_attention_heads=4, num_key_value_heads=1),
    "mqa_theta": dict(num_attention_heads=4, num_key_value_heads=1, rope_theta=500000.0),
    "llama3_scaling": dict(num_attention_heads=4, num_key_value_heads=2,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    "linear_scaling": dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_and_greedy_match_transformers(shape, device, tmp_path):
    hf = random_hf_llama(seed=1, **SHAPES[shape])
    r = runner(engine_from_hf(hf, tmp_path / "engine", target_device="any"), device=device)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, hf.config.vocab_size, (40,), generator=g).tolist()

    out = r.generate([prompt], max_new_tokens=12, return_context_logits=True)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    ours = out["context_logits"][0].cpu()
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())
    assert generated(out, 0, len(prompt)) == hf_greedy(hf, prompt, 12)


@pytest.mark.parametrize("device", DEVICES)
def test_ragged_batch_equals_each_alone(device, tmp_path):
    hf = random_hf_llama(seed=3, num_attention_heads=4, num_key_value_heads=2)
    r = runner(engine_from_hf(hf, tmp_path / "engine", target_device="any"), device=device)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 320, (n,), generator=g).tolist() for n in (5, 17, 1, 33)]
    together = r.generate(prompts, max_new_tokens=10)
    for b, p in enumerate(prompts):
        alone = r.generate([p], max_new_tokens=10)
        assert generated(together, b, len(p)) == generated(alone, 0, len(p)), f"prompt {b}"
        assert generated(alone, 0, len(p)) == hf_greedy(hf, p, 10)


def test_generation_logits_are_those_of_each_step(tmp_path):
    hf = random_hf_llama(seed=5)
    r = runner(engine_from_hf(hf, tmp_path / "engine"))
    prompt = list(range(3, 20))
    out = r.generate([prompt], max_new_tokens=4, output_generation_logits=True)
    logits = out["generation_logits"]
    assert logits.shape == (1, 1, 4, 320)
    tokens = generated(out, 0, len(prompt))
    assert logits[0, 0].argmax(-1).tolist() == tokens
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + tokens[:3]])).logits[0, len(prompt) - 1:]
    torch.testing.assert_close(logits[0, 0], ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())


def test_end_id_stops_a_sequence_and_pads(tmp_path):
    hf = random_hf_llama(seed=6)
    r = runner(engine_from_hf(hf, tmp_path / "engine"))
    prompts = [[1, 2, 3, 4], [9, 8, 7, 6, 5, 4, 3]]
    free = r.generate(prompts, max_new_tokens=8)
    first = generated(free, 0, 4)
    end_id = first[2]  # make the third token of prompt 0 its end
    out = r.generate(prompts, max_new_tokens=8, end_id=end_id, pad_id=0)
    toks = generated(out, 0, 4)
    assert toks == first[:first.index(end_id) + 1]
    width = out["output_ids"].shape[-1]
    assert out["output_ids"][0, 0, 4 + len(toks):].tolist() == [0] * (width - 4 - len(toks))
    other = generated(free, 1, 7)
    cut = other.index(end_id) + 1 if end_id in other else len(other)
    assert generated(out, 1, 7) == other[:cut]


def test_streaming_yields_every_step_and_ends_with_the_full_result(tmp_path):
    hf = random_hf_llama(seed=7)
    r = runner(engine_from_hf(hf, tmp_path / "engine"))
    steps = list(r.generate([[5, 6, 7]], max_new_tokens=5, streaming=True))
    lengths = [int(s["sequence_lengths"][0, 0]) for s in steps]
    assert lengths[:5] == [4, 5, 6, 7, 8]
    assert generated(steps[-1], 0, 3) == generated(r.generate([[5, 6, 7]], max_new_tokens=5), 0, 3)


def test_sampling_with_a_seed_repeats_and_differs_from_greedy(tmp_path):
    hf = random_hf_llama(seed=8)
    r = runner(engine_from_hf(hf, tmp_path / "engine"))
    kw = dict(max_new_tokens=16, temperature=1.5, top_k=0, top_p=0.95)
    a = generated(r.generate([[1, 2, 3]], random_seed=11, **kw), 0, 3)
    b = generated(r.generate([[1, 2, 3]], random_seed=11, **kw), 0, 3)
    c = generated(r.generate([[1, 2, 3]], random_seed=12, **kw), 0, 3)
    assert a == b
    assert a != c


def test_float16_and_bfloat16_engines_stay_close_to_float32(tmp_path):
    hf = random_hf_llama(seed=9)
    prompt = list(range(10, 40))
    ref = runner(engine_from_hf(hf, tmp_path / "f32")).generate(
        [prompt], max_new_tokens=1, return_context_logits=True)["context_logits"][0]
    for dtype in ("float16", "bfloat16"):
        out = runner(engine_from_hf(hf, tmp_path / dtype, dtype=dtype)).generate(
            [prompt], max_new_tokens=1, return_context_logits=True)["context_logits"][0]
        assert out.dtype == torch.float32  # logits_dtype
        err = (out - ref).abs().max() / ref.abs().max()
        assert err < (0.02 if dtype == "float16" else 0.08), (dtype, float(err))
