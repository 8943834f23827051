"""float32 -> fp8 e4m3 for the KV cache (attention/kv_quant.py): clamp to +-448, round to
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
