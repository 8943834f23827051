"""W4A16 at 8-256 rows: the tl.dot kernel's tiles against what Int4Linear does past
w4a16_tiles.KERNEL_ROWS (dequantize the whole weight, then cuBLAS) and against bf16.

    python3 benchmarks/gpu/w4a16_dot_probe.py OUT.json TABLE.json [SHAPES]

For each shape (N x K, groups of 128) and 16, 32 and 64 rows (PROBE_ROWS; or 128 and 256, on a
grid of their own, BIG): bf16 F.linear, the dequantize + F.linear path, and the tl.dot kernel
(w4a16_dot.py) at every tile of a grid.
Timed as w4a16_probe.py times (CUDA graphs of 24 calls over weight copies larger than L2).
TABLE.json: the repo's table for this GPU with each shape's tl.dot row classes ("16", "32",
"64", ...: w4a16_tiles.DOT_CLASSES) set to the fastest tile at that many rows (what
kernels/triton/configs/ holds). Whether the kernel should take steps past 16 rows at all
and up to how many (w4a16_tiles.KERNEL_ROWS) is read off the dequantize + cuBLAS column.

At 8 rows (in PROBE_ROWS, as by default) it times the table's dp4a tile against tl.dot on the
table's "16" tile, padded to its 16 rows: where tl.dot is faster, TABLE's "8" entry gets
"dot": true, which sends 5-8 rows there (the dp4a kernel pads 5-7 rows to its block of 8, so
8 rows stand for the class). At 16 rows on an H100 tl.dot took 57.0 us at gate_up and 30.7 at
down, the dp4a kernel at 8 rows 64.2 and 35.4 (two calls, 2026-12-06).
"""
from __future__ import annotations

import itertools
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from w4a16_probe import graph_us, time_tile, write_results  # noqa: E402

from nextok.kernels.triton import int4_words as words4  # noqa: E402
from nextok.kernels.triton import w4a16 as w4  # noqa: E402
from nextok.kernels.triton import w4a16_tiles as tiles  # noqa: E402
from nextok.quant.int4 import dequantize_groups, pack_words, quantize_groups  # noqa: E402

DEFAULT_SHAPES = "6144x4096,4096x4096,28672x4096,4096x14336"
ROW_COUNTS = [int(r) for r in os.environ.get("PROBE_ROWS", "8,16,32,64").split(",")]
# JOIN (one dot a tile) with PAIRS (W dequantized two columns a register: ~0.6x the loop's
# instructions, counted for sm_90) over K split 1-8 ways and 16-64 rows a program; beside it, to
# compare, JOIN through float32 and the per-nibble kernel (the tiles that won at 16 rows on an
# H100, 2026-12-06, 7ef0119) at a few tiles each. (W as the dot's left operand, WLHS, was within
# 3 % there and is gone from the kernel.) (BLOCK_N 128 with 64 rows at 4 warps: Triton 3.6's
# TritonGPUOptimizeDotOperands pass fails on it for sm_90, compiled on the CPU)
DOT = ([dict(BLOCK_N=bn, TW=16, num_warps=nw, num_stages=3, BLOCK_M=bm, JOIN=1, SPLIT=sp, PAIRS=1)
        for (bn, nw), bm, sp in itertools.product(((64, 4), (128, 4), (128, 8)), (16, 32, 64), (1, 2, 4, 8))
        if not (bn == 128 and nw == 4 and bm == 64)]
       + [dict(BLOCK_N=bn, TW=16, num_warps=nw, num_stages=3, BLOCK_M=bm, JOIN=1, SPLIT=sp)
          for (bn, nw), bm, sp in itertools.product(((64, 4), (128, 8)), (16, 64), (1, 4))]
       + [dict(BLOCK_N=bn, TW=tw, num_warps=nw, num_stages=3, BLOCK_M=16)
          for bn, tw, nw in ((32, 32, 4), (64, 32, 4), (128, 16, 8))])

# 65-256 rows, JOIN + PAIRS: blocks of 64 rows (W dequantized again per block) or of 128 (per
# W word and row ~0.3-0.44 sm_90 loop instructions against 0.56 at 64, counted on the CPU),
# K split 1 or 2 ways. (BLOCK_N 128 with 128 rows at 4 warps, and 256 with 64 at 8: Triton 3.6
# fails on them for sm_90, compiled on the CPU)
BIG = [dict(BLOCK_N=bn, TW=16, num_warps=nw, num_stages=ns, BLOCK_M=bm, JOIN=1, SPLIT=sp, PAIRS=1)
       for (bn, nw, bm, ns), sp in itertools.product(((64, 4, 64, 3), (128, 8, 64, 3), (64, 4, 128, 2),
                                                      (64, 8, 128, 3), (64, 8, 128, 2), (128, 8, 128, 2)), (1, 2))]


def dp4a_or_dot(n: int, k: int, x, packed: list, ref, copies: int, layout, table: dict, dev) -> dict:
    """At <= DP4A_ROWS rows: the table's dp4a tile for the class against tl.dot on its "16"
    tile; TABLE's entry for the class routed to the faster ("dot": true for tl.dot)."""
    kept = tiles._tuned(torch.cuda.get_device_name(dev)).get(f"{n}x{k}", {})
    cls = tiles._row_class(x.shape[0])
    tile = {key: v for key, v in (kept.get(cls) or tiles._default_tile(cls, n, k)).items() if key != "dot"}
    dp4a = time_tile(tile, x, packed, ref, copies, layout)
    dot = time_tile(dict(kept.get("16") or tiles.DEFAULT_TILES["16"], dot=True), x, packed, ref, copies, layout)
    if dot and (not dp4a or dot["us"] < dp4a["us"]):
        tile["dot"] = True
    table.setdefault(f"{n}x{k}", {})[cls] = tile
    us = lambda t: t["us"] if t else float("nan")  # noqa: E731
    print(f"{n:>6}x{k:<6} rows {x.shape[0]:>2}: dp4a {us(dp4a):6.1f} us | tl.dot on the 16-row tile "
          f"{us(dot):6.1f} us -> {'tl.dot' if tile.get('dot') else 'dp4a'}", flush=True)
    return {"n": n, "k": k, "rows": x.shape[0], "dp4a": dp4a, "dot_16_tile": dot, "class_tile": tile}


def main() -> int:
    out_path, table_path = sys.argv[1], sys.argv[2]
    shapes = [tuple(int(v) for v in s.split("x"))
              for s in (sys.argv[3] if len(sys.argv) > 3 else DEFAULT_SHAPES).split(",")]
    dev, results, table = torch.device("cuda"), [], {}
    layout = words4.LAYOUT
    for n, k in shapes:
        w = torch.randn(n, k, device=dev) * k ** -0.5
        q, d, m = quantize_groups(w, 128)
        copies = max(2, -(-400 * 2**20 // (n * k * 2)))  # bf16 copies over 400 MB
        bfs = [w.to(torch.bfloat16) for _ in range(copies)]
        packed = [(words4.tile_words(pack_words(q)), d.clone(), m.clone()) for _ in range(copies)]
        packed_bytes = packed[0][0].numel() * 4 + d.numel() * 4
        ref_w = dequantize_groups(q, d, m)
        del w, q
        for rows in ROW_COUNTS:
            x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            ref = F.linear(x.float(), ref_w)
            if rows <= tiles.DP4A_ROWS:
                results.append(dp4a_or_dot(n, k, x, packed, ref, copies, layout, table, dev))
                continue
            r = {"n": n, "k": k, "rows": rows, "packed_bytes": packed_bytes,
                 "bf16_cublas_us": graph_us(lambda i: F.linear(x, bfs[i]), copies),
                 "dequant_cublas_us": graph_us(lambda i: F.linear(x, words4.dequantize(
                     *packed[i], torch.bfloat16, layout=layout)), copies)}
            # (rows fewer than a tile's BLOCK_M are padded to it)
            grid = DOT if rows <= 64 else BIG
            sweep = [t for t in (time_tile(cfg, x, packed, ref, copies, layout) for cfg in grid) if t]
            if not sweep:
                continue
            best = min(sweep, key=lambda s: s["us"])
            r.update(sweep=sweep, best=best, dot_us=best["us"])
            results.append(r)
            table.setdefault(f"{n}x{k}", {})[str(rows)] = {
                key: v for key, v in best.items() if key not in ("us", "max_diff")}
            print(f"{n:>6}x{k:<6} rows {rows:>3}: bf16 {r['bf16_cublas_us']:6.1f} us | dequantize + cuBLAS "
                  f"{r['dequant_cublas_us']:6.1f} us | tl.dot {best['us']:6.1f} us "
                  f"({r['bf16_cublas_us'] / best['us']:.2f}x bf16, {r['dequant_cublas_us'] / best['us']:.2f}x "
                  f"dequantize) max diff {best['max_diff']:.3g} tile "
                  f"{ {key: v for key, v in best.items() if key not in ('us', 'max_diff')} }", flush=True)
        del bfs, packed
        torch.cuda.empty_cache()
    write_results(table, table_path, out_path, layout, results, dev)  # the 1/4/8-row entries stay
    return 0


if __name__ == "__main__":
    sys.exit(main())
