"""Completions through the server at a big batch: two source trees side by side.

    python benchmarks/server_whole.py OUT.json --a OLD_TREE --b NEW_TREE [--requests 256]
        [--tokens 128] [--rounds 3] [--stream] [--vocab N] [--b-path DIR] [--path DIR]
        [--config HF_CONFIG_DIR --tokenizer DIR --serve-args "--dtype bfloat16 ..."]

Each tree's `nextok serve` runs the model of benchmarks/host_step.py on the CPU (2 layers, 64
wide, the default model's vocabulary and tokenizer, random weights: the model costs next to
nothing, so what is timed is the server's and the engine's own work), or with `--config` that
configuration's random weights, with `--serve-args` (e.g. on a GPU). Both servers start once; each round sends the
same `--requests` concurrent `/v1/completions` requests (16-token prompts as token ids, greedy,
ignore_eos, `--tokens` each; not streamed, or with `--stream` streamed as an editor reads them: SSE,
usage in the last chunk) to A, then to B. Per run: the wall time from the first
request to the last response, the server process's CPU seconds, and what other processes took.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import psutil
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nextok import hub  # noqa: E402
from nextok.bench.common import Meter, header  # noqa: E402
from benchmarks.host_step import tiny_model  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CPU_ARGS = f"--dtype float32 --kv-cache-memory {1 << 30}"


def start(tree: str, model: str, tokenizer: str, serve_args: str, seqs: int, log,
          paths: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "nextok", "serve", "--model", model, "--load-format", "dummy",
           "--tokenizer", tokenizer, *serve_args.split(), "--max-model-len", "2048",
           "--max-num-seqs", str(seqs), "--max-num-batched-tokens", "8192", "--port", str(port),
           "--served-model-name", "tiny"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, *paths])}
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.flush()
            with open(log.name) as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"the server of {tree} exited ({proc.returncode}):\n{tail}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the server of {tree} did not come up: see {log.name}")


async def load(url: str, prompts: list[list[int]], tokens: int, stream: bool, chunks: list | None = None) -> int:
    """Sends the requests at once -> tokens generated; streamed, `chunks` gets each one's count
    of SSE chunks with text (fewer than its tokens where the server joined steps)."""
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=len(prompts))) as c:
        async def one(p):
            body = {"model": "tiny", "prompt": p, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
            if not stream:
                r = await c.post("/v1/completions", json=body)
                r.raise_for_status()
                return r.json()["usage"]["completion_tokens"]
            body.update(stream=True, stream_options={"include_usage": True})
            usage, n = None, 0
            async with c.stream("POST", "/v1/completions", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        event = json.loads(line[6:])
                        usage = event.get("usage") or usage
                        n += any(ch.get("text") for ch in event.get("choices") or [])
            if chunks is not None:
                chunks.append(n)
            return usage["completion_tokens"]
        return sum(await asyncio.gather(*(one(p) for p in prompts)))


def run(label: str, proc: subprocess.Popen, url: str, prompts, tokens: int, stream: bool) -> dict:
    server = psutil.Process(proc.pid)
    cpu0 = sum(server.cpu_times()[:2])
    chunks = []
    with Meter() as meter:
        generated = asyncio.run(load(url, prompts, tokens, stream, chunks))
    server_cpu = sum(server.cpu_times()[:2]) - cpu0
    return {"tree": label, "wall_s": meter.seconds, "server_cpu_s": server_cpu, "tokens": generated,
            **({"text_chunks": sum(chunks)} if stream else {}),
            "tokens_per_s": generated / meter.seconds, "bench_process_peak_rss": meter.peak_rss,
            # Meter counts every process but this one; the servers' own share taken out (both
            # read in clock ticks, so a few hundredths either way)
            "others_and_server_cpu_s": meter.other_cpu_seconds,
            "other_cpu_seconds": meter.other_cpu_seconds - server_cpu}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--a", required=True, help="source tree A (the baseline)")
    ap.add_argument("--b", required=True, help="source tree B")
    ap.add_argument("--b-path", default=None,
                    help="a directory of packages B's server imports too (e.g. other event loops)")
    ap.add_argument("--path", default=None, help="a directory of packages both servers import")
    ap.add_argument("--config", default=None,
                    help="a Hugging Face config.json's directory (random weights) instead of the tiny model")
    ap.add_argument("--tokenizer", default=None, help="default: the default model's")
    ap.add_argument("--serve-args", default=CPU_ARGS, help=f"more `nextok serve` flags (default: {CPU_ARGS!r})")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stream", action="store_true", help="streamed requests (SSE)")
    ap.add_argument("--vocab", type=int, default=None,
                    help="the model's vocabulary, if not the tokenizer's 49152: a smaller one makes "
                         "a step as short as a GPU's (the tokenizer still decodes its ids)")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, min(40000, args.vocab or 40000), (16,), generator=gen).tolist()
               for _ in range(args.requests)]
    # (absolute: each server runs in its own tree)
    tokenizer = os.path.abspath(args.tokenizer) if args.tokenizer else hub.resolve_model("smollm2-135m-instruct")
    with tempfile.TemporaryDirectory() as d:
        if args.config:
            shutil.copy(os.path.join(args.config, "config.json"), d)
        else:
            tiny_model(d)
        if args.vocab:
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump({**cfg, "vocab_size": args.vocab}, f)
        servers = {}
        try:
            for label, tree in (("a", args.a), ("b", args.b)):
                log = open(os.path.join(d, f"server-{label}.log"), "w")
                paths = [p for p in (args.path, args.b_path if label == "b" else None) if p]
                servers[label] = start(os.path.abspath(tree), d, tokenizer, args.serve_args, args.requests, log, paths)
                asyncio.run(load(servers[label][1], prompts[:8], 4, args.stream))  # warm-up
            runs = []
            for r in range(args.rounds):
                for label in ("a", "b"):
                    res = dict(run(label, *servers[label], prompts, args.tokens, args.stream), round=r)
                    runs.append(res)
                    print(f"round {r} {label}: {res['wall_s']:.2f} s, {res['tokens_per_s']:.0f} tokens/s, server CPU "
                          f"{res['server_cpu_s']:.2f} s, others {res['other_cpu_seconds']:.2f} s"
                          + (f", {res['text_chunks']} chunks" if args.stream else ""), flush=True)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(60)
    trees = {label: {"path": os.path.abspath(t), "commit": _commit(t)} for label, t in (("a", args.a), ("b", args.b))}
    trees["b"]["extra_path"] = args.b_path
    if os.path.abspath(args.b) == ROOT and os.environ.get("NEXTOK_COMMIT"):  # (a copy on the GPU machine)
        trees["b"]["commit"] = os.environ["NEXTOK_COMMIT"]
    with open(args.out, "w") as f:
        json.dump(header({"requests": args.requests, "tokens": args.tokens, "stream": args.stream, "vocab": args.vocab,
                          "config": args.config, "serve_args": args.serve_args, "path": args.path,
                          "trees": trees, "runs": runs}), f, indent=1)
    return 0


def _commit(tree: str) -> str:
    """The tree's commit; a copy without its own repository (`git archive`) names it in COMMIT."""
    if os.path.isfile(os.path.join(tree, "COMMIT")):
        with open(os.path.join(tree, "COMMIT")) as f:
            return f.read().strip()
    run = subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return run.stdout.strip() + ("+changes" if dirty else "")


if __name__ == "__main__":
    sys.exit(main())
