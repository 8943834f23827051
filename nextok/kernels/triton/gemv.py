"""Decode-sized matmuls (1-8 rows) as a Triton GEMV: y [M, N] = x [M, K] @ W[N, K].T (+ bias).

Why not cuBLAS: on an H200 cuBLAS splits two of the four GEMMs of each Llama-3.1-8B layer along
K at batch 1 and adds a reduce launch for each (64 launches, ~0.1 ms of a 4.6 ms step), and its
kernels cannot take part in programmatic dependent launch (kernels/triton/pdl.py). This kernel
reads BLOCK_N rows of W, all of K, once for every row of x, with no split. (A first version
that loaded the next weight tile by hand, into registers, ahead of the PDL wait and of each
multiply, with one tile size for all shapes, made the captured step slower: 4.80 / 6.25 ms at
batch 1 / 8 against this plain loop's 4.41 / 4.65; 2026-12-04-pdl-probe-h200-llama-8b-first-gemv.json.)

One row: a multiply and sum on CUDA cores; more rows: tl.dot with the rows padded to 16. Tile
sizes from benchmarks/gpu/gemv_probe.py on an H200 at the 8B shapes
(benchmarks/results/2026-12-04-gemv-probe-h200.json). In the captured 8B decode step
(2026-12-04-pdl-probe-h200-llama-8b.json, device-only, ms per step at batch 1 / 8):
cuBLAS 4.67 / 4.79, cuBLAS + PDL 4.59 / 4.90, GEMV 4.41 / 4.65, GEMV + PDL 4.25 / 4.68.
NEXTOK_TRITON_GEMV=0 sends every step to cuBLAS.
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
def _tile(acc, a, w, USE_DOT: tl.constexpr, IEEE: tl.constexpr):
    # acc += a [BLOCK_M, BLOCK_K] @ w [BLOCK_N, BLOCK_K].T; without tl.dot acc is [BLOCK_N,
    # BLOCK_K] of per-lane partial sums (one row of a), reduced once at the end.
    if USE_DOT:
        if IEEE:  # float32 (or the interpreter, whose tl.dot multiplies bfloat16's raw bits)
            acc += tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(a, tl.trans(w))
    else:
        acc += w.to(tl.float32) * a.to(tl.float32)
    return acc


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, s_xm, s_wn, s_ym,
                 HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PDL: tl.constexpr, IEEE: tl.constexpr, INTERPRET: tl.constexpr,
                 K_INTERPRET: tl.constexpr):
    # Grid (cdiv(N, BLOCK_N),). x: [M, K] rows unit-stride; W: [N, K]; y: [M, N].
    # K is a runtime argument (as in the probe whose speed the tiles come from); the interpreter
    # cannot loop to a runtime argument, so there the loop runs to K_INTERPRET (= K).
    pdl_wait(PDL)
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:  # BLOCK_M == 1: per-lane partial sums, reduced once at the end
        part = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K_INTERPRET if INTERPRET else K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + n[:, None] * s_wn + k[None, :], mask=n_ok[:, None] & (k < K)[None, :],
                    other=0.0)
        if USE_DOT:
            a = tl.load(x_ptr + rows[:, None] * s_xm + k[None, :],
                        mask=row_ok[:, None] & (k < K)[None, :], other=0.0)
            if IEEE:  # float32 (or the interpreter, whose tl.dot multiplies bfloat16's raw bits)
                acc += tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(a, tl.trans(w))
        else:
            a = tl.load(x_ptr + k, mask=k < K, other=0.0)
            part += w.to(tl.float32) * a.to(tl.float32)[None, :]
    if not USE_DOT:
        acc = tl.sum(part, axis=1)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * s_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & n_ok[None, :])


INTERPRETED = not isinstance(_gemv_kernel, JITFunction)


def _config(m: int, n: int, k: int, device: torch.device) -> dict:
    """Tiles per shape class, the fastest of benchmarks/gpu/gemv_probe.py's sweep on an H200 at
    the Llama-3.1-8B shapes: long K (down_proj), wide N (gate_up, lm_head), N > K (qkv), o_proj."""
    if device.type != "cuda":  # the interpreter: small tiles, few programs' worth of work
        return dict(USE_DOT=m > 1, BLOCK_M=1 if m == 1 else 16, BLOCK_N=16, BLOCK_K=32,
                    num_warps=4, num_stages=1)
    dot = dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=32, num_warps=4)
    one = dict(USE_DOT=False, BLOCK_M=1)
    if k > 8192:
        return dict(dot, BLOCK_K=512, num_stages=4)
    if n >= 16384:
        return (dict(one, BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=3) if m == 1
                else dict(dot, BLOCK_K=128, num_stages=3))
    if n > k:
        return (dict(one, BLOCK_N=32, BLOCK_K=256, num_warps=8, num_stages=4) if m == 1
                else dict(dot, BLOCK_K=256, num_stages=4))
    return (dict(one, BLOCK_N=16, BLOCK_K=512, num_warps=8, num_stages=4) if m == 1
            else dict(dot, BLOCK_K=256, num_stages=3))


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [M, N] = x [M, K] @ weight[N, K].T + bias; M <= MAX_ROWS, x rows unit-stride, weight
    contiguous, y in x's dtype."""
    m, (n, k) = x.shape[0], weight.shape
    if m > MAX_ROWS or x.dim() != 2 or x.stride(-1) != 1 or weight.stride() != (k, 1) or x.shape[1] != k:
        raise ValueError(f"gemv takes <= {MAX_ROWS} unit-stride rows of {k} and a contiguous "
                         f"weight, not x {list(x.shape)} and weight {list(weight.shape)}")
    if x.is_cuda and x.dtype not in (torch.bfloat16, torch.float16):
        # float32 on the GPU is for checks and goes to cuBLAS (ops.linear); this kernel's
        # float32 tl.dot was not exact enough at K = 14336 on an H200
        raise ValueError(f"gemv on CUDA takes bfloat16 or float16, not {x.dtype}")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m:
        cfg = _config(m, n, k, x.device)
        use_pdl = pdl.enabled(x.device)
        _gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
            x, weight, bias if bias is not None else weight, y, m, n, k, x.stride(0), k, y.stride(0),
            HAS_BIAS=bias is not None, PDL=use_pdl,
            IEEE=INTERPRETED or x.dtype == torch.float32, INTERPRET=INTERPRETED,
            K_INTERPRET=k if INTERPRETED else 0,
            launch_pdl=use_pdl, **cfg)
    return y
