"""`nextok lsp` driven over stdio by real LSP clients (tests/server/lsp_client.py, and pygls's own
LanguageClient in one test) against the
session's real `nextok serve` (the `server` fixture: no extra server process)."""
from __future__ import annotations

import time

import httpx
import pytest

pytest.importorskip("pygls")

from nextok.lsp.backend import window  # noqa: E402
from tests.server.conftest import MAIN_KEY, free_port, metric_value  # noqa: E402
from tests.server.lsp_client import LspProcess  # noqa: E402

PREFIX = ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
          "        self.items.append(item)\n\n    def pop(self):\n        ")
SUFFIX = "\n\n    def peek(self):\n        return self.items[-1]\n"
URI = "file:///tmp/nextok-lsp/stack.py"
REQUEST_CANCELLED, REQUEST_FAILED = -32800, -32803


def cursor(prefix: str) -> dict:
    """The LSP position at the end of `prefix` (ASCII here, so UTF-16 units are characters)."""
    return {"line": prefix.count("\n"), "character": len(prefix.rsplit("\n", 1)[-1])}


def at_cursor(uri: str, prefix: str, **extra) -> dict:
    return {"textDocument": {"uri": uri}, "position": cursor(prefix), **extra}


def running(server) -> float:
    return metric_value(httpx.get(server.url + "/metrics").text, "nextok:num_requests_running")


@pytest.fixture(scope="module")
def lsp(server):
    """`nextok lsp` on the session server, its key from NEXTOK_API_KEY."""
    proc = LspProcess("--server-url", server.url, "--max-tokens", "16", env={"NEXTOK_API_KEY": MAIN_KEY})
    init = proc.initialize()
    proc.open(URI, PREFIX + SUFFIX)
    yield proc, init
    assert proc.close() == 0, proc.stderr()


def test_window_bounds_lines_around_the_cursor():
    text = "a\nb\nc\nd|e\nf\ng\n"
    offset = text.index("|")
    assert window(text, offset, 1, 1) == ("c\nd", "|e\nf")
    assert window(text, offset, 0, 0) == ("d", "|e")
    assert window(text, offset, 100, 100) == (text[:offset], text[offset:])
    assert window("", 5, 3, 3) == ("", "")


def test_initialize_advertises_inline_and_completion(lsp):
    _, init = lsp
    caps = init["result"]["capabilities"]
    assert caps.get("inlineCompletionProvider") is not None and caps.get("completionProvider") is not None
    assert init["result"]["serverInfo"]["name"] == "nextok-lsp"


def test_inline_completion_is_the_servers_text(lsp, http):
    proc, _ = lsp
    r = proc.call("textDocument/inlineCompletion",
                  at_cursor(URI, PREFIX, context={"triggerKind": 1}))  # 1: Invoked
    assert "error" not in r, r
    items = r["result"]["items"]
    assert len(items) == 1 and items[0]["insertText"].strip()
    assert items[0]["range"]["start"] == cursor(PREFIX) == items[0]["range"]["end"]
    direct = http.post("/v1/code/complete", json={
        "prefix": PREFIX, "suffix": SUFFIX, "language": "python", "filepath": "/tmp/nextok-lsp/stack.py",
        "max_tokens": 16, "temperature": 0}).json()
    assert items[0]["insertText"] == direct["completion"]  # greedy, float32: deterministic


def test_completion_fallback_is_one_item_with_the_text(lsp, http):
    proc, _ = lsp
    inline = proc.call("textDocument/inlineCompletion", at_cursor(URI, PREFIX, context={"triggerKind": 1}))
    r = proc.call("textDocument/completion", at_cursor(URI, PREFIX))
    assert "error" not in r, r
    (item,) = r["result"]["items"]
    assert item["textEdit"]["newText"] == inline["result"]["items"][0]["insertText"]
    assert item["label"] and r["result"]["isIncomplete"] is True


def test_edits_are_seen_by_the_next_request(lsp):
    """didChange (incremental) moves the text the server completes."""
    proc, _ = lsp
    uri = "file:///tmp/nextok-lsp/edit.py"
    proc.open(uri, "")
    text = "import os\n\ndef list_files(path):\n    "
    proc.notify("textDocument/didChange", {
        "textDocument": {"uri": uri, "version": 2},
        "contentChanges": [{"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}},
                            "text": text}]})
    r = proc.call("textDocument/inlineCompletion", at_cursor(uri, text, context={"triggerKind": 1}))
    assert r["result"]["items"] and r["result"]["items"][0]["insertText"].strip()


def test_cancel_request_aborts_the_generation_on_the_server(server):
    proc = LspProcess("--server-url", server.url, "--api-key", MAIN_KEY, "--max-tokens", "400")
    try:
        proc.initialize()
        uri, text = "file:///tmp/nextok-lsp/story.md", "Once upon a time"
        proc.open(uri, text, language="markdown")
        m0 = httpx.get(server.url + "/metrics").text
        aborted0 = metric_value(m0, "nextok:http_requests_total", route="/v1/code/complete", status="499")
        msg_id = proc.request("textDocument/inlineCompletion", at_cursor(uri, text, context={"triggerKind": 2}))
        deadline = time.monotonic() + 30
        while running(server) < 1:  # the generation has started on the server
            assert time.monotonic() < deadline, "the request never reached the server"
            time.sleep(0.02)
        proc.notify("$/cancelRequest", {"id": msg_id})
        r = proc.response(msg_id, timeout=10)
        assert r.get("error", {}).get("code") == REQUEST_CANCELLED, r
        deadline = time.monotonic() + 10
        while running(server) != 0:
            assert time.monotonic() < deadline, "the cancelled generation is still running"
            time.sleep(0.05)
        deadline = time.monotonic() + 10  # the access log and metrics are written as it unwinds
        while metric_value(httpx.get(server.url + "/metrics").text, "nextok:http_requests_total",
                           route="/v1/code/complete", status="499") != aborted0 + 1:
            assert time.monotonic() < deadline, "the server did not see the request go"
            time.sleep(0.05)
        # cancelled right after it is sent, as editors do on the next keystroke
        msg_id = proc.request("textDocument/inlineCompletion", at_cursor(uri, text, context={"triggerKind": 2}))
        proc.notify("$/cancelRequest", {"id": msg_id})
        assert proc.response(msg_id, timeout=10)["error"]["code"] == REQUEST_CANCELLED
        deadline = time.monotonic() + 10
        while running(server) != 0:
            assert time.monotonic() < deadline, "the cancelled generation is still running"
            time.sleep(0.05)
    finally:
        assert proc.close() == 0, proc.stderr()


def test_newer_request_of_a_document_supersedes_the_older(server):
    """No $/cancelRequest: the shared session_id makes the server cancel the older generation,
    and its stale text is not offered."""
    proc = LspProcess("--server-url", server.url, "--api-key", MAIN_KEY, "--max-tokens", "400")
    try:
        proc.initialize()
        uri, text = "file:///tmp/nextok-lsp/tale.md", "Once upon a time"
        proc.open(uri, text, language="markdown")
        first = proc.request("textDocument/inlineCompletion", at_cursor(uri, text, context={"triggerKind": 2}))
        deadline = time.monotonic() + 30
        while running(server) < 1:
            assert time.monotonic() < deadline, "the request never reached the server"
            time.sleep(0.02)
        second = proc.request("textDocument/inlineCompletion", at_cursor(uri, text, context={"triggerKind": 2}))
        r = proc.response(first, timeout=20)
        assert r["result"] == {"items": []}, r
        proc.notify("$/cancelRequest", {"id": second})
        assert proc.response(second, timeout=10)["error"]["code"] == REQUEST_CANCELLED
        deadline = time.monotonic() + 10
        while running(server) != 0:
            assert time.monotonic() < deadline, "a generation is still running"
            time.sleep(0.05)
    finally:
        assert proc.close() == 0, proc.stderr()


def test_unreachable_server_is_an_error_response_not_a_crash():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    proc = LspProcess("--server-url", url)
    try:
        proc.initialize()
        proc.open(URI, PREFIX + SUFFIX)
        for method in ("textDocument/inlineCompletion", "textDocument/completion"):
            r = proc.call(method, at_cursor(URI, PREFIX, context={"triggerKind": 1}), timeout=30)
            assert r["error"]["code"] == REQUEST_FAILED and "cannot reach the nextok server" in r["error"]["message"]
            assert url in r["error"]["message"]
        shown = proc.notification("window/showMessage")
        assert shown["params"]["type"] == 1 and "cannot reach" in shown["params"]["message"]
        assert proc.proc.poll() is None  # still serving
    finally:
        assert proc.close() == 0, proc.stderr()
    assert "cannot reach" in proc.stderr() and "Traceback" not in proc.stderr()  # one line each


def test_server_4xx_carries_the_servers_message(server):
    proc = LspProcess("--server-url", server.url, "--api-key", "sk-wrong")
    try:
        proc.initialize()
        proc.open(URI, PREFIX + SUFFIX)
        r = proc.call("textDocument/inlineCompletion", at_cursor(URI, PREFIX, context={"triggerKind": 1}))
        assert r["error"]["code"] == REQUEST_FAILED
        assert "401" in r["error"]["message"] and "incorrect API key" in r["error"]["message"]
        assert "incorrect API key" in proc.notification("window/showMessage")["params"]["message"]
    finally:
        assert proc.close() == 0, proc.stderr()


def test_pygls_language_client_gets_the_inline_completion(server):
    """pygls's own LanguageClient (not the test's JSON-RPC client) drives `nextok lsp` over stdio:
    initialize, didOpen, textDocument/inlineCompletion -> the server's completion text."""
    import asyncio
    import os
    import sys

    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    async def run() -> str:
        client = LanguageClient("pygls-test-client", "1")
        await client.start_io(sys.executable, "-m", "nextok", "lsp", "--server-url", server.url,
                              "--max-tokens", "16", env={**os.environ, "NEXTOK_API_KEY": MAIN_KEY})
        try:
            await client.initialize_async(types.InitializeParams(capabilities=types.ClientCapabilities()))
            client.initialized(types.InitializedParams())
            client.text_document_did_open(types.DidOpenTextDocumentParams(
                types.TextDocumentItem(uri=URI, language_id="python", version=1, text=PREFIX + SUFFIX)))
            pos = cursor(PREFIX)
            result = await asyncio.wait_for(client.text_document_inline_completion_async(
                types.InlineCompletionParams(
                    context=types.InlineCompletionContext(types.InlineCompletionTriggerKind.Invoked),
                    text_document=types.TextDocumentIdentifier(URI),
                    position=types.Position(pos["line"], pos["character"]))), timeout=60)
            items = result.items if hasattr(result, "items") else result
            return items[0].insert_text if isinstance(items[0].insert_text, str) else items[0].insert_text.value
        finally:
            await client.shutdown_async(None)
            client.exit(None)
            await client.stop()

    text = asyncio.run(run())
    assert text.strip()
