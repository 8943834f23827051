"""W4A16 / W8A16 Triton kernels against bf16 cuBLAS at decode shapes (issue 7, a first look).

    python3 benchmarks/gpu/quant_linear_probe.py OUT.json

y = x @ W.T at the Llama-3.1-8B layer shapes for 1 and 8 rows: F.linear on bf16 weights, the
W4A16 kernel on 4-bit groups of 128, the W8A16 kernel on per-channel int8. Weights rotate over
copies larger than the 50 MB L2, as each layer's do in a real step. Reports microseconds, the
bytes each reads per call over that time, and the max difference from dequantize-then-matmul.
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())

from nextok.bench.common import header  # noqa: E402

from nextok.kernels.triton.quant_linear import w4a16, w8a16  # noqa: E402
from nextok.quant.int4 import dequantize_groups, pack_nibbles, quantize_groups  # noqa: E402
from nextok.quant.int8 import dequantize, quantize_per_channel  # noqa: E402

SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]


def time_us(fn, copies: int, iters: int = 40) -> float:
    for i in range(3):
        fn(i % copies)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(iters):
        fn(i % copies)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def main() -> int:
    dev, rows = torch.device("cuda"), []
    for name, n, k in SHAPES:
        w = torch.randn(n, k, device=dev) * k ** -0.5
        q4, d, m = quantize_groups(w, 128)
        q8, s8 = quantize_per_channel(w)
        bf = w.to(torch.bfloat16)
        copies = max(2, -(-400 * 2**20 // (n * k * 2)))  # bf16 copies over 400 MB
        bfs = [bf.clone() for _ in range(copies)]
        p4s = [(pack_nibbles(q4).contiguous(), d.clone(), m.clone()) for _ in range(copies)]
        p8s = [(q8.clone(), s8.clone()) for _ in range(copies)]
        for mrows in (1, 8):
            x = torch.randn(mrows, k, device=dev, dtype=torch.bfloat16)
            r = {"shape": name, "n": n, "k": k, "rows": mrows}
            r["bf16_us"] = time_us(lambda i: F.linear(x, bfs[i]), copies)
            r["w4a16_us"] = time_us(lambda i: w4a16(x, *p4s[i]), copies)
            r["w8a16_us"] = time_us(lambda i: w8a16(x, *p8s[i]), copies)
            r["bf16_tbps"] = n * k * 2 / r["bf16_us"] / 1e6
            r["w4a16_tbps"] = (n * k // 2 + 4 * n * k // 128) / r["w4a16_us"] / 1e6
            r["w8a16_tbps"] = (n * k + 2 * n) / r["w8a16_us"] / 1e6
            ref4 = F.linear(x.float(), dequantize_groups(q4, d, m).to(torch.bfloat16).float())
            ref8 = F.linear(x.float(), dequantize(q8, s8))
            r["w4a16_max_diff"] = (w4a16(x, *p4s[0]).float() - ref4).abs().max().item()
            r["w8a16_max_diff"] = (w8a16(x, *p8s[0]).float() - ref8).abs().max().item()
            rows.append(r)
            print(f"{name:>8} rows {mrows}: bf16 {r['bf16_us']:7.1f} us  w4a16 {r['w4a16_us']:7.1f} us "
                  f"({r['bf16_us'] / r['w4a16_us']:.2f}x, {r['w4a16_tbps']:.2f} TB/s)  w8a16 "
                  f"{r['w8a16_us']:7.1f} us ({r['bf16_us'] / r['w8a16_us']:.2f}x)  diffs "
                  f"{r['w4a16_max_diff']:.3g} {r['w8a16_max_diff']:.3g}", flush=True)
        del bfs, p4s, p8s
        torch.cuda.empty_cache()
    for mrows in (1, 8):
        sel = [r for r in rows if r["rows"] == mrows]
        b, f4, f8 = (sum(r[key] for r in sel) for key in ("bf16_us", "w4a16_us", "w8a16_us"))
        print(f"rows {mrows}, one 8B layer: bf16 {b:.1f} us, w4a16 {f4:.1f} us ({b / f4:.2f}x), "
              f"w8a16 {f8:.1f} us ({b / f8:.2f}x)")
    with open(sys.argv[1], "w") as f:
        json.dump(header({"rows": rows}), f, indent=1)  # with the commit, machine and command
    return 0


if __name__ == "__main__":
    sys.exit(main())
