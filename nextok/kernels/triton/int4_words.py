"""The int4 weight's packed words (quant/int4.py, Int4Linear): their order in memory on CUDA, and
the whole weight dequantized in one pass for prefill-sized steps.

Words: int32 [N, K / 8], word j of a row holds columns 8j .. 8j + 7, column 8j + i in bits
4i .. 4i + 3; per row and group of GROUP columns a scale d and a min m, float16 [N, K / GROUP]:
W = d * q + m. Row-major, or in tiles (tile_words) for the kernels of w4a16.py, which take both.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from nextok.kernels.triton.fused import _round


@triton.jit
def _tile_ptrs(w_ptr, n, wl, KW, TW: tl.constexpr, LN: tl.constexpr, LW: tl.constexpr):
    # Pointers to words wl (0 <= wl < TW) of rows n for the tile whose first word is 0; the
    # tile at word kw0 (a multiple of TW) is these + _tile_step(kw0). Row-major words [N, KW]
    # (LN = 0), or tiles of LN rows x LW words, each contiguous, [N / LN, KW / LW, LN, LW]
    # (tile_words), with TW a multiple of LW. Split this way, a loop over K adds one product to
    # pointers computed once, which the compiler's alignment analysis follows (through // and
    # % it loses track, and the loads stop being 16-byte vectors).
    if LN == 0:
        return w_ptr + n * KW + wl
    elif TW == LW:
        return w_ptr + (n // LN) * (KW * LN) + (n % LN) * LW + wl
    else:
        return w_ptr + (n // LN) * (KW * LN) + (n % LN) * LW + (wl // LW) * (LN * LW) + wl % LW


@triton.jit
def _tile_step(kw0, LN: tl.constexpr):
    # with tiles: kw0 / LW whole tiles of LN * LW words further
    if LN == 0:
        return kw0
    else:
        return kw0 * LN


@triton.jit
def _dequant_kernel(w_ptr, d_ptr, m_ptr, out_ptr, N, KW, G, S_DN, S_DG, WPG: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_W: tl.constexpr, LN: tl.constexpr, LW: tl.constexpr):
    # Program (block of rows, block of words): out [N, 8 KW] = d * q + m in out's dtype, as
    # float32 then rounded (dequantize_groups' arithmetic). words [N, KW]; d, m [N, G].
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    ok = (n < N)[:, None] & (j < KW)[None, :]
    w = tl.load(_tile_ptrs(w_ptr, n[:, None].to(tl.int64), j[None, :], KW, 0, LN, LW), mask=ok,
                other=0)  # [BLOCK_N, BLOCK_W] (TW = 0: j may span tiles)
    grp = n[:, None] * S_DN + (j[None, :] // WPG) * S_DG  # d[n, g] at n * S_DN + g * S_DG
    d = tl.load(d_ptr + grp, mask=ok, other=0.0).to(tl.float32)
    mn = tl.load(m_ptr + grp, mask=ok, other=0.0).to(tl.float32)
    q = (w[:, :, None] >> (4 * tl.arange(0, 8))[None, None, :]) & 0xF  # [BLOCK_N, BLOCK_W, 8]
    val = q.to(tl.float32) * d[:, :, None] + mn[:, :, None]
    col = j[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    val = _round(val, out_ptr.dtype.element_ty).to(out_ptr.dtype.element_ty)  # to nearest even
    tl.store(out_ptr + n[:, None, None].to(tl.int64) * (8 * KW) + col, val, mask=ok[:, :, None])


# The words' layout on CUDA (Int4Linear): tiles of LAYOUT = (rows, words), each tile contiguous.
# Why: in row-major order a program's tile of 128 rows x 32 words is 128 runs of 128 bytes, 2-7
# KB apart, and DRAM serves short scattered runs at well under its copy bandwidth. The one-row
# kernel read ~2.3 TB/s of 4.25 on an H200, and the 8B step took 1.42x as long on an H100 with
# 1.42x less bandwidth and the same SMs and clock, which pointed at memory. In tiles a program
# streams 4 KB tiles, consecutive along K (a kernel's TW must be a multiple of the tile's 16
# words; every CUDA tile is). Timed on an H200 (2026-12-05-evening-gpu.md): the 8B gate_up at
# one row 29.3 -> 24.4 us, the three smaller shapes unchanged; what is left looks like issue
# and memory time not overlapping (w4a16.py, XAHEAD).
LAYOUT = (64, 16)


def tile_words(words: torch.Tensor, layout: tuple[int, int] = LAYOUT) -> torch.Tensor:
    """Row-major words [N, KW] -> the same words in tiles of layout (LN rows, LW words), stored
    [N / LN, KW / LW, LN, LW], returned as an [N, KW] tensor (N and KW multiples of LN, LW)."""
    (n, kw), (ln, lw) = words.shape, layout
    return words.view(n // ln, ln, kw // lw, lw).transpose(1, 2).contiguous().view(n, kw)


def untile_words(words: torch.Tensor, layout: tuple[int, int] = LAYOUT) -> torch.Tensor:
    """tile_words' inverse."""
    (n, kw), (ln, lw) = words.shape, layout
    return words.view(n // ln, kw // lw, ln, lw).transpose(1, 2).contiguous().view(n, kw)


def can_tile(n: int, kw: int, layout: tuple[int, int] = LAYOUT) -> bool:
    return n % layout[0] == 0 and kw % layout[1] == 0


def layout_args(layout: tuple[int, int] | None) -> dict:
    return dict(LN=layout[0], LW=layout[1]) if layout else dict(LN=0, LW=1)


def dequantize(words: torch.Tensor, d: torch.Tensor, m: torch.Tensor, dtype: torch.dtype,
               layout: tuple[int, int] | None = None) -> torch.Tensor:
    """The weight d * q + m [N, 8 KW] in dtype, in one pass (words int32 [N, KW], tiled if layout,
    d and m [N, G]): for prefill-sized steps, which then multiply with cuBLAS. In torch the same
    is five passes over [N, K], one in float32 (an 8B model's 128-token prefill took 3.5x bf16's
    on an H100)."""
    n, kw = words.shape
    out = torch.empty(n, 8 * kw, dtype=dtype, device=words.device)
    g = d.shape[1]
    if n and kw:
        wpg = kw // g
        if wpg * g != kw or wpg & (wpg - 1):
            raise ValueError(f"{kw} words a row do not make {g} groups of a power-of-two size")
        if layout and not can_tile(n, kw, layout):
            raise ValueError(f"words {[n, kw]} do not make tiles of {layout} (rows, words)")
        block_w = min(64, triton.next_power_of_2(kw))
        _dequant_kernel[(triton.cdiv(n, 16), triton.cdiv(kw, block_w))](
            words, d, m, out, n, kw, g, *d.stride(), WPG=wpg, BLOCK_N=16, BLOCK_W=block_w, num_warps=4,
            **layout_args(layout))
    return out
