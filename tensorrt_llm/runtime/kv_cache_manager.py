"""Paged KV cache: pool sizing and allocation, and block bookkeeping per sequence.

The pool is one tensor `[num_layers, num_blocks, 2, num_kv_heads, tokens_per_block,
head_dim]` (see docs/architecture.md). A sequence owns a list of block ids; token `p` of
the sequence lives in block `blocks[p // tokens_per_block]`, slot `p % tokens_per_block`.

Blocks carry reference counts so that sequences can share them (beam search forks a
prompt's blocks; block reuse shares a cached prefix between requests). Sequences only
append, so a shared block that is full is never written again; only a shared, partially
filled last block must be copied before a sequence writes into it (copy-on-write).

Block reuse (`enable_block_reuse`): a full block whose tokens have been computed is known
by a hash chain over its tokens and every token before it (`commit`). A new sequence whose
prompt starts with the same full blocks takes them read-only (`add_sequence(..., token_ids)`)
and only the rest of its prompt is computed. A cached block that no sequence holds stays
in the pool, evictable: blocks are handed out from the never-cached free list first, then
by evicting the least recently used cached block.
"""

import hashlib
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import TrtLlmError
from ..kv_cache_layout import as_torch_dtype, blocks_for_memory, blocks_for_tokens, blocks_for_tokens_of

_KNOBS = "kv_cache_free_gpu_mem_fraction / max_tokens_in_paged_kv_cache"


class KVCacheFullError(TrtLlmError, RuntimeError):
    """Not enough free blocks in the paged KV cache for a request."""

    def __init__(self, seq_id, needed_blocks: int, free_blocks: int, total_blocks: int):
        self.seq_id = seq_id
        self.needed_blocks = needed_blocks
        self.free_blocks = free_blocks
        self.total_blocks = total_blocks
        super().__init__(
            f"paged KV cache is full: sequence {seq_id!r} needs {needed_blocks} more blocks "
            f"but only {free_blocks} of {total_blocks} are free; raise {_KNOBS} "
            f"or run fewer / shorter sequences at once")


@dataclass
class KVCacheConfig:
    """How large a pool to allocate.

    free_gpu_memory_fraction: share of the free device memory the pool may take
        (ModelRunner's `kv_cache_free_gpu_mem_fraction`); used on CUDA only.
    max_tokens: explicit pool size in tokens (ModelRunner's `max_tokens_in_paged_kv_cache`).
    """
    free_gpu_memory_fraction: float = 0.9
    max_tokens: int | None = None

    def num_blocks(self, device, *, num_layers: int, num_kv_heads: int, head_dim: int,
                   tokens_per_block: int, dtype, max_batch_size: int, max_seq_len: int) -> int:
        """Number of pool blocks for an engine running on `device`.

        Never more than the engine can use at once (max_batch_size sequences of max_seq_len
        tokens), nor more than `max_tokens` when given. On CUDA also never more than
        `free_gpu_memory_fraction` of the memory `torch.cuda.mem_get_info` reports free. On
        other devices free memory is not known, so without `max_tokens` the pool is exactly
        that engine limit.
        """
        device = torch.device(device)
        blocks = blocks_for_tokens_of(max_batch_size, max_seq_len, tokens_per_block)
        if self.max_tokens is not None:
            blocks = min(blocks, blocks_for_tokens(self.max_tokens, tokens_per_block))
        if device.type == "cuda":
            free_bytes, _ = torch.cuda.mem_get_info(device)
            blocks = min(blocks, blocks_for_memory(free_bytes, self.free_gpu_memory_fraction,
                                                   num_layers, num_kv_heads, head_dim,
                                                   tokens_per_block, dtype))
        if blocks < 1:
            raise ValueError(f"no memory for a single KV cache block on {device}; raise {_KNOBS}")
        return blocks


def allocate_pool(num_blocks: int, num_layers: int, num_kv_heads: int, tokens_per_block: int,
                  head_dim: int, dtype, device) -> torch.Tensor:
    """The `kv_cache_pool` engine input. Uninitialised: attention writes every slot it reads."""
    return torch.empty(num_layers, num_blocks, 2, num_kv_heads, tokens_per_block, head_dim,
                       dtype=as_torch_dtype(dtype), device=device)


def copy_blocks(pool: torch.Tensor, pairs: Sequence[tuple[int, int]]) -> None:
    """Copy whole blocks (all layers, K and V) `src -> dst`, as copy-on-write asks."""
    if not pairs:
        return
    src, dst = zip(*pairs)
    src = torch.tensor(src, device=pool.device)
    dst = torch.tensor(dst, device=pool.device)
    pool[:, dst] = pool[:, src]


class KVCacheManager:
    """Hands out pool blocks to sequences identified by any hashable id.

    Every method that allocates checks first and raises `KVCacheFullError` before changing
    anything, so a failed request leaves all sequences as they were.
    """

    def __init__(self, num_blocks: int, tokens_per_block: int, max_blocks_per_seq: int,
                 enable_block_reuse: bool = False):
        if num_blocks < 1 or tokens_per_block < 1 or max_blocks_per_seq < 1:
            raise ValueError("num_blocks, tokens_per_block and max_blocks_per_seq must be >= 1")
        self.num_blocks = num_blocks
        self.tokens_per_block = tokens_per_block
        self.max_blocks_per_seq = max_blocks_per_seq
        self.enable_block_reuse = enable_block_reuse
        # LIFO stack: pop/append are O(1), and reuse of recently freed blocks keeps the
        # working set small. Reversed so that a fresh manager hands out 0, 1, 2, ...
        self._free = list(range(num_blocks - 1, -1, -1))
        self._refcount = [0] * num_blocks
        self._blocks: dict[Hashable, list[int]] = {}
        self._num_tokens: dict[Hashable, int] = {}
        # Block reuse: hash <-> block of every cached block, the cached blocks no sequence
        # holds (least recently freed first), and each sequence's chain of committed hashes.
        self._block_of_hash: dict[bytes, int] = {}
        self._hash_of_block: dict[int, bytes] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._hashes: dict[Hashable, list[bytes]] = {}
        self.reused_blocks = 0  # blocks taken from the cache instead of computed

    # -- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new sequence can take: never used, or cached and held by no sequence."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._hash_of_block)

    def __contains__(self, seq_id) -> bool:
        return seq_id in self._blocks

    def num_tokens(self, seq_id) -> int:
        return self._num_tokens[self._check(seq_id)]

    def blocks(self, seq_id) -> tuple[int, ...]:
        return tuple(self._blocks[self._check(seq_id)])

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    def blocks_needed(self, num_tokens: int, seq_id=None) -> int:
        """Free blocks needed to grow `seq_id` (a new sequence when None) to `num_tokens`,
        including the copy of a shared last block that the growth would write into."""
        tpb = self.tokens_per_block
        total = -(-num_tokens // tpb)
        if seq_id is None:
            return total
        blocks, have = self._blocks[self._check(seq_id)], self._num_tokens[seq_id]
        copy = int(self._needs_copy(seq_id) and num_tokens > have)
        return max(total - len(blocks), 0) + copy

    def can_allocate(self, num_tokens: int, seq_id=None) -> bool:
        """Whether `blocks_needed(num_tokens, seq_id)` blocks are free."""
        return self.blocks_needed(num_tokens, seq_id) <= self.num_free_blocks

    # -- changes -------------------------------------------------------------------------

    def cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], list[bytes]]:
        """(blocks, hashes) of the cached full blocks a sequence of `token_ids` would start
        with. At most the blocks before the last token: a sequence computes at least one
        token (the logits of its last one), and into a block of its own."""
        if not self.enable_block_reuse:
            return [], []
        blocks, hashes, parent = [], [], b""
        tpb = self.tokens_per_block
        for k in range((len(token_ids) - 1) // tpb):
            parent = _chain_hash(parent, token_ids[k * tpb:(k + 1) * tpb])
            block = self._block_of_hash.get(parent)
            if block is None:
                break
            blocks.append(block)
            hashes.append(parent)
        return blocks, hashes

    def add_sequence(self, seq_id, num_tokens: int, token_ids: Sequence[int] | None = None) -> int:
        """Start a sequence with room for `num_tokens` tokens (its prompt, or the part of it
        computed first). With block reuse and `token_ids` (the whole prompt), the cached
        full blocks it starts with are shared. Returns how many tokens those hold (already
        computed: start computing there)."""
        if seq_id in self._blocks:
            raise ValueError(f"sequence {seq_id!r} already exists")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        shared, hashes = self.cached_prefix(token_ids) if token_ids is not None else ([], [])
        reused = len(shared) * self.tokens_per_block
        total = max(self.blocks_needed(num_tokens), len(shared))
        # Taking an evictable cached block uses up a free block too.
        needed = total - len(shared) + sum(b in self._evictable for b in shared)
        self._check_capacity(seq_id, needed, total)
        for block in shared:
            self._evictable.pop(block, None)
            self._refcount[block] += 1
        self.reused_blocks += len(shared)
        self._blocks[seq_id] = shared + [self._pop() for _ in range(total - len(shared))]
        self._num_tokens[seq_id] = max(num_tokens, reused)
        self._hashes[seq_id] = hashes
        return reused

    def commit(self, seq_id, token_ids: Sequence[int], num_computed: int) -> None:
        """The first `num_computed` of the sequence's `token_ids` are in the cache: its full
        blocks among them become reusable (no-op without block reuse)."""
        if not self.enable_block_reuse:
            return
        hashes, blocks, tpb = self._hashes[self._check(seq_id)], self._blocks[seq_id], self.tokens_per_block
        for k in range(len(hashes), min(num_computed, len(token_ids)) // tpb):
            h = _chain_hash(hashes[-1] if hashes else b"", token_ids[k * tpb:(k + 1) * tpb])
            hashes.append(h)
            block = blocks[k]
            # The first block computed with these contents is the cached one; a duplicate
            # (computed before the first was committed) stays private.
            if h not in self._block_of_hash and block not in self._hash_of_block:
                self._block_of_hash[h] = block
                self._hash_of_block[block] = h

    def extend(self, seq_id, new_total_tokens: int) -> list[tuple[int, int]]:
        """Grow a sequence to `new_total_tokens`, allocating blocks only where it crosses a
        block boundary. Returns the `(src, dst)` block copies the caller must perform (see
        `copy_blocks`) before attention writes the new tokens: non-empty only when the
        partially filled last block was shared."""
        have = self.num_tokens(seq_id)
        blocks = self._blocks[seq_id]
        if have <= new_total_tokens <= len(blocks) * self.tokens_per_block and not self._needs_copy(seq_id):
            # The common case, a decode step inside its private last block: nothing to allocate
            # or copy (the executor calls this for every running request every step).
            self._num_tokens[seq_id] = new_total_tokens
            return []
        if new_total_tokens < have:
            raise ValueError(f"sequence {seq_id!r} has {have} tokens; cannot shrink "
                             f"to {new_total_tokens}")
        new_blocks = -(-new_total_tokens // self.tokens_per_block)
        self._check_capacity(seq_id, self.blocks_needed(new_total_tokens, seq_id), new_blocks)
        copies = self.copy_on_write(seq_id) if new_total_tokens > have else []
        blocks.extend(self._pop() for _ in range(new_blocks - len(blocks)))
        self._num_tokens[seq_id] = new_total_tokens
        return copies

    def copy_on_write(self, seq_id) -> list[tuple[int, int]]:
        """Give the sequence a private copy of its last block if that block is shared and
        not full (the next token would be written into it). Returns `[(src, dst)]` or []."""
        if not self._needs_copy(seq_id):
            return []
        self._check_capacity(seq_id, 1, len(self._blocks[seq_id]))
        blocks = self._blocks[seq_id]
        src, dst = blocks[-1], self._pop()
        self._refcount[src] -= 1
        blocks[-1] = dst
        return [(src, dst)]

    def fork_sequence(self, parent_id, child_id) -> None:
        """Make `child_id` a sequence sharing all of the parent's blocks and tokens."""
        if child_id in self._blocks:
            raise ValueError(f"sequence {child_id!r} already exists")
        blocks = self._blocks[self._check(parent_id)]
        for block in blocks:
            self._refcount[block] += 1
        self._blocks[child_id] = list(blocks)
        self._num_tokens[child_id] = self._num_tokens[parent_id]
        self._hashes[child_id] = list(self._hashes[parent_id])

    def free_sequence(self, seq_id) -> None:
        """Drop a sequence; blocks no other sequence shares return to the free pool (cached
        ones stay reusable until evicted)."""
        for block in reversed(self._blocks.pop(self._check(seq_id))):
            self._refcount[block] -= 1
            if self._refcount[block] == 0:
                if block in self._hash_of_block:
                    self._evictable[block] = None  # most recently used last
                else:
                    self._free.append(block)
        del self._num_tokens[seq_id]
        del self._hashes[seq_id]

    # -- block tables --------------------------------------------------------------------

    def get_block_table(self, seq_ids: Iterable) -> torch.Tensor:
        """int32 `[B, max_blocks_per_seq]` (CPU) of the sequences' block ids in order.

        Unused entries are 0. That is safe although block 0 may belong to another sequence:
        attention reads and writes only positions below each sequence's length, and those
        all lie in the sequence's own blocks.
        """
        width = self.max_blocks_per_seq
        rows = [blocks + [0] * (width - len(blocks))
                for blocks in (self._blocks[self._check(s)] for s in seq_ids)]
        return torch.tensor(rows, dtype=torch.int32).reshape(len(rows), width)

    def fill_block_table(self, out: torch.Tensor, seq_ids: Sequence) -> torch.Tensor:
        """Write the block table into rows `[:B]` of a preallocated tensor (any device) in
        place, so that its address stays fixed (CUDA graphs). One host-to-device copy of the
        whole table; rows past B are left as they are. Returns `out[:B]`."""
        if out.dim() != 2 or out.shape[1] != self.max_blocks_per_seq or out.shape[0] < len(seq_ids):
            raise ValueError(f"out must be [>= {len(seq_ids)}, {self.max_blocks_per_seq}], "
                             f"got {list(out.shape)}")
        rows = out[:len(seq_ids)]
        rows.copy_(self.get_block_table(seq_ids), non_blocking=True)
        return rows

    # -- internals -----------------------------------------------------------------------

    def _check(self, seq_id):
        if seq_id not in self._blocks:
            raise KeyError(f"unknown sequence {seq_id!r}")
        return seq_id

    def _needs_copy(self, seq_id) -> bool:
        blocks = self._blocks[seq_id]
        partial = self._num_tokens[seq_id] % self.tokens_per_block != 0
        return partial and self._refcount[blocks[-1]] > 1

    def _check_capacity(self, seq_id, needed: int, total_blocks: int) -> None:
        if total_blocks > self.max_blocks_per_seq:
            raise ValueError(
                f"sequence {seq_id!r} would need {total_blocks} blocks of "
                f"{self.tokens_per_block} tokens; the engine allows {self.max_blocks_per_seq} "
                f"(max_seq_len)")
        if needed > self.num_free_blocks:
            raise KVCacheFullError(seq_id, needed, self.num_free_blocks, self.num_blocks)

    def _pop(self) -> int:
        if self._free:
            block = self._free.pop()
        else:  # evict the least recently used cached block
            block, _ = self._evictable.popitem(last=False)
            del self._block_of_hash[self._hash_of_block.pop(block)]
        self._refcount[block] = 1
        return block


def _chain_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The hash of a full block: its tokens and its parent block's hash (so, every token
    before it). A cryptographic digest: a request must not be able to craft a collision
    that would hand it another prompt's cache."""
    data = np.asarray(tokens, dtype=np.int64).tobytes()
    return hashlib.blake2b(parent + data, digest_size=16).digest()
