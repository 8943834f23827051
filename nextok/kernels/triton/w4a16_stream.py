"""W4A16 for one row as a stream: the split-K grid's products (w4a16.py), on a fixed number of
programs that each run through an equal share of the (row tile, K tile) steps.

Why: at one row the split-K grid (_w4a16_dp4a_kernel) gives each program a few tiles of W
(4 at gate_up's best split on an H200), so every program starts and drains its loads, and the
last wave of programs leaves SMs idle; the o and qkv projections of an 8B layer make fewer
programs than the SMs hold at all. A stream keeps each program's next tile in flight across
row tiles, with as many programs as the table asks (STREAM, swept by
benchmarks/gpu/w4a16_probe.py at 1-4 an SM). On an H100 (2026-12-06) 3 programs of 4 warps an
SM won gate_up (22.9 us, 2.72 TB/s of packed bytes) and down; the H200 has not swept it yet.
Its loads keep their masks on whole tiles: without them (as w4a16.py's EVEN) sm_90 took 753
instead of 800 instructions a loop, but ptxas 128 registers instead of 145 and, on the H100,
gate_up 24.1 us at its best tile instead of 22.9 (2026-12-06, reverted).
TMA (a tile option, with PIPE): W's words copied by the tensor memory accelerator, PIPE - 1
steps in flight in shared memory with no registers or addresses a word, for a card whose DRAM
the loop's own loads leave idle. On an H100 (2026-12-07-s31-h100.md) as fast as PIPE's cp.async
loads and 1.15-1.44x the best tile's time (which reads ~90 % of that card's copy bandwidth at
gate_up); swept for the H200.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from nextok.kernels.triton.int4_words import _tile_ptrs, _tile_step, layout_args
from nextok.kernels.triton.pdl import pdl_wait
from nextok.kernels.triton.dp4a import _tile_products
from nextok.kernels.triton.w4a16 import INTERPRETED, _scales, _scratch, _x_tile


@triton.jit
def _w4a16_stream_kernel(x_ptr, w_ptr, w_desc, d_ptr, m_ptr, b_ptr, y_ptr, part_ptr, count_ptr,
                         N, KW, G, S_DN, S_DG, WPG: tl.constexpr, GT: tl.constexpr, HAS_BIAS: tl.constexpr,
                         SILU_MUL: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
                         INTERPRET: tl.constexpr, LN: tl.constexpr, LW: tl.constexpr,
                         XRUN: tl.constexpr = 0, PIPE: tl.constexpr = 0, TMA: tl.constexpr = 0):
    # One row of x, as a stream: the steps (row tile r of BLOCK_N rows of W, K tile of TW
    # words), row tile by row tile and K in order within one, are cut into num_programs equal
    # runs, one a program. A program streams its run with the next step's words in flight and
    # no start or drain between row tiles; the split-K grid (_w4a16_dp4a_kernel) starts and
    # drains every program (4 tiles each at gate_up's best split), and its last wave leaves
    # SMs idle. Where a run ends inside a row tile, its programs leave float32 sums in part
    # [slot, N] (slot: the program's place among the tile's, in run order) and the tile's last
    # to finish adds them in slot order and writes y. x [1, 8 KW] (SILU_MUL: [1, 16 KW]);
    # words [N, KW]; d, m [N, G]; y [1, N]; count [cdiv(N, BLOCK_N)] zeros. TMA (with PIPE):
    # W's words through the descriptor w_desc (stream() makes it), else w_desc is None.
    TW: tl.constexpr = GT * WPG
    T = tl.cdiv(KW, TW)  # K tiles a row tile
    total = tl.cdiv(N, BLOCK_N) * T
    P = tl.num_programs(0)
    pid = tl.program_id(0)
    it_lo = pid * total // P
    it_hi = (pid + 1) * total // P
    wword = tl.arange(0, GT)[None, None, :, None] * WPG + tl.arange(0, WPG)[None, None, None, :]
    lane = tl.arange(0, BLOCK_N)
    w_tile = _tile_ptrs(w_ptr, lane[None, :, None, None], wword, KW, TW, LN, LW)  # row tile 0
    xword = tl.arange(0, GT)[None, :, None, None] * WPG + tl.arange(0, WPG)[None, None, :, None]
    x_rows = x_ptr + tl.arange(0, 8)[None, None, None, :]
    if PIPE:  # each step's loads in its own turn, issued PIPE - 1 steps ahead by Triton (w4a16.py)
        pdl_wait(PDL)
        acc = tl.zeros([1, BLOCK_N, GT, WPG // 4], dtype=tl.float32)
        if INTERPRET:
            it = it_lo
            while it < it_hi:
                acc = _stream_pipe_step(acc, it, it + 1 < it_hi, T, total, P, pid, w_tile, w_desc, wword, lane,
                                        x_rows, xword, x_ptr, d_ptr, m_ptr, b_ptr, y_ptr, part_ptr, count_ptr, N,
                                        KW, G, S_DN, S_DG, WPG, GT, HAS_BIAS, SILU_MUL, BLOCK_N, INTERPRET, LN, LW,
                                        XRUN, TMA)
                it += 1
        else:
            for it in tl.range(it_lo, it_hi, num_stages=PIPE):
                acc = _stream_pipe_step(acc, it, it + 1 < it_hi, T, total, P, pid, w_tile, w_desc, wword, lane,
                                        x_rows, xword, x_ptr, d_ptr, m_ptr, b_ptr, y_ptr, part_ptr, count_ptr, N,
                                        KW, G, S_DN, S_DG, WPG, GT, HAS_BIAS, SILU_MUL, BLOCK_N, INTERPRET, LN, LW,
                                        XRUN, TMA)
    else:
        # the step as (row tile, first word), carried from step to step: no division in the loop
        r = it_lo // T
        kw0 = (it_lo - r * T) * TW
        # the next step's words, scales (constants: before the PDL wait) and x, loaded a step ahead
        w_next = _stream_w(w_tile, wword, lane, r, kw0, it_lo < it_hi, N, KW, BLOCK_N, LN)
        sc_next = _stream_scales(d_ptr, m_ptr, lane, r, kw0, N, KW, G, S_DN, S_DG, BLOCK_N, WPG, GT)
        pdl_wait(PDL)
        x_next = _x_tile(x_rows, kw0 + xword, True, 0, KW, KW, SILU_MUL)
        acc = tl.zeros([1, BLOCK_N, GT, WPG // 4], dtype=tl.float32)
        # (the interpreter cannot loop between runtime bounds: a while loop there, as in
        # attention.py; compiled code keeps the for loop)
        if INTERPRET:
            it = it_lo
            while it < it_hi:
                acc, w_next, sc_next, x_next, r, kw0 = _stream_step(
                    acc, w_next, sc_next, x_next, r, kw0, it + 1 < it_hi, T, total, P, pid, w_tile,
                    wword, lane, x_rows, xword, x_ptr, d_ptr, m_ptr, b_ptr, y_ptr, part_ptr, count_ptr,
                    N, KW, G, S_DN, S_DG, WPG, GT, HAS_BIAS, SILU_MUL, BLOCK_N, INTERPRET, LN, XRUN)
                it += 1
        else:
            for it in range(it_lo, it_hi):
                acc, w_next, sc_next, x_next, r, kw0 = _stream_step(
                    acc, w_next, sc_next, x_next, r, kw0, it + 1 < it_hi, T, total, P, pid, w_tile,
                    wword, lane, x_rows, xword, x_ptr, d_ptr, m_ptr, b_ptr, y_ptr, part_ptr, count_ptr,
                    N, KW, G, S_DN, S_DG, WPG, GT, HAS_BIAS, SILU_MUL, BLOCK_N, INTERPRET, LN, XRUN)


@triton.jit
def _stream_step(acc, w_next, sc_next, x_next, r, kw0, more, T, total, P, pid, w_tile, wword, lane,
                 x_rows, xword, x_ptr, d_ptr, m_ptr, b_ptr, y_ptr, part_ptr, count_ptr, N, KW, G,
                 S_DN, S_DG, WPG: tl.constexpr, GT: tl.constexpr, HAS_BIAS: tl.constexpr,
                 SILU_MUL: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr,
                 LN: tl.constexpr, XRUN: tl.constexpr):
    # The step at (row tile r, word kw0): its products from what the last step loaded, the
    # next step's words, scales and x loaded meanwhile (W's not past the run: `more`); at the
    # row tile's last K tile or the run's last step the sums leave (_stream_flush).
    # -> (acc, the next step's words, scales and x, its r and kw0)
    TW: tl.constexpr = GT * WPG
    last_k = kw0 + TW >= KW
    r_next = tl.where(last_k, r + 1, r)
    kw_next = tl.where(last_k, 0, kw0 + TW)
    w = w_next
    d, mn = sc_next
    x, up = x_next
    w_next = _stream_w(w_tile, wword, lane, r_next, kw_next, more, N, KW, BLOCK_N, LN)
    sc_next = _stream_scales(d_ptr, m_ptr, lane, r_next, kw_next, N, KW, G, S_DN, S_DG, BLOCK_N, WPG, GT)
    x_next = _x_tile(x_rows, kw_next + xword, True, 0, KW, KW, SILU_MUL)
    acc = _tile_products(acc, w, x, up, d, mn, x_ptr.dtype.element_ty, SILU_MUL, 1, BLOCK_N, GT,
                         WPG, INTERPRET, XRUN)
    if last_k | (not more):
        _stream_flush(tl.sum(tl.sum(acc, axis=3), axis=2), r, r * BLOCK_N + lane, T, total, P, pid, b_ptr, y_ptr,
                      part_ptr, count_ptr, N, HAS_BIAS)
        acc = tl.zeros_like(acc)
    return acc, w_next, sc_next, x_next, r_next, kw_next


@triton.jit
def _stream_pipe_step(acc, it, more, T, total, P, pid, w_tile, w_desc, wword, lane, x_rows, xword, x_ptr, d_ptr,
                      m_ptr, b_ptr, y_ptr, part_ptr, count_ptr, N, KW, G, S_DN, S_DG, WPG: tl.constexpr,
                      GT: tl.constexpr, HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr, BLOCK_N: tl.constexpr,
                      INTERPRET: tl.constexpr, LN: tl.constexpr, LW: tl.constexpr, XRUN: tl.constexpr,
                      TMA: tl.constexpr):
    # PIPE's step `it`: (row tile r, word kw0) from it itself, not carried, so that the
    # pipeline can compute a later step's addresses ahead (a division a step: ~20 instructions
    # against a tile's ~500); its loads, its products, and the sums out at the row tile's
    # last K tile or the run's last step
    TW: tl.constexpr = GT * WPG
    r = it // T
    kw0 = (it - r * T) * TW
    if TMA:
        w = _stream_w_tma(w_desc, r, kw0, BLOCK_N, GT, WPG, LN, LW)
    else:
        w = _stream_w(w_tile, wword, lane, r, kw0, True, N, KW, BLOCK_N, LN)
    d, mn = _stream_scales(d_ptr, m_ptr, lane, r, kw0, N, KW, G, S_DN, S_DG, BLOCK_N, WPG, GT)
    x, up = _x_tile(x_rows, kw0 + xword, True, 0, KW, KW, SILU_MUL)
    acc = _tile_products(acc, w, x, up, d, mn, x_ptr.dtype.element_ty, SILU_MUL, 1, BLOCK_N, GT, WPG, INTERPRET,
                         XRUN)
    if (kw0 + TW >= KW) | (not more):
        _stream_flush(tl.sum(tl.sum(acc, axis=3), axis=2), r, r * BLOCK_N + lane, T, total, P, pid, b_ptr, y_ptr,
                      part_ptr, count_ptr, N, HAS_BIAS, LANES=True)
        acc = tl.zeros_like(acc)
    return acc


@triton.jit
def _stream_scales(d_ptr, m_ptr, lane, r, kw0, N, KW, G, S_DN, S_DG, BLOCK_N: tl.constexpr, WPG: tl.constexpr,
                   GT: tl.constexpr):
    # (d, m) of row tile r's groups from word kw0, [1, BLOCK_N, GT]: the first tile's pointers
    # and an offset, so lane * G stays out of the loop (past the last row tile: masked)
    off = r * BLOCK_N * S_DN
    return _scales(d_ptr + off, m_ptr + off, lane, lane < N - r * BLOCK_N, kw0, 0, KW, G, S_DN, S_DG, WPG, GT)


@triton.jit
def _stream_w(w_tile, wword, lane, r, kw0, more, N, KW, BLOCK_N: tl.constexpr, LN: tl.constexpr):
    # W's words at (row tile r, word kw0), [1, BLOCK_N, GT, WPG] (zeros if not `more`)
    n_ok = (lane < N - r * BLOCK_N)[None, :, None, None] & more
    return tl.load(w_tile + r * BLOCK_N * KW + _tile_step(kw0, LN),
                   mask=n_ok & (kw0 + wword < KW), other=0)


@triton.jit
def _stream_w_tma(w_desc, r, kw0, BLOCK_N: tl.constexpr, GT: tl.constexpr, WPG: tl.constexpr, LN: tl.constexpr,
                  LW: tl.constexpr):
    # W's words at (row tile r, word kw0), [1, BLOCK_N, GT, WPG], copied by the tensor memory
    # accelerator into shared memory (zeros past N and K): one thread issues a step's whole
    # copy, with no address or register a word, so PIPE - 1 steps in flight cost only shared
    # memory. Row-major words: blocks [BLOCK_N, TW] of [N, KW]. In word tiles (int4_words) a
    # step's words are BLOCK_N / LN runs of TW LN contiguous words, one a tile row: w_desc
    # views the words as [N / LN, KW LN / C, C] with C = min(LW LN, 256) (a copy's box is at
    # most 256 a dimension; KW is a multiple of LW) and takes blocks [BLOCK_N / LN, TW LN / C, C]
    # (_descriptor).
    TW: tl.constexpr = GT * WPG
    if LN == 0:
        w = tl.reshape(w_desc.load([r * BLOCK_N, kw0]), [1, BLOCK_N, GT, WPG])
    else:
        A: tl.constexpr = BLOCK_N // LN
        C: tl.constexpr = LW * LN if LW * LN < 256 else 256
        w = w_desc.load([r * A, kw0 * LN // C, 0])  # [A, TW LN / C, C]
        w = tl.permute(tl.reshape(w, [A, TW // LW, LN, LW]), [0, 2, 1, 3])  # [A, LN, TW / LW, LW]
        w = tl.reshape(w, [1, BLOCK_N, GT, WPG])
    return w


@triton.jit
def _stream_flush(out, r, n, T, total, P, pid, b_ptr, y_ptr, part_ptr, count_ptr, N,
                  HAS_BIAS: tl.constexpr, LANES: tl.constexpr = False):
    # out [1, BLOCK_N]: this program's sums for row tile r, whose K tiles are the steps
    # [r T, (r + 1) T). Program c runs the steps [c total / P, (c + 1) total / P), so the tile's
    # first and last programs are ((x + 1) P - 1) // total at x = r T and x = (r + 1) T - 1.
    # LANES (PIPE): a count per row of W (count [N] zeros) instead of one per tile: each lane's
    # atomic (acq_rel) follows its own store of its sums, so no barrier is needed (a barrier in
    # a loop stops Triton's pipeline); for each row the program that counts last adds it up.
    first = ((r * T + 1) * P - 1) // total
    last = (((r + 1) * T) * P - 1) // total
    n_ok = (n < N)[None, :]
    if first == last:  # one program holds the whole tile
        if HAS_BIAS:
            out += tl.load(b_ptr + n, mask=n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + n[None, :], out.to(y_ptr.dtype.element_ty), mask=n_ok)
    elif LANES:
        tl.store(part_ptr + (pid - first) * N + n[None, :], out, mask=n_ok)
        done = tl.atomic_add(count_ptr + n[None, :], tl.full(out.shape, 1, tl.int32), mask=n_ok, sem="acq_rel",
                             scope="gpu")
        mine = n_ok & (done == last - first)
        out = tl.zeros_like(out)
        k = 0
        while k <= last - first:  # slot order: the same sum whoever finishes last
            out += tl.load(part_ptr + k * N + n[None, :], mask=mine, other=0.0, cache_modifier=".cg")
            k += 1
        tl.store(count_ptr + n[None, :], tl.zeros_like(done), mask=mine)
        if HAS_BIAS:
            out += tl.load(b_ptr + n[None, :], mask=mine, other=0.0).to(tl.float32)
        tl.store(y_ptr + n[None, :], out.to(y_ptr.dtype.element_ty), mask=mine)
    else:
        tl.store(part_ptr + (pid - first) * N + n[None, :], out, mask=n_ok)
        tl.debug_barrier()  # every lane's sums stored before the count says so
        done = tl.atomic_add(count_ptr + r, 1, sem="acq_rel", scope="gpu")
        if done == last - first:
            out = tl.zeros_like(out)
            k = 0
            while k <= last - first:  # slot order: the same sum whoever finishes last
                out += tl.load(part_ptr + k * N + n[None, :], mask=n_ok, other=0.0,
                               cache_modifier=".cg")
                k += 1
            tl.store(count_ptr + r, 0)
            if HAS_BIAS:
                out += tl.load(b_ptr + n, mask=n < N, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptr + n[None, :], out.to(y_ptr.dtype.element_ty), mask=n_ok)


def stream(x, words, d, m, bias, y, silu_mul: bool, layout, use_pdl: bool, cfg: dict) -> None:
    """One row through _w4a16_stream_kernel on cfg["STREAM"] programs (at most one a step)."""
    n, kw = words.shape
    block_n, gt = cfg["BLOCK_N"], cfg["GT"]
    wpg = kw // d.shape[1]
    lay = layout_args(layout)
    if lay["LN"] and block_n % lay["LN"]:
        raise ValueError(f"a stream's tiles of {block_n} rows do not take whole "
                         f"{lay['LN']}-row word tiles")
    tiles = triton.cdiv(n, block_n)
    total = tiles * triton.cdiv(kw, gt * wpg)
    programs = min(cfg["STREAM"], total)
    slots = triton.cdiv(triton.cdiv(kw, gt * wpg), total // programs) + 1  # programs a tile at most
    part, count = _scratch(x.device, slots * n, n if cfg.get("PIPE") else tiles)  # PIPE: a count a row
    tma = cfg.get("TMA", 0)
    if tma and not cfg.get("PIPE"):
        raise ValueError("TMA's copies are issued by Triton's pipeline: a stream tile with TMA takes PIPE")
    _w4a16_stream_kernel[(programs,)](
        x, words, _descriptor(words, block_n, gt * wpg, lay) if tma else None, d, m,
        bias if bias is not None else d, y, part, count, n, kw, d.shape[1], *d.stride(),
        WPG=wpg, GT=gt, HAS_BIAS=bias is not None, SILU_MUL=silu_mul, BLOCK_N=block_n, PDL=use_pdl,
        XRUN=cfg.get("XRUN", 0), PIPE=cfg.get("PIPE", 0), TMA=tma,
        INTERPRET=INTERPRETED, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        launch_pdl=use_pdl, **lay)


def _descriptor(words, block_n: int, tw: int, lay: dict) -> TensorDescriptor:
    """The tensor-memory-accelerator descriptor of the words [N, KW] for _stream_w_tma (its
    view and blocks). Made per call (a few microseconds of Python; a CUDA graph's replay makes
    none). The accelerator takes 16-byte aligned rows: KW a multiple of 4 words (every group
    of 32 or more columns makes whole words of 4)."""
    n, kw = words.shape
    ln = lay["LN"]
    if not ln:
        return TensorDescriptor(words, [n, kw], [kw, 1], [block_n, tw])
    c = min(lay["LW"] * ln, 256)
    rows = kw * ln // c
    return TensorDescriptor(words, [n // ln, rows, c], [rows * c, c, 1], [block_n // ln, tw * ln // c, c])
