"""The QuantMethod interface and the module swap that applies it to a loaded model."""
from __future__ import annotations

import functools
from abc import ABC, abstractmethod

import torch
from torch import nn


class QuantMethod(ABC):
    """One way to hold a linear layer's weight quantized and to apply it.

    - `check(device, dtype)` raises NextokError where the method cannot run (say, FP8 on a GPU
      without FP8 tensor cores), before any weight is touched;
    - `create_layer(weight, bias)` returns the quantized layer for a loaded dense weight
      [out, in] (methods that quantize at load: int8, fp8). Checkpoint formats that arrive
      quantized (AWQ, GPTQ) will build theirs from the file's tensors instead;
    - the layer's forward is the method's apply: x [T, in] -> [T, out], in x's dtype.
    """

    name: str

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """Raise NextokError if this method cannot run on `device` in `dtype`."""

    @abstractmethod
    def create_layer(self, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
        ...


def quantize_model(model: nn.Module, method: QuantMethod, lm_head: bool = False) -> int:
    """Swap every nn.Linear of the decoder layers for `method`'s layer (the embedding stays
    dense, and so does the lm_head unless `lm_head`). Returns how many were swapped.

    A quantized lm_head (--quantize-lm-head) is opt-in, as in GPTQ's `lm_head` option: it holds
    the logits' precision, but at batch 1 a 4-bit decoder leaves a bf16 lm_head a fifth of the
    step's bytes (Llama-3.1-8B: 1.05 of 4.76 GB). A tied lm_head gets a quantized copy of the
    embedding, which keeps its dense weight for lookups."""
    targets = [(name, mod) for name, mod in model.named_modules()
               if isinstance(mod, nn.Linear) and (lm_head or not name.startswith("lm_head"))]
    for name, mod in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        bias = None if mod.bias is None else mod.bias.detach()
        setattr(parent, attr, method.create_layer(mod.weight.detach(), bias))
    if lm_head and getattr(model, "lm_head", False) is None:  # tied to the embedding
        model.lm_head = method.create_layer(model.embed_tokens.weight.detach(), None)
        model.lm_head_quantized = True  # memory of its own (bench/latency.py weight_bytes)
        return len(targets) + 1
    return len(targets)


def scales_in_order(t: torch.Tensor, group_major: bool) -> torch.Tensor:
    """Per-group scales (or mins) [out, groups] in row order (contiguous), or in group order: a
    view of a [groups, out'] tensor whose rows are padded to a multiple of 16 entries, so the
    kernels' stride between groups is one Triton specializes as divisible by 16 (with a stride
    it cannot, e.g. 24 rows, Triton 3.6 failed to compile the W4A16 tl.dot kernel for sm_90:
    "Illegal shared layout")."""
    if not group_major:
        return t.contiguous()
    out, groups = t.shape
    padded = t.new_zeros(groups, -(-out // 16) * 16)
    padded[:, :out] = t.t()
    return padded[:, :out].t()


def bias_parameter(bias: torch.Tensor | None) -> nn.Parameter | None:
    """A quantized layer's bias as a parameter (quantize_model hands over a plain tensor), so that
    .to(device) moves it with the layer's buffers."""
    if bias is None or isinstance(bias, nn.Parameter):
        return bias
    return nn.Parameter(bias, requires_grad=False)


@functools.cache
def triton_gemv_rows() -> int:
    """The most rows the W8A16 Triton kernel takes (kernels/triton/quant_linear.py); 0 without
    triton (the torch path takes every step). The layers take their own limits below it
    (w4a16_tiles, w8a16_tiles). Decided once: the layers ask on every call."""
    try:
        from nextok.kernels.triton.quant_linear import MAX_ROWS
    except ImportError:
        return 0
    return MAX_ROWS
