"""The keystroke workload: editor sessions typed through real files, and runs against a real server.

The sessions are checked against the file they type (every request's document is the file with
the not-yet-typed span cut out); the end-to-end tests start `nextok serve` on a tiny random-weight
FIM model from `fim_model.py` and type much faster than it completes, so older requests are
superseded whatever the machine's speed.
"""
from __future__ import annotations

import argparse
import asyncio
import os

import pytest

from nextok.bench import keystroke as ks
from nextok.bench import keystroke_sessions as editor
from nextok.bench.load import HttpBackend

SPEC = editor.TypingSpec(every=3, cps=8.0, jitter=0.3, line_pause=1.0, min_chars=150, max_chars=400,
                         prefix_chars=600, suffix_chars=300)


@pytest.fixture(scope="module")
def python_files():
    return {"python": editor.candidate_files("python")[:40]}


# ---- sessions -------------------------------------------------------------------------------
def _key(sessions):
    return [(s.path, s.start, s.end, s.keystrokes) for s in sessions]


def test_sessions_are_deterministic_per_seed(python_files):
    a = editor.build_sessions(5, python_files, SPEC, seed=7)
    assert _key(a) == _key(editor.build_sessions(5, python_files, SPEC, seed=7))
    assert _key(a) != _key(editor.build_sessions(5, python_files, SPEC, seed=8))
    # session i does not depend on how many sessions follow it
    assert _key(a[:3]) == _key(editor.build_sessions(3, python_files, SPEC, seed=7))
    assert len({s.session_id for s in a}) == 5


def test_each_request_is_the_file_with_the_untyped_span_cut_out(python_files):
    for s in editor.build_sessions(6, python_files, SPEC, seed=1):
        text, n = s.text, s.end - s.start
        assert text == open(s.path, encoding="utf-8").read()
        # typing starts at a non-blank line past the first fifth, and types up to a line end
        assert text[s.start - 1] == "\n" and text[s.start:text.index("\n", s.start)].strip()
        assert s.start >= 0.2 * len(text) and n <= SPEC.max_chars
        assert n >= SPEC.min_chars or s.end == len(text) or n == SPEC.max_chars or text[s.end] == "\n"
        # a request every 3 characters, and one right after each newline typed
        after_newline = {i + 1 for i, c in enumerate(text[s.start:s.end]) if c == "\n"}
        assert [k.typed for k in s.keystrokes] == sorted(set(range(3, n, 3)) | after_newline | {n})
        for k in s.keystrokes:
            doc, cursor = s.document(k.typed), s.start + k.typed
            assert doc == text[:s.start + k.typed] + text[s.end:]
            assert doc[:cursor].endswith(k.prefix) and doc[cursor:].startswith(k.suffix)
            assert k.suffix.startswith(text[s.end:s.end + 1])  # what follows the span stays
            # windows in whole lines: the prefix starts a line, the cut suffix ends one
            first = cursor - len(k.prefix)
            assert first == 0 or doc[first - 1] == "\n"
            head = cursor - (doc.rfind("\n", 0, cursor) + 1)
            assert len(k.prefix) - head <= SPEC.prefix_chars and len(k.suffix) <= SPEC.suffix_chars
            assert k.suffix.endswith("\n") or cursor + len(k.suffix) == len(doc) or "\n" not in k.suffix


def test_requests_go_out_at_the_typing_pace_with_a_pause_after_each_line(python_files):
    pauses = 0
    for s in editor.build_sessions(4, python_files, SPEC, seed=2):
        typed = s.text[s.start:s.end]
        prev_at, prev_typed = 0.0, 0
        for k in s.keystrokes:
            chars = k.typed - prev_typed
            # the typist stops after each newline, before typing the next character
            lines = typed[max(prev_typed - 1, 0):k.typed - 1].count("\n")
            pauses += lines
            gap = k.at - prev_at - lines * SPEC.line_pause
            assert chars * 0.7 / SPEC.cps - 1e-9 <= gap <= chars * 1.3 / SPEC.cps + 1e-9
            prev_at, prev_typed = k.at, k.typed
    assert pauses > 0  # the spans cross lines


def test_prefix_window_start_moves_only_with_the_cursor_line(python_files):
    moved_within_line = 0
    for s in editor.build_sessions(6, python_files, SPEC, seed=3):
        for a, b in zip(s.keystrokes, s.keystrokes[1:]):
            if "\n" in s.text[s.start + a.typed:s.start + b.typed]:
                continue
            start_a = s.start + a.typed - len(a.prefix)
            moved_within_line += start_a != s.start + b.typed - len(b.prefix)
    assert moved_within_line == 0


def test_editor_windows_cut_at_line_boundaries():
    doc = "aaaa\nbbbb\ncccc\ndd|ee\nffff\ngggg\n".replace("|", "")
    cursor = doc.index("ee")
    assert editor.editor_windows(doc, cursor, 6, 8) == ("cccc\ndd", "ee\nffff\n")
    assert editor.editor_windows(doc, cursor, 6, 7) == ("cccc\ndd", "ee\n")
    assert editor.editor_windows(doc, cursor, 100, 100) == (doc[:cursor], doc[cursor:])
    assert editor.editor_windows(doc, cursor, 0, 1) == ("dd", "e")  # no whole line fits: cut


# ---- source files ---------------------------------------------------------------------------
def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def test_file_discovery_keeps_typeable_sources(tmp_path):
    code = "".join(f"int f{i}(int x) {{ return x + {i}; }}\n" for i in range(120))  # ~4 KB
    tree = tmp_path / "llama.cpp"
    _write(f"{tree}/src/ok.c", code)
    _write(f"{tree}/src/tiny.c", "int x;\n")
    _write(f"{tree}/src/huge.c", code * 60)
    _write(f"{tree}/tools/ui/app.js", code.replace("int", "let"))
    _write(f"{tree}/tools/ui/app.min.js", "var a=1;" * 600)  # one 4.8 KB line
    _write(f"{tree}/tools/ui/node_modules/dep.js", code)
    _write(f"{tree}/src/other.js", code)  # not under tools/ or examples/
    _write(f"{tmp_path}/include/sys/types.h", code)
    roots = {"llama_cpp": str(tree), "headers": str(tmp_path / "include"), "go_examples": str(tmp_path / "go")}
    assert editor.candidate_files("c", **roots) == [f"{tree}/src/ok.c"]
    js = editor.candidate_files("javascript", **roots)
    assert sorted(js) == [f"{tree}/tools/ui/app.js", f"{tree}/tools/ui/app.min.js"]
    assert editor.read_source(f"{tree}/tools/ui/app.js") == code.replace("int", "let")
    assert editor.read_source(f"{tree}/tools/ui/app.min.js") is None  # minified
    assert editor.candidate_files("go", **roots) == []
    # without the llama.cpp tree, C comes from the system headers
    no_tree = {**roots, "llama_cpp": str(tmp_path / "absent")}
    assert editor.candidate_files("c", **no_tree) == [f"{tmp_path}/include/sys/types.h"]
    assert editor.candidate_files("javascript", **no_tree) == []
    with pytest.raises(ValueError):
        editor.candidate_files("cobol")


def test_language_without_files_is_skipped_unless_asked_for(monkeypatch, capsys):
    monkeypatch.setattr(ks, "candidate_files", lambda lang: [] if lang == "go" else [f"/x/{lang}"])
    assert list(ks._files_by_language(None)) == ["python", "c", "javascript"]
    assert "no go source files" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no go source files"):
        ks._files_by_language("python,go")


def test_prefix_cache_counters_from_prometheus_text():
    text = ('# HELP nextok:prefix_cache_hits_total Prompt tokens served from the prefix cache.\n'
            'nextok:prefix_cache_hits_total{model_name="m"} 30.0\n'
            'nextok:prefix_cache_hits_created{model_name="m"} 1.7e9\n'
            'nextok:prefix_cache_queries_total{model_name="m"} 100.0\n'
            'nextok:prefix_cache_queries_total{model_name="n"} 20.0\n')
    assert ks.parse_prefix_cache_counters(text) == {"hits": 30.0, "queries": 120.0}
    assert ks.parse_prefix_cache_counters("up 1\n") is None
    # before the first request a labelled counter has only its TYPE line
    fresh = "# TYPE nextok:prefix_cache_queries_total counter\n# TYPE nextok:prefix_cache_hits_total counter\n"
    assert ks.parse_prefix_cache_counters(fresh) == {"hits": 0.0, "queries": 0.0}
    report = ks.prefix_cache_report({"hits": 30.0, "queries": 120.0}, {"hits": 90.0, "queries": 220.0}, [])
    assert report["hit_rate"] == 0.6 and report["source"] == "server /metrics"


# ---- against a real server ------------------------------------------------------------------
@pytest.fixture(scope="module")
def fim_model_dir(tmp_path_factory):
    from nextok.bench.fim_model import write_fim_model

    return write_fim_model(str(tmp_path_factory.mktemp("keystroke") / "fim"), num_hidden_layers=2,
                           hidden_size=64, intermediate_size=128, num_attention_heads=4,
                           num_key_value_heads=2)


def test_fim_model_is_the_default_tokenizer_plus_starcoder2_fim_tokens(fim_model_dir, model_path):
    import json

    from nextok.server.fim import detect_fim_format
    from nextok.tokenizer import Tokenizer

    tok, base = Tokenizer.from_dir(fim_model_dir), Tokenizer.from_gguf(model_path)
    assert detect_fim_format(tok).name == "starcoder2"
    code = open(editor.candidate_files("python")[0], encoding="utf-8").read()
    assert tok.encode(code) == base.encode(code)  # the real tokenizer, so real prompt lengths
    with open(os.path.join(fim_model_dir, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["vocab_size"] == tok.vocab_size == base.vocab_size + 4  # <repo_name>, <file_sep> existed
    assert cfg["eos_token_id"] == tok.token_to_id("<|endoftext|>") == tok.eos_token_id
    assert cfg["num_hidden_layers"] == 2 and cfg["max_position_embeddings"] == 8192


@pytest.fixture(scope="module")
def fim_server(fim_model_dir):
    from tests.server.conftest import ServerProcess

    proc = ServerProcess(["--load-format", "dummy", "--fim-order", "psm", "--num-threads", "1"],
                         os.path.join(os.path.dirname(fim_model_dir), "server.log"), fim_model_dir)
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def _bench_args(*argv):
    from nextok.bench import serve_bench

    parser = argparse.ArgumentParser()
    serve_bench.add_parser(parser.add_subparsers())
    return parser.parse_args(["serve", "--base-url", "unused", "--dataset", "keystroke", *argv])


def test_fast_typing_against_nextok_supersedes_and_hits_the_cache(fim_server, fim_model_dir):
    """Typing at 2000 chars/s, requests go out about every 1.5 ms: far faster than any
    completion, so the server cancels the older ones; the last of each session completes."""
    from nextok.tokenizer import Tokenizer

    args = _bench_args("--num-sessions", "2", "--session-languages", "python", "--typing-cps", "2000",
                       "--typed-chars", "30:45", "--keystroke-max-tokens", "8", "--seed", "4")
    tokenizer = Tokenizer.from_dir(fim_model_dir)

    async def run():
        backend = HttpBackend(fim_server.url, "code", model="smollm2-135m-instruct")
        try:
            return await ks.run_from_args(args, backend, tokenizer)
        finally:
            await backend.aclose()

    out = asyncio.run(run())
    s = out["summary"]
    assert s["num_requests"] == s["planned_requests"] == sum(x["requests"] for x in out["sessions"])
    assert s["failed"] == 0, s["errors"]
    assert s["superseded"] > 0 and s["superseded"] + s["completed"] == s["num_requests"]
    assert s["completed"] >= 2 and 0 < s["superseded_share"] < 1
    assert s["prefix_cache"]["source"] == "server /metrics" and s["prefix_cache_hit_rate"] > 0
    assert s["latency_ms"]["p50"] > 0 and set(s["latency_ms"]) >= {"mean", "p50", "p90", "p99"}
    assert set(s["by_language"]) == {"python"} and s["by_language"]["python"]["sessions"] == 2
    assert len(out["files"]) >= 1 and out["settings"]["cps"] == 2000 and not out["settings"]["client_abort"]
    assert "Superseded share" in ks.format_summary(s)


def test_peer_endpoint_without_sessions_aborts_client_side(fim_server, python_files):
    """/infill has no session: the client abandons the older request itself."""
    spec = editor.TypingSpec(every=3, cps=2000, min_chars=30, max_chars=45)
    sessions = editor.build_sessions(2, python_files, spec, seed=5)

    async def run():
        backend = HttpBackend(fim_server.url, "infill")
        try:
            return await ks.run_keystroke(backend, sessions, max_tokens=8, time_limit=120)
        finally:
            await backend.aclose()

    records, _ = asyncio.run(run())
    results = [r.result for r in records]
    assert len(results) == sum(len(s.keystrokes) for s in sessions)
    assert any(r.superseded and r.error == "aborted by the next keystroke" for r in results)
    last = {r.session: r.result for r in records}  # each session's final request is never aborted
    assert all(r.ok for r in last.values()), [r.error for r in last.values()]
