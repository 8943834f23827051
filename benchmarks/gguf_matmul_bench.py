"""Every weight matrix of a GGUF model (the default one, or --model FILE, e.g. a Q4_K_M file) once, as a
decode step reads them: the GGUF block kernels (csrc/gguf_matmul.c, csrc/gguf_unpacked.c: weights
kept as their blocks) with int8 and with float32 activations (int8: every type regrouped 16 rows
at a time, csrc/gguf_rows16.c, where the CPU has AVX-512 VNNI or AVX2; "int8 1-row" is the
row-at-a-time kernel, gguf_matmul_q8 or gguf_kq_matmul_q8, as every type had before),
dequantized per call into a float32 scratch for oneDNN (--gguf-blocks-only past its row limit), and
oneDNN on float32 and bfloat16 weights (the dense copy; what --dtype bfloat16 runs). Passes of the modes
alternate, so a noisy neighbour hits them alike; /proc/loadavg is printed before and after.

    PYTHONPATH=. .venv/bin/python benchmarks/gguf_matmul_bench.py [--model FILE] [ROWS ...] > benchmarks/results/DATE-gguf-matmul-cpu.txt
"""
import collections, sys, time, numpy as np, torch
from nextok import hub, platform
from nextok.model.gguf import GGUFFile
from nextok.model.gguf_format import dequantize
from nextok.kernels.cpu_gguf_linear import BlockLinear, GGUFBlockLinear, load_gguf_matmul, supported_types, type_name
from nextok.kernels.cpu_linear import PackedLinear
from nextok.bench import common

torch.set_num_threads(2)
args = sys.argv[1:]
model = args.pop(args.index("--model") + 1) if "--model" in args else None
args = [a for a in args if a != "--model"]
rows_list = [int(a) for a in args] or [1, 2, 4, 8, 12, 16, 24, 32, 48]
path = hub.resolve_model(model); g = GGUFFile(path)
types = collections.Counter()
modes = {"blocks int8": [], "int8 1-row": [], "blocks fp32": [], "dequant+fp32": [], "oneDNN fp32": [],
         "oneDNN bf16": []}


class RowAtATime:
    """gguf_matmul_q8 on the blocks as the file has them (x [M, K] float32 -> [M, N])."""

    def __init__(self, raw, type_id, n, k):
        self.w, self.fn, self.type_id, self.n, self.k = torch.from_numpy(raw.copy()), load_gguf_matmul("int8", type_id), type_id, n, k

    def __call__(self, x):
        y = torch.empty(x.shape[0], self.n)
        assert self.fn(x.data_ptr(), x.shape[0], self.k, self.w.data_ptr(), self.type_id, self.n, y.data_ptr(), 2) == 0
        return y


BF16 = torch.backends.mkldnn.is_available() and "avx512_bf16" in platform.cpu_flags() or "avx_ne_convert" in platform.cpu_flags()
with open(path, "rb") as f:
    for name, info in g.tensor_infos.items():
        if info.type_id not in supported_types() or len(info.shape) != 2: continue
        types[type_name(info.type_id)] += 1
        f.seek(info.offset); raw = np.frombuffer(f.read(info.nbytes), dtype=np.uint8)
        n, k = info.shape
        w = dequantize(raw.copy(), info.type_id, n * k).view(n, k)
        modes["blocks int8"].append((GGUFBlockLinear(raw, info.type_id, n, k, activations="int8"), k))
        modes["int8 1-row"].append((RowAtATime(raw, info.type_id, n, k), k))
        modes["blocks fp32"].append((GGUFBlockLinear(raw, info.type_id, n, k, activations="float32"), k))
        # what --gguf-blocks-only runs past its row limit: dequantize into a scratch, oneDNN GEMM
        modes["dequant+fp32"].append((BlockLinear(modes["blocks fp32"][-1][0], max_rows=0), k))
        modes["oneDNN fp32"].append((PackedLinear(w, None), k))
        if BF16:  # oneDNN packs bf16 weights only where the CPU computes in bf16 (AVX-512 BF16, AVX-NE-CONVERT)
            modes["oneDNN bf16"].append((PackedLinear(w.bfloat16(), None), k))
h = common.header()
print(common.machine_line(h['machine']), '| commit', h['commit'], '| benchmarks/gguf_matmul_bench.py', ' '.join(sys.argv[1:]))
print(path.rsplit('/', 1)[-1], ':', len(modes["blocks int8"]), 'matrices', dict(types), '(the embedding is the tied lm_head); median of 7 passes; 2 threads')
print('loadavg before:', open('/proc/loadavg').read().strip())
for rows in rows_list:
    xs = {k: torch.randn(rows, k) for _, k in modes["blocks int8"]}
    times = {m: [] for m in modes}
    for rep in range(7):
        for label, layers in modes.items():
            if label == "blocks fp32" and rows > 8: continue  # 8 rows per call: rows / 8 weight reads
            dt = torch.bfloat16 if "bf16" in label else torch.float32
            xd = {k: v.to(dt) for k, v in xs.items()}
            t = time.perf_counter()
            for layer, k in layers:
                layer(xd[k])
            times[label].append(time.perf_counter() - t)
    for label, ts in times.items():
        if ts:
            print(f"rows {rows:>2}: {label:<12} all matrices once: {sorted(ts)[len(ts) // 2]*1000:.1f} ms")
print('loadavg after:', open('/proc/loadavg').read().strip())
