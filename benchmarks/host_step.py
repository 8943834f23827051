"""The engine's host work per decode step at a big batch, apart from the model (CPU).

    python benchmarks/host_step.py OUT.json [--seqs 256] [--steps 128] [--rounds 3]

On a GPU a decode step of 256 sequences takes ~5-10 ms of device time (8B, H200), and with async
scheduling the host prepares the next step and collects the last one meanwhile. Where the host
work per step is longer than the device's, the GPU waits. This measures that host work on a model
too small to cost anything itself: a 2-layer, 64-wide Llama with the default model's 49152-token
vocabulary and tokenizer, random weights, on the CPU. Each component is timed by wrapping it
(scheduler, the runner's input preparation, collecting a step: the detokenizer, stops, outputs).

Two request kinds, interleaved A B A B over the rounds: "generate" (LLM.generate: requests nobody
reads before they end, whose text is decoded once at the end) and "streamed" (the engine's
requests with stream=True, as the server's: text decoded every step). 16-token prompts, greedy,
ignore_eos, no stop strings.
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nextok import LLM, SamplingParams, hub  # noqa: E402
from nextok.bench.common import Meter, header  # noqa: E402
from nextok.engine import engine as engine_mod, scheduler as sched_mod  # noqa: E402
from nextok.worker import model_runner as runner_mod  # noqa: E402

PARTS = [(sched_mod.Scheduler, "schedule"), (sched_mod.Scheduler, "advance"), (sched_mod.Scheduler, "resolve"),
         (runner_mod.ModelRunner, "_prepare"), (engine_mod.LLMEngine, "_finish_step"),
         (engine_mod.LLMEngine, "_detokenize"), (engine_mod.LLMEngine, "step")]
TIMES: collections.Counter = collections.Counter()


def _wrap(cls, name):
    f = getattr(cls, name)

    @functools.wraps(f)
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            TIMES[f"{cls.__name__}.{name}"] += time.perf_counter() - t
    setattr(cls, name, timed)


def tiny_model(path: str) -> None:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "smollm2-135m",
                           "config.json")) as f:
        cfg = json.load(f)
    cfg.update(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)


def run(llm, prompts, steps: int, kind: str) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
    TIMES.clear()
    with Meter() as meter:  # (and what other processes took of the CPU meanwhile)
        if kind == "generate":
            llm.generate(prompts, params)
        else:  # the server's requests: stream=True, outputs every step
            eng = llm.engine
            for i, p in enumerate(prompts):
                eng.add_request(f"host-{kind}-{i}", p, params, stream=True)
            while eng.has_unfinished_requests():
                eng.step()
    wall = meter.seconds
    n = steps + 1  # (the first step is the 16-token prefill of every sequence)
    ms = {k: v / n * 1e3 for k, v in TIMES.items()}
    host = sum(ms.get(f"{c.__name__}.{m}", 0.0) for c, m in PARTS if m not in ("step", "_detokenize"))
    return {"kind": kind, "wall_s": wall, "ms_per_step": ms, "host_ms_per_step": host, **meter.summary()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    for cls, name in PARTS:
        _wrap(cls, name)
    with tempfile.TemporaryDirectory() as d:
        tiny_model(d)
        llm = LLM(model=d, load_format="dummy", tokenizer=hub.resolve_model("smollm2-135m-instruct"),
                  dtype="float32", max_model_len=2048, kv_cache_memory=1 << 30, max_num_seqs=args.seqs,
                  max_num_batched_tokens=8192)
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(100, 40000, (16,), generator=gen).tolist() for _ in range(args.seqs)]
        llm.generate(prompts[:8], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # warm-up
        runs = []
        for r in range(args.rounds):
            for kind in ("generate", "streamed"):
                res = dict(run(llm, prompts, args.steps, kind), round=r)
                runs.append(res)
                print(f"round {r} {kind:>8}: host {res['host_ms_per_step']:.2f} ms a step (finish "
                      f"{res['ms_per_step']['LLMEngine._finish_step']:.2f}, detokenize "
                      f"{res['ms_per_step'].get('LLMEngine._detokenize', 0.0):.2f}), wall "
                      f"{res['wall_s'] / (args.steps + 1) * 1e3:.1f} ms a step", flush=True)
    with open(args.out, "w") as f:
        json.dump(header({"seqs": args.seqs, "steps": args.steps, "runs": runs}), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
