"""Medusa speculative decoding on the real model (issue 8): greedy output with --speculative
medusa equals output without it, in batches mixing speculating and non-speculating requests, and
with preemption forced by a small KV pool; no block leaks. Correctness must not depend on how good
the heads are: they are trained here for a few dozen steps (a few seconds), never read from a file
in the repository. The hidden state the runner hands the proposer is the model's own at the row
that gave each sequence's newest token."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nextok import SamplingParams
from tests.e2e.test_invariants import _assert_no_leak, _tokens
from tests.e2e.test_speculative import GREEDY, PENALISED, WITH_LOGPROBS
from tests.prompts import PROMPTS


@pytest.fixture(scope="module")
def heads_dir(llm_f32, tmp_path_factory):
    from nextok.spec.medusa_train import train

    out = tmp_path_factory.mktemp("medusa-heads")
    args = SimpleNamespace(out=str(out), data="code", steps=24, heads=4, projection="shared",
                           labels="data", lr=3e-3, batch=4, seq_len=64, generate=0, pool_windows=16,
                           windows_per_file=2, val_windows=2, seed=0)
    train(llm_f32, args)
    return str(out)


def _medusa(make_llm, heads_dir, **kw):
    return make_llm(speculative="medusa", medusa_heads=heads_dir,
                    num_speculative_tokens=kw.pop("k", 4), speculative_disable_batch_size=64, **kw)


def test_greedy_with_medusa_equals_without(llm_f32, make_llm, heads_dir):
    """All 20 prompts in one batch; every third request carries a penalty or logprobs and so
    does not speculate (the reference is batched too: batched == one at a time is its own
    invariant, test_invariants.py)."""
    spec = _medusa(make_llm, heads_dir)
    params = [PENALISED if i % 3 == 1 else WITH_LOGPROBS if i % 3 == 2 else GREEDY
              for i in range(len(PROMPTS))]
    ref = _tokens(llm_f32.generate(PROMPTS, params))
    out = spec.generate(PROMPTS, params)
    assert _tokens(out) == ref
    assert all(o.outputs[0].logprobs for o, sp in zip(out, params) if sp is WITH_LOGPROBS)
    stats = spec.engine.spec_stats
    assert stats["steps"] > 0 and stats["accepted"] > 0
    assert spec.engine.stats()["spec_method"] == "medusa"  # the metrics' method label
    _assert_no_leak(spec)


def test_fewer_drafts_than_heads_one_at_a_time(llm_f32, make_llm, heads_dir):
    ref = _tokens(llm_f32.generate(PROMPTS[:4], GREEDY))
    spec = _medusa(make_llm, heads_dir, k=2)
    assert [_tokens(spec.generate([p], GREEDY))[0] for p in PROMPTS[:4]] == ref
    stats = spec.engine.spec_stats
    assert 0 < stats["proposed"] <= 2 * stats["steps"]
    _assert_no_leak(spec)


def test_preemption_with_medusa(llm_f32, make_llm, heads_dir):
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    ref = _tokens(llm_f32.generate(PROMPTS[:12], params))
    tiny = _medusa(make_llm, heads_dir, num_kv_blocks=16, enable_prefix_caching=False)  # 240 tokens
    assert _tokens(tiny.generate(PROMPTS[:12], params)) == ref
    assert tiny.engine.scheduler.num_preemptions > 0
    assert tiny.engine.spec_stats["accepted"] > 0
    _assert_no_leak(tiny)


def test_proposer_gets_the_models_hidden_state_of_each_newest_token(llm_f32, make_llm, heads_dir):
    """Each row handed over after a step (prefill, decode or verify) is, to float32 rounding,
    the model's hidden state at its recorded position of the finished sequence, and that
    position is the one before the sequence's newest token at the time."""
    from nextok.eval.ppl import WindowScorer

    spec = _medusa(make_llm, heads_dir)
    proposer = spec.engine.proposer
    seen = []
    observe = proposer.observe
    proposer.observe = lambda hidden: (seen.append(hidden), observe(hidden))
    try:
        for prompt in PROMPTS[:2]:
            seen.clear()
            out = spec.generate([prompt], SamplingParams(temperature=0.0, max_tokens=32))[0]
            ids = out.prompt_token_ids + out.outputs[0].token_ids
            full = WindowScorer(llm_f32, len(ids) + 1).hidden(torch.tensor(ids))  # [len, hidden]
            positions = [p for h in seen for p in h.positions]
            rows = torch.cat([h.rows for h in seen])
            assert positions[0] == len(out.prompt_token_ids) - 1  # the prefill's last row
            assert max(positions) == len(ids) - 2 and positions == sorted(positions)
            assert len(positions) < len(out.outputs[0].token_ids)  # verify steps kept several
            torch.testing.assert_close(rows, full[positions], atol=2e-3, rtol=1e-3)
    finally:
        proposer.observe = observe
    _assert_no_leak(spec)
