"""A sequence: one prompt plus the tokens generated for it, and where the engine is with it.

Think in tokens, not phases: the engine only moves `num_computed_tokens` toward `num_tokens`.
Prefill, chunked prefill, a prefix-cache hit and decode are all "compute the next k tokens".
"""
from __future__ import annotations

import enum
import itertools

from nextok.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"  # EOS, a stop token id or a stop string
    FINISHED_LENGTH = "length"  # max_tokens or the context window
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH,
                        SequenceStatus.FINISHED_ABORTED)


_seq_counter = itertools.count()
PENDING = -1  # stands for a sampled token still on the device (async scheduling)


class Sequence:
    """Token state of one sequence. The scheduler and block manager mutate it; nothing else."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 index: int = 0, arrival: float = 0.0):
        self.seq_id = next(_seq_counter)
        self.request_id = request_id
        self.index = index  # which of the request's n samples this is
        self.params = params
        self.arrival = arrival
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.num_cached_tokens = 0  # of the prompt, found in the prefix cache at admission
        self.block_table: list[int] = []  # physical block ids; 0 is the null block (freed by the window)
        self.block_hashes: list[int] = []  # chained hashes of the full blocks registered so far
        self.status = SequenceStatus.WAITING
        self.num_preemptions = 0
        self.stop_reason: int | str | None = None
        # Trailing tokens of token_ids that are PENDING: sampled by a step still running on the
        # device. The scheduler may schedule the next step of the sequence before it knows them
        # (the runner takes the token from the device); 0 without async scheduling.
        self.num_pending = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Generated so far, PENDING ones included."""
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_resolved_tokens(self) -> int:
        return len(self.token_ids) - self.num_pending

    @property
    def output_token_ids(self) -> list[int]:
        """The generated tokens known on the host (no PENDING ones)."""
        return self.token_ids[self.num_prompt_tokens:self.num_resolved_tokens]

    def drop_pending(self) -> None:
        if self.num_pending:
            del self.token_ids[-self.num_pending:]
            self.num_pending = 0

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, req={self.request_id!r}, {self.status.value}, "
                f"computed={self.num_computed_tokens}/{self.num_tokens})")
