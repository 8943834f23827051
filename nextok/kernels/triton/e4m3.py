"""fp8 e4m3 for the KV cache (attention/kv_quant.py), both ways.

float32 -> e4m3 (to_e4m3): clamp to +-448, round to
nearest even, cast. The rounding is done by hand because Triton 3.6's interpreter rounds its
float32 -> float8e4nv cast wrongly (ties up, and a mantissa carry lands in the exponent bits:
1.97 -> 1.0), and the CPU tests should see the GPU's bytes; a cast of an e4m3 value is exact
in both, so on CUDA the result is the hardware cast's (cvt.rn.satfinite), for a few more ALU
ops in a memory-bound store.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def to_e4m3(x, dst_ty: tl.constexpr):
    """x: float32 (any shape) -> clamp(x, -448, 448) in dst_ty (tl.float8e4nv), to nearest even."""
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    # e4m3's step at |x|: 2^(max(E, -6) - 3), E = x's unbiased exponent (-6: the subnormals')
    e = (x.to(tl.int32, bitcast=True) >> 23) & 0xFF
    step = ((tl.maximum(e, 127 - 6) - 3) << 23).to(tl.float32, bitcast=True)
    # x + 1.5 * 2^23 steps lands where float32's spacing is one step: rounds x to a multiple of it
    magic = step * 12582912.0
    y = (x + magic) - magic
    return tl.where(y == 0.0, x * 0.0, y).to(dst_ty)  # (x * 0: a negative x keeps -0)


# ---- e4m3 -> float16, four values an int32 word (the paged decode kernel's fp8 tiles) -------------
@triton.jit
def _byte_to_f16(w, SHIFT: tl.constexpr):
    # byte SHIFT / 8 of each word as float16
    e = ((w >> SHIFT) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
    return e.to(tl.float32).to(tl.float16)


@triton.jit
def e4m3_words(w, INTERPRET: tl.constexpr):
    """int32 words [N, W] of four e4m3 values each (byte i: column 4 j + i) -> float16 [N, 4 W]:
    on the GPU two cvt.rn.f16x2.e4m3x2 a word, in the registers the words were loaded into; the
    interpreter, which runs no PTX, takes each byte through float32 (it converts fp8 right
    only that way)."""
    if INTERPRET:
        o0 = _byte_to_f16(w, 0)
        o1 = _byte_to_f16(w, 8)
        o2 = _byte_to_f16(w, 16)
        o3 = _byte_to_f16(w, 24)
    else:
        o0, o1, o2, o3 = tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; .reg .b32 r0, r1; mov.b32 {lo, hi}, $4; "
            "cvt.rn.f16x2.e4m3x2 r0, lo; cvt.rn.f16x2.e4m3x2 r1, hi; "
            "mov.b32 {$0, $1}, r0; mov.b32 {$2, $3}, r1; }",
            "=h,=h,=h,=h,r", [w], dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
            is_pure=True, pack=1)
    x = tl.join(tl.join(o0, o2), tl.join(o1, o3))  # [N, W, 2, 2]: [.., a, b] is o_(2a + b)
    return tl.reshape(x, [w.shape[0], w.shape[1] * 4])


@triton.jit
def fp8_tile(base, rows, k_ok, BD: tl.constexpr, INTERPRET: tl.constexpr):
    # An fp8 tile [N, BD] (rows: each key's byte offset, BD = D) as float16, through int32 words.
    # Why: loaded as bytes, Triton took them to the mma layout through shared memory one byte
    # at a time (sm_90: 112 shared loads a 64-key decode tile, 725 instructions; now 44 and
    # 566). On an H100 the 256 x 576 decode went 1.36x -> 1.55x the bf16 cache's speed
    # (2026-12-06-day-h100.md). The paged prefill keeps byte loads: its fp8 tile was not slower
    # than bf16's there (576 against 602 instructions).
    words = tl.load(base.to(tl.pointer_type(tl.int32)) + (rows // 4)[:, None]
                    + tl.arange(0, BD // 4)[None, :], mask=k_ok[:, None], other=0)
    return e4m3_words(words, INTERPRET)
