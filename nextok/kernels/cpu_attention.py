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
    """The kernel's entry points {dtype: fn} (float32, bfloat16 caches of the query's dtype;
    ("q8", dtype): int8 caches, --kv-cache-dtype int8), or None where it cannot be built (then use the
    torch path)."""
    lib = cpu_build.load("paged_decode")
    if lib is None:
        return None
    fns = {torch.float32: lib.paged_decode_f32, torch.bfloat16: lib.paged_decode_bf16,
           ("q8", torch.float32): lib.paged_decode_q8_f32, ("q8", torch.bfloat16): lib.paged_decode_q8_bf16}
    for fn in fns.values():
        fn.restype = _c_int
        fn.argtypes = [_c_ptr] * 6 + [_c_int] * 6 + [_c_float, _c_int, _c_int]
    lib.paged_decode_q8_supported.argtypes = [_c_int] * 3
    lib.paged_decode_q8_supported.restype = _c_int
    fns["q8_supported"] = lib.paged_decode_q8_supported
    return fns


def q8_supported(fns, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Has this build a kernel for int8 caches of this shape (AVX2; up to 16 query heads a KV
    head; head_dim 32, 64 or 128)?"""
    return fns is not None and fns["q8_supported"](heads, kv_heads, head_dim) != 0


def paged_decode(fns, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                 window: int | None) -> torch.Tensor:
    """q: [B, H, D] float32 or bfloat16 -> [B, H, D]; caches [N, bs, KVH, D] of q's dtype, or
    int8 rows [N, bs, KVH, D + 4] (attention/kv_quant.py; q8_supported shapes); tables [B, nb];
    lens [B]. fns: load_paged_decode()'s."""
    b, h, d = q.shape
    q = q.contiguous()
    out = torch.empty_like(q)
    tables = block_tables.contiguous()
    lens = context_lens.contiguous()
    args = (q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
            lens.data_ptr(), out.data_ptr(), b, h, k_cache.shape[2], d, k_cache.shape[1],
            tables.shape[1], scale, window or 0, torch.get_num_threads())
    rc = fns[("q8", q.dtype) if k_cache.dtype == torch.int8 else q.dtype](*args)
    if rc != 0:
        raise RuntimeError("paged_decode failed (more than 256 heads, or no memory)")
    return out
