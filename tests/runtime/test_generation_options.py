"""Greedy and sampling options of generate: penalties, min_length and bad words as
transformers' processors, stop words, log-probs, and seeded sampling."""
import pytest
import torch

from ..models.llama_utils import DEVICES, engine_from_hf, generated, random_hf_llama, runner

NEW = 16
PROMPTS = [[5, 17, 33, 2, 9, 100, 44], list(range(50, 70))]


@pytest.fixture(scope="module")
def hf():
    return random_hf_llama(seed=2)


@pytest.fixture(scope="module", params=DEVICES)
def r(request, hf, tmp_path_factory):
    return runner(engine_from_hf(hf, tmp_path_factory.mktemp("opts") / "engine"),
                  device=request.param)


@pytest.fixture(scope="module")
def greedy(r):
    out = r.generate(PROMPTS, max_new_tokens=NEW)
    return [generated(out, b, len(p)) for b, p in enumerate(PROMPTS)]


def hf_greedy(hf, prompt, **kwargs):
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                      pad_token_id=0, **kwargs)
    return out[0, len(prompt):].tolist()


def cut(tokens, end_id):
    return tokens[:tokens.index(end_id) + 1] if end_id in tokens else tokens


@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_repetition_penalty_matches_transformers(r, hf, greedy, penalty):
    out = r.generate(PROMPTS, max_new_tokens=NEW, repetition_penalty=penalty)
    for b, p in enumerate(PROMPTS):
        ours = generated(out, b, len(p))
        assert ours == hf_greedy(hf, p, repetition_penalty=penalty, eos_token_id=None)
    assert [generated(out, b, len(p)) for b, p in enumerate(PROMPTS)] != greedy


def test_min_length_matches_transformers(r, hf, greedy):
    end_id = greedy[0][2]  # prompt 0 would end after 3 tokens
    out = r.generate(PROMPTS, max_new_tokens=NEW, end_id=end_id, pad_id=0, min_length=6)
    for b, p in enumerate(PROMPTS):
        ref = cut(hf_greedy(hf, p, min_new_tokens=6, eos_token_id=end_id), end_id)
        assert generated(out, b, len(p)) == ref
    assert len(generated(out, 0, len(PROMPTS[0]))) >= 6


def test_bad_words_match_transformers(r, hf, greedy):
    # A one-token word banned always, and a two-token word banned after its first token.
    bad = [[greedy[0][1]], greedy[1][3:5]]
    out = r.generate(PROMPTS, max_new_tokens=NEW, bad_words_list=bad)
    for b, p in enumerate(PROMPTS):
        assert generated(out, b, len(p)) == hf_greedy(hf, p, bad_words_ids=bad, eos_token_id=None)
        assert generated(out, b, len(p)) != greedy[b]


def test_bad_words_per_request(r, greedy):
    out = r.generate(PROMPTS, max_new_tokens=NEW, bad_words_list=[[[greedy[0][0]]], []])
    assert generated(out, 0, len(PROMPTS[0]))[0] != greedy[0][0]
    assert generated(out, 1, len(PROMPTS[1])) == greedy[1]


def test_stop_words_end_their_row_and_stay_in_the_output(r, greedy):
    stop = [[greedy[0][3:5]], [[greedy[1][6]], [999 % 320, 1]]]
    out = r.generate(PROMPTS, max_new_tokens=NEW, stop_words_list=stop, pad_id=0)
    assert generated(out, 0, len(PROMPTS[0])) == greedy[0][:5]
    assert generated(out, 1, len(PROMPTS[1])) == greedy[1][:greedy[1].index(greedy[1][6]) + 1]


def test_log_probs_are_those_of_the_chosen_tokens(r):
    out = r.generate(PROMPTS, max_new_tokens=NEW, output_generation_logits=True,
                     output_log_probs=True, output_cum_log_probs=True)
    logits = out["generation_logits"][:, 0].cpu().float()
    tokens = out["output_ids"][:, 0, -NEW:].long()
    for b, p in enumerate(PROMPTS):
        tokens[b] = torch.tensor(generated(out, b, len(p)))
    ref = torch.log_softmax(logits, -1).gather(2, tokens[..., None]).squeeze(-1)
    assert out["log_probs"].shape == (2, 1, NEW)
    torch.testing.assert_close(out["log_probs"][:, 0], ref)
    torch.testing.assert_close(out["cum_log_probs"][:, 0], ref.sum(-1))


def test_log_probs_follow_the_processed_logits_and_stop_at_the_end(r, greedy):
    end_id = greedy[0][2]
    out = r.generate(PROMPTS[:1], max_new_tokens=NEW, end_id=end_id, repetition_penalty=1.3,
                     output_generation_logits=True, output_log_probs=True)
    n = len(generated(out, 0, len(PROMPTS[0])))
    assert n < NEW
    assert out["log_probs"][0, 0, n:].abs().sum() == 0
    assert bool((out["log_probs"][0, 0, :n] < 0).all())


def test_seeded_sampling_repeats(r):
    kw = dict(max_new_tokens=NEW, temperature=1.2, top_k=0, top_p=0.95, repetition_penalty=1.2,
              bad_words_list=[[7]])
    a, b, c = (r.generate(PROMPTS, random_seed=seed, **kw) for seed in (3, 3, 4))
    assert torch.equal(a["output_ids"], b["output_ids"])
    assert not torch.equal(a["output_ids"], c["output_ids"])
    assert all(7 not in generated(a, i, len(p)) for i, p in enumerate(PROMPTS))


@pytest.mark.parametrize("words, message", [
    ([[1, 320]], "in \\[0, 320\\)"),
    ([[[1]], [[2]], [[3]]], "3 lists for 2 requests"),
    ([[[1], []], [[2]]], "non-empty"),
    (5, "must be a list"),
])
def test_malformed_word_lists_are_refused(r, words, message):
    with pytest.raises(ValueError, match=message):
        r.generate(PROMPTS, max_new_tokens=2, bad_words_list=words)
