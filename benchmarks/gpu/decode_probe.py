"""The paged decode kernel's tiles swept per KV cache dtype (issue 7: the fp8 cache's decode).

    python3 benchmarks/gpu/decode_probe.py OUT.json [KINDS]

For each cache (auto = the activations' bfloat16, int8, fp8; KINDS comma-separated) at the
Llama-3.1-8B attention shape (32 query heads, 8 KV heads of 128, pages of 16) and two decode
batches (256 x 576 keys: the offline throughput run's; 32 x 4096), times kernels/triton/
attention.py's paged_decode at every (BLOCK_N, num_warps, num_stages) of a small grid, with
the pages shuffled and the L2 flushed between calls. Prints each tile's microseconds and its
share of the copy bandwidth, and the best per case; writes them all to OUT.json.
"""
from __future__ import annotations

import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.getcwd())

from nextok.attention import kv_quant  # noqa: E402
from nextok.bench.common import header  # noqa: E402
from nextok.bench.kernels import Timer  # noqa: E402
from nextok.kernels.triton import attention  # noqa: E402

CASES = [(256, 576), (32, 4096)]
H, KVH, D, PAGE = 32, 8, 128, 16
# DECODE_TILES=NxWxS,...: only these (BLOCK_N x num_warps x num_stages)
TILES = ([tuple(int(v) for v in t.split("x")) for t in os.environ["DECODE_TILES"].split(",")]
         if os.environ.get("DECODE_TILES") else list(itertools.product((32, 64, 128), (4, 8), (2, 3, 4))))


def main() -> int:
    out_path = sys.argv[1]
    kinds = (sys.argv[2] if len(sys.argv) > 2 else "auto,int8,fp8").split(",")
    dev = torch.device("cuda")
    timer = Timer(dev, iters=30, warmup=3)
    copy_gbps = timer.copy_bandwidth(1 << 30)
    gen = torch.Generator().manual_seed(0)
    rows, best, head = [], {}, header()
    for kind, (b, ctx) in itertools.product(kinds, CASES):
        per_seq = -(-ctx // PAGE)
        caches = [torch.randn(b * per_seq + 1, PAGE, KVH, D, generator=gen).to(dev, torch.bfloat16)
                  for _ in range(2)]
        if kind != "auto":
            caches = [kv_quant.quantize_rows(c, kv_quant.DTYPES[kind]) for c in caches]
        tables = (torch.randperm(b * per_seq, generator=gen) + 1).view(b, per_seq).to(dev)
        lens = torch.full((b,), ctx, dtype=torch.int64, device=dev)
        q = torch.randn(b, H, D, generator=gen).to(dev, torch.bfloat16)
        nbytes = 2 * b * ctx * KVH * caches[0].shape[-1] * caches[0].element_size()
        ref = None
        for tile in TILES:
            attention.DECODE_OVERRIDE = tile
            o = torch.empty_like(q)
            call = lambda: attention.paged_decode(q, *caches, tables, lens, D ** -0.5, None, o)  # noqa: E731
            try:
                call()
                torch.cuda.synchronize()
            except Exception as e:  # a tile that does not fit (shared memory) is skipped
                print(f"{kind} {b}x{ctx} {tile}: {type(e).__name__} {str(e)[:100]}")
                continue
            ref = o.clone() if ref is None else ref
            diff = (o.float() - ref.float()).abs().max().item()
            us = timer.time_us(call)
            gbps = nbytes / us / 1e3
            rows.append(dict(kind=kind, batch=b, context=ctx, BLOCK_N=tile[0], num_warps=tile[1],
                             num_stages=tile[2], us=us, gbps=gbps, pct_of_copy=100 * gbps / copy_gbps,
                             max_diff_vs_first=diff))
            print(f"{kind:5} {b:4}x{ctx:<5} BLOCK_N {tile[0]:3} warps {tile[1]} stages {tile[2]}: "
                  f"{us:8.1f} us {100 * gbps / copy_gbps:5.1f}% of copy (diff {diff:.1e})", flush=True)
        # after each case: a call cut short at its deadline keeps the cases before
        case = [r for r in rows if (r["kind"], r["batch"], r["context"]) == (kind, b, ctx)]
        if case:
            r = min(case, key=lambda r: r["us"])
            default = [c for c in case if (c["BLOCK_N"], c["num_warps"], c["num_stages"]) == (64, 4, 3)]
            best[f"{kind} {b}x{ctx}"] = r
            print(f"best {kind} {b}x{ctx}: BLOCK_N {r['BLOCK_N']} warps {r['num_warps']} stages "
                  f"{r['num_stages']} {r['us']:.1f} us ({r['pct_of_copy']:.0f}% of copy)"
                  + (f"; default 64/4/3 {default[0]['us']:.1f} us" if default else ""), flush=True)
        with open(out_path, "w") as f:
            json.dump(dict(head, copy_gbps=copy_gbps, rows=rows, best=best), f, indent=1)
    attention.DECODE_OVERRIDE = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
