"""The W4A16 kernel's tiles swept at decode shapes, against bf16 (issue 7, item 4).

    python3 benchmarks/gpu/w4a16_probe.py OUT.json TABLE.json [SHAPES]

For each shape y = x @ W.T (N x K, groups of 128) and 1, 4 and 8 rows: bf16 through cuBLAS
(F.linear) and through nextok's Triton GEMV, and the W4A16 kernel: the dp4a kernel at every
tile of a grid for 1, 4 and 8 rows (all rows in one program; one row also as a stream on 1-4
programs an SM), and for 8 rows the tl.dot kernel's tuned tile beside it.
Weights rotate over copies larger than the 50 MB L2, as each layer's do in a real step, and
each variant is timed as a CUDA graph of 24 calls (a Python launch costs more than a 4-bit
o_proj reads). Writes every timing to OUT.json and the fastest tile per shape and row class to
TABLE.json, the format kernels/triton/w4a16.py reads (configs/w4a16_<gpu>.json; its "16"
entries, the tl.dot tiles, and the row classes not probed (PROBE_ROWS) are kept from the table in
the repo).
SHAPES: comma-separated NxK (default: the Llama-3.1-8B layers and Qwen2.5-Coder-7B's).
The words are in Int4Linear's CUDA order, tiles of int4_words.LAYOUT (PROBE_LAYOUT=rowmajor: row
order); each best tile is timed again on the words in the other order ("other_layout") and
with d and m in group order ("group_major_us", quant/int4.py GROUP_MAJOR_MAX).
"""
from __future__ import annotations

import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())

from nextok.bench.common import header  # noqa: E402
from nextok.kernels.triton import int4_words as words4  # noqa: E402
from nextok.kernels.triton import w4a16 as w4  # noqa: E402
from nextok.kernels.triton import w4a16_tiles as tiles  # noqa: E402
from nextok.kernels.triton.gemv import gemv  # noqa: E402
from nextok.quant.base import scales_in_order  # noqa: E402
from nextok.quant.int4 import dequantize_groups, pack_words, quantize_groups  # noqa: E402

DEFAULT_SHAPES = "6144x4096,4096x4096,28672x4096,4096x14336,4608x3584,3584x3584,37888x3584,3584x18944"
CALLS = 24
# the words' order swept: Int4Linear's tiles on CUDA (int4_words.LAYOUT), or PROBE_LAYOUT=rowmajor
LAYOUT = None if os.environ.get("PROBE_LAYOUT") == "rowmajor" else words4.LAYOUT
ROW_COUNTS = [int(r) for r in os.environ.get("PROBE_ROWS", "1,4,8").split(",")]  # PROBE_ROWS=1: one row only
# DEPTH: tiles of W loaded ahead; XAHEAD: x's tiles loaded one ahead too (w4a16.py). One row:
# TW 32 only, the best at every 8B shape on both cards (2026-12-05), and XAHEAD 1, the best at
# each on the H200 (2026-12-05 night). BLOCK_N 256: 8 rows a thread at 4 warps share each x
# word's preparation, 15.1 instructions a word of W on sm_90 against 16.9 at 128 (whole tiles).
# UNROLL: the loop in turns of DEPTH + 1 tiles with buffers of their own (no moves; at DEPTH 2
# the loads really two tiles ahead): 479 / 477 instructions a tile at gate_up's, 294 at down's
# (BLOCK_N 64, DEPTH 2), against 512 and 336 (sm_90). BLOCK_N 256 with UNROLL spills.
# PROBE_SPLITK=0: none of these (nor PIPE's split-K tiles below), for a sweep of the stream's
# tiles alone within a short call (each tile is compiled once, ~1 s, on a fresh machine)
SPLITK = os.environ.get("PROBE_SPLITK", "1") != "0"
DP4A = [dict(BLOCK_N=bn, TW=32, num_warps=nw, num_stages=3, SPLIT=sp, BLOCK_M=1, DEPTH=dp, XAHEAD=1,
             UNROLL=un)
        for bn, nw, sp, dp, un in itertools.product((64, 128, 256), (4, 8), (2, 4, 8), (1, 2), (0, 1))
        if SPLITK and not (bn == 256 and (un or dp == 2)) and not (bn == 64 and nw == 8)]
# (SPLIT 16 and BLOCK_N 64 at 8 warps were never among the five best at an 8B shape, 2026-12-05)
# PIPE: the loop's loads pipelined by Triton through shared memory, 2 tiles ahead (w4a16.py). On
# an H100 (2026-12-07-gguf-h100.md) never the best: 1.03-1.13x the best tile's time at each 8B
# shape; 4 tiles ahead (PIPE 5) slower still. Swept for the H200, whose DRAM is faster.
if SPLITK and os.environ.get("PROBE_PIPE", "1") != "0":
    DP4A += [dict(BLOCK_N=bn, TW=32, num_warps=nw, num_stages=3, SPLIT=sp, BLOCK_M=1, PIPE=3)
             for bn, nw, sp in itertools.product((64, 128, 256), (4, 8), (2, 4, 8)) if not (bn == 64 and nw == 8)]
# and one row as a stream (_w4a16_stream_kernel) on 1-4 programs an SM (PROBE_STREAM=0: not)
SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
if os.environ.get("PROBE_STREAM", "1") != "0":
    DP4A += [dict(BLOCK_N=bn, TW=32, num_warps=nw, num_stages=3, SPLIT=1, BLOCK_M=1, DEPTH=1, XAHEAD=0,
                  STREAM=per_sm * SMS, XRUN=xr)
             for bn, nw, per_sm, xr in itertools.product((64, 128), (4, 8), (1, 2, 3, 4), (0, 1))]
    if os.environ.get("PROBE_PIPE", "1") != "0":  # the stream's loads pipelined by Triton too
        DP4A += [dict(BLOCK_N=bn, TW=32, num_warps=4, num_stages=3, SPLIT=1, BLOCK_M=1, STREAM=per_sm * SMS,
                      PIPE=3) for bn, per_sm in itertools.product((64, 128), (2, 3, 4))]
    if os.environ.get("PROBE_TMA", "1") != "0":  # W's words copied by the tensor memory accelerator
        # (w4a16_stream.py _stream_w_tma): PIPE - 1 steps in flight for shared memory alone
        DP4A += [dict(BLOCK_N=bn, TW=32, num_warps=4, num_stages=3, SPLIT=1, BLOCK_M=1, STREAM=per_sm * SMS,
                      PIPE=pipe, TMA=1, XRUN=1)
                 for bn, per_sm, pipe in itertools.product((64, 128), (1, 2, 3, 4), (3, 4, 5))]
        # deeper: 5-7 steps of 8 KB in flight a program, for DRAM whose latency x bandwidth
        # the loop's own loads do not cover
        DP4A += [dict(BLOCK_N=64, TW=32, num_warps=4, num_stages=3, SPLIT=1, BLOCK_M=1, STREAM=per_sm * SMS,
                      PIPE=pipe, TMA=1, XRUN=1) for per_sm, pipe in itertools.product((2, 3, 4), (6, 8))]
# XRUN: x's fixed point per run of 4 words, whose products add up in dp4a's accumulator (w4a16.py);
# one row: beside the stream's, at the split-K tiles that won on either card
DP4A += [dict(BLOCK_N=bn, TW=32, num_warps=4, num_stages=3, SPLIT=sp, BLOCK_M=1, DEPTH=1, XAHEAD=1, XRUN=1)
         for bn, sp in itertools.product((64, 128), (4, 8))]
# 4 and 8 rows: all rows in one program; BLOCK_N 64 (32 never won at 4 or 8 rows: H200
# 2026-12-05, H100 2026-12-06)
ROWS = {rows: [dict(BLOCK_N=64, TW=tw, num_warps=nw, num_stages=3, SPLIT=sp, BLOCK_M=rows, DEPTH=1, XAHEAD=xa,
                    XRUN=xr)
               for tw, nw, sp, xa, xr in itertools.product((16, 32), (4, 8), (2, 4, 8), (0, 1), (0, 1))]
        for rows in (4, 8)}


def graph_us(fn, copies: int) -> float:
    """Microseconds per call of fn(i) for i rotating over the copies, replayed as one graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            fn(i % copies)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            fn(i % copies)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (10 * CALLS)


def main() -> int:
    out_path, table_path = sys.argv[1], sys.argv[2]
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[3] if len(sys.argv) > 3 else DEFAULT_SHAPES).split(",")]
    dev, rows, table = torch.device("cuda"), [], {}
    for n, k in shapes:
        w = torch.randn(n, k, device=dev) * k ** -0.5
        q, d, m = quantize_groups(w, 128)
        bf = w.to(torch.bfloat16)
        copies = max(2, -(-400 * 2**20 // (n * k * 2)))  # bf16 copies over 400 MB
        bfs = [bf.clone() for _ in range(copies)]
        words = pack_words(q)
        # the layout Int4Linear keeps on CUDA (tiles), and row-major words to time the best tile on
        other = None if LAYOUT else words4.LAYOUT
        packed = [(words4.tile_words(words) if LAYOUT else words.clone(), d.clone(), m.clone())
                  for _ in range(copies)]
        packed_other = [(words4.tile_words(words) if other else words.clone(), d.clone(), m.clone())
                        for _ in range(copies)]
        packed_bytes = words.numel() * 4 + d.numel() * 2 + m.numel() * 2
        ref_w = dequantize_groups(q, d, m)
        del w, q
        for mrows in ROW_COUNTS:
            x = torch.randn(mrows, k, device=dev, dtype=torch.bfloat16)
            ref = F.linear(x.float(), ref_w)
            r = {"n": n, "k": k, "rows": mrows, "packed_bytes": packed_bytes}
            r["bf16_cublas_us"] = graph_us(lambda i: F.linear(x, bfs[i]), copies)
            r["bf16_gemv_us"] = graph_us(lambda i: gemv(x, bfs[i]), copies)
            grid = DP4A if mrows == 1 else ROWS[mrows]
            sweep = [t for t in (time_tile(cfg, x, packed, ref, copies, LAYOUT) for cfg in grid) if t]
            best = min(sweep, key=lambda s: s["us"])
            if mrows == 1 and not best.get("STREAM"):  # the best tile again with ptxas held to
                # 128 registers a thread (4 programs of 4 warps an SM): ptxas's own count moves
                # with unrelated code (the stream kernel takes no cap)
                tile = dict({key: v for key, v in best.items() if key not in ("us", "max_diff")}, maxnreg=128)
                tiles.set_config(tile)
                try:
                    capped = dict(tile, us=graph_us(lambda i: w4.w4a16(x, *packed[i], layout=LAYOUT), copies),
                                  max_diff=best["max_diff"])
                    sweep.append(capped)
                    best = min(best, capped, key=lambda s: s["us"])
                except Exception as e:
                    print(f"  {n}x{k} maxnreg 128: {type(e).__name__}: {str(e)[:120]}", flush=True)
            # the best tile on the words in the other order: what the layout is worth
            tile = {key: v for key, v in best.items() if key not in ("us", "max_diff")}
            tiles.set_config(tile)
            r["other_layout"] = {"layout": other, "us": graph_us(
                lambda i: w4.w4a16(x, *packed_other[i], layout=other), copies)}
            # and on d, m in group order (quant/int4.py GROUP_MAJOR_MAX): what that order is worth
            # at groups of 128
            gm = [(words_i, scales_in_order(d_i, True), scales_in_order(m_i, True)) for words_i, d_i, m_i in packed]
            r["group_major_us"] = graph_us(lambda i: w4.w4a16(x, *gm[i], layout=LAYOUT), copies)
            r["group_major_max_diff"] = (w4.w4a16(x, *gm[0], layout=LAYOUT).float() - ref).abs().max().item()
            del gm
            tiles.set_config(None)
            r["sweep"], r["best"] = sweep, best
            r["w4a16_us"] = best["us"]
            r["w4a16_tbps"] = packed_bytes / best["us"] / 1e6
            r["bf16_tbps"] = n * k * 2 / min(r["bf16_cublas_us"], r["bf16_gemv_us"]) / 1e6
            rows.append(r)
            table.setdefault(f"{n}x{k}", {})[str(mrows)] = tile
            if mrows == 8:  # the tl.dot kernel's tile from the repo's table, beside it
                tiles.DP4A_ROWS = 4
                r["dot_us"] = graph_us(lambda i: w4.w4a16(x, *packed[i], layout=LAYOUT), copies)
                tiles.DP4A_ROWS = 8
                print(f"  8 rows through the tl.dot kernel: {r['dot_us']:.1f} us", flush=True)
                if r["dot_us"] < best["us"]:
                    table[f"{n}x{k}"]["8"] = {"dot": True}
            bf_best = min(r["bf16_cublas_us"], r["bf16_gemv_us"])
            print(f"{n:>6}x{k:<6} rows {mrows}: bf16 cuBLAS {r['bf16_cublas_us']:6.1f} us, GEMV "
                  f"{r['bf16_gemv_us']:6.1f} us ({r['bf16_tbps']:.2f} TB/s) | w4a16 {best['us']:6.1f} us "
                  f"({r['w4a16_tbps']:.2f} TB/s, {bf_best / best['us']:.2f}x) max diff {best['max_diff']:.3g} "
                  f"tile {({k_: v for k_, v in best.items() if k_ not in ('us', 'max_diff')})}; "
                  f"words {'row-major' if other is None else 'in tiles'}: {r['other_layout']['us']:.1f} us; "
                  f"d, m in group order {r['group_major_us']:.1f} us",
                  flush=True)
        del bfs, packed, packed_other
        torch.cuda.empty_cache()
        # after every shape: a sweep cut short by its call's deadline keeps the shapes it did
        write_results(table, table_path, out_path, LAYOUT, rows, dev)
    return 0


def time_tile(cfg: dict, x, packed: list, ref, copies: int, layout) -> dict | None:
    """cfg with its time (us) and largest difference from ref (max_diff) over the packed
    copies, or None (said why) for a tile the compiler or the SM cannot take."""
    tiles.set_config(cfg)
    try:
        us = graph_us(lambda i: w4.w4a16(x, *packed[i], layout=layout), copies)
        err = (w4.w4a16(x, *packed[0], layout=layout).float() - ref).abs().max().item()
    except Exception as e:
        print(f"  {tuple(packed[0][0].shape)} rows {x.shape[0]} {cfg}: {type(e).__name__}: {str(e)[:120]}",
              flush=True)
        return None
    finally:
        tiles.set_config(None)
    return dict(cfg, us=us, max_diff=err)


def write_results(table: dict, table_path: str, out_path: str, layout, rows: list, dev) -> None:
    """TABLE: the probed tiles over the repo's table for this GPU (the row classes and shapes
    not probed stay); OUT: every timing, with the machine and commit."""
    table = {shape: dict(entry) for shape, entry in table.items()}  # (the caller's, unchanged)
    kept = tiles._tuned(torch.cuda.get_device_name(dev))
    for shape, entry in kept.items():
        for cls, tile in entry.items():
            table.setdefault(shape, {}).setdefault(cls, tile)
    with open(table_path, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    with open(out_path, "w") as f:
        json.dump(header({"layout": layout, "rows": rows}), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
