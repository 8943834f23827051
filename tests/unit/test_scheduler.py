"""Scheduler: token budget, chunked prefill, prefix hits, preemption, stop rules, FCFS.

Driven by `FakeModel`, which stands in for the worker: its next token is a function of the
sequence's token ids, so a run's final tokens do not depend on how it was scheduled. It also
keeps a fake KV pool (one value per slot, a hash of the token prefix up to that position) and
checks that every position a step attends to holds the value for exactly this sequence's prefix,
and that no slot is written twice in one step. So a wrong prefix hit, a lost or
duplicated token after preemption, or a block freed too early fails the test.
"""
from __future__ import annotations

import random

import pytest

from nextok.config import SchedulerConfig
from nextok.engine import block_manager as bm_mod
from nextok.engine.block_manager import NULL_BLOCK, BlockManager
from nextok.engine.scheduler import Scheduler, SchedulerOutput
from nextok.engine.sequence import PENDING, Sequence, SequenceStatus
from nextok.sampling_params import SamplingParams

STOPPED, LENGTH, ABORTED = (SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH,
                            SequenceStatus.FINISHED_ABORTED)


def make_scheduler(num_blocks=64, block_size=4, max_num_seqs=16, max_num_batched_tokens=64,
                   chunked=True, max_model_len=4096, prefix=True, eos=(), window=None) -> Scheduler:
    bm = BlockManager(num_blocks, block_size, prefix)
    cfg = SchedulerConfig(max_num_seqs, max_num_batched_tokens, chunked, max_model_len)
    return Scheduler(cfg, bm, eos_token_ids=eos, sliding_window=window)


def new_seq(name: str, prompt, **params) -> Sequence:
    params.setdefault("max_tokens", 8)
    return Sequence(name, list(prompt), SamplingParams(**params))


def hash_model(seq: Sequence, vocab: int = 1000) -> int:
    # hash of a tuple of ints does not depend on PYTHONHASHSEED: runs repeat exactly.
    return hash(tuple(seq.token_ids)) % vocab


class FakeModel:
    """The worker's stand-in: checks and writes a fake KV pool, then samples `next_token`."""

    def __init__(self, sched: Scheduler, next_token=hash_model):
        self.sched = sched
        self.next_token = next_token
        self.kv: dict[int, int] = {}  # slot -> value written there
        self.values: dict[int, list[int]] = {}  # seq_id -> expected KV value per position
        self.truth: dict[int, list[int]] = {}  # seq_id -> every token, sampled ones included

    def _tokens(self, seq: Sequence) -> list[int]:
        """The sequence's tokens as the device knows them: with async scheduling the host's
        copy ends in PENDING tokens that this model sampled but the scheduler has not seen."""
        truth = self.truth.setdefault(seq.seq_id, list(seq.token_ids))
        known = seq.num_resolved_tokens
        assert seq.token_ids[:known] == truth[:known], f"{seq}: a token was lost or changed"
        assert len(seq.token_ids) <= len(truth), f"{seq}: more tokens than were sampled"
        return truth

    def _expected(self, seq: Sequence, upto: int) -> list[int]:
        vals = self.values.setdefault(seq.seq_id, [])
        tokens = self._tokens(seq)
        while len(vals) < upto:  # value at p depends on tokens [0, p], like real KV
            p = len(vals)
            vals.append(hash((vals[-1] if vals else None, tokens[p])))
        return vals

    def execute(self, out: SchedulerOutput) -> dict[int, int]:
        # Like each layer of the real model: the whole batch's KV is written, then attention
        # reads. A sequence may read a block that another one writes in the same step (the
        # scheduler shares blocks as soon as they are scheduled), so every read is checked
        # against this sequence's own prefix, and no slot may be written twice in one step.
        bm = self.sched.block_manager
        bs, window = bm.block_size, self.sched.sliding_window
        written: set[int] = set()
        for item in out.scheduled:
            seq, start, n = item.seq, item.start, item.num_new_tokens
            vals = self._expected(seq, start + n)
            for p in range(start, start + n):
                block = seq.block_table[p // bs]
                assert block != NULL_BLOCK
                slot = block * bs + p % bs
                assert slot not in written, f"{seq}: slot {slot} written twice in one step"
                written.add(slot)
                self.kv[slot] = vals[p]
        for item in out.scheduled:
            seq, start, n = item.seq, item.start, item.num_new_tokens
            vals = self._expected(seq, start + n)
            lo = 0 if window is None else max(0, start - window + 1)
            for p in range(lo, start + n):  # what this step attends to
                block = seq.block_table[p // bs]
                assert block != NULL_BLOCK, f"{seq}: position {p} in the window was freed"
                assert self.kv.get(block * bs + p % bs) == vals[p], f"{seq}: wrong KV at {p}"
        sampled = {}
        for it in out.scheduled:
            if it.samples:
                seq, truth = it.seq, self._tokens(it.seq)
                view = Sequence(seq.request_id, seq.prompt_token_ids, seq.params)
                view.token_ids = list(truth)  # what next_token sees: every token, none PENDING
                sampled[seq.seq_id] = self.next_token(view)
                truth.append(sampled[seq.seq_id])
        return sampled


def check_output(sched: Scheduler, out: SchedulerOutput) -> None:
    """Invariants of one `schedule()` result, before the step runs."""
    cfg, bm = sched.config, sched.block_manager
    assert out.num_batched_tokens <= cfg.max_num_batched_tokens
    assert len(sched.running) <= cfg.max_num_seqs
    ids = [it.seq.seq_id for it in out.scheduled]
    assert len(ids) == len(set(ids)), "a sequence scheduled twice in one step"
    for it in out.scheduled:
        seq = it.seq
        assert seq in sched.running and seq.status == SequenceStatus.RUNNING
        assert it.start == seq.num_computed_tokens
        # (speculative drafts are computed past the sequence's last token)
        assert 1 <= it.num_new_tokens and it.start + it.num_new_tokens - len(it.draft) <= seq.num_tokens
        assert len(seq.block_table) * bm.block_size >= it.start + it.num_new_tokens
    # (Async scheduling also skips a sequence whose PENDING token surely ends it.)
    unscheduled = [s for s in sched.running if s.seq_id not in ids
                   and not (s.num_pending and sched._ends_by_length(s, s.num_tokens))]
    if unscheduled:  # a running sequence is skipped only when the budget is spent
        assert out.num_batched_tokens == cfg.max_num_batched_tokens
    # Victims are taken from the back of `running` and requeued at the front of `waiting`, so
    # the front of `waiting` is the victims in their admission order.
    assert list(sched.waiting)[:len(out.preempted)] == out.preempted[::-1]
    for seq in out.preempted:
        assert seq.seq_id not in ids and seq in sched.waiting
        assert seq.status == SequenceStatus.WAITING
        assert seq.block_table == [] and seq.num_computed_tokens == 0
    bm.check_integrity(live=sched.running)


def step(sched: Scheduler, model: FakeModel):
    out = sched.schedule()
    check_output(sched, out)
    finished = sched.update(out, model.execute(out))
    sched.block_manager.check_integrity(live=sched.running)
    for seq in finished:
        assert seq.is_finished and seq.block_table == []
        assert seq not in sched.running and seq not in sched.waiting
    return out, finished


def check_all_released(sched: Scheduler) -> None:
    bm = sched.block_manager
    bm.check_integrity(live=[])
    assert all(b.ref_count == 0 for b in bm.blocks)
    assert bm.num_free_blocks == bm.num_blocks - 1  # every block free, cached or not
    assert bm.usage == 0.0


def run(sched: Scheduler, seqs=(), arrivals=None, model=None, max_steps=20_000, abort=None,
        overlap=False):
    """Run until everything finished; `arrivals`: {step: [seqs]} added before that step.

    `abort(step, sched, out)`, if given, is called between schedule and update.
    `overlap`: as the engine's async scheduling: step i is scheduled and advanced before step
    i - 1's tokens are resolved.
    Returns the list of SchedulerOutputs. Fails on a step that schedules nothing while work
    remains (a deadlock) or on running past `max_steps`.
    """
    model = model or FakeModel(sched)
    for seq in seqs:
        sched.add(seq)
    arrivals = dict(arrivals or {})
    outs = []
    inflight = None
    for i in range(max_steps):
        for seq in arrivals.pop(i, []):
            sched.add(seq)
        if not sched.has_unfinished():
            assert inflight is None or not any(it.samples and not it.seq.is_finished
                                               for it in inflight[0].scheduled)
            if not arrivals:
                check_all_released(sched)
                return outs
            continue
        out = sched.schedule()
        assert not out.is_empty or inflight, f"deadlock at step {i}: waiting={list(sched.waiting)}"
        check_output(sched, out)
        sampled = model.execute(out)
        if abort is not None:
            abort(i, sched, out)
        if overlap:
            sched.advance(out)
            if inflight is not None:
                sched.resolve(*inflight)
            inflight = (out, sampled) if not out.is_empty else None
        else:
            sched.update(out, sampled)
        sched.block_manager.check_integrity(live=sched.running)
        outs.append(out)
    raise AssertionError("did not finish")


def reference_tokens(prompts: dict[str, list[int]], params: dict[str, dict], eos=(),
                     max_model_len=4096, next_token=hash_model) -> dict[str, list[int]]:
    """Final token lists from a run with a pool and budget too large to ever preempt or chunk."""
    lens = [min(max_model_len, len(prompts[k]) + (params[k].get("max_tokens") or max_model_len))
            for k in prompts]
    sched = make_scheduler(num_blocks=sum(-(-n // 16) for n in lens) + 1, block_size=16,
                           max_num_seqs=1024,
                           max_num_batched_tokens=1 << 20, max_model_len=max_model_len, eos=eos,
                           prefix=False)
    seqs = [new_seq(name, prompts[name], **params[name]) for name in prompts]
    outs = run(sched, seqs, model=FakeModel(sched, next_token))
    assert sched.num_preemptions == 0 and not any(o.preempted for o in outs)
    assert all(it.samples for o in outs for it in o.scheduled)  # no prompt was ever chunked
    return {s.request_id: s.token_ids for s in seqs}


def first_step(outs, seq) -> int:
    return next(i for i, o in enumerate(outs) if any(it.seq is seq for it in o.scheduled))


def items_of(outs, seq):
    return [(i, it) for i, o in enumerate(outs) for it in o.scheduled if it.seq is seq]


# ---- budget and limits -------------------------------------------------------------------

def test_token_budget_and_max_num_seqs_are_respected_and_reached():
    sched = make_scheduler(max_num_seqs=3, max_num_batched_tokens=20)
    rng = random.Random(1)
    seqs = [new_seq(f"r{i}", [rng.randrange(100) for _ in range(5 + 3 * i)], max_tokens=6)
            for i in range(10)]
    outs = run(sched, seqs)  # check_output asserts both limits every step
    assert max(o.num_batched_tokens for o in outs) == 20
    assert max(len(o.scheduled) for o in outs) == 3
    assert all(s.status == LENGTH and s.num_output_tokens == 6 for s in seqs)


def test_empty_scheduler_schedules_nothing():
    sched = make_scheduler()
    out = sched.schedule()
    assert out.is_empty and out.num_batched_tokens == 0 and not sched.has_unfinished()


def test_chunked_prefill_splits_a_long_prompt_and_only_the_last_chunk_samples():
    sched = make_scheduler(max_num_batched_tokens=16)
    model = FakeModel(sched)
    seq = new_seq("long", range(50), max_tokens=3)
    sched.add(seq)
    chunks = []
    for _ in range(4):
        out, _ = step(sched, model)
        (it,) = out.scheduled
        chunks.append((it.start, it.num_new_tokens, it.samples))
        if not it.samples:
            assert seq.num_tokens == 50, "a token appended before the prompt was done"
    assert chunks == [(0, 16, False), (16, 16, False), (32, 16, False), (48, 2, True)]
    assert seq.num_tokens == 51 and seq.num_computed_tokens == 50
    out, _ = step(sched, model)
    assert [(it.start, it.num_new_tokens, it.samples) for it in out.scheduled] == [(50, 1, True)]


def test_chunked_prefill_shares_the_budget_with_decodes():
    sched = make_scheduler(max_num_batched_tokens=16)
    model = FakeModel(sched)
    a = new_seq("a", range(4), max_tokens=20)
    sched.add(a)
    step(sched, model)
    b = new_seq("b", range(100, 140), max_tokens=2)
    sched.add(b)
    out, _ = step(sched, model)
    assert [(it.seq.request_id, it.num_new_tokens) for it in out.scheduled] == [("a", 1), ("b", 15)]
    out, _ = step(sched, model)  # b is running now: it goes in arrival order after a
    assert [(it.seq.request_id, it.num_new_tokens) for it in out.scheduled] == [("a", 1), ("b", 15)]
    out, _ = step(sched, model)
    assert [(it.seq.request_id, it.num_new_tokens, it.samples) for it in out.scheduled] == [
        ("a", 1, True), ("b", 10, True)]


def test_without_chunked_prefill_a_prompt_over_the_remaining_budget_waits():
    sched = make_scheduler(max_num_batched_tokens=16, chunked=False)
    model = FakeModel(sched)
    a, b, c = new_seq("a", range(10)), new_seq("b", range(20, 30)), new_seq("c", [1, 2])
    for s in (a, b, c):
        sched.add(s)
    out, _ = step(sched, model)
    # b (10 tokens) does not fit in the 6 left; c would, but must not overtake b.
    assert [(it.seq.request_id, it.num_new_tokens) for it in out.scheduled] == [("a", 10)]
    assert list(sched.waiting) == [b, c]
    out, _ = step(sched, model)
    assert [(it.seq.request_id, it.num_new_tokens) for it in out.scheduled] == [
        ("a", 1), ("b", 10), ("c", 2)]
    assert all(it.samples for it in out.scheduled)


def test_with_chunked_prefill_the_same_prompt_starts_at_once():
    sched = make_scheduler(max_num_batched_tokens=16, chunked=True)
    model = FakeModel(sched)
    a, b = new_seq("a", range(10)), new_seq("b", range(20, 30))
    sched.add(a)
    sched.add(b)
    out, _ = step(sched, model)
    assert [(it.seq.request_id, it.num_new_tokens, it.samples) for it in out.scheduled] == [
        ("a", 10, True), ("b", 6, False)]


def test_decode_sequences_get_one_token_each():
    sched = make_scheduler(max_num_batched_tokens=64)
    model = FakeModel(sched)
    seqs = [new_seq(f"r{i}", range(i, i + 5 + i), max_tokens=5) for i in range(4)]
    for s in seqs:
        sched.add(s)
    out, _ = step(sched, model)
    assert [it.num_new_tokens for it in out.scheduled] == [5, 6, 7, 8]
    for k in range(4):
        out, finished = step(sched, model)
        assert [(it.num_new_tokens, it.samples) for it in out.scheduled] == [(1, True)] * 4
        assert all(s.num_output_tokens == k + 2 for s in seqs)
    assert finished == seqs and not sched.has_unfinished()
    check_all_released(sched)


# ---- prefix cache ------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", [True, False])
def test_prefix_cache_hit_reduces_scheduled_tokens(prefix):
    sched = make_scheduler(block_size=4, prefix=prefix)
    model = FakeModel(sched)
    prompt = list(range(30, 50))  # 20 tokens: 5 full blocks
    a = new_seq("a", prompt, max_tokens=4)
    sched.add(a)
    step(sched, model)
    b = new_seq("b", prompt, max_tokens=4)
    sched.add(b)
    out, _ = step(sched, model)
    (item,) = [it for it in out.scheduled if it.seq is b]
    if prefix:
        # 4 of the 5 full blocks: one token is always left to compute for b's first logits.
        assert (item.start, item.num_new_tokens) == (16, 4)
        assert b.num_cached_tokens == 16
        assert b.block_table[:4] == a.block_table[:4]
        assert all(sched.block_manager.blocks[x].ref_count == 2 for x in b.block_table[:4])
    else:
        assert (item.start, item.num_new_tokens) == (0, 20) and b.num_cached_tokens == 0
        assert set(a.block_table).isdisjoint(b.block_table)
    run(sched, model=model)
    assert a.token_ids == b.token_ids  # same prompt, same deterministic model


def test_prefix_hit_on_blocks_of_a_finished_sequence():
    sched = make_scheduler(block_size=4)
    model = FakeModel(sched)
    system = list(range(200, 213))  # a shared 13-token "system prompt"
    a = new_seq("a", system + [1, 2, 3], max_tokens=2)
    run(sched, [a], model=model)
    b = new_seq("b", system + [7, 8], max_tokens=2)
    outs = run(sched, [b], model=model)
    assert (outs[0].scheduled[0].start, outs[0].scheduled[0].num_new_tokens) == (12, 3)
    assert b.num_cached_tokens == 12
    assert sched.block_manager.prefix_hits == 12


# ---- preemption --------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", [False, True])
def test_preemption_of_the_last_admitted_sequence(prefix):
    sched = make_scheduler(num_blocks=5, block_size=4, prefix=prefix)  # 4 usable blocks
    model = FakeModel(sched)
    a = new_seq("a", range(7), max_tokens=6)
    b = new_seq("b", range(10, 17), max_tokens=6)
    sched.add(a)
    sched.add(b)
    step(sched, model)  # both prompts: 2 blocks each, the pool is full
    c = new_seq("c", [1, 2, 3], max_tokens=2)
    sched.add(c)
    out, _ = step(sched, model)  # decode at position 7 fits in block 1; c cannot start
    assert [it.seq for it in out.scheduled] == [a, b] and not out.preempted
    b_tokens = list(b.token_ids)
    assert len(b_tokens) == 9
    out, _ = step(sched, model)  # a needs a 3rd block: b, admitted last, is preempted
    assert out.preempted == [b]
    assert [it.seq for it in out.scheduled] == [a]  # no admission in a preempting step
    assert list(sched.waiting) == [b, c]  # b at the front
    assert b.status == SequenceStatus.WAITING and b.block_table == []
    assert b.num_computed_tokens == 0 and b.num_preemptions == 1 and sched.num_preemptions == 1
    assert b.token_ids == b_tokens  # prompt + the 2 generated tokens, nothing lost
    outs = [out]
    while a.status == SequenceStatus.RUNNING:
        out, _ = step(sched, model)
        outs.append(out)
        # c would fit in the one free block, but must not overtake b.
        assert c.status == SequenceStatus.WAITING or a.is_finished
    assert a.status == LENGTH
    outs += run(sched, model=model)
    (i, first), *_ = items_of(outs, b)
    assert first_step(outs, c) >= i  # admitted no earlier than b
    # b is recomputed from its tokens: prompt + generated, minus what the cache still has.
    assert first.start == (4 if prefix else 0)  # b's head block survived in the LRU cache
    assert first.start + first.num_new_tokens == 9 and first.samples
    assert b.token_ids[:9] == b_tokens
    ref = reference_tokens({"a": list(range(7)), "b": list(range(10, 17)), "c": [1, 2, 3]},
                           {"a": {"max_tokens": 6}, "b": {"max_tokens": 6}, "c": {"max_tokens": 2}})
    assert {s.request_id: s.token_ids for s in (a, b, c)} == ref


def test_the_first_admitted_sequence_is_never_preempted():
    """Decodes that outgrow the pool take their blocks from the most recently admitted."""
    sched = make_scheduler(num_blocks=8, block_size=2, prefix=False)  # 7 usable: 14 tokens
    model = FakeModel(sched)
    seqs = [new_seq(f"r{i}", [i, i, i], max_tokens=10) for i in range(3)]  # 13 tokens each
    outs = run(sched, seqs, model=model)
    preempted = [s.request_id for o in outs for s in o.preempted]
    assert preempted and "r0" not in preempted  # the first admitted is never the victim
    assert all(s.status == LENGTH for s in seqs)
    ref = reference_tokens({s.request_id: s.prompt_token_ids for s in seqs},
                           {s.request_id: {"max_tokens": 10} for s in seqs})
    assert {s.request_id: s.token_ids for s in seqs} == ref


@pytest.mark.parametrize("block_size, chunked, prefix", [
    (1, True, True), (2, True, False), (4, False, True), (4, True, True), (8, False, False)])
def test_tiny_pool_gives_the_same_tokens_as_a_huge_pool(block_size, chunked, prefix):
    rng = random.Random(block_size * 10 + chunked * 2 + prefix)
    max_len = 48
    prompts = {f"r{i}": [rng.randrange(20) for _ in range(rng.randint(1, 30))] for i in range(40)}
    params = {k: {"max_tokens": rng.randint(1, max_len - len(p))} for k, p in prompts.items()}
    blocks = -(-max_len // block_size) + 1  # one full-length sequence, and not much more
    sched = make_scheduler(num_blocks=blocks + 2, block_size=block_size, max_num_seqs=8,
                           max_num_batched_tokens=max_len if not chunked else 24,
                           chunked=chunked, prefix=prefix, max_model_len=max_len)
    seqs = [new_seq(k, p, **params[k]) for k, p in prompts.items()]
    run(sched, seqs)
    assert sched.num_preemptions > 0
    assert {s.request_id: s.token_ids for s in seqs} == reference_tokens(prompts, params)


def test_a_sequence_longer_than_the_pool_stops_at_the_pool_size():
    """max_tokens=None runs to the context window; a window longer than the whole pool must not
    leave the sequence preempting itself forever."""
    sched = make_scheduler(num_blocks=5, block_size=4, max_model_len=4096)  # 16 tokens fit
    seq = new_seq("r", range(5), max_tokens=None)
    run(sched, [seq], max_steps=100)
    assert seq.status == LENGTH and seq.num_tokens == 16


def test_no_chunked_prefill_sequence_never_outgrows_the_budget():
    """Without chunked prefill a preempted sequence is recomputed in one step, so it must never
    grow past max_num_batched_tokens, or it could never be scheduled again."""
    sched = make_scheduler(num_blocks=64, block_size=4, chunked=False,
                           max_num_batched_tokens=16, max_model_len=4096)
    seq = new_seq("r", range(5), max_tokens=None)
    run(sched, [seq], max_steps=100)
    assert seq.status == LENGTH and seq.num_tokens == 16


# ---- abort -------------------------------------------------------------------------------

def test_abort_waiting_and_running_sequences_frees_their_blocks():
    sched = make_scheduler(num_blocks=16, block_size=4, max_num_seqs=2)
    model = FakeModel(sched)
    prompt = list(range(9))
    a, b, w = new_seq("a", prompt), new_seq("b", prompt), new_seq("w", [5, 6])
    for s in (a, b, w):
        sched.add(s)
    step(sched, model)
    assert sched.running == [a, b] and list(sched.waiting) == [w]
    sched.finish(w, ABORTED)
    assert w.status == ABORTED and not sched.waiting
    sched.finish(a, ABORTED)
    assert a.status == ABORTED and a.block_table == [] and sched.running == [b]
    sched.block_manager.check_integrity(live=[b])
    sched.finish(a, STOPPED)  # finishing twice changes nothing
    assert a.status == ABORTED
    run(sched, model=model)
    assert b.status == LENGTH


def test_abort_while_the_step_runs():
    """Aborted between schedule() and update(): no token appended, blocks freed, no crash."""
    sched = make_scheduler(num_blocks=16, block_size=4)
    model = FakeModel(sched)
    a, b = new_seq("a", range(9), max_tokens=4), new_seq("b", range(9), max_tokens=4)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    sampled = model.execute(out)
    sched.finish(a, ABORTED)
    sched.update(out, sampled)
    assert a.num_tokens == 9 and a.block_table == [] and a.status == ABORTED
    sched.block_manager.check_integrity(live=sched.running)
    run(sched, model=model)
    assert b.num_output_tokens == 4


def test_abort_a_preempted_sequence():
    sched = make_scheduler(num_blocks=5, block_size=4, prefix=False)
    model = FakeModel(sched)
    a, b = new_seq("a", range(7), max_tokens=6), new_seq("b", range(10, 17), max_tokens=6)
    sched.add(a)
    sched.add(b)
    for _ in range(3):
        out, _ = step(sched, model)
    assert out.preempted == [b]
    sched.finish(b, ABORTED)
    assert b not in sched.waiting and b.status == ABORTED
    run(sched, model=model)
    assert a.status == LENGTH


# ---- FCFS --------------------------------------------------------------------------------

def test_fcfs_equal_sequences_are_admitted_and_finish_in_arrival_order():
    sched = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64)
    seqs = [new_seq(f"r{i}", [i] * 8, max_tokens=5) for i in range(7)]
    finish_order = []
    model = FakeModel(sched)
    for s in seqs:
        sched.add(s)
    outs = []
    while sched.has_unfinished():
        out, finished = step(sched, model)
        outs.append(out)
        finish_order += finished
    starts = [first_step(outs, s) for s in seqs]
    assert starts == sorted(starts) and starts[0] == starts[1] < starts[2]
    assert finish_order == seqs


def test_a_waiting_sequence_that_does_not_fit_blocks_the_ones_behind():
    sched = make_scheduler(num_blocks=9, block_size=4, prefix=False)  # 8 usable blocks
    model = FakeModel(sched)
    a = new_seq("a", range(24), max_tokens=2)  # 6 blocks, 7 by the end
    big = new_seq("big", range(100, 112), max_tokens=1)  # 3 blocks: not while a runs
    small = new_seq("small", [1], max_tokens=1)  # 1 block: would fit, must wait for big
    outs = run(sched, [a, big, small], model=model)
    assert first_step(outs, big) > 0
    assert first_step(outs, small) >= first_step(outs, big)


def test_preempted_sequences_keep_their_order_at_the_front():
    sched = make_scheduler(num_blocks=5, block_size=2, prefix=False)  # 4 usable blocks
    model = FakeModel(sched)
    r0, r1, r2 = new_seq("r0", [0]), new_seq("r1", [1, 1, 1]), new_seq("r2", [2])
    late = new_seq("late", [9], max_tokens=1)
    for s in (r0, r1, r2):
        sched.add(s)
    step(sched, model)  # 1 + 2 + 1 blocks: the pool is full
    sched.add(late)
    step(sched, model)  # everyone decodes inside the blocks it has
    out, _ = step(sched, model)
    # r0 needs a block: r2 (last) goes. r1 then needs one too, and is itself the last left.
    assert out.preempted == [r2, r1] and [it.seq for it in out.scheduled] == [r0]
    assert list(sched.waiting) == [r1, r2, late]
    outs = [out] + run(sched, model=model)
    assert first_step(outs, r1) <= first_step(outs, r2) <= first_step(outs, late)


# ---- stop rules --------------------------------------------------------------------------

def scripted(outputs: list[int]):
    """A model that emits `outputs` in order (then repeats the last)."""
    return lambda seq: outputs[min(seq.num_output_tokens, len(outputs) - 1)]


def finish_one(seq: Sequence, outputs: list[int], eos=(), **kw) -> Sequence:
    sched = make_scheduler(eos=eos, **kw)
    run(sched, [seq], model=FakeModel(sched, scripted(outputs)))
    return seq


def test_stop_on_eos():
    seq = finish_one(new_seq("r", [1, 2, 2]), [5, 2, 6], eos=(2,))
    assert seq.status == STOPPED and seq.output_token_ids == [5, 2] and seq.stop_reason is None


def test_ignore_eos():
    seq = finish_one(new_seq("r", [1], ignore_eos=True, max_tokens=4), [2], eos=(2,))
    assert seq.status == LENGTH and seq.output_token_ids == [2, 2, 2, 2]


def test_stop_token_ids():
    seq = finish_one(new_seq("r", [1], stop_token_ids=[6], ignore_eos=True), [5, 2, 6, 7], eos=(2,))
    assert seq.status == STOPPED and seq.output_token_ids == [5, 2, 6] and seq.stop_reason == 6


def test_max_tokens():
    seq = finish_one(new_seq("r", [1], max_tokens=3), [5])
    assert seq.status == LENGTH and seq.output_token_ids == [5, 5, 5]


def test_eos_wins_over_max_tokens_on_the_same_token():
    seq = finish_one(new_seq("r", [1], max_tokens=2), [5, 2], eos=(2,))
    assert seq.status == STOPPED and seq.output_token_ids == [5, 2]


def test_min_tokens_delays_eos_and_stop_tokens():
    seq = finish_one(new_seq("r", [1], min_tokens=3, max_tokens=10), [2], eos=(2,))
    assert seq.status == STOPPED and seq.output_token_ids == [2, 2, 2]
    seq = finish_one(new_seq("r", [1], min_tokens=2, stop_token_ids=[6]), [6, 6, 6])
    assert seq.status == STOPPED and seq.output_token_ids == [6, 6] and seq.stop_reason == 6


def test_max_model_len():
    seq = finish_one(new_seq("r", range(10), max_tokens=None), [5], max_model_len=12)
    assert seq.status == LENGTH and seq.num_tokens == 12 and seq.output_token_ids == [5, 5]


def test_eos_in_the_prompt_does_not_stop():
    seq = finish_one(new_seq("r", [2, 2, 2], max_tokens=2), [5], eos=(2,))
    assert seq.status == LENGTH and seq.output_token_ids == [5, 5]


# ---- sliding window ----------------------------------------------------------------------

def test_sliding_window_frees_blocks_and_keeps_tokens():
    window, bs = 8, 4
    sched = make_scheduler(num_blocks=40, block_size=bs, prefix=False, window=window,
                           max_num_batched_tokens=16)
    model = FakeModel(sched)  # checks every position inside the window is still intact
    prompts = {"a": list(range(30)), "b": list(range(50, 55))}
    params = {"a": {"max_tokens": 60}, "b": {"max_tokens": 80}}
    seqs = [new_seq(k, p, **params[k]) for k, p in prompts.items()]
    for s in seqs:
        sched.add(s)
    peak = 0
    while sched.has_unfinished():
        step(sched, model)
        for s in sched.running:
            live = [x for x in s.block_table if x != NULL_BLOCK]
            peak = max(peak, len(live))
    # A chunk of 16 plus a window of 8 spans at most 7 blocks of 4.
    assert peak <= -(-(16 + window) // bs) + 1
    check_all_released(sched)
    assert {s.request_id: s.token_ids for s in seqs} == reference_tokens(prompts, params)


# ---- randomized stress -------------------------------------------------------------------

def _stress_config(rng: random.Random, seed: int, **overrides) -> dict:
    cfg = dict(block_size=rng.choice([1, 2, 4, 8, 16]), max_model_len=rng.choice([32, 64, 96]),
               chunked=seed % 3 != 1, window=rng.choice([5, 8, 20]) if seed % 4 == 3 else None,
               max_num_seqs=rng.choice([1, 3, 16, 64]),
               # The engine turns prefix caching off with a sliding window; here both are tried.
               prefix=rng.random() < 0.75, eos=(0,))
    cfg.update(overrides)
    bs, max_len = cfg["block_size"], cfg["max_model_len"]
    # A full-length sequence must fit (the pool also caps the length), plus some slack.
    cfg["num_blocks"] = -(-max_len // bs) + 1 + rng.randint(0, max_len // bs)
    cfg["max_num_batched_tokens"] = (max_len * rng.choice([1, 2]) if not cfg["chunked"]
                                     else rng.choice([1, 3, 16, 64]))
    return cfg


# Seeds picked to cover preemption, chunked prefill on and off, sliding windows, prefix caching
# on and off and budgets of 1-3 tokens; hundreds more pass too (range(N) in a loop), but take
# longer than a unit test should.
@pytest.mark.parametrize("seed", [10, 12, 13, 16, 17, 18, 23, 24, 25, 27, 29, 31])
def test_random_stress(seed):
    sched = _stress(seed)
    assert sched.num_preemptions > 0


@pytest.mark.parametrize("seed", [0, 2])
def test_random_stress_with_colliding_hashes(seed, monkeypatch):
    """A block hash that ignores the parent and has 5 values: hits are checked on every block
    (the fake KV would show a block served for the wrong prefix)."""
    monkeypatch.setattr(bm_mod, "hash_block", lambda parent, tokens: hash(tokens) % 5)
    sched = _stress(seed, vocab=2, block_size=2, prefix=True, window=None)
    assert sched.block_manager.prefix_hits > 0


@pytest.mark.parametrize("seed", [10, 13, 16, 23, 27, 35])
def test_random_stress_with_async_scheduling(seed):
    """The same, each step scheduled before the previous one's tokens are known (PENDING)."""
    sched = _stress(seed, overlap=True)
    assert sched.num_preemptions > 0


def _stress(seed: int, vocab: int = 30, overlap: bool = False, **overrides) -> Scheduler:
    """200 sequences arriving over time, some from a few common prefixes, with random aborts;
    integrity every step, and the final tokens of the sequences that were not aborted must equal
    those of a run with an unlimited pool."""
    rng = random.Random(seed)
    cfg = _stress_config(rng, seed, **overrides)
    max_len = cfg["max_model_len"]
    commons = [[rng.randrange(vocab) for _ in range(rng.randint(1, 40))] for _ in range(4)]
    prompts, params, arrivals = {}, {}, {}
    for i in range(200):
        head = rng.choice(commons) if rng.random() < 0.6 else []
        prompt = (head + [rng.randrange(vocab) for _ in range(rng.randint(1, 30))])[:max_len - 2]
        name = f"r{i}"
        prompts[name] = prompt
        max_tokens = rng.choice([None, rng.randint(1, max_len - len(prompt))])
        min_tokens = min(rng.choice([0, 0, 2]), max_tokens or 2)
        params[name] = {"max_tokens": max_tokens, "min_tokens": min_tokens,
                        "ignore_eos": rng.random() < 0.2}
        arrivals.setdefault(rng.randint(0, 300), []).append(name)
    sched = make_scheduler(**cfg)
    seqs = {k: new_seq(k, prompts[k], **params[k]) for k in prompts}
    aborted = set()

    def abort(i, sched, out):
        live = list(sched.running) + list(sched.waiting)
        if live and rng.random() < 0.05:
            victim = rng.choice(live)
            sched.finish(victim, ABORTED)
            aborted.add(victim.request_id)

    model = FakeModel(sched, lambda s: hash_model(s, 50))
    run(sched, arrivals={i: [seqs[k] for k in ks] for i, ks in arrivals.items()}, model=model,
        abort=abort, overlap=overlap)
    # The length cap the scheduler applies (the pool; one step's budget without chunking).
    cap = min(max_len, (cfg["num_blocks"] - 1) * cfg["block_size"])
    if not cfg["chunked"]:
        cap = min(cap, cfg["max_num_batched_tokens"])
    ref = reference_tokens(prompts, params, eos=(0,), max_model_len=cap,
                           next_token=model.next_token)
    for k, seq in seqs.items():
        assert seq.is_finished
        if k in aborted:
            assert seq.status == ABORTED
            assert ref[k][:seq.num_tokens] == seq.token_ids  # a prefix of the full answer
        else:
            assert seq.token_ids == ref[k], k
    assert aborted
    return sched


def test_twins_admitted_in_one_step_share_the_prompt_blocks():
    """n > 1: the samples of one prompt share its full blocks from the very first step."""
    sched = make_scheduler(num_blocks=32, block_size=4)
    model = FakeModel(sched)
    twins = [new_seq("r", range(10), max_tokens=3) for _ in range(3)]
    for s in twins:
        sched.add(s)
    out, _ = step(sched, model)
    assert [it.num_new_tokens for it in out.scheduled] == [10, 2, 2]
    assert twins[1].block_table[:2] == twins[0].block_table[:2] == twins[2].block_table[:2]
    assert twins[1].num_cached_tokens == 8
    run(sched, model=model)
    assert all(s.num_output_tokens == 3 for s in twins)
    check_all_released(sched)


# ---- async scheduling: PENDING tokens ------------------------------------------------------

def test_pending_token_is_decoded_before_it_is_known_and_resolved_in_order():
    sched = make_scheduler(block_size=4)
    seq = new_seq("r", range(7), max_tokens=3)
    sched.add(seq)
    first = sched.schedule()
    sched.advance(first)  # prefill launched: its token is PENDING
    assert seq.token_ids[-1] == PENDING and seq.num_pending == 1 and seq.output_token_ids == []
    second = sched.schedule()  # the decode of the PENDING token is scheduled at once
    assert [(it.start, it.num_new_tokens) for it in second.scheduled] == [(7, 1)]
    sched.advance(second)
    assert seq.num_pending == 2
    # 8 resolved tokens would fill block 1; it must not be cached while a token is unknown.
    assert len(seq.block_hashes) == 1
    sched.resolve(first, {seq.seq_id: 100})
    assert seq.token_ids[7] == 100 and seq.num_pending == 1 and seq.output_token_ids == [100]
    assert len(seq.block_hashes) == 2
    third = sched.schedule()
    sched.advance(third)
    assert sched.schedule().is_empty  # its third token (PENDING) surely ends it: max_tokens=3
    sched.resolve(second, {seq.seq_id: 101})
    sched.resolve(third, {seq.seq_id: 102})
    assert seq.status == LENGTH and seq.output_token_ids == [100, 101, 102]
    check_all_released(sched)


def test_a_sequence_stopped_while_its_next_step_runs_drops_that_token():
    sched = make_scheduler(block_size=4, eos=(2,))
    seq = new_seq("r", [1, 1, 1], max_tokens=10)
    sched.add(seq)
    first = sched.schedule()
    sched.advance(first)
    second = sched.schedule()
    sched.advance(second)
    sched.resolve(first, {seq.seq_id: 2})  # EOS: finished while `second` runs
    assert seq.status == STOPPED and seq.token_ids == [1, 1, 1, 2] and seq.num_pending == 0
    sched.resolve(second, {seq.seq_id: 5})  # ignored
    assert seq.token_ids == [1, 1, 1, 2]
    check_all_released(sched)


def test_a_preempted_sequence_waits_for_its_pending_token():
    sched = make_scheduler(num_blocks=4, block_size=4, prefix=False)  # 3 usable blocks
    a, b = new_seq("a", range(4), max_tokens=8), new_seq("b", range(4), max_tokens=8)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    sched.advance(out)  # one block each; both sampled, so both end in a PENDING token
    nxt = sched.schedule()  # each needs a second block for its 5th token; one is left: b goes
    assert nxt.preempted == [b] and b.num_pending == 1 and b.block_table == []
    sched.advance(nxt)
    sched.finish(a, ABORTED)  # the pool is empty now, yet b must wait: its 5th token is unknown
    assert sched.schedule().is_empty
    sched.resolve(out, {a.seq_id: 9, b.seq_id: 8})
    assert b.token_ids == [0, 1, 2, 3, 8] and b.num_pending == 0
    again = sched.schedule()  # recomputed from its known tokens
    assert [(it.seq, it.start, it.num_new_tokens) for it in again.scheduled] == [(b, 0, 5)]
