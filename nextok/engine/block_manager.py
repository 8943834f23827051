"""Paged KV-cache bookkeeping: which physical block holds which tokens of which sequence.

Pure Python, no tensors. The KV pool itself lives in the worker; here a block is an id.

- Block 0 is the *null block*: never allocated, it stands in the block table for blocks that a
  sliding window has freed, and pads block tables in the worker.
- Blocks are reference counted: sequences sharing a cached prefix (n > 1, or two requests with
  the same system prompt) point at the same physical block.
- Automatic prefix caching: a full block whose KV is computed is registered under a chained hash
  hash(parent, its token ids). A later sequence whose prompt starts with the same tokens reuses
  the block instead of recomputing it. The chain links are *prefix ids*, not hashes: each distinct
  prefix registered gets a fresh id from a counter (never reused), and a block records the exact
  key (parent prefix id, token ids) it holds. On a hash hit that key is compared, so by induction
  a hit means the whole prefix is equal: a hash collision, even a crafted one (Python's `hash`
  is not collision resistant), can never serve wrong KV; it only costs a cache miss.
  `Sequence.block_hashes` holds these prefix ids.
- A block whose ref count drops to 0 goes to the back of the free queue but keeps its hash: it
  can still be hit until it is reused. Allocation takes from the front, so eviction is LRU.
"""
from __future__ import annotations

import itertools
from collections import OrderedDict

from nextok.engine.sequence import Sequence

NULL_BLOCK = 0


class Block:
    __slots__ = ("block_id", "ref_count", "block_hash", "prefix_id", "parent_id", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None  # its key in BlockManager.cached, while registered
        self.prefix_id: int | None = None  # the prefix ending with this block
        # The exact key, compared on a hash hit: (parent_id, token_ids).
        self.parent_id: int | None = None  # None for a sequence's first block
        self.token_ids: tuple[int, ...] | None = None

    def clear_hash(self) -> None:
        self.block_hash = self.prefix_id = self.parent_id = self.token_ids = None


def hash_block(parent_id: int | None, token_ids: tuple[int, ...]) -> int:
    # Python's hash of a tuple of ints does not depend on PYTHONHASHSEED, so it is stable.
    return hash((parent_id, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 2:
            raise ValueError(f"the KV pool needs at least 2 blocks, got {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Blocks with ref_count 0, front = least recently freed = evicted first.
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self._prefix_ids = itertools.count(1)
        # Counters for metrics (queries and hits counted in tokens, as vLLM does).
        self.prefix_queries = 0
        self.prefix_hits = 0

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by live sequences (cached-but-free blocks count as free)."""
        return 1.0 - self.num_free_blocks / (self.num_blocks - 1)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, total - len(seq.block_table))

    # ---- prefix cache --------------------------------------------------------------------
    def find_cached_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Longest run of leading full blocks of `seq` already in the cache.

        Returns (block ids, their prefix ids). At least one token is always left to compute, since
        the step that computes it also yields the logits for the next token.
        """
        if not self.enable_prefix_caching:
            return [], []
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        ids: list[int] = []
        prefix_ids: list[int] = []
        parent = None
        for i in range(max_blocks):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            block = self._lookup(parent, tokens)
            if block is None:
                break
            ids.append(block.block_id)
            prefix_ids.append(block.prefix_id)
            parent = block.prefix_id
        return ids, prefix_ids

    def _lookup(self, parent: int | None, tokens: tuple[int, ...]) -> Block | None:
        """The registered block holding exactly (parent, tokens); None on a miss or a collision."""
        block_id = self.cached.get(hash_block(parent, tokens))
        if block_id is None:
            return None
        block = self.blocks[block_id]
        if block.parent_id != parent or block.token_ids != tokens:  # a hash collision
            return None
        return block

    def cache_full_blocks(self, seq: Sequence, num_computed: int | None = None) -> None:
        """Register the blocks of `seq` that are full of computed KV since the last call.

        The scheduler calls this as soon as it schedules a step, with `num_computed` = the tokens
        computed by the end of that step: a sequence admitted later in the same step (the other
        samples of an n > 1 request, or a twin prompt) can then share those blocks at once. That is
        safe because each layer writes the whole batch's KV before any attention reads it.
        """
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        if num_computed is None:
            num_computed = seq.num_computed_tokens
        # A block holding a PENDING token (async scheduling) waits until the token is known.
        num_computed = min(num_computed, seq.num_resolved_tokens)
        num_full = min(num_computed // bs, len(seq.block_table))
        parent = seq.block_hashes[-1] if seq.block_hashes else None
        for i in range(len(seq.block_hashes), num_full):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            owner = self._lookup(parent, tokens)
            if owner is not None:  # the same prefix computed twice (same step): keep the first
                prefix_id = owner.prefix_id
            else:
                prefix_id = next(self._prefix_ids)
                h = hash_block(parent, tokens)
                block = self.blocks[seq.block_table[i]]
                # A colliding hash keeps its first owner: this prefix just stays uncached.
                if h not in self.cached and block.block_id != NULL_BLOCK:
                    block.block_hash, block.prefix_id = h, prefix_id
                    block.parent_id, block.token_ids = parent, tokens
                    self.cached[h] = block.block_id
            seq.block_hashes.append(prefix_id)
            parent = prefix_id

    # ---- allocation ----------------------------------------------------------------------
    def can_admit(self, cached_ids: list[int], num_tokens_after: int) -> bool:
        """Can a waiting sequence start with `cached_ids` as its prefix and hold `num_tokens_after`?"""
        # Touching a cached block that sits in the free queue takes it out of the free pool.
        reclaimed = sum(1 for b in cached_ids if self.blocks[b].ref_count == 0)
        needed = -(-num_tokens_after // self.block_size) - len(cached_ids)
        return needed + reclaimed <= self.num_free_blocks

    def admit_cached(self, seq: Sequence, cached_ids: list[int], cached_hashes: list[int]) -> None:
        """Give a newly scheduled `seq` the prefix blocks and ids from `find_cached_prefix`."""
        assert not seq.block_table, "admit_cached on a sequence that already holds blocks"
        for block_id in cached_ids:
            self._ref(block_id)
        seq.block_table = list(cached_ids)
        seq.block_hashes = list(cached_hashes)
        seq.num_computed_tokens = len(cached_ids) * self.block_size
        seq.num_cached_tokens = seq.num_computed_tokens
        if self.enable_prefix_caching:
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += seq.num_cached_tokens

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for `num_new_tokens` more tokens of `seq`; False (and no change) if it can't."""
        needed = self.blocks_needed(seq, num_new_tokens)
        if needed > self.num_free_blocks:
            return False
        for _ in range(needed):
            block_id, _ = self.free_queue.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:  # evict its cached contents
                if self.cached.get(block.block_hash) == block_id:
                    del self.cached[block.block_hash]
                block.clear_hash()
            block.ref_count = 1
            seq.block_table.append(block_id)
        return True

    def free(self, seq: Sequence) -> None:
        """Release every block of `seq` (finished, aborted or preempted)."""
        # Reverse order: the tail of a sequence is the least likely to be shared, so it is
        # put at the front of the LRU queue and evicted first.
        for block_id in reversed(seq.block_table):
            if block_id != NULL_BLOCK:
                self._unref(block_id)
        seq.block_table = []
        seq.block_hashes = []

    def free_outside_window(self, seq: Sequence, window: int) -> None:
        """Sliding window: free blocks no future token can attend to (replaced by the null block).

        The next token computed sits at position p = num_computed_tokens and attends to
        positions [p - window + 1, p]; a block is dead once its last position is below that.
        """
        first_live_pos = seq.num_computed_tokens - window + 1
        num_dead = max(0, first_live_pos) // self.block_size
        for i in range(min(num_dead, len(seq.block_table))):
            if seq.block_table[i] != NULL_BLOCK:
                self._unref(seq.block_table[i])
                seq.block_table[i] = NULL_BLOCK

    def _ref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_queue[block_id]
        block.ref_count += 1

    def _unref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"double free of block {block_id}"
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_queue[block_id] = None

    def reset_prefix_cache(self) -> None:
        for block_id in self.free_queue:
            self.blocks[block_id].clear_hash()
        self.cached = {h: b for h, b in self.cached.items() if self.blocks[b].ref_count > 0}

    # ---- integrity -----------------------------------------------------------------------
    def check_integrity(self, live: list[Sequence] = ()) -> None:
        """Assert the pool is consistent with the live sequences (used by tests after every step)."""
        expected = [0] * self.num_blocks
        for seq in live:
            for block_id in seq.block_table:
                expected[block_id] += 1  # expected[NULL_BLOCK] counts null entries: ignored
        free, cached = self.free_queue, self.cached
        assert NULL_BLOCK not in free and self.blocks[NULL_BLOCK].ref_count == 0
        assert self.blocks[NULL_BLOCK].block_hash is None, "the null block is cached"
        num_hashed = 0
        for block in self.blocks[1:]:
            b, rc = block.block_id, block.ref_count
            assert rc == expected[b], f"block {b}: ref_count {rc} != {expected[b]} users"
            assert (rc == 0) == (b in free), f"block {b}: in the free queue iff ref_count is 0"
            if block.block_hash is not None:  # a hashed block is the cache entry for its hash
                num_hashed += 1
                assert cached.get(block.block_hash) == b, f"block {b}: hash not mapped to it"
                assert block.prefix_id is not None and block.token_ids is not None
                assert len(block.token_ids) == self.block_size
        # Every hashed block owns its entry, so an extra entry points at a block that lost its hash.
        assert len(cached) == num_hashed, "stale prefix-cache entries"
