"""PNG plots of serving benchmarks (matplotlib, Agg backend, imported only when drawing).

- `ladder_bars`: the ladder as bars, QPS at the P99 SLO and cost per 1M output tokens per step;
- `throughput_vs_rate`, `p99_vs_rate`: one line per server configuration over the swept rates;
- `latency_cdf`: the distribution of per-request latencies, one curve per label.

    nextok bench plot RESULT.json [MORE.json ...] [--output-dir DIR]

redraws from saved results: a ladder JSON gets all four plots; `nextok bench serve --output X
--save-requests` results get latency CDFs (E2E and TTFT), one curve per file.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def ladder_bars(ladder: dict, path: str) -> str:
    """Horizontal bars, first step on top: QPS at the SLO, and $ per 1M output tokens there."""
    plt = _pyplot()
    rows = ladder["rows"]
    labels = [r["label"] for r in rows]
    fig, (ax_qps, ax_cost) = plt.subplots(1, 2, figsize=(12, 0.6 * len(rows) + 1.8), sharey=True)
    y = list(range(len(rows)))[::-1]
    for yi, r in zip(y, rows):
        op = r.get("operating_point")
        if r["status"] != "measured" or op is None:
            text = "not yet" if r["status"] == "not yet" else "failed"
            for ax in (ax_qps, ax_cost):
                ax.text(0.0, yi, f" {text}", va="center", color="gray", style="italic")
            continue
        qps = op["qps_at_slo"] or 0.0
        ax_qps.barh(yi, qps, color="tab:blue")
        ax_qps.text(qps, yi, f" {qps:g}" if op["met_slo"] else f" none at ≥ {op['rate']:g}", va="center")
        cost = op["cost_per_1m_output_usd"]
        if cost is not None:
            ax_cost.barh(yi, cost, color="tab:orange" if op["met_slo"] else "lightgray",
                         hatch=None if op["met_slo"] else "//")
            ax_cost.text(cost, yi, f" \\${cost:.3f}" + ("" if op["met_slo"] else " †"), va="center")
    cfg = ladder.get("config", {})
    ax_qps.set_yticks(y, labels)
    ax_qps.set_xlabel("requests/s at P99 E2E ≤ {:.0f} ms".format(cfg.get("slo_p99_e2e_ms", float("nan"))))
    # "\\$": a bare pair of dollar signs would be read as mathtext
    ax_cost.set_xlabel(f"\\$ per 1M output tokens at \\${cfg.get('usd_per_hour', '?')}/h (†: SLO missed)")
    for ax in (ax_qps, ax_cost):
        ax.margins(x=0.35)
        ax.set_ylim(-0.6, len(rows) - 0.4)
    fig.suptitle("Optimisation ladder")
    return _save(fig, path)


def _rate_lines(series, path: str, ylabel: str, title: str, *, logy=False, hline=None, diagonal=False) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = 0.0
    for label, points in series:
        if points:
            xs, ys = zip(*sorted(points))
            ax.plot(xs, ys, marker="o", label=label)
            top = max(top, max(xs))
    if diagonal and top:
        ax.plot([0, top], [0, top], color="gray", linestyle=":", label="offered load")
    if hline is not None:
        ax.axhline(hline, color="red", linestyle="--", label="SLO")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("offered request rate (req/s, Poisson)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def throughput_vs_rate(series: list[tuple[str, list[tuple[float, float]]]], path: str,
                       ylabel: str = "achieved requests/s", title: str = "Throughput vs request rate") -> str:
    """series: [(label, [(offered rate, throughput)])]; requests/s plots get the offered-load line."""
    return _rate_lines(series, path, ylabel, title, diagonal="request" in ylabel)


def p99_vs_rate(series: list[tuple[str, list[tuple[float, float]]]], path: str, slo_ms: float | None = None,
                title: str = "P99 end-to-end latency vs request rate") -> str:
    return _rate_lines(series, path, "P99 E2E latency (ms)", title, logy=True, hline=slo_ms)


def latency_cdf(latencies_ms: dict[str, list[float]], path: str, title: str = "Latency CDF",
                xlabel: str = "latency (ms)", slo_ms: float | None = None) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, values in latencies_ms.items():
        if values:
            xs = sorted(values)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            # start at 0 at the fastest request, so each request is one visible rise
            ax.step([xs[0]] + xs, [0.0] + ys, where="post", label=f"{label} (n={len(xs)})")
    if slo_ms is not None:
        ax.axvline(slo_ms, color="red", linestyle="--", label="SLO")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


# ---- from saved results ---------------------------------------------------------------------
def draw_ladder(ladder: dict, prefix: str) -> list[str]:
    """All four plots of a ladder result, as PREFIX-{bars,throughput,p99,cdf}.png."""
    measured = [r for r in ladder["rows"] if r["status"] == "measured" and r.get("sweep")]
    slo = ladder.get("config", {}).get("slo_p99_e2e_ms")
    thpt = [(r["label"], [(p["rate"], p["summary"]["request_throughput"]) for p in r["sweep"]]) for r in measured]
    p99 = [(r["label"], [(p["rate"], p["summary"]["e2e_ms"]["p99"]) for p in r["sweep"]
                         if p["summary"]["e2e_ms"]["p99"] is not None]) for r in measured]
    cdf = {}
    for r in measured:  # each step at its operating point: the rate the table reports
        rate = r["operating_point"]["rate"]
        point = next(p for p in r["sweep"] if p["rate"] == rate)
        cdf[f"{r['label']} @ {rate:g}/s"] = [q["latency"] * 1000 for q in point.get("requests", []) if q["ok"]]
    return [ladder_bars(ladder, prefix + "-bars.png"),
            throughput_vs_rate(thpt, prefix + "-throughput.png"),
            p99_vs_rate(p99, prefix + "-p99.png", slo),
            latency_cdf(cdf, prefix + "-cdf.png", "E2E latency at each step's operating point",
                        "end-to-end latency (ms)", slo)]


def draw_serve_results(paths: list[str], results: list[dict], prefix: str) -> list[str]:
    """Latency CDFs of `nextok bench serve --save-requests` results, one curve per file."""
    names = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    e2e, ttft = {}, {}
    for name, res in zip(names, results):
        ok = [q for q in res.get("requests", []) if q["ok"]]
        e2e[name] = [q["latency"] * 1000 for q in ok]
        ttft[name] = [q["ttft"] * 1000 for q in ok if q["output_len"] > 0]
    if not any(e2e.values()):
        raise ValueError("no per-request figures in these results (run `nextok bench serve --save-requests`)")
    return [latency_cdf(e2e, prefix + "-e2e-cdf.png", "End-to-end latency", "E2E latency (ms)"),
            latency_cdf(ttft, prefix + "-ttft-cdf.png", "Time to first token", "TTFT (ms)")]


def draw_compare(result: dict, prefix: str) -> list[str]:
    """`nextok bench compare` results: per workload, TTFT and E2E CDFs of each server, with the
    requests of all its runs pooled (the runs alternate, so slow periods hit both alike)."""
    written = []
    for w in result["workloads"]:
        name = f"{w['dataset']} {w['input_len']}->{w['output_len']} c={w['concurrency']}"
        slug = f"{w['dataset']}-{w['input_len']}-{w['output_len']}-c{w['concurrency']}"
        ttft: dict[str, list[float]] = {}
        e2e: dict[str, list[float]] = {}
        for run in result["runs"]:
            if run["workload"] != name:
                continue
            ok = [q for q in run["requests"] if q["ok"]]
            ttft.setdefault(run["server"], []).extend(q["ttft"] * 1000 for q in ok)
            e2e.setdefault(run["server"], []).extend(q["latency"] * 1000 for q in ok)
        written.append(latency_cdf(ttft, f"{prefix}-{slug}-ttft-cdf.png", f"TTFT, {name}", "TTFT (ms)"))
        written.append(latency_cdf(e2e, f"{prefix}-{slug}-e2e-cdf.png", f"End-to-end latency, {name}",
                                   "E2E latency (ms)"))
    return written


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="PNG plots from saved ladder or serve results")
    _add_args(p)
    p.set_defaults(func=run)


def _add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="result JSON files")
    p.add_argument("--output-dir", default=None, help="default: next to the first result")
    p.add_argument("--prefix", default=None, help="file name prefix (default: the first result's name)")


def run(args) -> int:
    results = []
    for path in args.results:
        with open(path) as f:
            results.append(json.load(f))
    stem = args.prefix or os.path.splitext(os.path.basename(args.results[0]))[0]
    prefix = os.path.join(args.output_dir or os.path.dirname(os.path.abspath(args.results[0])), stem)
    written = []
    ladders = [r for r in results if r.get("benchmark") == "ladder"]
    for i, ladder in enumerate(ladders):
        written += draw_ladder(ladder, prefix if len(ladders) == 1 else f"{prefix}-{i}")
    for path, r in zip(args.results, results):
        if r.get("benchmark") == "compare":
            written += draw_compare(r, os.path.join(os.path.dirname(prefix), os.path.splitext(os.path.basename(path))[0]))
    others = [(p, r) for p, r in zip(args.results, results) if r.get("benchmark") not in ("ladder", "compare")]
    if others:
        written += draw_serve_results([p for p, _ in others], [r for _, r in others], prefix)
    print("\n".join(written))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m nextok.bench.plots", description=__doc__.split("\n")[0])
    _add_args(parser)
    sys.exit(run(parser.parse_args()))
