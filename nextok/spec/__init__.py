"""Speculative decoding: a proposer guesses the next few tokens of a sequence; one forward pass
of the target scores them all (the verify step), and the longest prefix the target agrees with
is kept, plus one token of the target's own (spec/verify.py). Greedy output is exactly that of
decoding without speculation; sampled output keeps the target's distribution.

The engine asks the proposer for drafts before each step (engine.py), the scheduler gives a
decoding sequence 1 + len(draft) tokens to compute (scheduler.py), and the runner scores them
and returns the accepted tokens (worker/model_runner.py).

A proposer has `name` and either `propose(token_ids, k) -> tokens` (one sequence: ngram.py) or
`propose_batch(seqs, k) -> {seq_id: tokens}` (every speculating sequence of the step at once:
a model's forward passes are batched, draft.py); one with per-sequence state also has
`release(seq_ids)`, which the engine calls when a sequence ends, is aborted or is preempted.
Medusa (spec/medusa.py) drafts from heads trained by `nextok train medusa` on the target's last
hidden state; the runner then returns each sequence's last hidden state after every step.
"""
from __future__ import annotations

from nextok.config import ModelConfig, SpeculativeConfig
from nextok.errors import NextokError
from nextok.spec.ngram import NgramProposer

METHODS = ("ngram", "draft", "self-draft", "medusa")
MODEL_METHODS = ("draft", "self-draft")  # a model drafts: spec/draft.py
MAX_SPECULATIVE_TOKENS = 15  # a verify step of one sequence stays within 16 rows
# self-draft's default depth: all layers but the last SELF_DRAFT_SKIPPED_LAYERS. Measured on
# SmolLM2-135M (30 layers, not trained to exit early; benchmarks/results/
# 2026-12-04-spec-cpu-self-draft.md, code, K = 4): acceptance is 1% for L = 4..16, 2% at 20,
# 10% at 24 and 18% at 28 (21% on edits), so only the last layers make drafts the target keeps.
# No L pays on that model (TPOT 0.24x-0.40x of no speculation: each draft step costs L layers
# plus the 49k-row lm_head); 28 is as cheap per token as 8 and the only depth whose drafts count.
# A model trained for early exit (LayerSkip) should be given its exit layer instead.
SELF_DRAFT_SKIPPED_LAYERS = 2


def check_config(cfg: SpeculativeConfig) -> None:
    """Raise NextokError for options that cannot run, before any model loads."""
    if cfg.draft_model is not None and cfg.method != "draft":
        raise NextokError(f"--draft-model is an option of --speculative draft, not of "
                          f"--speculative {cfg.method or '(off)'}")
    if cfg.self_draft_layers is not None and cfg.method != "self-draft":
        raise NextokError(f"--self-draft-layers is an option of --speculative self-draft, not of "
                          f"--speculative {cfg.method or '(off)'}")
    if cfg.medusa_heads is not None and cfg.method != "medusa":
        raise NextokError(f"--medusa-heads is an option of --speculative medusa, not of "
                          f"--speculative {cfg.method or '(off)'}")
    if cfg.draft_num_blocks is not None and cfg.method not in MODEL_METHODS:
        raise NextokError("--draft-num-kv-blocks is an option of --speculative draft / self-draft")
    if cfg.method is None:
        return
    if cfg.method not in METHODS:
        raise NextokError(f"unknown --speculative method {cfg.method!r}; supported: {', '.join(METHODS)}")
    if cfg.method == "draft" and not cfg.draft_model:
        raise NextokError("--speculative draft needs --draft-model PATH (a smaller model with the "
                          "target's tokenizer)")
    if cfg.draft_num_blocks is not None and cfg.draft_num_blocks < 2:
        raise NextokError(f"--draft-num-kv-blocks must be >= 2, got {cfg.draft_num_blocks}")
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


def self_draft_layers(cfg: SpeculativeConfig, model: ModelConfig) -> int:
    """The target layers self-draft runs: in [1, num_layers - 1] (all of them would be the
    target itself, at the target's cost)."""
    num = model.num_hidden_layers
    layers = cfg.self_draft_layers
    if layers is None:
        layers = max(1, num - SELF_DRAFT_SKIPPED_LAYERS)
    if not 1 <= layers <= num - 1:
        raise NextokError(f"--self-draft-layers must be in [1, {num - 1}] for this {num}-layer "
                          f"model, got {layers}")
    return layers


def make_proposer(cfg: SpeculativeConfig, runner=None, num_blocks: int = 0, max_model_len: int = 0,
                  draft=None):
    """The proposer for cfg.method, or None when speculation is off. Model methods take the
    target's runner, its pool size and context; `draft` also the draft's DraftCheckpoint
    (spec/draft_model.py)."""
    check_config(cfg)
    if cfg.method is None:
        return None
    if cfg.method == "ngram":
        return NgramProposer(cfg.ngram_min, cfg.ngram_max)
    if cfg.method == "medusa":  # heads checked against the target, projected by its lm_head
        from nextok.spec.medusa import MedusaProposer

        return MedusaProposer.load(cfg.medusa_heads, runner.model if runner is not None else None)
    from nextok.spec.draft import DraftModelProposer

    if runner is None:
        raise NextokError(f"--speculative {cfg.method} needs the model runner (engine/factory.py)")
    blocks = cfg.draft_num_blocks or num_blocks
    chunk = runner.config.scheduler.max_num_batched_tokens
    if cfg.method == "self-draft":
        layers = self_draft_layers(cfg, runner.config.model)
        return DraftModelProposer(cfg.method, runner, layers, blocks, max_model_len, chunk)
    from nextok.spec.draft_model import draft_runner

    drunner = draft_runner(runner.config, draft, max_model_len)
    return DraftModelProposer(cfg.method, drunner, draft.model.num_hidden_layers, blocks,
                              max_model_len, chunk)
