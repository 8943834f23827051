"""Serving metrics with the definitions of vLLM's `vllm bench serve`.

Per request (times in seconds, measured by the client):
- TTFT: from sending the request to the first chunk that carries generated text.
- ITL: the gaps between successive text-bearing chunks (a chunk holding several tokens, as
  speculative decoding streams them, is one gap, as in vLLM).
- TPOT: (E2E - TTFT) / (output tokens - 1), defined only for requests with 2+ output tokens.
- E2E: from sending to the last byte.

Over the run: mean, median and the chosen percentiles of each (numpy's linear interpolation,
as vLLM), request/output/total-token throughput over the run's wall time, and goodput: the
requests per second that met every SLO given (a request with one output token has no TPOT and
is judged on the others).
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

import numpy as np

SLO_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2e", "e2el": "e2e", "itl": "itl"}


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int = 0           # prompt tokens (the server's usage when it reports one)
    output_len: int = 0           # generated tokens (usage, else the count of text chunks)
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0          # E2E
    start: float = 0.0            # seconds after the run began
    error: str = ""
    superseded: bool = False      # cancelled by a newer keystroke (server or client side)
    cached_tokens: int | None = None  # prompt tokens the server took from its cache, if it says
    finish_reason: str | None = None
    text: str = ""

    @property
    def tpot(self) -> float | None:
        if self.output_len < 2:
            return None
        return (self.latency - self.ttft) / (self.output_len - 1)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("text")
        d["tpot"] = self.tpot
        return d


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft=200ms,e2e=0.5s,tpot=40' -> {'ttft': 0.2, 'e2e': 0.5, 'tpot': 0.04} (bare numbers: ms)."""
    if not text:
        return {}
    slo = {}
    for part in text.split(","):
        m = re.fullmatch(r"\s*([a-z0-9]+)\s*=\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*", part.lower())
        if not m or m.group(1) not in SLO_KEYS:
            raise ValueError(f"bad SLO {part.strip()!r}: want NAME=VALUE[ms|s] with NAME in "
                             f"{', '.join(sorted(SLO_KEYS))}, e.g. ttft=200ms,e2e=500ms")
        value = float(m.group(2)) / (1 if m.group(3) == "s" else 1000)
        if value <= 0:
            raise ValueError(f"SLO {part.strip()!r} must be positive")
        slo[SLO_KEYS[m.group(1)]] = value
    return slo


def meets_slo(r: RequestResult, slo: dict[str, float]) -> bool:
    if not r.ok:
        return False
    checks = {"ttft": r.ttft, "e2e": r.latency, "tpot": r.tpot,
              "itl": max(r.itl) if r.itl else None}
    return all(checks[k] is None or checks[k] <= v for k, v in slo.items())


def distribution(values: list[float], percentiles: tuple[float, ...]) -> dict[str, float | None]:
    """mean, median, std and p{P} of `values` in milliseconds (None when there are none)."""
    keys = ["mean", "median", "std"] + [f"p{_pct_name(p)}" for p in percentiles]
    if not values:
        return dict.fromkeys(keys)
    a = np.asarray(values, dtype=np.float64) * 1000.0
    out = {"mean": float(a.mean()), "median": float(np.median(a)), "std": float(a.std())}
    for p in percentiles:
        out[f"p{_pct_name(p)}"] = float(np.percentile(a, p))
    return out


def _pct_name(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def summarize(results: list[RequestResult], duration: float, slo: dict[str, float] | None = None,
              percentiles: tuple[float, ...] = (50, 90, 99)) -> dict:
    """The run's figures; latencies in ms, throughputs per second of `duration`."""
    ok = [r for r in results if r.ok]
    superseded = [r for r in results if r.superseded]
    failed = [r for r in results if not r.ok and not r.superseded]
    out_tokens = sum(r.output_len for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    dur = max(duration, 1e-9)
    summary = {
        "duration_s": duration,
        "num_requests": len(results),
        "completed": len(ok),
        "failed": len(failed),
        "superseded": len(superseded),
        "errors": _error_counts(failed),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / dur,
        "output_throughput": out_tokens / dur,
        "total_token_throughput": (in_tokens + out_tokens) / dur,
        # a request that streamed no text (it stopped at once) has no first token to time
        "ttft_ms": distribution([r.ttft for r in ok if r.text], percentiles),
        "tpot_ms": distribution([t for r in ok if (t := r.tpot) is not None], percentiles),
        "itl_ms": distribution([g for r in ok for g in r.itl], percentiles),
        "e2e_ms": distribution([r.latency for r in ok], percentiles),
    }
    if slo:
        good = sum(meets_slo(r, slo) for r in results)
        summary["slo"] = {k: v * 1000 for k, v in slo.items()}
        summary["goodput"] = good / dur
        summary["slo_attainment"] = good / len(results) if results else math.nan
    return summary


def _error_counts(failed: list[RequestResult]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in failed:
        key = (r.error or "unknown").splitlines()[0][:120]
        counts[key] = counts.get(key, 0) + 1
    return counts


def format_summary(s: dict, title: str = "Serving benchmark") -> str:
    """vLLM-style text block."""
    lines = [f"{'=' * 18} {title} {'=' * 18}"]

    def row(label, value, fmt="{:.2f}"):
        lines.append(f"{label:<40}{fmt.format(value) if value is not None else 'n/a':>12}")

    row("Successful requests:", s["completed"], "{:d}")
    row("Failed requests:", s["failed"], "{:d}")
    if s.get("superseded"):
        row("Superseded requests:", s["superseded"], "{:d}")
    row("Benchmark duration (s):", s["duration_s"])
    row("Total input tokens:", s["total_input_tokens"], "{:d}")
    row("Total generated tokens:", s["total_output_tokens"], "{:d}")
    row("Request throughput (req/s):", s["request_throughput"])
    if "goodput" in s:
        row("Request goodput (req/s):", s["goodput"])
    row("Output token throughput (tok/s):", s["output_throughput"])
    row("Total token throughput (tok/s):", s["total_token_throughput"])
    for key, name in (("ttft_ms", "Time to First Token"), ("tpot_ms", "Time per Output Token (excl. 1st token)"),
                      ("itl_ms", "Inter-token Latency"), ("e2e_ms", "End-to-end Latency")):
        lines.append(f"{'-' * 14}{name}{'-' * 14}")
        for stat, v in s[key].items():
            if stat != "std":
                row(f"{stat.capitalize() if stat in ('mean', 'median') else stat.upper()} {key[:-3].upper()} (ms):", v)
    for err, n in s["errors"].items():
        lines.append(f"error x{n}: {err}")
    lines.append("=" * (38 + len(title)))
    return "\n".join(lines)
