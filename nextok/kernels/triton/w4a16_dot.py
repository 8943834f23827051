"""W4A16 for 9-64 rows (w4a16.py's w4a16 launches it): each tile of W dequantized to x's dtype in
registers and multiplied with tl.dot, the rows in blocks of BLOCK_M (16-64, padded), one dot
per nibble position. The weight layout is w4a16.py's. At more rows than the dp4a kernel's
eight, the tensor cores' throughput pays for the dequantization (tiles: w4a16_tiles.py, row
class "16"). Past 16 rows it stands in for dequantizing the whole weight each call (2 bytes
a weight written and read back) where w4a16_tiles.KERNEL_ROWS lets it.
"""
from __future__ import annotations

import triton
import triton.language as tl

from nextok.kernels.triton.int4_words import _tile_ptrs, _tile_step
from nextok.kernels.triton.pdl import pdl_wait


@triton.jit
def _nibble(w, hi, i: tl.constexpr):
    # Column 8j + i of each word, as float32 q * 2^(4 (i % 4)); hi = w >> 16. The nibble lands
    # in the mantissa of 2^23 (0x4B000000): one LOP3 and one FADD.
    SHIFT: tl.constexpr = 4 * (i % 4)
    if i < 4:
        src = w
    else:
        src = hi
    bits = (src & (0xF << SHIFT)) | 0x4B000000
    return bits.to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _w4a16_dot_kernel(x_ptr, w_ptr, d_ptr, m_ptr, b_ptr, y_ptr, M, N, KW, G, s_xm, s_ym,
                      WPG: tl.constexpr, GT: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
                      IEEE: tl.constexpr, INTERPRET: tl.constexpr, KW_INTERPRET: tl.constexpr,
                      LN: tl.constexpr, LW: tl.constexpr, WLHS: tl.constexpr = 0):
    # Grid (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M)). x [M, 8 * KW] unit-stride rows; words [N, KW];
    # d, m [N, G]; y [M, N]. A tile: [BLOCK_N, GT, WPG] words (WPG words per group). KW is a
    # runtime argument; the interpreter cannot loop to one, so there the loop runs to KW_INTERPRET.
    # WLHS: W's tile is the dot's left operand (y.T's tile [BLOCK_N, BLOCK_M] accumulates; on
    # sm_90 wgmma then reads W from registers), else x's is (y's tile [BLOCK_M, BLOCK_N]).
    pdl_wait(PDL)
    TW: tl.constexpr = GT * WPG  # words per row per tile
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    n3 = n[:, None, None]
    n_ok3 = n_ok[:, None, None]
    g3 = tl.arange(0, GT)[None, :, None]
    j3 = tl.arange(0, WPG)[None, None, :]
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    t = tl.arange(0, TW)
    if WLHS:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    w_tile = _tile_ptrs(w_ptr, n3, g3 * WPG + j3, KW, TW, LN, LW)
    for kw0 in range(0, KW_INTERPRET if INTERPRET else KW, TW):
        word = kw0 + g3 * WPG + j3  # [1, GT, WPG]
        w = tl.load(w_tile + _tile_step(kw0, LN), mask=n_ok3 & (word < KW), other=0)  # [BLOCK_N, GT, WPG]
        hi = w >> 16
        grp = kw0 // WPG + g3  # [1, GT, 1]
        g_mask = n_ok3 & (grp < G)
        d = tl.load(d_ptr + n3 * G + grp, mask=g_mask, other=0.0).to(tl.float32)  # [BLOCK_N, GT, 1]
        mn = tl.load(m_ptr + n3 * G + grp, mask=g_mask, other=0.0).to(tl.float32)
        for i in tl.static_range(8):
            wq = _nibble(w, hi, i) * (d * (1.0 / (1 << (4 * (i % 4))))) + mn  # W at 8 word + i
            col = (kw0 + t) * 8 + i  # [TW]
            a = tl.load(x_ptr + rows[:, None] * s_xm + col[None, :],
                        mask=row_ok[:, None] & (kw0 + t < KW)[None, :], other=0.0)
            w2 = tl.reshape(wq, [BLOCK_N, TW])
            if IEEE:  # the interpreter's tl.dot multiplies bfloat16's raw bits
                if WLHS:
                    acc += tl.dot(w2, tl.trans(a.to(tl.float32)), input_precision="ieee")
                else:
                    acc += tl.dot(a.to(tl.float32), tl.trans(w2), input_precision="ieee")
            elif WLHS:
                acc += tl.dot(w2.to(a.dtype), tl.trans(a))
            else:
                acc += tl.dot(a, tl.trans(w2.to(a.dtype)))
    if WLHS:
        acc = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * s_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & n_ok[None, :])
