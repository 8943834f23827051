"""One markdown table from several keystroke results (`nextok bench serve --dataset keystroke`).

    python -m nextok.bench.keystroke_report OUT.md "label=path.json" ["label=path.json" ...]

Rows with the same label (repeated runs, interleaved with the other labels') are shown one by
one and then as a median row, so the spread between runs stays visible.
"""
from __future__ import annotations

import json
import statistics
import sys

COLUMNS = ("runs", "sessions", "requests", "completed", "superseded", "latency P50 ms", "latency P99 ms",
           "TTFT P50 ms", "prefix-cache hit rate", "other CPU s")


def row(summary: dict, cpu: dict | None) -> dict:
    lat, ttft = summary["latency_ms"], summary["ttft_ms"]
    return {"runs": 1, "sessions": summary["num_sessions"], "requests": summary["num_requests"],
            "completed": summary["completed"], "superseded": summary["superseded_share"],
            "latency P50 ms": lat["p50"], "latency P99 ms": lat["p99"], "TTFT P50 ms": ttft["p50"],
            "prefix-cache hit rate": summary["prefix_cache_hit_rate"],
            "other CPU s": (cpu or {}).get("other_processes_cpu_s")}


def median_row(rows: list[dict]) -> dict:
    out = {}
    for key in COLUMNS:
        values = [r[key] for r in rows if r[key] is not None]
        out[key] = statistics.median(values) if values else None
    out["runs"] = len(rows)
    return out


def _cell(key: str, v) -> str:
    if v is None:
        return "n/a"
    if key in ("superseded", "prefix-cache hit rate"):
        return f"{v:.1%}"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.0f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(int(v))


def table(labelled: list[tuple[str, dict]]) -> str:
    lines = ["| run | " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    groups: dict[str, list[dict]] = {}
    for label, result in labelled:
        r = row(result["summary"], result.get("cpu"))
        groups.setdefault(label, []).append(r)
        lines.append(f"| {label} | " + " | ".join(_cell(k, r[k]) for k in COLUMNS) + " |")
    for label, rows in groups.items():
        if len(rows) > 1:
            m = median_row(rows)
            lines.append(f"| **{label}, median** | " + " | ".join(_cell(k, m[k]) for k in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) < 2 or any("=" not in a for a in argv[1:]):
        print(__doc__, file=sys.stderr)
        return 2
    labelled = []
    for arg in argv[1:]:
        label, path = arg.split("=", 1)
        with open(path) as f:
            labelled.append((label, json.load(f)))
    text = table(labelled)
    with open(argv[0], "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
