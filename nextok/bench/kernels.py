"""`nextok bench kernels`: each Triton kernel against the torch ops it replaces, at real shapes.

- Fused ops (kernels/triton/fused.py vs kernels/ref.py, the model's unfused path): add + RMSNorm,
  silu * up, RoPE, at Llama-3.1-8B and Qwen2.5-Coder-1.5B sizes for 1, 32, 256, 2048 tokens.
  Bandwidth = the bytes the op must read and write (the fused kernel's traffic) / time, set
  against a measured device copy (copy_ of a large tensor, read + write).
- Attention, when nextok.attention.triton_backend imports: paged decode (batch 32, context 4096;
  batch 256, context 576: offline throughput's steps) on a bf16, int8 and fp8 cache vs
  TorchRefBackend's gather + SDPA; prefill (4096 tokens, one chunk) vs a naive O(N^2)
  attention and vs torch SDPA with is_causal.
Timing on CUDA: per iteration a CUDA event pair, median of --iters after --warmup. The L2 is
flushed between iterations, and the GPU is held busy (torch.cuda._sleep) while the timed loop is
queued, so the events see kernel time, not Python launch overhead. Small shapes are then latency
bound: that is what the numbers show at 1 token. `--device cpu --quick` is a smoke run in
Triton's interpreter (tiny shapes; its times mean nothing).
"""
from __future__ import annotations

import os
import statistics
import time

from nextok.bench.common import header, write_json

# name -> (hidden, intermediate, q heads, kv heads, head_dim)
MODELS = {"llama-3.1-8b": (4096, 14336, 32, 8, 128), "qwen2.5-coder-1.5b": (1536, 8960, 12, 2, 128)}
TOKENS = [1, 32, 256, 2048]
QUICK_MODELS = {"tiny": (96, 160, 2, 1, 32)}
QUICK_TOKENS = [1, 4]
EPS = 1e-6


def add_parser(sub) -> None:
    p = sub.add_parser("kernels", help="Triton kernels vs the torch ops they replace (CUDA)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a smoke run in Triton's interpreter (use with --quick)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--quick", action="store_true", help="tiny shapes, few iterations")
    p.add_argument("--iters", type=int, default=None, help="timed iterations (default 50; quick 2)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed iterations (default 10; quick 1)")
    p.add_argument("--no-attention", dest="attention", action="store_false")
    p.add_argument("--output", default=None, help="write results JSON here")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from nextok.errors import NextokError

    if args.device == "cuda" and not torch.cuda.is_available():
        raise NextokError("bench kernels needs a CUDA GPU and none is visible "
                          "(--device cpu --quick runs a smoke test in Triton's interpreter)")
    if args.device == "cpu":  # CPU tensors only run in the interpreter; read when triton.jit runs
        os.environ["TRITON_INTERPRET"] = "1"
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    iters = args.iters or (2 if args.quick else 50)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 10)
    timer = Timer(device, iters, warmup)
    copy_gbps = timer.copy_bandwidth(16 << 20 if args.quick else 1 << 30)
    models, tokens = (QUICK_MODELS, QUICK_TOKENS) if args.quick else (MODELS, TOKENS)
    rows = [row for name, shape in models.items() for t in tokens
            for row in _fused_rows(timer, name, shape, t, dtype, copy_gbps)]
    result = header({"benchmark": "kernels", "device": args.device, "dtype": args.dtype,
                     "quick": args.quick, "iters": iters, "warmup": warmup,
                     "torch_version": torch.__version__, "triton_version": _triton_version(),
                     "copy_bandwidth_gbps": copy_gbps, "fused": rows})
    if args.attention:
        result["attention"], result["attention_skipped"] = _attention_rows(timer, dtype, args.quick,
                                                                           copy_gbps)
    _print(result)
    if args.output:
        write_json(args.output, result)
    return 0


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


class Timer:
    """time_us(fn) -> median microseconds of fn() over `iters` runs, after `warmup` runs."""

    def __init__(self, device, iters: int, warmup: int):
        import torch

        self.device, self.iters, self.warmup = device, iters, warmup
        self.cuda = device.type == "cuda"
        # Bigger than the L2 (50 MB on H100/H200): zeroed between iterations so none starts warm.
        self._flush = (torch.empty(256 << 20, dtype=torch.uint8, device=device) if self.cuda
                       else None)

    def time_us(self, fn) -> float:
        import torch

        for _ in range(self.warmup):
            fn()
        if not self.cuda:
            times = []
            for _ in range(self.iters):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
            return statistics.median(times)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(self.iters)]
        torch.cuda.synchronize()
        if hasattr(torch.cuda, "_sleep"):  # ~100 us per iteration: the queue fills meanwhile
            torch.cuda._sleep(200_000 * self.iters)
        for start, end in events:
            self._flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in events)

    def copy_bandwidth(self, nbytes: int) -> float:
        """GB/s of dst.copy_(src): nbytes read + nbytes written."""
        import torch

        src = torch.empty(nbytes, dtype=torch.uint8, device=self.device).random_(0, 255)
        dst = torch.empty_like(src)
        return 2 * nbytes / self.time_us(lambda: dst.copy_(src)) / 1e3


def _fused_rows(timer: Timer, model: str, shape, t: int, dtype, copy_gbps: float) -> list[dict]:
    """One row per op: the Triton kernel and the torch ops, on the same inputs."""
    import torch

    from nextok.kernels.ref import RefFusedOps
    from nextok.kernels.triton.fused import TritonFusedOps

    hidden, inter, heads, kv_heads, head_dim = shape
    dev, es = timer.device, torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator(device=dev).manual_seed(t)
    rand = lambda *s: torch.randn(*s, generator=gen, device=dev).to(dtype)  # noqa: E731
    x, res, w = rand(t, hidden), rand(t, hidden), rand(hidden)
    gate_up = rand(t, 2 * inter)
    qkv = rand(t, (heads + 2 * kv_heads) * head_dim)
    angles = torch.rand(t, 1, head_dim // 2, generator=gen, device=dev) * 100
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    nh = heads + kv_heads
    kv_rows = t * kv_heads * head_dim
    slots = torch.arange(t, device=dev)  # pages of 16 rows, filled in order
    caches = [torch.zeros(t // 16 + 1, 16, kv_heads, head_dim, dtype=dtype, device=dev)
              for _ in range(2)]
    ops = {  # op -> (shape, bytes read + written, fn(ops) on fresh copies of the inputs)
        "add_rms_norm": (f"[{t}, {hidden}]", (4 * t * hidden + hidden) * es,
                         lambda o: o.add_rms_norm(x, res.clone(), w, EPS)[0]),
        "silu_mul": (f"[{t}, 2x{inter}]", 3 * t * inter * es, lambda o: o.silu_mul(gate_up)),
        "rope_neox": (f"[{t}, {nh}x{head_dim}]", (2 * nh + 1) * t * head_dim * es,
                      lambda o: _rope_copy(o, qkv, nh, head_dim, cos, sin)),
        # + v read, k and v written to the paged caches; the torch version is RoPE + index_copy_
        "rope_neox_store_kv": (f"[{t}, {nh}x{head_dim}] + kv", ((2 * nh + 1) * t * head_dim + 3 * kv_rows) * es,
                               lambda o: _rope_store_copy(o, qkv, heads, kv_heads, head_dim, cos, sin, slots)),
    }
    timed = {  # the same ops in place where they are in place: no copies inside the timed loop
        "add_rms_norm": lambda o: o.add_rms_norm(x, res, w, EPS),
        "silu_mul": lambda o: o.silu_mul(gate_up),
        "rope_neox": lambda o: o.rope_neox(qkv, nh, head_dim, cos, sin),
        "rope_neox_store_kv": lambda o: o.rope_neox_store_kv(qkv, heads, kv_heads, head_dim, cos, sin,
                                                             *caches, slots),
    }
    fused, ref, rows = TritonFusedOps(), RefFusedOps(), []
    for op, (desc, nbytes, check) in ops.items():
        diff = (check(fused).float() - check(ref).float()).abs().max().item()
        us_fused = timer.time_us(lambda: timed[op](fused))
        us_ref = timer.time_us(lambda: timed[op](ref))
        rows.append({"model": model, "op": op, "tokens": t, "shape": desc, "bytes": nbytes,
                     "fused_us": us_fused, "torch_us": us_ref, "speedup": us_ref / us_fused,
                     "fused_gbps": nbytes / us_fused / 1e3, "torch_gbps": nbytes / us_ref / 1e3,
                     "fused_pct_of_copy": 100 * nbytes / us_fused / 1e3 / copy_gbps,
                     "max_abs_diff": diff})
    return rows


def _rope_copy(ops, qkv, num_heads, head_dim, cos, sin):
    out = qkv.clone()
    ops.rope_neox(out, num_heads, head_dim, cos, sin)
    return out


def _rope_store_copy(ops, qkv, heads, kv_heads, head_dim, cos, sin, slots):
    """The rotated qkv rows and both caches, flattened into one tensor to compare."""
    import torch

    out = qkv.clone()
    caches = [torch.zeros(len(slots) // 16 + 1, 16, kv_heads, head_dim, dtype=qkv.dtype,
                          device=qkv.device) for _ in range(2)]
    ops.rope_neox_store_kv(out, heads, kv_heads, head_dim, cos, sin, *caches, slots)
    return torch.cat([out.flatten()] + [c.flatten() for c in caches])


# ---- attention ---------------------------------------------------------------------------------
def _attention_rows(timer: Timer, dtype, quick: bool,
                    copy_gbps: float) -> tuple[list[dict], str | None]:
    """(rows, None), or ([], why) when there is no Triton backend to measure."""
    try:
        from nextok.attention.triton_backend import TritonBackend
    except ImportError as e:
        return [], f"nextok.attention.triton_backend not importable: {e}"
    # (batch, context), q heads, kv heads, head_dim, block size; prefill tokens
    decode = [(2, 64)] if quick else [(32, 4096), (256, 576)]
    h, kvh, d, bs = (4, 2, 32, 16) if quick else (32, 8, 128, 16)
    n = 64 if quick else 4096
    rows = []
    cases = [("decode", _decode_row, (b, ctx, h, kvh, d, bs, kv)) for b, ctx in decode
             for kv in ("auto", "int8", "fp8")]
    for op, measure, shape in cases + [("prefill", _prefill_row, (n, h, kvh, d, bs))]:
        try:
            rows.append(measure(timer, TritonBackend(), dtype, copy_gbps, *shape))
        except Exception as e:  # noqa: BLE001  a backend being written must not sink the table
            rows.append({"op": op, "error": f"{type(e).__name__}: {e}"})
    return rows, None


def _decode_row(timer: Timer, backend, dtype, copy_gbps, b, ctx, h, kvh, d, bs, kv="auto") -> dict:
    """One decode step of `b` sequences, each `ctx` keys long, over shuffled pages of a cache of
    `kv` (auto: the activations' dtype, int8 or fp8 rows: attention/kv_quant.py)."""
    import torch

    from nextok.attention import kv_quant
    from nextok.attention.base import AttentionMetadata
    from nextok.attention.torch_ref import TorchRefBackend, decode_mask

    dev, gen = timer.device, torch.Generator().manual_seed(0)
    rand = lambda *s: torch.randn(*s, generator=gen).to(dev, dtype)  # noqa: E731
    per_seq = -(-ctx // bs)
    k_cache, v_cache = rand(b * per_seq + 1, bs, kvh, d), rand(b * per_seq + 1, bs, kvh, d)
    if kv != "auto":
        k_cache, v_cache = (kv_quant.quantize_rows(c, kv_quant.DTYPES[kv]) for c in (k_cache, v_cache))
    tables = (torch.randperm(b * per_seq, generator=gen) + 1).view(b, per_seq).to(dev)  # 0: padding
    lens = torch.full((b,), ctx, dtype=torch.int64, device=dev)
    slots = tables[:, (ctx - 1) // bs] * bs + (ctx - 1) % bs
    meta = AttentionMetadata(slot_mapping=slots, num_decode=b, decode_block_tables=tables,
                             decode_context_lens=lens,
                             decode_mask=decode_mask(lens, per_seq * bs, None), prefills=[])
    q, k, v = rand(b, h, d), rand(b, kvh, d), rand(b, kvh, d)
    ref = TorchRefBackend()
    call = lambda be: be.forward(q, k, v, k_cache, v_cache, meta, d ** -0.5)  # noqa: E731
    diff = (call(backend).float() - call(ref).float()).abs().max().item()
    us, us_ref = timer.time_us(lambda: call(backend)), timer.time_us(lambda: call(ref))
    row_bytes = k_cache.shape[-1] * k_cache.element_size()  # a token's row, its scale included
    nbytes = 2 * b * ctx * kvh * row_bytes + 2 * b * h * d * q.element_size()  # K, V; q, out
    gbps = nbytes / us / 1e3
    return {"op": "decode", "kv_cache_dtype": kv,
            "shape": f"batch {b}, context {ctx}, {h}/{kvh} heads x {d}, block {bs}, {kv} cache",
            "bytes": nbytes, "triton_us": us, "triton_gbps": gbps,
            "triton_pct_of_copy": 100 * gbps / copy_gbps,
            "metric": f"{gbps:.0f} GB/s, {100 * gbps / copy_gbps:.0f}% of copy",
            "baselines": {"torch_ref_gather_sdpa": {"us": us_ref, "speedup": us_ref / us}},
            "max_abs_diff": diff}


def _prefill_row(timer: Timer, backend, dtype, copy_gbps, n, h, kvh, d, bs) -> dict:
    """One sequence's prefill of `n` tokens in one chunk, nothing cached before it."""
    import torch
    import torch.nn.functional as F

    from nextok.attention.base import AttentionMetadata, PrefillChunk

    dev, gen, scale = timer.device, torch.Generator().manual_seed(1), d ** -0.5
    rand = lambda *s: torch.randn(*s, generator=gen).to(dev, dtype)  # noqa: E731
    blocks = -(-n // bs)
    k_cache = torch.zeros(blocks + 1, bs, kvh, d, dtype=dtype, device=dev)
    v_cache = torch.zeros_like(k_cache)
    table = torch.arange(1, blocks + 1, device=dev)
    meta = AttentionMetadata(slot_mapping=torch.arange(n, device=dev) + bs, num_decode=0,
                             decode_block_tables=None, decode_context_lens=None, decode_mask=None,
                             prefills=[PrefillChunk(0, n, n, table)])
    q, k, v = rand(n, h, d), rand(n, kvh, d), rand(n, kvh, d)
    qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    impls = {"triton": lambda: backend.forward(q, k, v, k_cache, v_cache, meta, scale),
             "naive": lambda: _naive_causal(q, k, v, scale),
             "sdpa_causal": lambda: F.scaled_dot_product_attention(
                 qh, kh, vh, is_causal=True, scale=scale, enable_gqa=kvh != h)[0].transpose(0, 1)}
    diff = (impls["triton"]().float() - impls["sdpa_causal"]().float()).abs().max().item()
    us = {name: timer.time_us(fn) for name, fn in impls.items()}
    flops = 2 * n * n * h * d  # QK^T and PV over the causal half: 2 x (2 N^2 H D / 2)
    tflops = flops / us["triton"] / 1e6
    return {"op": "prefill", "shape": f"{n} tokens, {h}/{kvh} heads x {d}, block {bs}",
            "flops": flops, "triton_us": us["triton"], "triton_tflops": tflops,
            "metric": f"{tflops:.1f} TFLOP/s",
            "baselines": {k: {"us": us[k], "speedup": us[k] / us["triton"],
                              "tflops": flops / us[k] / 1e6} for k in ("naive", "sdpa_causal")},
            "max_abs_diff": diff}


def _naive_causal(q, k, v, scale: float):
    """q: [N, H, D]; k, v: [N, KVH, D] -> [N, H, D], every score materialized ([H, N, N])."""
    import torch

    n, h, _ = q.shape
    group = h // k.shape[1]
    qh = q.transpose(0, 1)
    kh, vh = (t.repeat_interleave(group, dim=1).transpose(0, 1) for t in (k, v))
    scores = (qh @ kh.transpose(1, 2)) * scale
    future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    probs = scores.masked_fill(future, float("-inf")).softmax(-1, dtype=torch.float32).to(q.dtype)
    return (probs @ vh).transpose(0, 1)


def _print(result: dict) -> None:
    gpu = result["machine"].get("cuda_device") or "CPU (Triton interpreter)"
    print(f"\nkernels on {gpu}, {result['dtype']}; copy bandwidth "
          f"{result['copy_bandwidth_gbps']:.0f} GB/s; median of {result['iters']}")
    print(f"{'model':20s} {'op':13s} {'tokens':>6s} {'fused us':>9s} {'torch us':>9s} "
          f"{'speedup':>7s} {'fused GB/s':>10s} {'% copy':>6s} {'torch GB/s':>10s} "
          f"{'max diff':>9s}")
    for r in result["fused"]:
        print(f"{r['model']:20s} {r['op']:13s} {r['tokens']:6d} {r['fused_us']:9.1f} "
              f"{r['torch_us']:9.1f} {r['speedup']:6.2f}x {r['fused_gbps']:10.0f} "
              f"{r['fused_pct_of_copy']:5.0f}% {r['torch_gbps']:10.0f} {r['max_abs_diff']:9.2g}")
    if result.get("attention_skipped"):
        print(f"attention: skipped ({result['attention_skipped']})")
    for r in result.get("attention") or []:
        if "error" in r:
            print(f"attention {r['op']:8s} failed: {r['error']}")
            continue
        base = ", ".join(f"{k} {v['us']:.1f} us ({v['speedup']:.2f}x)"
                         for k, v in r["baselines"].items())
        print(f"attention {r['op']:8s} {r['shape']}: triton {r['triton_us']:.1f} us "
              f"({r['metric']}); vs {base}; max diff {r['max_abs_diff']:.2g}")
