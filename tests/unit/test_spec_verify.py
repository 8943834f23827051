"""The verify step's acceptance rules (spec/verify.py) against exact distributions.

A tiny "model" with a vocabulary of 5: a Markov chain whose next-token distribution depends on
the last token only, so the exact probability of any continuation is known. Generation runs
verify steps with deterministic drafts (as the n-gram proposer's) until 3 tokens are out; over
many seeded samples the 3-token continuations must follow the chain (a chi-square test at
p = 0.001, with fixed seeds so it cannot flake). A rule with a known bug must fail the same test.
"""
from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import torch

import nextok.spec.verify as verify
from nextok.sampling_params import SamplingParams
from nextok.spec.ngram import NgramProposer
from nextok.worker.sampler import Sampler

V, START, LENGTH, SAMPLES = 5, 2, 3, 10000


def _chain() -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    p = torch.rand(V, V, generator=g) ** 2 + 0.02
    return p / p.sum(dim=1, keepdim=True)  # [V, V]: P[a, b] = p(next = b | last = a)


def _item(seq_tokens, draft, params, seq_id=0):
    seq = SimpleNamespace(seq_id=seq_id, params=params, token_ids=seq_tokens)
    return SimpleNamespace(seq=seq, draft=draft)


def _generate(chain, gen, draft_of) -> tuple[int, ...]:
    """Verify steps until LENGTH tokens follow START; drafts from draft_of(tokens)."""
    params = SamplingParams(temperature=1.0, max_tokens=LENGTH)
    tokens = [START]
    while len(tokens) - 1 < LENGTH:
        draft = draft_of(tokens)
        rows = [tokens[-1]] + draft  # row i scores the token after rows[i]
        logits = chain[rows].log()
        out = verify.verify_drafts(logits, [(_item(tokens, draft, params), list(range(len(rows))))],
                                   [gen], Sampler())
        tokens += out[0]
    return tuple(tokens[1:LENGTH + 1])


def _chi_square(chain, draft_of, seed: int) -> tuple[float, float]:
    """(statistic, critical value at p = 0.001) of SAMPLES continuations against the chain."""
    gen = torch.Generator().manual_seed(seed)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(SAMPLES):
        t = _generate(chain, gen, draft_of)
        counts[t] = counts.get(t, 0) + 1
    cells = []  # (observed, expected); continuations expected < 5 times are pooled in one cell
    pooled = [0, 0.0]
    for t in itertools.product(range(V), repeat=LENGTH):
        p, last = 1.0, START
        for tok in t:
            p, last = p * chain[last, tok].item(), tok
        if p * SAMPLES < 5:
            pooled[0] += counts.get(t, 0)
            pooled[1] += p * SAMPLES
        else:
            cells.append((counts.get(t, 0), p * SAMPLES))
    cells.append(tuple(pooled))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    z = 3.090  # the normal quantile of 0.999; Wilson-Hilferty for the chi-square quantile
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, crit


def _drafts(tokens):  # deterministic, often right and often wrong: (last + 1) % V, twice
    return [(tokens[-1] + 1) % V, (tokens[-1] + 2) % V]


def test_speculative_sampling_keeps_the_target_distribution():
    stat, crit = _chi_square(_chain(), _drafts, seed=0)
    assert stat < crit, f"chi-square {stat:.1f} >= {crit:.1f}: the samples do not follow the target"


def test_the_chi_square_test_catches_a_wrong_rule(monkeypatch):
    """Sampling the rejected position from p itself (forgetting to remove the draft token) skews
    the distribution; the same test must see it."""
    def wrong(probs, draft, gen):
        u = torch.rand(len(draft), generator=gen).tolist()
        kept = 0
        while kept < len(draft) and u[kept] < probs[kept, draft[kept]].item():
            kept += 1
        return draft[:kept] + [verify._sample(probs[kept], gen)]

    monkeypatch.setattr(verify, "_speculative_sample", wrong)
    stat, crit = _chi_square(_chain(), _drafts, seed=0)
    assert stat > crit


def test_seeded_sampling_is_reproducible_and_greedy_keeps_the_agreeing_prefix():
    chain = _chain()
    runs = [_generate(chain, torch.Generator().manual_seed(5), _drafts) for _ in range(2)]
    assert runs[0] == runs[1]
    # Greedy: row i's argmax decides; drafts kept while they agree, then the target's token.
    greedy = SamplingParams(temperature=0.0)
    logits = torch.full((4, V), -5.0)
    logits[0, 3] = logits[1, 4] = logits[2, 0] = logits[3, 1] = 5.0
    item = _item([1], [3, 4, 2], greedy, seq_id=7)
    assert verify.verify_drafts(logits, [(item, [0, 1, 2, 3])], [None], Sampler()) == {7: [3, 4, 0]}
    item = _item([1], [3, 4, 0], greedy, seq_id=7)
    assert verify.verify_drafts(logits, [(item, [0, 1, 2, 3])], [None], Sampler()) == {7: [3, 4, 0, 1]}


def test_ngram_proposer():
    p = NgramProposer(1, 3)
    assert p.propose([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]  # "1 2" seen before: what followed it
    assert p.propose([1, 2, 3, 9, 2, 3, 7, 2, 3], 2) == [7, 2]  # the most recent occurrence
    assert p.propose([5, 6, 7], 2) == []  # nothing repeats
    assert p.propose([4, 4, 4], 5) == [4, 4, 4, 4]  # a repeat continues past the end (cap 4)
    assert NgramProposer(2, 2).propose([1, 2, 9, 2], 2) == []  # "9 2" never seen before


def test_ngram_proposer_prefers_the_longest_match():
    # "2 3" last followed by 6, but "1 2 3" occurred too, followed by 5: the longer match wins
    assert NgramProposer(1, 8).propose([1, 2, 3, 5, 9, 2, 3, 6, 1, 2, 3], 2) == [5, 9]
    # with n_max = 2 both are 2-token matches: the most recent wins
    assert NgramProposer(1, 2).propose([1, 2, 3, 5, 9, 2, 3, 6, 1, 2, 3], 2) == [6, 1]


def test_ngram_draft_length_follows_the_match_length():
    p = NgramProposer(1, 8)
    assert p.propose([7, 8, 9, 7], 4) == [8]  # a 1-token match: 1 token
    assert p.propose([1, 2, 3, 4, 5, 6, 7, 1, 2], 7) == [3, 4, 5, 6]  # 2 tokens: at most 4
    assert p.propose([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4], 7) == [5, 6, 7, 8, 9, 1, 2]  # 4: k
    assert p.propose([1, 2, 3, 4, 5, 6, 7, 1, 2], 2) == [3, 4]  # never more than k


def test_ngram_draft_continues_a_loop_past_the_end():
    # period 3, matched over 4 tokens: k tokens of the loop, not only the 2 left before the end
    assert NgramProposer(1, 8).propose([5, 6, 7, 5, 6, 7, 5], 7) == [6, 7, 5, 6, 7, 5, 6]


def test_ngram_takes_a_never_seen_token_for_a_substitution():
    p = NgramProposer(1, 8)
    # "1 2 3" occurred followed by 4 5 6; now "1 2 3" is followed by 9, never seen: 9 replaced 4,
    # so what followed 4 comes next (at most SUB_DRAFT_CAP = 2 tokens)
    assert p.propose([1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 9], 7) == [5, 6]
    assert p.propose([1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 9], 1) == [5]  # never more than k
    assert p.propose([8, 2, 3, 4, 5, 6, 0, 1, 2, 3, 9], 7) == []  # only "2 3" before it: too short
    assert p.propose([9, 1, 2, 3, 4], 7) == []  # a never-seen token with nothing before it
