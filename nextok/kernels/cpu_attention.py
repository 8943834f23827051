"""Paged decode attention on CPU through the C kernel in csrc/paged_decode.c.

The torch path (attention/torch_ref.py) gathers every sequence's blocks into a contiguous copy
before SDPA: at 64 sequences of ~200 tokens that copy is most of a decode step (measured: gather
4.5 ms + SDPA 3.2 ms per layer). The kernel reads each K/V row once, in place.
"""
from __future__ import annotations

import ctypes

import torch

from nextok.kernels import cpu_build

_c_ptr, _c_int, _c_float = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


def load_paged_decode():
    """The kernel's entry points {dtype: fn} (float32, bfloat16), or None where it cannot be
    built (then use the torch path)."""
    lib = cpu_build.load("paged_decode")
    if lib is None:
        return None
    fns = {torch.float32: lib.paged_decode_f32, torch.bfloat16: lib.paged_decode_bf16}
    for fn in fns.values():
        fn.restype = _c_int
        fn.argtypes = [_c_ptr] * 6 + [_c_int] * 6 + [_c_float, _c_int, _c_int]
    return fns


def paged_decode(fns, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                 window: int | None) -> torch.Tensor:
    """q: [B, H, D] float32 or bfloat16 (the caches' dtype) -> [B, H, D]; caches [N, bs, KVH, D];
    tables [B, nb]; lens [B]. fns: load_paged_decode()'s."""
    fn = fns[q.dtype]
    b, h, d = q.shape
    q = q.contiguous()
    out = torch.empty_like(q)
    tables = block_tables.contiguous()
    lens = context_lens.contiguous()
    rc = fn(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
            lens.data_ptr(), out.data_ptr(), b, h, k_cache.shape[2], d, k_cache.shape[1],
            tables.shape[1], scale, window or 0, torch.get_num_threads())
    if rc != 0:
        raise RuntimeError("paged_decode failed (more than 256 heads, or no memory)")
    return out
