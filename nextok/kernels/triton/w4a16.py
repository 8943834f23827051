"""W4A16 for decode-sized steps: y [M, N] = x [M, K] @ W.T (+ bias), M <= MAX_ROWS, with W in
4 bits, read once per step and dequantized in registers.

Weight layout (quant/int4.py, Int4Linear): `words` int32 [N, K / 8], word j of a row holds columns
8j .. 8j + 7, column 8j + i in bits 4i .. 4i + 3; per row and group of GROUP columns a scale d and
a min m, float16 [N, K / GROUP]: W = d * q + m.

Why this shape of kernel: at batch 1 an 8B step must stream ~4 GB of nibbles at ~4 TB/s, i.e.
~8 * 10^12 weights a second, and an H200 SM issues 64 integer and 128 float32 operations per clock:
two or three instructions per weight at most, and int -> float conversions (16 per clock) are out.
So each nibble becomes a float by bit tricks: (word & 0xF << s) | 0x4B000000 is the float32
2^23 + q * 2^s exactly (s = 0, 4, 8, 12: the nibble lands in the mantissa), and subtracting 2^23
leaves q * 2^s; the 2^-s goes into x, which every row of the tile shares. The upper four nibbles
take one shift per word first. Per weight: one LOP3, one FADD, one FFMA. The group's d and m
apply per word: sum_i q_i x_i * d + sum_i x_i * m.

One program: BLOCK_N rows of W, all of K in tiles of GT groups (GT * GROUP / 8 words per row),
for all M rows of x. One row: partial sums per word on CUDA cores, reduced once at the end (as
kernels/triton/gemv.py). More rows: each tile dequantized to x's dtype and multiplied with tl.dot
(the rows padded to 16), one dot per nibble position.

Measured on an H200 (2026-12-04, benchmarks/gpu/w4a16_probe.py; results
2026-12-04-w4a16-probe-h200-*.json): still far from the bytes' bound. At one row it reads the
packed bytes at ~1.2 TB/s, only 1.06-1.26x faster than bf16 per 8B layer shape, and the 8B step
is 3.93 ms against bf16's 4.17 (issue 7 asks 2.5x). Each lane gathers x for every weight it
holds (no reuse of x across rows within a thread), which costs more instructions than the
dequantization saves. A tensor-core variant (bfloat16 from nibbles by PTX lop3, tl.dot per
nibble plane) was slower (6.36 ms): tiles cannot cross a group of 128 columns, and each tile's
overhead dominated. What is left to try: x reused across rows in registers (split-K with
many rows per program), or a Marlin-style layout made for the tensor cores' operand order.
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
MAGIC = 8388608.0  # 2^23: float32 0x4B000000


@triton.jit
def _nibble(w, hi, i: tl.constexpr):
    # Column 8j + i of each word, as float32 q * 2^(4 (i % 4)); hi = w >> 16.
    SHIFT: tl.constexpr = 4 * (i % 4)
    if i < 4:
        src = w
    else:
        src = hi
    bits = (src & (0xF << SHIFT)) | 0x4B000000
    return bits.to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _w4a16_kernel(x_ptr, w_ptr, d_ptr, m_ptr, b_ptr, y_ptr, M, N, KW, G, s_xm, s_ym,
                  WPG: tl.constexpr, GT: tl.constexpr, HAS_BIAS: tl.constexpr,
                  USE_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  PDL: tl.constexpr, IEEE: tl.constexpr, INTERPRET: tl.constexpr,
                  KW_INTERPRET: tl.constexpr):
    # Grid (cdiv(N, BLOCK_N),). x [M, 8 * KW] unit-stride rows; words [N, KW]; d, m [N, G];
    # y [M, N]. A tile: [BLOCK_N, GT, WPG] words (WPG words per group). KW is a runtime
    # argument; the interpreter cannot loop to one, so there the loop runs to KW_INTERPRET.
    pdl_wait(PDL)
    TW: tl.constexpr = GT * WPG  # words per row per tile
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    n3 = n[:, None, None]
    n_ok3 = n_ok[:, None, None]
    g3 = tl.arange(0, GT)[None, :, None]
    j3 = tl.arange(0, WPG)[None, None, :]
    if USE_DOT:
        rows = tl.arange(0, BLOCK_M)
        row_ok = rows < M
        t = tl.arange(0, TW)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc3 = tl.zeros([BLOCK_N, GT, WPG], dtype=tl.float32)
    for kw0 in range(0, KW_INTERPRET if INTERPRET else KW, TW):
        word = kw0 + g3 * WPG + j3  # [1, GT, WPG]
        w_ok = word < KW
        w = tl.load(w_ptr + n3 * KW + word, mask=n_ok3 & w_ok, other=0)  # [BLOCK_N, GT, WPG]
        hi = w >> 16
        grp = kw0 // WPG + g3  # [1, GT, 1]
        g_mask = n_ok3 & (grp < G)
        d = tl.load(d_ptr + n3 * G + grp, mask=g_mask, other=0.0).to(tl.float32)  # [BLOCK_N, GT, 1]
        mn = tl.load(m_ptr + n3 * G + grp, mask=g_mask, other=0.0).to(tl.float32)
        if USE_DOT:
            for i in tl.static_range(8):
                wq = _nibble(w, hi, i) * (d * (1.0 / (1 << (4 * (i % 4))))) + mn  # W at 8 word + i
                col = (kw0 + t) * 8 + i  # [TW]
                a = tl.load(x_ptr + rows[:, None] * s_xm + col[None, :],
                            mask=row_ok[:, None] & (kw0 + t < KW)[None, :], other=0.0)
                w2 = tl.reshape(wq, [BLOCK_N, TW])
                if IEEE:  # the interpreter's tl.dot multiplies bfloat16's raw bits
                    acc += tl.dot(a.to(tl.float32), tl.trans(w2), input_precision="ieee")
                else:
                    acc += tl.dot(a, tl.trans(w2.to(a.dtype)))
        else:
            part = tl.zeros([BLOCK_N, GT, WPG], dtype=tl.float32)
            xs = tl.zeros([1, GT, WPG], dtype=tl.float32)
            for i in tl.static_range(8):
                xi = tl.load(x_ptr + word * 8 + i, mask=w_ok, other=0.0).to(tl.float32)  # [1, GT, WPG]
                xs += xi
                part += _nibble(w, hi, i) * (xi * (1.0 / (1 << (4 * (i % 4)))))
            acc3 += part * d + xs * mn
    if not USE_DOT:
        acc = tl.sum(tl.sum(acc3, axis=2), axis=1)[None, :]  # [1, BLOCK_N]
        rows = tl.arange(0, 1)
        row_ok = rows < M
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * s_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & n_ok[None, :])


INTERPRETED = not isinstance(_w4a16_kernel, JITFunction)
_OVERRIDE: dict | None = None  # benchmarks/gpu/w4a16_probe.py sets tiles to sweep them
# Tuned tiles per GPU: {"<N>x<K>": {"1": tile, "16": tile}} (tile: BLOCK_N, TW words per row per
# tile, num_warps, num_stages; "1": one row, "16": the tl.dot path), written by
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


def _tile(tile: dict, m: int, wpg: int) -> dict:
    return dict(USE_DOT=m > 1, BLOCK_M=1 if m == 1 else 16, BLOCK_N=tile["BLOCK_N"],
                GT=max(1, tile["TW"] // wpg), num_warps=tile["num_warps"], num_stages=tile["num_stages"])


def _config(m: int, n: int, k: int, group: int, device: torch.device) -> dict:
    """Tiles: tuned per shape where the GPU has a table (configs/), else a default that did well
    across the Llama-3.1-8B shapes on an H200."""
    wpg = group // 8
    if device.type != "cuda":  # the interpreter: small tiles
        return dict(USE_DOT=m > 1, BLOCK_M=1 if m == 1 else 16, BLOCK_N=16, GT=max(1, 8 // wpg),
                    num_warps=4, num_stages=1)
    if _OVERRIDE is not None:
        return _tile(_OVERRIDE, m, wpg)
    tuned = _tuned(torch.cuda.get_device_name(device)).get(f"{n}x{k}", {}).get("1" if m == 1 else "16")
    if tuned:
        return _tile(tuned, m, wpg)
    if m == 1:
        return _tile(dict(BLOCK_N=16, TW=128, num_warps=4, num_stages=3), m, wpg)
    return _tile(dict(BLOCK_N=32, TW=32, num_warps=4, num_stages=3), m, wpg)


def supports(k: int, group: int) -> bool:
    """Shapes the kernel takes: K a multiple of the group, groups of a power of two >= 32."""
    return group >= 32 and group & (group - 1) == 0 and k % group == 0


def w4a16(x: torch.Tensor, words: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
          bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ (d * q + m).T (+ bias): words int32 [N, K / 8], d and m float16 [N, G]."""
    rows, k = x.shape
    n, kw = words.shape
    group = k // d.shape[1] if d.shape[1] else 0
    if x.is_cuda and x.dtype not in (torch.bfloat16, torch.float16):
        # float32 on the GPU is for checks and takes Int4Linear's torch path: this kernel's
        # float32 tl.dot (more than one row) was not exact enough on an H200
        raise ValueError(f"W4A16 on CUDA takes bfloat16 or float16, not {x.dtype}")
    if rows > MAX_ROWS or x.stride(-1) != 1 or k != 8 * kw or not supports(k, group):
        raise ValueError(f"W4A16 takes <= {MAX_ROWS} unit-stride rows of K = 8 x words and groups "
                         f"of a power of two >= 32 dividing K; got x {list(x.shape)}, words "
                         f"{list(words.shape)}, {d.shape[1]} groups")
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if rows:
        cfg = _config(rows, n, k, group, x.device)
        use_pdl = pdl.enabled(x.device)
        _w4a16_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
            x, words, d, m, bias if bias is not None else d, y, rows, n, kw, d.shape[1],
            x.stride(0), y.stride(0), WPG=group // 8, HAS_BIAS=bias is not None, PDL=use_pdl,
            IEEE=INTERPRETED or x.dtype == torch.float32, INTERPRET=INTERPRETED,
            KW_INTERPRET=kw if INTERPRETED else 0, launch_pdl=use_pdl, **cfg)
    return y
