"""The end of a W4A16 kernel whose K is split over SPLIT programs (w4a16.py, w4a16_dot.py): each
program leaves its float32 sums in `part` [SPLIT, M, N], and the last of a tile's programs to
finish (a per-tile count, zeros between calls) adds them in split order and writes y. With SPLIT
1 the program writes y itself.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def store_split_k(out, part_ptr, count_ptr, b_ptr, y_ptr, rows, row_ok, n, n_ok, M, N, s_ym, split,
                  counter, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    # out [BLOCK_M, BLOCK_N] float32: this program's sums for y[rows, n]; counter: its tile's count
    ym = rows[:, None] * s_ym + n[None, :]
    y_ok = row_ok[:, None] & n_ok[None, :]
    if SPLIT > 1:
        pm = (split * M + rows[:, None]) * N + n[None, :]
        tl.store(part_ptr + pm, out, mask=y_ok)
        tl.debug_barrier()  # every lane's sums stored before the count says so
        done = tl.atomic_add(count_ptr + counter, 1, sem="acq_rel", scope="gpu")
        if done == SPLIT - 1:
            out = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k in tl.static_range(SPLIT):  # .cg: from L2, not a stale L1 line of a past call
                pk = (k * M + rows[:, None]) * N + n[None, :]
                out += tl.load(part_ptr + pk, mask=y_ok, other=0.0, cache_modifier=".cg")
            tl.store(count_ptr + counter, 0)
            if HAS_BIAS:
                out += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptr + ym, out.to(y_ptr.dtype.element_ty), mask=y_ok)
    else:
        if HAS_BIAS:
            out += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + ym, out.to(y_ptr.dtype.element_ty), mask=y_ok)
