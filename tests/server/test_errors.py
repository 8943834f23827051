"""Bad requests get OpenAI-style 4xx/5xx bodies, and the server keeps serving others."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.server.conftest import LIMITED_KEY, MAIN_KEY, TPM_KEY, ServerProcess

OK_BODY = {"model": "smollm2-135m-instruct", "prompt": "def f(x):", "max_tokens": 4, "temperature": 0}


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    if param is not None:
        assert err["param"] == param
    return err


def still_serving(http: httpx.Client) -> None:
    r = http.post("/v1/completions", json=OK_BODY)
    assert r.status_code == 200 and r.json()["choices"][0]["text"]


def test_auth_missing_and_wrong_key(server, http):
    r = httpx.post(server.url + "/v1/completions", json=OK_BODY)
    assert_error(r, 401)
    assert r.headers["www-authenticate"] == "Bearer"
    r = httpx.post(server.url + "/v1/completions", json=OK_BODY, headers={"Authorization": "Bearer sk-wrong"})
    assert_error(r, 401)
    r = httpx.get(server.url + "/v1/models", headers={"Authorization": "Basic abc"})
    assert_error(r, 401)
    assert httpx.get(server.url + "/health").status_code == 200  # public
    still_serving(http)


def test_keys_never_logged(server, http):
    httpx.post(server.url + "/v1/completions", json=OK_BODY, headers={"Authorization": "Bearer sk-wrong-secret"})
    still_serving(http)
    logs = server.logs()
    assert MAIN_KEY not in logs and "sk-wrong-secret" not in logs
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{") and '"nextok.access"' in line]
    mine = [e for e in lines if e.get("key") == "main" and e.get("route") == "/v1/completions"]
    assert mine, logs[-2000:]
    entry = mine[-1]
    for field in ("id", "prompt_tokens", "completion_tokens", "ttft_ms", "total_ms", "finish_reason", "status"):
        assert field in entry
    assert entry["prompt_tokens"] > 0 and entry["completion_tokens"] > 0
    assert 0 < entry["ttft_ms"] <= entry["total_ms"]  # (not streamed: the engine's first-token time)


def test_rate_limit_rpm_and_tpm(server, http):
    limited = {"Authorization": f"Bearer {LIMITED_KEY}"}
    codes = [httpx.post(server.url + "/v1/completions", json=OK_BODY, headers=limited, timeout=60).status_code
             for _ in range(4)]
    assert codes[:3] == [200, 200, 200] and codes[3] == 429
    r = httpx.post(server.url + "/v1/completions", json=OK_BODY, headers=limited, timeout=60)
    assert_error(r, 429)
    assert 1 <= int(r.headers["retry-after"]) <= 60
    tpm = {"Authorization": f"Bearer {TPM_KEY}"}
    big = {**OK_BODY, "max_tokens": 150}
    assert httpx.post(server.url + "/v1/completions", json=big, headers=tpm, timeout=120).status_code == 200
    r = httpx.post(server.url + "/v1/completions", json=big, headers=tpm, timeout=120)  # 2 x ~155 > 200 tokens/min
    assert_error(r, 429)
    assert int(r.headers["retry-after"]) >= 1
    still_serving(http)  # other keys are unaffected


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": 5}, None),
    ({"prompt": "x", "temperature": 5.0}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "logprobs": 50}, "logprobs"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, None),
    ({"prompt": "x", "stop": [""]}, None),
    ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"99999999": 1}}, None),
    ({"prompt": [99999999]}, "prompt"),
    ({"prompt": [11192350306729316352, 51555]}, "prompt"),  # past 64 bits: the tokenizer overflowed (500)
    ({"prompt": [[5, 6], [-1]]}, None),  # (the schema refuses it)
    ({"max_tokens": 3}, "prompt"),
    ({"prompt": "x", "echo": True, "logprobs": 1}, "echo"),
])
def test_bad_completion_requests(http, body, param):
    assert_error(http.post("/v1/completions", json=body), 400, param)


def test_bad_chat_requests(http):
    assert_error(http.post("/v1/chat/completions", json={"messages": []}), 400)
    assert_error(http.post("/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]}), 400)
    assert_error(http.post("/v1/chat/completions", json={"messages": "hello"}), 400)
    assert_error(http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                         "top_logprobs": 2}), 400, "top_logprobs")
    still_serving(http)


def test_malformed_json_and_content(http):
    r = http.post("/v1/completions", content=b'{"prompt": "x", ', headers={"Content-Type": "application/json"})
    assert "JSON" in assert_error(r, 400)["message"]
    r = http.post("/v1/completions", content=b"\xff\xfe", headers={"Content-Type": "application/json"})
    assert_error(r, 400)
    still_serving(http)


def test_prompt_over_context(http):
    long_prompt = "hello " * 7000
    err = assert_error(http.post("/v1/completions", json={"prompt": long_prompt, "max_tokens": 4}), 400)
    assert "context" in err["message"]
    err = assert_error(http.post("/v1/completions", json={"prompt": "x", "max_tokens": 100000}), 400)
    assert "context" in err["message"]
    still_serving(http)


def test_unknown_model(http):
    err = assert_error(http.post("/v1/completions", json={**OK_BODY, "model": "gpt-9"}), 404, "model")
    assert err["code"] == "model_not_found"
    assert_error(http.post("/v1/chat/completions", json={"model": "gpt-9", "messages": [
        {"role": "user", "content": "x"}]}), 404)
    still_serving(http)


def test_body_too_large(server, http):
    big = json.dumps({"prompt": "x" * (5 << 20)}).encode()
    r = http.post("/v1/completions", content=big, headers={"Content-Type": "application/json"})
    assert_error(r, 413)

    def chunks():  # no Content-Length: the limit applies as the body streams in
        for _ in range(6):
            yield b" " * (1 << 20)

    r = http.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert_error(r, 413)
    still_serving(http)


@pytest.fixture(scope="module")
def small_server(model_path, tmp_path_factory):
    """One request at a time and one waiting: the third concurrent request is refused."""
    log = str(tmp_path_factory.mktemp("small") / "server.log")
    proc = ServerProcess(["--max-num-seqs", "1", "--max-queued-requests", "1"], log, model_path)
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def test_queue_full_503(small_server):
    url = small_server.url + "/v1/completions"
    slow = {"prompt": "Count: 1, 2, 3,", "max_tokens": 120, "ignore_eos": True, "temperature": 0}
    results = []

    def send():
        results.append(httpx.post(url, json=slow, timeout=120).status_code)

    def wait_for(running: int, waiting: int) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready = httpx.get(small_server.url + "/ready").json()
            if (ready.get("running"), ready.get("waiting")) == (running, waiting):
                return
            time.sleep(0.05)
        raise AssertionError(f"never saw running={running} waiting={waiting}: {ready}")

    threads = [threading.Thread(target=send) for _ in range(2)]
    threads[0].start()
    wait_for(1, 0)
    threads[1].start()
    wait_for(1, 1)
    r = httpx.post(url, json={"prompt": "x", "max_tokens": 2})
    assert_error(r, 503)
    assert r.headers.get("retry-after")
    for t in threads:
        t.join()
    assert results == [200, 200]
    r = httpx.post(url, json={"prompt": "x", "max_tokens": 2})  # the queue drained: served again
    assert r.status_code == 200
