"""Speculative decoding: a proposer guesses the next few tokens of a sequence; one forward pass
of the target scores them all (the verify step), and the longest prefix the target agrees with
is kept, plus one token of the target's own (spec/verify.py). Greedy output is exactly that of
decoding without speculation; sampled output keeps the target's distribution.

The engine asks the proposer for drafts before each step (engine.py), the scheduler gives a
decoding sequence 1 + len(draft) tokens to compute (scheduler.py), and the runner scores them
and returns the accepted tokens (worker/model_runner.py).

Proposers: `ngram` (prompt lookup, spec/ngram.py) and `medusa` (heads trained by
`nextok train medusa` on the target's last hidden state, spec/medusa.py; the runner then
returns each sequence's last hidden state after every step).
"""
from __future__ import annotations

from nextok.config import SpeculativeConfig
from nextok.errors import NextokError
from nextok.spec.ngram import NgramProposer

METHODS = ("ngram", "medusa")
MAX_SPECULATIVE_TOKENS = 15  # a verify step of one sequence stays within 16 rows


def check_config(cfg: SpeculativeConfig) -> None:
    """Raise NextokError for options that cannot run, before any model loads."""
    if cfg.method is None:
        return
    if cfg.method not in METHODS:
        raise NextokError(f"unknown --speculative method {cfg.method!r}; supported: {', '.join(METHODS)}")
    k = cfg.num_speculative_tokens
    if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise NextokError(f"--num-speculative-tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], got {k}")
    if not 1 <= cfg.ngram_min <= cfg.ngram_max:
        raise NextokError(f"--ngram-min / --ngram-max must satisfy 1 <= min <= max, got "
                          f"{cfg.ngram_min} / {cfg.ngram_max}")
    if cfg.disable_batch_size < 1:
        raise NextokError(f"--speculative-disable-batch-size must be >= 1, got {cfg.disable_batch_size}")
    if cfg.method == "medusa":
        if not cfg.medusa_heads:
            raise NextokError("--speculative medusa needs --medusa-heads PATH (heads written by "
                              "`nextok train medusa`)")
        from nextok.spec.medusa_heads import read_metadata

        read_metadata(cfg.medusa_heads)  # missing or unreadable: fail before the model loads


def needs_hidden_states(cfg: SpeculativeConfig) -> bool:
    """Does the proposer read the target's last hidden state of each sequence after a step?"""
    return cfg.method == "medusa"


def make_proposer(cfg: SpeculativeConfig, model=None):
    """The proposer for cfg.method, or None when speculation is off. model: the target model
    (medusa heads are checked against it and project through its lm_head)."""
    check_config(cfg)
    if cfg.method is None:
        return None
    if cfg.method == "medusa":
        from nextok.spec.medusa import MedusaProposer

        return MedusaProposer.load(cfg.medusa_heads, model)
    return NgramProposer(cfg.ngram_min, cfg.ngram_max)
