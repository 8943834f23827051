"""Perplexity on held-out code with each linear layer's input x rounded the ways a W4 kernel could
take it: what would W4A8 (x as int8 per run of 32 columns, one dp4a per 4 weights instead of
the fixed point's 2) cost in quality, beside what W4A16's kernels do now.

    python benchmarks/activation_ppl.py OUT.json [max_tokens]

transformers' float32 model from the default GGUF (the numerical reference of the tests), every
decoder linear's weight through round-to-nearest int4 (groups of 64, quant/int4.py) except in
the first row, scored as `nextok eval ppl --dataset code` scores (the eval split of the standard
library, the same windows: context 512, stride 256, the first max_tokens tokens). x per variant:
float32; bfloat16 (what the GPU kernels are given); 16-bit fixed point per 32 columns (XRUN,
kernels/triton/w4a16.py); int8 per 32 columns (scale max|x| / 127); int8 per token (one scale a
row of x, the W4A8 of QQQ and QServe). And the int4 weights as the GPU's tl.dot kernels hold them,
with x in bfloat16: each weight rounded to bfloat16, and (PAIRS, kernels/triton/w4a16_dot.py)
d and m rounded to bfloat16 first. --only SUBSTRING runs the variants whose label has it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fixed_point_error import fixed_point, reference_model  # noqa: E402

from nextok.bench.common import header  # noqa: E402
from nextok.eval.ppl import load_documents  # noqa: E402
from nextok.eval.windows import plan_windows  # noqa: E402
from nextok.quant.int4 import dequantize_groups, quantize_groups  # noqa: E402

CONTEXT, STRIDE, GROUP = 512, 256, 64


def int8_runs(x: torch.Tensor, cols: int) -> torch.Tensor:
    """x [T, K] as symmetric int8 per `cols` columns (cols = K: per token), dequantized."""
    w = x.reshape(x.shape[0], -1, cols)
    s = w.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 127
    return (torch.round(w / s).clamp(-127, 127) * s).reshape(x.shape)


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.bfloat16().float()


# label: (weights: "float32", "int4" (float32 q d + m), "int4 bf16" (q d + m rounded to bfloat16),
# "int4 pairs" (d and m rounded to bfloat16, then q d + m), x rounded)
VARIANTS = {
    "float32 weights, float32 x": ("float32", lambda x: x),
    "int4 weights, float32 x": ("int4", lambda x: x),
    "int4, x bfloat16": ("int4", bf16),
    "int4, x fixed point per 32 columns (XRUN)": ("int4", lambda x: fixed_point(bf16(x), 32)),
    "int4, x int8 per 32 columns (W4A8)": ("int4", lambda x: int8_runs(bf16(x), 32)),
    "int4, x int8 per token (W4A8)": ("int4", lambda x: int8_runs(bf16(x), x.shape[-1])),
    "int4 weights in bfloat16, x bfloat16": ("int4 bf16", bf16),
    "int4 weights in bfloat16 from d, m in bfloat16 (PAIRS), x bfloat16": ("int4 pairs", bf16),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("max_tokens", nargs="?", type=int, default=20000)
    ap.add_argument("--only", default="", help="run the variants whose label contains this")
    args = ap.parse_args()
    model, tok = reference_model()
    docs = load_documents("code", tok, args.max_tokens)
    linears = {name: mod for name, mod in model.named_modules()
               if isinstance(mod, torch.nn.Linear) and "lm_head" not in name}
    full = {name: mod.weight.detach().clone() for name, mod in linears.items()}
    groups = {name: quantize_groups(w, GROUP) for name, w in full.items()}
    weights = {"float32": full,
               "int4": {name: dequantize_groups(*g).float() for name, g in groups.items()},
               "int4 bf16": {name: bf16(dequantize_groups(*g)) for name, g in groups.items()},
               "int4 pairs": {name: bf16(dequantize_groups(q, d.bfloat16(), m.bfloat16()))
                              for name, (q, d, m) in groups.items()}}
    current = {"x": None}
    for mod in linears.values():  # x as the variant rounds it, before every decoder linear
        mod.register_forward_pre_hook(lambda m, inp: (current["x"](inp[0].reshape(-1, inp[0].shape[-1]))
                                                      .reshape(inp[0].shape),))
    results = {}
    for label, (kind, round_x) in VARIANTS.items():
        if args.only not in label:
            continue
        with torch.no_grad():
            for name, mod in linears.items():
                mod.weight.copy_(weights[kind][name])
        current["x"] = round_x
        nll, tokens = 0.0, 0
        with torch.inference_mode():
            for _, ids in docs:
                t = torch.tensor(ids)
                for w in plan_windows(len(ids), CONTEXT, STRIDE):
                    a, b = w.fed
                    logits = model(t[a:b][None]).logits[0, w.first_scored - 1 - a:].float()
                    nll -= logits.log_softmax(-1).gather(1, t[w.first_scored:w.end, None])[:, 0].double().sum().item()
                    tokens += w.end - w.first_scored
        results[label] = {"ppl": math.exp(nll / tokens), "nll_mean": nll / tokens, "tokens": tokens}
        print(f"{label:>45}: ppl {results[label]['ppl']:.4f}", flush=True)
    base = results.get("int4, x bfloat16", {}).get("ppl")
    for r in results.values():
        if base:
            r["vs_int4_bf16_x"] = r["ppl"] / base - 1
    result = header({"benchmark": "perplexity with each linear's x rounded per variant (default model)",
                     "dataset": "code (eval split)", "context": CONTEXT, "stride": STRIDE,
                     "int4_group": GROUP, "files": len(docs), "results": results})
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
