"""Is a Triton GEMV faster than cuBLAS for decode-sized matmuls? A probe, not an engine kernel.

    python3 benchmarks/gpu/gemv_probe.py OUT.json

At batch 1 the Llama-3.1-8B decode step is ~3.8 ms of cuBLAS GEMMs reading 15 GB (~3.9 TB/s).
This times y = x @ W.T at the 8B layer shapes for M = 1 and 8 rows, cuBLAS (F.linear) against
a Triton kernel over several tile configurations (tensor-core tl.dot with the rows padded to
16, and a CUDA-core multiply-and-sum for one row), each checked against cuBLAS. Weights rotate
over copies that exceed the 50 MB L2, as each layer's weights do in a real step.
"""
from __future__ import annotations

import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.getcwd())

from nextok.bench.common import header  # noqa: E402

# (name, N out, K in): Llama-3.1-8B
SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
          ("lm_head", 128256, 4096)]


@triton.jit
def _gemv_dot(x_ptr, w_ptr, y_ptr, M, N, K, s_xm, s_wn, s_ym,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + n[:, None] * s_wn + k[None, :], mask=(n < N)[:, None] & (k < K)[None, :], other=0.0)
        x = tl.load(x_ptr + m[:, None] * s_xm + k[None, :], mask=(m < M)[:, None] & (k < K)[None, :], other=0.0)
        acc += tl.dot(x, tl.trans(w))
    tl.store(y_ptr + m[:, None] * s_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(m < M)[:, None] & (n < N)[None, :])


@triton.jit
def _gemv_sum(x_ptr, w_ptr, y_ptr, M, N, K, s_xm, s_wn, s_ym,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # One row of x (M = 1): acc[n] += sum_k w[n, k] x[k] on CUDA cores.
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + n[:, None] * s_wn + k[None, :], mask=(n < N)[:, None] & (k < K)[None, :], other=0.0)
        x = tl.load(x_ptr + k, mask=k < K, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    tl.store(y_ptr + n, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=n < N)


def time_us(fn, iters: int = 50) -> float:
    for _ in range(3):
        fn(0)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(iters):
        fn(i)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def main() -> int:
    out_path = sys.argv[1]
    dev, dt = torch.device("cuda"), torch.bfloat16
    rows = []
    for (name, n, k), m in itertools.product(SHAPES, (1, 8)):
        copies = max(2, -(-512 * 2**20 // (n * k * 2)))  # >= 512 MB of weights, L2 is 50 MB
        ws = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
        x = torch.randn(m, k, device=dev, dtype=dt)
        y = torch.empty(m, n, device=dev, dtype=dt)
        ref = F.linear(x, ws[0]).float()
        nbytes = n * k * 2
        cublas = time_us(lambda i: F.linear(x, ws[i % copies]))
        best = None
        kernels = [("dot", _gemv_dot)] + ([("sum", _gemv_sum)] if m == 1 else [])
        for (kname, kern), bn, bk, warps, stages in itertools.product(
                kernels, (8, 16, 32), (128, 256, 512), (4, 8), (3, 4)):
            if kname == "sum" and bn * bk > 8192:
                continue

            def run(i, kern=kern, bn=bn, bk=bk, warps=warps, stages=stages):
                kern[(triton.cdiv(n, bn),)](x, ws[i % copies], y, m, n, k, x.stride(0), k, y.stride(0),
                                            BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
                                            num_stages=stages)
            try:
                run(0)
                err = (y.float() - ref).abs().max().item()
                us = time_us(run)
            except Exception as e:  # noqa: BLE001  a config that does not compile: skip it
                print(f"  {name} m={m} {kname} {bn}x{bk} w{warps} s{stages}: {type(e).__name__}")
                continue
            if err > 0.05 * ref.abs().max().item():
                print(f"  {name} m={m} {kname} {bn}x{bk}: wrong (max err {err})")
                continue
            if best is None or us < best["us"]:
                best = {"kernel": kname, "block_n": bn, "block_k": bk, "warps": warps, "stages": stages,
                        "us": us, "max_abs_err": err}
        row = {"shape": name, "n": n, "k": k, "m": m, "cublas_us": cublas,
               "cublas_tbps": nbytes / cublas / 1e6, "triton_best": best,
               "triton_tbps": nbytes / best["us"] / 1e6 if best else None}
        rows.append(row)
        print(f"{name:>8} m={m}: cuBLAS {cublas:8.1f} us ({row['cublas_tbps']:.2f} TB/s)  Triton "
              f"{best['us'] if best else float('nan'):8.1f} us ({row['triton_tbps'] or 0:.2f} TB/s) {best}",
              flush=True)
        del ws
        torch.cuda.empty_cache()
    for m in (1, 8):
        cb = sum(r["cublas_us"] for r in rows if r["m"] == m)
        tr = sum(r["triton_best"]["us"] for r in rows if r["m"] == m and r["triton_best"])
        print(f"m={m}: one layer + lm_head share, cuBLAS {cb:.1f} us vs best Triton {tr:.1f} us")
    with open(out_path, "w") as f:
        json.dump(header({"rows": rows}), f, indent=1)  # with the commit, machine and command
    return 0


if __name__ == "__main__":
    sys.exit(main())
