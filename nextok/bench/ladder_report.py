"""The arithmetic of `nextok bench ladder`: from per-rate summaries to one row, and the table.

A step's *operating point* is the highest swept request rate at which the P99 end-to-end
latency met the SLO and no request failed: "QPS at the P99 SLO". The row reports the latency
and throughput measured at that rate, and the cost of an output token there:

    cost per 1M output tokens = usd_per_hour / 3600 / (output tokens per second) * 1e6

When no rate met the SLO the row reports the lowest rate instead, flagged (`met` False), so the
row still holds measured figures, never invented ones.
"""
from __future__ import annotations

NOT_YET = "not yet"


def p99_e2e_ms(summary: dict) -> float | None:
    return (summary.get("e2e_ms") or {}).get("p99")


def meets_slo(summary: dict, slo_ms: float) -> bool:
    """Every request completed and the P99 E2E latency is within the SLO."""
    p99 = p99_e2e_ms(summary)
    return (summary["failed"] == 0 and summary["completed"] == summary["num_requests"] > 0
            and p99 is not None and p99 <= slo_ms)


def should_stop(summary: dict, slo_ms: float, stop_factor: float) -> bool:
    """Higher rates can only do worse than a rate that failed requests or missed the SLO widely."""
    p99 = p99_e2e_ms(summary)
    return summary["failed"] > 0 or p99 is None or p99 > stop_factor * slo_ms


def cost_per_million(usd_per_hour: float, output_tokens_per_s: float) -> float | None:
    if output_tokens_per_s <= 0:
        return None
    return usd_per_hour / 3600.0 / output_tokens_per_s * 1e6


def operating_point(points: list[dict], slo_ms: float, usd_per_hour: float) -> dict | None:
    """points: [{"rate": r, "summary": summarize(...)}] in sweep order -> the row's figures."""
    if not points:
        return None
    passing = [p for p in points if meets_slo(p["summary"], slo_ms)]
    met = bool(passing)
    chosen = max(passing, key=lambda p: p["rate"]) if met else min(points, key=lambda p: p["rate"])
    s = chosen["summary"]
    return {
        "met_slo": met,
        "qps_at_slo": chosen["rate"] if met else None,
        "rate": chosen["rate"],
        "request_throughput": s["request_throughput"],
        "output_throughput": s["output_throughput"],
        "p50_e2e_ms": s["e2e_ms"]["median"],
        "p99_e2e_ms": s["e2e_ms"]["p99"],
        "p50_ttft_ms": s["ttft_ms"]["median"],
        "p99_ttft_ms": s["ttft_ms"]["p99"],
        "cost_per_1m_output_usd": cost_per_million(usd_per_hour, s["output_throughput"]),
    }


# ---- the table ------------------------------------------------------------------------------
COLUMNS = ("step", "QPS at P99 SLO", "achieved req/s", "P50 E2E (ms)", "P99 E2E (ms)",
           "P99 TTFT (ms)", "peak RSS (MiB)", "output tok/s", "$ / 1M output tokens")


def _num(x, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def table_row(row: dict) -> list[str]:
    """One step's cells. A step not built yet, or that failed to run, says so instead of numbers."""
    label = row["label"]
    if row["status"] == NOT_YET:
        return [label] + [NOT_YET] * (len(COLUMNS) - 1)
    op = row.get("operating_point")
    if row["status"] != "measured" or op is None:
        return [label, f"failed: {row.get('error', '?')}"[:80]] + [""] * (len(COLUMNS) - 2)
    flag = "" if op["met_slo"] else " †"  # figures at the lowest rate: no rate met the SLO
    qps = _num(op["qps_at_slo"], "g") if op["met_slo"] else f"none (≥ {op['rate']:g})"
    return [label, qps, _num(op["request_throughput"], ".2f") + flag, _num(op["p50_e2e_ms"], ".0f") + flag,
            _num(op["p99_e2e_ms"], ".0f") + flag, _num(op["p99_ttft_ms"], ".0f") + flag,
            _num(row.get("peak_rss_mib"), ".0f"), _num(op["output_throughput"], ".1f") + flag,
            _num(op["cost_per_1m_output_usd"], ".3f") + flag]


def format_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join(["---"] + ["---:"] * (len(COLUMNS) - 1)) + "|"]
    lines += ["| " + " | ".join(table_row(r)) + " |" for r in rows]
    return "\n".join(lines)


def format_markdown(result: dict) -> str:
    """The committed summary: what ran where, the table, and each row's notes."""
    cfg, m = result["config"], result["machine"]
    lines = [f"# Optimisation ladder ({result['time_utc'][:10]})", "",
             f"- machine: {m.get('cpu_model')} ({m.get('cpu_count_usable')} usable cores), "
             f"server threads {cfg['num_threads']}, {cfg['dtype']}",
             f"- model: `{cfg['model']}`; commit `{result['commit'][:12]}`{' (dirty)' if result['dirty'] else ''}",
             f"- workload: {cfg['workload_description']}",
             f"- SLO: P99 E2E ≤ {cfg['slo_p99_e2e_ms']:.0f} ms; rates swept {cfg['rates']} req/s (Poisson, "
             f"seed {cfg['seed']}); cost at ${cfg['usd_per_hour']}/hour",
             *([f"- reported again from `{result['rereported_from']}` (measured with an SLO of "
                f"{cfg['measured_with_slo_p99_e2e_ms']:.0f} ms; each row's sweep ran until P99 passed "
                f"{cfg['stop_factor']:g}x that)"] if result.get("rereported_from") else []),
             f"- command: `{result['command']}`", "", format_table(result["rows"]), ""]
    if any(r.get("operating_point") and not r["operating_point"]["met_slo"] for r in result["rows"]):
        lines += ["† no swept rate met the SLO: figures at the lowest rate.", ""]
    for r in result["rows"]:
        extra = []
        if r.get("notes"):
            extra.append(r["notes"])
        if r["status"] == "measured":
            extra.append(f"other processes used {r['other_processes_cpu_s']:.1f} CPU-s during the sweep "
                         f"(server {r['server_cpu_s']:.1f} CPU-s over {r['sweep_s']:.0f} s)")
            cached = r.get("cached_prompt_fraction")
            if cached is not None:
                extra.append(f"{cached:.0%} of prompt tokens served from the prefix cache")
        if extra:
            lines.append(f"- **{r['label']}**: " + "; ".join(extra) + ".")
    return "\n".join(lines) + "\n"
