"""Continuous batching: each step hands out a token budget across running and waiting sequences.

Data in, data out: `schedule() -> SchedulerOutput`, then `update(output, sampled)`. No tensors,
no device, so unit tests drive it with a fake model in milliseconds.

`update` is two halves, which async scheduling calls apart: `advance` once the step is launched
(the KV is being computed; each sampling sequence gets a PENDING token) and `resolve` once its
sampled tokens reach the host. In between, the next step may already be scheduled: a sequence
whose last token is PENDING decodes it (the runner takes it from the device), except one that
this token will surely end by length.

Policy (FCFS, as vLLM v1):
1. Running sequences first, in arrival order: each gets the tokens it still has to compute
   (1 for decode, the rest of its prompt for a chunked prefill) within the budget. If the KV
   pool cannot hold them, the most recently admitted running sequence is preempted (its blocks
   freed, to be recomputed later from its tokens: prompt + what it generated so far).
2. Then waiting sequences, in arrival order, while budget, blocks and `max_num_seqs` allow.
   A waiting sequence that does not fit blocks the ones behind it (no overtaking), and none is
   admitted in a step that had to preempt.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from nextok.config import SchedulerConfig
from nextok.engine.block_manager import BlockManager
from nextok.engine.sequence import PENDING, Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    seq: Sequence
    start: int  # first position computed this step (== num_computed_tokens when scheduled)
    num_new_tokens: int  # tokens [start, start + num_new_tokens) are computed this step
    # Speculative draft tokens, computed after the sequence's last token: the last
    # len(draft) of the num_new_tokens positions. The verify step keeps those the model agrees with.
    draft: list[int] = field(default_factory=list)
    # Does this step reach the end of the sequence, so its last logits give a new token? Fixed
    # when scheduled: once `update` appends that token, the sequence no longer ends here.
    samples: bool = field(init=False)

    def __post_init__(self) -> None:
        self.samples = self.start + self.num_new_tokens - len(self.draft) == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager,
                 eos_token_ids: tuple[int, ...] = (), sliding_window: int | None = None):
        self.config = config
        self.block_manager = block_manager
        self.eos_token_ids = frozenset(eos_token_ids)
        self.sliding_window = sliding_window
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # A sequence never grows past what can be recomputed after a preemption: the whole pool
        # (block 0 is reserved) and, without chunked prefill, one step's budget. Longer, it would
        # preempt itself and then wait forever to be readmitted, stalling everything behind it.
        self.max_seq_len = min(config.max_model_len,
                               (block_manager.num_blocks - 1) * block_manager.block_size)
        if not config.enable_chunked_prefill:
            self.max_seq_len = min(self.max_seq_len, config.max_num_batched_tokens)

    # ---- requests in and out -------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """End `seq` wherever it is (waiting or running) and release its blocks."""
        if seq.is_finished:
            return
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.drop_pending()  # tokens of steps still running are dropped with the sequence
        seq.status = status

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ------------------------------------------------------------------------
    def schedule(self, drafts: dict[int, list[int]] | None = None) -> SchedulerOutput:
        """drafts: seq_id -> proposed tokens (speculative decoding) for running sequences that
        decode; each is cut to what the budget, the context and max_tokens leave room for."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(out, budget, drafts or {})
        if not out.preempted:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int, drafts: dict[int, list[int]]) -> int:
        bm = self.block_manager
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.num_pending and self._ends_by_length(seq, seq.num_tokens):
                i += 1  # its PENDING token is its last: nothing more to compute
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            draft = self._fit_draft(seq, drafts.get(seq.seq_id), budget) if n == 1 else []
            n += len(draft)
            if self.sliding_window is not None:
                bm.free_outside_window(seq, self.sliding_window)
            while not bm.allocate(seq, n):
                victim = self.running.pop()  # lowest priority: admitted last
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, n, draft))
                bm.cache_full_blocks(seq, seq.num_computed_tokens + n - len(draft))
                budget -= n
                i += 1
        return budget

    def _fit_draft(self, seq: Sequence, draft: list[int] | None, budget: int) -> list[int]:
        """The part of a decoding sequence's draft this step can verify: within the token budget,
        the context window, and max_tokens (the step also yields one token of its own)."""
        if not draft or seq.num_pending or seq.num_tokens - seq.num_computed_tokens != 1:
            return []
        room = min(budget - 1, self.max_seq_len - seq.num_tokens - 1)
        max_tokens = seq.params.max_tokens
        if max_tokens is not None:
            room = min(room, max_tokens - seq.num_output_tokens - 1)
        return list(draft[:max(0, room)])

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if seq.num_pending:  # preempted while its step ran: recompute once its token is known
                break
            cached_ids, cached_hashes = bm.find_cached_prefix(seq)
            num_cached = len(cached_ids) * bm.block_size
            n = seq.num_tokens - num_cached
            if n > budget and not self.config.enable_chunked_prefill:
                break
            n = min(n, budget)
            if not bm.can_admit(cached_ids, num_cached + n):
                break
            self.waiting.popleft()
            bm.admit_cached(seq, cached_ids, cached_hashes)
            ok = bm.allocate(seq, n)
            assert ok, "can_admit promised room"
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, n))
            bm.cache_full_blocks(seq, seq.num_computed_tokens + n)
            budget -= n

    def _preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: drop the KV, keep the tokens, requeue at the front."""
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    # ---- results -------------------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled: dict[int, int]) -> list[Sequence]:
        """Advance every scheduled sequence; append sampled tokens (seq_id -> token id).

        Returns the sequences that finished this step (EOS, stop token, length).
        """
        self.advance(out)
        return self.resolve(out, sampled)

    def advance(self, out: SchedulerOutput) -> None:
        """The step is launched: its KV counts as computed, each sampling sequence gets a PENDING
        token (what the step will sample)."""
        for item in out.scheduled:
            seq = item.seq
            if seq.is_finished:  # aborted
                continue
            if item.draft:  # the drafts' KV counts once verified (resolve); never async
                seq.num_computed_tokens = item.start + item.num_new_tokens - len(item.draft)
                continue
            seq.num_computed_tokens = item.start + item.num_new_tokens
            self.block_manager.cache_full_blocks(seq)
            if item.samples:
                seq.token_ids.append(PENDING)
                seq.num_pending += 1

    def resolve(self, out: SchedulerOutput, sampled: dict[int, int]) -> list[Sequence]:
        """The step's tokens are known: each replaces its sequence's oldest PENDING token.
        Returns the sequences that finished (EOS, stop token, length)."""
        finished = []
        for item in out.scheduled:
            seq = item.seq
            if not item.samples or seq.is_finished:  # finished (or aborted) meanwhile
                continue
            if item.draft:
                status = self._resolve_verified(item, sampled)
                if status is not None:
                    self.finish(seq, status)
                    finished.append(seq)
                continue
            token = sampled[seq.seq_id]
            seq.token_ids[seq.num_resolved_tokens] = token
            seq.num_pending -= 1
            self.block_manager.cache_full_blocks(seq)
            status = self._check_stop(seq, token)
            if status is not None:
                self.finish(seq, status)
                finished.append(seq)
        return finished

    def _resolve_verified(self, item: ScheduledSeq, sampled: dict) -> SequenceStatus | None:
        """A verify step's tokens (sampled[seq_id]: the accepted drafts, then the model's own
        token) are appended one at a time, as decode steps would have: the first that ends the
        sequence is its last, and sampled[seq_id] is cut to what was appended. The KV of the
        accepted drafts is kept; that of the rejected ones is overwritten later."""
        seq = item.seq
        tokens = sampled[seq.seq_id]
        accepted = len(tokens) - 1
        seq.num_computed_tokens = item.start + 1 + accepted
        status = None
        for i, token in enumerate(tokens):
            seq.token_ids.append(token)
            status = self._check_stop(seq, token)
            if status is not None:
                del tokens[i + 1:]
                break
        self.block_manager.cache_full_blocks(seq)
        return status

    def _check_stop(self, seq: Sequence, token: int) -> SequenceStatus | None:
        """Does `token`, the newest resolved one, end `seq`?"""
        params = seq.params
        num_output = seq.num_resolved_tokens - seq.num_prompt_tokens
        if num_output >= params.min_tokens:
            if token in params.stop_token_ids:
                seq.stop_reason = token
                return SequenceStatus.FINISHED_STOPPED
            if token in self.eos_token_ids and not params.ignore_eos:
                return SequenceStatus.FINISHED_STOPPED
        if self._ends_by_length(seq, seq.num_resolved_tokens):
            return SequenceStatus.FINISHED_LENGTH
        return None

    def _ends_by_length(self, seq: Sequence, num_tokens: int) -> bool:
        """Does a sequence of `num_tokens` tokens (prompt included) end by length?"""
        max_tokens = seq.params.max_tokens
        if max_tokens is not None and num_tokens - seq.num_prompt_tokens >= max_tokens:
            return True
        return num_tokens >= self.max_seq_len
