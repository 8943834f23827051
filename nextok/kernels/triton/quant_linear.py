"""Weight-only quantized matmuls for decode-sized steps: W4A16 and W8A16 Triton kernels that
dequantize in registers, so each step reads the packed weights once (a quarter or a half of
bf16's bytes) instead of a dequantized copy.

y [M, N] = x [M, K] @ W.T (+ bias), M <= MAX_ROWS, with W held as
- 4 bits (BITS=4): nibbles uint8 [N, K / 2] in GGUF Q4_1's order (per 32 columns, byte j holds
  column j in its low nibble and column j + 16 in its high one), and per row and group of GROUP
  columns d and m float16 [N, K / GROUP]: W = d * q + m (quant/int4.py);
- 8 bits (BITS=8): q int8 [N, K] and one scale float16 [N] per row: W = scale * q (quant/int8.py).
The 4-bit weight is dequantized in float32 and rounded to x's dtype, as Int4Linear's torch path
rounds it, so both multiply the same matrix. A K tile never crosses a group (BLOCK_K divides
GROUP), so each tile takes one d and m per row.

One program: BLOCK_N rows of W, all of K, for all M rows of x. One row of x: multiply and sum on
CUDA cores; more: tl.dot with the rows padded to 16. Bigger steps (prefill) dequantize the
whole weight once and call cuBLAS (quant/int4.py, quant/int8.py).

Measured on the H200 (benchmarks/gpu/quant_linear_probe.py, 2026-12-04): correct, but not yet
fast. One 8B layer at batch 1 takes 268 us in W4A16 and 251 us in W8A16, against 146 us for
bf16 cuBLAS. Each program moves too few bytes per iteration (a [16, 64]-byte nibble tile) for
the memory system; larger tiles, split-K for the narrow matrices, and a tuned config per shape
come next. It still beats the path it replaced, which converted the whole weight on every call.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

MAX_ROWS = 16


@triton.jit
def _dot(acc, a, w, USE_DOT: tl.constexpr, INTERPRET: tl.constexpr):
    # a: [BLOCK_M, BK] in x's dtype; w: [BLOCK_N, BK] float32 rounded to x's dtype. One return:
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
def _quant_linear_kernel(x_ptr, q_ptr, d_ptr, m_ptr, b_ptr, y_ptr, M, N, s_xm, s_ym,
                         K: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr,
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
    if BITS == 8:
        scale = tl.load(d_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if BITS == 4:
            # Columns of this tile's low and high nibbles: per 32 columns, j and j + 16.
            c_lo = k0 + (t // 16) * 32 + t % 16
            w_mask = n_ok[:, None] & (c_lo < K)[None, :]
            byte = tl.load(q_ptr + n[:, None] * (K // 2) + (k0 // 2 + t)[None, :], mask=w_mask, other=0)
            g = k0 // GROUP
            d = tl.load(d_ptr + n * (K // GROUP) + g, mask=n_ok, other=0.0).to(tl.float32)[:, None]
            m = tl.load(m_ptr + n * (K // GROUP) + g, mask=n_ok, other=0.0).to(tl.float32)[:, None]
            w_lo = (byte & 0xF).to(tl.float32) * d + m
            w_hi = (byte >> 4).to(tl.float32) * d + m
            c_hi = c_lo + 16
        else:
            c_lo = k0 + t  # the tile's two halves, so both widths share the code below
            c_hi = c_lo + HALF
            w_mask = n_ok[:, None] & (c_lo < K)[None, :]
            w_lo = tl.load(q_ptr + n[:, None] * K + c_lo[None, :], mask=w_mask, other=0).to(tl.float32)
            w_hi = tl.load(q_ptr + n[:, None] * K + c_hi[None, :], mask=n_ok[:, None] & (c_hi < K)[None, :],
                           other=0).to(tl.float32)
        x_lo = tl.load(x_ptr + rows[:, None] * s_xm + c_lo[None, :], mask=row_ok[:, None] & (c_lo < K)[None, :],
                       other=0.0)
        x_hi = tl.load(x_ptr + rows[:, None] * s_xm + c_hi[None, :], mask=row_ok[:, None] & (c_hi < K)[None, :],
                       other=0.0)
        dt = x_lo.dtype
        if BITS == 4:  # the dequantized weight, rounded as the torch path's .to(x.dtype)
            w_lo = w_lo.to(dt).to(tl.float32)
            w_hi = w_hi.to(dt).to(tl.float32)
        acc = _dot(acc, x_lo, w_lo, USE_DOT, INTERPRET)
        acc = _dot(acc, x_hi, w_hi, USE_DOT, INTERPRET)
    if not USE_DOT:
        acc = tl.sum(acc, axis=1)[None, :]  # [1, BLOCK_N]
    if BITS == 8:
        acc = acc * scale[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * s_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & n_ok[None, :])


INTERPRETED = not isinstance(_quant_linear_kernel, JITFunction)


def _config(m: int, group: int, device: torch.device) -> dict:
    block_k = 256 if device.type == "cuda" else 64
    while group % block_k:  # a power of two that divides the group (a multiple of 32)
        block_k //= 2
    if device.type != "cuda":
        return dict(USE_DOT=m > 1, BLOCK_M=1 if m == 1 else 16, BLOCK_N=16, BLOCK_K=block_k,
                    num_warps=4, num_stages=1)
    if m == 1:
        return dict(USE_DOT=False, BLOCK_M=1, BLOCK_N=16, BLOCK_K=block_k, num_warps=4, num_stages=4)
    return dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=32, BLOCK_K=block_k, num_warps=4, num_stages=4)


def _launch(x, q, d, m, bias, n: int, k: int, group: int, bits: int) -> torch.Tensor:
    rows = x.shape[0]
    if rows > MAX_ROWS or x.stride(-1) != 1:
        raise ValueError(f"quantized GEMV takes <= {MAX_ROWS} unit-stride rows")
    if bits == 4 and (k % 32 or group % 32 or k % group):
        raise ValueError(f"W4A16 needs K ({k}) and the group ({group}) in multiples of 32")
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if rows:
        cfg = _config(rows, group, x.device)
        _quant_linear_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
            x, q, d, m, bias if bias is not None else d, y, rows, n, x.stride(0), y.stride(0),
            K=k, GROUP=group, BITS=bits, HAS_BIAS=bias is not None, INTERPRET=INTERPRETED, **cfg)
    return y


def w4a16(x: torch.Tensor, nibbles: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
          bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ (d * q + m).T: nibbles uint8 [N, K / 2] (Q4_1 order), d, m float16 [N, G]."""
    n, half = nibbles.shape
    return _launch(x, nibbles, d, m, bias, n, 2 * half, 2 * half // d.shape[1], 4)


def w8a16(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
          bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ (scale * q).T: q int8 [N, K], scale float16 [N]."""
    n, k = q.shape
    return _launch(x, q, scale, scale, bias, n, k, 256, 8)  # (no groups: 256 sets the tile)
