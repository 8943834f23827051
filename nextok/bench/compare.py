"""`nextok bench compare`: nextok and llama.cpp's llama-server side by side on one GGUF file.

Both servers run on this machine at once (an idle server takes no CPU), with the same thread
count and the same number of parallel slots (nextok --max-num-seqs = llama-server -np). Each
workload runs against nextok, then llama.cpp, and this repeats for `--pairs` pairs, the order
turned around in every other pair (A B, B A, A B, ...): these shared machines have slow periods of
20-50 %, and a ratio of two runs a minute apart survives them where two separate tables would not.
The turn cancels what the position in a pair costs: two identical nextok servers, always in the
same order, read 0.97x (0.94-0.98) at c=32 (2026-12-05). During every run the CPU time of other processes (the machine's
busy time minus the server under test and this client) and the hypervisor's steal time are
recorded. The table gives, per figure, each server's median over its runs and the median of the
per-pair ratios nextok / llama.cpp (with their range).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

from nextok.bench import common
from nextok.bench.load import HttpBackend, run_load
from nextok.bench.serve_bench import build_requests, load_tokenizer
from nextok.bench.serve_metrics import summarize
from nextok.bench.servers import CpuAccount, ServerUnderTest, find_llama_server

# (summary key, stat or None, label, higher is better)
FIGURES = [
    ("output_throughput", None, "output tok/s", True),
    ("request_throughput", None, "requests/s", True),
    ("ttft_ms", "median", "TTFT P50 ms", False),
    ("ttft_ms", "p99", "TTFT P99 ms", False),
    ("tpot_ms", "median", "TPOT P50 ms", False),
    ("tpot_ms", "p99", "TPOT P99 ms", False),
    ("itl_ms", "median", "ITL P50 ms", False),
    ("e2e_ms", "median", "E2E P50 ms", False),
    ("e2e_ms", "p99", "E2E P99 ms", False),
]


@dataclass
class Workload:
    dataset: str
    input_len: int
    output_len: int
    concurrency: int
    num_requests: int

    @property
    def name(self) -> str:
        return f"{self.dataset} {self.input_len}->{self.output_len} c={self.concurrency}"

    @classmethod
    def parse(cls, spec: str) -> "Workload":
        """DATASET:INPUT:OUTPUT:CONCURRENCY:NUM_REQUESTS, e.g. random:128:128:8:16."""
        parts = spec.split(":")
        if len(parts) != 5 or parts[0] not in ("random", "code"):
            raise ValueError(f"bad workload {spec!r}: want DATASET:INPUT:OUTPUT:CONCURRENCY:NUM "
                             "with DATASET random or code, e.g. random:128:128:8:16")
        w = cls(parts[0], *(int(x) for x in parts[1:]))
        if min(w.input_len, w.output_len, w.concurrency, w.num_requests) < 1:
            raise ValueError(f"bad workload {spec!r}: lengths and counts must be positive")
        return w


DEFAULT_WORKLOADS = "random:128:128:1:4,random:128:128:8:16,random:128:128:32:32,code:256:128:8:16"


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="nextok vs llama.cpp's llama-server, interleaved, on one GGUF")
    p.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    p.add_argument("--llama-server", default=None, help="binary (default: the `make peer` build)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="threads of each server")
    p.add_argument("--parallel", type=int, default=32, help="parallel slots of each server")
    p.add_argument("--ctx-per-slot", type=int, default=1024, help="llama-server context per slot")
    p.add_argument("--workloads", default=DEFAULT_WORKLOADS,
                   help="comma-separated DATASET:INPUT:OUTPUT:CONCURRENCY:NUM_REQUESTS")
    p.add_argument("--pairs", type=int, default=3, help="nextok/llama.cpp run pairs per workload")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nextok-args", default="", help="extra flags for nextok serve")
    p.add_argument("--llama-args", default="", help="extra flags for llama-server")
    p.add_argument("--baseline-nextok-args", default=None, metavar="ARGS",
                   help="run a second nextok server with these flags as the peer instead of "
                        "llama-server (e.g. one build option against another, interleaved the same way)")
    p.add_argument("--output", required=True, help="JSON path; the markdown table goes next to it (.md)")
    p.add_argument("--time-limit", type=float, default=900.0, help="seconds per run")
    p.set_defaults(func=_cmd_compare)


def _measure(server: ServerUnderTest, idle: ServerUnderTest, workload: Workload, requests, seed: int,
             time_limit: float) -> dict:
    async def go():
        backend = HttpBackend(server.url, "completions")
        try:
            backend.model = await backend.served_model()
            return await run_load(backend, requests, max_concurrency=workload.concurrency,
                                  seed=seed, time_limit=time_limit)
        finally:
            await backend.aclose()

    with CpuAccount(server=server.cpu_seconds, idle_peer=idle.cpu_seconds) as cpu:
        results, duration = asyncio.run(go())
    return {"server": server.name, "workload": workload.name, "summary": summarize(results, duration),
            **cpu.summary(), "requests": [r.to_json() for r in results]}


def figure(summary: dict, key: str, stat: str | None) -> float | None:
    v = summary[key] if stat is None else summary[key][stat]
    return None if v is None else float(v)


def ratio_table(runs: list[dict], workloads: list[Workload], peer_name: str = "llama.cpp") -> list[dict]:
    """Per workload and figure: each server's median, and the per-pair ratios' median and range.
    (The peer's column keeps the key llama_cpp whichever server the peer is.)"""
    rows = []
    for w in workloads:
        mine = [r for r in runs if r["workload"] == w.name and r["server"] == "nextok"]
        peer = [r for r in runs if r["workload"] == w.name and r["server"] == peer_name]
        for key, stat, label, higher in FIGURES:
            a = [figure(r["summary"], key, stat) for r in mine]
            b = [figure(r["summary"], key, stat) for r in peer]
            ratios = [x / y for x, y in zip(a, b) if x is not None and y]
            rows.append({
                "workload": w.name, "figure": label, "higher_is_better": higher,
                "nextok": statistics.median(x for x in a if x is not None) if any(x is not None for x in a) else None,
                "llama_cpp": statistics.median(y for y in b if y is not None) if any(y is not None for y in b) else None,
                "ratio_median": statistics.median(ratios) if ratios else None,
                "ratio_min": min(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None,
                "pairs": len(ratios),
            })
    return rows


def markdown(result: dict) -> str:
    h = result
    peer = h.get("peer", "llama.cpp")
    title = "llama.cpp llama-server" if peer == "llama.cpp" else f"{peer} (`nextok {' '.join(h['peer_argv'][3:])}`)"
    lines = [f"# nextok vs {title} ({h['time_utc'][:10]})", "",
             f"Machine: {common.machine_line(h['machine'])}", f"Commit: {h['commit']}{' (dirty)' if h['dirty'] else ''}",
             f"Command: `{h['command']}`",
             f"Model: {os.path.basename(h['model'])}; both servers: {h['threads']} threads, "
             f"{h['parallel']} parallel slots; {peer}: `{' '.join(h['peer_argv'][3:])}`", "",
             f"Ratio = median over pairs of (nextok / {peer}) for runs a minute apart; "
             "for latencies lower is better, for throughputs higher. Every pair sends fresh prompts "
             "(the same to both servers), so no run is served from a cache an earlier run filled.", "",
             f"| workload | figure | nextok | {peer} | ratio (median) | range |",
             "|---|---|---:|---:|---:|---|"]
    for r in h["table"]:
        def f(v):
            return "n/a" if v is None else f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"
        rng = "" if r["ratio_min"] is None else f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}"
        ratio = "n/a" if r["ratio_median"] is None else f"**{r['ratio_median']:.2f}x**"
        lines.append(f"| {r['workload']} | {r['figure']} | {f(r['nextok'])} | {f(r['llama_cpp'])} | {ratio} | {rng} |")
    lines += ["", "Runs in order (other processes' CPU seconds and steal during each run):", "",
              "| # | server | workload | s | ok/failed | out tok/s | server CPU s | other CPU s | steal s |",
              "|---|---|---|---:|---|---:|---:|---:|---:|"]
    for i, r in enumerate(h["runs"]):
        s = r["summary"]
        lines.append(f"| {i + 1} | {r['server']} | {r['workload']} | {s['duration_s']:.1f} | "
                     f"{s['completed']}/{s['failed']} | {s['output_throughput']:.1f} | {r['server_cpu_s']} | "
                     f"{r['other_processes_cpu_s']} | {r['steal_s']} |")
    return "\n".join(lines) + "\n"


def _cmd_compare(args: argparse.Namespace) -> int:
    import shlex

    from nextok import hub

    workloads = [Workload.parse(s) for s in args.workloads.split(",") if s.strip()]
    if args.pairs < 1:
        raise ValueError("--pairs must be at least 1")
    gguf = hub.resolve_model(args.model)
    if not os.path.isfile(gguf) or not gguf.endswith(".gguf"):
        raise ValueError(f"compare needs a GGUF file both servers load, not {gguf!r}")
    binary = find_llama_server(args.llama_server) if args.baseline_nextok_args is None else None
    tok = load_tokenizer(gguf)

    def requests_of(w: Workload, pair: int):
        # Fresh prompts for every pair (both servers of a pair get the same ones): a repeated
        # prompt would be served from the prefix cache of nextok and llama-server alike.
        return build_requests(w.dataset, tok, w.num_requests, w.input_len, w.output_len,
                              args.seed * 1000 + pair)

    started = common.header()  # the commit and time the run starts from, not ends at
    log_dir = tempfile.mkdtemp(prefix="nextok-compare-")
    mine = ServerUnderTest.nextok(gguf, args.threads, args.parallel, log_dir, shlex.split(args.nextok_args))
    if binary is None:
        peer = ServerUnderTest.nextok(gguf, args.threads, args.parallel, log_dir,
                                      shlex.split(args.baseline_nextok_args), name="nextok-baseline")
    else:
        peer = ServerUnderTest.llama_cpp(binary, gguf, args.threads, args.parallel, args.ctx_per_slot,
                                         log_dir, shlex.split(args.llama_args))
    runs: list[dict] = []
    try:
        for s in (mine, peer):
            s.start()
        print(f"servers up (logs in {log_dir}); warming up", file=sys.stderr)
        warm = build_requests("random", tok, 4, 32, 8, args.seed * 1000 + 999)
        for s, other in ((mine, peer), (peer, mine)):
            _measure(s, other, Workload("random", 32, 8, 4, 4), warm, args.seed, 120)
        for pair in range(args.pairs):
            for w in workloads:
                requests = requests_of(w, pair)
                order = ((mine, peer), (peer, mine))
                for s, other in (order if pair % 2 == 0 else order[::-1]):
                    t = time.monotonic()
                    run = _measure(s, other, w, requests, args.seed, args.time_limit)
                    run["pair"] = pair
                    runs.append(run)
                    sm = run["summary"]
                    print(f"pair {pair + 1}/{args.pairs} {w.name:<28} {s.name:<9} "
                          f"{sm['output_throughput']:7.1f} out tok/s  TTFT P50 {sm['ttft_ms']['median'] or 0:7.0f} ms  "
                          f"failed {sm['failed']}  other CPU {run['other_processes_cpu_s']} s  "
                          f"({time.monotonic() - t:.0f} s)", file=sys.stderr)
    finally:
        mine.stop()
        peer.stop()
    result = started | ({"benchmark": "compare", "model": gguf, "threads": args.threads, "parallel": args.parallel,
                            "llama_server": binary, "peer": peer.name, "peer_argv": peer.argv,
                            "llama_argv": peer.argv, "nextok_argv": mine.argv,
                            "workloads": [w.__dict__ for w in workloads], "pairs": args.pairs})
    result["table"] = ratio_table(runs, workloads, peer.name)
    result["runs"] = runs
    common.write_json(args.output, result)
    md_path = os.path.splitext(args.output)[0] + ".md"
    with open(md_path, "w") as f:
        f.write(markdown(result))
    print(markdown(result))
    print(f"wrote {args.output} and {md_path}", file=sys.stderr)
    try:
        from nextok.bench import plots

        for path in plots.draw_compare(result, os.path.splitext(args.output)[0]):
            print(f"wrote {path}", file=sys.stderr)
    except ImportError as e:  # matplotlib is the bench extra; the table stands without plots
        print(f"no plots: {e}", file=sys.stderr)
    return 0
