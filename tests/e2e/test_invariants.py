"""Engine invariants on the real model (greedy unless said otherwise).

batched == one at a time; prefix cache on == off; chunked prefill on == off; a pool so small that
preemption happens == a large pool; no block leaks after finish or abort; same seed => same sample
whatever else is in the batch; streamed text == full decode.
"""
from __future__ import annotations

from nextok import SamplingParams
from tests.prompts import PROMPTS

GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)


def _tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def _assert_no_leak(llm) -> None:
    eng = llm.engine
    bm = eng.block_manager
    assert not eng.has_unfinished_requests()
    assert not eng.scheduler.running and not eng.scheduler.waiting
    bm.check_integrity(live=[])
    assert bm.num_free_blocks == bm.num_blocks - 1, "blocks still held after every request ended"


def test_batched_equals_one_at_a_time(llm_f32):
    batched = _tokens(llm_f32.generate(PROMPTS, GREEDY))
    single = [_tokens(llm_f32.generate([p], GREEDY))[0] for p in PROMPTS]
    assert batched == single
    _assert_no_leak(llm_f32)


def test_prefix_cache_on_equals_off(make_llm):
    shared = "You are a careful Python programmer. Answer with code only.\n" * 4
    prompts = [shared + p for p in PROMPTS[:8]]
    on, off = make_llm(), make_llm(enable_prefix_caching=False)
    first = on.generate(prompts, GREEDY)
    again = on.generate(prompts, GREEDY)  # the prompts are now in the cache
    ref = off.generate(prompts, GREEDY)
    assert _tokens(first) == _tokens(ref) == _tokens(again)
    assert all(o.num_cached_tokens > 0 for o in again)
    assert all(o.num_cached_tokens == 0 for o in ref)
    _assert_no_leak(on)
    _assert_no_leak(off)


def test_chunked_prefill_on_equals_off(make_llm):
    long_prompts = [p * 6 for p in PROMPTS[:6]]
    chunked = make_llm(max_num_batched_tokens=24, enable_prefix_caching=False)
    whole = make_llm(enable_chunked_prefill=False, enable_prefix_caching=False)
    assert _tokens(chunked.generate(long_prompts, GREEDY)) == _tokens(whole.generate(long_prompts, GREEDY))
    _assert_no_leak(chunked)


def test_preemption_gives_same_outputs(llm_f32, make_llm):
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    ref = _tokens(llm_f32.generate(PROMPTS[:12], params))
    tiny = make_llm(num_kv_blocks=16, enable_prefix_caching=False)  # 15 usable blocks = 240 tokens
    before = tiny.engine.scheduler.num_preemptions
    assert _tokens(tiny.generate(PROMPTS[:12], params)) == ref
    assert tiny.engine.scheduler.num_preemptions > before, "the pool was meant to force preemption"
    _assert_no_leak(tiny)


def test_abort_frees_blocks(llm_f32):
    eng = llm_f32.engine
    for i, p in enumerate(PROMPTS[:6]):
        eng.add_request(f"abort-{i}", p, SamplingParams(max_tokens=200, ignore_eos=True))
    for _ in range(3):
        eng.step()
    eng.abort_request("abort-0")  # running
    eng.abort_request("abort-5")
    eng.step()
    for i in range(1, 5):
        eng.abort_request(f"abort-{i}")
    _assert_no_leak(llm_f32)


def test_seeded_sampling_ignores_batch_composition(llm_f32):
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=32, ignore_eos=True)
    alone = llm_f32.generate([PROMPTS[0]], seeded)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.2, top_k=20, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=10),
              SamplingParams(temperature=0.7, seed=7, max_tokens=32, ignore_eos=True)]
    batch_prompts = PROMPTS[1:4] + [PROMPTS[0]] + PROMPTS[4:6]
    batch_params = others + [seeded] + others[:2]
    outs = llm_f32.generate(batch_prompts, batch_params)
    assert outs[3].outputs[0].token_ids == alone
    assert llm_f32.generate([PROMPTS[0]], seeded)[0].outputs[0].token_ids == alone


def test_streamed_text_equals_full_decode(llm_f32):
    tok = llm_f32.get_tokenizer()
    for prompt in ["Write a poem with emoji 🎉 and 日本語:", PROMPTS[0], PROMPTS[7]]:
        params = SamplingParams(temperature=0.8, seed=3, max_tokens=40, ignore_eos=True)
        streamed = "".join(llm_f32.stream(prompt, params))
        out = llm_f32.last_output.outputs[0]
        assert streamed == out.text == tok.decode(out.token_ids)
    _assert_no_leak(llm_f32)


def test_generated_text_equals_streamed_text(llm_f32):
    """generate() decodes a request's text once, when it ends (it is not streamed and watches
    no stop string): the same text as streaming it, and as decoding its ids, with n > 1 and
    with sequences that end on EOS."""
    tok = llm_f32.get_tokenizer()
    for prompt, params in [("Write a poem with emoji 🎉 and 日本語:",
                            SamplingParams(temperature=0.8, seed=5, max_tokens=40, ignore_eos=True)),
                           (tok.apply_chat_template([{"role": "user", "content": "Say hi in one word."}]),
                            SamplingParams(temperature=0.0, max_tokens=64)),  # ends on EOS (55 tokens)
                           (PROMPTS[7], SamplingParams(n=2, temperature=1.0, seed=9, max_tokens=24))]:
        outs = llm_f32.generate(prompt, params)[0].outputs
        assert len(outs) == params.n and (params.max_tokens != 64 or outs[0].finish_reason == "stop")
        streamed = "".join(llm_f32.stream(prompt, params)) if params.n == 1 else None
        for o in outs:
            assert o.text == tok.decode(o.token_ids)  # (an EOS that ended it: a special token, skipped)
        if streamed is not None:
            assert streamed == outs[0].text == llm_f32.last_output.outputs[0].text
    _assert_no_leak(llm_f32)


def test_n_samples_share_prompt_blocks(llm_f32):
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=16, ignore_eos=True)
    out = llm_f32.generate(["def merge_sort(xs):\n" * 3], params)[0]
    assert len(out.outputs) == 4
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1, "n samples should differ"
    _assert_no_leak(llm_f32)


def test_stop_token_ends_without_its_text(llm_f32):
    prompt = "def fibonacci(n):"
    free = llm_f32.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    ids = free.outputs[0].token_ids
    stop_id = ids[4]
    first = ids.index(stop_id)  # the first time the model produces it
    out = llm_f32.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                                  stop_token_ids=[stop_id], skip_special_tokens=False))[0]
    o = out.outputs[0]
    assert o.finish_reason == "stop" and o.stop_reason == stop_id
    assert o.token_ids == ids[:first + 1]  # the stop token is in the ids, not in the text
    assert o.text == llm_f32.get_tokenizer().decode(ids[:first], skip_special_tokens=False)
