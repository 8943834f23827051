"""The OpenAI API through the official `openai` client over real HTTP, against `nextok serve`."""
from __future__ import annotations

import asyncio

import pytest

from nextok import SamplingParams

PROMPTS = ["def fibonacci(n):", "The capital of France is", "import numpy as np\n\ndef normalize(x):",
           "SELECT name FROM users WHERE", "# Sort a list in place\ndef bubble_sort(items):",
           "class Stack:\n    def __init__(self):", "fn main() {\n    let v = vec![1, 2, 3];",
           "Once upon a time", "for (int i = 0; i < n; i++) {", "<html>\n<body>\n",
           "def is_prime(n):\n    if n < 2:", "The three laws of thermodynamics are",
           "const add = (a, b) =>", "package main\n\nimport \"fmt\"\n\nfunc main() {",
           "git commit -m", "1, 1, 2, 3, 5, 8,"]


def greedy(llm, prompt, max_tokens=24):
    return llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens))[0].outputs[0]


def test_completion_matches_engine_and_tokenizer_counts(client, llm_f32):
    tok = llm_f32.get_tokenizer()
    for prompt in PROMPTS[:3]:
        r = client.completions.create(model="smollm2-135m-instruct", prompt=prompt, max_tokens=24, temperature=0)
        ref = greedy(llm_f32, prompt)
        assert r.choices[0].text == ref.text
        assert r.usage.prompt_tokens == len(tok.encode(prompt))
        assert r.usage.completion_tokens == len(ref.token_ids)
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        assert r.choices[0].finish_reason in ("stop", "length")
        assert r.object == "text_completion" and r.id.startswith("cmpl-")


def test_streamed_equals_non_streamed(client):
    for prompt in PROMPTS[:3]:
        full = client.completions.create(model="smollm2-135m-instruct", prompt=prompt, max_tokens=32, temperature=0)
        chunks = list(client.completions.create(model="smollm2-135m-instruct", prompt=prompt, max_tokens=32,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert text == full.choices[0].text
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason
        assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
        assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_chat_streamed_equals_non_streamed_and_usage(client, http):
    messages = [{"role": "system", "content": "You are a helpful coding assistant."},
                {"role": "user", "content": "Write a Python function that reverses a string."}]
    full = client.chat.completions.create(model="smollm2-135m-instruct", messages=messages, max_tokens=40,
                                          temperature=0)
    stream = list(client.chat.completions.create(model="smollm2-135m-instruct", messages=messages,
                                                 max_tokens=40, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert stream[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == full.choices[0].message.content and text
    assert full.choices[0].message.role == "assistant"
    n_prompt = http.post("/tokenize", json={"messages": messages}).json()["count"]
    assert full.usage.prompt_tokens == n_prompt == stream[-1].usage.prompt_tokens
    assert stream[-1].usage.completion_tokens == full.usage.completion_tokens


def test_sixteen_concurrent_streams_equal_single(async_client, client):
    singles = [client.completions.create(model="smollm2-135m-instruct", prompt=p, max_tokens=20,
                                         temperature=0).choices[0].text for p in PROMPTS]

    async def one(prompt):
        stream = await async_client.completions.create(model="smollm2-135m-instruct", prompt=prompt,
                                                       max_tokens=20, temperature=0, stream=True)
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def all_at_once():
        return await asyncio.gather(*(one(p) for p in PROMPTS))

    assert asyncio.run(all_at_once()) == singles


def test_n_and_seed_reproducible(client):
    kw = dict(model="smollm2-135m-instruct", prompt="def parse_args():", max_tokens=16, temperature=1.0, n=3)
    a = client.completions.create(seed=1234, **kw)
    b = client.completions.create(seed=1234, **kw)
    c = client.completions.create(seed=99, **kw)
    assert sorted(ch.index for ch in a.choices) == [0, 1, 2]
    assert [ch.text for ch in a.choices] == [ch.text for ch in b.choices]
    assert [ch.text for ch in a.choices] != [ch.text for ch in c.choices]
    assert len({ch.text for ch in a.choices}) > 1  # the n samples differ from each other


def test_stop_string(client):
    r = client.completions.create(model="smollm2-135m-instruct", prompt="def fibonacci(n):", max_tokens=40,
                                  temperature=0, stop=["return"])
    assert "return" not in r.choices[0].text
    assert r.choices[0].finish_reason == "stop"
    free = client.completions.create(model="smollm2-135m-instruct", prompt="def fibonacci(n):", max_tokens=40,
                                     temperature=0)
    assert free.choices[0].text.startswith(r.choices[0].text) and "return" in free.choices[0].text


def test_logprobs_completion_and_chat(client):
    r = client.completions.create(model="smollm2-135m-instruct", prompt="1, 2, 3,", max_tokens=6, temperature=0,
                                  logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert "".join(lp.tokens).startswith(r.choices[0].text)
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and 1 <= len(top) <= 3
        assert max(top.values()) == pytest.approx(chosen, abs=1e-5)  # greedy takes the best
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    c = client.chat.completions.create(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=5, temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_echo_prompt_list_and_token_ids(client, llm_f32):
    r = client.completions.create(model="smollm2-135m-instruct", prompt="def add(a, b):", max_tokens=8,
                                  temperature=0, echo=True)
    assert r.choices[0].text.startswith("def add(a, b):")
    ids = llm_f32.get_tokenizer().encode("def add(a, b):")
    by_ids = client.completions.create(model="smollm2-135m-instruct", prompt=ids, max_tokens=8, temperature=0)
    assert r.choices[0].text == "def add(a, b):" + by_ids.choices[0].text
    many = client.completions.create(model="smollm2-135m-instruct", prompt=PROMPTS[:3], max_tokens=8,
                                     temperature=0, n=2)
    assert sorted(c.index for c in many.choices) == list(range(6))
    by_index = {c.index: c.text for c in many.choices}
    for i, p in enumerate(PROMPTS[:3]):
        single = client.completions.create(model="smollm2-135m-instruct", prompt=p, max_tokens=8, temperature=0)
        assert by_index[2 * i] == by_index[2 * i + 1] == single.choices[0].text  # greedy: n copies


def test_models_and_tokenize_roundtrip(client, http):
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2-135m-instruct"]
    t = http.post("/tokenize", json={"prompt": "def f(x):\n    return x"}).json()
    assert t["count"] == len(t["tokens"]) and t["max_model_len"] > 0
    d = http.post("/detokenize", json={"tokens": t["tokens"]}).json()
    assert d["prompt"] == "def f(x):\n    return x"


def test_penalties_bias_and_extras(client, llm_f32):
    tok = llm_f32.get_tokenizer()
    banned = tok.encode(" 1", add_special_tokens=False)[0]
    base = client.completions.create(model="smollm2-135m-instruct", prompt="0, 1, 0, 1, 0,", max_tokens=4, temperature=0)
    biased = client.completions.create(model="smollm2-135m-instruct", prompt="0, 1, 0, 1, 0,", max_tokens=4,
                                       temperature=0, logit_bias={str(banned): -100})
    assert base.choices[0].text.startswith(" 1") and not biased.choices[0].text.startswith(" 1")
    r = client.completions.create(model="smollm2-135m-instruct", prompt="Hello", max_tokens=8, temperature=0.7,
                                  presence_penalty=0.5, frequency_penalty=0.5, user="u1", seed=3,
                                  extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1,
                                              "ignore_eos": True, "unknown_field": 1})
    assert r.usage.completion_tokens == 8  # ignore_eos: always max_tokens
