"""`nextok bench latency`: prefill time and decode time per step at a few batch sizes, next to
the memory-bandwidth roofline of a decode step, optionally beside transformers' batch-1 decode.

Per batch size b, with fresh random prompts each time (so the prefix cache never helps):
- prefill: generate(b prompts, max_tokens=1);
- decode step: (t(1 + new tokens) - t(1 token)) / new, the same prompts' shape both times.
The roofline of a decode step is (weight bytes a step reads + KV bytes it reads) over the
measured device copy bandwidth (bytes read + written by a large tensor copy). Weight bytes are
what a decode step reads: every linear and norm weight, and the lm_head; an untied embedding
table is only indexed (b rows), so it is left out (`param_bytes` has all weights). On CPU, linears
kept as GGUF blocks count their blocks (what steps of up to 8 rows read).

`--also-eager` builds a second engine with --enforce-eager and `--also-sync` one with
--async-scheduling off; they run interleaved with the main engine, round by round. With CUDA
graphs, each batch size also gets its device-only time: the captured step replayed back to back
plus the lm_head and argmax (no host work in between), the floor that overlapping host work with
the GPU can reach.
`--baseline transformers` times transformers' batch-1 decode eagerly and with its best path, a
static cache, which generate() compiles with mode="reduce-overhead" (CUDA only; a minute or two).
"""
from __future__ import annotations

import statistics
import time

import torch

from nextok.bench.common import header, memory_report, write_json


def add_parser(sub, add_engine_args) -> None:
    p = sub.add_parser("latency", help="prefill and decode-step latency vs the bandwidth roofline")
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64, help="decode steps timed per run")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (median reported)")
    p.add_argument("--also-eager", action="store_true", help="also time an --enforce-eager engine")
    p.add_argument("--also-sync", action="store_true",
                   help="also time an engine with --async-scheduling off")
    p.add_argument("--baseline", default="none", choices=["none", "transformers"])
    p.add_argument("--output", default=None, help="write results JSON here")
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from nextok import LLM
    from nextok.cli import engine_kwargs

    sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    if not sizes or min(sizes) < 1 or args.input_len < 1 or args.output_len < 1 or args.repeats < 1:
        raise ValueError("--batch-sizes, --input-len, --output-len and --repeats must be >= 1")
    kwargs = engine_kwargs(args)
    engines = {"nextok": LLM(**kwargs)}
    if args.also_eager:
        engines["nextok_eager"] = LLM(**{**kwargs, "enforce_eager": True})
    if args.also_sync:
        engines["nextok_sync"] = LLM(**{**kwargs, "async_scheduling": "off"})
    main = engines["nextok"].engine
    device = torch.device(main.config.device)
    model = main.runner.model
    rng = torch.Generator().manual_seed(0)
    vocab = main.config.model.vocab_size

    def prompts(b):  # fresh ids every call: no prefix-cache hits
        return torch.randint(100, vocab - 1, (b, args.input_len), generator=rng).tolist()

    for llm in engines.values():  # warm-up (Triton compiles, allocator)
        _time_generate(llm, prompts(2), 3, device)
    rounds = []
    for r in range(args.repeats):
        rnd = {}
        for name, llm in engines.items():
            rnd[name] = {str(b): _step_times(llm, prompts, b, args.output_len, device) for b in sizes}
        rounds.append(rnd)
        print(f"round {r + 1}/{args.repeats} done", flush=True)
    bw = copy_bandwidth(device)
    mc = main.config.model
    # the pool's own rows (--kv-cache-dtype int8: D + 4 bytes; fp8: D), all layers, K and V
    kv_per_token = main.runner.kv_bytes_per_block() // main.runner.block_size
    weights = weight_bytes(model, decode=True)
    summary = {}
    for name in engines:
        summary[name] = {}
        for b in sizes:
            decode = statistics.median(rd[name][str(b)]["decode_step_ms"] for rd in rounds)
            prefill = statistics.median(rd[name][str(b)]["prefill_ms"] for rd in rounds)
            ctx = args.input_len + args.output_len / 2  # mean context over the timed steps
            roof_ms = (weights + b * ctx * kv_per_token) / bw * 1e3
            summary[name][str(b)] = {"decode_step_ms": decode, "prefill_ms": prefill,
                                     "roofline_ms": roof_ms, "fraction_of_roofline": roof_ms / decode,
                                     "decode_tokens_per_s": b / decode * 1e3}
            if name == "nextok" and main.runner.graphs is not None:
                dev_ms = device_step_ms(main.runner, b, int(ctx))
                summary[name][str(b)].update(device_only_step_ms=dev_ms,
                                             device_only_fraction_of_roofline=roof_ms / dev_ms)
    result = header({"benchmark": "latency", "device": main.config.device, "dtype": main.config.dtype,
                     "model": main.config.model_path, "load_format": main.config.load_format,
                     "attention_backend": main.config.attention_backend,
                     "cuda_graphs": main.runner.graphs is not None,
                     "input_len": args.input_len, "output_len": args.output_len,
                     "copy_bandwidth_GBps": bw / 1e9, "weight_bytes_per_step": weights,
                     "param_bytes": weight_bytes(model, decode=False),
                     "kv_bytes_per_token": kv_per_token, "memory": memory_report(main),
                     "rounds": rounds, "summary": summary})
    if args.baseline == "transformers":
        if args.output:  # nextok's numbers are kept even if the baseline's compile is cut short
            write_json(args.output, result)
        result["transformers"] = hf_batch1(main.config, args.input_len, args.output_len, device)
    _print(result)
    if args.output:
        write_json(args.output, result)
    return 0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time_generate(llm, prompts, max_tokens: int, device) -> float:
    from nextok import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    _sync(device)
    t = time.perf_counter()
    llm.generate(prompts, params)
    _sync(device)
    return time.perf_counter() - t


def _step_times(llm, prompts, b: int, new: int, device) -> dict:
    """One run of b prompts, 1 + new tokens each, timed by the engine's own stamps: prefill up to
    the batch's last first token, then `new` decode steps to the last finish. (The difference of
    a prefill-only run and a full run, as before, went negative when a slow moment of a shared
    machine hit the first.)"""
    from nextok import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1 + new, ignore_eos=True)
    _sync(device)
    start = time.monotonic()  # the clock of the engine's stamps
    outs = llm.generate(prompts(b), params)
    _sync(device)
    first = max(o.metrics["first_token"] for o in outs)
    last = max(o.metrics["finished"] for o in outs)
    return {"prefill_ms": (first - start) * 1e3, "decode_step_ms": (last - first) / new * 1e3}


@torch.inference_mode()
def device_step_ms(runner, b: int, ctx: int, iters: int = 30) -> float:
    """A decode step of b sequences at context ctx with no host work between steps: the
    captured graph replayed back to back, each followed by the lm_head and argmax. The block
    tables point at blocks 1.. of the (idle) pool, so attention reads ctx real positions."""
    graphs, bs = runner.graphs, runner.block_size
    nblocks, dev = -(-ctx // bs), runner.device
    # All inputs on the device already: the replays' input copies are device to device.
    tables = torch.arange(b * nblocks, dtype=torch.long, device=dev).view(b, nblocks) % (
        runner.kv_caches[0][0].shape[0] - 1) + 1
    ids = torch.zeros(b, dtype=torch.long, device=dev)
    pos = torch.full((b,), ctx - 1, dtype=torch.long, device=dev)
    slots = tables[:, -1] * bs + (ctx - 1) % bs
    lens = torch.full((b,), ctx, dtype=torch.long, device=dev)

    def step():
        hidden = graphs.run(ids, pos, slots, tables, lens)
        return runner.model.compute_logits(hidden).argmax(-1)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e3


def copy_bandwidth(device: torch.device) -> float:
    """Bytes read + written per second by a 1 GiB (CPU: 256 MiB) tensor copy (bench kernels' timer)."""
    from nextok.bench.kernels import Timer

    nbytes = (1 << 30) if device.type == "cuda" else (1 << 28)
    return Timer(device, iters=10, warmup=3).copy_bandwidth(nbytes) * 1e9


def weight_bytes(model, decode: bool) -> int:
    """Bytes of the model's weights; with decode=True only what one decode step of up to 8 rows
    reads: an untied embedding table is only indexed (b rows), so it is left out (a tied one
    counts once, as the lm_head), and linears kept as GGUF blocks count their blocks."""
    from torch import nn

    from nextok.kernels.cpu_gguf_linear import BlockLinear, BlockOrDenseLinear
    from nextok.kernels.cpu_linear import PackedLinear

    elem = model.embed_tokens.weight.element_size()
    total = 0

    tied = model.config.tie_word_embeddings

    def walk(module):
        nonlocal total
        if module is model.lm_head and tied and not decode and not model.lm_head_quantized:
            return  # the embedding's own copy (CPU packs it as the lm_head): counted once
        # (a quantized copy, --quantize-lm-head, holds other bytes: it counts)
        if isinstance(module, BlockOrDenseLinear) and decode or isinstance(module, BlockLinear):
            total += module.blocks.nbytes  # (a BlockLinear holds nothing else)
        elif isinstance(module, (PackedLinear, BlockOrDenseLinear)):  # no parameters of their own
            total += module.in_features * module.out_features * elem
        elif isinstance(module, nn.Embedding):
            total += 0 if decode else module.weight.numel() * elem
        else:  # parameters and buffers (quantized layers keep their weights as buffers)
            total += sum(t.numel() * t.element_size() for t in
                         [*module.parameters(recurse=False), *module.buffers(recurse=False)])
            for child in module.children():
                walk(child)

    walk(model)
    if decode and model.lm_head is None:  # tied, unpacked: compute_logits reads the embedding
        total += model.embed_tokens.weight.numel() * elem
    return total


def hf_batch1(config, input_len: int, new: int, device: torch.device) -> dict:
    """transformers' batch-1 decode ms/token: eager generate(), then a static cache, which
    generate() compiles with CUDA graphs (its best path)."""
    from nextok.bench.throughput import load_hf

    model = load_hf(config)
    hf_cfg = model.config
    ids = torch.randint(100, hf_cfg.vocab_size - 1, (1, input_len), device=device)

    def per_token() -> float:
        def gen(n):
            _sync(device)
            t = time.perf_counter()
            with torch.inference_mode():
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                               min_new_tokens=n, do_sample=False, pad_token_id=0)
            _sync(device)
            return time.perf_counter() - t
        gen(new + 1)  # the longest first: a static cache is sized once, at the largest length
        return statistics.median((gen(new + 1) - gen(1)) / new * 1e3 for _ in range(3))

    out = {"eager_ms_per_token": per_token()}
    if device.type == "cuda":
        # A static cache makes generate() compile its decode step itself (its CompileConfig:
        # mode="reduce-overhead", i.e. CUDA graphs) and manage the graphs' buffers.
        # Wrapping model.forward in torch.compile by hand instead fails on torch 2.11: the
        # graphs' outputs are overwritten by the next replay.
        model.generation_config.cache_implementation = "static"
        t = time.perf_counter()
        for _ in range(2):
            per_token()  # compiles (prefill and decode shapes) and warms the graphs
        out["compile_s"] = time.perf_counter() - t
        out["static_compiled_ms_per_token"] = per_token()
    return out


def _print(result: dict) -> None:
    print(f"copy bandwidth {result['copy_bandwidth_GBps']:.0f} GB/s, weights read per decode step "
          f"{result['weight_bytes_per_step'] / 1e9:.2f} GB")
    mem = result["memory"]
    print(f"weights held {mem['weight_bytes'] / 2**20:.0f} MiB, KV cache {mem['kv_cache_bytes'] / 2**20:.0f} "
          f"MiB ({mem['kv_cache_dtype']}), peak RSS {mem['peak_rss_mib']:.0f} MiB"
          + (f", peak GPU {mem['peak_gpu_mib']:.0f} MiB" if "peak_gpu_mib" in mem else ""))
    for name, rows in result["summary"].items():
        for b, r in rows.items():
            print(f"{name:>13} batch {b:>3}: decode step {r['decode_step_ms']:8.2f} ms "
                  f"(roofline {r['roofline_ms']:.2f} ms, {r['fraction_of_roofline'] * 100:5.1f} %), "
                  f"prefill {r['prefill_ms']:8.1f} ms"
                  + (f", device-only step {r['device_only_step_ms']:.2f} ms"
                     if "device_only_step_ms" in r else ""))
    if "transformers" in result:
        print("transformers batch 1:", {k: round(v, 2) for k, v in result["transformers"].items()})
