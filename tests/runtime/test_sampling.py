import math

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tensorrt_llm.runtime.sampling import (
    SamplingConfig,
    argmax_by_chunks,
    argmax_rows,
    make_generator,
    process_logits,
    sample,
    sampling_distribution,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def random_logits(batch, vocab, seed, device="cpu", scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, vocab, generator=gen) * scale).to(device)


def hf_distribution(logits, temperature=1.0, top_k=0, top_p=1.0):
    """The distribution transformers' warpers sample from (temperature, top-k, top-p)."""
    scores = logits.float().cpu()
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(-1)


def draw_counts(logits_row, config, draws, device, seed=0):
    """Sample one row `draws` times (as a batch) and count each token."""
    logits = logits_row.reshape(1, -1).expand(draws, -1).to(device)
    tokens = sample(logits, config, make_generator(seed, device))
    return torch.bincount(tokens.long().cpu(), minlength=logits.shape[1]).double()


def chi_square(counts, probs):
    """Pearson statistic over the tokens with probability > 0, and its degrees of freedom."""
    probs = probs.double().cpu()
    assert counts[probs == 0].sum() == 0, "drew a token of probability 0"
    keep = probs > 0
    expected = counts.sum() * probs[keep]
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


def assert_matches(counts, probs):
    stat, df = chi_square(counts, probs)
    # Mean df, standard deviation sqrt(2 df): 6 deviations out is never reached by chance.
    assert stat < df + 6 * math.sqrt(2 * df) + 10, (stat, df)


# -- config ----------------------------------------------------------------------------


def test_config_defaults_and_greedy():
    c = SamplingConfig(end_id=2)
    assert c.pad_id == 2 and c.temperature == 1.0 and c.top_k == 0 and c.top_p == 1.0
    assert not c.is_greedy
    assert SamplingConfig(end_id=2, top_k=1).is_greedy
    assert SamplingConfig(end_id=2, temperature=0.0).is_greedy
    assert SamplingConfig(end_id=2, pad_id=0).pad_id == 0


@pytest.mark.parametrize("field,value", [
    ("end_id", -1), ("pad_id", -3), ("temperature", -0.1), ("temperature", math.inf),
    ("top_k", -1), ("top_k", 2.5), ("top_p", 1.5), ("top_p", -0.1), ("random_seed", "x"),
    ("num_beams", 0), ("repetition_penalty", 0.0), ("presence_penalty", math.nan),
    ("frequency_penalty", math.inf), ("min_length", -1), ("length_penalty", math.nan),
    ("early_stopping", "always"),
])
def test_config_rejects_out_of_range(field, value):
    with pytest.raises(ValueError, match=f"SamplingConfig.{field}"):
        SamplingConfig(**{"end_id": 0, field: value})


@pytest.mark.parametrize("sampling", [dict(top_k=5), dict(top_p=0.9), dict(temperature=0.7)])
def test_beam_search_does_not_sample(sampling):
    assert SamplingConfig(end_id=0, num_beams=4, top_k=1).num_beams == 4
    with pytest.raises(ValueError, match="SamplingConfig.num_beams must be 1 when sampling"):
        SamplingConfig(end_id=0, num_beams=4, **sampling)


# -- greedy ----------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("greedy", [dict(top_k=1), dict(temperature=0.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_is_argmax(device, greedy, dtype):
    logits = random_logits(16, 1000, seed=1, device=device).to(dtype)
    tokens = sample(logits, SamplingConfig(end_id=0, **greedy))
    assert tokens.dtype == torch.int32 and tokens.device.type == device
    assert torch.equal(tokens.long(), logits.argmax(-1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab,width", [(128256, 1002), (4096, 1024), (5000, 1024), (3000, 512), (2048, 1024)])
def test_argmax_by_chunks_is_argmax(device, vocab, width):
    """The two-pass argmax (chunk maxima, then the best chunk) answers as torch.argmax does:
    the first of tied maxima, within a chunk, across chunks and in the tail after the last whole
    chunk; NaN as the largest."""
    g = torch.Generator().manual_seed(vocab + width)
    logits = torch.randint(-50, 5, (12, vocab), generator=g).float()  # few values: many ties
    logits[1, :] = 7.0  # all tied: index 0
    logits[2, vocab - 1] = 9.0  # the last logit (the tail, when there is one)
    logits[3, [width - 1, width]] = 9.0  # tied across a chunk boundary: the first
    logits[4, vocab - 2:] = 9.0  # tied in the tail
    logits[5, [3, vocab - 1]] = 9.0  # tied between the first chunk and the tail: the first
    logits[6, width + 1] = float("nan")
    logits[7, vocab - 1] = float("nan")
    logits[8, [5, vocab - 1]] = float("nan")  # two NaNs: the first
    logits[9] = float("-inf")
    logits = logits.to(device)
    want = logits.argmax(dim=-1)
    got = argmax_by_chunks(logits, width)
    assert got.dtype == torch.int32 and torch.equal(got.long(), want)
    assert torch.equal(argmax_rows(logits).long(), want)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [128256, 32000, 49152, 151937, 1500])
def test_greedy_rows_on_a_gpu_are_argmax(vocab):
    """On a GPU greedy rows take the two-pass argmax (a vocabulary with and without a divisor
    for the chunks, one too small to chunk): torch.argmax's tokens."""
    logits = random_logits(5, vocab, seed=vocab, device="cuda")
    logits[0, -1] = logits.max() + 1
    tokens = sample(logits, SamplingConfig(end_id=0, top_k=1))
    assert tokens.dtype == torch.int32 and torch.equal(tokens.long(), logits.argmax(-1))


# -- sampling distributions ------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_top_k_never_leaves_the_top_k(device):
    logits = random_logits(1, 200, seed=2, scale=0.5)[0]
    counts = draw_counts(logits, SamplingConfig(end_id=0, top_k=7), 20000, device)
    top = set(torch.topk(logits, 7).indices.tolist())
    assert set(counts.nonzero().flatten().tolist()) == top
    assert_matches(counts, hf_distribution(logits[None], top_k=7)[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("top_k", [0, 25])
def test_a_top_p_below_float32s_smallest_keeps_the_most_likely_token(device, top_k):
    """Found by tests/fuzz: top_p=2e-107 is 0 in float32, kept nothing, and indexed -1."""
    logits = random_logits(2, 96, seed=4)
    config = SamplingConfig(end_id=0, top_p=2.1e-107, top_k=top_k)
    probs = sampling_distribution(logits.to(device), config).cpu()
    assert torch.equal(probs.argmax(dim=-1), logits.argmax(dim=-1))
    assert torch.equal((probs > 0).sum(-1), torch.ones(2).long())
    tokens = sample(logits.to(device), config, make_generator(0, device))
    assert torch.equal(tokens.cpu().long(), logits.argmax(dim=-1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("top_k", [0, 25])
def test_top_p_draws_from_renormalised_nucleus(device, top_k):
    logits = random_logits(1, 100, seed=3, scale=1.5)[0]
    config = SamplingConfig(end_id=0, top_p=0.7, top_k=top_k)
    probs = sampling_distribution(logits[None].to(device), config)[0].cpu()
    nucleus = probs > 0
    assert 2 < nucleus.sum() < (top_k or 30)  # the test exercises a real cut
    # The nucleus: the most likely tokens, just enough to reach 0.7 of the top-k
    # distribution (top-p applies after top-k, as in transformers).
    full = hf_distribution(logits[None], top_k=top_k)[0]
    inside = full[nucleus]
    assert inside.sum() >= 0.7 and inside.sum() - inside.min() < 0.7
    assert inside.min() > full[~nucleus].max()
    torch.testing.assert_close(probs[nucleus], inside / inside.sum())

    counts = draw_counts(logits, config, 40000, device)
    assert_matches(counts, probs)
    # The check is sharp enough to reject a mildly flattened nucleus.
    flatter = (logits / 1.3).softmax(-1) * nucleus
    stat, df = chi_square(counts, flatter / flatter.sum())
    assert stat > df + 6 * math.sqrt(2 * df) + 10, (stat, df)


@pytest.mark.parametrize("params", [
    dict(), dict(temperature=0.6), dict(top_k=10), dict(top_p=0.9), dict(top_p=0.5, top_k=30),
    dict(temperature=1.7, top_k=40, top_p=0.8), dict(top_p=0.0),
])
def test_distribution_equals_transformers_warpers(params):
    logits = random_logits(6, 300, seed=4)
    ours = sampling_distribution(logits, SamplingConfig(end_id=0, **params))
    hf_params = dict(params)
    if hf_params.get("top_p") == 0.0:  # our spelling of "off"
        del hf_params["top_p"]
    torch.testing.assert_close(ours, hf_distribution(logits, **hf_params), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_temperature_sharpens(device):
    logits = random_logits(1, 30, seed=5, scale=1.0)[0]
    top = int(logits.argmax())
    shares = {}
    for t in (0.3, 1.0, 3.0):
        counts = draw_counts(logits, SamplingConfig(end_id=0, temperature=t), 20000, device)
        assert_matches(counts, (logits / t).softmax(-1))
        shares[t] = counts[top] / counts.sum()
    assert shares[0.3] > shares[1.0] + 0.05 and shares[1.0] > shares[3.0] + 0.02


@pytest.mark.parametrize("device", DEVICES)
def test_same_seed_same_tokens(device):
    logits = random_logits(64, 500, seed=6, device=device)
    config = SamplingConfig(end_id=0, temperature=0.9, top_p=0.95, random_seed=1234)
    runs = []
    for _ in range(2):
        gen = make_generator(config.random_seed, device)
        runs.append(torch.stack([sample(logits, config, gen) for _ in range(5)]))
    assert torch.equal(runs[0], runs[1])
    # Successive steps and other seeds draw differently.
    assert not torch.equal(runs[0][0], runs[0][1])
    other = sample(logits, config, make_generator(99, device))
    assert not torch.equal(runs[0][0], other)


def test_per_row_configs():
    logits = random_logits(4, 50, seed=7, scale=0.5)
    configs = [SamplingConfig(end_id=0, top_k=1), SamplingConfig(end_id=0, top_k=5),
               SamplingConfig(end_id=0, temperature=0.0), SamplingConfig(end_id=0, top_p=0.6)]
    dist = sampling_distribution(logits, configs)
    for row, config in enumerate(configs):
        torch.testing.assert_close(dist[row], sampling_distribution(logits[row:row + 1], config)[0])
    draws = torch.stack([sample(logits, configs, make_generator(s, "cpu")) for s in range(300)])
    argmax = logits.argmax(-1).int()
    assert (draws[:, 0] == argmax[0]).all() and (draws[:, 2] == argmax[2]).all()
    for row in (1, 3):
        picked = set(draws[:, row].tolist())
        assert len(picked) > 1
        assert all(dist[row, t] > 0 for t in picked)
    with pytest.raises(ValueError, match="3 sampling configs for 4 rows"):
        sample(logits, configs[:3])


# -- penalties -------------------------------------------------------------------------


def history(batch, vocab, seed):
    """Token buffer [B, S] with ragged prompt and generated lengths; junk past the end."""
    gen = torch.Generator().manual_seed(seed)
    token_ids = torch.randint(vocab, (batch, 24), generator=gen)
    context_lengths = torch.randint(1, 10, (batch,), generator=gen)
    sequence_lengths = context_lengths + torch.randint(0, 12, (batch,), generator=gen)
    return token_ids, context_lengths.int(), sequence_lengths.int()


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_equals_transformers(penalty):
    vocab = 40  # small, so that tokens repeat
    logits = random_logits(5, vocab, seed=8)
    token_ids, ctx, seq = history(5, vocab, seed=9)
    ours = process_logits(logits, SamplingConfig(end_id=0, repetition_penalty=penalty),
                          token_ids=token_ids, sequence_lengths=seq)
    processor = RepetitionPenaltyLogitsProcessor(penalty)
    for b in range(5):
        expected = processor(token_ids[b:b + 1, :seq[b]], logits[b:b + 1].clone())[0]
        torch.testing.assert_close(ours[b], expected)
    assert not torch.equal(ours, logits)


def test_min_length_equals_transformers():
    logits = random_logits(5, 30, seed=10)
    token_ids, ctx, seq = history(5, 30, seed=11)
    end_id, min_length = 3, 6
    ours = process_logits(logits, SamplingConfig(end_id=end_id, min_length=min_length),
                          context_lengths=ctx, sequence_lengths=seq)
    generated = (seq - ctx).tolist()
    assert min(generated) < min_length <= max(generated)  # both cases occur
    for b in range(5):
        processor = MinNewTokensLengthLogitsProcessor(int(ctx[b]), min_length, end_id)
        expected = processor(token_ids[b:b + 1, :seq[b]], logits[b:b + 1].clone())[0]
        torch.testing.assert_close(ours[b], expected)


def test_min_length_blocks_end_token_when_sampling():
    logits = torch.zeros(1, 4)
    logits[0, 2] = 10.0
    config = SamplingConfig(end_id=2, min_length=1, top_k=1)
    ctx, seq = torch.tensor([3]), torch.tensor([3])
    assert sample(logits, config, context_lengths=ctx, sequence_lengths=seq).item() != 2
    assert sample(logits, config, context_lengths=ctx, sequence_lengths=seq + 1).item() == 2


def test_presence_and_frequency_penalties():
    vocab = 25
    logits = random_logits(4, vocab, seed=12)
    token_ids, ctx, seq = history(4, vocab, seed=13)
    config = SamplingConfig(end_id=0, presence_penalty=0.4, frequency_penalty=0.25,
                            repetition_penalty=1.2)
    ours = process_logits(logits, config, token_ids=token_ids, sequence_lengths=seq)
    # Reference: transformers' repetition penalty, then the OpenAI formula, token by token.
    for b in range(4):
        expected = RepetitionPenaltyLogitsProcessor(1.2)(token_ids[b:b + 1, :seq[b]],
                                                         logits[b:b + 1].clone())[0]
        for token in set(token_ids[b, :seq[b]].tolist()):
            count = token_ids[b, :seq[b]].tolist().count(token)
            expected[token] -= 0.4 + 0.25 * count
        torch.testing.assert_close(ours[b], expected)


def test_per_row_penalties():
    vocab = 30
    logits = random_logits(3, vocab, seed=14)
    token_ids, ctx, seq = history(3, vocab, seed=15)
    configs = [SamplingConfig(end_id=0, repetition_penalty=1.5), SamplingConfig(end_id=0),
               SamplingConfig(end_id=1, frequency_penalty=-0.3, min_length=50)]
    ours = process_logits(logits, configs, token_ids=token_ids, context_lengths=ctx,
                          sequence_lengths=seq)
    for b, config in enumerate(configs):
        alone = process_logits(logits[b:b + 1], config, token_ids=token_ids[b:b + 1],
                               context_lengths=ctx[b:b + 1], sequence_lengths=seq[b:b + 1])
        torch.testing.assert_close(ours[b], alone[0])
    assert torch.equal(ours[1], logits[1]) and ours[2, 1] == -math.inf


def test_penalties_need_history():
    logits = random_logits(2, 10, seed=16)
    with pytest.raises(ValueError, match="token_ids"):
        sample(logits, SamplingConfig(end_id=0, repetition_penalty=1.1))
    with pytest.raises(ValueError, match="context_lengths"):
        sample(logits, SamplingConfig(end_id=0, min_length=2))
