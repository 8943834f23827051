"""What the one-row W4A16 kernel would gain if x came to it already as dp4a operands (issue 7).

    python3 benchmarks/gpu/xq_probe.py OUT.json [SHAPES]

The dp4a kernel (kernels/triton/w4a16.py) makes x's fixed-point bytes inside its tile loop, once
per tile and program: the word's largest |x| (shuffles), the bytes packed four to an operand,
then the operands, the word scales and the sums of x moved from x's layout to the products'
through shared memory (on sm_90: 4 layout conversions, 8 barriers in gate_up's loop of 493
instructions at BLOCK_N 128, SPLIT 4, XAHEAD). If the kernel that writes x (the add + RMSNorm
before qkv and gate_up) wrote those operands instead, as it writes FP8's quantized input, the
loop would load them in the products' layout: the experimental kernel here does exactly that
(425 instructions, 4 barriers, 128 registers instead of 157; compiled for sm_90 on the CPU,
2026-12-06; its products are bit-identical to the engine's kernel in the interpreter). It is not
in the engine: this probe times it against the engine's kernel at each 8B shape's tuned tile,
to decide whether the producer side is worth building.

Operands per word j of x's 8 columns (as w4a16._tile_products makes them): s_j = 2^(E - 13)
with E the exponent of the largest |x|, xq = round(x / s_j), hi = xq >> 8 (signed byte), lo =
xq & 0xFF, packed as 4 int32 planes [hi of columns 0,2,4,6 | hi of 1,3,5,7 | lo 0,2,4,6 | lo
1,3,5,7]; and the sum of x over each run of 4 words. Made in torch here, outside the timing.
Every call is one launch either way (the same split-K reduction by the last program).
"""
from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.getcwd())

from nextok.bench.common import header  # noqa: E402
from nextok.kernels.triton import int4_words as words4  # noqa: E402
from nextok.kernels.triton import w4a16 as w4  # noqa: E402
from nextok.kernels.triton import w4a16_tiles as tiles  # noqa: E402
from nextok.kernels.triton.dp4a import _dp4a  # noqa: E402
from nextok.kernels.triton.int4_words import _tile_ptrs, _tile_step  # noqa: E402
from nextok.quant.int4 import dequantize_groups, pack_words, quantize_groups  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _xq_tile(ops_ptr, s_ptr, xs_ptr, w_tile, d_ptr, m_ptr, gptr, wword, xrun, kw0, KW,
             WPG: tl.constexpr, LN: tl.constexpr):
    # everything the tile at word kw0 multiplies: W's words, d, m, x's four operands, s, xs
    return (tl.load(w_tile + _tile_step(kw0, LN)), tl.load(d_ptr + gptr + kw0 // WPG).to(tl.float32),
            tl.load(m_ptr + gptr + kw0 // WPG).to(tl.float32), tl.load(ops_ptr + kw0 + wword),
            tl.load(ops_ptr + KW + kw0 + wword), tl.load(ops_ptr + 2 * KW + kw0 + wword),
            tl.load(ops_ptr + 3 * KW + kw0 + wword), tl.load(s_ptr + kw0 + wword),
            tl.load(xs_ptr + kw0 // 4 + xrun))


@triton.jit
def _xq_kernel(ops_ptr, s_ptr, xs_ptr, w_ptr, d_ptr, m_ptr, y_ptr, part_ptr, count_ptr, N, KW, G,
               WPG: tl.constexpr, GT: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
               LN: tl.constexpr, LW: tl.constexpr, INTERPRET: tl.constexpr, KW_I: tl.constexpr):
    # One row, whole tiles only (N % BLOCK_N == 0, KW % (GT WPG) == 0). ops [4, KW] int32, s [KW]
    # float32, xs [KW / 4] float32; words [N, KW] (tiles LN x LW); d, m [N, G]; y [1, N].
    # Everything of the next tile loaded one tile ahead (as XAHEAD). Shapes: [1, BLOCK_N, GT, WPG]
    # on W's side, [1, 1, GT, WPG] on x's (loaded in the products' layout: no conversion).
    TW: tl.constexpr = GT * WPG
    NS: tl.constexpr = WPG // 4
    split = tl.program_id(0) % SPLIT
    tile = tl.program_id(0) // SPLIT
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    wword = tl.arange(0, GT)[None, None, :, None] * WPG + tl.arange(0, WPG)[None, None, None, :]
    xrun = tl.arange(0, GT)[None, None, :, None] * NS + tl.arange(0, NS)[None, None, None, :]
    gptr = n[None, :, None, None] * G + tl.arange(0, GT)[None, None, :, None]
    per_split = tl.cdiv(tl.cdiv(KW, SPLIT), TW) * TW
    kw_lo = split * per_split
    kw_hi = tl.minimum(kw_lo + per_split, KW)
    w_tile = _tile_ptrs(w_ptr, n[None, :, None, None], wword, KW, TW, LN, LW)
    acc = tl.zeros([1, BLOCK_N, GT, NS], dtype=tl.float32)
    k0 = tl.minimum(0 if INTERPRET else kw_lo, KW - TW)  # an empty split (past K) loads the last tile
    nxt = _xq_tile(ops_ptr, s_ptr, xs_ptr, w_tile, d_ptr, m_ptr, gptr, wword, xrun, k0, KW, WPG, LN)
    # (the interpreter cannot loop between runtime bounds: it walks all of K, KW_I words)
    for kw0 in range(0 if INTERPRET else kw_lo, KW_I if INTERPRET else kw_hi, TW):
        w, d, mn, he, ho, le, lo, s, xs = nxt
        kn = tl.minimum(kw0 + TW, KW - TW)  # past the split: the last tile again, never used
        nxt = _xq_tile(ops_ptr, s_ptr, xs_ptr, w_tile, d_ptr, m_ptr, gptr, wword, xrun, kn, KW, WPG, LN)
        we = w & 0x0F0F0F0F
        wo = (w >> 4) & 0x0F0F0F0F
        t = _dp4a(we, he, tl.zeros_like(we), True, INTERPRET)
        t = _dp4a(wo, ho, t, True, INTERPRET) << 8
        t = _dp4a(we, le, t, False, INTERPRET)
        t = _dp4a(wo, lo, t, False, INTERPRET)
        part = tl.sum(tl.reshape(t.to(tl.float32) * s, [1, BLOCK_N, GT, NS, 4]), axis=4)
        if INTERPRET:  # (it walks all of K)
            acc += tl.where((kw0 >= kw_lo) & (kw0 < kw_hi), part * d + mn * xs, 0.0)
        else:
            acc += part * d + mn * xs
    out = tl.sum(tl.sum(acc, axis=3), axis=2)  # [1, BLOCK_N]
    if SPLIT > 1:
        tl.store(part_ptr + split * N + n[None, :], out)
        tl.debug_barrier()
        done = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if done == SPLIT - 1:
            out = tl.zeros([1, BLOCK_N], dtype=tl.float32)
            for k in tl.static_range(SPLIT):
                out += tl.load(part_ptr + k * N + n[None, :], cache_modifier=".cg")
            tl.store(count_ptr + tile, 0)
            tl.store(y_ptr + n[None, :], out.to(y_ptr.dtype.element_ty))
    else:
        tl.store(y_ptr + n[None, :], out.to(y_ptr.dtype.element_ty))


def operands(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [1, K] -> (ops int32 [4, K / 8], s float32 [K / 8], xs float32 [K / 32]), as the dp4a
    kernel makes them per tile."""
    xw = x.float().view(-1, 8)  # [KW, 8]
    amax = xw.abs().amax(1).clamp_min(1e-30)
    s = (amax.view(torch.int32) & 0x7F800000).view(torch.float32) / 8192.0
    xq = torch.round(xw / s[:, None]).to(torch.int32)  # |xq| < 2^14
    hi, lo = xq >> 8, xq & 0xFF
    shifts = torch.tensor([0, 8, 16, 24], device=x.device, dtype=torch.int32)

    ops = torch.stack([_pack(v, shifts) for v in (hi[:, 0::2], hi[:, 1::2], lo[:, 0::2], lo[:, 1::2])])
    xs = xw.sum(1).view(-1, 4).sum(1)
    return ops.contiguous(), s.contiguous(), xs.contiguous()


def _pack(v: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """[R, 4] int32 whose low bytes count -> [R] int32, byte k from column k (two's complement)."""
    u = ((v.to(torch.int64) & 0xFF) << shifts.to(torch.int64)).sum(1)
    return torch.where(u >= 1 << 31, u - (1 << 32), u).to(torch.int32)


def xq_matmul(ops, s, xs, words, d, m, layout, block_n: int, split: int, warps: int) -> torch.Tensor:
    n, kw = words.shape
    gt = 32 // (kw // d.shape[1])
    y = torch.empty(1, n, dtype=torch.bfloat16, device=words.device)
    part, count = w4._scratch(words.device, split * n, n // block_n)
    _xq_kernel[(n // block_n * split,)](ops, s, xs, words, d, m, y, part, count, n, kw, d.shape[1],
                                       WPG=kw // d.shape[1], GT=max(1, gt), BLOCK_N=block_n,
                                       SPLIT=split, INTERPRET=INTERPRET, KW_I=kw if INTERPRET else 0, num_warps=warps,
                                       num_stages=3, **words4.layout_args(layout))
    return y


def main() -> int:
    from benchmarks.gpu.w4a16_probe import graph_us

    out_path = sys.argv[1]
    shapes = [tuple(int(v) for v in s.split("x")) for s in
              (sys.argv[2] if len(sys.argv) > 2 else "6144x4096,4096x4096,28672x4096,4096x14336").split(",")]
    dev, rows = torch.device("cuda"), []
    for n, k in shapes:
        w = torch.randn(n, k, device=dev) * k ** -0.5
        q, d, m = quantize_groups(w, 128)
        words = pack_words(q)
        copies = max(2, -(-400 * 2**20 // (n * k // 2)))  # packed copies over 400 MB
        packed = [(words4.tile_words(words), d.clone(), m.clone()) for _ in range(copies)]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        ref = torch.nn.functional.linear(x.float(), dequantize_groups(q, d, m))
        ops, s, xs = operands(x)
        engine = graph_us(lambda i: w4.w4a16(x, *packed[i], layout=words4.LAYOUT), copies)
        r = {"n": n, "k": k, "engine_us": engine, "engine_tile": tiles.config(1, n, k, 128, dev)[1],
             "xq": []}
        for bn, split, warps in ((64, 4, 4), (64, 8, 4), (128, 4, 4), (128, 8, 4), (128, 2, 4), (256, 4, 8)):
            if n % bn:
                continue
            y = xq_matmul(ops, s, xs, *packed[0], words4.LAYOUT, bn, split, warps)
            err = (y.float() - ref).abs().max().item()
            us = graph_us(lambda i: xq_matmul(ops, s, xs, *packed[i], words4.LAYOUT, bn, split, warps), copies)
            r["xq"].append(dict(BLOCK_N=bn, SPLIT=split, num_warps=warps, us=us, max_diff=err))
        best = min(r["xq"], key=lambda e: e["us"])
        print(f"{n}x{k}: engine {engine:6.2f} us ({r['engine_tile']}) | x as operands {best['us']:6.2f} us "
              f"({engine / best['us']:.2f}x) {best}", flush=True)
        rows.append(r)
    with open(out_path, "w") as f:
        json.dump(header({"rows": rows}), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
