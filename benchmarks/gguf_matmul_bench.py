"""Every weight matrix of the default model once, as a decode step reads them: the GGUF block kernel
(csrc/gguf_matmul.c, weights kept as Q4_1/Q8_0 blocks) against oneDNN on float32 weights.

    .venv/bin/python benchmarks/gguf_matmul_bench.py > benchmarks/results/DATE-gguf-matmul-cpu.txt
"""
import math, time, numpy as np, torch
from nextok import hub
from nextok.model.gguf import GGUFFile
from nextok.model.gguf_format import dequantize
from nextok.kernels.cpu_gguf_linear import GGUFBlockLinear
from nextok.kernels.cpu_linear import PackedLinear
torch.set_num_threads(2)
path = hub.resolve_model(None); g = GGUFFile(path)
layers = []
with open(path, "rb") as f:
    for name, info in g.tensor_infos.items():
        if info.type_id not in (3, 8): continue
        f.seek(info.offset); raw = np.frombuffer(f.read(info.nbytes), dtype=np.uint8)
        n, k = info.shape
        w = dequantize(raw.copy(), info.type_id, n * k).view(n, k)
        layers.append((GGUFBlockLinear(raw, info.type_id, n, k), PackedLinear(w, None), k))
from nextok.bench import common
h = common.header()
print(common.machine_line(h['machine']), '| commit', h['commit'], '| benchmarks/gguf_matmul_bench.py')
print(len(layers), 'matrices (Q4_1 and the Q8_0 tied embedding / lm_head); median of 5 passes; 2 threads')
for rows in (1, 4, 8):
    xs = {k: torch.randn(rows, k) for _, _, k in layers}
    for label, idx in (("gguf blocks", 0), ("oneDNN fp32", 1)):
        ts = []
        for rep in range(5):
            t = time.perf_counter()
            for l in layers:
                l[idx](xs[l[2]])
            ts.append(time.perf_counter() - t)
        print(f"rows {rows}: {label:<12} all matrices once: {sorted(ts)[2]*1000:.1f} ms")
