"""Speculative decoding on the real model (issue 8): greedy output with speculation on equals
output with it off, in batches that mix speculating and non-speculating requests, with and
without preemption; stop rules still cut where they would; no block leaks."""
from __future__ import annotations

import pytest

from nextok import SamplingParams
from nextok.errors import NextokError
from tests.e2e.test_invariants import _assert_no_leak, _tokens
from tests.prompts import PROMPTS

GREEDY = SamplingParams(temperature=0.0, max_tokens=64)
# Not speculated (per-position sampling state): same batch, same engine
PENALISED = SamplingParams(temperature=0.0, max_tokens=64, repetition_penalty=1.3)
WITH_LOGPROBS = SamplingParams(temperature=0.0, max_tokens=64, logprobs=2)


def _spec(make_llm, **kw):
    return make_llm(speculative="ngram", num_speculative_tokens=kw.pop("k", 4),
                    speculative_disable_batch_size=kw.pop("disable", 64), **kw)


def test_greedy_with_ngram_equals_without(llm_f32, make_llm):
    spec = _spec(make_llm)
    ref = _tokens(llm_f32.generate(PROMPTS, GREEDY))
    # Mixed: every third request carries a penalty or logprobs and so does not speculate.
    params = [PENALISED if i % 3 == 1 else WITH_LOGPROBS if i % 3 == 2 else GREEDY
              for i in range(len(PROMPTS))]
    ref_mixed = _tokens(llm_f32.generate(PROMPTS, params))  # batch-invariant (test_invariants)
    before = dict(spec.engine.spec_stats)
    assert _tokens(spec.generate(PROMPTS, GREEDY)) == ref
    out = spec.generate(PROMPTS, params)
    assert _tokens(out) == ref_mixed
    assert all(o.outputs[0].logprobs for o, sp in zip(out, params) if sp is WITH_LOGPROBS)
    stats = spec.engine.spec_stats
    assert stats["steps"] > before["steps"] and stats["accepted"] > before["accepted"]
    _assert_no_leak(spec)


def test_one_at_a_time_and_k_1_equal_too(llm_f32, make_llm):
    ref = _tokens(llm_f32.generate(PROMPTS[:6], GREEDY))
    spec = _spec(make_llm, k=1)
    assert [_tokens(spec.generate([p], GREEDY))[0] for p in PROMPTS[:6]] == ref
    _assert_no_leak(spec)


def test_preemption_with_speculation(llm_f32, make_llm):
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    ref = _tokens(llm_f32.generate(PROMPTS[:12], params))
    tiny = _spec(make_llm, num_kv_blocks=16, enable_prefix_caching=False)  # 240 tokens
    assert _tokens(tiny.generate(PROMPTS[:12], params)) == ref
    assert tiny.engine.scheduler.num_preemptions > 0
    assert tiny.engine.spec_stats["accepted"] > 0
    _assert_no_leak(tiny)


def test_prefix_cache_and_stops_with_speculation(llm_f32, make_llm):
    """Accepted drafts land in cached blocks that later requests reuse; a stop string or
    max_tokens inside a verify step's tokens ends the output exactly where decoding would."""
    spec = _spec(make_llm)
    code = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return"
    cases = [SamplingParams(temperature=0.0, max_tokens=n) for n in (1, 2, 3, 7)]
    cases += [SamplingParams(temperature=0.0, max_tokens=40, stop=[s]) for s in ("\n", " b", "(")]
    for sp in cases:
        want = llm_f32.generate([code], sp)[0].outputs[0]
        got = spec.generate([code], sp)[0].outputs[0]
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
    again = spec.generate([code] * 2, GREEDY)
    assert all(o.num_cached_tokens > 0 for o in again)
    _assert_no_leak(spec)


def test_bad_speculative_options_fail_before_loading(make_llm):
    for kw, msg in (({"speculative": "medusa-x"}, "unknown --speculative"),
                    ({"speculative": "ngram", "num_speculative_tokens": 0}, "num-speculative-tokens"),
                    ({"speculative": "ngram", "num_speculative_tokens": 99}, "num-speculative-tokens"),
                    ({"speculative": "ngram", "ngram_min": 3, "ngram_max": 2}, "ngram-min")):
        with pytest.raises(NextokError, match=msg):
            make_llm(**kw)


def test_seeded_sampling_with_speculation_repeats(make_llm):
    """Per-request seeds still reproduce a sample: alone or batched (drafts depend only on the
    request's own tokens here: the budget and the batch-size cut-off are not reached)."""
    spec = _spec(make_llm)
    prompts = PROMPTS[:4]
    params = [SamplingParams(temperature=0.8, top_p=0.95, max_tokens=40, seed=100 + i)
              for i in range(4)]
    batched = _tokens(spec.generate(prompts, params))
    alone = [_tokens(spec.generate([p], sp))[0] for p, sp in zip(prompts, params)]
    assert batched == alone == _tokens(spec.generate(prompts, params))
    assert spec.engine.spec_stats["steps"] > 0
    _assert_no_leak(spec)


def test_bench_spec_compares_the_tokens_not_only_their_number(llm_f32):
    """`nextok bench spec`'s "same tokens" is the outputs' digest: two greedy runs of one prompt
    match; another prompt's output of the same length does not."""
    from nextok.bench.spec import _one

    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ids = llm_f32.get_tokenizer().encode("def fib(n):", add_special_tokens=False)
    a, b = _one(llm_f32, ids, sp), _one(llm_f32, ids, sp)
    other = _one(llm_f32, ids[:-1], sp)
    assert a["tokens"] == b["tokens"] == other["tokens"] == 12
    assert a["output_sha1"] == b["output_sha1"] != other["output_sha1"]
