"""W8A16 for decode-sized steps: y [M, N] = x [M, K] @ W.T (+ bias), M <= MAX_ROWS, with W held as
q int8 [N, K] and float16 scales: one per row, W = scale * q (quant/int8.py), or one per GROUP
columns of a row with an optional min, W = d * q + m (GGUF Q8_0, Q5_*, Q6_K on CUDA:
quant/gguf_cuda.py). (W4A16 has its own kernels: kernels/triton/w4a16.py.)

Per-row scales come out of the sum, y[:, n] = scale[n] * (x @ q[n]), so the loop multiplies by
q itself: an int8 is exact in bfloat16 and float16, and turning it into x's dtype is the whole
dequantization. Group scales cannot: each tile [BLOCK_N, BK] is dequantized in float32 (one
multiply-add a weight, BK a multiple of GROUP) and rounded to x's dtype once.

A program takes BLOCK_M rows of x, BLOCK_N rows of W and a SPLIT-th of K (the grid and the split
sums are the W4A16 kernels': split_k.py), and walks its K in tiles of BK columns.
- DOT: tl.dot on the tensor cores, rows padded to BLOCK_M (>= 16).
- Else (one row): on the CUDA cores, a [BLOCK_N, BK] float32 sum of products per lane, reduced
  once at the end.

The first kernel (2026-12-04) took one program per 16 rows of W over all of K, in float32: one
8B layer at batch 1 took 251 us on an H200 against 146 us for bf16 cuBLAS, as it kept too few
bytes in flight. This one, on an H100 (2026-12-06-w8a16-h100.md; tiles: w8a16_tiles.py): one 8B
layer 92.7 / 91.3 / 133.6 / 334.1 us at 1 / 16 / 64 / 256 rows against bf16's 149.1 / 161.2 /
163.9 / 200.3 (gate_up at one row reads 2.44 TB/s); the 8B step 3.88 ms against 5.60 at batch
1, 13.9 against 11.2 at batch 256 (there the conversion, once per block of rows, is the cost).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from nextok.kernels.triton import pdl
from nextok.kernels.triton.pdl import pdl_wait
from nextok.kernels.triton.split_k import store_split_k
from nextok.kernels.triton.w4a16_dot import _dot, _in_split

MAX_ROWS = 256  # past it (prefill) quant/int8.py converts the whole weight and runs cuBLAS


@triton.jit
def _w8a16_kernel(x_ptr, q_ptr, s_ptr, m_ptr, b_ptr, y_ptr, part_ptr, count_ptr, M, N, K, s_xm, s_ym,
                  S_SN, S_SG,
                  HAS_BIAS: tl.constexpr, DOT: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr,
                  IEEE: tl.constexpr, INTERPRET: tl.constexpr, K_INTERPRET: tl.constexpr,
                  GROUP: tl.constexpr = 0, HAS_MIN: tl.constexpr = 0):
    # Grid (cdiv(N, BLOCK_N) * SPLIT * cdiv(M, BLOCK_M),). x [M, K] unit-stride rows; q [N, K]
    # int8 row-major; s [N] (GROUP 0), else s and m [N, K / GROUP], s[n, g] at n * S_SN + g * S_SG
    # (row or group order; m's strides the same); y [M, N]. K is a runtime argument: the
    # interpreter, which cannot loop to a bound made from program_id, walks all of K
    # (K_INTERPRET) masking the columns outside the program's split.
    pdl_wait(PDL)
    mb = tl.cdiv(M, BLOCK_M)
    rblock = tl.program_id(0) % mb
    split = (tl.program_id(0) // mb) % SPLIT
    tile = tl.program_id(0) // (mb * SPLIT)
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rows = rblock * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    c = tl.arange(0, BK)
    per_split = tl.cdiv(tl.cdiv(K, SPLIT), BK) * BK
    k_first = split * per_split
    k_hi = tl.minimum(k_first + per_split, K)
    # GROUP: W's tile as [BLOCK_N, GT, GROUP] (GT groups), scales [BLOCK_N, GT, 1]; the one-row
    # loop keeps that shape throughout (a reshape moves the tile through shared memory)
    G: tl.constexpr = GROUP if GROUP else BK
    GT: tl.constexpr = BK // G
    g3 = tl.arange(0, GT)[None, :, None]
    c3 = g3 * G + tl.arange(0, G)[None, None, :]  # [1, GT, G]: the tile's columns
    n3 = n[:, None, None]
    if DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    elif GROUP:
        acc = tl.zeros([BLOCK_N, GT, G], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, BK], dtype=tl.float32)
    dtype = tl.float32 if IEEE else x_ptr.dtype.element_ty
    for k0 in range(0 if INTERPRET else k_first, K_INTERPRET if INTERPRET else k_hi, BK):
        col = k0 + c  # [BK]
        col_ok = _in_split(col, k_first, k_hi, INTERPRET)
        if GROUP:  # W = d * q + m per GROUP columns, in float32
            col3 = k0 + c3
            ok3 = _in_split(col3, k_first, k_hi, INTERPRET)
            w = tl.load(q_ptr + n3 * K + col3, mask=n_ok[:, None, None] & ok3,
                        other=0)  # [BLOCK_N, GT, G] int8
            grp = k0 // G + g3  # [1, GT, 1]; K is a multiple of GROUP
            g_ok = n_ok[:, None, None] & (grp < K // G)
            g_at = n3 * S_SN + grp * S_SG
            wf = w.to(tl.float32) * tl.load(s_ptr + g_at, mask=g_ok, other=0.0).to(tl.float32)
            if HAS_MIN:  # columns outside the split meet x's zeros
                wf += tl.load(m_ptr + g_at, mask=g_ok, other=0.0).to(tl.float32)
        else:
            wf = tl.load(q_ptr + n[:, None] * K + col[None, :], mask=n_ok[:, None] & col_ok[None, :],
                         other=0)  # [BLOCK_N, BK] int8
        if DOT:
            a = tl.load(x_ptr + rows[:, None] * s_xm + col[None, :], mask=row_ok[:, None] & col_ok[None, :],
                        other=0.0)  # [BLOCK_M, BK]
            acc = _dot(acc, a, tl.reshape(wf, [BLOCK_N, BK]).to(dtype), IEEE)
        elif GROUP:
            a = tl.load(x_ptr + rblock * s_xm + col3, mask=ok3, other=0.0)  # [1, GT, G], row rblock
            acc += wf * a.to(tl.float32)
        else:
            a = tl.load(x_ptr + rblock * s_xm + col, mask=col_ok, other=0.0)  # [BK], row rblock
            acc += wf.to(tl.float32) * a.to(tl.float32)[None, :]
    if DOT:
        out = acc
    elif GROUP:
        out = tl.sum(tl.sum(acc, axis=2), axis=1)[None, :]  # [1, BLOCK_N]; BLOCK_M is 1
    else:
        out = tl.sum(acc, axis=1)[None, :]  # [1, BLOCK_N]; BLOCK_M is 1
    if not GROUP:
        out = out * tl.load(s_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    store_split_k(out, part_ptr, count_ptr, b_ptr, y_ptr, rows, row_ok, n, n_ok, M, N, s_ym, split,
                  tile * mb + rblock, SPLIT, HAS_BIAS, BLOCK_M, BLOCK_N)


INTERPRETED = not isinstance(_w8a16_kernel, JITFunction)


def w8a16(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
          bias: torch.Tensor | None = None, mins: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W.T (+ bias), q int8 [N, K]: W = scale * q with scale float16 [N], or with
    scale (and mins) float16 [N, K / G], W = scale * q + mins per G columns (G = 16 or 32), in
    row order or group order (a view of a [K / G, N'] tensor, N' >= N: quant/base.py
    scales_in_order; mins as scale)."""
    from nextok.kernels.triton import w8a16_tiles
    from nextok.kernels.triton.w4a16 import _scratch

    rows, (n, k) = x.shape[0], q.shape
    if rows > MAX_ROWS or x.stride(-1) != 1 or x.shape[1] != k or not q.is_contiguous():
        raise ValueError(f"W8A16 takes <= {MAX_ROWS} unit-stride rows of K columns and a contiguous "
                         f"int8 weight [N, K]; got x {list(x.shape)}, weight {list(q.shape)}")
    group = k // scale.shape[1] if scale.dim() == 2 else 0
    strides = scale.stride() if group else (1, 0)
    if (scale.shape[0] != n or group not in (0, 16, 32) or group * scale.shape[-1] not in (0, k)
            or not (group or scale.is_contiguous())
            or not (strides in ((1, 0), (k // max(group, 1), 1)) or (strides[0] == 1 and strides[1] >= n))
            or (mins is not None and (not group or mins.shape != scale.shape or mins.stride() != strides))):
        raise ValueError(f"W8A16 takes a scale [N] or scales (and mins) [N, K / 16 or 32] in row or "
                         f"group order; got scale {list(scale.shape)} (strides {list(scale.stride())}), "
                         f"mins {None if mins is None else list(mins.shape)} for a weight {list(q.shape)}")
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if rows:
        cfg = w8a16_tiles.config(rows, n, k, x.device, grouped=group > 0)
        cfg = dict(cfg, BK=max(cfg["BK"], group))  # whole groups a tile (BK, GROUP: powers of 2)
        tiles, mb = triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(rows, cfg["BLOCK_M"])
        part, count = _scratch(x.device, cfg["SPLIT"] * rows * n, tiles * mb)
        use_pdl = pdl.enabled(x.device)
        _w8a16_kernel[(tiles * cfg["SPLIT"] * mb,)](
            x, q, scale, scale if mins is None else mins, bias if bias is not None else scale, y, part,
            count, rows, n, k, x.stride(0), y.stride(0), *strides, HAS_BIAS=bias is not None, PDL=use_pdl,
            launch_pdl=use_pdl, IEEE=INTERPRETED or x.dtype == torch.float32, INTERPRET=INTERPRETED,
            K_INTERPRET=k if INTERPRETED else 0, GROUP=group, HAS_MIN=mins is not None, **cfg)
    return y
