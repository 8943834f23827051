"""A real Prometheus server (Debian's package, installed by `make system-deps`) scrapes /metrics."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import httpx
import pytest

from tests.server.conftest import free_port


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed: `make system-deps` should have installed it")
        pytest.skip("prometheus is not installed (make system-deps)")
    d = tmp_path_factory.mktemp("prometheus")
    (d / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: nextok\n    metrics_path: /metrics\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{server.port}']\n")
    port = free_port()
    log = open(d / "prometheus.log", "w")
    proc = subprocess.Popen([binary, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        else:
            raise RuntimeError("prometheus did not become ready:\n" + (d / "prometheus.log").read_text())
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def query(url: str, promql: str) -> list:
    r = httpx.get(url + "/api/v1/query", params={"query": promql}, timeout=10)
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_prometheus_scrapes_histograms(prometheus, client):
    for _ in range(3):
        client.completions.create(model="smollm2-135m-instruct", prompt="def f(x):", max_tokens=8, temperature=0)
    deadline = time.monotonic() + 60
    result = []
    while time.monotonic() < deadline:
        up = query(prometheus, 'up{job="nextok"}')
        result = query(prometheus, 'sum(nextok:time_to_first_token_seconds_count{job="nextok"})')
        if up and up[0]["value"][1] == "1" and result and float(result[0]["value"][1]) >= 3:
            break
        time.sleep(1)
    assert result and float(result[0]["value"][1]) >= 3, result
    p50 = query(prometheus, "histogram_quantile(0.5, sum by (le) (nextok:e2e_request_latency_seconds_bucket))")
    assert p50 and float(p50[0]["value"][1]) > 0
    tokens = query(prometheus, "nextok:generation_tokens_total")
    assert tokens and float(tokens[0]["value"][1]) >= 24


def test_every_dashboard_query_returns_data(prometheus, client):
    """Every PromQL expression of the provisioned Grafana dashboard, evaluated by the real
    Prometheus against the real server after some load, returns at least one series."""
    from tests.deploy.test_static import dashboard_exprs

    # A prompt of several KV blocks, sent more than once, so the prefix cache has hits to count;
    # spread over a few scrapes, so every rate() window sees an increase.
    prompt = "def add(a, b):\n    return a + b\n\n" * 12 + "def mul(a, b):"
    for _ in range(3):
        for _ in range(2):
            client.completions.create(model="smollm2-135m-instruct", prompt=prompt, max_tokens=8, temperature=0)
        time.sleep(1.5)
    exprs = [e.replace("$model_name", ".*") for e in dashboard_exprs()]
    empty = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        empty = [e for e in exprs if not query(prometheus, e)]
        if not empty:
            break
        time.sleep(1)
    assert not empty, empty
