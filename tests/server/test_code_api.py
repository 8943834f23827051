"""/v1/code/complete, /infill and OpenAI `suffix` on the default model (no FIM tokens), over HTTP."""
from __future__ import annotations

import json
import re
import threading
import time

import httpx

from tests.server.conftest import MAIN_KEY, metric_value

STACK = ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
         "        self.items.append(item)\n\n    def pop(self):\n        ")
LIST_FILES = ("import os\n\ndef list_files(path):\n    files = os.listdir(path)\n"
              "    return [f for f in files if f.endswith(")
JS_SUM = "function sum(xs) {\n  let total = 0;\n  for (const x of xs) {\n    "
JS_SUFFIX = "\n  }\n  return total;\n}\n"


def raw(http, prompt: str, max_tokens: int = 80) -> str:
    """What the model writes with no stop rules (greedy)."""
    r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    return r.json()["choices"][0]["text"]


def complete(http, **body) -> dict:
    body.setdefault("max_tokens", 80)
    r = http.post("/v1/code/complete", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_single_line_stops_at_the_line_end(http):
    free = raw(http, LIST_FILES)
    assert "\n" in free.strip()  # the model would go on to other lines
    r = complete(http, prefix=LIST_FILES, suffix="", language="python", mode="single_line")
    assert r["completion"] == free.split("\n")[0] and r["completion"]
    assert r["finish_reason"] == "stop" and r["mode"] == "single_line" and r["fim"] is False
    assert r["usage"]["completion_tokens"] < 80 and r["usage"]["prompt_tokens"] > 0


def test_multi_line_stops_at_the_block_end_python(http):
    free = raw(http, STACK)
    block, _, after = free.partition("\n\n")
    assert block.startswith("\n        ") and after.startswith("    def ")  # a new method follows
    r = complete(http, prefix=STACK, suffix="", language="python", mode="multi_line")
    # the blank line the model began with is moved onto the cursor's indented line
    assert r["completion"] == block[len("\n        "):]
    assert "\n" in r["completion"]  # several lines: the whole method body
    assert r["finish_reason"] == "stop"
    assert r["usage"]["completion_tokens"] < 80


def test_multi_line_stops_at_the_closing_brace_js(http):
    free = raw(http, JS_SUM)
    assert free.split("\n")[1].strip() == "}"  # the model closes the loop next
    r = complete(http, prefix=JS_SUM, suffix=JS_SUFFIX, language="javascript", mode="multi_line")
    assert r["completion"] == free.split("\n")[0] and r["finish_reason"] == "stop"


def test_document_and_position_shape_matches_prefix_suffix(http):
    suffix = "\n\n    def peek(self):\n        return self.items[-1]\n"
    code = STACK + suffix
    lines = STACK.split("\n")
    by_parts = complete(http, prefix=STACK, suffix=suffix, language="python")
    by_doc = complete(http, code=code, position={"line": len(lines) - 1, "character": len(lines[-1])},
                      language="python")
    assert by_doc["completion"] == by_parts["completion"] and by_doc["mode"] == by_parts["mode"]
    r = http.post("/v1/code/complete", json={"code": code, "position": {"line": 99, "character": 0}})
    assert r.status_code == 400 and "line" in r.json()["error"]["message"]
    r = http.post("/v1/code/complete", json={"suffix": "x"})
    assert r.status_code == 400


def test_streamed_equals_non_streamed(http):
    for prefix, suffix, lang in ((STACK, "", "python"), (JS_SUM, JS_SUFFIX, "javascript")):
        full = complete(http, prefix=prefix, suffix=suffix, language=lang, mode="multi_line")
        with http.stream("POST", "/v1/code/complete", json={"prefix": prefix, "suffix": suffix, "language": lang,
                                                            "mode": "multi_line", "max_tokens": 80,
                                                            "stream": True}) as s:
            events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert "".join(c["delta"] for c in chunks) == full["completion"]
        assert chunks[-1]["completion"] == full["completion"] and chunks[-1]["finish_reason"] == "stop"


def test_second_keystroke_reuses_the_cached_prefix(http):
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(textwrap.TextWrapper._wrap_chunks))  # real code
    prefix = source[:1500]
    first = complete(http, prefix=prefix, suffix="", language="python", max_tokens=4,
                     filepath="textwrap.py", session_id="kbd-1")
    second = complete(http, prefix=prefix + "x = ", suffix="", language="python", max_tokens=4,
                      filepath="textwrap.py", session_id="kbd-1")
    assert first["usage"]["prompt_tokens"] > 200
    assert second["cached_tokens"] >= 16 * ((first["usage"]["prompt_tokens"] - 16) // 16) - 16
    assert second["cached_tokens"] > 0


def test_extra_context_as_comment_headers(http):
    r = complete(http, prefix="import util\n\nutil.", suffix="\n", language="python", filepath="app/main.py",
                 extra_context=[{"filepath": "app/util.py", "content": "def helper():\n    return 1\n"}],
                 max_tokens=4, return_prompt=True)
    assert r["prompt"] == "# app/util.py\ndef helper():\n    return 1\n# app/main.py\nimport util\n\nutil."
    big = "\n".join(f"def f{i}(x):\n    return x + {i}" for i in range(2000))
    r = complete(http, prefix="x = ", suffix="", language="python", max_tokens=4, return_prompt=True,
                 extra_context=[{"filepath": "big.py", "content": big}])
    assert r["prompt"].startswith("# big.py\ndef f0(x):") and r["prompt"].endswith("x = ")
    assert r["usage"]["prompt_tokens"] <= 1024 + 16  # the context budget (--code-context-tokens)


def test_session_supersede_cancels_the_earlier_request(server, http):
    m0 = httpx.get(server.url + "/metrics").text
    cancelled0 = metric_value(m0, "nextok:request_success_total", finished_reason="cancelled")
    events: list = []

    def first():
        with httpx.stream("POST", server.url + "/v1/code/complete", timeout=120,
                          headers={"Authorization": f"Bearer {MAIN_KEY}"},
                          json={"prefix": "Once upon a time", "suffix": "", "language": "markdown",
                                "mode": "multi_line", "max_tokens": 400, "session_id": "editor-7",
                                "stream": True}) as s:
            events.extend(line[6:] for line in s.iter_lines() if line.startswith("data: "))

    t = threading.Thread(target=first)
    t.start()
    deadline = time.monotonic() + 30
    while metric_value(httpx.get(server.url + "/metrics").text, "nextok:num_requests_running") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = complete(http, prefix="Once upon a time, a", suffix="", language="markdown", max_tokens=4,
                      session_id="editor-7")
    t.join(60)
    assert second["finish_reason"] in ("stop", "length")
    final = json.loads(events[-2])
    assert events[-1] == "[DONE]" and final["finish_reason"] == "cancelled"
    assert final["usage"]["completion_tokens"] < 400
    m1 = httpx.get(server.url + "/metrics").text
    assert metric_value(m1, "nextok:request_success_total", finished_reason="cancelled") == cancelled0 + 1
    deadline = time.monotonic() + 10
    while metric_value(httpx.get(server.url + "/metrics").text, "nextok:kv_cache_usage_perc") != 0:
        assert time.monotonic() < deadline, "KV blocks of the cancelled request were not freed"
        time.sleep(0.05)


def test_openai_suffix_without_fim_is_prefix_only(http):
    a = http.post("/v1/completions", json={"prompt": LIST_FILES, "suffix": "\n", "max_tokens": 8,
                                           "temperature": 0}).json()
    b = http.post("/v1/completions", json={"prompt": LIST_FILES, "max_tokens": 8, "temperature": 0}).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]


LLAMA_VIM_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                    "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                    "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated",
                    "tokens_cached"]


def test_infill_as_llama_vim_sends_it(http):
    body = {"id_slot": 0, "input_prefix": "class Stack:\n    def __init__(self):\n        self.items = []\n\n",
            "input_suffix": "\n", "prompt": "    def push(self, item):",
            "input_extra": [{"text": "def helper():\n    pass\n", "time": 1.5, "filename": "util.py"}],
            "n_predict": 32, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.90,
            "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "response_fields": LLAMA_VIM_FIELDS, "model": ""}
    r = http.post("/infill", json=body)
    assert r.status_code == 200
    assert re.search(r'"content"\s*:"', r.text) and "\n" not in r.text  # llama.vim's own check
    obj = r.json()
    assert set(obj) == set(LLAMA_VIM_FIELDS)
    assert obj["timings/predicted_n"] >= 1 and obj["timings/prompt_n"] > 0 and obj["tokens_cached"] > 0
    warm = http.post("/infill", json={"input_prefix": "", "input_suffix": "", "input_extra": [], "prompt": "",
                                      "n_predict": 0, "samplers": [], "response_fields": [""]})
    assert warm.status_code == 200 and warm.json() == {}


def test_infill_llama_vscode_array_and_stream(http):
    body = {"id_slot": 0, "input_prefix": "def add(a, b):\n", "input_suffix": "\n", "input_extra": [],
            "prompt": "    ", "n_predict": 8, "n_cmpl": 3, "top_k": 40, "top_p": 0.99, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
            "t_max_predict_ms": 500}
    arr = http.post("/infill", json=body).json()
    assert isinstance(arr, list) and [o["index"] for o in arr] == [0, 1, 2]
    for o in arr:
        assert o["stop"] is True and isinstance(o["content"], str)
        assert o["generation_settings"]["n_ctx"] > 0 and o["timings"]["predicted_n"] == o["tokens_predicted"]
        assert o["stop_type"] in ("eos", "limit", "word")
    # No time cap here: t_max_predict_ms stops at the first newline after 500 ms, so on a loaded
    # machine the two greedy runs could stop at different points.
    single = {**body, "n_cmpl": 1, "temperature": 0.0, "samplers": ["temperature"], "t_max_predict_ms": -1}
    full = http.post("/infill", json=single).json()
    with http.stream("POST", "/infill", json={**single, "stream": True}) as s:
        lines = [line for line in s.iter_lines() if line]
    assert all(line.startswith("data: {") for line in lines)  # no [DONE], as llama.cpp
    chunks = [json.loads(line[6:]) for line in lines]
    assert all(c["stop"] is False for c in chunks[:-1]) and chunks[-1]["stop"] is True
    assert "".join(c["content"] for c in chunks) == full["content"]
    assert chunks[-1]["tokens_predicted"] == full["tokens_predicted"]


def test_infill_n_indent_and_errors(http):
    prefix = STACK[:-len("    def pop(self):\n        ")]
    free = raw(http, STACK, 60)
    r = http.post("/infill", json={"input_prefix": prefix, "input_suffix": "", "prompt": "    def pop(self):\n        ",
                                   "n_predict": 60, "n_indent": 8, "temperature": 0, "samplers": ["temperature"]}).json()
    # cut at the first later line indented less than 8: here the blank line after the method
    assert r["content"] == free.split("\n\n")[0] + "\n" and r["stop_type"] == "limit"
    for bad in ({"input_extra": "x"}, {"input_extra": [{"filename": "a"}]}, {"input_extra": [{"text": 1}]},
                {"input_prefix": 5}, {"n_predict": "x"}):
        e = http.post("/infill", json={"input_prefix": "a", "input_suffix": "", **bad})
        assert e.status_code == 400 and "error" in e.json()
