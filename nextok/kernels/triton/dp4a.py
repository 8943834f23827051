"""The integer dot product the one-row W4A16 kernel (w4a16.py) is built on: `dp4a`, four byte
products and their sum in one instruction, and the packing of bytes into its 32-bit operands.
In Triton's interpreter the same sums in integer arithmetic.
"""
from __future__ import annotations

import triton
import triton.language as tl


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
