"""Which tiles the W4A16 kernels (w4a16.py) run with, per GPU, shape and number of rows.

Tuned tiles per GPU: {"<N>x<K>": {row class: tile}} (tile: BLOCK_N, TW words per row per tile,
num_warps, num_stages, and for dp4a SPLIT, BLOCK_M, DEPTH, how many tiles of W ahead it loads
(1 if absent), XAHEAD, whether x's tiles are loaded one ahead too (0 if absent), and UNROLL,
whether the loop takes DEPTH + 1 tiles a turn in buffers of their own (with XAHEAD; 0 if absent),
XRUN, whether x's fixed point is per run of 4 words instead of per word (0 if absent; w4a16.py),
PIPE, the stages of Triton's own pipeline of the loop's loads instead of DEPTH, XAHEAD and
UNROLL (0 if absent: those; w4a16.py),
TMA, with PIPE in a stream, W's words copied by the tensor memory accelerator (0 if absent;
w4a16_stream.py),
for tl.dot (row classes DOT_CLASSES; one missing takes DEFAULT_TILES') BLOCK_M, rows a
program (16, 32, 64 or 128; 16 if absent; fewer rows are padded to it: sm_90's wgmma takes 64),
JOIN, one dot a tile (0 if absent; w4a16_dot.py), PAIRS, with JOIN W dequantized two columns a
register in x's dtype (0 if absent; w4a16_dot.py), and SPLIT (1 if absent), and maxnreg, a
cap on the registers a thread (ptxas: the programs an SM holds); one row may instead take
STREAM programs of w4a16_stream.py's kernel, each a run of the (row tile, K tile) steps (0 or
absent: the split-K grid); row classes: _row_class), written by
benchmarks/gpu/w4a16_probe.py to configs/w4a16_<gpu>.json. NEXTOK_W4A16_CONFIGS names another
table; a GPU without one takes DEFAULT_TILES.
"""
from __future__ import annotations

import functools

import torch
import triton

from nextok.kernels.triton.tile_tables import load_table, rows_limit

DP4A_ROWS = 8  # up to this many rows the dp4a kernel, above it the tl.dot one
# Steps of up to KERNEL_ROWS rows run these kernels (Int4Linear); bigger ones dequantize the
# whole weight (int4_words.dequantize) and run cuBLAS. NEXTOK_W4A16_ROWS (8-256) moves it. On an
# H100 at every 8B shape the tl.dot kernel with PAIRS took 0.28-0.51x the time of dequantize +
# cuBLAS at 16, 32 and 64 rows (2026-12-06-rows-pairs-h100.md), and 0.48-0.60x at 128 rows,
# 0.78-0.87x at 256 (2026-12-06-rows-256-h100.md); without PAIRS and JOIN it was slower than
# dequantize + cuBLAS past 32 rows, and this was 16.
KERNEL_ROWS = 256
_OVERRIDE: dict | None = None  # benchmarks/gpu/w4a16_probe.py sets tiles to sweep them


def set_config(cfg: dict | None) -> None:
    global _OVERRIDE
    _OVERRIDE = cfg


@functools.cache
def _tuned(device_name: str) -> dict:
    return load_table("w4a16", device_name)


@functools.cache
def kernel_rows() -> int:
    """KERNEL_ROWS, or NEXTOK_W4A16_ROWS within 8..w4a16.MAX_ROWS. Decided once per process."""
    from nextok.kernels.triton.w4a16 import MAX_ROWS

    return rows_limit("w4a16", KERNEL_ROWS, DP4A_ROWS, MAX_ROWS)


# tl.dot's row classes: 9-16, 17-32, 33-64, 65-128 and 129-256 rows
DOT_CLASSES = ("16", "32", "64", "128", "256")


def _row_class(m: int) -> str:
    """The table's key for m <= DP4A_ROWS rows: "1", "4" (2-4), "8" (5-8); DOT_CLASSES are tl.dot's."""
    return next(c for c in ("1", "4", "8") if m <= int(c))


# Where the GPU has no table: one row in tiles of 128 rows, K split by _default_tile; 2-8 rows in
# the tile within ~10 % of the best at all four 8B shapes in the H200's sweep
# (2026-12-05-w4a16-probe-h200-dp4a-rows.json: at 8 rows 1.5-2x faster than the 32-row, 8-warp
# guess this table had, which an H100 without a table took: 10.6 ms a step).
DEFAULT_TILES = {"1": dict(BLOCK_N=128, TW=32, num_warps=4, num_stages=3, SPLIT=8),
                 "4": dict(BLOCK_N=64, TW=32, num_warps=4, num_stages=3, SPLIT=4, BLOCK_M=4),
                 "8": dict(BLOCK_N=64, TW=32, num_warps=4, num_stages=3, SPLIT=4, BLOCK_M=8),
                 # tl.dot, 9-16 and 17-64 rows (17-32 padded to 64: sm_90's wgmma takes 64 rows):
                 # within 1.12x, 1.26x and 1.23x of the best tile at 16, 32 and 64 rows at each 8B
                 # shape on an H100 (2026-12-06-w4a16-dot-probe-h100-pairs-b5b3e4b.json)
                 "16": dict(BLOCK_N=64, TW=16, num_warps=4, num_stages=3, BLOCK_M=16, JOIN=1, PAIRS=1, SPLIT=4),
                 "32": dict(BLOCK_N=64, TW=16, num_warps=4, num_stages=3, BLOCK_M=64, JOIN=1, PAIRS=1, SPLIT=2),
                 "64": dict(BLOCK_N=64, TW=16, num_warps=4, num_stages=3, BLOCK_M=64, JOIN=1, PAIRS=1, SPLIT=2),
                 # 65-256 rows in blocks of 128: within 1.26x and 1.16x of the best tile at 128 and
                 # 256 rows at each 8B shape on an H100 (2026-12-06-w4a16-dot-probe-h100-big-6247efd.json)
                 "128": dict(BLOCK_N=64, TW=16, num_warps=8, num_stages=3, BLOCK_M=128, JOIN=1, PAIRS=1, SPLIT=2),
                 "256": dict(BLOCK_N=64, TW=16, num_warps=8, num_stages=2, BLOCK_M=128, JOIN=1, PAIRS=1, SPLIT=2)}


def _default_tile(cls: str, n: int, k: int) -> dict:
    """An untuned shape's tile: the default; at one row K split 8 ways where N makes fewer than 128
    tiles, else 4 (and never into pieces of under one tile of words). Against the best tile of
    the 8B shapes' sweeps on tiled words (2026-12-05, H200 and H100) this is 1.00-1.17x its time;
    the split that aimed at ~4 programs an SM before was 1.19-1.40x at three of the four."""
    tile = DEFAULT_TILES[cls]
    if cls != "1":  # 2-8 rows: SPLIT 4 was within ~10 % of the best at every 8B shape
        return tile
    split = 8 if triton.cdiv(n, tile["BLOCK_N"]) < 128 else 4
    while split > 1 and k // 8 < split * tile["TW"]:
        split //= 2
    return dict(tile, SPLIT=split)


def _tile(tile: dict, m: int, dot: bool, wpg: int) -> dict:
    if dot:  # rows in blocks of the tile's BLOCK_M, the last one padded
        join = tile.get("JOIN", 0)
        extra = dict(BLOCK_M=max(16, tile.get("BLOCK_M", 16)), JOIN=join, SPLIT=tile.get("SPLIT", 1),
                     PAIRS=tile.get("PAIRS", 0) if join else 0)  # PAIRS needs JOIN
    else:
        extra = dict(SPLIT=tile.get("SPLIT", 1), BLOCK_M=min(tile.get("BLOCK_M", 1), triton.next_power_of_2(m)),
                     DEPTH=tile.get("DEPTH", 1), XAHEAD=tile.get("XAHEAD", 0),
                     UNROLL=tile.get("UNROLL", 0) if tile.get("XAHEAD", 0) else 0,  # UNROLL needs XAHEAD
                     XRUN=tile.get("XRUN", 0), PIPE=tile.get("PIPE", 0))
    if not dot and m == 1 and tile.get("STREAM"):
        extra["STREAM"] = tile["STREAM"]
        if tile.get("TMA"):  # (the stream's PIPE loop only)
            extra["TMA"] = tile["TMA"]
    if not dot and tile.get("maxnreg") and "STREAM" not in extra:  # ptxas's register cap
        extra["maxnreg"] = tile["maxnreg"]  # (occupancy) of a split-K tile; the stream takes none
    return dict(BLOCK_N=tile["BLOCK_N"], GT=max(1, tile["TW"] // wpg), num_warps=tile["num_warps"],
                num_stages=tile["num_stages"], **extra)


def config(m: int, n: int, k: int, group: int, device: torch.device) -> tuple[bool, dict]:
    """(whether the tl.dot kernel, its tiles): tuned per shape where the GPU has a table
    (configs/), else a default. A table's "8" entry may send 5-8 rows to tl.dot ({"dot": true})."""
    wpg = group // 8
    if device.type != "cuda":  # the interpreter: small tiles
        dot = m > DP4A_ROWS
        # split K only where N is small (every split walks all of K in the interpreter)
        return dot, _tile(dict(BLOCK_N=16, TW=max(wpg, 8), num_warps=4, num_stages=1,
                               SPLIT=2 if n <= 32 else 1, BLOCK_M=16 if dot else 2), m, dot, wpg)
    if _OVERRIDE is not None:  # (a probe's tile; "dot": true takes tl.dot at <= DP4A_ROWS too)
        dot = m > DP4A_ROWS or bool(_OVERRIDE.get("dot"))
        return dot, _tile(_OVERRIDE, m, dot, wpg)
    table = _tuned(torch.cuda.get_device_name(device)).get(f"{n}x{k}", {})
    if m > DP4A_ROWS:  # tl.dot: the tile of the row class (up to 16, 32, ... rows)
        cls = next(c for c in DOT_CLASSES if m <= int(c))
        return True, _tile(table.get(cls) or DEFAULT_TILES[cls], m, True, wpg)
    cls = _row_class(m)
    tile = table.get(cls) or _default_tile(cls, n, k)
    if tile.get("dot"):
        return True, _tile(table.get("16") or DEFAULT_TILES["16"], m, True, wpg)
    return False, _tile(tile, m, False, wpg)
