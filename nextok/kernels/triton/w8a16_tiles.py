"""Which tiles the W8A16 kernel (quant_linear.py) runs with, per GPU, shape and number of rows.

Tuned tiles per GPU: {"<N>x<K>": {row class: tile}}, a tile: BLOCK_N, BK (columns a step),
num_warps, num_stages, BLOCK_M (rows a program; 1 with DOT 0), DOT (tl.dot, else the one-row
CUDA-core loop) and SPLIT (programs a tile of W splits K over), written by
benchmarks/gpu/w8a16_probe.py to configs/w8a16_<gpu>.json; NEXTOK_W8A16_CONFIGS names another
table. A shape or row class the table lacks takes DEFAULT_TILES, with K split so that the grid
makes about two programs an SM.
"""
from __future__ import annotations

import functools

import torch
import triton

from nextok.kernels.triton.tile_tables import load_table, rows_limit

ROW_CLASSES = ("1", "16", "64", "256")  # 1, 2-16, 17-64, 65-256 rows
# Steps of up to KERNEL_ROWS rows run the kernel (Int8Linear), bigger ones (prefill) convert the
# whole weight to x's dtype and run cuBLAS. At 1, 16, 64 and 256 rows one 8B layer took 92.7,
# 91.3, 133.6 and 334.1 us on the kernel against 767-841 us converted (H100, 2026-12-06,
# 2026-12-06-w8a16-h100.md). NEXTOK_W8A16_ROWS (1..MAX_ROWS) moves it.
KERNEL_ROWS = 256
# Where the GPU has no table: the tile that was best at most of the 8B shapes per row class in
# the H100's sweep, K split by _split (which gave the best split at 15 of its 16 points). One
# row takes tl.dot too, padded to 16 rows: faster than the CUDA-core loop at 3 of 4 shapes.
DEFAULT_TILES = {
    "1": dict(DOT=1, BLOCK_M=16, BLOCK_N=64, BK=128, num_warps=4, num_stages=4),
    "16": dict(DOT=1, BLOCK_M=16, BLOCK_N=64, BK=128, num_warps=4, num_stages=4),
    "64": dict(DOT=1, BLOCK_M=64, BLOCK_N=64, BK=128, num_warps=4, num_stages=3),
    "256": dict(DOT=1, BLOCK_M=128, BLOCK_N=64, BK=64, num_warps=8, num_stages=3)}
# Group scales (GGUF Q8_0 / Q5_* / Q6_K) up to 16 rows, in group order (quant/int8.py
# GROUP_MAJOR): tl.dot on tiles of 32 rows x 256 columns, one row too (padded to 16). In the
# H100's second sweep (2026-12-07-gguf-h100.md; 8B gate_up and down, Q8_0 / Q5_K / Q6_K, 1 and 8
# rows) it was the best at 5 of 12 points and within 1.04-1.33x elsewhere; against the tile
# before (64 x 64, the CUDA-core loop at one row, scales in row order) one row took 0.58-0.83x
# the time (gate_up Q8_0 71.8 us against 96.6 and bf16's 81.3; down Q6_K 49.5 against 85.8),
# 8 rows 0.79-1.03x.
GROUP_TILES = {c: dict(DOT=1, BLOCK_M=16, BLOCK_N=32, BK=256, num_warps=4, num_stages=3) for c in ("1", "16")}
PROGRAMS = 256  # the grid an untuned shape's split of K aims at (an H100 has 132 SMs)
_OVERRIDE: dict | None = None  # benchmarks/gpu/w8a16_probe.py sets tiles to sweep them


def set_config(cfg: dict | None) -> None:
    global _OVERRIDE
    _OVERRIDE = cfg


@functools.cache
def _tuned(device_name: str) -> dict:
    return load_table("w8a16", device_name)


@functools.cache
def kernel_rows() -> int:
    """KERNEL_ROWS, or NEXTOK_W8A16_ROWS within 1..quant_linear.MAX_ROWS. Decided once a process."""
    from nextok.kernels.triton.quant_linear import MAX_ROWS

    return rows_limit("w8a16", KERNEL_ROWS, 1, MAX_ROWS)


def row_class(m: int) -> str:
    return next(c for c in ROW_CLASSES if m <= int(c))


def _split(tile: dict, m: int, n: int, k: int) -> int:
    """K's split for an untuned shape: the power of two that brings the grid nearest PROGRAMS
    from below, at most 8, and never into pieces of under 4 steps of BK."""
    programs = triton.cdiv(n, tile["BLOCK_N"]) * triton.cdiv(m, tile["BLOCK_M"])
    split = 1
    while split < 8 and programs * split * 2 <= PROGRAMS and k // (2 * split) >= 4 * tile["BK"]:
        split *= 2
    return split


def config(m: int, n: int, k: int, device: torch.device, grouped: bool = False) -> dict:
    """The tile for m rows of x and a weight [n, k]: a probe's (set_config), GROUP_TILES for
    grouped scales, the GPU's table, else DEFAULT_TILES; in the interpreter small tiles, K split
    2 ways where N is small."""
    if _OVERRIDE is not None:
        tile = _OVERRIDE
    elif device.type != "cuda":
        tile = dict(DOT=int(m > 1), BLOCK_M=16, BLOCK_N=16, BK=32, num_warps=4, num_stages=1,
                    SPLIT=2 if n <= 32 else 1)
    else:
        cls = row_class(m)
        tuned = _tuned(torch.cuda.get_device_name(device)).get(f"{n}x{k}", {}).get(cls)
        tile = (GROUP_TILES.get(cls) if grouped else None) or tuned or DEFAULT_TILES[cls]
    # tl.dot takes blocks of >= 16 rows, the CUDA-core loop one row a program
    tile = dict(tile, BLOCK_M=max(16, tile["BLOCK_M"]) if tile["DOT"] else 1)
    if tile.get("SPLIT") is None:
        tile["SPLIT"] = _split(tile, m, n, k)
    return tile
