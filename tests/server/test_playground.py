"""The Monaco playground at /playground, as a user meets it: Debian's headless Chromium, driven by
Playwright, types into the editor on the session's real `nextok serve`, waits for the server's
ghost text, accepts it with Tab, and saves a screenshot (docs/playground.png is a copy of one).
Also: a clear 503/404 when the Monaco assets were never built."""
from __future__ import annotations

import os
import shutil
import time

import httpx
import pytest

from tests.server.conftest import MAIN_KEY

TYPED = "def fibonacci(n):\n"
GHOST = ".monaco-editor .ghost-text-decoration, .monaco-editor .ghost-text"


def chromium_or_skip() -> str:
    def missing(why: str):
        if os.environ.get("CI"):
            pytest.fail(f"{why}: `make system-deps` / `make venv` should have installed it")
        pytest.skip(why)

    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing("playwright is not installed (pip install playwright; make venv)")
    binary = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if binary is None:
        missing("chromium is not installed (apt-get install chromium; make system-deps)")
    return binary


def test_playground_completes_in_chromium(server, tmp_path):
    binary = chromium_or_skip()
    page_probe = httpx.get(server.url + "/playground", timeout=10)
    if page_probe.status_code == 503:
        pytest.fail(f"/playground has no Monaco assets (make playground): {page_probe.text}")
    from playwright.sync_api import sync_playwright

    t0 = time.monotonic()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=binary, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 520})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server.url + "/playground")
            page.wait_for_function("window.nextokPlayground && window.nextokPlayground.editor", timeout=20_000)
            page.wait_for_selector("#key-label:not([hidden])", timeout=10_000)  # the server has keys
            page.fill("#api-key", MAIN_KEY)
            assert page.evaluate("localStorage.getItem('nextok.apiKey')") == MAIN_KEY

            page.click(".monaco-editor .view-lines")
            page.keyboard.press("Control+End")
            page.keyboard.type(TYPED, delay=20)
            page.wait_for_selector(GHOST, timeout=20_000)
            last = page.evaluate("window.nextokPlayground.last")
            status = page.text_content("#status")
            shot = tmp_path / "playground.png"
            page.screenshot(path=str(shot))

            page.keyboard.press("Tab")
            page.wait_for_function("t => window.nextokPlayground.editor.getValue().includes(t)",
                                   arg=last["text"], timeout=5_000)
            value = page.evaluate("window.nextokPlayground.editor.getValue()")

            # Monaco's own "Canceled" rejection of a superseded completion (which nothing
            # awaits) is not reported; any other unhandled rejection still is
            seen = len(errors)
            page.evaluate("() => { const e = new Error('Canceled'); e.name = 'Canceled'; Promise.reject(e); }")
            page.evaluate("() => { Promise.reject(new Error('a real fault')); }")
            page.wait_for_timeout(300)
            rejections = errors[seen:]
            del errors[seen:]
        finally:
            browser.close()
    print(f"playground: completion {last['text']!r} in {last['ms']} ms; status {status!r}; "
          f"browser steps {time.monotonic() - t0:.1f}s; screenshot {shot}")

    assert not errors, errors
    assert len(rejections) == 1 and "a real fault" in rejections[0], rejections
    assert last["text"].strip() and last["ms"] > 0
    assert status.startswith("completion: ") and " ms" in status
    assert TYPED in value and last["text"] in value
    assert value.index(last["text"]) > value.index(TYPED.rstrip())
    assert shot.stat().st_size > 10_000


def test_playground_without_assets_says_how_to_build(tmp_path):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from nextok.server.playground import add_playground_routes

    static = tmp_path / "static"
    static.mkdir()
    (static / "index.html").write_text("<html></html>")
    (tmp_path / "secret.txt").write_text("outside")
    app = FastAPI()
    add_playground_routes(app, auth_enabled=True, model="m", static_dir=static)
    c = TestClient(app)
    r = c.get("/playground")
    assert r.status_code == 503 and "make playground" in r.text
    r = c.get("/playground/vs/loader.js")
    assert r.status_code == 404 and "make playground" in r.text
    assert c.get("/playground/config.json").json() == {"auth": True, "model": "m"}
    assert c.get("/playground/..%2fsecret.txt").status_code == 404  # never outside the folder

    (static / "vs").mkdir()
    (static / "vs" / "loader.js").write_text("// loader")
    assert c.get("/playground").status_code == 200
    assert c.get("/playground/vs/loader.js").text == "// loader"
