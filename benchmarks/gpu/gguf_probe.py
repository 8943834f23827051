"""The Triton GGUF block kernel (kernels/triton/gguf_linear.py) at decode shapes, against bf16
(issue 7: GGUF kept packed on CUDA; first run on an H100, 2026-12-06-gguf-h100.md).

    python3 benchmarks/gpu/gguf_probe.py OUT.json [SHAPES] [TYPES]

For each shape y = x @ W.T (N x K), each ggml type (default Q4_0, Q4_K, Q5_0, Q6_K, Q8_0) and
PROBE_GGUF_ROWS rows (default 1 and 8): bf16 through cuBLAS; past 16 rows the layer's dense path
(dequantize into a scratch matrix, then cuBLAS); the GGUF kernel at every tile of a small grid
(past 16 rows with 16, 32 or 64 rows a program); and for Q4_0 / Q4_1 / Q4_K the W4A16 layer
they are converted to (quant/gguf_cuda.py), on its own tiles, with d and m in row order and in
group order (quant/int4.py GROUP_MAJOR_MAX); for Q8_0 / Q5_* / Q6_K the W8A16 layer with group
scales they are converted to, on the GPU's W8A16 tiles (scales in row and in group order) and
on each of W8_TILES (group order). Each is timed as
a CUDA graph of 24 calls with the weights rotating over copies larger than the L2
(w4a16_probe.graph_us).
Random blocks with sane f16 scales; every output is checked against dequantize + F.linear.
Writes every timing to OUT.json (rewritten after each shape and type); PROBE_BN, PROBE_NW and
PROBE_NS (comma lists) narrow the tile grid. Prints the best tile per shape, type and row count
with its bandwidth.
"""
from __future__ import annotations

import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())

from benchmarks.gpu.w4a16_probe import graph_us  # noqa: E402
from nextok.bench.common import header  # noqa: E402
from nextok.kernels.triton import gguf_linear as gl  # noqa: E402
from nextok.kernels.triton import w8a16_tiles  # noqa: E402
from nextok.quant.gguf_cuda import INT4_TYPES, INT8_TYPES, int4_groups, int8_groups  # noqa: E402
from nextok.quant.int4 import Int4Linear  # noqa: E402
from nextok.quant.int8 import Int8Linear  # noqa: E402

DEFAULT_SHAPES = "6144x4096,4096x4096,28672x4096,4096x14336"
DEFAULT_TYPES = "2,12,6,14,8"
# byte offsets of each type's f16 scales (d, and dmin / m): random bytes elsewhere
HALF_SCALES = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}


def _ints(name: str, default: str) -> list[int]:
    return [int(v) for v in os.environ.get(name, default).split(",")]


# the grid; PROBE_BN / PROBE_NW / PROBE_NS narrow it (each tile compiles per type, K and row kind)
TILES = [dict(BLOCK_N=bn, num_warps=nw, num_stages=ns)
         for bn, nw, ns in itertools.product(_ints("PROBE_BN", "8,16,32,64"), _ints("PROBE_NW", "2,4,8"),
                                             _ints("PROBE_NS", "2,3,4"))]
# the W8A16 kernel's tiles tried on group scales, besides the table's (w8a16_tiles.py)
# (PROBE_W8_SWEEP=0: none)
W8_TILES = [dict(DOT=dot, BLOCK_M=16, BLOCK_N=bn, BK=bk, num_warps=4, num_stages=ns)
            for dot, bn, bk, ns in ((1, 64, 128, 4), (1, 32, 256, 3), (0, 32, 128, 4), (0, 64, 64, 4))
            ] if os.environ.get("PROBE_W8_SWEEP", "1") != "0" else []
ROWS = _ints("PROBE_GGUF_ROWS", "1,8")  # rows of x; past 16 each tile also takes 16-64 rows a program


def tiles_for(rows: int) -> list[dict]:
    if rows <= 16:
        return TILES
    return [dict(t, BLOCK_M=bm) for t in TILES for bm in (16, 32, 64) if bm < 2 * rows]


def random_blocks(type_id: int, n: int, k: int, dev) -> torch.Tensor:
    per_block, nbytes, _ = gl.TYPES[type_id]
    nb = n * k // per_block
    raw = torch.randint(0, 256, (nb, nbytes), dtype=torch.uint8, device=dev)
    lo, hi = (1e-4, 1e-3) if per_block == 256 else (1e-3, 2e-2)
    for off in HALF_SCALES[type_id]:
        half = (torch.rand(nb, device=dev) * (hi - lo) + lo).to(torch.float16)
        raw[:, off:off + 2] = half.view(torch.uint8).view(nb, 2)
    return raw.view(n, -1)


def main() -> int:
    out_path = sys.argv[1]
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[2] if len(sys.argv) > 2 else DEFAULT_SHAPES).split(",")]
    types = [int(t) for t in (sys.argv[3] if len(sys.argv) > 3 else DEFAULT_TYPES).split(",")]
    dev, results = torch.device("cuda"), []
    for (n, k), type_id in itertools.product(shapes, types):
        blocks = random_blocks(type_id, n, k, dev)
        w = gl.dequantize(blocks, type_id, k, torch.empty(n, k, device=dev, dtype=torch.float32))
        nbytes = blocks.numel()
        copies = max(2, -(-400 * 2**20 // nbytes))
        packs = [blocks.clone() for _ in range(copies)]
        bcopies = max(2, -(-400 * 2**20 // (n * k * 2)))
        bfs = [w.to(torch.bfloat16) for _ in range(bcopies)]
        scratch = torch.empty(n, k, device=dev, dtype=torch.bfloat16)
        # Q4_0 / Q4_1 / Q4_K: the layer converts them to the W4A16 layout (quant/gguf_cuda.py)
        int4s = ([Int4Linear(*int4_groups(type_id, p, k), None) for p in packs]
                 if type_id in INT4_TYPES else [])
        # Q8_0 / Q5_* / Q6_K: to int8 with group scales, the W8A16 kernel (quant/gguf_cuda.py)
        int8s = []
        for p in packs if type_id in INT8_TYPES else []:
            q, d, m = int8_groups(type_id, p, k)
            int8s.append(Int8Linear(q, d, None, m))
        for rows in ROWS:
            x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            ref = F.linear(x.float(), w)
            r = {"n": n, "k": k, "type": gl.NAMES[type_id], "rows": rows, "block_bytes": nbytes,
                 "bf16_cublas_us": graph_us(lambda i: F.linear(x, bfs[i]), bcopies)}
            if rows > 16:  # the layer's other path: dequantize into a scratch matrix, then cuBLAS
                r["dequantize_cublas_us"] = graph_us(
                    lambda i: F.linear(x, gl.dequantize(packs[i], type_id, k, scratch)), copies)
            if int4s:  # what the layer runs for this type: the W4A16 kernels on the converted weight
                for key, group_major in (("w4a16", False), ("w4a16_group_major", True)):  # d, m order
                    for layer in int4s:
                        layer.set_scale_order(group_major)
                    r[f"{key}_us"] = graph_us(lambda i: int4s[i](x), copies)
                    r[f"{key}_rel_err"] = ((int4s[0](x).float() - ref).abs().max() / ref.abs().max()).item()
            if int8s:  # the table's tile (or the default) in row and group order, then W8_TILES
                for layer in int8s:
                    layer.set_scale_order(False)
                r["w8a16_row_order_us"] = graph_us(lambda i: int8s[i](x), copies)
                for layer in int8s:
                    layer.set_scale_order(True)
                r["w8a16_us"] = graph_us(lambda i: int8s[i](x), copies)
                r["w8a16_rel_err"] = ((int8s[0](x).float() - ref).abs().max() / ref.abs().max()).item()
                r["w8a16_bytes"] = sum(t.numel() * t.element_size() for t in int8s[0].buffers())
                r["w8a16_sweep"] = []
                for cfg in W8_TILES:
                    w8a16_tiles.set_config(dict(cfg, DOT=int(cfg["DOT"] or rows > 1)))
                    try:
                        r["w8a16_sweep"].append(dict(cfg, us=graph_us(lambda i: int8s[i](x), copies)))
                    except Exception as e:
                        print(f"  W8A16 {cfg}: {type(e).__name__}: {str(e)[:100]}", flush=True)
                w8a16_tiles.set_config(None)
            sweep = []
            for cfg in tiles_for(rows):
                gl.set_config(cfg)
                try:
                    us = graph_us(lambda i: gl.gguf_matmul(x, packs[i], type_id, k), copies)
                    err = ((gl.gguf_matmul(x, blocks, type_id, k).float() - ref).abs().max()
                           / ref.abs().max()).item()
                except Exception as e:  # a tile the compiler or the SM cannot take
                    print(f"  {n}x{k} {gl.NAMES[type_id]} rows {rows} {cfg}: {type(e).__name__}: {str(e)[:100]}", flush=True)
                    continue
                sweep.append(dict(cfg, us=us, rel_err=err))
            gl.set_config(None)
            best = min(sweep, key=lambda s: s["us"])
            r.update(sweep=sweep, best=best, gguf_us=best["us"], gguf_tbps=nbytes / best["us"] / 1e6,
                     speedup_vs_bf16=r["bf16_cublas_us"] / best["us"])
            results.append(r)
            dense = f" | dequantize + cuBLAS {r['dequantize_cublas_us']:6.1f} us" if rows > 16 else ""
            dense += (f" | W4A16 {r['w4a16_us']:6.1f} us, group-major d, m {r['w4a16_group_major_us']:6.1f} "
                      f"(rel err {r['w4a16_rel_err']:.1e})") if int4s else ""
            if int8s:
                b8 = min(r["w8a16_sweep"], key=lambda s: s["us"], default={"us": float("nan")})
                dense += (f" | W8A16 {r['w8a16_us']:6.1f} us (row order {r['w8a16_row_order_us']:6.1f}), best of sweep {b8['us']:6.1f} "
                          f"(rel err {r['w8a16_rel_err']:.1e}, {r['w8a16_bytes'] / nbytes:.2f}x the blocks' bytes)")
            print(f"{n:>6}x{k:<6} {gl.NAMES[type_id]:5} rows {rows}: bf16 {r['bf16_cublas_us']:6.1f} us{dense} | "
                  f"gguf {best['us']:6.1f} us ({r['gguf_tbps']:.2f} TB/s of blocks, {r['speedup_vs_bf16']:.2f}x, "
                  f"rel err {best['rel_err']:.1e}) tile {best}", flush=True)
        del packs, bfs, w, blocks, scratch, int4s, int8s
        torch.cuda.empty_cache()
        with open(out_path, "w") as f:  # after every shape and type: a call cut short keeps what ran
            json.dump(header({"rows": results}), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
