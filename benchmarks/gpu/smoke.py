"""First look at nextok on a GPU (issue 6 groundwork): does the engine run on CUDA as it is, and
how far is batch-1 decode from the memory-bandwidth roofline?

    python3 benchmarks/gpu/smoke.py MODEL_DIR [MODEL_DIR ...]     (dirs from nextok.bench.fim_model)

For each dummy (random-weight) model: the device copy bandwidth (1 GiB device-to-device copies,
bytes read + written), the weight bytes, and nextok's decode time per token at batch 1, 8 and
32 with the torch reference attention (no Triton kernels, no CUDA graphs yet), in bf16.
The roofline of a decode step is weight bytes / copy bandwidth (KV bytes are small here).
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())


def copy_bandwidth() -> float:
    x = torch.randint(0, 255, (1 << 30,), dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        y.copy_(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    times.sort()
    return 2 * x.numel() / times[len(times) // 2]


def decode_ms(llm, batch: int, prompt_len: int = 128, new: int = 64) -> float:
    from nextok import SamplingParams

    prompts = [[(1000 + 7 * i + j) % 40000 + 300 for j in range(prompt_len)] for i in range(batch)]
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    many = SamplingParams(max_tokens=new + 1, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, one)  # warm-up, and the prompts' KV into the prefix cache
    torch.cuda.synchronize()
    t = time.perf_counter()
    llm.generate(prompts, one)
    torch.cuda.synchronize()
    t1 = time.perf_counter() - t
    t = time.perf_counter()
    llm.generate(prompts, many)
    torch.cuda.synchronize()
    return (time.perf_counter() - t - t1) / new * 1000


def main() -> int:
    from nextok import LLM

    from nextok.bench import common

    out = {**common.header(), "torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
           "python": sys.version.split()[0]}
    bw = copy_bandwidth()
    out["copy_bandwidth_gb_s"] = bw / 1e9
    print(f"{out['device']}  torch {out['torch']}  copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    out["models"] = []
    for d in sys.argv[1:]:
        t = time.perf_counter()
        llm = LLM(model=d, load_format="dummy", dtype="bfloat16", device="cuda", kv_cache_memory=16 << 30)
        load_s = time.perf_counter() - t
        model = llm.engine.runner.model
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        roof_ms = weight_bytes / bw * 1000
        row = {"model": os.path.basename(d.rstrip("/")), "load_s": load_s, "weight_gb": weight_bytes / 1e9,
               "roofline_ms_per_step": roof_ms, "decode_ms_per_step": {}}
        for b in (1, 8, 32):
            ms = decode_ms(llm, b)
            row["decode_ms_per_step"][b] = ms
            print(f"{row['model']:<10} weights {weight_bytes / 1e9:6.2f} GB  roofline {roof_ms:6.2f} ms  "
                  f"batch {b:>2}: {ms:7.2f} ms/step ({roof_ms / ms:.0%} of roofline)", flush=True)
        out["models"].append(row)
        del llm
        torch.cuda.empty_cache()
    path = os.path.join(os.environ.get("OUT", "."), "gpu-smoke.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
