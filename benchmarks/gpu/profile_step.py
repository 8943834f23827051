"""Where a decode step's time goes on the GPU: torch.profiler over the engine's own decode loop.

    python3 benchmarks/gpu/profile_step.py CONFIG_DIR TOKENIZER OUT.json [batch ...]

For each engine (async scheduling on, and off) and batch size: wall time per decode step, the
GPU's busy time per step (the union of kernel and copy intervals on the device) and so the idle
gap, and the kernels that take the most time per step, grouped by kind. The prompts are fresh
random ids (no prefix-cache hits); each run decodes STEPS tokens after a 1-token prefill run of
the same shape, and the profile covers only the decode run. PROFILE_QUANT=int4 (any
--quantization) profiles the quantized model; PROFILE_ASYNC_ONLY=1 the async engine only.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.getcwd())

from nextok import LLM, SamplingParams  # noqa: E402
from nextok.bench.common import header  # noqa: E402

STEPS = 48
INPUT = 512


def kind(name: str) -> str:
    """Group kernel names into what they do (cuBLAS GEMMs, our Triton kernels, copies...)."""
    n = name.lower()
    for key, pats in (("gemm (cuBLAS/cutlass)", ("gemm", "gemv", "cutlass", "sm90", "nvjet")),
                      ("paged decode attention", ("paged_decode", "decode_attn", "_reduce")),
                      ("store kv", ("store_kv",)),
                      ("rms norm (fused)", ("rms",)),
                      ("silu*mul (fused)", ("silu",)),
                      ("rope (fused)", ("rope",)),
                      ("argmax / sampler", ("argmax", "reduce_kernel", "max")),
                      ("memcpy", ("memcpy", "copy")),
                      ("embedding / index", ("index", "embedding", "gather"))):
        if any(p in n for p in pats):
            return key
    return "other: " + re.sub(r"<.*", "", name)[:60]


def device_intervals(prof) -> list[tuple[float, float]]:
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0:
            out.append((e.time_range.start, e.time_range.end))
    return out


def union_us(intervals) -> float:
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def run_case(llm, b: int, vocab: int) -> dict:
    gen = torch.Generator().manual_seed(b)
    prompts = lambda: torch.randint(100, vocab - 1, (b, INPUT), generator=gen).tolist()  # noqa: E731
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    full = SamplingParams(temperature=0.0, max_tokens=1 + STEPS, ignore_eos=True)
    llm.generate(prompts(), full)  # warm-up of this shape
    torch.cuda.synchronize()
    t = time.perf_counter()
    llm.generate(prompts(), one)
    torch.cuda.synchronize()
    prefill = time.perf_counter() - t
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        llm.generate(prompts(), full)
        torch.cuda.synchronize()
        total = time.perf_counter() - t
    step_ms = (total - prefill) / STEPS * 1e3
    busy_ms = union_us(device_intervals(prof)) / 1e3
    kinds: dict[str, float] = {}
    kernels: dict[str, list] = {}  # kind -> [(ms per run, launches, kernel name)]
    for e in prof.key_averages():
        dt = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if dt and e.device_type == torch.autograd.DeviceType.CUDA:
            kinds[kind(e.key)] = kinds.get(kind(e.key), 0.0) + dt / 1e3
            kernels.setdefault(kind(e.key), []).append((dt / 1e3, e.count, e.key[:100]))
    # The profiled run is the prefill plus STEPS decode steps; per step, the prefill's share
    # (its wall time) is taken out of the busy time as if it kept the GPU busy throughout.
    per_step_busy = max(busy_ms - prefill * 1e3, 0.0) / STEPS
    top = sorted(kinds.items(), key=lambda kv: -kv[1])[:12]
    return {"batch": b, "wall_step_ms": step_ms, "gpu_busy_step_ms": per_step_busy,
            "gpu_idle_step_ms": step_ms - per_step_busy,
            "kernel_ms_per_run_by_kind": dict(top), "profiled_run_ms": total * 1e3,
            "top_kernels_by_kind": {k: sorted(v, reverse=True)[:3] for k, v in kernels.items()},
            "prefill_ms": prefill * 1e3}


def main() -> int:
    config, tokenizer, out_path = sys.argv[1:4]
    sizes = [int(x) for x in sys.argv[4:]] or [1, 32]
    common = dict(model=config, load_format="dummy", tokenizer=tokenizer, dtype="bfloat16",
                  max_model_len=2048, kv_cache_memory=24 << 30)
    quant = os.environ.get("PROFILE_QUANT")  # e.g. int4: the same steps with quantized weights
    if quant:
        common["quantization"] = quant
    result = {"config": config, "steps": STEPS, "input_len": INPUT, "quantization": quant, "cases": {}}
    engines = (("async", {}), ("sync", {"async_scheduling": "off"}))
    if os.environ.get("PROFILE_ASYNC_ONLY"):
        engines = engines[:1]
    for name, kw in engines:
        llm = LLM(**common, **kw)
        vocab = llm.engine.config.model.vocab_size
        result["cases"][name] = [run_case(llm, b, vocab) for b in sizes]
        for c in result["cases"][name]:
            print(f"{name:>5} batch {c['batch']:>3}: step {c['wall_step_ms']:.3f} ms, GPU busy "
                  f"{c['gpu_busy_step_ms']:.3f} ms, idle {c['gpu_idle_step_ms']:.3f} ms", flush=True)
            for k, v in c["kernel_ms_per_run_by_kind"].items():
                print(f"        {v / STEPS:8.3f} ms/step  {k}")
                for ms, count, name in c["top_kernels_by_kind"][k]:
                    print(f"                 {ms / STEPS:8.3f} ms/step, {count / STEPS:6.1f}/step  {name}")
        del llm
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump(header(result), f, indent=1)  # with the commit, machine and command
    return 0


if __name__ == "__main__":
    sys.exit(main())
