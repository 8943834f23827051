"""W4A16 for decode-sized steps: y [M, N] = x [M, K] @ W.T (+ bias), M <= MAX_ROWS, with W in
4 bits, read once per step and dequantized in registers.

Weight layout (quant/int4.py, Int4Linear): `words` int32 [N, K / 8], word j of a row holds columns
8j .. 8j + 7, column 8j + i in bits 4i .. 4i + 3; per row and group of GROUP columns a scale d and
a min m, float16 [N, K / GROUP]: W = d * q + m. On CUDA the words are stored in contiguous tiles
of 64 rows x 16 words (int4_words.py; the kernels take either order).

Why integer dot products for 1-8 rows: at batch 1 an 8B step must stream ~4 GB of nibbles at ~4
TB/s, 8 * 10^12 weights a second, and an H200 SM issues 128 lane-instructions a clock: a few
instructions per 8-weight word at most. Turning each nibble into a float costs three (a first
kernel did that, with x gathered per weight: ~70 SASS instructions a word, 1.2 TB/s measured).
Instead x is put in 16-bit fixed point per word of 8 columns, x = s (256 hi + lo) with hi a
signed and lo an unsigned byte, and one `dp4a` multiplies four nibbles by four bytes and adds:

    we = w & 0x0F0F0F0F, wo = (w >> 4) & 0x0F0F0F0F     columns 0,2,4,6 and 1,3,5,7 as bytes
    t = 256 (dp4a(we, hi_e) + dp4a(wo, hi_o)) + dp4a(we, lo_e) + dp4a(wo, lo_o) = sum_i q_i x_i / s

and the word adds d s t + m sum_i x_i to its row (11 instructions a word). s is a power of two
(2^(E - 13), E the exponent of the word's largest |x|), so every element within 2^6 of that
largest one, all of a bfloat16 word but outliers, is exact; the others are off by at most
2^(E - 14). The x bytes are made once per tile and program and shared by its BLOCK_N rows of W;
a program takes BLOCK_M rows of x, so W's words are unpacked once for all of them. Small N
splits K over SPLIT programs (an 8B o_proj has 4096 rows: 32 tiles of 128 for 132 SMs).

XRUN (a tile option): one fixed point per run of 4 words (32 columns, the words a thread loads
together) instead of per word, so a run's 16 dp4a chain through one accumulator, its hi and lo
bytes apart, and only the run's sum turns into a float. On sm_90 (SASS counted on the CPU) a
tile's loop per word of W: 8 rows 87.1 -> 69.5 instructions, 4 rows 51.1 -> 43.0, one row 19.4
-> 17.4, the one-row stream with silu 26.8 -> 24.8. On the default model's activations
(benchmarks/fixed_point_error.py, 2026-12-06-fixed-point-error-cpu.json) it moves a layer's
output by 3.9e-5 of its norm (median; max 2.7e-4) against 1.9e-5 per word, while rounding x
to bfloat16 moves it by 1.4e-3 and the int4 weight by 7e-2. Not timed on a GPU yet: the sweep
(w4a16_probe.py) offers it and the tables take it where it wins.

More rows (9-256): w4a16_dot.py, each tile dequantized to x's dtype and multiplied with tl.dot.

Measured on an H200 (2026-12-04, benchmarks/gpu/w4a16_probe.py; results
2026-12-04-w4a16-probe-h200-*.json): the float one-row kernel read the packed bytes at ~1.2 TB/s
and the 8B step took 3.93 ms against bf16's 4.17; a tensor-core variant was slower (6.36 ms).
The dp4a kernel (2026-12-05, 2026-12-05-h200.md): one 8B layer's matmuls 49.6 us against bf16's
109.8 at one row (gate_up reads 2.64 TB/s of packed bytes), the 8B step 2.31 ms against 4.19;
at 8 rows it is still slower than bf16's GEMV (5.86 vs 4.61 ms a step). H100 (2026-12-06,
2026-12-06-h100.md), after the loop's changes below (whole tiles, UNROLL, sums per run of 4
words, operands moved in one tensor): the 8B step 2.53 ms against bf16's 5.75 at one row.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from nextok.kernels.triton import pdl, w4a16_tiles
from nextok.kernels.triton.int4_words import _tile_ptrs, _tile_step, can_tile, layout_args
from nextok.kernels.triton.dp4a import _tile_products
from nextok.kernels.triton.pdl import pdl_wait
from nextok.kernels.triton.split_k import store_split_k
from nextok.kernels.triton.w4a16_dot import _w4a16_dot_kernel

MAX_ROWS = 256  # the tl.dot kernel's most rows (Int4Linear sends it w4a16_tiles.kernel_rows())


@triton.jit
def _w_tile(w_tile, wword, kw0, n_ok4, kw_lo, kw_hi, kw_last, LN: tl.constexpr, EVEN: tl.constexpr):
    # W's words of the tile at word kw0, [1, BLOCK_N, GT, WPG] (0 outside the split). EVEN: N a
    # multiple of BLOCK_N and K of the tile's words (kw_last: KW - TW): no masks, and a tile past
    # K loads the last one instead, as what a tile outside the split holds is never used (the
    # loop stops before it; in the interpreter x is 0 there). On sm_90 a masked load zeroes its
    # registers first: with the per-word predicates ~50 of gate_up's 601 instructions a tile.
    if EVEN:
        return tl.load(w_tile + _tile_step(tl.minimum(kw0, kw_last), LN))
    word = kw0 + wword
    return tl.load(w_tile + _tile_step(kw0, LN), mask=n_ok4 & (word >= kw_lo) & (word < kw_hi), other=0)


@triton.jit
def _x_tile(x_rows, xw, xrow_ok, kw_lo, kw_hi, KW, SILU_MUL: tl.constexpr):
    # x's words xw of the program's rows [BLOCK_M, GT, WPG, 8] as stored, and with SILU_MUL the
    # up half's beside them (else x again)
    x_ok = xrow_ok & (xw >= kw_lo) & (xw < kw_hi)
    x = tl.load(x_rows + xw * 8, mask=x_ok, other=0.0)
    up = x
    if SILU_MUL:
        up = tl.load(x_rows + 8 * KW + xw * 8, mask=x_ok, other=0.0)
    return x, up


@triton.jit
def _scales(d_ptr, m_ptr, n, n_ok, kw0, kw_lo, kw_hi, G, S_DN, S_DG, WPG: tl.constexpr,
            GT: tl.constexpr, EVEN: tl.constexpr = False):
    # d and m of the GT groups from word kw0 of rows n, float32 [1, BLOCK_N, GT] (EVEN: as
    # _w_tile's, unmasked, the last tile's past K). d[n, g] at n * S_DN + g * S_DG: row-major
    # (G, 1) or group-major (1, N; quant/int4.py GROUP_MAJOR_MAX)
    if EVEN:
        grp = tl.minimum(kw0, G * WPG - GT * WPG) // WPG + tl.arange(0, GT)[None, None, :]
        gptr = n[None, :, None] * S_DN + grp * S_DG
        return tl.load(d_ptr + gptr).to(tl.float32), tl.load(m_ptr + gptr).to(tl.float32)
    grp = kw0 // WPG + tl.arange(0, GT)[None, None, :]  # [1, 1, GT]
    gptr = n[None, :, None] * S_DN + grp * S_DG
    g_mask = n_ok[None, :, None] & (grp * WPG >= kw_lo) & (grp * WPG < kw_hi)
    d = tl.load(d_ptr + gptr, mask=g_mask, other=0.0).to(tl.float32)
    mn = tl.load(m_ptr + gptr, mask=g_mask, other=0.0).to(tl.float32)
    return d, mn


@triton.jit
def _tile_loads(w_tile, wword, kw0, n_ok4, kw_lo, kw_hi, KW, d_ptr, m_ptr, n, n_ok, G, S_DN, S_DG, x_rows, xword,
                xrow_ok, TW: tl.constexpr, WPG: tl.constexpr, GT: tl.constexpr, LN: tl.constexpr,
                EVEN: tl.constexpr, SILU_MUL: tl.constexpr):
    # everything the tile at word kw0 multiplies: (W's words, x, up, d, m) (UNROLL's buffers)
    w = _w_tile(w_tile, wword, kw0, n_ok4, kw_lo, kw_hi, KW - TW, LN, EVEN)
    d, mn = _scales(d_ptr, m_ptr, n, n_ok, kw0, kw_lo, kw_hi, G, S_DN, S_DG, WPG, GT, EVEN)
    x, up = _x_tile(x_rows, kw0 + xword, xrow_ok, kw_lo, kw_hi, KW, SILU_MUL)
    return w, x, up, d, mn


@triton.jit
def _w4a16_dp4a_kernel(x_ptr, w_ptr, d_ptr, m_ptr, b_ptr, y_ptr, part_ptr, count_ptr,
                       M, N, KW, G, S_DN, S_DG, s_xm, s_ym, WPG: tl.constexpr, GT: tl.constexpr,
                       SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
                       INTERPRET: tl.constexpr, KW_INTERPRET: tl.constexpr, LN: tl.constexpr,
                       LW: tl.constexpr, DEPTH: tl.constexpr, XAHEAD: tl.constexpr,
                       EVEN: tl.constexpr, UNROLL: tl.constexpr = 0, XRUN: tl.constexpr = 0,
                       PIPE: tl.constexpr = 0):
    # Grid (cdiv(N, BLOCK_N) * SPLIT * cdiv(M, BLOCK_M),): a program takes BLOCK_M rows of x,
    # BLOCK_N rows of W and a SPLIT-th of K; the programs of one tile of W run side by side, so
    # its bytes come from DRAM once. x [M, 8 KW]; words [N, KW]; d, m [N, G]; y [M, N]. A tile:
    # [BLOCK_N, GT, WPG] words, GT whole groups; d[n, g] at n * S_DN + g * S_DG. With SPLIT > 1
    # each program leaves its float32 sums in part [SPLIT, M, N] and the last of a tile's SPLIT
    # programs (count [cdiv(N, BLOCK_N), cdiv(M, BLOCK_M)], zeros between calls) adds them in
    # split order and writes y.
    # Shapes below: x side [BLOCK_M, 1, GT, WPG], W side [1, BLOCK_N, GT, WPG].
    # SILU_MUL: x's rows are an MLP's gate and up halves, [M, 16 KW], and the kernel multiplies
    # silu(gate) * up, rounded as the separate silu_mul kernel (fused.py) rounds it: the down
    # projection without that kernel's launch and round trip through memory.
    TW: tl.constexpr = GT * WPG
    mb = tl.cdiv(M, BLOCK_M)
    rblock = tl.program_id(0) % mb
    split = (tl.program_id(0) // mb) % SPLIT
    tile = tl.program_id(0) // (mb * SPLIT)
    rows = rblock * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    n4 = n[None, :, None, None]
    n_ok4 = n_ok[None, :, None, None]
    wword = tl.arange(0, GT)[None, None, :, None] * WPG + tl.arange(0, WPG)[None, None, None, :]
    # x's tile [BLOCK_M, GT, WPG, 8]: row, group, word, column in the word
    xrow = rows[:, None, None, None]
    xrow_ok = row_ok[:, None, None, None]
    xword = tl.arange(0, GT)[None, :, None, None] * WPG + tl.arange(0, WPG)[None, None, :, None]
    col = tl.arange(0, 8)[None, None, None, :]
    per_split = tl.cdiv(tl.cdiv(KW, SPLIT), TW) * TW
    kw_lo = split * per_split
    kw_hi = tl.minimum(kw_lo + per_split, KW)
    kw_first = split * per_split
    # the interpreter cannot loop between runtime bounds: there every program walks all of K
    # and masks the words outside its split; on the GPU the loop starts at the split, and the
    # masks need only the upper bound
    if not INTERPRET:
        kw_lo = 0
    acc = tl.zeros([BLOCK_M, BLOCK_N, GT, WPG // 4], dtype=tl.float32)
    # The words of each tile are loaded DEPTH (1 or 2) tiles ahead, the first before pdl_wait: W
    # depends on no earlier kernel, so with PDL the first tiles stream in while the kernel before
    # this one (the norm that writes x) finishes, instead of after it. At one row an o_proj reads
    # 8.4 MB, ~2 us at the copy bandwidth, about what a kernel's start costs. Two ahead: a tile's
    # compute (~0.7 us a round of 4 programs an SM at one row) is about DRAM's latency under
    # load, so one tile ahead barely covers it; two cost 16 more registers a thread (H100 sweep,
    # 2026-12-05: 4-5 % faster at the two K-split-8 shapes of the 8B, equal at the others).
    # W's pointers for the tile at word 0, once; each tile adds _tile_step of its first word.
    # (kw_start: 0 spelled out for the interpreter, where a name assigned under an `if` is a
    # tensor)
    w_tile = _tile_ptrs(w_ptr, n4, wword, KW, TW, LN, LW)
    kw_start = 0 if INTERPRET else kw_first
    if not PIPE:
        w_next = _w_tile(w_tile, wword, kw_start, n_ok4, kw_lo, kw_hi, KW - TW, LN, EVEN)
        if DEPTH == 2:
            w_after = _w_tile(w_tile, wword, kw_start + TW, n_ok4, kw_lo, kw_hi, KW - TW, LN, EVEN)
    # XAHEAD: x's tile (and up's) is loaded one tile ahead as well, after the wait (an earlier
    # kernel writes x), and so are the scales d, m (constants: the first before the wait); else
    # each tile's x-prep waits a full L2 round trip for its x. Why: the H200's gate_up at one row
    # took 24.4 us, the sum of its ~9.9 us of issue (22.5 instructions a word) and 14.7 us of
    # DRAM at the copy bandwidth, as if the two never overlapped. Swept on an H200 (2026-12-05
    # night): every one-row 8B shape's best tile takes it; with DEPTH 2 where that pays, a
    # layer's four matmuls 50.7 -> 48.3 us.
    x_rows = x_ptr + xrow * s_xm + col
    if XAHEAD and not PIPE:
        d_next, mn_next = _scales(d_ptr, m_ptr, n, n_ok, kw_start, kw_lo, kw_hi, G, S_DN, S_DG, WPG, GT, EVEN)
    pdl_wait(PDL)
    if XAHEAD and not PIPE:
        x_next, up_next = _x_tile(x_rows, kw_start + xword, xrow_ok, kw_lo, kw_hi, KW, SILU_MUL)
    # PIPE (>= 2): the loop as written, each tile's loads in its own turn, and Triton's software
    # pipeline (a loop with its own num_stages: loads that feed no tl.dot too) issues them PIPE - 1
    # turns ahead as asynchronous copies into shared memory, which hold the tiles in flight
    # instead of registers (DEPTH's tiles ahead cost registers, so programs an SM). Why: the
    # one-row kernel read ~2.7 TB/s at gate_up on both an H100 (3.35 TB/s) and an H200 (4.8):
    # the same time on a card with 1.4x the bandwidth, as if bound by the bytes each SM keeps in
    # flight rather than by DRAM. On an H100 it never won: 1.03-1.13x the best tile's time at
    # each 8B shape, PIPE 5 slower than 3 (2026-12-07-gguf-h100.md); the H200's sweep decides there.
    if PIPE:
        for kw0 in tl.range(0 if INTERPRET else kw_first, KW_INTERPRET if INTERPRET else kw_hi, TW,
                            num_stages=PIPE):
            w, x, up, d, mn = _tile_loads(w_tile, wword, kw0, n_ok4, kw_lo, kw_hi, KW, d_ptr, m_ptr, n, n_ok,
                                          G, S_DN, S_DG, x_rows, xword, xrow_ok, TW, WPG, GT, LN, EVEN, SILU_MUL)
            acc = _tile_products(acc, w, x, up, d, mn, x_ptr.dtype.element_ty, SILU_MUL, BLOCK_M,
                                 BLOCK_N, GT, WPG, INTERPRET, XRUN)
    # UNROLL (with XAHEAD): the loop takes DEPTH + 1 tiles a turn, each in buffers of its own
    # (a, b[, c]), each buffer loaded right after its tile is multiplied, DEPTH tiles ahead.
    # Without it, the tile ahead moves into the current one's registers at the end of every
    # turn: on sm_90 32 moves a tile at gate_up's (of 512 instructions), and a move waits for
    # its load, so at DEPTH 2 the turn waited for the tile it had just asked for: one ahead in
    # effect. The loop's last turn may hold fewer tiles than DEPTH + 1 (the `if`s).
    if UNROLL and not PIPE:
        a_w, a_x, a_up, a_d, a_m = w_next, x_next, up_next, d_next, mn_next
        if DEPTH == 2:
            b_w = w_after
            b_d, b_m = _scales(d_ptr, m_ptr, n, n_ok, kw_start + TW, kw_lo, kw_hi, G, S_DN, S_DG, WPG, GT, EVEN)
            b_x, b_up = _x_tile(x_rows, kw_start + TW + xword, xrow_ok, kw_lo, kw_hi, KW, SILU_MUL)
        for kw0 in range(0 if INTERPRET else kw_first, KW_INTERPRET if INTERPRET else kw_hi,
                         (DEPTH + 1) * TW):
            if DEPTH == 1:
                b_w, b_x, b_up, b_d, b_m = _tile_loads(
                    w_tile, wword, kw0 + TW, n_ok4, kw_lo, kw_hi, KW, d_ptr, m_ptr, n, n_ok, G, S_DN, S_DG,
                    x_rows, xword, xrow_ok, TW, WPG, GT, LN, EVEN, SILU_MUL)
            else:
                c_w, c_x, c_up, c_d, c_m = _tile_loads(
                    w_tile, wword, kw0 + 2 * TW, n_ok4, kw_lo, kw_hi, KW, d_ptr, m_ptr, n, n_ok, G, S_DN, S_DG,
                    x_rows, xword, xrow_ok, TW, WPG, GT, LN, EVEN, SILU_MUL)
            acc = _tile_products(acc, a_w, a_x, a_up, a_d, a_m, x_ptr.dtype.element_ty, SILU_MUL,
                                 BLOCK_M, BLOCK_N, GT, WPG, INTERPRET, XRUN)
            a_w, a_x, a_up, a_d, a_m = _tile_loads(
                w_tile, wword, kw0 + (DEPTH + 1) * TW, n_ok4, kw_lo, kw_hi, KW, d_ptr, m_ptr, n, n_ok,
                G, S_DN, S_DG, x_rows, xword, xrow_ok, TW, WPG, GT, LN, EVEN, SILU_MUL)
            if kw0 + TW < (KW_INTERPRET if INTERPRET else kw_hi):
                acc = _tile_products(acc, b_w, b_x, b_up, b_d, b_m, x_ptr.dtype.element_ty, SILU_MUL,
                                     BLOCK_M, BLOCK_N, GT, WPG, INTERPRET, XRUN)
            if DEPTH == 2:
                b_w, b_x, b_up, b_d, b_m = _tile_loads(
                    w_tile, wword, kw0 + 4 * TW, n_ok4, kw_lo, kw_hi, KW, d_ptr, m_ptr, n, n_ok, G, S_DN, S_DG,
                    x_rows, xword, xrow_ok, TW, WPG, GT, LN, EVEN, SILU_MUL)
                if kw0 + 2 * TW < (KW_INTERPRET if INTERPRET else kw_hi):
                    acc = _tile_products(acc, c_w, c_x, c_up, c_d, c_m, x_ptr.dtype.element_ty,
                                         SILU_MUL, BLOCK_M, BLOCK_N, GT, WPG, INTERPRET, XRUN)
    if not UNROLL and not PIPE:
        for kw0 in range(0 if INTERPRET else kw_first, KW_INTERPRET if INTERPRET else kw_hi, TW):
            w = w_next
            if DEPTH == 2:
                w_next = w_after
                w_after = _w_tile(w_tile, wword, kw0 + 2 * TW, n_ok4, kw_lo, kw_hi, KW - TW, LN, EVEN)
            else:
                w_next = _w_tile(w_tile, wword, kw0 + TW, n_ok4, kw_lo, kw_hi, KW - TW, LN, EVEN)
            if XAHEAD:
                x, up, d, mn = x_next, up_next, d_next, mn_next
                x_next, up_next = _x_tile(x_rows, kw0 + TW + xword, xrow_ok, kw_lo, kw_hi, KW, SILU_MUL)
                d_next, mn_next = _scales(d_ptr, m_ptr, n, n_ok, kw0 + TW, kw_lo, kw_hi, G, S_DN, S_DG, WPG, GT, EVEN)
            else:
                x, up = _x_tile(x_rows, kw0 + xword, xrow_ok, kw_lo, kw_hi, KW, SILU_MUL)
                d, mn = _scales(d_ptr, m_ptr, n, n_ok, kw0, kw_lo, kw_hi, G, S_DN, S_DG, WPG, GT, EVEN)
            acc = _tile_products(acc, w, x, up, d, mn, x_ptr.dtype.element_ty, SILU_MUL, BLOCK_M,
                                 BLOCK_N, GT, WPG, INTERPRET, XRUN)
    out = tl.sum(tl.sum(acc, axis=3), axis=2)  # [BLOCK_M, BLOCK_N]
    store_split_k(out, part_ptr, count_ptr, b_ptr, y_ptr, rows, row_ok, n, n_ok, M, N, s_ym, split,
                  tile * mb + rblock, SPLIT, HAS_BIAS, BLOCK_M, BLOCK_N)


INTERPRETED = not isinstance(_w4a16_dp4a_kernel, JITFunction)
_SCRATCH: dict = {}  # device -> (part float32, count int32), grown as needed
_OUTGROWN: list = []  # buffers replaced by bigger ones: a captured CUDA graph may still use them


def _scratch(device: torch.device, parts: int, counts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-K kernel's float32 partial sums and its per-tile counts (zeros; each call leaves
    them zero), shared by every call on the device: calls on one stream run one after another."""
    part, count = _SCRATCH.get(device, (None, None))
    if part is None or part.numel() < parts or count.numel() < counts:
        if part is not None:
            _OUTGROWN.append((part, count))
        part = torch.empty(max(parts, 1 << 20), dtype=torch.float32, device=device)
        count = torch.zeros(max(counts, 1 << 14), dtype=torch.int32, device=device)
        _SCRATCH[device] = (part, count)
    return part, count


def supports(k: int, group: int) -> bool:
    """Shapes the kernel takes: K a multiple of the group, groups of a power of two >= 32."""
    return group >= 32 and group & (group - 1) == 0 and k % group == 0


def w4a16(x: torch.Tensor, words: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
          bias: torch.Tensor | None = None, silu_mul: bool = False,
          layout: tuple[int, int] | None = None) -> torch.Tensor:
    """x [M, K] @ (d * q + m).T (+ bias): words int32 [N, K / 8] (in tiles if layout:
    int4_words.tile_words), d and m float16 [N, G].
    silu_mul: x is [M, 2K], an MLP's gate and up halves, and the product takes silu(gate) * up
    (in the one-row kernel; the tl.dot one, for more rows, gets it from the silu_mul kernel)."""
    rows, k = x.shape
    if silu_mul:
        k //= 2
    n, kw = words.shape
    group = k // d.shape[1] if d.shape[1] else 0
    if x.is_cuda and x.dtype not in (torch.bfloat16, torch.float16):
        # float32 on the GPU is for checks and takes Int4Linear's torch path: this kernel's
        # float32 tl.dot (more than one row) was not exact enough on an H200
        raise ValueError(f"W4A16 on CUDA takes bfloat16 or float16, not {x.dtype}")
    if (rows > MAX_ROWS or x.stride(-1) != 1 or k != 8 * kw or x.shape[1] != k * (1 + silu_mul)
            or not supports(k, group)):
        raise ValueError(f"W4A16 takes <= {MAX_ROWS} unit-stride rows of K = 8 x words "
                         f"({'2K: gate and up' if silu_mul else 'K'} columns) and groups of a power "
                         f"of two >= 32 dividing K; got x {list(x.shape)}, words {list(words.shape)}, "
                         f"{d.shape[1]} groups")
    if layout and not can_tile(n, kw, layout):
        raise ValueError(f"words {list(words.shape)} do not make tiles of {layout} (rows, words)")
    if d.stride() != m.stride() or 1 not in d.stride():
        raise ValueError(f"d and m must share row- or group-major strides, not {d.stride()} and {m.stride()}")
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if rows:
        dot, cfg = w4a16_tiles.config(rows, n, k, group, x.device)
        if layout and (cfg["GT"] * group // 8) % layout[1]:
            raise ValueError(f"a tile of {cfg['GT'] * group // 8} words does not read whole "
                             f"{layout[1]}-word tiles")
        if silu_mul and dot:
            from nextok.kernels.triton.fused import TritonFusedOps

            x, silu_mul = TritonFusedOps(gemv_rows=0).silu_mul(x), False
        use_pdl = pdl.enabled(x.device)
        args = (x, words, d, m, bias if bias is not None else d, y)
        common = dict(WPG=group // 8, HAS_BIAS=bias is not None, PDL=use_pdl, INTERPRET=INTERPRETED,
                      KW_INTERPRET=kw if INTERPRETED else 0, launch_pdl=use_pdl,
                      **layout_args(layout), **{k: v for k, v in cfg.items() if k != "STREAM"})
        if not dot and cfg.get("STREAM"):  # one row only (w4a16_tiles._tile)
            from nextok.kernels.triton.w4a16_stream import stream

            stream(x, words, d, m, bias, y, silu_mul, layout, use_pdl, cfg)
        else:  # a grid of (tile of W, split of K, block of rows), both kernels
            tiles, mb = triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(rows, cfg["BLOCK_M"])
            part, count = _scratch(x.device, cfg["SPLIT"] * rows * n, tiles * mb)
            grid = (tiles * cfg["SPLIT"] * mb,)
            if dot:
                _w4a16_dot_kernel[grid](*args, part, count, rows, n, kw, d.shape[1], *d.stride(), x.stride(0),
                                        y.stride(0), IEEE=INTERPRETED or x.dtype == torch.float32,
                                        GROUP_MAJOR=d.stride(1) != 1, **common)
            else:
                _w4a16_dp4a_kernel[grid](
                    *args, part, count, rows, n, kw, d.shape[1], *d.stride(), x.stride(0), y.stride(0),
                    SILU_MUL=silu_mul, EVEN=n % cfg["BLOCK_N"] == 0 and kw % (cfg["GT"] * group // 8) == 0,
                    **common)
    return y
