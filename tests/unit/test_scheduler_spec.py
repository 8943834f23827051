"""The scheduler with speculative drafts (issue 8): drafts are cut to the budget, the context and
max_tokens; a verify step's accepted tokens are appended as decode steps would append them, the
rest of its KV is dropped; runs give the tokens of runs without drafts, with preemption; no leak."""
from __future__ import annotations

import random

from nextok.engine.scheduler import SchedulerOutput
from nextok.engine.sequence import Sequence
from tests.unit.test_scheduler import check_output, hash_model, make_scheduler, new_seq


def _next(tokens: list[int]) -> int:
    view = Sequence("v", tokens, new_seq("v", [1]).params)
    return hash_model(view, vocab=50)


def _execute(out: SchedulerOutput) -> dict:
    """Greedy verify against the fake model: keep drafts while they equal its next token."""
    sampled = {}
    for it in out.scheduled:
        seq = it.seq
        assert len(seq.block_table) * 4 >= it.start + it.num_new_tokens  # room for the drafts
        if not it.samples:
            continue
        tokens = list(seq.token_ids)
        emitted = []
        for d in it.draft:
            t = _next(tokens)
            if d != t:
                break
            emitted.append(t)
            tokens.append(t)
        emitted.append(_next(tokens))
        sampled[seq.seq_id] = emitted if it.draft else emitted[0]
    return sampled


def _run(drafts_of, num_blocks=64, budget=64, prompts=None, max_tokens=20) -> list[list[int]]:
    sched = make_scheduler(num_blocks=num_blocks, max_num_batched_tokens=budget)
    rng = random.Random(0)
    prompts = prompts or [[rng.randrange(50) for _ in range(rng.randrange(3, 12))] for _ in range(6)]
    seqs = [new_seq(f"r{i}", p, max_tokens=max_tokens) for i, p in enumerate(prompts)]
    for s in seqs:
        sched.add(s)
    steps = 0
    while sched.has_unfinished():
        drafts = {s.seq_id: drafts_of(s) for s in sched.running}
        out = sched.schedule(drafts)
        check_output(sched, out)
        for it in out.scheduled:
            assert not it.draft or it.num_new_tokens == 1 + len(it.draft)
            if it.draft:
                assert it.seq.params.max_tokens - it.seq.num_output_tokens >= len(it.draft) + 1
        sched.update(out, _execute(out))
        sched.block_manager.check_integrity(live=sched.running)
        steps += 1
        assert steps < 2000
    bm = sched.block_manager
    assert bm.num_free_blocks == bm.num_blocks - 1
    return [s.output_token_ids for s in seqs], sched


def _oracle(n: int):
    """Drafts of n tokens: right for the first half of the sequences, wrong at position 2 for
    the others (so verify steps keep 0, 1 or all of them)."""
    def drafts(seq):
        tokens, out = list(seq.token_ids), []
        for i in range(n):
            t = _next(tokens)
            if seq.seq_id % 2 and i == 1:
                t = (t + 1) % 50
            out.append(t)
            tokens.append(t)
        return out
    return drafts


def test_drafts_give_the_tokens_of_plain_decoding():
    ref, _ = _run(lambda s: [])
    for k in (1, 3, 6):
        got, sched = _run(_oracle(k))
        assert got == ref
        assert all(len(t) == 20 for t in got)
    # a small pool: preemption happens while drafts are in flight
    got, sched = _run(_oracle(4), num_blocks=12)
    assert got == ref and sched.num_preemptions > 0
    # a small budget cuts the drafts
    got, _ = _run(_oracle(6), budget=5)
    assert got == ref


def test_drafts_are_cut_to_max_tokens_and_budget():
    sched = make_scheduler(max_num_batched_tokens=64)
    seq = new_seq("a", [1, 2, 3], max_tokens=3)
    sched.add(seq)
    out = sched.schedule()
    sched.update(out, {seq.seq_id: 7})  # prefill: 1 output token, 2 more allowed
    out = sched.schedule({seq.seq_id: [5, 6, 7, 8]})
    (it,) = out.scheduled
    assert it.draft == [5] and it.num_new_tokens == 2  # +1 own token = max_tokens
    finished = sched.update(out, {seq.seq_id: [5, 9]})
    assert finished == [seq] and seq.output_token_ids == [7, 5, 9]
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks - 1
    sched = make_scheduler(max_num_batched_tokens=3)
    seq = new_seq("b", [1], max_tokens=10)
    sched.add(seq)
    sched.update(sched.schedule(), {seq.seq_id: 4})
    out = sched.schedule({seq.seq_id: [1, 2, 3, 4]})
    assert out.scheduled[0].draft == [1, 2]  # 1 + 2 tokens = the budget


def test_a_stop_token_inside_the_accepted_drafts_ends_there():
    sched = make_scheduler(eos=(42,))
    seq = new_seq("a", [1, 2], max_tokens=10)
    sched.add(seq)
    sched.update(sched.schedule(), {seq.seq_id: 3})
    out = sched.schedule({seq.seq_id: [42, 5, 6]})
    sampled = {seq.seq_id: [42, 5, 6, 7]}
    finished = sched.update(out, sampled)
    assert finished == [seq] and seq.output_token_ids == [3, 42]
    assert sampled[seq.seq_id] == [42]  # cut where the sequence ended
