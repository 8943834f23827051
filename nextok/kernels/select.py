"""Which fused ops a model binds, decided once at construction from its device and dtype."""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("nextok")


def fused_ops_for(device: torch.device, dtype: torch.dtype):
    """The `fused` object for RMSNorm, Attention and SwiGLU (interface: kernels/ref.py):
    - CPU, float32 or bfloat16: the C kernels (kernels/cpu_fused.py), when a compiler builds them;
    - CUDA, any dtype: the Triton kernels (kernels/triton/fused.py), when triton imports;
    - else None: the layers run their inline torch ops (the same numerics as RefFusedOps)."""
    device = torch.device(device)
    if device.type == "cpu":
        if dtype not in (torch.float32, torch.bfloat16):
            return None
        from nextok.kernels.cpu_fused import load_fused_ops

        return load_fused_ops()
    if device.type == "cuda":
        try:
            from nextok.kernels.triton.fused import TritonFusedOps
        except ImportError as e:  # triton missing or broken: the torch ops still work
            log.warning("Triton fused kernels unavailable (%s); using torch ops", e)
            return None
        return TritonFusedOps()
    return None
