"""`nextok bench serve`'s client against a small fake server whose delays are known.

The fake server streams `max_tokens` chunks: the first after TTFT seconds, then one every GAP
seconds, in the shapes of OpenAI /v1/completions, nextok /v1/code/complete and llama.cpp /infill.
asyncio.sleep never returns early, so each measured figure is at least the injected one; the
upper bounds leave room for a busy 2-core machine (these are not speed tests, they check that
the client measures what happened).
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from nextok.bench.load import BenchRequest, HttpBackend, run_load
from nextok.bench.serve_metrics import parse_slo, summarize

TTFT, GAP, TOKENS = 0.30, 0.05, 8
SLACK = 0.25  # seconds of scheduling noise allowed on top of an injected delay


def sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def completions(request: Request):
    body = await request.json()
    n = body["max_tokens"]
    if body.get("prompt") == "reject":
        return JSONResponse({"error": {"message": "prompt too long", "type": "invalid_request_error"}}, 400)
    hang = body.get("prompt") == "hang"

    async def stream():
        await asyncio.sleep(3600 if hang else TTFT)
        for i in range(n):
            if i:
                await asyncio.sleep(GAP)
            yield sse({"choices": [{"index": 0, "text": f"t{i}", "finish_reason": "length" if i == n - 1 else None}]})
        if body.get("stream_options", {}).get("include_usage"):
            yield sse({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": n, "total_tokens": 11 + n}})
        yield "data: [DONE]\n\n"
    return StreamingResponse(stream(), media_type="text/event-stream")


async def code_complete(request: Request):
    body = await request.json()
    n = body["max_tokens"]

    async def stream():
        await asyncio.sleep(TTFT)
        for i in range(n - 1):
            if i:
                await asyncio.sleep(GAP)
            yield sse({"object": "code_completion.chunk", "delta": f"c{i}", "finish_reason": None})
        await asyncio.sleep(GAP)
        reason = "cancelled" if body.get("session_id") == "old" else "length"
        yield sse({"object": "code_completion.chunk", "completion": "...", "delta": "z", "finish_reason": reason,
                   "usage": {"prompt_tokens": 20, "completion_tokens": n, "total_tokens": 20 + n},
                   "cached_tokens": 16})
        yield "data: [DONE]\n\n"
    return StreamingResponse(stream(), media_type="text/event-stream")


async def infill(request: Request):
    body = await request.json()
    n = body["n_predict"]

    async def stream():  # llama.cpp: no [DONE]; the last chunk has stop, counts and timings
        await asyncio.sleep(TTFT)
        for i in range(n):
            if i:
                await asyncio.sleep(GAP)
            yield sse({"content": f"i{i}", "stop": False})
        yield sse({"content": "", "stop": True, "tokens_predicted": n, "tokens_evaluated": 30,
                   "stop_type": "limit", "timings": {"cache_n": 24, "prompt_n": 6}})
    return StreamingResponse(stream(), media_type="text/event-stream")


async def models(request: Request):
    return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})


@pytest.fixture(scope="module")
def fake_url():
    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                            Route("/v1/code/complete", code_complete, methods=["POST"]),
                            Route("/infill", infill, methods=["POST"]),
                            Route("/v1/models", models)])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "fake server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def run(url, endpoint, requests, **kw):
    async def go():
        backend = HttpBackend(url, endpoint)
        try:
            backend.model = await backend.served_model()
            return await run_load(backend, requests, **kw)
        finally:
            await backend.aclose()
    return asyncio.run(go())


def within(value, injected):
    return injected <= value <= injected + SLACK


@pytest.mark.parametrize("endpoint", ["completions", "code", "infill"])
def test_reported_latencies_match_the_injected_delays(fake_url, endpoint):
    reqs = [BenchRequest(prompt="x", prompt_len=3, max_tokens=TOKENS, ignore_eos=True) for _ in range(4)]
    results, duration = run(fake_url, endpoint, reqs, max_concurrency=2)
    assert all(r.ok for r in results), [r.error for r in results]
    for r in results:
        assert r.output_len == TOKENS
        assert within(r.ttft, TTFT)
        # a chunk read late shortens the gap after it: gaps are judged on average
        assert len(r.itl) == TOKENS - 1 and 0.8 * GAP <= sum(r.itl) / len(r.itl) <= GAP + SLACK
        assert 0.8 * GAP <= r.tpot <= GAP + SLACK
        assert within(r.latency, TTFT + (TOKENS - 1) * GAP)
    s = summarize(results, duration, parse_slo("ttft=2s"))
    assert s["completed"] == 4 and s["goodput"] > 0
    assert within(s["ttft_ms"]["median"] / 1000, TTFT)
    assert 0.8 * GAP <= s["tpot_ms"]["p99"] / 1000 <= GAP + SLACK
    e2e = TTFT + (TOKENS - 1) * GAP
    assert within(s["e2e_ms"]["p50"] / 1000, e2e)
    # two waves of two under max_concurrency=2
    assert 2 * e2e <= duration <= 2 * e2e + 2 * SLACK
    assert s["output_throughput"] == pytest.approx(4 * TOKENS / duration)


def test_usage_and_cache_counts_come_from_the_server(fake_url):
    req = [BenchRequest(prompt=[1, 2, 3], prompt_len=3, max_tokens=4)]
    (r,), _ = run(fake_url, "completions", req)
    assert r.prompt_len == 11 and r.text == "t0t1t2t3" and r.finish_reason == "length"
    (r,), _ = run(fake_url, "infill", [BenchRequest(prompt="a", prompt_len=1, max_tokens=3, suffix="b")])
    assert (r.prompt_len, r.output_len, r.cached_tokens, r.text) == (30, 3, 24, "i0i1i2")
    (r,), _ = run(fake_url, "code", [BenchRequest(prompt="a", prompt_len=1, max_tokens=3)])
    assert (r.prompt_len, r.cached_tokens, r.text) == (20, 16, "c0c1z")


def test_superseded_code_request_is_neither_ok_nor_an_error(fake_url):
    (r,), _ = run(fake_url, "code", [BenchRequest(prompt="a", prompt_len=1, max_tokens=3, session_id="old")])
    assert r.superseded and not r.ok
    s = summarize([r], 1.0)
    assert (s["superseded"], s["failed"], s["completed"]) == (1, 0, 0)


def test_http_errors_are_counted_with_their_message(fake_url):
    reqs = [BenchRequest(prompt="reject", prompt_len=1, max_tokens=4),
            BenchRequest(prompt="x", prompt_len=1, max_tokens=2)]
    results, duration = run(fake_url, "completions", reqs)
    assert [r.ok for r in results] == [False, True]
    assert results[0].error == "HTTP 400: prompt too long"
    assert summarize(results, duration)["errors"] == {"HTTP 400: prompt too long": 1}


def test_a_run_stops_at_its_time_limit(fake_url):
    reqs = [BenchRequest(prompt="hang", prompt_len=1, max_tokens=2) for _ in range(3)]
    reqs.append(BenchRequest(prompt="x", prompt_len=1, max_tokens=2))
    t = time.monotonic()
    results, duration = run(fake_url, "completions", reqs, request_rate=1.0, seed=0, time_limit=1.5)
    assert time.monotonic() - t < 30  # it returned: the hanging requests were cut, not waited for
    assert [r.error for r in results[:3]] == ["time limit"] * 3
    assert summarize(results, duration)["failed"] >= 3


def test_unreachable_server_is_an_error_not_a_crash():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    backend_requests = [BenchRequest(prompt="x", prompt_len=1, max_tokens=2)]

    async def go():
        backend = HttpBackend(f"http://127.0.0.1:{port}", "completions", model="m")
        try:
            return await run_load(backend, backend_requests)
        finally:
            await backend.aclose()
    (r,), _ = asyncio.run(go())
    assert not r.ok and "ConnectError" in r.error
