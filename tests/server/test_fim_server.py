"""End to end: a real `nextok serve` on tiny random-weight models whose tokenizers carry each code
family's real FIM tokens; every code path (/v1/code/complete in both request shapes, /infill,
/v1/completions with `suffix`) must build that family's FIM prompt.

The weights are random, so completions are noise; what is checked is the prompt the model saw,
as exact text (`return_prompt`, /infill's `prompt`) and as token ids (/tokenize, `usage`).
Expected prompts are written out literally, not computed with nextok.server.fim.
"""
from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import ServerProcess
from tests.server.fim_tokenizers import FAMILY_SPECIAL_TOKENS, build_tokenizer

ARCHITECTURES = {"qwen2.5-coder": "Qwen2ForCausalLM", "starcoder2": "MistralForCausalLM",
                 "codellama": "LlamaForCausalLM", "deepseek-coder": "LlamaForCausalLM"}
FAMILIES = list(ARCHITECTURES)
MARKERS = {  # prefix, suffix, middle: as in each family's released tokenizer
    "qwen2.5-coder": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    "starcoder2": ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    "codellama": ("\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>"),
    "deepseek-coder": ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>",
                       "<\uff5cfim\u2581end\uff5c>"),
}
PRE, SUF = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
PSM = {
    "qwen2.5-coder": "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>"
                     "\n\nprint(add(1, 2))\n<|fim_middle|>",
    "starcoder2": "<fim_prefix>def add(a, b):\n    return <fim_suffix>"
                  "\n\nprint(add(1, 2))\n<fim_middle>",
    # Meta's `<PRE> {pre} <SUF>{suf} <MID>`: the spaces before SUF/MID are the ▁ in those pieces
    "codellama": "\u2581<PRE> def add(a, b):\n    return \u2581<SUF>"
                 "\n\nprint(add(1, 2))\n\u2581<MID>",
    "deepseek-coder": "<\uff5cfim\u2581begin\uff5c>def add(a, b):\n    return "
                      "<\uff5cfim\u2581hole\uff5c>\n\nprint(add(1, 2))\n<\uff5cfim\u2581end\uff5c>",
}
CONTEXT = [{"filepath": "src/util.py", "content": "def sub(a, b):\n    return a - b\n"},
           {"filepath": "README.md", "content": "# demo"}]  # no final newline
WITH_CONTEXT = {
    # Qwen2.5-Coder report, figure 4: every file ends with "\n" before the next <|file_sep|>
    "qwen2.5-coder": "<|file_sep|>src/util.py\ndef sub(a, b):\n    return a - b\n"
                     "<|file_sep|>README.md\n# demo\n"
                     "<|file_sep|>src/main.py\n"
                     "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>\n\nprint(add(1, 2))\n"
                     "<|fim_middle|>",
    # StarCoder2 paper, section 5: the current file's path sits inside the FIM prefix
    "starcoder2": "<file_sep>src/util.py\ndef sub(a, b):\n    return a - b\n"
                  "<file_sep>README.md\n# demo"
                  "<file_sep><fim_prefix>src/main.py\ndef add(a, b):\n    return "
                  "<fim_suffix>\n\nprint(add(1, 2))\n<fim_middle>",
    # no repo tokens: context and path as comment headers inside the prefix
    "codellama": "\u2581<PRE> # src/util.py\ndef sub(a, b):\n    return a - b\n"
                 "# README.md\n# demo\n# src/main.py\ndef add(a, b):\n    return "
                 "\u2581<SUF>\n\nprint(add(1, 2))\n\u2581<MID>",
    "deepseek-coder": "<\uff5cfim\u2581begin\uff5c># src/util.py\n"
                      "def sub(a, b):\n    return a - b\n"
                      "# README.md\n# demo\n# src/main.py\ndef add(a, b):\n    return "
                      "<\uff5cfim\u2581hole\uff5c>\n\nprint(add(1, 2))\n<\uff5cfim\u2581end\uff5c>",
}
BLOCK = 16  # the server's default KV block size
BUDGET_FLAGS = ("--code-context-tokens", "64", "--max-model-len", "256")
LONG_FILE = "".join(f"value_{i} = {i}\n" for i in range(200))


# ---- servers ---------------------------------------------------------------------------------
def write_model(family: str, directory: str):
    """A tiny random-weight model directory: the family's tokenizer and a config.json."""
    tok = build_tokenizer(family, directory)
    eos = tok.token_to_id(FAMILY_SPECIAL_TOKENS[family][0])
    config = {"architectures": [ARCHITECTURES[family]], "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 2048,
              "vocab_size": tok.backend.get_vocab_size(), "rms_norm_eps": 1e-6,
              "eos_token_id": eos, "tie_word_embeddings": False, "torch_dtype": "float32"}
    with open(f"{directory}/config.json", "w") as f:
        json.dump(config, f)
    return tok


class FimServer:
    def __init__(self, proc: ServerProcess, tokenizer, family: str):
        self.proc, self.tokenizer, self.family = proc, tokenizer, family
        self.http = httpx.Client(base_url=proc.url, timeout=60)

    def post(self, path: str, body: dict) -> dict:
        r = self.http.post(path, json=body)
        assert r.status_code == 200, (r.status_code, r.text)
        return r.json()

    def complete(self, **body) -> dict:
        """/v1/code/complete, greedy, 4 tokens, with the prompt echoed back."""
        body = {"language": "python", "max_tokens": 4, "temperature": 0, "return_prompt": True,
                **body}
        return self.post("/v1/code/complete", body)

    def tokens(self, text: str) -> list[int]:
        return self.post("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]

    def marker_ids(self) -> list[int]:
        return [self.tokenizer.token_to_id(m) for m in MARKERS[self.family]]


class ServerPool:
    """One server per (family, flags), started on first use and kept for the module."""

    def __init__(self, tmp_path_factory):
        self.tmp = tmp_path_factory
        self.models: dict[str, tuple[str, object]] = {}
        self.servers: dict[tuple, FimServer] = {}

    def __call__(self, family: str, *flags: str) -> FimServer:
        key = (family, *flags)
        if key not in self.servers:
            if family not in self.models:
                directory = str(self.tmp.mktemp(family))
                self.models[family] = (directory, write_model(family, directory))
            directory, tok = self.models[family]
            log = str(self.tmp.mktemp("log") / f"{family}.log")
            proc = ServerProcess(["--load-format", "dummy", *flags], log, directory)
            try:
                proc.wait_ready()
            except BaseException:
                proc.stop()
                raise
            self.servers[key] = FimServer(proc, tok, family)
        return self.servers[key]

    def stop(self) -> None:
        for s in self.servers.values():
            s.http.close()
            s.proc.stop()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    pool = ServerPool(tmp_path_factory)
    try:
        yield pool
    finally:
        pool.stop()


def assert_fim_tokens(server: FimServer, prompt: str, prompt_tokens: int) -> list[int]:
    """The prompt parses with each FIM marker as one special token, and is what the engine got."""
    ids = server.tokens(prompt)
    assert ids == server.tokenizer.encode(prompt, add_special_tokens=False)
    assert prompt_tokens == len(ids)
    for marker, i in zip(MARKERS[server.family], server.marker_ids()):
        assert i is not None and ids.count(i) == 1, (marker, ids)
    return ids


# ---- /v1/code/complete ------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_code_complete_psm_prompt(servers, family):
    s = servers(family)
    r = s.complete(prefix=PRE, suffix=SUF)
    assert r["fim"] is True
    assert r["prompt"] == PSM[family]
    assert_fim_tokens(s, r["prompt"], r["usage"]["prompt_tokens"])
    assert r["finish_reason"] in ("length", "stop") and r["usage"]["completion_tokens"] <= 4


@pytest.mark.parametrize("family", FAMILIES)
def test_code_complete_repo_context_layout(servers, family):
    s = servers(family)
    r = s.complete(prefix=PRE, suffix=SUF, filepath="src/main.py", extra_context=CONTEXT)
    assert r["prompt"] == WITH_CONTEXT[family]
    ids = assert_fim_tokens(s, r["prompt"], r["usage"]["prompt_tokens"])
    sep = {"qwen2.5-coder": "<|file_sep|>", "starcoder2": "<file_sep>"}.get(family)
    if sep:  # one <file_sep> per context file, one for the current file
        assert ids.count(s.tokenizer.token_to_id(sep)) == 3


@pytest.mark.parametrize("family", ["qwen2.5-coder", "codellama"])
def test_whole_document_shape_matches_prefix_suffix(servers, family):
    s = servers(family)
    code = 'def greet():\n    s = "\U0001F600 hi"\n    return s\n'
    # LSP counts UTF-16 units: the emoji is 2, so character 11 is right after it
    prefix, suffix = 'def greet():\n    s = "\U0001F600', ' hi"\n    return s\n'
    common = {"filepath": "src/greet.py", "extra_context": CONTEXT}
    whole = s.complete(code=code, position={"line": 1, "character": 11}, **common)
    split = s.complete(prefix=prefix, suffix=suffix, **common)
    assert whole["prompt"] == split["prompt"]
    assert whole["usage"]["prompt_tokens"] == split["usage"]["prompt_tokens"]
    _, suf_mark, mid_mark = MARKERS[family]
    assert whole["prompt"].endswith(prefix + suf_mark + suffix + mid_mark)


def test_context_and_code_trimmed_to_budget(servers):
    """--code-context-tokens 64: the context keeps the first whole lines that fit 64 tokens and
    drops later files; --max-model-len 256: the prefix keeps its lines nearest the cursor."""
    s = servers("qwen2.5-coder", *BUDGET_FLAGS)
    big = "".join(f"CONST_{i} = {i} * {i}\n" for i in range(60))
    prefix = "".join(f"value_{i} = {i}\n" for i in range(120)) + "def total():\n    return "
    suffix = "\n\nprint(total())\n"
    r = s.complete(prefix=prefix, suffix=suffix, filepath="src/main.py",
                   extra_context=[{"filepath": "src/big.py", "content": big},
                                  {"filepath": "src/other.py", "content": "OTHER = 1\n"}])
    prompt = r["prompt"]
    context, sep, rest = prompt.partition("<|file_sep|>src/main.py\n<|fim_prefix|>")
    assert sep and "src/other.py" not in prompt
    head = "<|file_sep|>src/big.py\n"
    assert context.startswith(head)
    kept = context[len(head):]
    assert kept and big.startswith(kept) and kept.endswith("\n") and len(kept) < len(big)
    n = len(s.tokens(context))
    assert n <= 64
    next_line = big[len(kept):].split("\n", 1)[0] + "\n"
    assert len(s.tokens(context + next_line)) > 64  # as many whole lines as fit
    # the current file: a tail of the prefix from a line start, the suffix whole
    kept_pre, _, tail = rest.partition("<|fim_suffix|>")
    assert tail == suffix + "<|fim_middle|>"
    assert prefix.endswith(kept_pre) and len(kept_pre) < len(prefix)
    assert prefix[len(prefix) - len(kept_pre) - 1] == "\n"
    assert kept_pre.endswith("value_119 = 119\ndef total():\n    return ")
    assert r["usage"]["prompt_tokens"] == len(s.tokens(prompt)) <= 256 - 4


def test_openai_suffix_prompt_leaves_room_for_max_tokens(servers):
    s = servers("qwen2.5-coder", *BUDGET_FLAGS)
    body = {"prompt": LONG_FILE, "suffix": "\n", "max_tokens": 100, "temperature": 0}
    r = s.http.post("/v1/completions", json=body)  # /v1/code/complete trims to fit instead
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] <= 256 - 100


def test_code_complete_max_tokens_over_context_is_a_400(servers):
    s = servers("qwen2.5-coder", *BUDGET_FLAGS)
    # a fresh connection: after an unhandled error the server drops the one it answered on
    r = httpx.post(s.proc.url + "/v1/code/complete", headers={"Connection": "close"},
                   json={"prefix": PRE, "suffix": SUF, "max_tokens": 256})
    assert r.status_code == 400, r.text


def test_next_keystroke_hits_prefix_cache(servers):
    s = servers("qwen2.5-coder")
    context = [{"filepath": "src/cache_me.py",
                "content": "".join(f"def helper_{i}(x):\n    return x + {i}\n" for i in range(12))}]
    body = {"suffix": "\n", "filepath": "src/app.py", "extra_context": context}
    first = s.complete(prefix="import os\n\ndef main():\n    x = hel", **body)
    second = s.complete(prefix="import os\n\ndef main():\n    x = helper_", **body)
    a, b = s.tokens(first["prompt"]), s.tokens(second["prompt"])
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert common >= 3 * BLOCK  # the context is shared
    assert second["cached_tokens"] > 0
    assert second["cached_tokens"] == common // BLOCK * BLOCK  # every full shared block


# ---- /infill (llama.cpp) and /v1/completions with suffix ----------------------------------------
INFILL = {"input_prefix": "def add(a, b):\n", "prompt": "    return ", "input_suffix": SUF,
          "input_extra": [{"filename": "util.py", "text": "X = 1\n"}], "n_predict": 4,
          "temperature": 0}
INFILL_PROMPT = {
    "qwen2.5-coder": "<|file_sep|>util.py\nX = 1\n<|file_sep|>\n<|fim_prefix|>def add(a, b):\n"
                     "    return <|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>",
    "starcoder2": "<file_sep>util.py\nX = 1\n<file_sep><fim_prefix>def add(a, b):\n    return "
                  "<fim_suffix>\n\nprint(add(1, 2))\n<fim_middle>",
    "codellama": "\u2581<PRE> # util.py\nX = 1\ndef add(a, b):\n    return \u2581<SUF>\n\n"
                 "print(add(1, 2))\n\u2581<MID>",
}


@pytest.mark.parametrize("family", list(INFILL_PROMPT))
def test_infill_llama_cpp_shape(servers, family):
    s = servers(family)
    r = s.post("/infill", INFILL)
    assert r["prompt"] == INFILL_PROMPT[family]
    assert_fim_tokens(s, r["prompt"], r["tokens_evaluated"])
    assert r["stop"] is True and isinstance(r["content"], str) and r["tokens_predicted"] <= 4
    assert r["generation_settings"]["n_predict"] == 4
    assert {"stop_type", "timings", "tokens_cached", "truncated"} <= r.keys()
    plain = s.post("/infill", {**INFILL, "input_extra": []})
    assert plain["prompt"] == PSM[family]


@pytest.mark.parametrize("family", FAMILIES)
def test_openai_completions_suffix_uses_fim(servers, family):
    s = servers(family)
    r = s.post("/v1/completions", {"prompt": PRE, "suffix": SUF, "max_tokens": 4, "temperature": 0})
    assert r["usage"]["prompt_tokens"] == len(s.tokens(PSM[family]))
    assert r["usage"]["prompt_tokens"] != len(s.tokens(PRE + SUF))


def sse_objects(response: httpx.Response) -> list[dict]:
    lines = [ln[len("data: "):] for ln in response.text.splitlines() if ln.startswith("data: ")]
    return [json.loads(ln) for ln in lines if ln != "[DONE]"]


def test_streamed_requests_use_the_same_prompt(servers):
    s = servers("starcoder2")
    body = {"prefix": PRE, "suffix": SUF, "filepath": "src/main.py", "extra_context": CONTEXT,
            "language": "python", "max_tokens": 4, "temperature": 0, "return_prompt": True}
    final = sse_objects(s.http.post("/v1/code/complete", json={**body, "stream": True}))[-1]
    assert final["prompt"] == WITH_CONTEXT["starcoder2"] and final["fim"] is True
    assert final["usage"]["prompt_tokens"] == len(s.tokens(final["prompt"]))
    final = sse_objects(s.http.post("/infill", json={**INFILL, "stream": True}))[-1]
    assert final["stop"] is True and final["prompt"] == INFILL_PROMPT["starcoder2"]


# ---- SPM ----------------------------------------------------------------------------------------
SPM = {
    "starcoder2": "<fim_prefix><fim_suffix>\n\nprint(add(1, 2))\n<fim_middle>"
                  "def add(a, b):\n    return ",
    # Meta's suffix_first `<PRE> <SUF>{suf} <MID> {pre}`: the prefix keeps its dummy space
    "codellama": "\u2581<PRE>\u2581<SUF>\n\nprint(add(1, 2))\n\u2581<MID>"
                 " def add(a, b):\n    return ",
}


@pytest.mark.parametrize("family", list(SPM))
def test_spm_order(servers, family):
    s = servers(family, "--fim-order", "spm")
    r = s.complete(prefix=PRE, suffix=SUF)
    assert r["prompt"] == SPM[family]
    assert_fim_tokens(s, r["prompt"], r["usage"]["prompt_tokens"])
    infill = s.post("/infill", {**INFILL, "input_extra": []})
    assert infill["prompt"] == SPM[family]


def test_spm_with_repo_context_starcoder2(servers):
    s = servers("starcoder2", "--fim-order", "spm")
    r = s.complete(prefix=PRE, suffix=SUF, filepath="src/main.py", extra_context=CONTEXT)
    assert r["prompt"] == ("<file_sep>src/util.py\ndef sub(a, b):\n    return a - b\n"
                           "<file_sep>README.md\n# demo<file_sep>"
                           "<fim_prefix><fim_suffix>\n\nprint(add(1, 2))\n<fim_middle>"
                           "src/main.py\ndef add(a, b):\n    return ")


def test_spm_request_on_psm_only_family_stays_psm(servers):
    s = servers("qwen2.5-coder", "--fim-order", "spm")
    assert s.complete(prefix=PRE, suffix=SUF)["prompt"] == PSM["qwen2.5-coder"]
    assert s.post("/infill", {**INFILL, "input_extra": []})["prompt"] == PSM["qwen2.5-coder"]
