"""The decode step with its weight tiles asked of L2 before the PDL wait (pdl.py, prefetch_l2)
or not: bf16 and int4 (with the int4 lm_head) engines in turn, each variant recapturing the
CUDA graphs and timed device-only (bench latency's device_step_ms) in interleaved rounds
(PF 0, 2, 4, 0, 2, 4, ...). A prefetch changes no value read, so the logits on one fixed KV
state must equal PF 0's bit for bit.

    python3 benchmarks/gpu/prefetch_probe.py CONFIG_DIR TOKENIZER OUT.json [rounds] [pf,pf,...]
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())

from nextok import LLM  # noqa: E402
from nextok.bench.common import header  # noqa: E402
from nextok.bench.latency import copy_bandwidth, device_step_ms, weight_bytes  # noqa: E402
from nextok.kernels.triton import pdl  # noqa: E402

ENGINES = {"bf16": {}, "int4+lm_head": {"quantization": "int4", "quantize_lm_head": True}}
BATCHES, CTX = (1, 8), 192


def set_ahead(runner, tiles: int) -> None:
    pdl.L2_AHEAD = tiles
    runner.graphs.graphs.clear()
    runner.graphs.outputs.clear()
    runner.graphs.capture()


@torch.inference_mode()
def logits_on_fixed_state(runner, b: int) -> torch.Tensor:
    g, bs, dev = runner.graphs, runner.block_size, runner.device
    nblocks = -(-CTX // bs)
    tables = torch.arange(1, 1 + b * nblocks, device=dev).view(b, nblocks)
    ids = torch.arange(b, device=dev) * 7 + 100
    pos = torch.full((b,), CTX - 1, device=dev)
    slots = tables[:, -1] * bs + (CTX - 1) % bs
    lens = torch.full((b,), CTX, device=dev)
    return runner.model.compute_logits(g.run(ids, pos, slots, tables, lens)).float().cpu()


def probe(config_dir: str, tok: str, kwargs: dict, variants: list[int], rounds: int) -> dict:
    llm = LLM(model=config_dir, tokenizer=tok, load_format="dummy", dtype="bfloat16",
              max_model_len=4096, cuda_graph_max_batch=8, max_num_seqs=8, **kwargs)
    runner = llm.engine.runner
    gen = torch.Generator(device=runner.device).manual_seed(0)
    for k, v in runner.kv_caches:  # a KV state that is not all zeros
        k.normal_(generator=gen)
        v.normal_(generator=gen)
    times = {pf: {b: [] for b in BATCHES} for pf in variants}
    logits = {}
    for r in range(rounds):
        for pf in variants:
            set_ahead(runner, pf)
            for b in BATCHES:
                times[pf][b].append(device_step_ms(runner, b, CTX, iters=100))
                if r == 0:
                    logits[(pf, b)] = logits_on_fixed_state(runner, b)
            print(f"round {r + 1} PF={pf}: " + ", ".join(
                f"b={b} {times[pf][b][-1]:.3f} ms" for b in BATCHES), flush=True)
    summary = {str(pf): {str(b): {"median_ms": statistics.median(times[pf][b]), "all_ms": times[pf][b]}
                         for b in BATCHES} for pf in variants}
    checks = {f"PF={pf} b={b} logits bitwise equal to PF={variants[0]}":
              bool(torch.equal(logits[(variants[0], b)], logits[(pf, b)]))
              for pf in variants[1:] for b in BATCHES}
    out = {"summary": summary, "checks": checks,
           "weight_bytes_per_step": weight_bytes(runner.model, decode=True)}
    del llm, runner
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main() -> int:
    config_dir, tok, out_path = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    variants = [int(v) for v in (sys.argv[5] if len(sys.argv) > 5 else "0,2,4").split(",")]
    default = pdl.L2_AHEAD
    cases = {name: probe(config_dir, tok, kw, variants, rounds) for name, kw in ENGINES.items()}
    pdl.L2_AHEAD = default
    bw = copy_bandwidth(torch.device("cuda"))
    for c in cases.values():
        c["weights_over_bandwidth_ms"] = c["weight_bytes_per_step"] / bw * 1e3
    ratio = {f"PF={pf} b={b}": cases["bf16"]["summary"][str(pf)][str(b)]["median_ms"]
             / cases["int4+lm_head"]["summary"][str(pf)][str(b)]["median_ms"]
             for pf in variants for b in BATCHES}
    result = header({"benchmark": "decode step with weight tiles prefetched to L2 before the PDL wait",
                     "model": config_dir, "context": CTX, "rounds": rounds, "variants_pf": variants,
                     "copy_bandwidth_GBps": bw / 1e9, "cases": cases, "bf16_over_int4": ratio})
    for name, c in cases.items():
        print(f"{name}: " + "; ".join(f"PF={pf} " + ", ".join(
            f"b={b} {c['summary'][str(pf)][str(b)]['median_ms']:.3f}" for b in BATCHES) for pf in variants)
              + f" ms (roofline {c['weights_over_bandwidth_ms']:.3f} ms)")
        print(json.dumps(c["checks"]))
    print("bf16 / int4:", json.dumps({k: round(v, 3) for k, v in ratio.items()}))
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
