"""The W8A16 kernel's tiles (kernels/triton/quant_linear.py) swept at decode shapes, against bf16
and against what Int8Linear does past w8a16_tiles.KERNEL_ROWS (the weight converted to bf16 each
call, then cuBLAS).

    python3 benchmarks/gpu/w8a16_probe.py OUT.json TABLE.json [SHAPES]

For each shape (N x K) and 1, 16, 64 and 256 rows (PROBE_ROWS; each stands for its row class,
w8a16_tiles.ROW_CLASSES): bf16 through cuBLAS (F.linear) and, at up to 8 rows, through nextok's
Triton GEMV; the convert + cuBLAS path; and the W8A16 kernel at every tile of its class's grid.
Timed as w4a16_probe.py times (CUDA graphs of 24 calls over weight copies larger than L2).
TABLE.json: each shape's row classes set to the fastest tile (configs/w8a16_<gpu>.json).
"""
from __future__ import annotations

import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from w4a16_probe import graph_us  # noqa: E402

from nextok.bench.common import header  # noqa: E402
from nextok.kernels.triton import w8a16_tiles as tiles  # noqa: E402
from nextok.kernels.triton.gemv import MAX_ROWS as GEMV_ROWS, gemv  # noqa: E402
from nextok.kernels.triton.quant_linear import w8a16  # noqa: E402
from nextok.quant.int8 import dequantize, quantize_per_channel  # noqa: E402

DEFAULT_SHAPES = "6144x4096,4096x4096,28672x4096,4096x14336"
ROW_COUNTS = [int(r) for r in os.environ.get("PROBE_ROWS", "1,16,64,256").split(",")]
# per row class: the CUDA-core loop (one row) or tl.dot, K split by the default rule (SPLIT
# None) or as given
GRID = {
    "1": [dict(DOT=0, BLOCK_M=1, BLOCK_N=bn, BK=bk, num_warps=nw, num_stages=4, SPLIT=sp)
          for (bn, bk, nw), sp in itertools.product(((32, 256, 4), (64, 128, 4), (64, 256, 8), (128, 128, 8)),
                                                   (None, 1, 4))]
    + [dict(DOT=1, BLOCK_M=16, BLOCK_N=64, BK=128, num_warps=4, num_stages=4, SPLIT=sp) for sp in (None, 1)],
    "16": [dict(DOT=1, BLOCK_M=16, BLOCK_N=bn, BK=bk, num_warps=nw, num_stages=ns, SPLIT=sp)
           for (bn, bk, nw, ns), sp in itertools.product(((64, 128, 4, 4), (64, 256, 4, 3), (128, 128, 8, 3),
                                                          (128, 64, 4, 4)), (None, 1, 4))],
    "64": [dict(DOT=1, BLOCK_M=64, BLOCK_N=bn, BK=bk, num_warps=nw, num_stages=3, SPLIT=sp)
           for (bn, bk, nw), sp in itertools.product(((64, 128, 4), (128, 64, 8), (128, 128, 8), (64, 64, 4)),
                                                    (None, 1, 2))],
    "256": [dict(DOT=1, BLOCK_M=bm, BLOCK_N=bn, BK=bk, num_warps=nw, num_stages=3, SPLIT=sp)
            for (bm, bn, bk, nw), sp in itertools.product(((64, 128, 64, 8), (64, 64, 128, 4), (128, 128, 64, 8),
                                                           (128, 64, 64, 8)), (None, 1))]}


def time_tile(cfg: dict, x, packed: list, ref, copies: int) -> dict | None:
    tiles.set_config(cfg)
    try:
        us = graph_us(lambda i: w8a16(x, *packed[i]), copies)
        err = (w8a16(x, *packed[0]).float() - ref).abs().max().item()
        split = tiles.config(x.shape[0], *packed[0][0].shape, x.device)["SPLIT"]
    except Exception as e:
        print(f"  rows {x.shape[0]} {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
        return None
    finally:
        tiles.set_config(None)
    return dict(cfg, SPLIT=split, us=us, max_diff=err)


def main() -> int:
    out_path, table_path = sys.argv[1], sys.argv[2]
    shapes = [tuple(int(v) for v in s.split("x"))
              for s in (sys.argv[3] if len(sys.argv) > 3 else DEFAULT_SHAPES).split(",")]
    dev, results, table = torch.device("cuda"), [], {}
    for n, k in shapes:
        w = torch.randn(n, k, device=dev) * k ** -0.5
        q, scale = quantize_per_channel(w)
        copies = max(2, -(-400 * 2**20 // (n * k * 2)))  # bf16 copies over 400 MB
        bfs = [w.to(torch.bfloat16) for _ in range(copies)]
        packed = [(q.clone(), scale.clone()) for _ in range(copies)]
        ref_w = dequantize(q, scale)
        del w
        for rows in ROW_COUNTS:
            x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            ref = F.linear(x.float(), ref_w)
            cls = tiles.row_class(rows)
            r = {"n": n, "k": k, "rows": rows, "class": cls, "int8_bytes": n * k + 2 * n,
                 "bf16_cublas_us": graph_us(lambda i: F.linear(x, bfs[i]), copies),
                 "convert_cublas_us": graph_us(lambda i: F.linear(x, packed[i][0].to(x.dtype))
                                               * packed[i][1].to(x.dtype), copies)}
            if rows <= GEMV_ROWS:
                r["bf16_gemv_us"] = graph_us(lambda i: gemv(x, bfs[i]), copies)
            sweep = [t for t in (time_tile(cfg, x, packed, ref, copies) for cfg in GRID[cls]) if t]
            if not sweep:
                continue
            best = min(sweep, key=lambda s: s["us"])
            bf16 = min(r["bf16_cublas_us"], r.get("bf16_gemv_us", float("inf")))
            r.update(sweep=sweep, best=best, w8a16_us=best["us"], best_bf16_us=bf16,
                     w8a16_tbps=r["int8_bytes"] / best["us"] / 1e6)
            results.append(r)
            table.setdefault(f"{n}x{k}", {})[cls] = {key: v for key, v in best.items() if key not in ("us", "max_diff")}
            print(f"{n:>6}x{k:<6} rows {rows:>3}: bf16 {bf16:6.1f} us | convert + cuBLAS "
                  f"{r['convert_cublas_us']:6.1f} us | W8A16 {best['us']:6.1f} us ({bf16 / best['us']:.2f}x bf16, "
                  f"{r['w8a16_tbps']:.2f} TB/s) max diff {best['max_diff']:.3g} tile "
                  f"{ {key: v for key, v in best.items() if key not in ('us', 'max_diff')} }", flush=True)
        del bfs, packed
        torch.cuda.empty_cache()
    for cls in tiles.ROW_CLASSES:  # a step's sum over the four shapes, as one 8B layer
        sel = [r for r in results if r["class"] == cls]
        if len(sel) == len(shapes):
            b, c, q8 = (sum(r[key] for r in sel) for key in ("best_bf16_us", "convert_cublas_us", "w8a16_us"))
            print(f"rows {sel[0]['rows']:>3}, one layer: bf16 {b:.1f} us, convert + cuBLAS {c:.1f}, W8A16 {q8:.1f} "
                  f"({b / q8:.2f}x bf16)", flush=True)
    with open(table_path, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    with open(out_path, "w") as f:
        json.dump(header({"rows": results}), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
