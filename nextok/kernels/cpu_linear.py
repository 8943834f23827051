"""CPU linear layers on oneDNN with weights packed once at load ("prepacked").

`F.linear` on CPU calls MKL's sgemm with the weight as stored, [out, in], re-reading and
re-blocking it on every call. oneDNN can reorder the weight once into the blocked layout its
kernels stream best; measured on a 2-core AVX2 EPYC (GFLOP/s, F.linear -> packed):

    M=1  576->3072: 19 -> 23     M=7  576->3072: 36 -> 88     M=64 576->3072: 116 -> 137
    M=1  576->49152 (lm_head): 7 -> 11      M=7: 13 -> 47      M=64: 75 -> 125

which is most of a decode step at the batch sizes a CPU server runs. Results equal F.linear's to
float32 rounding (a different summation order). Where the private oneDNN ops are missing or
refuse the dtype, `pack_linears` leaves the model alone: the choice is made once, at load.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger("nextok")


def _ops_work(dtype: torch.dtype) -> bool:
    """Do the oneDNN linear ops exist in this torch build and agree with F.linear?"""
    try:
        w = torch.randn(24, 16, dtype=dtype)
        x = torch.randn(3, 16, dtype=dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return bool(torch.allclose(y.float(), nn.functional.linear(x, w).float(), atol=1e-2, rtol=1e-2))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


class PackedLinear(nn.Module):
    """y = x @ W.T + b with W held in oneDNN's packed layout. x: [T, in] -> [T, out]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        # No batch-size hint: the packed layout then serves every M a step brings.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        self.bias = None if bias is None else bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous():
            x = x.contiguous()
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"


def pack_linears(model: nn.Module, dtype: torch.dtype) -> int:
    """Swap every nn.Linear of a CPU model for a PackedLinear; returns how many were swapped."""
    if not _ops_work(dtype):
        log.info("oneDNN packed linear unavailable for %s; using F.linear", dtype)
        return 0
    targets = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    for name, mod in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, PackedLinear(mod.weight, mod.bias))
    return len(targets)
