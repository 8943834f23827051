"""Block manager: paged KV bookkeeping, ref counts, prefix cache, LRU eviction, sliding window.

Pure Python, no model: a sequence is "computed" by allocating blocks for it and moving
`num_computed_tokens` forward, as the scheduler's `update` does.
"""
from __future__ import annotations

import random

import pytest

from nextok.engine import block_manager as bm_mod
from nextok.engine.block_manager import NULL_BLOCK, BlockManager
from nextok.engine.sequence import Sequence
from nextok.sampling_params import SamplingParams


def make_seq(tokens, name: str = "r") -> Sequence:
    return Sequence(name, list(tokens), SamplingParams(max_tokens=None))


def compute(bm: BlockManager, seq: Sequence, n: int | None = None) -> None:
    """Allocate and "compute" the next `n` tokens of `seq` (all the rest by default)."""
    n = seq.num_tokens - seq.num_computed_tokens if n is None else n
    assert bm.allocate(seq, n)
    seq.num_computed_tokens += n
    bm.cache_full_blocks(seq)


def admit(bm: BlockManager, seq: Sequence) -> list[int]:
    """Admit a new sequence the way the scheduler does: prefix hit, then the rest."""
    ids, hashes = bm.find_cached_prefix(seq)
    assert bm.can_admit(ids, seq.num_tokens)
    bm.admit_cached(seq, ids, hashes)
    compute(bm, seq)
    return ids


def free_ids(bm: BlockManager) -> list[int]:
    return list(bm.free_queue)


# ---- allocate / free ---------------------------------------------------------------------

def test_allocate_then_free_returns_every_block():
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = make_seq(range(10))
    assert bm.allocate(seq, 10)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert NULL_BLOCK not in seq.block_table
    for b in seq.block_table:
        assert bm.blocks[b].ref_count == 1 and b not in bm.free_queue
    assert bm.num_free_blocks == 9 - 3
    bm.check_integrity(live=[seq])

    bm.free(seq)
    assert seq.block_table == [] and seq.block_hashes == []
    assert all(b.ref_count == 0 for b in bm.blocks)
    assert sorted(bm.free_queue) == list(range(1, 10))
    bm.check_integrity(live=[])


def test_allocate_grows_only_at_block_boundaries():
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = make_seq(range(1))
    sizes = []
    for _ in range(12):
        compute(bm, seq, 1)
        seq.token_ids.append(7)
        sizes.append(len(seq.block_table))
        bm.check_integrity(live=[seq])
    assert sizes == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    assert bm.blocks_needed(seq, 0) == 0
    assert bm.blocks_needed(seq, 1) == 1  # 12 computed, the 13th token starts block 4


def test_allocate_failure_changes_nothing():
    bm = BlockManager(num_blocks=3, block_size=4)  # 2 usable blocks
    seq = make_seq(range(9))
    before = free_ids(bm)
    assert not bm.allocate(seq, 9)
    assert seq.block_table == [] and free_ids(bm) == before
    bm.check_integrity(live=[seq])
    assert bm.allocate(seq, 8)
    assert bm.num_free_blocks == 0
    assert not bm.allocate(make_seq([1]), 1)
    bm.check_integrity(live=[seq])


def test_pool_needs_two_blocks():
    with pytest.raises(ValueError):
        BlockManager(num_blocks=1, block_size=4)


def test_null_block_is_never_handed_out():
    rng = random.Random(0)
    bm = BlockManager(num_blocks=12, block_size=2)
    live: list[Sequence] = []
    for _ in range(500):
        if live and rng.random() < 0.4:
            seq = live.pop(rng.randrange(len(live)))
            bm.free(seq)
        else:
            seq = make_seq([rng.randrange(5) for _ in range(rng.randint(1, 7))])
            ids, hashes = bm.find_cached_prefix(seq)
            if bm.can_admit(ids, seq.num_tokens):
                bm.admit_cached(seq, ids, hashes)
                compute(bm, seq)
                live.append(seq)
        for s in live:
            assert NULL_BLOCK not in s.block_table
        assert NULL_BLOCK not in bm.free_queue
        bm.check_integrity(live=live)
    # Drain: the pool never offers block 0, even when every other block is taken.
    for s in live:
        bm.free(s)
    hog = make_seq(range(22))
    assert bm.allocate(hog, 22)
    assert sorted(hog.block_table) == list(range(1, 12))
    assert not bm.allocate(hog, 23)
    bm.check_integrity(live=[hog])


# ---- prefix cache: sharing and hits ------------------------------------------------------

def test_same_prefix_shares_blocks_with_ref_count_two():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "a")
    compute(bm, a)
    assert len(a.block_hashes) == 2  # two full blocks registered; the third is partial
    b = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 99, 98, 97], "b")
    hit = admit(bm, b)
    assert hit == a.block_table[:2]
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert [bm.blocks[x].ref_count for x in b.block_table] == [2, 2, 1]
    assert b.num_cached_tokens == 8 and b.block_hashes[:2] == a.block_hashes[:2]
    bm.check_integrity(live=[a, b])

    bm.free(a)
    assert [bm.blocks[x].ref_count for x in b.block_table] == [1, 1, 1]
    assert not any(x in bm.free_queue for x in b.block_table)
    bm.check_integrity(live=[b])
    bm.free(b)
    assert all(blk.ref_count == 0 for blk in bm.blocks)
    assert bm.num_free_blocks == 15
    bm.check_integrity(live=[])


def test_cache_hit_returns_the_right_blocks_and_leaves_one_token():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = make_seq(range(12), "a")
    compute(bm, a)
    assert len(a.block_hashes) == 3
    # Identical 12-token prompt: only 2 of the 3 cached blocks are used, so 4 tokens remain and
    # the step computing them yields the logits for the next token.
    same = make_seq(range(12))
    ids, hashes = bm.find_cached_prefix(same)
    assert ids == a.block_table[:2] and hashes == a.block_hashes[:2]
    # One more token: all three blocks hit, exactly one token left.
    longer = make_seq(list(range(12)) + [50])
    ids, _ = bm.find_cached_prefix(longer)
    assert ids == a.block_table[:3]
    bm.admit_cached(longer, ids, _)
    assert longer.num_computed_tokens == 12 == longer.num_tokens - 1
    # A divergence in block 1 stops the hit there.
    diverged = make_seq([0, 1, 2, 3, 4, 5, 99, 7, 8, 9, 10, 11, 12])
    assert bm.find_cached_prefix(diverged)[0] == a.block_table[:1]
    # Same tokens in block 1 but a different block 0: the chained hash misses.
    other_head = make_seq([9, 9, 9, 9, 4, 5, 6, 7, 8])
    assert bm.find_cached_prefix(other_head)[0] == []
    # One-token and one-block prompts can never hit.
    assert bm.find_cached_prefix(make_seq([0]))[0] == []
    assert bm.find_cached_prefix(make_seq([0, 1, 2, 3]))[0] == []


def test_only_full_computed_blocks_are_cached():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = make_seq(range(10))
    assert bm.allocate(a, 10)
    a.num_computed_tokens = 6  # a chunk of 6: block 0 full, block 1 half computed
    bm.cache_full_blocks(a)
    assert len(a.block_hashes) == 1 and len(bm.cached) == 1
    assert bm.blocks[a.block_table[1]].block_hash is None
    a.num_computed_tokens = 10
    bm.cache_full_blocks(a)
    assert len(a.block_hashes) == 2 and len(bm.cached) == 2
    assert bm.blocks[a.block_table[2]].block_hash is None
    bm.check_integrity(live=[a])


def test_cache_hit_on_freed_blocks_takes_them_out_of_the_free_queue():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq(range(9), "a")
    compute(bm, a)
    head = a.block_table[:2]
    bm.free(a)
    assert all(x in bm.free_queue for x in head)
    assert all(bm.blocks[x].block_hash is not None for x in head)  # still cached while free
    b = make_seq(range(9), "b")
    assert admit(bm, b) == head
    assert all(x not in bm.free_queue and bm.blocks[x].ref_count == 1 for x in head)
    assert bm.prefix_hits == 8 and bm.prefix_queries == 9
    bm.check_integrity(live=[b])


def test_prefix_caching_disabled():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = make_seq(range(9))
    compute(bm, a)
    assert a.block_hashes == [] and bm.cached == {}
    assert bm.find_cached_prefix(make_seq(range(9))) == ([], [])
    bm.check_integrity(live=[a])


def test_two_computations_of_the_same_block_register_one():
    """Two sequences computing the same prefix in the same step: the second copy stays private."""
    bm = BlockManager(num_blocks=8, block_size=4)
    a, b = make_seq(range(5), "a"), make_seq(range(5), "b")
    assert bm.allocate(a, 5) and bm.allocate(b, 5)
    a.num_computed_tokens = b.num_computed_tokens = 5
    bm.cache_full_blocks(a)
    bm.cache_full_blocks(b)
    assert list(bm.cached.values()) == [a.block_table[0]]
    assert bm.blocks[b.block_table[0]].block_hash is None
    assert b.block_hashes == a.block_hashes  # b's chain continues from the same hash
    bm.check_integrity(live=[a, b])
    bm.free(a)
    bm.free(b)
    bm.check_integrity(live=[])


# ---- hash collisions ---------------------------------------------------------------------

def test_hash_collision_with_different_tokens_is_not_served(monkeypatch):
    monkeypatch.setattr(bm_mod, "hash_block", lambda parent, tokens: 12345)
    bm = BlockManager(num_blocks=16, block_size=4)
    a = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
    compute(bm, a)
    assert len(bm.cached) == 1  # every block collides: only the first is registered
    b = make_seq([9, 9, 9, 9, 5, 6, 7, 8, 9], "b")
    assert bm.find_cached_prefix(b) == ([], [])
    assert admit(bm, b) == []
    assert set(a.block_table).isdisjoint(b.block_table)
    # A real hit under the same constant hash still works for the block that owns the entry.
    c = make_seq([1, 2, 3, 4, 0, 0, 0, 0, 0], "c")
    assert bm.find_cached_prefix(c)[0] == a.block_table[:1]
    bm.check_integrity(live=[a, b])


def test_hash_collision_with_same_tokens_but_other_prefix_is_not_served(monkeypatch):
    """A colliding chained hash whose block holds the same tokens after a different prefix
    (so different KV) must not be served either: the parent is part of what is compared."""
    monkeypatch.setattr(bm_mod, "hash_block", lambda parent, tokens: hash(tokens))
    bm = BlockManager(num_blocks=16, block_size=4)
    a = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 0], "a")
    compute(bm, a)
    # b's block 0 has the tokens of a's block 1, at another position after another prefix.
    b = make_seq([5, 6, 7, 8, 0], "b")
    assert bm.find_cached_prefix(b)[0] == []
    # A prompt of repeated blocks would otherwise map one physical block to several positions.
    c = make_seq([7, 7, 7, 7] * 3 + [1], "c")
    compute(bm, c)
    d = make_seq([7, 7, 7, 7] * 3 + [2], "d")
    ids = admit(bm, d)
    assert ids == c.block_table[:1]
    assert len(set(d.block_table)) == len(d.block_table)
    bm.check_integrity(live=[a, c, d])


def test_collision_in_an_earlier_block_is_not_inherited(monkeypatch):
    """r2's first block collides with a's, so it stays private; r2's second block is then
    registered after *its own* first block. A query matching a's first block exactly must not
    continue into r2's second block: its KV was computed after other tokens."""
    monkeypatch.setattr(bm_mod, "hash_block",
                        lambda parent, tokens: 7 if parent is None else hash(tokens))
    bm = BlockManager(num_blocks=16, block_size=2)
    a = make_seq([1, 1, 0], "a")
    compute(bm, a)  # registers [1, 1] under hash 7
    r2 = make_seq([2, 2, 3, 3, 0], "r2")
    assert admit(bm, r2) == []  # [2, 2] collides with [1, 1]: no hit, not registered
    assert len(bm.cached) == 2  # a's [1, 1] and r2's [3, 3] (after [2, 2])
    q = make_seq([1, 1, 3, 3, 0], "q")
    assert bm.find_cached_prefix(q)[0] == a.block_table[:1]
    bm.check_integrity(live=[a, r2])


# ---- LRU eviction ------------------------------------------------------------------------

def test_eviction_order_is_lru_and_tail_before_head():
    bm = BlockManager(num_blocks=7, block_size=2)  # 6 usable blocks
    a, b, c = make_seq([1, 1, 2], "a"), make_seq([3, 3, 4], "b"), make_seq([5, 5, 6], "c")
    for s in (a, b, c):
        compute(bm, s)  # one full (cached) block + one partial block each
    assert bm.num_free_blocks == 0
    ta, tb, tc = list(a.block_table), list(b.block_table), list(c.block_table)
    for s in (b, a, c):  # b is the least recently freed, c the most
        bm.free(s)
    bm.check_integrity(live=[])
    assert free_ids(bm) == [tb[1], tb[0], ta[1], ta[0], tc[1], tc[0]]
    assert len(bm.cached) == 3  # freed blocks keep their hash

    taker = make_seq(range(12), "taker")
    for k in range(1, 7):
        assert bm.allocate(taker, 2 * k)  # one more block each time
        bm.check_integrity(live=[taker])
        hits = {name: bool(bm.find_cached_prefix(make_seq(toks))[0])
                for name, toks in (("a", [1, 1, 2]), ("b", [3, 3, 4]), ("c", [5, 5, 6]))}
        # b's head goes at the 2nd allocation, a's at the 4th, c's at the 6th.
        assert hits == {"a": k < 4, "b": k < 2, "c": k < 6}, k
    assert taker.block_table == [tb[1], tb[0], ta[1], ta[0], tc[1], tc[0]]
    assert bm.cached == {}


def test_hit_block_moves_to_the_back_when_freed_again():
    bm = BlockManager(num_blocks=7, block_size=2)
    a = make_seq([1, 1, 2], "a")
    compute(bm, a)
    head = a.block_table[0]
    bm.free(a)
    assert free_ids(bm)[-1] == head
    b = make_seq([1, 1, 9], "b")
    assert admit(bm, b) == [head]
    bm.free(b)
    assert free_ids(bm)[-1] == head  # touched last, so evicted last
    assert bm.blocks[head].block_hash is not None
    bm.check_integrity(live=[])


def test_freed_blocks_stay_cached_until_reused():
    bm = BlockManager(num_blocks=4, block_size=2)  # 3 usable blocks
    a = make_seq([1, 2, 3, 4, 5], "a")
    compute(bm, a)
    bm.free(a)
    assert len(bm.cached) == 2
    assert len(bm.find_cached_prefix(make_seq([1, 2, 3, 4, 5]))[0]) == 2
    hog = make_seq(range(6), "hog")
    assert bm.allocate(hog, 6)  # takes every block, evicting both cached ones
    assert bm.cached == {}
    assert all(bm.blocks[x].block_hash is None and bm.blocks[x].token_ids is None
               for x in hog.block_table)
    assert bm.find_cached_prefix(make_seq([1, 2, 3, 4, 5])) == ([], [])
    bm.check_integrity(live=[hog])


# ---- admission ---------------------------------------------------------------------------

def test_can_admit_counts_cached_blocks_sitting_in_the_free_queue():
    bm = BlockManager(num_blocks=5, block_size=4)  # 4 usable
    a = make_seq(range(9), "a")
    compute(bm, a)  # 3 blocks, 2 of them full and cached
    bm.free(a)
    b = make_seq(range(9), "b")
    ids, hashes = bm.find_cached_prefix(b)
    assert len(ids) == 2 and bm.num_free_blocks == 4
    # b needs 1 new block and takes its 2 cached blocks out of the free queue: 3 of 4.
    assert bm.can_admit(ids, 9)
    hold1 = make_seq([100], "h1")
    compute(bm, hold1)  # 3 free blocks left, 2 of them b's cached prefix
    assert bm.can_admit(ids, 9)
    assert not bm.can_admit(ids, 13)  # 2 new blocks + 2 reclaimed > 3
    hold2 = make_seq([101], "h2")
    compute(bm, hold2)  # 2 free blocks left, both b's cached prefix: no room for the 3rd
    assert bm.num_free_blocks == 2
    assert not bm.can_admit(ids, 9)
    assert bm.can_admit(ids, 8)  # a prefix alone that fits exactly
    bm.free(hold2)
    assert bm.can_admit(ids, 9)
    bm.admit_cached(b, ids, hashes)
    assert bm.allocate(b, 1)  # what can_admit promised
    assert bm.num_free_blocks == 0
    bm.check_integrity(live=[b, hold1])


def test_can_admit_with_blocks_held_by_a_live_sequence():
    """A hit on blocks that a live sequence holds costs no free block."""
    bm = BlockManager(num_blocks=4, block_size=4)  # 3 usable
    a = make_seq(range(9), "a")
    compute(bm, a)
    assert bm.num_free_blocks == 0
    b = make_seq(list(range(8)) + [77], "b")
    ids, hashes = bm.find_cached_prefix(b)
    assert len(ids) == 2
    assert bm.can_admit(ids, 8)
    assert not bm.can_admit(ids, 9)
    assert not bm.allocate(a, 4)


# ---- sliding window ----------------------------------------------------------------------

def test_free_outside_window_replaces_dead_blocks_with_null():
    bm = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    seq = make_seq(range(20))
    compute(bm, seq)
    table = list(seq.block_table)
    # The next token (position 20) attends to [13, 20]: blocks 0..2 (positions 0..11) are dead.
    bm.free_outside_window(seq, window=8)
    assert seq.block_table == [NULL_BLOCK] * 3 + table[3:]
    for x in table[:3]:
        assert bm.blocks[x].ref_count == 0 and x in bm.free_queue
    bm.check_integrity(live=[seq])
    bm.free_outside_window(seq, window=8)  # idempotent
    bm.check_integrity(live=[seq])
    bm.free(seq)  # null entries are skipped, no double free
    assert bm.num_free_blocks == 9
    bm.check_integrity(live=[])


@pytest.mark.parametrize("computed, window, dead", [
    (0, 4, 0), (3, 4, 0), (4, 4, 0), (6, 4, 0), (7, 4, 1), (10, 4, 1), (11, 4, 2),
    (12, 8, 1), (13, 8, 1), (11, 8, 1), (10, 8, 0), (20, 1, 5), (19, 1, 4), (16, 100, 0)])
def test_free_outside_window_boundaries(computed, window, dead):
    """The next position p = computed attends to [p - window + 1, p]; block i (positions
    4i..4i+3) is dead once 4i + 3 < p - window + 1."""
    bm = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    seq = make_seq(range(computed + 1))
    compute(bm, seq, computed + 1)
    seq.num_computed_tokens = computed
    n = len(seq.block_table)
    bm.free_outside_window(seq, window)
    assert seq.block_table[:dead] == [NULL_BLOCK] * dead
    assert NULL_BLOCK not in seq.block_table[dead:] and len(seq.block_table) == n
    bm.check_integrity(live=[seq])


def test_free_outside_window_on_a_shared_block_only_drops_one_reference():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = make_seq(range(9), "a")
    compute(bm, a)
    b = make_seq(range(9), "b")
    admit(bm, b)
    shared = b.block_table[0]
    assert bm.blocks[shared].ref_count == 2
    bm.free_outside_window(b, window=2)  # next position 9 attends to [8, 9]
    assert b.block_table[:2] == [NULL_BLOCK, NULL_BLOCK]
    assert bm.blocks[shared].ref_count == 1 and shared not in bm.free_queue
    bm.check_integrity(live=[a, b])


# ---- integrity check and usage -----------------------------------------------------------

def _shared_state():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = make_seq(range(9), "a")
    compute(bm, a)
    b = make_seq(list(range(8)) + [50, 51], "b")
    admit(bm, b)
    done = make_seq([7, 7, 7, 7, 7], "done")
    compute(bm, done)
    bm.free(done)  # leaves a cached block in the free queue
    bm.check_integrity(live=[a, b])
    return bm, a, b


def _corrupt_ref_count_up(bm, a, b):
    bm.blocks[a.block_table[2]].ref_count += 1


def _corrupt_ref_count_down(bm, a, b):
    bm.blocks[a.block_table[0]].ref_count -= 1  # shared: 2 users, count says 1


def _corrupt_live_block_in_free_queue(bm, a, b):
    bm.free_queue[b.block_table[-1]] = None


def _corrupt_free_block_missing_from_queue(bm, a, b):
    bm.free_queue.pop(next(iter(bm.free_queue)))


def _corrupt_null_block_in_free_queue(bm, a, b):
    bm.free_queue[NULL_BLOCK] = None


def _corrupt_null_block_referenced(bm, a, b):
    bm.blocks[NULL_BLOCK].ref_count = 1


def _corrupt_stale_cache_entry(bm, a, b):
    h = a.block_hashes[0]
    bm.cached[h] = a.block_table[2]  # points at a block registered under no hash


def _corrupt_hash_without_cache_entry(bm, a, b):
    h = bm.blocks[a.block_table[1]].block_hash
    del bm.cached[h]  # the block still claims a hash the cache has forgotten


def _corrupt_table_unknown_block(bm, a, b):
    a.block_table.append(next(iter(bm.free_queue)))  # uses a block it holds no reference to


@pytest.mark.parametrize("corrupt", [
    _corrupt_ref_count_up, _corrupt_ref_count_down, _corrupt_live_block_in_free_queue,
    _corrupt_free_block_missing_from_queue, _corrupt_null_block_in_free_queue,
    _corrupt_null_block_referenced, _corrupt_stale_cache_entry, _corrupt_hash_without_cache_entry,
    _corrupt_table_unknown_block])
def test_check_integrity_catches_corruption(corrupt):
    bm, a, b = _shared_state()
    corrupt(bm, a, b)
    with pytest.raises(AssertionError):
        bm.check_integrity(live=[a, b])


def test_check_integrity_catches_a_forgotten_live_sequence():
    bm, a, b = _shared_state()
    with pytest.raises(AssertionError):
        bm.check_integrity(live=[a])
    with pytest.raises(AssertionError):
        bm.check_integrity(live=[])


def test_double_free_is_caught():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = make_seq(range(3))
    compute(bm, a)
    table = list(a.block_table)
    bm.free(a)
    a.block_table = table
    with pytest.raises(AssertionError):
        bm.free(a)


def test_usage_counts_live_blocks_only():
    bm = BlockManager(num_blocks=11, block_size=4)  # 10 usable
    assert bm.usage == 0.0
    a = make_seq(range(12), "a")
    compute(bm, a)
    assert bm.usage == pytest.approx(0.3)
    b = make_seq(range(13), "b")
    admit(bm, b)  # 3 shared + 1 new
    assert bm.usage == pytest.approx(0.4)
    bm.free(a)
    assert bm.usage == pytest.approx(0.4)
    bm.free(b)
    assert bm.usage == 0.0  # cached-but-free blocks count as free
    assert len(bm.cached) == 3
    hog = make_seq(range(40), "hog")
    compute(bm, hog)
    assert bm.usage == 1.0


def test_reset_prefix_cache_keeps_live_blocks():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = make_seq(range(9), "a")
    compute(bm, a)
    gone = make_seq([5] * 9, "gone")
    compute(bm, gone)
    bm.free(gone)
    bm.reset_prefix_cache()
    bm.check_integrity(live=[a])
    assert len(bm.cached) == 2
    assert bm.find_cached_prefix(make_seq([5] * 9)) == ([], [])
    assert len(bm.find_cached_prefix(make_seq(range(9)))[0]) == 2


# ---- randomized --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_random_operations_keep_integrity_and_serve_correct_prefixes(seed):
    """Random admissions (with prefix hits), chunked computation, frees and window frees.

    An oracle records, for each physical block, the token prefix its KV was computed for; a
    prefix hit must only ever serve blocks computed for exactly the same prefix.
    """
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4])
    bm = BlockManager(num_blocks=rng.randint(4, 24), block_size=bs)
    prefixes = [[rng.randrange(3) for _ in range(rng.randint(0, 12))] for _ in range(3)]
    content: dict[int, tuple[int, ...]] = {}  # block id -> token prefix its KV belongs to
    live: list[Sequence] = []
    for _ in range(400):
        op = rng.random()
        if op < 0.35 or not live:
            toks = rng.choice(prefixes) + [rng.randrange(3) for _ in range(rng.randint(1, 8))]
            seq = make_seq(toks)
            ids, hashes = bm.find_cached_prefix(seq)
            assert len(ids) * bs < seq.num_tokens
            for i, x in enumerate(ids):
                assert x != NULL_BLOCK
                assert content[x] == tuple(toks[:(i + 1) * bs]), "prefix cache served wrong KV"
            first = min(seq.num_tokens - len(ids) * bs, rng.randint(1, 8))
            if bm.can_admit(ids, len(ids) * bs + first):
                bm.admit_cached(seq, ids, hashes)
                assert bm.allocate(seq, first), "can_admit promised room"
                _compute(bm, seq, first, content)
                live.append(seq)
        elif op < 0.7:
            seq = rng.choice(live)
            n = rng.randint(1, 6)
            if seq.num_computed_tokens + n > seq.num_tokens:
                seq.token_ids += [rng.randrange(3) for _ in range(n)]
            if bm.allocate(seq, n):
                _compute(bm, seq, n, content)
        elif op < 0.8:
            bm.free_outside_window(rng.choice(live), window=rng.randint(1, 10))
        else:
            bm.free(live.pop(rng.randrange(len(live))))
        for s in live:
            assert len(s.block_table) * bs >= s.num_computed_tokens
        bm.check_integrity(live=live)
    for s in live:
        bm.free(s)
    bm.check_integrity(live=[])
    assert bm.num_free_blocks == bm.num_blocks - 1


def _compute(bm: BlockManager, seq: Sequence, n: int, content: dict) -> None:
    bs = bm.block_size
    start = seq.num_computed_tokens
    for pos in range(start, start + n):
        block = seq.block_table[pos // bs]
        assert bm.blocks[block].ref_count == 1, "writing KV into a shared block"
        if pos % bs == bs - 1:
            content[block] = tuple(seq.token_ids[:pos + 1])
    seq.num_computed_tokens += n
    bm.cache_full_blocks(seq)
