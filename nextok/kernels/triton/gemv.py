"""Decode-sized matmuls (1-8 rows) as Triton GEMV kernels, with the elementwise op before them
fused in: fewer launches for a decode step, which at batch 1 is bound by launches as well as by
the weight bytes.

y [M, N] = a [M, K] @ W[N, K].T (+ bias), where a is, by PROLOGUE:
- 0: x itself;
- 1 (silu_mul): silu(gate) * up of x = gate_up [M, 2K], the SwiGLU's down_proj input;
- 2 (add_rms_norm): rms_norm(x + residual) * norm_weight. Every program takes the row
  statistics itself (a first pass over the [M, K] rows, from L2) and program 0 writes x +
  residual to residual_out, the layer's new residual stream.
The prologues round where the unfused ops round (kernels/ref.py), so the activations the matmul
sees are those of kernels/triton/fused.py bit for bit, up to the norm's summation order.

One program reads BLOCK_N rows of W once, all of K, for every row of a (M <= 8 here): each weight
byte is read once per step, and no split along K (cuBLAS splits some decode GEMMs on an H200
and adds a reduce launch for each). One row: a multiply and sum on CUDA cores; more rows:
tl.dot with the rows padded to 16. Configurations from benchmarks/gpu/gemv_probe.py on an H200
at the Llama-3.1-8B shapes (2026-12-04-gemv-probe-h200.json): at or above cuBLAS everywhere.
K is a compile-time constant (a model has three: hidden, q heads x head_dim, intermediate).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from nextok.kernels.triton.fused import _round

MAX_ROWS = 8  # above this cuBLAS's tiled GEMMs win


@triton.jit
def _activation(x_ptr, res_ptr, nw_ptr, rows, k, mask, s_xm, s_rm, rstd, K: tl.constexpr,
                PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr, dt: tl.constexpr):
    # The [BLOCK_M, BLOCK_K] tile of a, float32, rounded to dt as the unfused ops round it.
    if PROLOGUE == 1:
        g = tl.load(x_ptr + rows[:, None] * s_xm + k[None, :], mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + rows[:, None] * s_xm + K + k[None, :], mask=mask, other=0.0).to(tl.float32)
        return _round(_round(g / (1.0 + tl.exp(-g)), dt) * u, dt)
    a = tl.load(x_ptr + rows[:, None] * s_xm + k[None, :], mask=mask, other=0.0).to(tl.float32)
    if PROLOGUE == 2:
        if HAS_RES:
            r = tl.load(res_ptr + rows[:, None] * s_rm + k[None, :], mask=mask, other=0.0)
            a = _round(a + r.to(tl.float32), dt)
        w = tl.load(nw_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        a = _round(_round(a * rstd[:, None], dt) * w[None, :], dt)
    return a


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, res_ptr, res_out_ptr, nw_ptr, eps, M, N,
                 s_xm, s_rm, s_wn, s_ym,
                 K: tl.constexpr, PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr,
                 HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr):
    # Grid (cdiv(N, BLOCK_N),). x: [M, K] ([M, 2K] for PROLOGUE 1); W: [N, K]; y: [M, N].
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    dt: tl.constexpr = w_ptr.dtype.element_ty
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if PROLOGUE == 2:  # the rows' statistics, and program 0 writes the new residual
        ss = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            mask = row_ok[:, None] & (k < K)[None, :]
            h = tl.load(x_ptr + rows[:, None] * s_xm + k[None, :], mask=mask, other=0.0).to(tl.float32)
            if HAS_RES:
                r = tl.load(res_ptr + rows[:, None] * s_rm + k[None, :], mask=mask, other=0.0)
                h = _round(h + r.to(tl.float32), dt)
                tl.store(res_out_ptr + rows[:, None] * K + k[None, :], h.to(dt), mask=mask & (pid == 0))
            ss += tl.sum(h * h, axis=1)
        rstd = tl.rsqrt(ss / K + eps)
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:  # BLOCK_M == 1: per-lane partial sums, reduced once at the end
        part = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(w_ptr + n[:, None] * s_wn + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        a = _activation(x_ptr, res_ptr, nw_ptr, rows, k, row_ok[:, None] & k_ok[None, :], s_xm, s_rm,
                        rstd, K, PROLOGUE, HAS_RES, dt)
        if USE_DOT:
            if INTERPRET:  # the interpreter's tl.dot multiplies bfloat16's raw bits
                acc += tl.dot(a, tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(a.to(dt), tl.trans(w), input_precision="ieee")
        else:
            part += w.to(tl.float32) * a  # [BLOCK_N, BLOCK_K] * [1, BLOCK_K]
    if not USE_DOT:
        acc = tl.sum(part, axis=1)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * s_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & n_ok[None, :])


INTERPRETED = not isinstance(_gemv_kernel, JITFunction)


def _config(m: int, device: torch.device) -> dict:
    if device.type != "cuda":  # the interpreter: small tiles, few programs' worth of work
        return dict(USE_DOT=m > 1, BLOCK_M=1 if m == 1 else 16, BLOCK_N=16, BLOCK_K=32,
                    num_warps=4, num_stages=1)
    if m == 1:
        return dict(USE_DOT=False, BLOCK_M=1, BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=4)
    return dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=4)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         prologue: str | None = None, residual: torch.Tensor | None = None,
         norm_weight: torch.Tensor | None = None, eps: float = 0.0
         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y [M, N], new residual or None). x: [M, K] ([M, 2K] for "silu_mul"), M <= MAX_ROWS,
    rows unit-stride; weight [N, K] contiguous; prologue None, "silu_mul" or "add_rms_norm".
    With "add_rms_norm" the new residual is x + residual (a new tensor), or x without one."""
    m, n = x.shape[0], weight.shape[0]
    k = weight.shape[1]
    if m > MAX_ROWS or x.stride(-1) != 1 or weight.stride() != (k, 1):
        raise ValueError(f"gemv takes <= {MAX_ROWS} unit-stride rows and a contiguous weight")
    code = {None: 0, "silu_mul": 1, "add_rms_norm": 2}[prologue]
    if x.shape[1] != (2 * k if code == 1 else k):
        raise ValueError(f"gemv: x has {x.shape[1]} columns for a weight of {k}")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    has_res = code == 2 and residual is not None
    res_out = torch.empty(m, k, dtype=x.dtype, device=x.device) if has_res else x
    res = residual if has_res else x
    if has_res and res.stride(-1) != 1:
        res = res.contiguous()
    cfg = _config(m, x.device)
    if m:
        _gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
            x, weight, bias if bias is not None else weight, y, res, res_out,
            norm_weight if norm_weight is not None else weight, eps, m, n,
            x.stride(0), res.stride(0), weight.stride(0), y.stride(0),
            K=k, PROLOGUE=code, HAS_RES=has_res, HAS_BIAS=bias is not None,
            INTERPRET=INTERPRETED, **cfg)
    return y, (res_out if code == 2 else None)
