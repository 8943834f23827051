"""`nextok bench scaleout`: throughput and latency with 1..N replicas behind HAProxy.

    nextok bench scaleout --replicas 1,2,3 --repeats 2 --threads-per-replica 1 \
        --num-requests 32 --input-len 128 --output-len 32 --max-concurrency 8 --output out.json

The replicas (`nextok serve`, each with `--threads-per-replica` CPU threads, like a pod with that
CPU limit) start once; each run renders deploy/haproxy/haproxy.cfg for the first n of them, starts
HAProxy and sends the same requests as `nextok bench serve` (random dataset, streamed, at a
fixed concurrency). Runs are interleaved (1,2,3,1,2,3) so a slow period of a shared machine
spreads over every replica count, and each run records the CPU seconds of the client, of every
replica, of HAProxy and of all other processes of the machine.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile

from nextok.bench import common


def add_parser(sub) -> None:
    p = sub.add_parser("scaleout", help="throughput/latency with 1..N nextok replicas behind HAProxy")
    p.add_argument("--model", default=None, help="GGUF file or alias (default model)")
    p.add_argument("--replicas", default="1,2,3", help="replica counts, in run order within a round")
    p.add_argument("--repeats", type=int, default=2, help="rounds over --replicas")
    p.add_argument("--threads-per-replica", type=int, default=1)
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-concurrency", type=int, default=8)
    p.add_argument("--serve-args", default="--kv-cache-memory 256MiB",
                   help="extra `nextok serve` arguments of every replica")
    p.add_argument("--output", default=None, help="write the results as JSON here")
    p.set_defaults(func=_cmd_scaleout)


def _cpu_readers(replicas, lb) -> dict:
    from nextok.bench.servers import tree_cpu_seconds
    import psutil

    readers = {r.name: r.cpu_seconds for r in replicas}
    proc = psutil.Process(lb.proc.pid)
    readers["haproxy"] = lambda: tree_cpu_seconds(proc)
    return readers


def _one_run(args, replicas, n: int, requests, log_dir: str) -> dict:
    from nextok.bench.balancer import HAProxy
    from nextok.bench.load import HttpBackend, run_load
    from nextok.bench.serve_metrics import summarize
    from nextok.bench.servers import CpuAccount

    with HAProxy([r.port for r in replicas[:n]], log_dir) as lb:
        for i in range(1, n + 1):
            lb.wait_status(f"r{i}", "UP", 15)
        backend = HttpBackend(lb.url, "completions", timeout=600)

        async def main():
            try:
                backend.model = await backend.served_model()
                return await run_load(backend, requests, max_concurrency=args.max_concurrency)
            finally:
                await backend.aclose()

        with CpuAccount(**_cpu_readers(replicas, lb)) as cpu:
            results, duration = asyncio.run(main())
    s = summarize(results, duration, None, (50, 99))
    return {"replicas": n, "completed": s["completed"], "failed": s["failed"], "duration_s": round(duration, 2),
            "request_throughput": round(s["request_throughput"], 3),
            "output_throughput": round(s["output_throughput"], 2),
            "e2e_ms": {k: round(s["e2e_ms"][k], 1) for k in ("median", "p99")},
            "ttft_ms": {k: round(s["ttft_ms"][k], 1) for k in ("median", "p99")},
            "tpot_ms": {k: round(s["tpot_ms"][k], 1) for k in ("median", "p99")},
            "cpu": cpu.summary()}


def aggregate(runs: list[dict]) -> list[dict]:
    """Per replica count: the median over repeats of each figure (and every run's throughput)."""
    out = []
    for n in sorted({r["replicas"] for r in runs}):
        rs = [r for r in runs if r["replicas"] == n]
        med = lambda f: round(statistics.median(f(r) for r in rs), 2)  # noqa: E731
        replica_cpu = lambda r: sum(v for k, v in r["cpu"].items() if re.fullmatch(r"r\d+_cpu_s", k))  # noqa: E731
        out.append({"replicas": n, "runs": len(rs), "output_throughput": med(lambda r: r["output_throughput"]),
                    "output_throughput_runs": [r["output_throughput"] for r in rs],
                    "request_throughput": med(lambda r: r["request_throughput"]),
                    "e2e_p50_ms": med(lambda r: r["e2e_ms"]["median"]), "e2e_p99_ms": med(lambda r: r["e2e_ms"]["p99"]),
                    "ttft_p50_ms": med(lambda r: r["ttft_ms"]["median"]), "ttft_p99_ms": med(lambda r: r["ttft_ms"]["p99"]),
                    "replica_cores_busy": med(lambda r: replica_cpu(r) / r["duration_s"]),
                    "other_cores_busy": med(lambda r: r["cpu"]["other_processes_cpu_s"] / r["duration_s"]),
                    "failed": sum(r["failed"] for r in rs)})
    return out


def format_table(rows: list[dict]) -> str:
    lines = ["| replicas | output tok/s (median; runs) | req/s | E2E P50 / P99 ms | TTFT P50 / P99 ms "
             "| cores busy: replicas / other processes | failed |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        runs = ", ".join(f"{x:.1f}" for x in r["output_throughput_runs"])
        lines.append(f"| {r['replicas']} | {r['output_throughput']:.1f} ({runs}) | {r['request_throughput']:.2f} "
                     f"| {r['e2e_p50_ms']:.0f} / {r['e2e_p99_ms']:.0f} | {r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} "
                     f"| {r['replica_cores_busy']:.2f} / {r['other_cores_busy']:.2f} | {r['failed']} |")
    return "\n".join(lines)


def _cmd_scaleout(args: argparse.Namespace) -> int:
    import shlex

    from nextok import hub
    from nextok.bench.balancer import start_replicas
    from nextok.bench.serve_bench import build_requests, load_tokenizer

    counts = [int(x) for x in args.replicas.split(",")]
    started = common.header()
    gguf = hub.resolve_model(args.model)
    requests = build_requests("random", load_tokenizer(gguf), args.num_requests, args.input_len,
                              args.output_len, seed=0)
    log_dir = tempfile.mkdtemp(prefix="nextok-scaleout-")
    print(f"logs: {log_dir}", file=sys.stderr)
    replicas = start_replicas(gguf, max(counts), log_dir, args.threads_per_replica, shlex.split(args.serve_args))
    runs = []
    try:
        _one_run(args, replicas, max(counts), requests[:max(counts) * 2], log_dir)  # warm every replica
        for _ in range(args.repeats):
            for n in counts:
                runs.append(_one_run(args, replicas, n, requests, log_dir))
                r = runs[-1]
                print(f"{n} replicas: {r['output_throughput']:.1f} tok/s, E2E P50 {r['e2e_ms']['median']:.0f} ms "
                      f"P99 {r['e2e_ms']['p99']:.0f} ms, other processes {r['cpu']['other_processes_cpu_s']:.1f} "
                      f"CPU s in {r['duration_s']:.1f} s", file=sys.stderr)
    finally:
        for r in replicas:
            r.stop()
    rows = aggregate(runs)
    print(format_table(rows))
    if args.output:
        common.write_json(args.output, {**started, "config": {k: v for k, v in vars(args).items() if k != "func"},
                                        "model": os.path.basename(gguf), "summary": rows, "runs": runs})
        print(f"wrote {args.output}", file=sys.stderr)
    return 0 if all(r["failed"] == 0 for r in runs) else 1
