"""Decode-sized matmuls (1-8 rows) as a Triton GEMV: y [M, N] = x [M, K] @ W[N, K].T (+ bias).

Why not cuBLAS: on an H200 cuBLAS splits two of the four GEMMs of each Llama-3.1-8B layer along
K at batch 1 and adds a reduce launch for each (64 launches, ~0.1 ms of a 4.6 ms step), and its
kernels cannot take part in programmatic dependent launch (kernels/triton/pdl.py). This kernel
reads BLOCK_N rows of W, all of K, once for every row of x, with no split, and loads its first
weight tile before it waits for x: the weights depend on no earlier kernel.

One row: a multiply and sum on CUDA cores; more rows: tl.dot with the rows padded to 16. Tile
sizes from benchmarks/gpu/gemv_probe.py on an H200 at the 8B shapes
(benchmarks/results/2026-12-04-gemv-probe-h200.json): equal to or faster than cuBLAS at each.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from nextok.kernels.triton import pdl
from nextok.kernels.triton.pdl import pdl_wait

MAX_ROWS = 8  # above this cuBLAS's tiled GEMMs win


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, s_xm, s_wn, s_ym,
                 K: tl.constexpr, HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PDL: tl.constexpr, INTERPRET: tl.constexpr):
    # Grid (cdiv(N, BLOCK_N),). x: [M, K] rows unit-stride; W: [N, K]; y: [M, N].
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + n[:, None] * s_wn + k[None, :]
    w = tl.load(w_ptrs, mask=n_ok[:, None] & (k < K)[None, :], other=0.0)  # before the wait
    pdl_wait(PDL)
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:  # BLOCK_M == 1: per-lane partial sums, reduced once at the end
        part = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + k
        a = tl.load(x_ptr + rows[:, None] * s_xm + kk[None, :],
                    mask=row_ok[:, None] & (kk < K)[None, :], other=0.0)
        # the next tile's weights, while this one is multiplied
        w_next = tl.load(w_ptrs + (k0 + BLOCK_K), mask=n_ok[:, None] & (kk + BLOCK_K < K)[None, :],
                         other=0.0)
        if USE_DOT:
            if INTERPRET:  # the interpreter's tl.dot multiplies bfloat16's raw bits
                acc += tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(a, tl.trans(w))
        else:
            part += w.to(tl.float32) * a.to(tl.float32)  # [BLOCK_N, BLOCK_K] * [1, BLOCK_K]
        w = w_next
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
        return dict(USE_DOT=False, BLOCK_M=1, BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=3)
    return dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=3)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [M, N] = x [M, K] @ weight[N, K].T + bias; M <= MAX_ROWS, x rows unit-stride, weight
    contiguous, y in x's dtype."""
    m, (n, k) = x.shape[0], weight.shape
    if m > MAX_ROWS or x.dim() != 2 or x.stride(-1) != 1 or weight.stride() != (k, 1) or x.shape[1] != k:
        raise ValueError(f"gemv takes <= {MAX_ROWS} unit-stride rows of {k} and a contiguous "
                         f"weight, not x {list(x.shape)} and weight {list(weight.shape)}")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m:
        cfg = _config(m, x.device)
        use_pdl = pdl.enabled(x.device)
        _gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
            x, weight, bias if bias is not None else weight, y, m, n, x.stride(0), k, y.stride(0),
            K=k, HAS_BIAS=bias is not None, PDL=use_pdl, INTERPRET=INTERPRETED,
            launch_pdl=use_pdl, **cfg)
    return y
