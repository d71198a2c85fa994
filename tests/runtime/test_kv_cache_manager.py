import pytest
import torch

from tensorrt_llm.kv_cache_layout import blocks_for_memory, blocks_for_tokens, bytes_per_block
from tensorrt_llm.runtime.kv_cache_manager import (
    KVCacheConfig,
    KVCacheFullError,
    KVCacheManager,
    allocate_pool,
    copy_blocks,
)


def state(mgr):
    """Everything observable about a manager, to compare before and after a failure."""
    seqs = sorted(mgr._blocks, key=repr)
    return (mgr.num_free_blocks, sorted(mgr._free),
            {s: (mgr.blocks(s), mgr.num_tokens(s)) for s in seqs},
            [mgr.refcount(b) for b in range(mgr.num_blocks)])


def check_invariants(mgr):
    owners = [0] * mgr.num_blocks
    for s in mgr._blocks:
        blocks = mgr.blocks(s)
        assert len(blocks) == -(-mgr.num_tokens(s) // mgr.tokens_per_block)
        for b in blocks:
            owners[b] += 1
    free = set(mgr._free)
    assert len(free) == mgr.num_free_blocks
    for b in range(mgr.num_blocks):
        assert mgr.refcount(b) == owners[b]
        assert (b in free) == (owners[b] == 0)


def test_sizing():
    # 2 layers * K,V * 4 heads * 16 tokens * 64 dims * 2 bytes
    assert bytes_per_block(2, 4, 64, 16, "float16") == 2 * 2 * 4 * 16 * 64 * 2
    assert bytes_per_block(2, 4, 64, 16, torch.float32) == 2 * 2 * 4 * 16 * 64 * 4
    per_block = bytes_per_block(2, 4, 64, 16, "bfloat16")
    assert blocks_for_memory(10 * per_block + 7, 1.0, 2, 4, 64, 16, "bfloat16") == 10
    assert blocks_for_memory(10 * per_block, 0.5, 2, 4, 64, 16, "bfloat16") == 5
    with pytest.raises(ValueError, match="kv_cache_free_gpu_mem_fraction"):
        blocks_for_memory(per_block, 0.0, 2, 4, 64, 16, "bfloat16")
    assert blocks_for_tokens(32, 16) == 2
    assert blocks_for_tokens(33, 16) == 3
    with pytest.raises(ValueError, match="max_tokens_in_paged_kv_cache"):
        blocks_for_tokens(0, 16)


def test_config_on_cpu():
    dims = dict(num_layers=2, num_kv_heads=4, head_dim=64, tokens_per_block=16, dtype="float16")
    # Default: what max_batch_size sequences of max_seq_len tokens can use.
    assert KVCacheConfig().num_blocks("cpu", max_batch_size=3, max_seq_len=40, **dims) == 9
    # An explicit token budget only lowers it.
    assert KVCacheConfig(max_tokens=50).num_blocks("cpu", max_batch_size=3, max_seq_len=40,
                                                   **dims) == 4
    assert KVCacheConfig(max_tokens=10**6).num_blocks("cpu", max_batch_size=3, max_seq_len=40,
                                                      **dims) == 9


def test_allocate_pool():
    pool = allocate_pool(5, 3, 2, 8, 16, "bfloat16", "cpu")
    assert pool.shape == (3, 5, 2, 2, 8, 16)
    assert pool.dtype == torch.bfloat16 and pool.device.type == "cpu"


def test_add_extend_free():
    mgr = KVCacheManager(num_blocks=8, tokens_per_block=4, max_blocks_per_seq=4)
    mgr.add_sequence("a", 5)  # 2 blocks
    mgr.add_sequence("b", 4)  # 1 block, exactly full
    assert mgr.blocks("a") == (0, 1) and mgr.blocks("b") == (2,)
    assert mgr.num_free_blocks == 5
    # Within the last block: no allocation.
    assert mgr.extend("a", 8) == []
    assert mgr.blocks("a") == (0, 1) and mgr.num_tokens("a") == 8
    # Crossing a boundary: exactly one new block.
    mgr.extend("a", 9)
    assert mgr.blocks("a") == (0, 1, 3)
    mgr.extend("b", 5)
    assert mgr.blocks("b") == (2, 4)
    check_invariants(mgr)

    table = mgr.get_block_table(["b", "a"])
    assert table.dtype == torch.int32
    assert table.tolist() == [[2, 4, 0, 0], [0, 1, 3, 0]]

    mgr.free_sequence("a")
    assert mgr.num_free_blocks == 6 and "a" not in mgr
    check_invariants(mgr)
    # Freed blocks are reused.
    mgr.add_sequence("c", 12)
    assert sorted(mgr.blocks("c")) == [0, 1, 3]
    check_invariants(mgr)
    with pytest.raises(KeyError):
        mgr.free_sequence("a")
    with pytest.raises(ValueError, match="already exists"):
        mgr.add_sequence("c", 1)
    with pytest.raises(ValueError, match="shrink"):
        mgr.extend("c", 3)


def test_sequence_longer_than_engine_allows():
    mgr = KVCacheManager(num_blocks=16, tokens_per_block=4, max_blocks_per_seq=2)
    with pytest.raises(ValueError, match="max_seq_len"):
        mgr.add_sequence(0, 9)
    mgr.add_sequence(0, 8)
    with pytest.raises(ValueError, match="max_seq_len"):
        mgr.extend(0, 9)
    assert mgr.num_tokens(0) == 8 and mgr.num_free_blocks == 14


def test_out_of_blocks_leaves_state_unchanged():
    mgr = KVCacheManager(num_blocks=6, tokens_per_block=4, max_blocks_per_seq=8)
    mgr.add_sequence(0, 10)  # 3 blocks
    mgr.add_sequence(1, 6)   # 2 blocks
    mgr.fork_sequence(1, 2)  # shares 1's blocks
    assert not mgr.can_allocate(9)
    assert mgr.can_allocate(4)
    before = state(mgr)

    with pytest.raises(KVCacheFullError) as err:
        mgr.add_sequence(3, 9)  # 3 blocks, 1 free
    assert isinstance(err.value, RuntimeError)
    assert err.value.needed_blocks == 3 and err.value.free_blocks == 1
    msg = str(err.value)
    assert "3 more blocks" in msg and "1 of 6" in msg
    assert "kv_cache_free_gpu_mem_fraction" in msg and "max_tokens_in_paged_kv_cache" in msg
    assert state(mgr) == before and 3 not in mgr

    with pytest.raises(KVCacheFullError):
        mgr.extend(0, 17)  # 2 more blocks, 1 free
    assert state(mgr) == before

    # Sequence 2 writing into its shared partial block needs a copy (1 block) plus one new
    # block to reach 9 tokens: 2 needed, 1 free. Nothing may be copied or allocated.
    assert mgr.blocks_needed(9, 2) == 2 and not mgr.can_allocate(9, 2)
    with pytest.raises(KVCacheFullError):
        mgr.extend(2, 9)
    assert state(mgr) == before

    # The last free block still serves a request that fits.
    assert mgr.can_allocate(13, 0)
    mgr.extend(0, 13)
    assert mgr.num_free_blocks == 0
    check_invariants(mgr)


def test_fork_and_copy_on_write():
    mgr = KVCacheManager(num_blocks=10, tokens_per_block=4, max_blocks_per_seq=4)
    mgr.add_sequence("p", 6)  # blocks 0 (full), 1 (2 of 4 tokens)
    mgr.fork_sequence("p", "c")
    assert mgr.blocks("c") == mgr.blocks("p") == (0, 1)
    assert mgr.num_tokens("c") == 6
    assert mgr.refcount(0) == mgr.refcount(1) == 2
    assert mgr.num_free_blocks == 8
    check_invariants(mgr)

    # The child writes token 7 into the shared partial block 1: it gets a private copy.
    assert mgr.blocks_needed(7, "c") == 1
    copies = mgr.extend("c", 7)
    assert copies == [(1, 2)]
    assert mgr.blocks("c") == (0, 2) and mgr.blocks("p") == (0, 1)
    assert mgr.refcount(1) == 1 and mgr.refcount(0) == 2
    check_invariants(mgr)
    # Block 1 is now the parent's alone: no further copy.
    assert mgr.extend("p", 7) == []
    assert mgr.blocks("p") == (0, 1)

    # Forking at a block boundary: the next token goes into a new block, no copy.
    mgr.extend("p", 8)
    mgr.fork_sequence("p", "d")
    assert mgr.extend("d", 9) == []
    assert mgr.blocks("d") == (0, 1, 3)
    check_invariants(mgr)

    # Shared blocks stay allocated until the last owner is freed.
    mgr.free_sequence("p")
    assert mgr.refcount(0) == 2 and mgr.refcount(1) == 1
    mgr.free_sequence("d")
    mgr.free_sequence("c")
    assert mgr.num_free_blocks == 10
    check_invariants(mgr)


def test_copy_on_write_explicit_and_copy_blocks():
    mgr = KVCacheManager(num_blocks=4, tokens_per_block=2, max_blocks_per_seq=4)
    mgr.add_sequence(0, 3)
    mgr.fork_sequence(0, 1)
    pool = torch.randn(3, 4, 2, 2, 2, 5)
    original = pool.clone()
    copies = mgr.copy_on_write(1)
    assert copies == [(1, 2)] and mgr.copy_on_write(1) == []
    copy_blocks(pool, copies)
    assert torch.equal(pool[:, 2], original[:, 1])
    assert torch.equal(pool[:, [0, 1, 3]], original[:, [0, 1, 3]])
    copy_blocks(pool, [])
    assert torch.equal(pool[:, 2], original[:, 1])


def test_fill_block_table_in_place():
    mgr = KVCacheManager(num_blocks=8, tokens_per_block=4, max_blocks_per_seq=3)
    mgr.add_sequence("x", 9)
    mgr.add_sequence("y", 2)
    out = torch.full((4, 3), -1, dtype=torch.int32)
    ptr = out.data_ptr()
    rows = mgr.fill_block_table(out, ["y", "x"])
    assert out.data_ptr() == ptr and rows.data_ptr() == ptr
    assert out.tolist() == [[3, 0, 0], [0, 1, 2], [-1, -1, -1], [-1, -1, -1]]
    mgr.extend("y", 5)
    mgr.fill_block_table(out, ["y", "x"])
    assert out[:2].tolist() == mgr.get_block_table(["y", "x"]).tolist()
    with pytest.raises(ValueError):
        mgr.fill_block_table(torch.zeros(1, 3, dtype=torch.int32), ["x", "y"])


def test_empty_block_table():
    mgr = KVCacheManager(num_blocks=2, tokens_per_block=4, max_blocks_per_seq=3)
    assert mgr.get_block_table([]).shape == (0, 3)


def test_random_workload_keeps_invariants():
    gen = torch.Generator().manual_seed(0)
    mgr = KVCacheManager(num_blocks=24, tokens_per_block=4, max_blocks_per_seq=6)
    live, next_id = [], 0
    for _ in range(400):
        op = int(torch.randint(4, (), generator=gen))
        before = state(mgr)
        try:
            if op == 0 or not live:
                mgr.add_sequence(next_id, int(torch.randint(1, 20, (), generator=gen)))
                live.append(next_id)
                next_id += 1
            elif op == 1:
                s = live[int(torch.randint(len(live), (), generator=gen))]
                mgr.extend(s, min(mgr.num_tokens(s) + int(torch.randint(1, 6, (), generator=gen)), 24))
            elif op == 2:
                s = live[int(torch.randint(len(live), (), generator=gen))]
                mgr.fork_sequence(s, next_id)
                live.append(next_id)
                next_id += 1
            else:
                mgr.free_sequence(live.pop(int(torch.randint(len(live), (), generator=gen))))
        except KVCacheFullError:
            assert state(mgr) == before
        check_invariants(mgr)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_sizing_pool_and_block_table():
    dims = dict(num_layers=2, num_kv_heads=4, head_dim=64, tokens_per_block=16, dtype="float16")
    per_block = bytes_per_block(**dims)
    free_bytes, _ = torch.cuda.mem_get_info()
    # Bounded by the engine's needs, and by the memory fraction when that is smaller.
    assert KVCacheConfig().num_blocks("cuda", max_batch_size=2, max_seq_len=64, **dims) == 8
    huge = KVCacheConfig(free_gpu_memory_fraction=0.01)
    blocks = huge.num_blocks("cuda", max_batch_size=10**6, max_seq_len=10**6, **dims)
    assert abs(blocks - int(free_bytes * 0.01) // per_block) <= 0.001 * blocks + 1
    pool = allocate_pool(blocks, 2, 4, 16, 64, "float16", "cuda")
    assert pool.is_cuda and pool.shape[1] == blocks

    mgr = KVCacheManager(num_blocks=blocks, tokens_per_block=16, max_blocks_per_seq=4)
    mgr.add_sequence(0, 20)
    mgr.fork_sequence(0, 1)
    pool[:, 1].fill_(3.0)
    copy_blocks(pool, mgr.extend(1, 21))
    assert mgr.blocks(1) == (0, 2) and bool((pool[:, 2] == 3.0).all())
    out = torch.zeros(3, 4, dtype=torch.int32, device="cuda")
    mgr.fill_block_table(out, [1, 0])
    assert out.cpu().tolist() == [[0, 2, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]]
