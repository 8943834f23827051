"""How far the W4A16 dp4a kernel's fixed-point x moves each linear layer's output, on the default
model's real activations (kernels/triton/w4a16.py: x in 16-bit fixed point per word of 8 columns,
or with XRUN per run of 4 words, 32 columns), beside rounding x to bfloat16 and the int4 weight's
own error.

    python benchmarks/fixed_point_error.py OUT.json [tokens]

Runs transformers' float32 model from the default GGUF (the numerical reference of the tests)
over the start of a Python standard-library file, keeps every decoder linear layer's input, and
for 64 of its token rows reports ||y' - y|| / ||y|| with y = x W4^T (W4: the weight through
round-to-nearest int4, groups of 64) and y' from x rounded each way.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from nextok.bench.common import header
from nextok.quant.int4 import dequantize_groups, quantize_groups


def fixed_point(x: torch.Tensor, cols: int) -> torch.Tensor:
    """round(x / s) * s per `cols` columns, s = 2^(E - 13) with E the exponent of their largest |x|."""
    w = x.reshape(x.shape[0], -1, cols)
    _, e = torch.frexp(w.abs().amax(-1, keepdim=True).clamp_min(1e-30))
    s = torch.ldexp(torch.ones_like(w), e - 14)
    return (torch.round(w / s) * s).reshape(x.shape)


def rel_w(x: torch.Tensor, w: torch.Tensor, w4: torch.Tensor, y: torch.Tensor) -> float:
    """||x w^T - x w4^T|| / ||x w4^T||: the int4 weight's own error."""
    return ((x @ (w - w4).T).norm() / y.norm()).item()


def reference_model():
    """(transformers' float32 model of the default GGUF, its tokenizer)."""
    import transformers

    from nextok.hub import resolve_model

    path = resolve_model(None)
    kw = dict(gguf_file=os.path.basename(path))
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), dtype=torch.float32,
                                                              **kw).eval()
    return model, transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), **kw)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("tokens", nargs="?", type=int, default=512)
    args = ap.parse_args()
    model, tok = reference_model()
    text = open(argparse.__file__).read()  # a standard-library source the activations come from
    ids = tok(text[:4 * args.tokens], return_tensors="pt").input_ids[:, :args.tokens]
    inputs: dict[str, torch.Tensor] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
            mod.register_forward_hook(lambda m, inp, out, name=name: (inputs.setdefault(
                name, inp[0].detach().reshape(-1, inp[0].shape[-1])), None)[1])  # None: out stays
    with torch.no_grad():
        model(ids)
    rows = []
    for name, mod in model.named_modules():
        if name not in inputs:
            continue
        x = inputs[name][:: max(1, ids.shape[1] // 64)]
        w4 = dequantize_groups(*quantize_groups(mod.weight.detach().float(), 64)).float()
        y = x @ w4.T
        xb = x.bfloat16().float()
        rel = lambda dx: ((dx @ w4.T).norm() / y.norm()).item()  # noqa: E731  (the product is linear)
        rows.append(dict(layer=name, int4_weight=rel_w(x, mod.weight.detach().float(), w4, y),
                         x_to_bfloat16=rel(xb - x), fixed_point_8=rel(fixed_point(xb, 8) - xb),
                         fixed_point_32=rel(fixed_point(xb, 32) - xb),
                         max_over_median_abs_x=(x.abs().amax(-1) / x.abs().median(-1).values).median().item()))
    keys = ("int4_weight", "x_to_bfloat16", "fixed_point_8", "fixed_point_32")
    summary = {k: {"median": statistics.median(r[k] for r in rows), "max": max(r[k] for r in rows)} for k in keys}
    for k in keys:
        print(f"{k:>15}: median {summary[k]['median']:.2e}, max {summary[k]['max']:.2e} (relative to ||y||)")
    result = header({"benchmark": "fixed-point x error of the W4A16 dp4a kernel, default model's activations",
                     "tokens": int(ids.shape[1]), "layers": len(rows), "summary": summary, "rows": rows})
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
