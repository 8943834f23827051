"""`nextok quantize --method gptq|awq|rtn MODEL OUT`: 4-bit weights in the GPTQ checkpoint format
(model/gptq.py) for gptq and rtn, in AutoAWQ's gemm format (model/awq.py) for awq: formats that
nextok, vLLM and the reference tools load. AWQ's own steps are in quant/awq_quantize.py.

The model runs in float32 on the CPU, its linear layers as plain nn.Linear; hooks on the decoder's
linears sum H = X^T X over calibration windows of held-out-disjoint code (the stdlib's calibration
split, bench/datasets.py: the eval split of `nextok eval ppl` is never seen). Each linear is then
quantized (quant/gptq_algo.py); fused matrices (qkv, gate_up) share their input, so they are
quantized whole and written back as the checkpoint's separate q/k/v and gate/up tensors.
Everything else (embedding, norms, an untied lm_head) is written in float32 as loaded.
"""
from __future__ import annotations

import json
import os
import time

import torch
from torch import nn

from nextok.model import gptq
from nextok.quant.gptq_algo import quantize

SHARDS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def add_parser(sub, add_engine_args) -> None:
    p = sub.add_parser("quantize", help="write a 4-bit checkpoint: GPTQ or AWQ, or round-to-nearest "
                                        "in the GPTQ format")
    p.add_argument("out", help="output directory")
    p.add_argument("--method", default="gptq", choices=["gptq", "awq", "rtn"])
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--calib", default="code", choices=["code"])
    p.add_argument("--num-calib", type=int, default=64, help="calibration windows")
    p.add_argument("--calib-len", type=int, default=256, help="tokens per calibration window")
    add_engine_args(p)
    p.set_defaults(func=run)


def calibration_windows(tokenizer, num: int, length: int) -> list[list[int]]:
    """One window of `length` tokens from each calibration file long enough, in path order."""
    from nextok.bench.datasets import CALIBRATION_SPLIT, stdlib_split

    windows = []
    for path in stdlib_split()[CALIBRATION_SPLIT]:
        with open(path, encoding="utf-8", errors="replace") as f:
            ids = tokenizer.encode(f.read(), add_special_tokens=False)
        if len(ids) >= length:
            windows.append(ids[:length])
        if len(windows) == num:
            break
    return windows


def run(args) -> int:
    from nextok import LLM
    from nextok.cli import engine_kwargs
    from nextok.model.loader import load_checkpoint

    if args.group_size < 32 or args.group_size % 32 or args.num_calib < 1 or args.calib_len < 2:
        raise ValueError("--group-size must be a multiple of 32, --num-calib >= 1, --calib-len >= 2")
    kw = {**engine_kwargs(args), "dtype": "float32", "device": "cpu", "cpu_kernels": False,
          "gguf_blocks": False, "enable_prefix_caching": False, "quantization": None}
    llm = LLM(**kw)
    model = llm.engine.runner.model
    linears = {name: mod for name, mod in model.named_modules()
               if isinstance(mod, nn.Linear) and name.startswith("layers.")}
    for name, mod in linears.items():
        if mod.in_features % args.group_size:
            raise ValueError(f"--group-size {args.group_size} does not divide {name}'s "
                             f"{mod.in_features} inputs")
    start = time.perf_counter()
    if args.method == "awq":
        from nextok.quant.awq_quantize import awq_tensors

        tensors = awq_tensors(llm, linears, args)  # also folds its scales into the model's norms
    else:
        hessians = _calibrate(llm, linears, args) if args.method == "gptq" else {}
        tensors = {}
        for name, mod in linears.items():
            q, s, z = quantize(mod.weight, args.group_size, hessians.get(name))
            tensors.update(_gptq_tensors(model, name, mod, q, s, z))
    for name, t in model.state_dict().items():  # what is not a quantized linear, as loaded
        if not any(name.startswith(lin + ".") for lin in linears):
            tensors[name if name.startswith("lm_head") else "model." + name] = t.contiguous()
    hf_config = load_checkpoint(llm.engine.config.model_path, llm.engine.config.load_format).hf_config
    _write(args.out, tensors, hf_config, llm.get_tokenizer(), args)
    print(f"{args.method}: {len(linears)} linears quantized to 4 bits (groups of {args.group_size}) "
          f"in {time.perf_counter() - start:.1f} s -> {args.out}")
    return 0


def _calibrate(llm, linears: dict[str, nn.Linear], args) -> dict[str, torch.Tensor]:
    from nextok import SamplingParams

    hessians = {name: torch.zeros(m.in_features, m.in_features) for name, m in linears.items()}

    def hook(name):
        def accumulate(_module, inputs):
            x = inputs[0].reshape(-1, inputs[0].shape[-1]).float()  # [T, in]
            hessians[name].addmm_(x.T, x)
        return accumulate

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in linears.items()]
    try:
        windows = calibration_windows(llm.get_tokenizer(), args.num_calib, args.calib_len)
        if not windows:
            raise ValueError(f"no calibration file has {args.calib_len} tokens")
        llm.generate(windows, SamplingParams(temperature=0.0, max_tokens=1))  # prefill only
    finally:
        for h in handles:
            h.remove()
    return hessians


def shards(model, name: str, mod: nn.Linear) -> tuple[list[str], list[int]]:
    """Our (possibly fused) linear -> the checkpoint's projection names and their row counts."""
    parent, _, attr = name.rpartition(".")
    if attr not in SHARDS:
        return [name], [mod.out_features]
    if attr == "qkv_proj":
        a = model.get_submodule(parent)
        sizes = [a.q_size, a.kv_size, a.kv_size]
    else:
        sizes = [model.config.intermediate_size] * 2
    return [f"{parent}.{p}" for p in SHARDS[attr]], sizes


def _gptq_tensors(model, name: str, mod: nn.Linear, q, s, z) -> dict[str, torch.Tensor]:
    """Our (possibly fused) linear -> the checkpoint's per-projection GPTQ tensors."""
    names, sizes = shards(model, name, mod)
    out, k = q.shape
    g_idx = (torch.arange(k) // (k // s.shape[1])).to(torch.int32)
    tensors, row = {}, 0
    for hf, n in zip(names, sizes):
        rows = slice(row, row + n)
        pre = "model." + hf
        tensors[pre + ".qweight"] = gptq.pack_rows(q[rows].T.contiguous())
        tensors[pre + ".qzeros"] = gptq.pack_cols((z[rows] - 1).T.contiguous())  # stores z - 1
        tensors[pre + ".scales"] = s[rows].T.contiguous()
        tensors[pre + ".g_idx"] = g_idx.clone()  # safetensors refuses shared storage
        if mod.bias is not None:
            tensors[pre + ".bias"] = mod.bias.detach()[rows].contiguous()
        row += n
    return tensors


def _write(out: str, tensors: dict, hf_config: dict, tokenizer, args) -> None:
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "model.safetensors"))
    cfg = dict(hf_config)
    if args.method == "awq":
        cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": args.group_size,
                                      "zero_point": True, "version": "gemm", "quantizer": "nextok awq"}
    else:
        cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": args.group_size,
                                      "desc_act": False, "sym": False, "checkpoint_format": "gptq",
                                      "quantizer": f"nextok {args.method}"}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    tokenizer.save(out)
