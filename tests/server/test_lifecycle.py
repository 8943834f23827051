"""Robustness: client disconnects, SIGTERM drain, a failing request, a dying engine, slow clients."""
from __future__ import annotations

import json
import signal
import socket
import threading
import time

import httpx
import pytest

from tests.server.conftest import MAIN_KEY, ServerProcess, metric_value

AUTH = {"Authorization": f"Bearer {MAIN_KEY}"}
LONG = {"prompt": "Count: 1, 2, 3,", "max_tokens": 400, "ignore_eos": True, "temperature": 0, "stream": True}


def metrics(url: str) -> str:
    return httpx.get(url + "/metrics").text


def wait_until(pred, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_disconnect_aborts_and_frees_kv(server, http):
    before = metrics(server.url)
    aborted0 = metric_value(before, "nextok:request_success_total", finished_reason="abort")
    wait_until(lambda: metric_value(metrics(server.url), "nextok:num_requests_running") == 0, what="idle")
    kv0 = metric_value(metrics(server.url), "nextok:kv_cache_usage_perc")
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=LONG) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(12)]  # a few tokens in: KV blocks are held now
            assert any(line.startswith("data: {") for line in got)
            assert metric_value(metrics(server.url), "nextok:kv_cache_usage_perc") > kv0
    # the connection is closed mid-stream: the request must be aborted and its blocks freed
    wait_until(lambda: metric_value(metrics(server.url), "nextok:request_success_total",
                                    finished_reason="abort") == aborted0 + 1, what="abort counted")
    wait_until(lambda: metric_value(metrics(server.url), "nextok:kv_cache_usage_perc") == kv0, what="KV freed")
    assert metric_value(metrics(server.url), "nextok:num_requests_running") == 0
    r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 200


def test_non_streaming_disconnect_aborts(server):
    aborted0 = metric_value(metrics(server.url), "nextok:request_success_total", finished_reason="abort")
    body = json.dumps({**LONG, "stream": False}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Authorization: Bearer {MAIN_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: metric_value(metrics(server.url), "nextok:num_requests_running") == 1, what="running")
    wait_until(lambda: metric_value(metrics(server.url), "nextok:request_success_total",
                                    finished_reason="abort") == aborted0 + 1, what="abort counted")
    wait_until(lambda: metric_value(metrics(server.url), "nextok:num_requests_running") == 0, what="idle")


def test_slow_reader_does_not_block_others(server, http):
    """A client that never reads its stream leaves the engine and other clients unaffected."""
    body = json.dumps({**LONG, "max_tokens": 200}).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Authorization: Bearer {MAIN_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    try:
        for _ in range(3):  # meanwhile, others are served in full
            r = http.post("/v1/completions", json={"prompt": "def f(x):", "max_tokens": 16, "temperature": 0})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
        data = b""
        s.settimeout(60)
        while b"data: [DONE]" not in data:  # and the slow reader still gets every token
            chunk = s.recv(65536)
            assert chunk, "connection closed early"
            data += chunk
        texts = [json.loads(line[6:])["choices"][0] for line in data.decode().split("\n")
                 if line.startswith("data: {")]
        assert texts[-1]["finish_reason"] == "length"
    finally:
        s.close()


def test_sigterm_drains_in_flight_and_exits_zero(model_path, tmp_path):
    proc = ServerProcess([], str(tmp_path / "server.log"), model_path).wait_ready()
    results: list = []

    def stream_one():
        with httpx.stream("POST", proc.url + "/v1/completions", timeout=120,
                          json={**LONG, "max_tokens": 40}) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        results.append(chunks)

    threads = [threading.Thread(target=stream_one) for _ in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: metric_value(metrics(proc.url), "nextok:num_requests_running") == 2, what="both running")
    proc.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(120)
    assert proc.proc.wait(60) == 0, proc.logs()
    assert len(results) == 2
    for chunks in results:
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"  # ran to the end
        assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["text"]) >= 30
    with pytest.raises(httpx.ConnectError):
        httpx.get(proc.url + "/health")
    proc.stop()


def test_failing_request_is_500_others_fine(model_path, tmp_path):
    proc = ServerProcess([], str(tmp_path / "server.log"), model_path,
                         entry=("tests.server.faulty_server", "request")).wait_ready()
    try:
        r = httpx.post(proc.url + "/v1/completions", json={"prompt": "BOOM goes", "max_tokens": 4}, timeout=60)
        assert r.status_code == 500 and r.json()["error"]["type"] == "internal_error"
        with httpx.stream("POST", proc.url + "/v1/completions", timeout=60,
                          json={"prompt": "BOOM again", "max_tokens": 4, "stream": True}) as s:
            lines = [line for line in s.iter_lines() if line.startswith("data: ")]
        assert "error" in json.loads(lines[-2][6:]) and lines[-1] == "data: [DONE]"
        r = httpx.post(proc.url + "/v1/completions", json={"prompt": "fine", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200
        assert httpx.get(proc.url + "/ready").status_code == 200
        m = metrics(proc.url)
        assert metric_value(m, "nextok:request_success_total", finished_reason="error") == 2
    finally:
        assert proc.stop() == 0


def test_engine_death_fails_ready_and_exits_nonzero(model_path, tmp_path):
    proc = ServerProcess([], str(tmp_path / "server.log"), model_path,
                         entry=("tests.server.faulty_server", "engine")).wait_ready()
    r = httpx.post(proc.url + "/v1/completions", json={"prompt": "CRASH now", "max_tokens": 4}, timeout=60)
    assert r.status_code in (500, 503) and "error" in r.json()
    assert proc.proc.wait(60) == 1, proc.logs()
    assert "engine loop died" in proc.logs()
    proc.stop()
