"""`nextok quantize --method awq`: calibrate, search and fold AWQ's scales, clip, and write the
4-bit weights in AutoAWQ's gemm layout (model/awq.py). The algorithm is in quant/awq_algo.py.

The float model (float32, CPU, plain nn.Linear layers) prefills the calibration windows once,
hooks keeping each linear's mean |x| over all tokens and an evenly spaced subset of its input
rows. Folding a scale into the op before a linear leaves the float model's function unchanged,
so every search can use these inputs of the unscaled model (divided by the scales found).
"""
from __future__ import annotations

import torch
from torch import nn

from nextok.model import awq
from nextok.quant import awq_algo

KEEP_ROWS = 1024  # input rows kept per linear for the searches


class _Inputs:
    """mean |x| over every token, and every stride-th row of x, for one linear."""

    def __init__(self, width: int, stride: int):
        self.abs_sum = torch.zeros(width)
        self.count = 0
        self.rows: list[torch.Tensor] = []
        self.stride, self.seen = stride, 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).float()
        self.abs_sum += x.abs().sum(dim=0)
        self.count += x.shape[0]
        first = (-self.seen) % self.stride  # the next kept row's index within x
        self.rows.append(x[first::self.stride].clone())
        self.seen += x.shape[0]

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat(self.rows), self.abs_sum / max(self.count, 1)


def _capture(llm, linears: dict[str, nn.Linear], args) -> dict[str, _Inputs]:
    from nextok import SamplingParams
    from nextok.quant.quantize_cmd import calibration_windows

    windows = calibration_windows(llm.get_tokenizer(), args.num_calib, args.calib_len)
    if not windows:
        raise ValueError(f"no calibration file has {args.calib_len} tokens")
    stride = max(1, sum(map(len, windows)) // KEEP_ROWS)
    inputs = {name: _Inputs(m.in_features, stride) for name, m in linears.items()}
    handles = [m.register_forward_pre_hook(lambda _m, inp, n=name: inputs[n].add(inp[0]))
               for name, m in linears.items()]
    try:
        llm.generate(windows, SamplingParams(temperature=0.0, max_tokens=1))  # prefill only
    finally:
        for h in handles:
            h.remove()
    return inputs


@torch.no_grad()
def awq_tensors(llm, linears: dict[str, nn.Linear], args) -> dict[str, torch.Tensor]:
    """The AWQ checkpoint's tensors of every decoder linear; the model's norms (and, without GQA,
    v rows) are divided by the scales in place, so the caller writes them as they now are."""
    model, g = llm.engine.runner.model, args.group_size
    inputs = _capture(llm, linears, args)
    for i, layer in enumerate(model.layers):
        pre = f"layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        qkv, o, gate_up, down = attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj
        x = {k: inputs[pre + k].result() for k in
             ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")}
        inter = model.config.intermediate_size
        v_rows = slice(attn.q_size + attn.kv_size, None)
        # (what scales, the norm or rows that absorb 1 / s, the rows of the producer)
        plan = [("self_attn.qkv_proj", qkv, layer.input_layernorm.weight, None),
                ("mlp.gate_up_proj", gate_up, layer.post_attention_layernorm.weight, None),
                ("mlp.down_proj", down, gate_up, slice(inter, None))]
        if attn.num_heads == attn.num_kv_heads:  # o's input channel c reads v channel c
            plan.append(("self_attn.o_proj", o, qkv, v_rows))
        scales = {}
        for key, lin, producer, rows in plan:
            xs, mean = x[key]
            s = awq_algo.search_scale(xs, mean, [lin.weight], g)
            lin.weight.mul_(s)
            if rows is None:  # an RMSNorm weight [in]
                producer.div_(s)
            else:  # a linear's output rows, and its bias if it has one
                producer.weight[rows].div_(s.unsqueeze(1))
                if producer.bias is not None:
                    producer.bias[rows].div_(s)
            scales[key] = s
        # Clip the range of each group where it lowers the output error: all but q and k.
        for key, lin, rows in (("self_attn.qkv_proj", qkv, v_rows), ("self_attn.o_proj", o, None),
                               ("mlp.gate_up_proj", gate_up, None), ("mlp.down_proj", down, None)):
            xs = x[key][0] / scales.get(key, 1.0)
            w = lin.weight if rows is None else lin.weight[rows]
            w.copy_(awq_algo.search_clip(xs, w, g))
        for key in x:
            del inputs[pre + key]
    tensors = {}
    for name, mod in linears.items():
        tensors.update(_awq_tensors(model, name, mod, *awq_algo.quantize(mod.weight, g)))
    return tensors


def _awq_tensors(model, name: str, mod: nn.Linear, q, s, z) -> dict[str, torch.Tensor]:
    """Our (possibly fused) linear -> the checkpoint's per-projection AWQ gemm tensors."""
    from nextok.quant.quantize_cmd import shards

    names, sizes = shards(model, name, mod)
    tensors, row = {}, 0
    for hf, n in zip(names, sizes):
        rows = slice(row, row + n)
        pre = "model." + hf
        tensors[pre + ".qweight"] = awq.pack(q[rows].T.contiguous())  # [in, out / 8]
        tensors[pre + ".qzeros"] = awq.pack(z[rows].T.contiguous())  # [in / G, out / 8]
        tensors[pre + ".scales"] = s[rows].T.contiguous()  # [in / G, out] float16
        if mod.bias is not None:
            tensors[pre + ".bias"] = mod.bias.detach()[rows].contiguous()
        row += n
    return tensors
