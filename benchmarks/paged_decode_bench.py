"""The CPU paged decode attention kernel (csrc/paged_decode.c) alone: one query row per sequence
over every layer's own caches (30 layers, so the keys stream from memory as in a decode step, not
from cache), random block tables, shape of the default model unless given (H 9, KVH 3, D 64,
block 16). Prints us per layer call and the K/V bytes read per second, at 1 and 2 threads.

    PYTHONPATH=. .venv/bin/python benchmarks/paged_decode_bench.py [--dtype bfloat16] [--lens 128,1000,4000] [--batch 1]
"""
import argparse
import time

import torch

from nextok.bench import common
from nextok.kernels.cpu_attention import load_paged_decode, paged_decode

p = argparse.ArgumentParser()
p.add_argument("--heads", type=int, default=9)
p.add_argument("--kv-heads", type=int, default=3)
p.add_argument("--head-dim", type=int, default=64)
p.add_argument("--block-size", type=int, default=16)
p.add_argument("--layers", type=int, default=30)
p.add_argument("--batch", type=int, default=1)
p.add_argument("--lens", default="128,1000,4000")
p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
args = p.parse_args()
dtype = getattr(torch, args.dtype)
fns = load_paged_decode()
h = common.header()
print(common.machine_line(h["machine"]), "| commit", h["commit"], "| benchmarks/paged_decode_bench.py", args)
print(f"loadavg before: {open('/proc/loadavg').read().strip()}")
gen = torch.Generator().manual_seed(0)
for n in (int(x) for x in args.lens.split(",")):
    nb = -(-n // args.block_size)
    blocks = args.batch * nb + 1
    shape = (blocks, args.block_size, args.kv_heads, args.head_dim)
    ks = [torch.randn(shape, generator=gen).to(dtype) for _ in range(args.layers)]
    vs = [torch.randn(shape, generator=gen).to(dtype) for _ in range(args.layers)]
    tables = (torch.randperm(blocks - 1, generator=gen)[:args.batch * nb] + 1).view(args.batch, nb)
    lens = torch.full((args.batch,), n, dtype=torch.long)
    q = torch.randn(args.batch, args.heads, args.head_dim, generator=gen).to(dtype)
    kv_bytes = 2 * args.batch * n * args.kv_heads * args.head_dim * ks[0].element_size()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        times = []
        for rnd in range(6):
            t0 = time.perf_counter()
            for k, v in zip(ks, vs):
                paged_decode(fns, q, k, v, tables, lens, args.head_dim ** -0.5, None)
            times.append((time.perf_counter() - t0) / args.layers)
        best = sorted(times[1:])[len(times[1:]) // 2]
        print(f"len {n:6d} batch {args.batch:3d} threads {threads}: {best * 1e6:9.1f} us/layer "
              f"{kv_bytes / best / 1e9:6.2f} GB/s of K/V")
