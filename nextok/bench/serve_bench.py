"""`nextok bench serve`: latency and throughput of a running OpenAI-compatible server.

    nextok bench serve --base-url http://127.0.0.1:8000 --dataset random \
        --input-len 128 --output-len 128 --num-requests 64 --max-concurrency 8 \
        --slo ttft=200ms,e2e=5s --output results.json

Works against nextok, llama.cpp's llama-server and vLLM alike (see `load.py` for the endpoints).
The datasets are built with the tokenizer of `--model` (default: nextok's default model), so
prompt lengths are exact in that model's tokens; `random` and `code` send token ids.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import sys

from nextok.bench import common
from nextok.bench.load import ENDPOINTS, BenchRequest, HttpBackend, run_load
from nextok.bench.serve_metrics import format_summary, parse_slo, summarize


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="latency/throughput of a running server (TTFT, TPOT, ITL, E2E, goodput)")
    add_client_args(p)
    p.add_argument("--dataset", default="random", choices=["random", "code", "keystroke"])
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128, help="random/code: prompt tokens")
    p.add_argument("--output-len", type=int, default=128, help="random/code: generated tokens (EOS ignored)")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--request-rate", type=float, default=math.inf,
                      help="Poisson arrivals per second (default inf: all at once)")
    rate.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    p.add_argument("--seed", type=int, default=0, help="dataset and arrival seed")
    p.add_argument("--slo", default=None, help="goodput SLO, e.g. ttft=200ms,e2e=500ms,tpot=50ms")
    p.add_argument("--percentiles", default="50,90,99")
    p.add_argument("--time-limit", type=float, default=1800.0,
                   help="seconds; then nothing new is sent and in-flight requests are cancelled")
    p.add_argument("--output", default=None, help="write the results as JSON here")
    p.add_argument("--save-requests", action="store_true", help="keep every request's figures in the JSON")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--server-pid", type=int, default=None,
                   help="the server's process id, on this machine: its CPU time is then told apart "
                        "from other processes' in the result")
    _keystroke_args(p)
    p.set_defaults(func=_cmd_serve)


def add_client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    p.add_argument("--api-key", default=None)
    p.add_argument("--endpoint", default=None, choices=list(ENDPOINTS),
                   help="default: completions (keystroke: code)")
    p.add_argument("--served-model-name", default=None,
                   help="model name to send (default: the server's first /v1/models entry)")
    p.add_argument("--model", default=None,
                   help="tokenizer source for building prompts: GGUF, HF dir or alias (default model)")
    p.add_argument("--request-timeout", type=float, default=600.0)


def _keystroke_args(p: argparse.ArgumentParser) -> None:
    try:
        from nextok.bench import keystroke
    except ImportError:
        return
    keystroke.add_args(p)


def cpu_account(server_pid: int | None):
    """The run's CPU accounting; with the server's pid, its CPU time is told from other processes'
    (without, the server's time is inside "other", and the key says so)."""
    import psutil

    from nextok.bench.servers import CpuAccount, tree_cpu_seconds

    if not server_pid:
        return CpuAccount()
    try:
        server = psutil.Process(server_pid)
    except psutil.Error as e:
        raise ValueError(f"--server-pid {server_pid}: {e}") from None
    last = [0.0]

    def server_cpu() -> float:  # the last reading, once the server is gone
        try:
            last[0] = tree_cpu_seconds(server)
        except psutil.Error:
            pass
        return last[0]
    return CpuAccount(server=server_cpu)


def cpu_summary(cpu, server_pid: int | None) -> dict:
    s = cpu.summary()
    if not server_pid:
        s["server_and_other_processes_cpu_s"] = s.pop("other_processes_cpu_s")
    return s


def load_tokenizer(model: str | None):
    import os

    from nextok import hub
    from nextok.tokenizer import Tokenizer

    path = hub.resolve_model(model)
    return Tokenizer.from_gguf(path) if os.path.isfile(path) else Tokenizer.from_dir(path)


def build_requests(dataset: str, tokenizer, num: int, input_len: int, output_len: int,
                   seed: int) -> list[BenchRequest]:
    from nextok.bench import datasets

    prompts = datasets.build(dataset, tokenizer, num, input_len, seed)
    return [BenchRequest(prompt=p, prompt_len=len(p), max_tokens=output_len, ignore_eos=True)
            for p in prompts]


async def _serve(args, backend: HttpBackend) -> dict:
    if backend.model is None and backend.endpoint != "infill":
        backend.model = await backend.served_model()
    tok = load_tokenizer(args.model)
    if args.dataset == "keystroke":
        from nextok.bench import keystroke

        return await keystroke.run_from_args(args, backend, tok)
    requests = build_requests(args.dataset, tok, args.num_requests, args.input_len, args.output_len, args.seed)
    results, duration = await run_load(backend, requests, request_rate=args.request_rate,
                                       max_concurrency=args.max_concurrency, seed=args.seed,
                                       time_limit=args.time_limit, progress=args.progress)
    pcts = tuple(float(x) for x in args.percentiles.split(","))
    summary = summarize(results, duration, parse_slo(args.slo), pcts)
    out = {"summary": summary}
    if args.save_requests:
        out["requests"] = [r.to_json() for r in results]
    return out


def _cmd_serve(args: argparse.Namespace) -> int:
    parse_slo(args.slo)  # a bad SLO fails before any request
    if args.num_requests < 1:
        raise ValueError("--num-requests must be at least 1")
    endpoint = args.endpoint or ("code" if args.dataset == "keystroke" else "completions")
    backend = HttpBackend(args.base_url, endpoint, args.api_key, args.served_model_name,
                          timeout=args.request_timeout)

    async def main():
        try:
            return await _serve(args, backend)
        finally:
            await backend.aclose()

    started = common.header()  # the commit and time the run starts from, not ends at
    with cpu_account(args.server_pid) as cpu:
        result = asyncio.run(main())
    result["cpu"] = cpu_summary(cpu, args.server_pid)
    result = {**started, **({"base_url": args.base_url, "endpoint": endpoint, "dataset": args.dataset,
                               "request_rate": str(args.request_rate), "max_concurrency": args.max_concurrency}),
              **result}
    if args.dataset == "keystroke":
        from nextok.bench import keystroke

        print(keystroke.format_summary(result["summary"]))
    elif "summary" in result and "ttft_ms" in result["summary"]:
        print(format_summary(result["summary"]))
    if args.output:
        common.write_json(args.output, result)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0 if result.get("summary", {}).get("completed", 1) else 1
