"""W8A16 for decode-sized steps: a Triton kernel that dequantizes int8 weights in registers, so
each step reads half of bf16's bytes. (W4A16 has its own kernel: kernels/triton/w4a16.py.)

y [M, N] = x [M, K] @ W.T (+ bias), M <= MAX_ROWS, with W held as q int8 [N, K] and one scale
float16 [N] per row: W = scale * q (quant/int8.py).

One program: BLOCK_N rows of W, all of K, for all M rows of x. One row of x: multiply and sum on
CUDA cores; more: tl.dot with the rows padded to 16. Bigger steps (prefill) dequantize the
whole weight once and call cuBLAS (quant/int8.py).

Measured on the H200 (benchmarks/gpu/quant_linear_probe.py, 2026-12-04): correct, not fast: one
8B layer at batch 1 takes 251 us against 146 us for bf16 cuBLAS (each program moves too few bytes
per iteration); the W4A16 kernel's layout and tiles are the way to fix it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

MAX_ROWS = 16


@triton.jit
def _dot(acc, a, w, USE_DOT: tl.constexpr, INTERPRET: tl.constexpr):
    # a: [BLOCK_M, BK] in x's dtype; w: [BLOCK_N, BK] float32 (int8 values, exact). One return:
    # Triton compiles every return of a jitted function, constexpr branches or not.
    if USE_DOT:
        if INTERPRET:  # the interpreter's tl.dot multiplies bfloat16's raw bits
            out = acc + tl.dot(a.to(tl.float32), tl.trans(w), input_precision="ieee")
        else:
            out = acc + tl.dot(a, tl.trans(w.to(a.dtype)), input_precision="ieee")
    else:
        out = acc + w * a.to(tl.float32)  # [BLOCK_N, BK] partial sums; a is one row
    return out


@triton.jit
def _quant_linear_kernel(x_ptr, q_ptr, d_ptr, b_ptr, y_ptr, M, N, s_xm, s_ym, K: tl.constexpr,
                         HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    HALF: tl.constexpr = BLOCK_K // 2
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, HALF], dtype=tl.float32)
    t = tl.arange(0, HALF)
    scale = tl.load(d_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
    for k0 in range(0, K, BLOCK_K):
        c_lo = k0 + t  # the tile's two halves
        c_hi = c_lo + HALF
        w_lo = tl.load(q_ptr + n[:, None] * K + c_lo[None, :], mask=n_ok[:, None] & (c_lo < K)[None, :],
                       other=0).to(tl.float32)
        w_hi = tl.load(q_ptr + n[:, None] * K + c_hi[None, :], mask=n_ok[:, None] & (c_hi < K)[None, :],
                       other=0).to(tl.float32)
        x_lo = tl.load(x_ptr + rows[:, None] * s_xm + c_lo[None, :], mask=row_ok[:, None] & (c_lo < K)[None, :],
                       other=0.0)
        x_hi = tl.load(x_ptr + rows[:, None] * s_xm + c_hi[None, :], mask=row_ok[:, None] & (c_hi < K)[None, :],
                       other=0.0)
        acc = _dot(acc, x_lo, w_lo, USE_DOT, INTERPRET)
        acc = _dot(acc, x_hi, w_hi, USE_DOT, INTERPRET)
    if not USE_DOT:
        acc = tl.sum(acc, axis=1)[None, :]  # [1, BLOCK_N]
    acc = acc * scale[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * s_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & n_ok[None, :])


INTERPRETED = not isinstance(_quant_linear_kernel, JITFunction)


def _config(m: int, device: torch.device) -> dict:
    if device.type != "cuda":
        return dict(USE_DOT=m > 1, BLOCK_M=1 if m == 1 else 16, BLOCK_N=16, BLOCK_K=64,
                    num_warps=4, num_stages=1)
    if m == 1:
        return dict(USE_DOT=False, BLOCK_M=1, BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=4)
    return dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=4)


def w8a16(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
          bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ (scale * q).T: q int8 [N, K], scale float16 [N]."""
    rows, (n, k) = x.shape[0], q.shape
    if rows > MAX_ROWS or x.stride(-1) != 1:
        raise ValueError(f"W8A16 takes <= {MAX_ROWS} unit-stride rows")
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if rows:
        cfg = _config(rows, x.device)
        _quant_linear_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
            x, q, scale, bias if bias is not None else scale, y, rows, n, x.stride(0), y.stride(0),
            K=k, HAS_BIAS=bias is not None, INTERPRET=INTERPRETED, **cfg)
    return y
