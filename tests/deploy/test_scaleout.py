"""Scale-out on loopback: 3 real `nextok serve` replicas behind the real HAProxy (Debian's package,
installed by `make system-deps`), configured by deploy/haproxy/haproxy.cfg.

- session affinity: requests naming a session reach one replica, and the prefix-cache hit rate
  (summed over the replicas' /metrics) is higher than under least connections;
- failover: under load (non-streamed workers, long streams, and `nextok bench serve` through the
  balancer), one replica is SIGKILLed while streams run on it and another is restarted (SIGTERM
  drain, then started again). Non-streamed requests are retried by HAProxy and all end 200; the
  streams on the killed replica end with a client-side error (an incomplete chunked body: HAProxy
  cannot add an SSE error event once it forwarded response bytes) within a timeout, never a hang;
  the killed replica is marked DOWN within the health check's 2 x 1 s (+ one interval of phase).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from nextok.bench import balancer
from tests.server.conftest import metric_value

CHECK_INTER_S, CHECK_FALL = 1.0, 2  # deploy/haproxy/haproxy.cfg: default-server inter 1s fall 2
MODEL = "m"
STREAM_TOKENS = 128  # each of the long streams (_stream), one event a token
REPLICA_ARGS = ["--dtype", "float32", "--kv-cache-memory", "64MiB", "--served-model-name", MODEL]


@pytest.fixture(scope="module")
def haproxy_bin() -> str:
    found = balancer.find_haproxy()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("haproxy is not installed: `make system-deps` should have installed it")
        pytest.skip("haproxy is not installed (apt-get install haproxy, or make system-deps)")
    return found


@pytest.fixture(scope="module")
def replicas(haproxy_bin, model_path, tmp_path_factory):
    # One thread each: three replicas share this machine's cores like three 1-CPU pods.
    reps = balancer.start_replicas(model_path, 3, str(tmp_path_factory.mktemp("replicas")), 1, REPLICA_ARGS)
    try:
        yield reps
    finally:
        for r in reps:
            r.stop()


@pytest.fixture(scope="module")
def lb(replicas, haproxy_bin, tmp_path_factory):
    proxy = balancer.HAProxy([r.port for r in replicas], str(tmp_path_factory.mktemp("haproxy")), haproxy_bin)
    with proxy:
        for backend in ("pool", "affinity"):
            for name in ("r1", "r2", "r3"):
                proxy.wait_status(name, "UP", 10, backend)
        yield proxy


def test_config_checks(haproxy_bin, tmp_path):
    assert subprocess.run([haproxy_bin, "-c", "-q", "-f", balancer.CONFIG]).returncode == 0
    cfg = tmp_path / "h.cfg"
    cfg.write_text(balancer.render_config([9001, 9002], 9000, str(tmp_path / "s.sock"), 9004))
    servers = [line.split()[1:3] for line in cfg.read_text().splitlines() if line.strip().startswith("server ")]
    assert servers == [["r1", "127.0.0.1:9001"], ["r2", "127.0.0.1:9002"]] * 2
    assert "bind 127.0.0.1:9000" in cfg.read_text()
    assert subprocess.run([haproxy_bin, "-c", "-q", "-f", str(cfg)]).returncode == 0


def _prefix_counts(replicas) -> tuple[float, float]:
    hits = queries = 0.0
    for r in replicas:
        text = httpx.get(r.url + "/metrics", timeout=10).text
        hits += metric_value(text, "nextok:prefix_cache_hits_total")
        queries += metric_value(text, "nextok:prefix_cache_queries_total")
    return hits, queries


def _session_prompt(tag: str, keystrokes: int) -> str:
    """~150 tokens of code unique to `tag`, then what the user typed since (one line per step)."""
    body = "\n".join(f"def {tag}_f{j}(x, y):\n    return x * {j} + y - {len(tag)}" for j in range(8))
    return body + "\n" + "".join(f"z{k} = {tag}_f{k}(1, 2)\n" for k in range(keystrokes))


def _run_sessions(lb, phase: str, affinity: bool, sessions: int = 4, steps: int = 4) -> dict[str, set]:
    """Each session's requests in turn (round by round, like editors typing together)."""
    served: dict[str, set] = {}
    with httpx.Client(base_url=lb.url, timeout=60) as c:
        for k in range(steps):
            for s in range(sessions):
                sid = f"{phase}{s}"
                r = c.post("/v1/completions", headers={"X-Session-Id": sid} if affinity else {},
                           json={"model": MODEL, "prompt": _session_prompt(sid, k), "max_tokens": 1})
                assert r.status_code == 200, r.text
                served.setdefault(sid, set()).add(r.headers["x-served-by"])
    return served


def test_session_affinity_raises_prefix_cache_hits(replicas, lb):
    h0, q0 = _prefix_counts(replicas)
    spread = _run_sessions(lb, "plain", affinity=False)
    h1, q1 = _prefix_counts(replicas)
    pinned = _run_sessions(lb, "pinned", affinity=True)
    h2, q2 = _prefix_counts(replicas)
    without, with_ = (h1 - h0) / (q1 - q0), (h2 - h1) / (q2 - q1)
    print(f"prefix-cache hit rate: {without:.2f} without affinity, {with_:.2f} with")
    assert all(len(v) == 1 for v in pinned.values()), pinned  # one replica per session
    assert len(set().union(*pinned.values())) >= 2, pinned  # sessions still spread over replicas
    assert any(len(v) > 1 for v in spread.values()), spread
    # 4 requests a session: with affinity only the first misses (~3/4 of the prompt blocks hit);
    # round-robin-like leastconn lands most requests on a replica the session has not used yet.
    assert with_ > without + 0.25, (with_, without)


async def _stream(c: httpx.AsyncClient, started: asyncio.Event, i: int, out: dict) -> dict:
    """One streamed completion, filling `out`: {"server", "events", "outcome": done | error | hang}."""
    out.update(server=None, events=0, outcome="hang")
    body = {"model": MODEL, "prompt": f"# stream {i}\ndef main():", "max_tokens": STREAM_TOKENS,
            "ignore_eos": True, "stream": True}

    async def read():
        async with c.stream("POST", "/v1/completions", json=body) as r:
            out["server"] = r.headers.get("x-served-by")
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    out["outcome"] = "done"
                    return
                if line.startswith("data:"):
                    out["events"] += 1
                    # an error event's top-level key (a completion's own text may be "error")
                    if "error" in json.loads(line[len("data:"):]):
                        out["outcome"] = "error: event"
                        return
                    if out["events"] >= 2:
                        started.set()
        out["outcome"] = "error: stream ended without [DONE]"

    try:
        await asyncio.wait_for(read(), timeout=45)
    except asyncio.TimeoutError:
        out["outcome"] = "hang"
    except httpx.HTTPError as e:  # RemoteProtocolError: incomplete chunked body
        out["outcome"] = f"error: {type(e).__name__}"
    return out


async def _plain_worker(c: httpx.AsyncClient, stop: asyncio.Event, results: list, w: int) -> None:
    n = 0
    while not stop.is_set():
        r = await c.post("/v1/completions", json={"model": MODEL, "prompt": f"# w{w} r{n}\nimport",
                                                  "max_tokens": 8})
        results.append((r.status_code, r.headers.get("x-served-by"), r.text[:200]))
        n += 1


def _bench_serve(lb, out: str) -> subprocess.Popen:
    """`nextok bench serve` through the balancer: 3 streams at a time, each bounded by 30 s."""
    return subprocess.Popen([sys.executable, "-m", "nextok", "bench", "serve", "--base-url", lb.url,
                             "--num-requests", "24", "--max-concurrency", "3", "--input-len", "32",
                             "--output-len", "48", "--request-timeout", "30", "--time-limit", "90",
                             "--save-requests", "--no-progress", "--output", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _frontend_connections(lb) -> int:
    return next(int(r["scur"]) for r in lb.stat() if r["pxname"] == "nextok" and r["svname"] == "FRONTEND")


def test_failover_kill_and_restart(replicas, lb, tmp_path):
    by_name = {f"r{i}": r for i, r in enumerate(replicas, 1)}
    report: dict = {}
    bench = _bench_serve(lb, str(tmp_path / "bench.json"))

    async def scenario():
        async with httpx.AsyncClient(base_url=lb.url, timeout=httpx.Timeout(60, connect=5)) as c:
            stop, plain = asyncio.Event(), []
            workers = [asyncio.create_task(_plain_worker(c, stop, plain, w)) for w in range(4)]
            events = [asyncio.Event() for _ in range(3)]
            outs: list[dict] = [{} for _ in range(3)]
            streams = [asyncio.create_task(_stream(c, events[i], i, outs[i])) for i in range(3)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 30)
            # bench serve's 3 streams too (it loads a tokenizer first), unless a stream is past
            # half its tokens: the kill must find them all under way, however busy the cores are
            t0 = time.monotonic()
            while (_frontend_connections(lb) < 10 and time.monotonic() - t0 < 10
                   and all(o["events"] < STREAM_TOKENS // 2 for o in outs)):
                await asyncio.sleep(0.1)
            report["bench_running_at_kill"] = _frontend_connections(lb) >= 10
            report["plain_before_kill"] = len(plain)
            # the replica serving the first stream still under way is killed while it streams
            victim = next(o["server"] for o in outs if o["outcome"] == "hang")
            by_name[victim].proc.send_signal(signal.SIGKILL)
            report["victim"] = victim
            report["down_after_s"] = await asyncio.to_thread(lb.wait_status, victim, "DOWN", 10)
            report["streams"] = await asyncio.gather(*streams)
            # another replica restarts: SIGTERM drains it (/ready 503 -> DOWN), then it comes back
            other = next(n for n in by_name if n != victim)
            report["restarted"] = other
            await asyncio.to_thread(by_name[other].stop)
            await asyncio.to_thread(lb.wait_status, other, "DOWN", 10)
            await asyncio.to_thread(by_name[other].start)
            report["up_after_ready_s"] = await asyncio.to_thread(lb.wait_status, other, "UP", 10)
            n0 = len(plain)
            while len(plain) < n0 + 8:
                await asyncio.sleep(0.2)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*workers), 60)
            report["plain"] = plain
            report["served_after_restart"] = {s for _, s, _ in plain[n0:]}

    try:
        asyncio.run(scenario())
        _, err = bench.communicate(timeout=120)
    finally:
        bench.kill()
    plain, streams, victim = report["plain"], report["streams"], report["victim"]
    # bench serve: every request accounted for, none cut by its time limit (a hang), and those
    # that failed failed on a broken stream (the kill), not on an HTTP error status
    summary = json.loads((tmp_path / "bench.json").read_text())["summary"] if bench.returncode == 0 else {}
    assert summary, err
    report["bench_serve"] = {k: summary[k] for k in ("completed", "failed", "errors")}
    print({k: v for k, v in report.items() if k != "plain"}, len(plain), "non-streamed;",
          lb.backend_counter("wretr"), "retries,", lb.backend_counter("wredis"), "redispatches")
    assert len(plain) >= 12 and report["plain_before_kill"] >= 1
    assert [p for p in plain if p[0] != 200] == [], "non-streamed requests lost"
    assert lb.backend_counter("wretr") + lb.backend_counter("wredis") >= 1  # some were retried
    for s in streams:
        if s["server"] == victim:
            assert s["outcome"].startswith("error"), s  # cut mid-stream, seen by the client
        else:
            assert s["outcome"] == "done", s
    assert report["down_after_s"] <= CHECK_INTER_S * (CHECK_FALL + 1) + 0.5, report["down_after_s"]
    assert report["restarted"] in report["served_after_restart"], report["served_after_restart"]
    assert summary["completed"] + summary["failed"] == 24 and summary["completed"] >= 12, summary
    assert all("time limit" not in e and "HTTP" not in e and "Timeout" not in e for e in summary["errors"]), summary
    assert victim not in report["served_after_restart"]



def test_scaleout_table_takes_medians_over_runs():
    from nextok.bench.scaleout import aggregate, format_table

    def run(n, tok, e2e, r_cpu):
        return {"replicas": n, "failed": 0, "duration_s": 10.0, "request_throughput": tok / 64,
                "output_throughput": tok, "e2e_ms": {"median": e2e, "p99": 2 * e2e},
                "ttft_ms": {"median": 1.0, "p99": 2.0},
                "cpu": {"client_cpu_s": 1.0, **{f"r{i}_cpu_s": r_cpu for i in range(1, n + 1)},
                        "haproxy_cpu_s": 0.5, "other_processes_cpu_s": 2.0, "steal_s": 0.0}}
    rows = aggregate([run(1, 100, 50, 10), run(2, 180, 30, 9), run(1, 120, 70, 10), run(2, 200, 40, 9)])
    assert [r["output_throughput"] for r in rows] == [110, 190]
    assert rows[1]["e2e_p50_ms"] == 35 and rows[1]["e2e_p99_ms"] == 70
    assert rows[1]["replica_cores_busy"] == 1.8 and rows[1]["other_cores_busy"] == 0.2
    assert "| 2 | 190.0 (180.0, 200.0) |" in format_table(rows)
