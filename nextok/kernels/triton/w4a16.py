"""W4A16 for decode-sized steps: y [M, N] = x [M, K] @ W.T (+ bias), M <= MAX_ROWS, with W in
4 bits, read once per step and dequantized on the way into tensor-core matmuls.

Weight layout (quant/int4.py, Int4Linear): `nibbles` uint8 [N, K / 2], byte t of a row holding
column t in its low nibble and column K / 2 + t in its high one (two planes, so either plane's
x is a contiguous slice); per row and group of GROUP columns a scale d and a min m, float16
[N, K / GROUP]: W = d * q + m. K / 2 must be a whole number of groups.

Why this shape of kernel. At batch 1 an 8B step streams ~4 GB of nibbles at ~4 TB/s: ~8 * 10^12
weights a second, with an H200 SM issuing 128 instructions a clock, so ~3 instructions per weight
at most, and converting integers to floats (16 a clock) is out. A first kernel that dequantized
to float32 and multiplied on CUDA cores reached 1.2 TB/s (benchmarks/results/
2026-12-04-w4a16-probe-h200-cuda-cores.json). Here each byte becomes two bfloat16 by bit tricks
(PTX, four bytes at a time): prmt spreads two bytes into the halves of a register and one lop3
per nibble plane makes (nibble | 0x4300), the bfloat16 128 + q, exactly (float16: 0x6400, 1024 + q);
so ~1 integer instruction per weight, and tensor cores (tl.dot, x's rows padded to 16) do the
multiplying. Per tile (inside one group): d sum_k x (128 + q) + (m - 128 d) sum_k x.

One program: BLOCK_N rows of W, all of K in tiles of TB bytes per row, for all M rows of x.
Triton's interpreter has no PTX: there the same values come from integer ops and float32.
"""
from __future__ import annotations

import functools
import json
import os

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from nextok.kernels.triton import pdl
from nextok.kernels.triton.pdl import pdl_wait

MAX_ROWS = 16


# Four bytes -> their low nibbles and their high nibbles as bfloat16 128 + q (or float16
# 1024 + q: 0x6400), two to a register.
_ASM_BF16 = """
{
.reg .b32 t0, t1, u0, u1;
prmt.b32 t0, $4, 0, 0x4140;
prmt.b32 t1, $4, 0, 0x4342;
lop3.b32 $0, t0, 0x000F000F, 0x43004300, 0xEA;
lop3.b32 $1, t1, 0x000F000F, 0x43004300, 0xEA;
shr.b32 u0, t0, 4;
shr.b32 u1, t1, 4;
lop3.b32 $2, u0, 0x000F000F, 0x43004300, 0xEA;
lop3.b32 $3, u1, 0x000F000F, 0x43004300, 0xEA;
}
"""


_NIBBLES_TO_BF16 = tl.constexpr(_ASM_BF16)  # (a jitted function reads only constexpr globals)
_NIBBLES_TO_FP16 = tl.constexpr(_ASM_BF16.replace("0x43004300", "0x64006400"))


@triton.jit
def _planes(b, FP16: tl.constexpr, INTERPRET: tl.constexpr):
    # b uint8 [BLOCK_N, TB] -> (OFFSET + low nibbles, OFFSET + high nibbles) in x's half type
    # (OFFSET: 1024 for float16, 128 for bfloat16); float32 in the interpreter (whose tl.dot
    # multiplies bfloat16's raw bits)
    if INTERPRET:
        lo = (b & 0xF).to(tl.float32) + (1024.0 if FP16 else 128.0)
        hi = (b >> 4).to(tl.float32) + (1024.0 if FP16 else 128.0)
    elif FP16:
        lo, hi = tl.inline_asm_elementwise(_NIBBLES_TO_FP16, "=r,=r,=r,=r,r", [b],
                                           dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    else:
        lo, hi = tl.inline_asm_elementwise(_NIBBLES_TO_BF16, "=r,=r,=r,=r,r", [b],
                                           dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    return lo, hi


@triton.jit
def _w4a16_kernel(x_ptr, w_ptr, d_ptr, m_ptr, b_ptr, y_ptr, M, N, KH, G, s_xm, s_ym,
                  GROUP: tl.constexpr, TB: tl.constexpr, HAS_BIAS: tl.constexpr, FP16: tl.constexpr,
                  BLOCK_N: tl.constexpr, PDL: tl.constexpr, INTERPRET: tl.constexpr,
                  KH_INTERPRET: tl.constexpr):
    # Grid (cdiv(N, BLOCK_N),). x [M, 2 KH] unit-stride rows; nibbles [N, KH]; d, m [N, G];
    # y [M, N]. A tile: TB bytes of BLOCK_N rows = columns k0 .. k0 + TB (low nibbles, group
    # k0 / GROUP) and KH + k0 .. (high nibbles, group (KH + k0) / GROUP). KH is a runtime
    # argument; the interpreter cannot loop to one, so there the loop runs to KH_INTERPRET.
    pdl_wait(PDL)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rows = tl.arange(0, 16)
    row_ok = rows < M
    t = tl.arange(0, TB)
    acc = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, KH_INTERPRET if INTERPRET else KH, TB):
        b = tl.load(w_ptr + n[:, None] * KH + (k0 + t)[None, :], mask=n_ok[:, None], other=0)
        lo, hi = _planes(b, FP16, INTERPRET)
        x_mask = row_ok[:, None] & (k0 + t < KH)[None, :]
        x_lo = tl.load(x_ptr + rows[:, None] * s_xm + (k0 + t)[None, :], mask=x_mask, other=0.0)
        x_hi = tl.load(x_ptr + rows[:, None] * s_xm + (KH + k0 + t)[None, :], mask=x_mask, other=0.0)
        g_lo = k0 // GROUP
        g_hi = (KH + k0) // GROUP
        d_lo = tl.load(d_ptr + n * G + g_lo, mask=n_ok, other=0.0).to(tl.float32)
        d_hi = tl.load(d_ptr + n * G + g_hi, mask=n_ok, other=0.0).to(tl.float32)
        m_lo = tl.load(m_ptr + n * G + g_lo, mask=n_ok, other=0.0).to(tl.float32)
        m_hi = tl.load(m_ptr + n * G + g_hi, mask=n_ok, other=0.0).to(tl.float32)
        if INTERPRET:
            dot_lo = tl.dot(x_lo.to(tl.float32), tl.trans(lo), input_precision="ieee")
            dot_hi = tl.dot(x_hi.to(tl.float32), tl.trans(hi), input_precision="ieee")
        else:  # x already in lo's type: bfloat16 or float16
            dot_lo = tl.dot(x_lo, tl.trans(lo))
            dot_hi = tl.dot(x_hi, tl.trans(hi))
        sx_lo = tl.sum(x_lo.to(tl.float32), axis=1)  # [16]
        sx_hi = tl.sum(x_hi.to(tl.float32), axis=1)
        OFFSET: tl.constexpr = 1024.0 if FP16 else 128.0
        acc += dot_lo * d_lo[None, :] + sx_lo[:, None] * (m_lo - OFFSET * d_lo)[None, :]
        acc += dot_hi * d_hi[None, :] + sx_hi[:, None] * (m_hi - OFFSET * d_hi)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * s_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & n_ok[None, :])


INTERPRETED = not isinstance(_w4a16_kernel, JITFunction)
_OVERRIDE: dict | None = None  # benchmarks/gpu/w4a16_probe.py sets tiles to sweep them
# Tuned tiles per GPU: {"<N>x<K>": {"1": tile, "16": tile}} (tile: BLOCK_N, TB bytes per row per
# tile, num_warps, num_stages; "1": one row, "16": more), written by
# benchmarks/gpu/w4a16_probe.py. NEXTOK_W4A16_CONFIGS names another table (the probe's own run).
CONFIG_DIR = os.path.join(os.path.dirname(__file__), "configs")


def set_config(cfg: dict | None) -> None:
    global _OVERRIDE
    _OVERRIDE = cfg


@functools.cache
def _tuned(device_name: str) -> dict:
    path = os.environ.get("NEXTOK_W4A16_CONFIGS") or os.path.join(
        CONFIG_DIR, "w4a16_" + device_name.replace("NVIDIA ", "").replace(" ", "_").lower() + ".json")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _tile(tile: dict, group: int) -> dict:
    return dict(BLOCK_N=tile["BLOCK_N"], TB=min(tile["TB"], group), num_warps=tile["num_warps"],
                num_stages=tile["num_stages"])


def _config(m: int, n: int, k: int, group: int, device: torch.device) -> dict:
    """Tiles: tuned per shape where the GPU has a table (configs/), else a default."""
    if device.type != "cuda":  # the interpreter: small tiles
        return dict(BLOCK_N=16, TB=min(32, group), num_warps=4, num_stages=1)
    if _OVERRIDE is not None:
        return _tile(_OVERRIDE, group)
    tuned = _tuned(torch.cuda.get_device_name(device)).get(f"{n}x{k}", {}).get("1" if m == 1 else "16")
    if tuned:
        return _tile(tuned, group)
    return _tile(dict(BLOCK_N=32, TB=64, num_warps=4, num_stages=3), group)


def supports(k: int, group: int) -> bool:
    """Shapes the kernel takes: each nibble plane (K / 2 columns) whole groups of a power of
    two >= 32 (a tile, a power of two too, stays inside one group)."""
    return group >= 32 and group & (group - 1) == 0 and (k // 2) % group == 0 and k % 2 == 0


def w4a16(x: torch.Tensor, nibbles: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
          bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ (d * q + m).T (+ bias): nibbles uint8 [N, K / 2] in two planes, d and m
    float16 [N, G]."""
    rows, k = x.shape
    n, kh = nibbles.shape
    group = k // d.shape[1] if d.shape[1] else 0
    if x.is_cuda and x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"W4A16 on CUDA takes bfloat16 or float16 rows (its tensor-core "
                         f"products are bfloat16), not {x.dtype}")
    if rows > MAX_ROWS or x.stride(-1) != 1 or k != 2 * kh or not supports(k, group):
        raise ValueError(f"W4A16 takes <= {MAX_ROWS} unit-stride rows of K = 2 x bytes, each "
                         f"half whole groups of a power of two >= 32; got x {list(x.shape)}, "
                         f"nibbles {list(nibbles.shape)}, {d.shape[1]} groups")
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if rows:
        cfg = _config(rows, n, k, group, x.device)
        use_pdl = pdl.enabled(x.device)
        _w4a16_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
            x, nibbles, d, m, bias if bias is not None else d, y, rows, n, kh, d.shape[1],
            x.stride(0), y.stride(0), GROUP=group, HAS_BIAS=bias is not None,
            FP16=x.dtype == torch.float16, PDL=use_pdl,
            INTERPRET=INTERPRETED, KH_INTERPRET=kh if INTERPRETED else 0, launch_pdl=use_pdl, **cfg)
    return y
