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
        self._store = lib.store_kv_rows
        self._store.argtypes = [_p, _i, ctypes.c_long, ctypes.c_long, ctypes.c_long, _p, _p, _p, ctypes.c_int64]
        self._store.restype = _i
        self._store_q8 = lib.store_kv_q8_rows
        self._store_q8.argtypes = [_p, _i, ctypes.c_long, ctypes.c_long, _i, _i, _i, _p, _p, _p, ctypes.c_int64]
        self._store_q8.restype = _i

    stores_int8_kv = True  # rope_neox_store_kv also quantizes into int8 caches (Attention.attend)

    def addresses(self, dtype: torch.dtype, int8_kv: bool = False) -> tuple[int, int, int, int]:
        """The C entry points of add_rms_norm, silu_mul, rope_neox (for `dtype`) and the KV store
        (int8_kv: store_kv_q8_rows), as addresses, for C code that calls them itself
        (kernels/cpu_decode.py)."""
        fns = (self._norm[dtype], self._silu[dtype], self._rope[dtype], self._store_q8 if int8_kv else self._store)
        return tuple(ctypes.cast(fn, ctypes.c_void_p).value for fn in fns)

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

    def rope_neox_store_kv(self, qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int,
                           head_dim: int, cos: torch.Tensor, sin: torch.Tensor,
                           k_cache: torch.Tensor, v_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        """rope_neox on the q and k heads of qkv [T, stride], then each row's k and v heads into
        the caches [num_blocks, block_size, KVH, D] at slot_mapping [T] (-1: not stored), as
        kernels/ref.py; int8 caches [num_blocks, block_size, KVH, D + 4] get each head quantized
        (attention/kv_quant.py's rows, the same bytes); caches of another dtype (fp8) or layout
        take ref.py's store."""
        self.rope_neox(qkv, num_q_heads + num_kv_heads, head_dim, cos, sin)
        kv = num_kv_heads * head_dim
        if (k_cache.dtype == v_cache.dtype == torch.int8 and k_cache.is_contiguous() and v_cache.is_contiguous()
                and k_cache.shape[2:] == (num_kv_heads, head_dim + 4) and qkv.stride(1) == 1):
            slots = slot_mapping.to(torch.int64).contiguous()
            es = qkv.element_size()
            rows = k_cache.shape[0] * k_cache.shape[1]
            if self._store_q8(qkv.data_ptr(), qkv.shape[0], qkv.stride(0) * es, num_q_heads * head_dim * es,
                              num_kv_heads, head_dim, es, k_cache.data_ptr(), v_cache.data_ptr(),
                              slots.data_ptr(), rows) != 0:
                raise IndexError(f"a KV slot is past the cache's {rows} rows: {slots.max().item()}")
            return
        if (k_cache.dtype != qkv.dtype or v_cache.dtype != qkv.dtype or not k_cache.is_contiguous()
                or not v_cache.is_contiguous() or k_cache.shape[2] * k_cache.shape[3] != kv):
            from nextok.kernels.ref import store_rotated_kv

            store_rotated_kv(qkv, num_q_heads, num_kv_heads, head_dim, k_cache, v_cache, slot_mapping)
            return
        slots = slot_mapping.to(torch.int64).contiguous()
        es = qkv.element_size()
        rows = k_cache.shape[0] * k_cache.shape[1]
        if self._store(qkv.data_ptr(), qkv.shape[0], qkv.stride(0) * es, num_q_heads * head_dim * es,
                       kv * es, k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(), rows) != 0:
            raise IndexError(f"a KV slot is past the cache's {rows} rows: {slots.max().item()}")


def load_fused_ops() -> FusedOps | None:
    """The kernels, or None where they cannot be built (the torch ops are used then)."""
    global _ops
    if _ops is False:
        lib = cpu_build.load("fused_ops")
        _ops = None if lib is None else FusedOps(lib)
    return _ops
