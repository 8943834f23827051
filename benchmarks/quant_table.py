"""Issue 7's table on the default model, CPU: perplexity, weight bytes and batch-1 decode speed
per way of holding the weights, all engines in one process, decode rounds interleaved.

    .venv/bin/python benchmarks/quant_table.py --output benchmarks/results/DATE-quant-cpu.json \
        [--max-tokens 4096] [--rounds 3]

The 4-bit rows (GPTQ and AWQ formats) are checkpoints that `nextok quantize` writes (once) from the same
model. Perplexity: `nextok eval ppl`'s evaluation (held-out stdlib code, windows of 256 tokens, stride
128). Decode: (t(1 + 32 tokens) - t(1 token)) / 32 at batch 1 on a 128-token random prompt,
as `nextok bench latency` does, median over the rounds. Weight bytes: every weight the engine
holds (bench latency's param_bytes; the tied lm_head counted once).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())

from nextok import LLM  # noqa: E402
from nextok.bench.common import header  # noqa: E402
from nextok.bench.latency import _step_times, weight_bytes  # noqa: E402
from nextok.eval.ppl import evaluate  # noqa: E402

VARIANTS = {  # name -> engine kwargs (the default model, a GGUF Q4_1 file)
    "float32 (dequantized at load)": dict(dtype="float32", gguf_blocks=False),
    "Q4_1 packed (blocks only)": dict(dtype="float32", gguf_dense_copy=False),
    "Q4_1 blocks + float32 copy (default)": dict(dtype="float32"),
    "int8 weight-only (per channel)": dict(dtype="float32", quantization="int8"),
    "int4 round-to-nearest (groups of 64)": dict(dtype="float32", quantization="int4",
                                                 quant_group_size=64),
    "bfloat16 (dequantized at load)": dict(dtype="bfloat16"),
    "Q4_1 blocks + float32 copy, int8 KV cache": dict(dtype="float32", kv_cache_dtype="int8"),
}
# 4-bit checkpoints written by `nextok quantize` (groups of 64; GPTQ format, AWQ's gemm format
# for awq) from the same model, loaded with their weights kept only as Q4_1 blocks.
QUANTIZED = {"int4 RTN, GPTQ format (groups of 64)": "rtn",
             "int4 GPTQ (groups of 64, `nextok quantize`)": "gptq",
             "int4 AWQ (groups of 64, `nextok quantize`)": "awq"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", required=True)
    ap.add_argument("--max-tokens", type=int, default=4096, help="tokens scored for perplexity")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma-separated subset of the variants")
    ap.add_argument("--quantized-dir", default=os.path.expanduser("~/.cache/nextok/quant-table"),
                    help="where the `nextok quantize` checkpoints are written (reused if there)")
    args = ap.parse_args()
    for name, method in QUANTIZED.items():
        out = os.path.join(args.quantized_dir, f"{method}-g64")
        if not os.path.exists(os.path.join(out, "model.safetensors")):
            from nextok.cli import main as cli

            if cli(["quantize", out, "--method", method, "--group-size", "64"]) != 0:
                raise SystemExit(f"nextok quantize --method {method} failed")
        VARIANTS[name] = dict(model=out, dtype="float32", gguf_dense_copy=False)
    names = [n for n in VARIANTS if not args.only or any(o in n for o in args.only.split(","))]
    engines = {n: LLM(kv_cache_memory=128 << 20, **VARIANTS[n]) for n in names}
    rows = {n: {"engine_kwargs": VARIANTS[n], "decode_ms": []} for n in names}
    for n, llm in engines.items():
        model = llm.engine.runner.model
        rows[n]["weight_bytes"] = weight_bytes(model, decode=False)
        rows[n]["weight_bytes_per_decode_step"] = weight_bytes(model, decode=True)
        rows[n]["ppl"] = evaluate(llm, "code", 256, 128, args.max_tokens)
        print(f"{n}: ppl {rows[n]['ppl']['ppl']:.4f}", flush=True)
    gen = torch.Generator().manual_seed(0)
    vocab = next(iter(engines.values())).engine.config.model.vocab_size
    prompts = lambda b: torch.randint(100, vocab - 1, (b, 128), generator=gen).tolist()  # noqa: E731
    for llm in engines.values():
        _step_times(llm, prompts, 1, 4, torch.device("cpu"))  # warm-up
    for r in range(args.rounds):  # interleaved: A, B, C, ... then again
        for n, llm in engines.items():
            rows[n]["decode_ms"].append(_step_times(llm, prompts, 1, 32, torch.device("cpu"))["decode_step_ms"])
        print(f"round {r + 1}/{args.rounds}", flush=True)
    for n in names:
        rows[n]["decode_ms_median"] = statistics.median(rows[n]["decode_ms"])
        rows[n]["decode_tokens_per_s"] = 1e3 / rows[n]["decode_ms_median"]
    result = header({"benchmark": "quant-table", "device": "cpu", "max_tokens": args.max_tokens,
                     "rows": rows})
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'variant':40} {'ppl':>8} {'weight MB':>10} {'decode tok/s':>13}")
    for n in names:
        r = rows[n]
        print(f"{n:40} {r['ppl']['ppl']:8.4f} {r['weight_bytes'] / 1e6:10.1f} {r['decode_tokens_per_s']:13.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
