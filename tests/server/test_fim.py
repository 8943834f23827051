"""FIM formats, detection, prompt layout and budgets, and document splitting.

Tokenizers are small real ones carrying each family's real special-token strings
(tests/server/fim_tokenizers.py); one test reads the default SmolLM2 GGUF's vocabulary.
"""
from __future__ import annotations

import os

import pytest

from nextok.server import fim
from nextok.server.code_context import (keep_head_lines, keep_tail_lines, language_spec,
                                        split_document)
from tests.server.fim_tokenizers import FAMILY_SPECIAL_TOKENS, build_tokenizer, token_counter

FAMILIES = ["starcoder2", "starcoder", "qwen2.5-coder", "codellama", "deepseek-coder"]
PRE, SUF = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    return {fam: build_tokenizer(fam, str(tmp_path_factory.mktemp(fam)))
            for fam in FAMILY_SPECIAL_TOKENS}


def prompt(tok, fmt, prefix=PRE, suffix=SUF, **kw):
    kw.setdefault("language", "python")
    return fim.build_code_prompt(fmt, prefix, suffix, count_tokens=token_counter(tok), **kw)


# ---- formats and detection ------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_detection_picks_the_family(tokenizers, family):
    assert fim.detect_fim_format(tokenizers[family]).name == family


def test_no_fim_tokens_detects_nothing(tokenizers):
    # SmolLM2-like: <repo_name>/<file_sep> exist, FIM tokens do not.
    assert fim.detect_fim_format(tokenizers["smollm2"]) is None


def test_exact_unicode_of_deepseek_and_codellama_tokens():
    ds = fim.DEEPSEEK_CODER
    assert [hex(ord(c)) for c in ds.prefix] == [
        "0x3c", "0xff5c", "0x66", "0x69", "0x6d", "0x2581", "0x62", "0x65", "0x67", "0x69",
        "0x6e", "0xff5c", "0x3e"]  # <｜fim▁begin｜>
    assert (ds.suffix, ds.middle) == ("<｜fim▁hole｜>", "<｜fim▁end｜>")
    assert fim.CODELLAMA.prefix == "\u2581<PRE>" and fim.CODELLAMA.stop_tokens[0] == "\u2581<EOT>"


def test_get_fim_format_by_name_and_alias():
    assert fim.get_fim_format("Qwen").name == "qwen2.5-coder"
    assert fim.get_fim_format("deepseek").name == "deepseek-coder"
    assert fim.get_fim_format("starcoder2") is fim.STARCODER2
    with pytest.raises(ValueError, match="unknown FIM format 'gpt-2'.*known formats: codellama"):
        fim.get_fim_format("gpt-2")


def test_resolve_fim_format(tokenizers):
    tok = tokenizers["qwen2.5-coder"]
    assert fim.resolve_fim_format(tok, None).name == "qwen2.5-coder"
    assert fim.resolve_fim_format(tok, "auto").name == "qwen2.5-coder"
    assert fim.resolve_fim_format(tok, "none") is None
    assert fim.resolve_fim_format(tok, "codellama").name == "codellama"


@pytest.mark.parametrize("family", FAMILIES)
def test_stop_token_ids_exist(tokenizers, family):
    tok = tokenizers[family]
    fmt = fim.get_fim_format(family)
    ids = fim.stop_token_ids(fmt, tok)
    assert tok.eos_token_id in ids
    assert all(i in tok.all_special_ids for i in ids)
    assert tok.token_to_id(fmt.prefix) in ids and tok.token_to_id(fmt.stop_tokens[0]) in ids


def test_stop_token_ids_without_fim_are_all_special_tokens(tokenizers):
    tok = tokenizers["smollm2"]
    ids = fim.stop_token_ids(None, tok)
    assert sorted(ids) == tok.all_special_ids
    assert tok.token_to_id("<file_sep>") in ids and tok.token_to_id("<|endoftext|>") in ids


# ---- layouts ----------------------------------------------------------------------------------
LAYOUTS = {  # family: (PSM, SPM) for PRE/SUF with no path and no context
    "starcoder2": ("<fim_prefix>{p}<fim_suffix>{s}<fim_middle>",
                   "<fim_prefix><fim_suffix>{s}<fim_middle>{p}"),
    "starcoder": ("<fim_prefix>{p}<fim_suffix>{s}<fim_middle>",
                  "<fim_prefix><fim_suffix>{s}<fim_middle>{p}"),
    "qwen2.5-coder": ("<|fim_prefix|>{p}<|fim_suffix|>{s}<|fim_middle|>", None),
    "codellama": ("\u2581<PRE> {p}\u2581<SUF>{s}\u2581<MID>",
                  "\u2581<PRE>\u2581<SUF>{s}\u2581<MID> {p}"),
    "deepseek-coder": ("<｜fim▁begin｜>{p}<｜fim▁hole｜>{s}<｜fim▁end｜>", None),
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("order", ["psm", "spm"])
def test_fim_layout(tokenizers, family, order):
    tok, fmt = tokenizers[family], fim.get_fim_format(family)
    psm, spm = LAYOUTS[family]
    p = prompt(tok, fmt, order=order)
    expected = (spm if order == "spm" and spm else psm).format(p=PRE, s=SUF)
    assert p.text == expected
    assert p.fim and p.format == family and p.stop == list(fmt.stop_tokens)
    # Families without SPM fall back to PSM and say so.
    assert p.order == (order if spm else "psm")
    assert p.prompt_tokens == len(tok.encode(p.text, add_special_tokens=False))


@pytest.mark.parametrize("family", FAMILIES)
def test_fim_tokens_encode_to_single_special_ids(tokenizers, family):
    tok, fmt = tokenizers[family], fim.get_fim_format(family)
    ids = tok.encode(prompt(tok, fmt).text, add_special_tokens=False)
    for t in (fmt.prefix, fmt.suffix, fmt.middle):
        tid = tok.token_to_id(t)
        assert tid in tok.all_special_ids and ids.count(tid) == 1
    assert tok.decode(ids, skip_special_tokens=True).replace(" ", "") == (PRE + SUF).replace(" ", "")


CTX = [{"filepath": "src/util.py", "content": "def helper():\n    return 1\n"},
       {"filepath": "src/const.py", "content": "PI = 3.14"}]
REPO_LAYOUTS = {
    "starcoder2": "<repo_name>me/proj<file_sep>src/util.py\ndef helper():\n    return 1\n"
                  "<file_sep>src/const.py\nPI = 3.14"
                  "<file_sep><fim_prefix>src/main.py\n{p}<fim_suffix>{s}<fim_middle>",
    "qwen2.5-coder": "<|repo_name|>me/proj\n<|file_sep|>src/util.py\ndef helper():\n    return 1\n"
                     "<|file_sep|>src/const.py\nPI = 3.14\n<|file_sep|>src/main.py\n"
                     "<|fim_prefix|>{p}<|fim_suffix|>{s}<|fim_middle|>",
    "starcoder": "<fim_prefix># src/util.py\ndef helper():\n    return 1\n# src/const.py\nPI = 3.14\n"
                 "# src/main.py\n{p}<fim_suffix>{s}<fim_middle>",
    "codellama": "\u2581<PRE> # src/util.py\ndef helper():\n    return 1\n# src/const.py\nPI = 3.14\n"
                 "# src/main.py\n{p}\u2581<SUF>{s}\u2581<MID>",
    "deepseek-coder": "<｜fim▁begin｜># src/util.py\ndef helper():\n    return 1\n# src/const.py\n"
                      "PI = 3.14\n# src/main.py\n{p}<｜fim▁hole｜>{s}<｜fim▁end｜>",
}


@pytest.mark.parametrize("family", FAMILIES)
def test_repo_context_layout(tokenizers, family):
    tok, fmt = tokenizers[family], fim.get_fim_format(family)
    p = prompt(tok, fmt, filepath="src/main.py", extra_context=CTX, repo_name="me/proj")
    assert p.text == REPO_LAYOUTS[family].format(p=PRE, s=SUF)
    assert p.context_files == 2 and p.context_paths == ["src/util.py", "src/const.py"]


def test_starcoder2_spm_with_repo_context(tokenizers):
    p = prompt(tokenizers["starcoder2"], fim.STARCODER2, filepath="a.py", order="spm",
               extra_context=CTX[:1])
    assert p.text == ("<file_sep>src/util.py\ndef helper():\n    return 1\n<file_sep>"
                      f"<fim_prefix><fim_suffix>{SUF}<fim_middle>a.py\n{PRE}")


def test_no_fim_prompt_is_headers_then_prefix(tokenizers):
    tok = tokenizers["smollm2"]
    p = prompt(tok, None, filepath="src/main.py", extra_context=CTX)
    assert p.text == ("# src/util.py\ndef helper():\n    return 1\n# src/const.py\nPI = 3.14\n"
                      "# src/main.py\n" + PRE)
    assert not p.fim and p.format is None and p.order is None and p.stop == []
    js = prompt(tok, None, prefix="let x = ", suffix="", language="typescript", filepath="a.ts")
    assert js.text == "// a.ts\nlet x = "
    html = prompt(tok, None, prefix="<p>", suffix="", language="", filepath="index.html")
    assert html.text == "<!-- index.html -->\n<p>"


def test_language_spec():
    assert language_spec("Python").comment == ("#", "")
    assert language_spec("c#").name == "csharp" and language_spec("c#").blocks == "braces"
    assert language_spec(None, "x/y.rs").name == "rust"
    assert language_spec("whatever").comment == ("#", "")


def test_bad_arguments(tokenizers):
    tok = tokenizers["starcoder2"]
    with pytest.raises(ValueError, match="order"):
        prompt(tok, fim.STARCODER2, order="pms")
    with pytest.raises(ValueError, match="extra_context\\[0\\]"):
        prompt(tok, fim.STARCODER2, extra_context=[{"path": "a.py"}])


# ---- budgets and trimming -------------------------------------------------------------------
BIG_PREFIX = "".join(f"value_{i} = compute({i})\n" for i in range(300)) + "result = "
BIG_SUFFIX = "\n" + "".join(f"check(value_{i})\n" for i in range(300))


@pytest.mark.parametrize("family", ["starcoder2", "qwen2.5-coder", "codellama", None])
def test_trimming_keeps_the_code_nearest_the_cursor(tokenizers, family):
    tok = tokenizers[family or "smollm2"]
    fmt = fim.get_fim_format(family) if family else None
    p = prompt(tok, fmt, BIG_PREFIX, BIG_SUFFIX, max_prompt_tokens=400, context_tokens=0)
    assert p.prompt_tokens <= 400
    kept_prefix = BIG_PREFIX[p.prefix_start:]
    assert kept_prefix in p.text and "value_299 = compute(299)\nresult = " in p.text
    assert "value_0 = " not in p.text
    assert p.prefix_start > 0 and BIG_PREFIX[p.prefix_start - 1] == "\n"  # a line boundary
    first_line = BIG_PREFIX[:p.prefix_start].count("\n")
    assert first_line % 8 == 0  # aligned, for a stable prompt start
    if fmt is not None:
        kept_suffix = BIG_SUFFIX[:p.suffix_kept]
        assert kept_suffix.endswith("\n") and kept_suffix in p.text
        assert "check(value_0)" in p.text and "check(value_299)" not in p.text
        assert 0 < p.suffix_kept < len(BIG_SUFFIX)


def test_context_is_trimmed_first_in_order_and_stays_stable(tokenizers):
    tok, fmt = tokenizers["qwen2.5-coder"], fim.QWEN_CODER
    files = [{"filepath": f"m{k}.py", "content": "".join(f"def f{k}_{i}(): pass\n" for i in range(20))}
             for k in range(4)]
    p1 = prompt(tok, fmt, BIG_PREFIX, BIG_SUFFIX, extra_context=files, max_prompt_tokens=800,
                context_tokens=300, filepath="main.py")
    assert 1 <= p1.context_files < 4
    assert p1.context_paths == [f"m{k}.py" for k in range(p1.context_files)]
    assert "def f0_0(): pass\n" in p1.text and "m3.py" not in p1.text
    # The context is the prompt's first part, and does not depend on the cursor.
    ctx_end = p1.text.index("<|file_sep|>main.py")
    p2 = prompt(tok, fmt, BIG_PREFIX[:-200], BIG_SUFFIX, extra_context=files,
                max_prompt_tokens=800, context_tokens=300, filepath="main.py")
    assert p2.text[:ctx_end] == p1.text[:ctx_end]
    # Context never takes more than half the prompt, whatever it is given.
    p3 = prompt(tok, fmt, BIG_PREFIX, BIG_SUFFIX, extra_context=files, max_prompt_tokens=400,
                context_tokens=10_000)
    assert p3.prompt_tokens <= 400 and "result = " in p3.text


def _cursor_line_start(p, prefix):
    kept = prefix[p.prefix_start:]
    return p.text.rindex(kept) + kept.rfind("\n") + 1


@pytest.mark.parametrize("family,order", [("starcoder2", "psm"), ("starcoder2", "spm"),
                                          ("qwen2.5-coder", "psm"), ("codellama", "spm"),
                                          (None, "psm")])
def test_keystrokes_share_the_prompt_up_to_the_cursor_line(tokenizers, family, order):
    tok = tokenizers[family or "smollm2"]
    fmt = fim.get_fim_format(family) if family else None
    typed = "compute_total(values, weights)"
    kw = dict(extra_context=CTX, filepath="main.py", order=order, max_prompt_tokens=500,
              context_tokens=100)
    prompts = [prompt(tok, fmt, BIG_PREFIX + typed[:n], BIG_SUFFIX, **kw)
               for n in range(len(typed) + 1)]
    starts = {BIG_PREFIX[:p.prefix_start].count("\n") for p in prompts}
    assert len(starts) <= 2 and all(s % 8 == 0 for s in starts)
    shared = 0
    for p1, p2, n in zip(prompts, prompts[1:], range(len(typed))):
        if p1.prefix_start != p2.prefix_start:
            continue
        shared += 1
        common = os.path.commonprefix([p1.text, p2.text])
        assert len(common) >= _cursor_line_start(p1, BIG_PREFIX + typed[:n])
    assert shared >= len(typed) - 1


def test_keep_lines_helpers():
    count = len  # one token per character
    text = "aaaa\nbbbb\ncccc\ndd"
    assert keep_tail_lines(text, 8, count) == "cccc\ndd"
    assert keep_tail_lines(text, 8, count, align=2) == "cccc\ndd"
    assert keep_tail_lines(text, 12, count, align=2) == "cccc\ndd"  # line 1 rounds up to 2
    assert keep_tail_lines(text, 1, count) == "d"  # the cursor line alone is too long
    assert keep_head_lines(text, 11, count) == "aaaa\nbbbb\n"
    assert keep_head_lines(text, 3, count) == "aaa"
    assert keep_head_lines(text, 3, count, partial_line=False) == ""
    assert keep_tail_lines(text, 0, count) == keep_head_lines(text, 0, count) == ""


# ---- split_document ---------------------------------------------------------------------------
def test_split_document_basic_and_crlf():
    code = "def f():\r\n    return 1\r\nx = f()"
    assert split_document(code, 1, 4) == ("def f():\r\n    ", "return 1\r\nx = f()")
    assert split_document(code, 2, 7) == (code, "")
    assert split_document(code, 0, 99) == ("def f():", "\r\n    return 1\r\nx = f()")  # clamped
    assert split_document("a\rb", 1, 1) == ("a\rb", "")  # a lone CR ends a line too
    assert split_document("", 0, 0) == ("", "")
    assert split_document("x\n", 1, 0) == ("x\n", "")


def test_split_document_utf16_offsets():
    code = "s = '😀é'  # ok\nnext"
    # UTF-16: "s = '" is 5 units, 😀 is 2, é is 1.
    assert split_document(code, 0, 7) == ("s = '😀", "é'  # ok\nnext")
    assert split_document(code, 0, 8) == ("s = '😀é", "'  # ok\nnext")
    with pytest.raises(ValueError, match="surrogate pair"):
        split_document(code, 0, 6)


def test_split_document_errors():
    with pytest.raises(ValueError, match="line 3 is out of range: the document has 2 line"):
        split_document("a\nb", 3, 0)
    with pytest.raises(ValueError, match="negative"):
        split_document("a", 0, -1)


# ---- the default model ------------------------------------------------------------------------
SMOLLM2_GGUF = os.path.expanduser("~/.cache/nextok/models/SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.skipif(not os.path.isfile(SMOLLM2_GGUF), reason="default model not downloaded")
def test_smollm2_has_no_fim_tokens():
    from nextok.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(SMOLLM2_GGUF)
    assert fim.detect_fim_format(tok) is None
    for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|fim_prefix|>", "\u2581<PRE>"):
        assert tok.token_to_id(t) is None
    # It does carry StarCoder's repo-level and metadata tokens, as special tokens.
    for t in ("<repo_name>", "<file_sep>", "<filename>", "<reponame>", "<gh_stars>"):
        assert tok.token_to_id(t) in tok.all_special_ids
    p = fim.build_code_prompt(None, PRE, SUF, count_tokens=token_counter(tok), language="python")
    assert p.text == PRE and not p.fim
    assert tok.token_to_id("<|endoftext|>") in fim.stop_token_ids(None, tok)
