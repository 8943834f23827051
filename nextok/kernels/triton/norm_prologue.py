"""add + RMS norm inside the one-row W4A16 kernels (w4a16.py, w4a16_stream.py): the norm before
a decoder layer's qkv and gate_up projections, without a launch of its own.

Why: at batch 1 a decode step is a chain of ~9 kernels a layer, and each waits for the one
before it to finish and flush (PDL starts it early, but its reads of x still wait). The add +
RMS norm kernel (fused.py) does almost no work: it is one such wait, a load, a sum and a store
(~2.5 us on an H100 without PDL, 66 a step of Llama-3.1-8B, ~0.16 ms of a ~2.2 ms int4 step).
Here every program of the matmul takes the norm's statistics itself, right after its own wait:
it reads the row(s) of x and the residual whole (8 KB each at hidden 4096, from L2) for the sum
of squares, and each x tile is then normed as it is loaded.

NORM (a kernel constexpr): 0 none; 1 x is the stream itself (the first layer: no residual);
2 s = x + residual. The program that `write`s also stores s, the new residual, to r_out.
Numerics are the norm kernel's: s rounded to x's dtype, rstd = rsqrt(mean(s^2) + eps) in
float32, s * rstd rounded, times the weight rounded. The sum of squares runs in chunks of CH
columns (its order differs from the norm kernel's one tl.sum, so rstd may differ in its last
bit, and a value now and then by one unit of x's dtype).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from nextok.kernels.triton.fused import _round


@dataclass
class NormIn:
    """What a W4A16 call norms its x with: y = (rms_norm(x + residual) * weight) @ W.T. residual
    None: x itself is the stream (the first layer). residual_out [M, K], x's dtype: where the
    new residual x + residual goes (not written without a residual)."""
    residual: torch.Tensor | None
    weight: torch.Tensor
    eps: float
    residual_out: torch.Tensor | None

    def check(self, x: torch.Tensor) -> None:
        """The shapes and dtypes the kernels take (x [M, K] unit-stride)."""
        k = x.shape[1]
        if self.weight.shape != (k,) or self.weight.dtype != x.dtype or not self.weight.is_contiguous():
            raise ValueError(f"the norm's weight must be [{k}] contiguous in x's dtype ({x.dtype}), not "
                             f"{list(self.weight.shape)} {self.weight.dtype}")
        if self.residual is not None:
            for name, t in (("residual", self.residual), ("residual_out", self.residual_out)):
                if t is None or t.shape != x.shape or t.dtype != x.dtype or t.stride(-1) != 1:
                    raise ValueError(f"the norm's {name} must be {list(x.shape)} unit-stride in {x.dtype}")
            if self.residual_out.stride(0) != k:
                raise ValueError("the norm's residual_out must be contiguous")

    def kernel_args(self, x: torch.Tensor, rows_a_program: int) -> tuple[tuple, dict]:
        """(runtime args res_ptr, g_ptr, r_out_ptr, s_rm, eps; constexprs NORM, K_NORM, CH_NORM)."""
        has_res = self.residual is not None
        res = self.residual if has_res else x
        k = x.shape[1]
        # a chunk of the sum of squares: <= 4096 values a program (32 a thread at 4 warps)
        ch = min(triton.next_power_of_2(k), max(256, 4096 // rows_a_program))
        return ((res, self.weight, self.residual_out if has_res else x, res.stride(0), self.eps),
                dict(NORM=2 if has_res else 1, K_NORM=k, CH_NORM=ch))


def no_norm(x: torch.Tensor) -> tuple[tuple, dict]:
    """kernel_args of a call without a norm (the pointers unused)."""
    return (x, x, x, 0, 0.0), dict(NORM=0, K_NORM=0, CH_NORM=1)


@triton.jit
def _norm_rstd(x_ptr, res_ptr, r_out_ptr, rows, row_ok, s_xm, s_rm, write, eps, NORM: tl.constexpr,
               K: tl.constexpr, CH: tl.constexpr):
    # rstd [BLOCK_M] float32 of x's rows `rows`: rsqrt(mean(s^2) + eps) over the K columns, s = x
    # (NORM 1) or x + residual rounded to x's dtype (NORM 2; `write`: s stored to r_out [M, K])
    dt: tl.constexpr = x_ptr.dtype.element_ty
    ss = tl.zeros([rows.shape[0]], dtype=tl.float32)
    for c0 in tl.static_range(0, K, CH):
        cols = c0 + tl.arange(0, CH)
        ok = row_ok[:, None] & (cols < K)[None, :]
        s = tl.load(x_ptr + rows[:, None] * s_xm + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        if NORM == 2:
            r = tl.load(res_ptr + rows[:, None] * s_rm + cols[None, :], mask=ok, other=0.0).to(tl.float32)
            s = _round(s + r, dt)
            tl.store(r_out_ptr + rows[:, None] * K + cols[None, :], s.to(dt), mask=ok & write)
        ss += tl.sum(s * s, axis=1)
    return tl.rsqrt(ss / K + eps)


@triton.jit
def _normed(x, res_tile, g_tile, rstd, xw, x_ok, NORM: tl.constexpr):
    # x's tile [BLOCK_M, GT, WPG, 8] as loaded (words xw) -> the norm's output there, float32
    # holding values of x's dtype; res_tile, g_tile: the residual's and the weight's words at
    # word 0 (as x_rows is x's); rstd [BLOCK_M, 1, 1, 1]
    dt: tl.constexpr = x.dtype
    s = x.to(tl.float32)
    if NORM == 2:
        s = _round(s + tl.load(res_tile + xw * 8, mask=x_ok, other=0.0).to(tl.float32), dt)
    g = tl.load(g_tile + xw * 8, mask=x_ok, other=0.0).to(tl.float32)
    return _round(_round(s * rstd, dt) * g, dt)
