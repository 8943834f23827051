"""One 4096 x 4096 matrix per GGUF block type with int8 activations: the regrouped kernel
(csrc/gguf_rows16.c) against the row-at-a-time one (gguf_matmul_q8 / gguf_kq_matmul_q8), at 1 and
8 rows of x; random blocks (the same bytes for both), 2 threads, calls alternating, median of 31.

    PYTHONPATH=. .venv/bin/python benchmarks/gguf_rows16_types_bench.py > benchmarks/results/DATE-gguf-rows16-types-cpu.txt
"""
import statistics, sys, time
import torch
from nextok.bench import common
from nextok.kernels.cpu_gguf_linear import GGUFBlockLinear, ROWS16_TYPES, load_gguf_matmul, type_name
from tests.kernels.test_cpu_gguf_linear import random_blocks

torch.set_num_threads(2)
N = K = 4096
h = common.header()
print(common.machine_line(h["machine"]), "| commit", h["commit"], "| benchmarks/gguf_rows16_types_bench.py")
print(f"loadavg before: {open('/proc/loadavg').read().strip()}")
print(f"{'type':6} {'rows':>4} {'regrouped us':>13} {'row-at-a-time us':>17} {'ratio':>6} {'GB/s regrouped':>15}")
for type_id in ROWS16_TYPES:
    blocks = random_blocks(type_id, N, K, seed=type_id)
    layer = GGUFBlockLinear(blocks, type_id, N, K, activations="int8")
    old, w = load_gguf_matmul("int8", type_id), torch.from_numpy(blocks.copy())
    for rows in (1, 8):
        x = torch.randn(rows, K)
        y = torch.empty(rows, N)
        calls = {"new": lambda: layer(x),
                 "old": lambda: old(x.data_ptr(), rows, K, w.data_ptr(), type_id, N, y.data_ptr(), 2)}
        times = {"new": [], "old": []}
        for _ in range(31):
            for name, fn in calls.items():
                t0 = time.perf_counter(); fn(); times[name].append(time.perf_counter() - t0)
        new, old_t = statistics.median(times["new"]) * 1e6, statistics.median(times["old"]) * 1e6
        print(f"{type_name(type_id):6} {rows:4} {new:13.0f} {old_t:17.0f} {new / old_t:6.2f} "
              f"{layer.nbytes / new / 1e3:15.1f}")
print(f"loadavg after: {open('/proc/loadavg').read().strip()}")
