"""The elementwise parts of a decoder layer on CPU, float32 or bfloat16, through csrc/fused_ops.c.

A decode step of a small model is mostly op dispatch: at one token a layer's ~40 torch ops take
~11 ms of a 30 ms token (2-core AVX2), its matmuls 16 ms. RMSNorm with its residual add, SwiGLU's
silu * up and RoPE each become one call here. Results equal the torch ops to float32 rounding
(the norm's sum of squares is taken in a different order); in bfloat16 they round where the
torch ops do (kernels/ref.py). Each call takes the kernel of its tensors' dtype.
"""
from __future__ import annotations

import ctypes

import torch

from nextok.kernels import cpu_build

_p, _i, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_ops: "FusedOps | None | bool" = False  # False: not tried yet


class FusedOps:
    def __init__(self, lib: ctypes.CDLL):
        # dtype -> entry point
        self._norm, self._silu, self._rope = {}, {}, {}
        for dtype, sfx in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            self._norm[dtype] = getattr(lib, "add_rms_norm_" + sfx)
            self._norm[dtype].argtypes = [_p, _p, _p, _i, _i, _f, _p, _i, _i]
            self._silu[dtype] = getattr(lib, "silu_mul_" + sfx)
            self._silu[dtype].argtypes = [_p, _i, _i, _p, _i]
            self._rope[dtype] = getattr(lib, "rope_neox_" + sfx)
            self._rope[dtype].argtypes = [_p, _i, _i, _i, _i, _p, _p, _i]
            for fn in (self._norm[dtype], self._silu[dtype], self._rope[dtype]):
                fn.restype = None

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """residual += x (in place; without a residual, x itself becomes it), then
        (rms_norm(residual) * weight, residual). x, residual: [T, D] contiguous float32 or
        bfloat16, weight in the same dtype."""
        add = residual is not None
        x = x.contiguous()
        residual = x if not add else residual.contiguous()  # (a copy if not: returned anyway)
        out = torch.empty_like(residual)
        t, d = residual.shape
        self._norm[x.dtype](x.data_ptr(), residual.data_ptr(), weight.contiguous().data_ptr(), t, d,
                            eps, out.data_ptr(), int(add), torch.get_num_threads())
        return out, residual

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2I] contiguous -> silu(gate) * up [T, I]."""
        gate_up = gate_up.contiguous()
        t, two_i = gate_up.shape
        out = torch.empty(t, two_i // 2, dtype=gate_up.dtype)
        self._silu[gate_up.dtype](gate_up.data_ptr(), t, two_i // 2, out.data_ptr(),
                                  torch.get_num_threads())
        return out

    def rope_neox(self, qkv: torch.Tensor, num_heads: int, head_dim: int, cos: torch.Tensor,
                  sin: torch.Tensor) -> None:
        """Rotate heads [0, num_heads) of each row of qkv [T, stride] in place; cos, sin: [T, D/2]."""
        if qkv.stride(1) != 1:
            raise ValueError("rope_neox rotates rows of a [T, stride] tensor with unit column stride")
        cos, sin = cos.to(qkv.dtype).contiguous(), sin.to(qkv.dtype).contiguous()
        self._rope[qkv.dtype](qkv.data_ptr(), qkv.shape[0], qkv.stride(0), num_heads, head_dim,
                   cos.data_ptr(), sin.data_ptr(), torch.get_num_threads())


def load_fused_ops() -> FusedOps | None:
    """The kernels, or None where they cannot be built (the torch ops are used then)."""
    global _ops
    if _ops is False:
        lib = cpu_build.load("fused_ops")
        _ops = None if lib is None else FusedOps(lib)
    return _ops
