"""W4A16 for 9-256 rows (w4a16.py's w4a16 launches it): each tile of W dequantized to x's dtype in
registers and multiplied with tl.dot, the rows in blocks of BLOCK_M (16, 32, 64 or 128; fewer
rows padded; each block of rows dequantizes W again). The weight layout is w4a16.py's. At more
rows than the dp4a kernel's eight, the tensor cores' throughput pays for the dequantization
(tiles: w4a16_tiles.py, row classes DOT_CLASSES); up to w4a16_tiles.KERNEL_ROWS rows it stands
in for dequantizing the whole weight each call (2 bytes a weight written and read back, then
cuBLAS).

Tile options (the H100's sweep, 2026-12-06-rows-pairs-h100.md; every best tile has JOIN and
PAIRS, and takes 0.28-0.51x the time of dequantize + cuBLAS, 0.70-1.02x bf16's):
- JOIN: one dot per tile. The 8 nibble planes are joined back into column order ([BLOCK_N,
  TW * 8], columns 8 word + i) and x's tile is one contiguous load. On sm_90 the loop has 2-3
  barriers instead of 16 (one wgmma at 64 rows). gate_up at 64 rows: 70.2 us, 220.4 with a dot
  per nibble position.
- PAIRS (with JOIN): W dequantized in x's 16-bit dtype two columns a 32-bit register
  (_paired_planes): the loop of a 64-row tile went from 454 to 284 sm_90 instructions, 1.02-1.24x
  faster than JOIN alone at the same tile. d and m are rounded to x's dtype first (float16 ->
  bfloat16 moves a weight by up to ~2^-9 (15 |d| + |m|); +0.04 % perplexity on the default
  model, less than rounding the weights to bfloat16 costs).
- SPLIT: K split over SPLIT programs a tile of W, summed by the last of them (split_k.py), so
  shapes with few tiles of N fill the SMs.
W's tile as the dot's left operand (sm_90's wgmma reading it from registers) was timed and
dropped: within 3 % of this orientation, ahead at 3 of 12 points (2026-12-06-late-h100.md).
"""
from __future__ import annotations

import triton
import triton.language as tl

from nextok.kernels.triton.fused import _round
from nextok.kernels.triton.int4_words import _tile_ptrs, _tile_step
from nextok.kernels.triton.pdl import pdl_wait
from nextok.kernels.triton.split_k import store_split_k


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
def _plane(w, hi, d, mn, i: tl.constexpr, dtype: tl.constexpr):
    # W at columns 8 word + i in the dot's input dtype: [BLOCK_N, GT, WPG]
    return (_nibble(w, hi, i) * (d * (1.0 / (1 << (4 * (i % 4))))) + mn).to(dtype)


def _pair_asm(t: str, magic: str, one: str, neg: str) -> str:
    """PTX of _paired_planes: $8 the word, $9 d, $10 m -> $0..$7 the columns 8 word + 0..7.
    Pair b: prmt takes the word's byte b (nibble 2b in its low half) into byte 0 and the word
    shifted right by 4's byte b (nibble 2b + 1) into byte 2; lop3 keeps those nibbles under
    `magic` (128 + q in bfloat16, 1024 + q in float16: exact); 1 * that - 128 (or 1024) is q;
    then q d + m, rounded once."""
    pairs = "".join(f"prmt.b32 p{b}, $8, w4, {0x4400 + 0x1111 * b}; "
                    f"lop3.b32 p{b}, p{b}, 0x000F000F, {magic}, 0xEA; "
                    f"fma.rn.{t} p{b}, p{b}, one, neg; fma.rn.{t} p{b}, p{b}, d2, m2; "
                    f"mov.b32 {{${2 * b}, ${2 * b + 1}}}, p{b}; " for b in range(4))
    return ("{ .reg .b32 w4, one, neg, d2, m2, p0, p1, p2, p3; shr.u32 w4, $8, 4; "
            f"mov.b32 d2, {{$9, $9}}; mov.b32 m2, {{$10, $10}}; mov.b32 one, {one}; mov.b32 neg, {neg}; "
            + pairs + "}")


PAIR_ASM_BF16 = tl.constexpr(_pair_asm("bf16x2", magic="0x43004300", one="0x3F803F80", neg="0xC300C300"))
PAIR_ASM_F16 = tl.constexpr(_pair_asm("f16x2", magic="0x64006400", one="0x3C003C00", neg="0xE400E400"))


@triton.jit
def _paired_planes(w, d, mn, xdtype: tl.constexpr, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    # The 8 planes (columns 8 word + i) of words w [BLOCK_N, GT, WPG] as q d + m computed in x's
    # 16-bit dtype, two columns a 32-bit register: per word one shift, and per pair of columns a
    # prmt, a lop3 and two fma.x2 (q exact, then q d + m rounded once), against ~4.4 instructions
    # a column through float32 (_plane). d and m [BLOCK_N, GT, 1] are rounded to x's dtype first:
    # from float16 to bfloat16 that moves a weight by up to ~2^-9 (15 |d| + |m|). The interpreter,
    # which runs no PTX, computes the same in float32 (q d + m is exact there), rounded once.
    if INTERPRET:  # _round: the interpreter's own cast to bfloat16 truncates
        d16 = _round(d, xdtype)
        m16 = _round(mn, xdtype)
        p0 = _round(((w >> 0) & 0xF).to(tl.float32) * d16 + m16, xdtype).to(dtype)
        p1 = _round(((w >> 4) & 0xF).to(tl.float32) * d16 + m16, xdtype).to(dtype)
        p2 = _round(((w >> 8) & 0xF).to(tl.float32) * d16 + m16, xdtype).to(dtype)
        p3 = _round(((w >> 12) & 0xF).to(tl.float32) * d16 + m16, xdtype).to(dtype)
        p4 = _round(((w >> 16) & 0xF).to(tl.float32) * d16 + m16, xdtype).to(dtype)
        p5 = _round(((w >> 20) & 0xF).to(tl.float32) * d16 + m16, xdtype).to(dtype)
        p6 = _round(((w >> 24) & 0xF).to(tl.float32) * d16 + m16, xdtype).to(dtype)
        p7 = _round(((w >> 28) & 0xF).to(tl.float32) * d16 + m16, xdtype).to(dtype)
    else:
        d16b = tl.broadcast_to(d.to(xdtype), w.shape)
        m16b = tl.broadcast_to(mn.to(xdtype), w.shape)
        if xdtype == tl.bfloat16:
            p0, p1, p2, p3, p4, p5, p6, p7 = tl.inline_asm_elementwise(
                PAIR_ASM_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [w, d16b, m16b], dtype=(tl.bfloat16,) * 8,
                is_pure=True, pack=1)
        else:
            p0, p1, p2, p3, p4, p5, p6, p7 = tl.inline_asm_elementwise(
                PAIR_ASM_F16, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [w, d16b, m16b], dtype=(tl.float16,) * 8,
                is_pure=True, pack=1)
    return p0, p1, p2, p3, p4, p5, p6, p7


@triton.jit
def _in_split(i, lo, hi, INTERPRET: tl.constexpr):
    # whether word (or column) i is in the program's split [lo, hi); on the GPU the loop starts
    # at lo, so only hi needs a test (the interpreter's loop walks all of K)
    if INTERPRET:
        return (i >= lo) & (i < hi)
    else:
        return i < hi


@triton.jit
def _dot(acc, a, w2, IEEE: tl.constexpr):
    # acc [BLOCK_M, BLOCK_N] + a [BLOCK_M, K] @ w2 [BLOCK_N, K].T, w2 in the dot's input dtype
    if IEEE:  # the interpreter's tl.dot multiplies bfloat16's raw bits: float32 there
        return acc + tl.dot(a.to(tl.float32), tl.trans(w2), input_precision="ieee")
    return acc + tl.dot(a, tl.trans(w2))


@triton.jit
def _w4a16_dot_kernel(x_ptr, w_ptr, d_ptr, m_ptr, b_ptr, y_ptr, part_ptr, count_ptr, M, N, KW, G,
                      S_DN, S_DG, s_xm, s_ym, WPG: tl.constexpr, GT: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
                      IEEE: tl.constexpr, INTERPRET: tl.constexpr, KW_INTERPRET: tl.constexpr,
                      LN: tl.constexpr, LW: tl.constexpr, JOIN: tl.constexpr = 0,
                      SPLIT: tl.constexpr = 1, PAIRS: tl.constexpr = 0, GROUP_MAJOR: tl.constexpr = 0):
    # Grid (cdiv(N, BLOCK_N) * SPLIT * cdiv(M, BLOCK_M),), as the dp4a kernel's (w4a16.py): a
    # program takes BLOCK_M rows of x, BLOCK_N rows of W and a SPLIT-th of K. x [M, 8 * KW]
    # unit-stride rows; words [N, KW]; d, m [N, G]; y [M, N]; part, count: split_k.py's. A tile:
    # [BLOCK_N, GT, WPG] words (WPG words per group). KW is a runtime argument; the interpreter
    # cannot loop to one, so there the loop runs to KW_INTERPRET over all of K, masking the
    # words outside the program's split.
    pdl_wait(PDL)
    TW: tl.constexpr = GT * WPG  # words per row per tile
    mb = tl.cdiv(M, BLOCK_M)
    rblock = tl.program_id(0) % mb
    split = (tl.program_id(0) // mb) % SPLIT
    tile = tl.program_id(0) // (mb * SPLIT)
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    n3 = n[:, None, None]
    n_ok3 = n_ok[:, None, None]
    g3 = tl.arange(0, GT)[None, :, None]
    j3 = tl.arange(0, WPG)[None, None, :]
    rows = rblock * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    t = tl.arange(0, TW)
    c = tl.arange(0, TW * 8)  # JOIN: a tile's columns in order
    per_split = tl.cdiv(tl.cdiv(KW, SPLIT), TW) * TW
    kw_first = split * per_split
    kw_hi = tl.minimum(kw_first + per_split, KW)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    w_tile = _tile_ptrs(w_ptr, n3, g3 * WPG + j3, KW, TW, LN, LW)
    for kw0 in range(0 if INTERPRET else kw_first, KW_INTERPRET if INTERPRET else kw_hi, TW):
        word = kw0 + g3 * WPG + j3  # [1, GT, WPG]
        w = tl.load(w_tile + _tile_step(kw0, LN), mask=n_ok3 & _in_split(word, kw_first, kw_hi, INTERPRET),
                    other=0)  # [BLOCK_N, GT, WPG]
        hi = w >> 16
        grp = kw0 // WPG + g3  # [1, GT, 1]
        g_mask = n_ok3 & (grp < G)
        # d, m [BLOCK_N, GT, 1]; in group order [BLOCK_N, GT, WPG], loaded in the words' shape:
        # else Triton 3.6 (sm_90, groups of 32 or 64) gave the tile's dequantized operand an
        # illegal shared-memory layout and failed to compile ("Illegal shared layout")
        gptr = n3 * S_DN + grp * S_DG + (j3 * 0 if GROUP_MAJOR else 0)
        d = tl.load(d_ptr + gptr, mask=g_mask, other=0.0).to(tl.float32)
        mn = tl.load(m_ptr + gptr, mask=g_mask, other=0.0).to(tl.float32)
        dtype = tl.float32 if IEEE else x_ptr.dtype.element_ty
        if JOIN:
            if PAIRS:
                p0, p1, p2, p3, p4, p5, p6, p7 = _paired_planes(w, d, mn, x_ptr.dtype.element_ty,
                                                                dtype, INTERPRET)
            else:
                p0 = _plane(w, hi, d, mn, 0, dtype)
                p1 = _plane(w, hi, d, mn, 1, dtype)
                p2 = _plane(w, hi, d, mn, 2, dtype)
                p3 = _plane(w, hi, d, mn, 3, dtype)
                p4 = _plane(w, hi, d, mn, 4, dtype)
                p5 = _plane(w, hi, d, mn, 5, dtype)
                p6 = _plane(w, hi, d, mn, 6, dtype)
                p7 = _plane(w, hi, d, mn, 7, dtype)
            # planes i joined so that the reshape's last index 4 e1 + 2 e2 + e3 is i: the
            # innermost pairs differ by 4 in i, the outermost by 1
            ev = tl.join(tl.join(p0, p4), tl.join(p2, p6))
            od = tl.join(tl.join(p1, p5), tl.join(p3, p7))
            w2 = tl.reshape(tl.join(ev, od), [BLOCK_N, TW * 8])
            col = kw0 * 8 + c  # [TW * 8]
            a = tl.load(x_ptr + rows[:, None] * s_xm + col[None, :],
                        mask=row_ok[:, None] & _in_split(col, 8 * kw_first, 8 * kw_hi, INTERPRET)[None, :],
                        other=0.0)
            acc = _dot(acc, a, w2, IEEE)
        else:
            for i in tl.static_range(8):
                w2 = tl.reshape(_plane(w, hi, d, mn, i, dtype), [BLOCK_N, TW])  # W at 8 word + i
                col = (kw0 + t) * 8 + i  # [TW]
                a = tl.load(x_ptr + rows[:, None] * s_xm + col[None, :],
                            mask=row_ok[:, None] & _in_split(kw0 + t, kw_first, kw_hi, INTERPRET)[None, :],
                            other=0.0)
                acc = _dot(acc, a, w2, IEEE)
    store_split_k(acc, part_ptr, count_ptr, b_ptr, y_ptr, rows, row_ok, n, n_ok, M, N, s_ym,
                  split, tile * mb + rblock, SPLIT, HAS_BIAS, BLOCK_M, BLOCK_N)
