"""The metric arithmetic of `nextok bench serve`, against hand-computed values (vLLM's definitions)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from nextok.bench.load import arrival_delays
from nextok.bench.serve_metrics import RequestResult, distribution, meets_slo, parse_slo, summarize


def result(ttft, gaps, out=None, prompt=10, ok=True, **kw):
    """A request whose chunks arrived at ttft, then after each gap; one token per chunk."""
    n = out if out is not None else len(gaps) + 1
    return RequestResult(ok=ok, prompt_len=prompt, output_len=n, ttft=ttft, itl=list(gaps),
                         latency=ttft + sum(gaps), text="x" * (len(gaps) + 1), **kw)


def test_tpot_excludes_the_first_token():
    r = result(0.5, [0.1, 0.2, 0.3])  # 4 tokens, E2E 1.1 s
    assert r.tpot == pytest.approx((1.1 - 0.5) / 3)
    assert result(0.5, []).tpot is None  # one token: no TPOT
    # chunks carrying several tokens (speculative decoding): TPOT uses tokens, ITL the chunk gaps
    multi = result(0.2, [0.3], out=7)
    assert multi.tpot == pytest.approx(0.3 / 6) and multi.itl == [0.3]


def test_percentiles_are_numpy_linear_interpolation_in_ms():
    values = [0.010, 0.020, 0.030, 0.040, 0.100]
    d = distribution(values, (50, 90, 99))
    assert d["mean"] == pytest.approx(40.0)
    assert d["median"] == pytest.approx(30.0)
    assert d["p90"] == pytest.approx(76.0)   # 40 + 0.6 * (100 - 40)
    assert d["p99"] == pytest.approx(97.6)   # 40 + 0.96 * 60
    assert d["std"] == pytest.approx(np.std([10, 20, 30, 40, 100]))
    assert distribution([], (50,)) == {"mean": None, "median": None, "std": None, "p50": None}
    assert "p99.9" in distribution([1.0], (99.9,))


def test_summary_counts_throughput_and_flattens_itl():
    rs = [result(0.1, [0.1, 0.1], prompt=5),             # 3 tokens, E2E 0.3
          result(0.3, [0.2], prompt=7),                   # 2 tokens, E2E 0.5
          RequestResult(ok=False, prompt_len=9, error="HTTP 503: busy"),
          RequestResult(ok=False, prompt_len=9, error="HTTP 503: busy"),
          RequestResult(ok=False, prompt_len=4, superseded=True, error="finish_reason=cancelled")]
    s = summarize(rs, duration=2.0)
    assert (s["completed"], s["failed"], s["superseded"]) == (2, 2, 1)
    assert s["errors"] == {"HTTP 503: busy": 2}
    assert s["total_input_tokens"] == 12 and s["total_output_tokens"] == 5
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_throughput"] == pytest.approx(2.5)
    assert s["total_token_throughput"] == pytest.approx(8.5)
    assert s["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert s["itl_ms"]["median"] == pytest.approx(100.0)          # gaps 100, 100, 200
    assert s["tpot_ms"]["mean"] == pytest.approx((100 + 200) / 2)  # per request, then averaged
    assert s["e2e_ms"]["p50"] == pytest.approx(400.0)
    assert "goodput" not in s
    # a request that streamed no text has no TTFT (not a zero one)
    silent = RequestResult(ok=True, prompt_len=3, output_len=1, latency=0.2)
    assert summarize(rs + [silent], duration=2.0)["ttft_ms"]["mean"] == pytest.approx(200.0)


def test_goodput_counts_requests_meeting_every_slo():
    rs = [result(0.1, [0.05] * 9),        # TTFT 100 ms, TPOT 50 ms, E2E 550 ms
          result(0.3, [0.05] * 9),        # TTFT too slow
          result(0.1, [0.1] * 9),         # TPOT 100 ms, E2E 1 s
          result(0.1, []),                # one token: no TPOT, judged on TTFT only
          RequestResult(ok=False, error="x")]
    slo = parse_slo("ttft=200ms,tpot=60ms")
    assert [meets_slo(r, slo) for r in rs] == [True, False, False, True, False]
    s = summarize(rs, duration=4.0, slo=slo)
    assert s["goodput"] == pytest.approx(0.5) and s["slo_attainment"] == pytest.approx(0.4)
    assert s["slo"] == {"ttft": pytest.approx(200.0), "tpot": pytest.approx(60.0)}
    e2e = parse_slo("e2e=0.6s")
    assert [meets_slo(r, e2e) for r in rs[:4]] == [True, False, False, True]  # 550, 750, 1000, 100 ms


@pytest.mark.parametrize("text,expected", [
    ("ttft=200ms,e2e=500ms", {"ttft": 0.2, "e2e": 0.5}),
    ("TTFT=1.5s, tpot=40", {"ttft": 1.5, "tpot": 0.04}),
    ("e2el=300ms", {"e2e": 0.3}),
    ("", {}),
])
def test_parse_slo(text, expected):
    assert parse_slo(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["ttft", "latency=3ms", "ttft=-1ms", "ttft=0", "ttft=fast"])
def test_parse_slo_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        parse_slo(bad)


def test_poisson_arrivals_are_seeded_with_the_asked_rate():
    a = arrival_delays(4000, request_rate=4.0, seed=1)
    assert a == arrival_delays(4000, request_rate=4.0, seed=1)
    assert a != arrival_delays(4000, request_rate=4.0, seed=2)
    assert a[0] == 0.0
    gaps = np.asarray(a[1:])
    assert gaps.mean() == pytest.approx(0.25, rel=0.06)
    assert gaps.std() == pytest.approx(0.25, rel=0.08)  # exponential: std = mean
    assert arrival_delays(3, math.inf, seed=0) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        arrival_delays(3, 0.0, seed=0)
