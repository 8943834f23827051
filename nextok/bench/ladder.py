"""`nextok bench ladder`: the optimisation case study of a deployment, one measured step per row.

    nextok bench ladder --usd-per-hour 0.10 --slo-p99-e2e 4s --rates 0.25,0.5,1,2,4 \
        --num-requests 24 --output-dir benchmarks/results

Each step is a server subprocess, started, swept over request rates, and stopped in turn, all
with the same thread count, dtype, workload and client (`HttpBackend`, as `nextok bench serve`):

1. `transformers`, one request at a time (`hf_server.py`): the naive deployment;
2. + continuous batching: nextok without prefix caching or chunked prefill, and with paging
   taken away as far as the engine allows (see `STEPS`);
3. + paged KV (16-token blocks) and prefix caching;
4. + chunked prefill: nextok's defaults;
5. later steps (quantization, speculative decoding) are rows that say "not yet" until they exist.

The workload imitates an editor's code completion, where prefix caching matters: each request
is a prefix of a real Python standard-library file, and each file yields several successively
longer prefixes (the user typing on), interleaved with other files' requests. Every rate gets
files of its own but the same lengths, so a rate never finds the previous rate's prefixes in the
cache. The arithmetic of a row (QPS at the SLO, cost) is in `ladder_report.py`.
"""
from __future__ import annotations

import asyncio
import math
import os
import random
import sys
import threading
import time
from dataclasses import dataclass

from nextok.bench import common, ladder_report
from nextok.bench.load import BenchRequest, HttpBackend, run_load
from nextok.bench.serve_metrics import parse_slo, summarize


@dataclass(frozen=True)
class Step:
    key: str
    label: str
    server: str | None  # "transformers" | "nextok" | None: not built yet
    flags: tuple[str, ...] = ()
    notes: str = ""


STEPS = (
    Step("transformers", "transformers, one request at a time", "transformers"),
    # Before paging, a server reserved one contiguous max-length KV slab per sequence. nextok
    # accepts blocks of at most 128 tokens (factory._check_args), far below the model's 8192
    # positions, so this row keeps paging, with blocks as large as the engine allows.
    Step("batching", "+ continuous batching", "nextok",
         ("--no-prefix-caching", "--no-chunked-prefill", "--block-size", "128"),
         notes="paging cannot be switched off: 128-token KV blocks (the largest the engine accepts) "
               "instead of one max-length slab per sequence, so this row still pages, coarsely"),
    Step("paged", "+ paged KV and prefix caching", "nextok", ("--no-chunked-prefill", "--block-size", "16")),
    Step("chunked", "+ chunked prefill", "nextok"),  # all defaults
    Step("quant", "+ quantization (packed GGUF kernels)", None),
    Step("spec", "+ speculative decoding", None),
)
STEP_KEYS = tuple(s.key for s in STEPS)


def add_parser(sub) -> None:
    p = sub.add_parser("ladder", help="the optimisation ladder: one server config per row, swept over rates")
    p.add_argument("--model", default=None, help="GGUF file (default: nextok's default model)")
    p.add_argument("--rows", default=",".join(STEP_KEYS), help=f"steps to run, of {','.join(STEP_KEYS)}")
    p.add_argument("--usd-per-hour", type=float, default=0.10, help="machine price, for cost per 1M tokens")
    p.add_argument("--slo-p99-e2e", default="4s", help="P99 end-to-end SLO, e.g. 4s or 2500ms")
    p.add_argument("--rates", default="0.25,0.5,1,2,4", help="request rates to sweep (req/s, Poisson)")
    p.add_argument("--stop-factor", type=float, default=2.0,
                   help="stop a row's sweep once P99 E2E exceeds this many times the SLO")
    p.add_argument("--num-requests", type=int, default=24, help="requests per rate")
    p.add_argument("--prompts-per-file", type=int, default=4, help="growing prefixes per file")
    p.add_argument("--prompt-len", default="300,600", help="MIN,MAX prompt tokens")
    p.add_argument("--max-tokens", type=int, default=32, help="generated tokens per request (EOS ignored)")
    p.add_argument("--num-threads", type=int, default=os.cpu_count(), help="server CPU threads, every row")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--kv-cache-memory", default="1GiB", help="nextok's preallocated KV pool, every nextok row")
    p.add_argument("--seed", type=int, default=0, help="workload and arrival seed")
    p.add_argument("--time-limit-per-rate", type=float, default=None,
                   help="seconds (default: the arrival span plus 15 x the SLO, at least 60 s)")
    p.add_argument("--output-dir", default="benchmarks/results")
    p.add_argument("--name", default=None, help="file name prefix (default: DATE-ladder)")
    p.add_argument("--no-plots", dest="plots", action="store_false")
    p.add_argument("--from-result", default=None, metavar="JSON",
                   help="run nothing: report a saved ladder again under --slo-p99-e2e (an SLO up to "
                        "stop-factor x the one it ran with, whose sweeps then hold every rate needed)")
    p.set_defaults(func=run)
    from nextok.bench import plots

    plots.add_parser(sub)  # `nextok bench plot`: redraws from saved results


# ---- workload -------------------------------------------------------------------------------
def editor_prompt_sets(tokenizer, num_sets: int, num_requests: int, prompts_per_file: int,
                       min_len: int, max_len: int, seed: int) -> list[list[list[int]]]:
    """`num_sets` disjoint sets of `num_requests` token-id prompts, one set per sweep rate.

    A set holds ceil(num_requests / prompts_per_file) files; file slot j yields prefixes of the
    lengths `lengths[j]` (drawn once, so every set has the same lengths), in growing order;
    requests go round-robin over the files, so a file's next prefix comes F - 1 requests later.
    """
    if not 1 <= min_len <= max_len or prompts_per_file > max_len - min_len + 1:
        raise ValueError("need 1 <= MIN <= MAX prompt tokens, with room for distinct prefix lengths")
    rng = random.Random(seed)
    num_files = math.ceil(num_requests / prompts_per_file)
    lengths = [sorted(rng.sample(range(min_len, max_len + 1), prompts_per_file)) for _ in range(num_files)]
    files = _long_files(tokenizer, num_sets * num_files, max_len, rng)
    sets = []
    for s in range(num_sets):
        ids = files[s * num_files:(s + 1) * num_files]
        order = [ids[f][:lengths[f][k]] for k in range(prompts_per_file) for f in range(num_files)]
        sets.append(order[:num_requests])
    return sets


def _long_files(tokenizer, count: int, min_tokens: int, rng: random.Random) -> list[list[int]]:
    """The first tokens of `count` shuffled stdlib files that have at least `min_tokens`."""
    from nextok.bench.datasets import shuffled_sources

    out = []
    for _, text in shuffled_sources(rng, min_tokens * 12):  # code runs ~3-4 characters a token
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= min_tokens:
            out.append(ids[:min_tokens])
            if len(out) == count:
                return out
    raise RuntimeError(f"found only {len(out)} stdlib files with {min_tokens}+ tokens, need {count}")


# ---- one step -------------------------------------------------------------------------------
def server_for(step: Step, args, model_path: str, log_dir: str):
    from nextok.bench.servers import ServerUnderTest, free_port

    port = free_port()
    flags = ["--model", model_path, "--host", "127.0.0.1", "--port", str(port),
             "--num-threads", str(args.num_threads), "--dtype", args.dtype]
    if step.server == "transformers":
        argv = [sys.executable, "-m", "nextok.bench.hf_server", *flags]
    else:
        argv = [sys.executable, "-m", "nextok", "serve", *flags, "--kv-cache-memory", args.kv_cache_memory,
                *step.flags]
    return ServerUnderTest(step.label, argv, port, "/ready", os.path.join(log_dir, f"{step.key}.log"))


class ServingMeter:
    """Watches a server: peak RSS of its process tree, sampled in a thread from before it starts
    (loading apart: transformers dequantizes a GGUF on load and can peak above what serving
    needs), and, while serving, its CPU time, ours, and what other processes took meanwhile."""

    def __init__(self, server, interval: float = 0.1):
        self.server, self.interval = server, interval
        self.peak_rss = self.peak_startup_rss = 0
        self._lock = threading.Lock()  # the switch to serving must not lose to a sample in flight
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            rss = self.server.rss_bytes()
            with self._lock:
                self.peak_rss = max(self.peak_rss, rss)

    def __enter__(self):
        """Loading is over: from here on it is serving."""
        from nextok.bench.servers import CpuAccount

        with self._lock:
            self.peak_startup_rss, self.peak_rss = self.peak_rss, self.server.rss_bytes()
        self._t0 = time.perf_counter()
        self._cpu = CpuAccount(server=self.server.cpu_seconds).__enter__()
        return self

    def __exit__(self, *exc):
        self._cpu.__exit__(*exc)
        self.close()
        self.figures = {"sweep_s": round(time.perf_counter() - self._t0, 2),
                        "peak_rss_mib": round(self.peak_rss / 2**20, 1),
                        "peak_rss_startup_mib": round(self.peak_startup_rss / 2**20, 1),
                        **self._cpu.summary()}
        return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


async def sweep(url: str, prompt_sets: list[list[list[int]]], args, slo_ms: float,
                progress=print) -> list[dict]:
    """Warm-up on set 0, then one rate per later set, until a rate misses the SLO widely."""
    backend = HttpBackend(url, "completions", timeout=max(600.0, 20 * slo_ms / 1000))
    rates = parse_rates(args.rates)
    points = []
    try:
        for prompt in prompt_sets[0][:2]:  # first-call costs (weight packing, kernel loads) stay out
            await backend.send(_request(prompt, args.max_tokens))
        for i, rate in enumerate(rates):
            requests = [_request(p, args.max_tokens) for p in prompt_sets[i + 1]]
            limit = args.time_limit_per_rate or max(60.0, len(requests) / rate + 15 * slo_ms / 1000)
            results, duration = await run_load(backend, requests, request_rate=rate, seed=args.seed + i,
                                               time_limit=limit)
            summary = summarize(results, duration, {"e2e": slo_ms / 1000})
            cached = [r.cached_tokens for r in results if r.ok and r.cached_tokens is not None]
            points.append({"rate": rate, "summary": summary,
                           "cached_prompt_tokens": sum(cached) if cached else None,
                           # per request for the CDFs; ITL gaps only in the summary (they would
                           # make the committed JSON ~7x larger)
                           "requests": [{k: v for k, v in r.to_json().items() if k != "itl"} for r in results]})
            progress(f"  {rate:g} req/s: P99 E2E {_ms(ladder_report.p99_e2e_ms(summary))}, "
                     f"{summary['completed']}/{summary['num_requests']} ok, "
                     f"{summary['output_throughput']:.1f} output tok/s")
            if ladder_report.should_stop(summary, slo_ms, args.stop_factor):
                break
    finally:
        await backend.aclose()
    return points


def _request(prompt: list[int], max_tokens: int) -> BenchRequest:
    return BenchRequest(prompt=prompt, prompt_len=len(prompt), max_tokens=max_tokens, ignore_eos=True)


def _ms(x) -> str:
    return "n/a" if x is None else f"{x:.0f} ms"


def run_step(step: Step, args, model_path: str, prompt_sets, slo_ms: float, log_dir: str) -> dict:
    row = {"key": step.key, "label": step.label, "notes": step.notes}
    if step.server is None:
        return {**row, "status": ladder_report.NOT_YET}
    server = server_for(step, args, model_path, log_dir)
    row["server_command"] = " ".join(server.argv)
    print(f"{step.label}: {row['server_command']}", flush=True)
    t0 = time.perf_counter()
    meter = ServingMeter(server)
    try:
        server.start(timeout=900.0)
        row["startup_s"] = round(time.perf_counter() - t0, 1)
        with meter:
            points = asyncio.run(sweep(server.url, prompt_sets, args, slo_ms))
    except (RuntimeError, OSError) as e:  # TimeoutError is an OSError
        print(f"  failed: {e}", file=sys.stderr)
        return {**row, "status": "failed", "error": str(e).splitlines()[0], "log_tail": _tail(server.log_path)}
    finally:
        meter.close()
        server.stop()
    op = ladder_report.operating_point(points, slo_ms, args.usd_per_hour)
    prompt_tokens = sum(p["summary"]["total_input_tokens"] for p in points)
    cached = [p["cached_prompt_tokens"] for p in points if p["cached_prompt_tokens"] is not None]
    return {**row, "status": "measured", **meter.figures, "operating_point": op,
            "cached_prompt_fraction": sum(cached) / prompt_tokens if cached and prompt_tokens else None,
            "sweep": points}


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


# ---- the command ----------------------------------------------------------------------------
def parse_rates(text: str) -> list[float]:
    rates = [float(x) for x in text.split(",") if x.strip()]
    if not rates or any(r <= 0 or math.isinf(r) for r in rates):
        raise ValueError("--rates must be positive finite request rates, e.g. 0.25,0.5,1")
    return sorted(rates)


def run(args) -> int:
    import tempfile

    from nextok import hub
    from nextok.bench.serve_bench import load_tokenizer

    slo_ms = parse_slo(f"e2e={args.slo_p99_e2e}")["e2e"] * 1000
    if args.from_result:
        return rereport(args, slo_ms)
    rates = parse_rates(args.rates)
    keys = [k.strip() for k in args.rows.split(",") if k.strip()]
    unknown = sorted(set(keys) - set(STEP_KEYS))
    if unknown or not keys:
        raise ValueError(f"unknown --rows {unknown}; choose of {','.join(STEP_KEYS)}")
    min_len, max_len = (int(x) for x in args.prompt_len.split(","))
    model_path = hub.resolve_model(args.model)
    prompt_sets = editor_prompt_sets(load_tokenizer(model_path), len(rates) + 1, args.num_requests,
                                     args.prompts_per_file, min_len, max_len, args.seed)
    steps = [s for s in STEPS if s.key in keys]
    started = common.header()  # the commit and time the run starts from, not ends at
    with tempfile.TemporaryDirectory(prefix="nextok-ladder-") as log_dir:
        rows = [run_step(s, args, model_path, prompt_sets, slo_ms, log_dir) for s in steps]
    workload = (f"code completion in an editor: {args.num_requests} requests per rate, prefixes of "
                f"{min_len}-{max_len} tokens of Python stdlib files, {args.prompts_per_file} growing "
                f"prefixes per file interleaved round-robin, fresh files at each rate; "
                f"{args.max_tokens} output tokens (EOS ignored), greedy")
    config = {"model": model_path, "num_threads": args.num_threads, "dtype": args.dtype,
              "kv_cache_memory": args.kv_cache_memory, "slo_p99_e2e_ms": slo_ms, "rates": rates,
              "stop_factor": args.stop_factor, "usd_per_hour": args.usd_per_hour,
              "num_requests": args.num_requests, "prompts_per_file": args.prompts_per_file,
              "prompt_len": [min_len, max_len], "max_tokens": args.max_tokens, "seed": args.seed,
              "workload_description": workload}
    result = started | {"benchmark": "ladder", "config": config, "rows": rows}
    write_outputs(result, args)
    return 0 if all(r["status"] != "failed" for r in rows) else 1


def rereport(args, slo_ms: float) -> int:
    """A saved ladder's rows recomputed for another SLO, from the same measured sweeps.

    A row's sweep stopped at the first rate whose P99 exceeded stop_factor x the run's SLO, so
    for any SLO up to that bound every rate that could meet it was measured."""
    import json

    with open(args.from_result) as f:
        result = json.load(f)
    cfg = result["config"]
    bound = cfg["stop_factor"] * cfg["slo_p99_e2e_ms"]
    if slo_ms > bound:
        raise ValueError(f"the sweeps of {args.from_result} stopped above {bound:.0f} ms; "
                         f"an SLO of {slo_ms:.0f} ms needs rates they did not measure")
    for row in result["rows"]:
        if row.get("status") == "measured":
            row["operating_point"] = ladder_report.operating_point(row["sweep"], slo_ms, cfg["usd_per_hour"])
    result["config"] = {**cfg, "slo_p99_e2e_ms": slo_ms, "measured_with_slo_p99_e2e_ms": cfg["slo_p99_e2e_ms"]}
    result["rereported_from"] = args.from_result
    args.name = args.name or os.path.splitext(os.path.basename(args.from_result))[0] + f"-slo{slo_ms / 1000:g}s"
    args.output_dir = os.path.dirname(os.path.abspath(args.from_result)) if args.output_dir == "benchmarks/results" \
        else args.output_dir
    write_outputs(result, args)
    return 0


def write_outputs(result: dict, args) -> None:
    prefix = os.path.join(args.output_dir, args.name or f"{result['time_utc'][:10]}-ladder")
    common.write_json(prefix + ".json", result)
    markdown = ladder_report.format_markdown(result)
    with open(prefix + ".md", "w") as f:
        f.write(markdown)
    print("\n" + markdown)
    written = [prefix + ".json", prefix + ".md"]
    if args.plots:
        from nextok.bench import plots

        written += plots.draw_ladder(result, prefix)
    print("wrote " + ", ".join(written), file=sys.stderr)
