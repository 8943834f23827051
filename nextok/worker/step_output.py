"""What a model step hands back: the sampled tokens (a verify step's accepted list), logprobs,
and the hidden rows a Medusa proposer reads (worker/model_runner.py fills them)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SeqLogprobs:
    logprob: float  # of the sampled token
    top: list[tuple[int, float]]  # (token id, logprob), best first


@dataclass
class LastHidden:
    """For a proposer that drafts from the target's hidden states (spec/medusa.py): per sequence
    that got tokens in a step, the final hidden state (after the norm) of the row whose logits
    gave its newest token: a decode or prefill's last row, a verify step's last accepted row."""
    seq_ids: list[int]
    positions: list[int]  # each row's position (the sequence's length - 2 once its token is in)
    rows: torch.Tensor  # [N, hidden], a copy (never a CUDA graph's output buffer)


@dataclass
class ModelOutput:
    # seq_id -> token id; for a verify step (speculative decoding) the list of its tokens
    sampled: dict[int, int | list[int]] = field(default_factory=dict)
    logprobs: dict[int, SeqLogprobs] = field(default_factory=dict)  # for seqs that asked
    hidden: LastHidden | None = None  # only when the proposer reads hidden states


@dataclass
class LaunchedStep:
    """A step whose work is queued on the device; `collect` waits for its results."""
    seqs: list  # the sampling sequences, in the row order of the results
    results: dict[str, torch.Tensor]  # sampled [S], logprobs [S], top_ids / top_logprobs [S, K]
    done: object = None  # a CUDA event recorded after the copies to (pinned) host memory
    verified: dict[int, list[int]] = field(default_factory=dict)  # verify steps' tokens (host)
    hidden: LastHidden | None = None
