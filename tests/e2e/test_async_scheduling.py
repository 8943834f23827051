"""Async scheduling on the real model: launching step N+1 before step N's tokens reach the host
changes nothing a user sees. The engine turns it on for CUDA; here it is forced on, on CPU, where
the same code runs (only without overlap) and is compared with the synchronous engine.
"""
from __future__ import annotations

from nextok import SamplingParams
from tests.prompts import PROMPTS

from .test_invariants import _assert_no_leak, _tokens


def _mixed_params(tok) -> list[SamplingParams]:
    newline = tok.encode("\n", add_special_tokens=False)[0]
    return [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=32, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=48, stop=["\n\n", "return"]),
        SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[newline]),
        SamplingParams(temperature=0.9, seed=3, n=2, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=24, logprobs=3),
        SamplingParams(temperature=0.0, max_tokens=1),
        SamplingParams(temperature=0.0, max_tokens=64, min_tokens=8),
        SamplingParams(temperature=0.7, top_k=40, seed=11, max_tokens=16, repetition_penalty=1.3),
        SamplingParams(temperature=0.0, max_tokens=20, frequency_penalty=0.5, presence_penalty=0.3),
    ]


def _summary(outs):
    return [[(o.token_ids, o.text, o.finish_reason, o.stop_reason,
              [(lp.token_id, round(lp.logprob, 4)) for lp in o.logprobs] if o.logprobs else None)
             for o in r.outputs] for r in outs]


def test_async_equals_sync_on_a_mixed_batch(llm_f32, make_llm):
    llm = make_llm(async_scheduling="on")
    assert llm.engine.config.async_scheduling and not llm_f32.engine.config.async_scheduling
    params = _mixed_params(llm.get_tokenizer())
    prompts = PROMPTS[:len(params)]
    # Penalised requests make the engine collect each step first; without them it overlaps.
    assert _summary(llm.generate(prompts[:8], params[:8])) == _summary(llm_f32.generate(prompts[:8], params[:8]))
    assert _summary(llm.generate(prompts, params)) == _summary(llm_f32.generate(prompts, params))
    _assert_no_leak(llm)


def test_async_with_preemption_chunking_and_prefix_hits(llm_f32, make_llm):
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    ref = _tokens(llm_f32.generate(PROMPTS[:12], params))
    tiny = make_llm(async_scheduling="on", num_kv_blocks=16, max_num_batched_tokens=40)
    before = tiny.engine.scheduler.num_preemptions
    assert _tokens(tiny.generate(PROMPTS[:12], params)) == ref
    assert tiny.engine.scheduler.num_preemptions > before, "the pool was meant to force preemption"
    _assert_no_leak(tiny)
    cached = make_llm(async_scheduling="on")
    shared = ["You are a careful Python programmer.\n" * 4 + p for p in PROMPTS[:4]]
    first = cached.generate(shared, params)
    again = cached.generate(shared, params)
    assert _tokens(first) == _tokens(again) == _tokens(llm_f32.generate(shared, params))
    assert all(o.num_cached_tokens > 0 for o in again)


def test_async_abort_and_streaming(make_llm):
    llm = make_llm(async_scheduling="on")
    eng = llm.engine
    for i, p in enumerate(PROMPTS[:6]):
        eng.add_request(f"a-{i}", p, SamplingParams(max_tokens=200, ignore_eos=True), stream=True)
    seen = set()
    for _ in range(4):
        seen |= {o.request_id for o in eng.step()}
    assert seen  # streamed outputs arrive (one step behind the launch)
    eng.abort_request("a-0")
    eng.abort_request("a-5")
    eng.step()
    for i in range(1, 5):
        eng.abort_request(f"a-{i}")
    _assert_no_leak(llm)
    tok = llm.get_tokenizer()
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=40, ignore_eos=True)
    streamed = "".join(llm.stream("Write a poem with emoji 🎉 and 日本語:", params))
    out = llm.last_output.outputs[0]
    assert streamed == out.text == tok.decode(out.token_ids)
    assert out.token_ids and -1 not in out.token_ids
