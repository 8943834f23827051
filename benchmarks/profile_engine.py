"""Where a CPU engine step's time goes: prefill and decode at several batch sizes, profiled.

    .venv/bin/python benchmarks/profile_engine.py [--output benchmarks/results/DATE-profile-cpu.md]

For each phase (a 128-token prefill of one request; decode steps at batch 1, 8 and 32 with
~128-token contexts) it times a few engine steps, then profiles the same steps with
torch.profiler and lists the ops that took the most time, as ms per step and share of the step.
The default model, float32, greedy, EOS ignored; other processes' CPU time is recorded.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from nextok import SamplingParams
from nextok.bench import common, datasets
from nextok.engine.factory import EngineArgs, create_engine

PARAMS = SamplingParams(max_tokens=2048, temperature=0.0, ignore_eos=True)  # aborted long before


def fresh(engine, batch: int, input_len: int, seed: int) -> None:
    """Adds `batch` new random prompts and runs steps until all are past their prefill."""
    for i, ids in enumerate(datasets.random_prompts(engine.tokenizer, batch, input_len, seed)):
        engine.add_request(f"s{seed}-{i}", ids, PARAMS)


def abort_all(engine) -> None:
    for rid in list(engine.requests):
        engine.abort_request(rid)


def prefilling(engine) -> bool:
    """Is any request still waiting or short of its prompt's KV?"""
    sched = engine.scheduler
    return bool(sched.waiting) or any(s.num_computed_tokens < s.num_prompt_tokens for s in sched.running)


def timed_steps(engine, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        engine.step()
        out.append((time.perf_counter() - t) * 1000)
    return out


def profile_steps(engine, n: int) -> list[tuple[str, float, int]]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            engine.step()
    rows = [(e.key, e.self_cpu_time_total / 1000 / n, e.count // n) for e in prof.key_averages()]
    return sorted(rows, key=lambda r: -r[1])


def phase(engine, name: str, batch: int, seed: int, decode: bool, top: int) -> dict:
    if decode:
        fresh(engine, batch, 128, seed)
        while prefilling(engine):
            engine.step()
        times = timed_steps(engine, 8)
        prof = profile_steps(engine, 4)
        abort_all(engine)
    else:  # one prefill step per fresh prompt
        times, prof = [], []
        for k in range(6):
            fresh(engine, batch, 128, seed + k)
            if k < 4:
                times += timed_steps(engine, 1)
            else:
                prof = profile_steps(engine, 1)
            abort_all(engine)
    step_ms = statistics.median(times)
    total = sum(ms for _, ms, _ in prof)
    return {"phase": name, "step_ms_median": step_ms, "step_ms": [round(t, 1) for t in times],
            "profiled_ms_per_step": total,
            "ops": [{"op": k, "ms_per_step": round(ms, 2), "share": ms / total, "calls_per_step": c}
                    for k, ms, c in prof[:top]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output", default=None)
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    engine = create_engine(EngineArgs(num_threads=args.num_threads, max_num_seqs=64, dtype="float32"))
    fresh(engine, 2, 64, 999)  # first-call costs stay out of the figures
    while prefilling(engine):
        engine.step()
    abort_all(engine)
    with common.Meter() as meter:
        phases = [phase(engine, "prefill 128 tokens, 1 request", 1, 100, False, args.top)]
        for b in (1, 8, 32):
            phases.append(phase(engine, f"decode, batch {b}, ~128-token contexts", b, 200 + b, True, args.top))
    head = common.header({"meter": meter.summary()})
    lines = [f"# Where a CPU engine step's time goes ({head['time_utc'][:10]})", "",
             f"Machine: {common.machine_line(head['machine'])}", f"Commit: {head['commit']}",
             f"Command: `{head['command']}`",
             f"Other processes' CPU during the run: {meter.other_cpu_seconds:.1f} s of {meter.seconds:.0f} s", "",
             "Default model (SmolLM2-135M, float32 weights dequantized from Q4_1), greedy. Step times are "
             "medians of timed steps; the op table is torch.profiler self time per step (ops run by "
             "oneDNN/OpenMP count once, in wall time).", ""]
    for p in phases:
        lines += [f"## {p['phase']}: {p['step_ms_median']:.1f} ms per step",
                  f"(timed steps: {', '.join(map(str, p['step_ms']))} ms; torch ops under the profiler: "
                  f"{p['profiled_ms_per_step']:.1f} ms per step, the rest of a step being Python, the C "
                  "paged-decode kernel (called through ctypes, invisible to the profiler) and sampling)", "",
                  "| op | ms / step | share | calls / step |", "|---|---:|---:|---:|"]
        lines += [f"| `{o['op']}` | {o['ms_per_step']:.2f} | {o['share']:.0%} | {o['calls_per_step']} |" for o in p["ops"]]
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
        common.write_json(args.output.rsplit(".", 1)[0] + ".json", {**head, "phases": phases})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
