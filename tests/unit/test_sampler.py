"""Sampler unit tests on hand-made logits: each stage alone, then mixed batches and seeds."""
from __future__ import annotations

import math

import pytest
import torch

from nextok.sampling_params import SamplingParams
from nextok.worker.sampler import Sampler, SamplingMetadata

V = 8


def meta_for(params, prompts=None, outputs=None, seeds=None, suppress=None, vocab=V):
    n = len(params)
    gens = [None if s is None else torch.Generator().manual_seed(s) for s in (seeds or [None] * n)]
    return SamplingMetadata.build(params, prompts or [[0]] * n, outputs or [[]] * n, gens,
                                  suppress or [[]] * n, vocab, "cpu")


def logits_from_probs(probs) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float32).log().unsqueeze(0)


def draw_many(logits, params, draws, seed=0):
    """Samples `draws` times one row, with one seeded generator carried across draws."""
    meta = meta_for([params], seeds=[seed])
    sampler = Sampler()
    return [int(sampler(logits, meta).sampled[0]) for _ in range(draws)]


def test_greedy_is_argmax():
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(1))
    out = Sampler()(logits, meta_for([SamplingParams(temperature=0.0)] * 5))
    assert out.sampled.tolist() == logits.argmax(-1).tolist()
    assert out.logprobs is None and out.top_ids is None


def test_mixed_batch_greedy_rows_stay_argmax():
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.5),
              SamplingParams(temperature=0.0, top_p=0.3), SamplingParams(temperature=0.9, top_k=3)]
    for _ in range(20):
        out = Sampler()(logits, meta_for(params)).sampled
        assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()
        assert int(out[3]) in logits[3].topk(3).indices.tolist()


def test_logit_bias_and_suppression():
    logits = torch.zeros(2, V)
    logits[:, 3] = 5.0
    params = [SamplingParams(temperature=0.0, logit_bias={6: 100.0}), SamplingParams(temperature=0.0)]
    out = Sampler()(logits, meta_for(params, suppress=[[], [3]]))
    assert out.sampled.tolist()[0] == 6
    assert out.sampled.tolist()[1] != 3  # suppressed although it is the largest
    # A bias of -100 removes a token from sampling too.
    biased = Sampler.apply_penalties(logits, meta_for([SamplingParams(logit_bias={3: -100.0})] * 2))
    assert biased[0, 3] == -95.0 and biased[1, 3] == -95.0


def test_repetition_penalty_divides_positive_multiplies_negative():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0, 1.0, 1.0, 1.0]])
    p = SamplingParams(repetition_penalty=2.0)
    out = Sampler.apply_penalties(logits, meta_for([p], prompts=[[0]], outputs=[[1, 1]]))
    assert out[0].tolist() == [1.0, -4.0, 2.0, -2.0, 1.0, 1.0, 1.0, 1.0]


def test_frequency_and_presence_penalties_count_output_only():
    logits = torch.zeros(1, V)
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=1.0)
    out = Sampler.apply_penalties(logits, meta_for([p], prompts=[[4, 4, 4]], outputs=[[2, 2, 2, 5]]))
    assert out[0, 2] == pytest.approx(-0.5 * 3 - 1.0)
    assert out[0, 5] == pytest.approx(-0.5 - 1.0)
    assert out[0, 4] == 0.0  # prompt tokens are not penalised by frequency/presence


def test_penalties_apply_only_to_their_row():
    logits = torch.ones(2, V)
    params = [SamplingParams(frequency_penalty=1.0, repetition_penalty=2.0), SamplingParams()]
    out = Sampler.apply_penalties(logits, meta_for(params, outputs=[[1], [1]]))
    assert out[0, 1] == pytest.approx(0.5 - 1.0)
    assert out[1].tolist() == [1.0] * V


def test_top_k_only_draws_from_the_k_best():
    probs = [0.3, 0.25, 0.2, 0.1, 0.05, 0.05, 0.03, 0.02]
    seen = set(draw_many(logits_from_probs(probs), SamplingParams(top_k=2), 300))
    assert seen == {0, 1}


def test_top_p_keeps_smallest_set_reaching_p():
    probs = [0.4, 0.3, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0]
    seen = set(draw_many(logits_from_probs(probs), SamplingParams(top_p=0.5), 300))
    assert seen == {0, 1}  # 0.4 < 0.5, so the second token is needed; the third is not
    seen = set(draw_many(logits_from_probs(probs), SamplingParams(top_p=0.05), 50))
    assert seen == {0}  # the most likely token always stays


def test_top_k_and_top_p_together():
    probs = [0.2, 0.2, 0.2, 0.2, 0.2, 0.0, 0.0, 0.0]
    seen = set(draw_many(logits_from_probs(probs), SamplingParams(top_k=3, top_p=0.9), 400))
    assert seen <= {0, 1, 2} and len(seen) >= 2  # ties broken by sort order, at most 3 kept


def test_min_p_drops_tokens_below_fraction_of_max():
    probs = [0.5, 0.3, 0.12, 0.08, 0.0, 0.0, 0.0, 0.0]
    seen = set(draw_many(logits_from_probs(probs), SamplingParams(min_p=0.2), 400))
    assert seen == {0, 1, 2}  # threshold 0.1


def test_sampling_follows_the_distribution():
    probs = [0.5, 0.25, 0.15, 0.1, 0.0, 0.0, 0.0, 0.0]
    draws = draw_many(logits_from_probs(probs), SamplingParams(temperature=1.0), 4000, seed=7)
    freq = [draws.count(i) / len(draws) for i in range(4)]
    for f, p in zip(freq, probs):
        assert abs(f - p) < 4 * math.sqrt(p * (1 - p) / len(draws)) + 1e-9


def test_temperature_sharpens_and_flattens():
    probs = [0.6, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    cold = draw_many(logits_from_probs(probs), SamplingParams(temperature=0.1), 500)
    hot = draw_many(logits_from_probs(probs), SamplingParams(temperature=5.0), 2000)
    assert cold.count(0) / 500 > 0.97  # 0.6^10 / (0.6^10 + 0.4^10) ~ 0.98
    assert 0.45 < hot.count(0) / 2000 < 0.6  # close to uniform over the two


def test_same_seed_same_tokens_whatever_the_batch():
    gen = torch.Generator().manual_seed(3)
    steps = [torch.randn(6, V, generator=gen) for _ in range(10)]
    p = SamplingParams(temperature=1.0, seed=42)
    alone, batched = [], []
    sampler = Sampler()
    m_alone = meta_for([p], seeds=[42])
    others = [SamplingParams(temperature=0.7), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.3, seed=5), SamplingParams(top_p=0.5)]
    m_batch = meta_for(others[:2] + [p] + others[2:], seeds=[None, None, 42, 5, None])
    for logits in steps:
        alone.append(int(sampler(logits[2:3], m_alone).sampled[0]))
        batched.append(int(sampler(logits[:5], m_batch).sampled[2]))
    assert alone == batched
    assert len(set(alone)) > 1  # it really sampled


def test_logprobs_are_of_raw_logits_with_top_alternatives():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(4))
    params = [SamplingParams(temperature=0.0, logprobs=3, repetition_penalty=1.5),
              SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, logprobs=0)]
    out = Sampler()(logits, meta_for(params, outputs=[[1, 2], [], []]))
    ref = torch.log_softmax(logits, -1)
    assert out.top_ids.shape == (3, 3)
    assert out.top_ids[0].tolist() == ref[0].topk(3).indices.tolist()
    torch.testing.assert_close(out.top_logprobs[0], ref[0].topk(3).values)
    for row in range(3):
        assert float(out.logprobs[row]) == pytest.approx(float(ref[row, out.sampled[row]]), abs=1e-6)


def test_metadata_skips_inactive_stages():
    meta = meta_for([SamplingParams(temperature=0.0), SamplingParams(temperature=0.8)])
    assert meta.top_k is None and meta.top_p is None and meta.min_p is None
    assert meta.seen_mask is None and meta.output_counts is None and meta.bias_index is None
    assert not meta.all_greedy and not meta.all_random
    # Greedy rows' top_p etc. do not switch a stage on.
    meta = meta_for([SamplingParams(temperature=0.0, top_p=0.5, top_k=4)])
    assert meta.all_greedy and meta.top_p is None and meta.top_k is None


def test_top_k_larger_than_vocab_is_harmless():
    logits = torch.randn(1, V)
    out = Sampler()(logits, meta_for([SamplingParams(top_k=1000)]))
    assert 0 <= int(out.sampled[0]) < V

