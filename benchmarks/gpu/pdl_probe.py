"""The decode step with and without the Triton GEMV and programmatic dependent launch (PDL), on
one engine: each variant recaptures the CUDA graphs, then is timed device-only (bench latency's
device_step_ms: graph replays back to back, each with the lm_head and argmax) in interleaved
rounds. Logits on one fixed KV state are compared across variants: PDL changes only when
kernels start, so with it the logits must equal those without it bit for bit.

    python3 benchmarks/gpu/pdl_probe.py CONFIG_DIR TOKENIZER OUT.json [rounds]
"""
from __future__ import annotations

import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())

from nextok import LLM  # noqa: E402
from nextok.bench.common import header  # noqa: E402
from nextok.bench.latency import copy_bandwidth, device_step_ms, weight_bytes  # noqa: E402
from nextok.kernels.triton import pdl  # noqa: E402

# name -> (rows up to which the Triton GEMV runs, PDL)
VARIANTS = {"cublas": (0, False), "cublas+pdl": (0, True), "gemv1+pdl": (1, True),
            "gemv8+pdl": (8, True), "gemv8": (8, False)}
SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
          ("lm_head", 128256, 4096)]
BATCHES, CTX = (1, 8), 192


def set_variant(runner, name: str) -> None:
    gemv_rows, use_pdl = VARIANTS[name]
    ops = runner.model._linear_ops
    ops.gemv_rows = gemv_rows
    pdl.set_enabled(use_pdl)
    runner.graphs.graphs.clear()
    runner.graphs.outputs.clear()
    runner.graphs.capture()


@torch.inference_mode()
def logits_on_fixed_state(runner, b: int) -> torch.Tensor:
    g = runner.graphs
    bs = runner.block_size
    nblocks = -(-CTX // bs)
    dev = runner.device
    tables = torch.arange(1, 1 + b * nblocks, device=dev).view(b, nblocks)
    ids = torch.arange(b, device=dev) * 7 + 100
    pos = torch.full((b,), CTX - 1, device=dev)
    slots = tables[:, -1] * bs + (CTX - 1) % bs
    lens = torch.full((b,), CTX, device=dev)
    hidden = g.run(ids, pos, slots, tables, lens)
    return runner.model.compute_logits(hidden).float().cpu()


def isolated_gemv() -> list[dict]:
    """The GEMV against cuBLAS per 8B shape, alone (weights rotate over copies beyond L2)."""
    from nextok.kernels.triton.gemv import gemv

    rows = []
    for (name, n, k), m in [(s, m) for s in SHAPES for m in BATCHES]:
        copies = max(2, -(-512 * 2**20 // (n * k * 2)))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        err = (gemv(x, ws[0]).float() - torch.nn.functional.linear(x, ws[0]).float()).abs().max().item()
        row = {"shape": name, "n": n, "k": k, "m": m, "max_abs_err": err}
        for label, fn in (("cublas_us", torch.nn.functional.linear), ("triton_us", gemv)):
            for i in range(3):
                fn(x, ws[i % copies])
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for i in range(60):
                fn(x, ws[i % copies])
            b.record()
            torch.cuda.synchronize()
            row[label] = a.elapsed_time(b) * 1e3 / 60
        rows.append(row)
        print(f"{name:>8} m={m}: cuBLAS {row['cublas_us']:.1f} us, GEMV {row['triton_us']:.1f} us, "
              f"err {err:.4f}", flush=True)
        del ws
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    config_dir, tok, out_path = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    pdl.set_enabled(False)
    isolated = isolated_gemv()
    llm = LLM(model=config_dir, tokenizer=tok, load_format="dummy", dtype="bfloat16",
              max_model_len=4096, cuda_graph_max_batch=8, max_num_seqs=8)
    runner = llm.engine.runner
    gen = torch.Generator(device=runner.device).manual_seed(0)
    for k, v in runner.kv_caches:  # a KV state that is not all zeros
        k.normal_(generator=gen)
        v.normal_(generator=gen)
    times = {name: {b: [] for b in BATCHES} for name in VARIANTS}
    logits = {}
    for r in range(rounds):
        for name in VARIANTS:
            set_variant(runner, name)
            for b in BATCHES:
                times[name][b].append(device_step_ms(runner, b, CTX, iters=100))
                if r == 0:
                    logits[(name, b)] = logits_on_fixed_state(runner, b)
            print(f"round {r + 1} {name:>11}: " + ", ".join(
                f"b={b} {times[name][b][-1]:.3f} ms" for b in BATCHES), flush=True)
    pdl.set_enabled(None)
    bw = copy_bandwidth(runner.device)
    weights = weight_bytes(runner.model, decode=True)
    summary = {}
    for name in VARIANTS:
        summary[name] = {str(b): {"median_ms": statistics.median(times[name][b]), "all_ms": times[name][b]}
                         for b in BATCHES}
    checks = {}
    for b in BATCHES:
        base = logits[("cublas", b)]
        for name in VARIANTS:
            d = logits[(name, b)]
            checks[f"{name} b={b}"] = {
                "max_abs_diff_vs_cublas": (d - base).abs().max().item(),
                "argmax_equal_vs_cublas": bool((d.argmax(-1) == base.argmax(-1)).all()),
            }
        for a, p in (("gemv8", "gemv8+pdl"), ("cublas", "cublas+pdl")):
            checks[f"{p} b={b} bitwise equal to {a}"] = bool(torch.equal(logits[(a, b)], logits[(p, b)]))
    roof = {"weight_bytes_per_step": weights, "copy_bandwidth_GBps": bw / 1e9,
            "weights_over_bandwidth_ms": weights / bw * 1e3,
            "issue_roofline_ms_16.06GB": 16.06e9 / bw * 1e3}
    result = header({"benchmark": "decode step: cuBLAS vs Triton GEMV, with and without PDL",
                     "model": config_dir, "context": CTX, "rounds": rounds, "summary": summary,
                     "checks": checks, "roofline": roof,
                     "isolated_gemv": isolated})
    for name in VARIANTS:
        print(f"{name:>11}: " + ", ".join(f"b={b} {summary[name][str(b)]['median_ms']:.3f} ms"
                                          for b in BATCHES))
    print(json.dumps(checks, indent=1))
    print(json.dumps(roof))
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
