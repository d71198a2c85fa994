"""The executor's scheduler and the KV cache's block-reuse bookkeeping, without a model.

Steps are simulated as the executor runs them on the CPU (Executor._launch, then _resolve):
every scheduled row computes its tokens (num_computed grows) and commits its full blocks,
a row that reaches its request's last token samples one more (a fixed value here), and a
request that has its max_new_tokens leaves the scheduler.
"""
import pytest

from tensorrt_llm.runtime.kv_cache_manager import KVCacheFullError, KVCacheManager
from tensorrt_llm.runtime.request import Request, RequestState
from tensorrt_llm.runtime.scheduler import Scheduler

TPB = 4      # tokens per block
TOKEN = 7    # the token every sampling row "samples"


def make(num_blocks, *, batch=8, budget=64, chunked=False, reuse=False, reserve=0.0, tpb=TPB):
    kv = KVCacheManager(num_blocks, tpb, 16, enable_block_reuse=reuse)
    return Scheduler(kv, batch, budget, enable_chunked_context=chunked, reserve_fraction=reserve)


def request(n, max_new=8, first=100):
    """A request with an n-token prompt first, first + 1, ..."""
    return Request(list(range(first, first + n)), max_new_tokens=max_new)


def check_invariants(s: Scheduler):
    kv = s.kv
    owners = [0] * kv.num_blocks
    for r in s.running:
        assert r.state is RequestState.RUNNING
        assert r.request_id in kv
        # What the cache holds for a running request is what it has computed.
        assert kv.num_tokens(r.request_id) == r.num_computed
        assert len(kv.blocks(r.request_id)) == -(-r.num_computed // kv.tokens_per_block)
        for b in kv.blocks(r.request_id):
            owners[b] += 1
    for r in s.waiting:
        assert r.state is RequestState.WAITING and r.request_id not in kv and r.num_computed == 0
    assert [kv.refcount(b) for b in range(kv.num_blocks)] == owners
    assert kv.num_free_blocks == sum(1 for n in owners if n == 0)
    assert len(s.running) <= s.max_batch_size


def step(s: Scheduler):
    """One step as the executor runs it on the CPU. Returns the ScheduledStep, with
    `sampled`: which rows sampled a token."""
    st = s.schedule()
    st.sampled = [row.samples for row in st.rows]
    assert st.num_tokens <= s.max_num_tokens
    assert len(st.rows) <= s.max_batch_size
    for row in st.rows:
        r = row.request
        assert row.start == r.num_computed and row.num_tokens >= 1
        r.num_computed += row.num_tokens
        s.kv.commit(r.request_id, r.tokens, r.num_computed)
    for row, sampled in zip(st.rows, st.sampled):
        r = row.request
        if not sampled:
            continue
        r.tokens.append(TOKEN)
        if r.num_generated >= r.max_new_tokens:
            s.remove(r)
            r.state = RequestState.FINISHED
        else:
            s.kv.commit(r.request_id, r.tokens, r.num_computed)
    check_invariants(s)
    return st


def rows(st, names):
    """The step's rows as (name, start, num_tokens), names from {request: name}."""
    by_id = {r.request_id: n for r, n in names.items()}
    return [(by_id[row.request.request_id], row.start, row.num_tokens) for row in st.rows]


def run_to_end(s, limit=200):
    steps = []
    while s.has_work:
        steps.append(step(s))
        assert len(steps) < limit, "the scheduler does not make progress"
    return steps


# -- scheduling --------------------------------------------------------------------------------

def test_decodes_come_first_with_one_token_each():
    s = make(32)
    a, b, c = request(5), request(3), request(4)
    names = {a: "a", b: "b", c: "c"}
    s.add(a)
    s.add(b)
    st = step(s)
    assert rows(st, names) == [("a", 0, 5), ("b", 0, 3)]
    assert all(st.sampled)
    s.add(c)
    st = step(s)
    assert rows(st, names) == [("a", 5, 1), ("b", 3, 1), ("c", 0, 4)]
    assert all(st.sampled)
    st = step(s)
    assert rows(st, names) == [("a", 6, 1), ("b", 4, 1), ("c", 4, 1)]
    assert [len(r.output_token_ids) for r in (a, b, c)] == [3, 3, 2]


def test_token_budget_is_honoured_and_later_prompts_do_not_overtake():
    s = make(32, budget=8)
    a, b, c = request(5), request(5), request(2)
    names = {a: "a", b: "b", c: "c"}
    for r in (a, b, c):
        s.add(r)
    st = step(s)
    # b (5) does not fit the 3 tokens left; c (2) would, but comes after b.
    assert rows(st, names) == [("a", 0, 5)]
    assert list(s.waiting) == [b, c]
    st = step(s)
    assert rows(st, names) == [("a", 5, 1), ("b", 0, 5), ("c", 0, 2)]
    assert st.num_tokens == 8
    for st in run_to_end(s):
        assert st.num_tokens <= 8
    assert all(r.num_generated == 8 for r in (a, b, c))


def test_chunked_prompt_is_split_while_others_decode():
    s = make(32, budget=8, chunked=True)
    a, b = request(3, max_new=6), request(20, max_new=2)
    names = {a: "a", b: "b"}
    s.add(a)
    assert rows(step(s), names) == [("a", 0, 3)]
    s.add(b)
    chunks = []
    for _ in range(3):
        st = step(s)
        assert rows(st, names)[0][0] == "a" and st.rows[0].num_tokens == 1  # a decodes every step
        chunks.append(rows(st, names)[1])
        assert s.kv.num_tokens(b.request_id) == b.num_computed
    assert chunks == [("b", 0, 7), ("b", 7, 7), ("b", 14, 6)]
    # Only the last chunk reaches the prompt's end and samples.
    assert b.num_generated == 1 and b.output_token_ids == [TOKEN]
    run_to_end(s)
    assert a.num_generated == 6 and b.num_generated == 2


def test_chunked_prompt_takes_what_is_left_of_the_budget_at_admission():
    s = make(32, budget=8, chunked=True)
    a, b = request(6), request(9)
    names = {a: "a", b: "b"}
    s.add(a)
    s.add(b)
    st = step(s)
    assert rows(st, names) == [("a", 0, 6), ("b", 0, 2)]
    assert st.sampled == [True, False]
    assert rows(step(s), names) == [("a", 6, 1), ("b", 2, 7)]


def test_max_batch_size_caps_the_sequences_of_a_step():
    s = make(32, batch=2)
    a, b, c = request(4, max_new=2), request(4, max_new=4), request(4, max_new=2)
    names = {a: "a", b: "b", c: "c"}
    for r in (a, b, c):
        s.add(r)
    assert rows(step(s), names) == [("a", 0, 4), ("b", 0, 4)]
    assert list(s.waiting) == [c]
    assert rows(step(s), names) == [("a", 4, 1), ("b", 4, 1)]   # a has its 2 tokens and leaves
    assert a.finished
    assert rows(step(s), names) == [("b", 5, 1), ("c", 0, 4)]
    run_to_end(s)
    assert [r.num_generated for r in (a, b, c)] == [2, 4, 2]


@pytest.mark.parametrize("reserve", [0.0, 0.25])
def test_admission_keeps_the_reserve_while_others_run(reserve):
    # 8 blocks; a takes 1, b needs 7 for its prompt.
    s = make(8, reserve=reserve)
    assert s.reserve_blocks == int(8 * reserve)
    a, b = request(2, max_new=1), request(28, max_new=1)
    names = {a: "a", b: "b"}
    s.add(a)
    s.add(b)
    st = step(s)
    if not reserve:
        assert rows(st, names) == [("a", 0, 2), ("b", 0, 28)]
        return
    # The 7 free blocks would hold b, but a reserve of 2 keeps it out while a runs.
    assert rows(st, names) == [("a", 0, 2)]
    assert list(s.waiting) == [b]
    # a left the batch with its one token: alone, b is admitted although 7 + 2 > 8.
    assert a.finished
    assert rows(step(s), names) == [("b", 0, 28)]


def test_the_youngest_running_request_is_preempted_when_the_pool_runs_out():
    # 6 blocks of 4 tokens: a and b take 2 blocks each for their prompts (7 tokens).
    s = make(6)
    a, b = request(7, max_new=10), request(7, max_new=10, first=200)
    names = {a: "a", b: "b"}
    s.add(a)
    s.add(b)
    preempted_at = None
    for i in range(12):
        st = step(s)
        if st.preempted:
            preempted_at = i
            break
        assert rows(st, names) == ([("a", 0, 7), ("b", 0, 7)] if i == 0
                                   else [("a", 6 + i, 1), ("b", 6 + i, 1)])
    # Both hold 3 blocks (12 tokens) when a needs a 4th: b, the youngest, goes.
    assert preempted_at == 6
    assert st.preempted == [b]
    assert rows(st, names) == [("a", 12, 1)]   # the oldest keeps going
    assert b.request_id not in s.kv
    assert b.state is RequestState.WAITING and b.num_computed == 0 and b.num_preemptions == 1
    assert s.waiting[0] is b and s.running == [a]
    assert b.num_tokens == 13                  # its prompt and 6 tokens, to be recomputed
    assert s.kv.num_free_blocks == 2
    # A newcomer does not overtake the preempted request.
    c = request(2, max_new=1, first=300)
    names[c] = "c"
    s.add(c)
    assert list(s.waiting) == [b, c]
    # b (4 blocks) waits until a has finished (a keeps its 4 blocks to the end).
    while not a.finished:
        st = step(s)
        assert rows(st, names) == [("a", a.num_computed - 1, 1)]
    st = step(s)
    assert rows(st, names) == [("b", 0, 13), ("c", 0, 2)]
    run_to_end(s)
    assert a.num_generated == 10 and b.num_generated == 10 and c.num_generated == 1
    assert a.num_preemptions == 0 and b.num_preemptions == 1
    assert s.kv.num_free_blocks == 6


def test_a_request_that_needs_a_block_and_is_the_youngest_preempts_itself():
    s = make(4)
    a, b = request(5), request(8, first=200)
    names = {a: "a", b: "b"}
    s.add(a)
    s.add(b)
    assert rows(step(s), names) == [("a", 0, 5), ("b", 0, 8)]
    st = step(s)
    # b's 9th token needs a third block; a, the oldest, needs none and is not touched.
    assert st.preempted == [b] and rows(st, names) == [("a", 5, 1)]
    assert s.waiting[0] is b and b.num_computed == 0


def test_preemption_takes_the_youngest_not_the_one_that_needs_the_block():
    s = make(6)
    a, b, c = request(4, first=100), request(6, first=200), request(6, first=300)
    names = {a: "a", b: "b", c: "c"}
    for r in (a, b, c):
        s.add(r)
    assert rows(step(s), names) == [("a", 0, 4), ("b", 0, 6), ("c", 0, 6)]
    assert not step(s).preempted       # a takes the one free block for its 5th token
    assert not step(s).preempted
    st = step(s)
    # b's 9th token needs a third block: c, the youngest, gives its two.
    assert st.preempted == [c]
    assert rows(st, names) == [("a", 6, 1), ("b", 8, 1)]
    assert len(s.kv.blocks(b.request_id)) == 3 and s.kv.num_free_blocks == 1
    run_to_end(s)
    assert [r.num_generated for r in (a, b, c)] == [8, 8, 8]
    assert a.num_preemptions == 0 and c.num_preemptions >= 1


def test_a_preempted_request_longer_than_the_token_budget_comes_back_without_chunking():
    """Without chunked context a prompt must fit one step, but a preempted request is
    recomputed with what it generated: it may have grown past max_num_tokens."""
    s = make(3, budget=8, chunked=False, tpb=8)
    a, b = request(6, max_new=8), request(6, max_new=8, first=200)
    s.add(a)
    s.add(b)
    steps = run_to_end(s, limit=60)
    assert any(st.preempted for st in steps)
    assert a.num_generated == 8 and b.num_generated == 8


def test_remove_returns_the_blocks():
    s = make(8, budget=9)
    a, b = request(9), request(5)
    s.add(a)
    s.add(b)
    step(s)
    assert s.running == [a] and list(s.waiting) == [b]
    assert s.kv.num_free_blocks == 5
    s.remove(a)
    assert s.kv.num_free_blocks == 8 and a.request_id not in s.kv
    s.remove(b)
    assert not s.has_work
    s.remove(b)   # not there any more: nothing happens
    check_invariants(s)


# -- block reuse -------------------------------------------------------------------------------

def reuse_kv(num_blocks=8):
    return KVCacheManager(num_blocks, TPB, 16, enable_block_reuse=True)


def test_commit_and_cached_prefix_share_blocks():
    kv = reuse_kv(12)
    a = list(range(1, 14))               # 13 tokens: 3 full blocks and one token
    assert kv.add_sequence("a", 13, a) == 0
    assert kv.cached_prefix(a) == ([], [])
    kv.commit("a", a, 6)                  # only computed full blocks are cached
    assert kv.num_cached_blocks == 1
    kv.commit("a", a, 13)
    assert kv.num_cached_blocks == 3
    blocks_a = kv.blocks("a")
    b = a[:12] + [99, 98]
    shared, hashes = kv.cached_prefix(b)
    assert shared == list(blocks_a[:3]) and len(hashes) == 3
    free = kv.num_free_blocks
    assert kv.add_sequence("b", len(b), b) == 12
    assert kv.blocks("b")[:3] == blocks_a[:3] and kv.blocks("b")[3] not in blocks_a
    assert [kv.refcount(x) for x in blocks_a] == [2, 2, 2, 1]
    assert kv.refcount(kv.blocks("b")[3]) == 1
    assert kv.num_free_blocks == free - 1     # only b's own last block
    assert kv.reused_blocks == 3
    # A sequence without reuse tokens takes nothing.
    assert kv.add_sequence("c", 13) == 0 and not set(kv.blocks("c")) & set(blocks_a)


def test_at_most_the_blocks_before_the_last_prompt_token_are_reused():
    kv = reuse_kv()
    a = list(range(1, 13))               # exactly 3 full blocks
    kv.add_sequence("a", 12, a)
    kv.commit("a", a, 12)
    assert kv.num_cached_blocks == 3
    # The same prompt again: its last token must be computed (its logits), so 2 blocks.
    assert len(kv.cached_prefix(a)[0]) == 2
    assert kv.add_sequence("b", 12, a) == 8
    assert kv.blocks("b")[:2] == kv.blocks("a")[:2] and kv.blocks("b")[2] != kv.blocks("a")[2]
    assert len(kv.cached_prefix(a + [50])[0]) == 3
    assert len(kv.cached_prefix(a[:9])[0]) == 2
    assert len(kv.cached_prefix(a[:8])[0]) == 1
    assert kv.cached_prefix(a[:1]) == ([], [])


def test_freed_cached_blocks_are_evictable_and_counted_as_free():
    kv = reuse_kv(6)
    a = list(range(1, 11))               # 2 full blocks and 2 tokens
    kv.add_sequence("a", 10, a)
    kv.commit("a", a, 10)
    assert kv.num_free_blocks == 3
    kv.free_sequence("a")
    assert kv.num_free_blocks == 6 and kv.num_used_blocks == 0
    assert kv.num_cached_blocks == 2
    # Still reusable after the sequence is gone...
    assert kv.add_sequence("b", 11, a + [77]) == 8
    assert kv.num_free_blocks == 3
    kv.free_sequence("b")
    # ...and taken by a sequence that needs the whole pool, evicted then.
    kv.add_sequence("c", 24, list(range(500, 524)))
    assert kv.num_free_blocks == 0 and kv.num_cached_blocks == 0
    assert kv.cached_prefix(a + [77]) == ([], [])
    with pytest.raises(KVCacheFullError):
        kv.add_sequence("d", 1)


def test_eviction_takes_the_least_recently_used_cached_block():
    kv = reuse_kv(6)
    x, y = list(range(1, 10)), list(range(101, 110))   # 2 full blocks and one token each
    for name, tokens in (("x", x), ("y", y)):
        kv.add_sequence(name, 9, tokens)
        kv.commit(name, tokens, 9)
    kv.free_sequence("x")
    kv.free_sequence("y")
    assert kv.num_cached_blocks == 4 and kv.num_free_blocks == 6
    # x's prefix is used again (and freed): x's blocks are now the most recently used.
    kv.add_sequence("x2", 9, x)
    kv.free_sequence("x2")
    # Two never-cached blocks are free; a 4-block sequence evicts two cached ones: y's.
    kv.add_sequence("z", 16)
    assert len(kv.cached_prefix(x)[0]) == 2
    assert kv.cached_prefix(y) == ([], [])
    # Within a sequence the last block goes first: its prefix stays usable longest.
    kv.free_sequence("z")
    kv.add_sequence("w", 20)             # 5 blocks: 4 never-cached free... and one of x's
    assert len(kv.cached_prefix(x)[0]) == 1


def test_a_mismatch_in_an_early_block_stops_the_match():
    kv = reuse_kv(12)
    a = list(range(1, 14))
    kv.add_sequence("a", 13, a)
    kv.commit("a", a, 13)
    first_differs = [0] + a[1:]
    second_differs = a[:5] + [0] + a[6:]
    third_differs = a[:8] + [0] + a[9:]
    # Blocks 1 and 2 hold the same tokens as a's, but after a different block 0.
    assert kv.cached_prefix(first_differs) == ([], [])
    assert kv.cached_prefix(second_differs)[0] == list(kv.blocks("a")[:1])
    assert kv.cached_prefix(third_differs)[0] == list(kv.blocks("a")[:2])
    assert kv.add_sequence("b", 13, first_differs) == 0


def test_scheduler_starts_a_request_after_its_cached_prefix():
    s = make(16, reuse=True, budget=32)
    prefix = list(range(1, 13))          # 3 blocks
    a = Request(prefix + [50, 51], max_new_tokens=4)
    b = Request(prefix + [60, 61, 62], max_new_tokens=2)
    names = {a: "a", b: "b"}
    s.add(a)
    assert rows(step(s), names) == [("a", 0, 14)]
    s.add(b)
    st = step(s)
    assert rows(st, names) == [("a", 14, 1), ("b", 12, 3)]
    assert b.reused_tokens == 12 and b.num_computed == 15
    shared = s.kv.blocks(a.request_id)[:3]
    assert s.kv.blocks(b.request_id)[:3] == shared
    assert [s.kv.refcount(x) for x in shared] == [2, 2, 2]
    assert s.kv.reused_blocks == 3
    run_to_end(s)
    assert s.kv.num_free_blocks == 16


def test_a_chunked_prompt_with_a_cached_prefix_is_chunked_after_it():
    s = make(16, reuse=True, budget=8, chunked=True)
    prefix = list(range(1, 13))
    a = Request(prefix + [50], max_new_tokens=1)
    b = Request(prefix + list(range(60, 70)), max_new_tokens=1)
    names = {a: "a", b: "b"}
    s.add(a)
    run_to_end(s)
    s.add(b)
    assert rows(step(s), names) == [("b", 12, 8)]
    assert rows(step(s), names) == [("b", 20, 2)]
    assert b.reused_tokens == 12 and b.num_generated == 1


def test_a_preempted_request_reuses_its_own_committed_blocks():
    s = make(6, reuse=True)
    a, b = request(7, max_new=10), request(7, max_new=10, first=200)
    s.add(a)
    s.add(b)
    while not b.num_preemptions:
        step(s)
    assert b.request_id not in s.kv
    # Its prompt's full block (and the generated ones) stay cached until evicted.
    run_to_end(s)
    assert b.num_generated == 10 and b.reused_tokens > 0


def test_the_full_blocks_of_a_chunk_are_reusable_the_next_step():
    s = make(16, reuse=True, budget=8, chunked=True)
    prompt = list(range(1, 21))
    a = Request(prompt + [50], max_new_tokens=1)
    b = Request(prompt + [60], max_new_tokens=1)
    names = {a: "a", b: "b"}
    s.add(a)
    assert rows(step(s), names) == [("a", 0, 8)]     # two full blocks, committed
    s.add(b)
    assert rows(step(s), names) == [("a", 8, 8)]     # no budget left for b
    st = step(s)
    assert rows(st, names) == [("a", 16, 5), ("b", 16, 3)]
    assert b.reused_tokens == 16


def test_a_request_that_returns_its_prompt_logits_does_not_start_after_a_cached_prefix():
    s = make(16, reuse=True)
    prompt = list(range(1, 14))
    a = Request(prompt, max_new_tokens=1)
    b = Request(prompt, max_new_tokens=1, return_context_logits=True)
    c = Request(prompt, max_new_tokens=1)
    names = {a: "a", b: "b", c: "c"}
    s.add(a)
    run_to_end(s)
    s.add(b)
    s.add(c)
    # b computes (and returns the logits of) its whole prompt; c takes the cached blocks.
    assert rows(step(s), names) == [("b", 0, 13), ("c", 12, 1)]
    assert b.reused_tokens == 0 and c.reused_tokens == 12
