"""The integer dot product the W4A16 kernels (w4a16.py, w4a16_stream.py) are built on: `dp4a`,
four byte products and their sum in one instruction, the packing of bytes into its 32-bit
operands, and one tile's products (_tile_products; the scheme is in w4a16.py's docstring). In
Triton's interpreter the same sums in integer arithmetic.
"""
from __future__ import annotations

import triton
import triton.language as tl

from nextok.kernels.triton.fused import _round


@triton.jit
def _dp4a(a, b, c, B_SIGNED: tl.constexpr, INTERPRET: tl.constexpr):
    # c + sum over the 4 bytes k of a.byte[k] (unsigned) * b.byte[k] (signed or not): one
    # instruction on the GPU; integer arithmetic in the interpreter, the same result.
    if INTERPRET:
        r = c
        for k in tl.static_range(4):
            bb = (b >> (8 * k)) & 0xFF
            if B_SIGNED:
                bb -= (bb >> 7) << 8
            r += ((a >> (8 * k)) & 0xFF) * bb
        return r
    elif B_SIGNED:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise("dp4a.u32.u32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _bytes(v):
    # [BLOCK_M, GT, WPG, 4] int32, of which the low bytes count -> [BLOCK_M, GT, WPG] words,
    # element k in byte k
    k = tl.arange(0, 4)[None, None, None, :]
    return tl.sum((v & 0xFF) << (8 * k), axis=3)


@triton.jit
def _runs(v, NS: tl.constexpr):
    # [A, B, GT, WPG] -> the words 4 r + k of each run r of 4, four tensors [A, B, GT, NS]
    a, b = tl.split(tl.reshape(v, [v.shape[0], v.shape[1], v.shape[2], NS, 2, 2]))
    a0, a1 = tl.split(a)
    b0, b1 = tl.split(b)
    return a0, a1, b0, b1


@triton.jit
def _run_dots(we, wo, xe, xo, SIGNED: tl.constexpr, NS: tl.constexpr, INTERPRET: tl.constexpr):
    # sum over the 4 words of each run of dp4a(we, xe) + dp4a(wo, xo), chained through dp4a's
    # accumulator: [BLOCK_M, BLOCK_N, GT, NS] int32 (|sum| < 32 * 15 * 128 for the hi bytes)
    we0, we1, we2, we3 = _runs(we, NS)
    wo0, wo1, wo2, wo3 = _runs(wo, NS)
    xe0, xe1, xe2, xe3 = _runs(xe, NS)
    xo0, xo1, xo2, xo3 = _runs(xo, NS)
    t = _dp4a(we0, xe0, tl.zeros([xe.shape[0], we.shape[1], we.shape[2], NS], dtype=tl.int32),
              SIGNED, INTERPRET)
    t = _dp4a(wo0, xo0, t, SIGNED, INTERPRET)
    t = _dp4a(we1, xe1, t, SIGNED, INTERPRET)
    t = _dp4a(wo1, xo1, t, SIGNED, INTERPRET)
    t = _dp4a(we2, xe2, t, SIGNED, INTERPRET)
    t = _dp4a(wo2, xo2, t, SIGNED, INTERPRET)
    t = _dp4a(we3, xe3, t, SIGNED, INTERPRET)
    return _dp4a(wo3, xo3, t, SIGNED, INTERPRET)


@triton.jit
def _tile_products(acc, w, x, up, d, mn, x_dtype: tl.constexpr, SILU_MUL: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GT: tl.constexpr,
                   WPG: tl.constexpr, INTERPRET: tl.constexpr, XRUN: tl.constexpr = False):
    # acc [BLOCK_M, BLOCK_N, GT, WPG / 4] += one tile's products: W's words w [1, BLOCK_N, GT, WPG], x's
    # [BLOCK_M, GT, WPG, 8] as stored (and up's, for SILU_MUL), the groups' d and m [1, BLOCK_N, GT].
    # x in fixed point per word (XRUN: per run of 4 words): x = s (256 hi + lo), s = 2^(E - 13)
    NS: tl.constexpr = WPG // 4
    x = x.to(tl.float32)
    if SILU_MUL:
        x = _round(x / (1.0 + tl.exp(-x)), x_dtype)
        x = _round(x * up.to(tl.float32), x_dtype)
    amax = tl.maximum(tl.max(tl.abs(x), axis=3), 1e-30)  # [BLOCK_M, GT, WPG]
    if XRUN:  # the run's largest |x| for each of its 4 words
        amax_run = tl.max(tl.reshape(amax, [BLOCK_M, GT, NS, 4]), axis=3)  # [BLOCK_M, GT, NS]
        amax = tl.reshape(tl.broadcast_to(amax_run[:, :, :, None], [BLOCK_M, GT, NS, 4]), [BLOCK_M, GT, WPG])
    s = (amax.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True) * (1.0 / 8192.0)
    # round to nearest: 1.5 * 2^23 + v holds round(v) in its low mantissa bits (|v| < 2^14)
    xq = (x * (1.0 / s)[:, :, :, None] + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000
    hi_e, hi_o = tl.split(tl.reshape(xq >> 8, [BLOCK_M, GT, WPG, 4, 2]))  # columns 0,2,4,6 / 1,3,5,7
    lo_e, lo_o = tl.split(tl.reshape(xq & 0xFF, [BLOCK_M, GT, WPG, 4, 2]))
    # W's nibbles as bytes, columns 0,2,4,6 and 1,3,5,7: t = sum_i q_i x_i / s per word
    we = w & 0x0F0F0F0F
    wo = (w >> 4) & 0x0F0F0F0F
    # the four byte operands of a word, made in x's layout, go to the products' layout as one
    # tensor: one trip through shared memory a tile instead of four (each a barrier or two)
    ops = tl.join(tl.join(_bytes(hi_e), _bytes(hi_o)), tl.join(_bytes(lo_e), _bytes(lo_o)))
    ops_hi, ops_lo = tl.split(ops[:, None, :, :, :, :])  # [BLOCK_M, 1, GT, WPG, 2] each
    b_hi_e, b_hi_o = tl.split(ops_hi)
    b_lo_e, b_lo_o = tl.split(ops_lo)
    # acc [BLOCK_M, BLOCK_N, GT, NS] holds a sum per run of 4 words (NS = WPG / 4 a group), the
    # 4 words a thread loads together: the group's sum across threads is left to the end, not
    # shuffled together every tile (on sm_90 ~1.5 instructions a word of W)
    if XRUN:
        # the run's words share x's scale, so they add up in dp4a's accumulator, the hi and lo
        # bytes apart, and only the run's sum turns into a float: 4 dp4a a word and row, and
        # per run one multiply-add, a conversion and an FMA (against a shift, a conversion and
        # two float ops a word)
        t = (_run_dots(we, wo, b_hi_e, b_hi_o, True, NS, INTERPRET) * 256
             + _run_dots(we, wo, b_lo_e, b_lo_o, False, NS, INTERPRET))
        s_run = (amax_run.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True) * (1.0 / 8192.0)
        part = t.to(tl.float32) * s_run[:, None, :, :]
    else:
        zero = tl.zeros([BLOCK_M, BLOCK_N, GT, WPG], dtype=tl.int32)
        t = _dp4a(we, b_hi_e, zero, True, INTERPRET)
        t = _dp4a(wo, b_hi_o, t, True, INTERPRET) << 8
        t = _dp4a(we, b_lo_e, t, False, INTERPRET)
        t = _dp4a(wo, b_lo_o, t, False, INTERPRET)
        part = tl.sum(tl.reshape(t.to(tl.float32) * s[:, None, :, :], [BLOCK_M, BLOCK_N, GT, NS, 4]), axis=4)
    xsum = tl.sum(tl.reshape(tl.sum(x, axis=3), [BLOCK_M, GT, NS, 4]), axis=3)[:, None, :, :]
    d4, mn4 = tl.split(tl.join(d, mn)[:, :, :, None, :])  # (one trip to the products' layout)
    return acc + part * d4 + mn4 * xsum
