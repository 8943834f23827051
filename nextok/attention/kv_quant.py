"""A quantized KV cache (`--kv-cache-dtype int8|fp8`): each cached row of one token and one KV
head holds its D values in one byte each and its own float32 scale in 4 more bytes.

Layout: the cache is [num_blocks, block_size, KVH, D + 4] of int8 (or float8_e4m3fn); bytes
[0, D) of a row are q, bytes [D, D + 4) the scale s, and the row stands for q * s.
- int8: s = max|x| / 127, q = round(x / s) in [-127, 127]: at most s / 2 off per value.
- fp8 (e4m3): s = max|x| / 448, q = x / s cast to e4m3 (3 mantissa bits, relative error 2^-4).
A scale per row rather than per block keeps a row writable on its own (a decode step writes one
token) and follows each token's own range. At head_dim 64 the scale adds 6 % to the row; a
bf16 cache holds 1.88x fewer tokens in the same bytes, a float32 one 3.76x fewer.
Every cache reader dequantizes to the query's dtype before the attention math.
"""
from __future__ import annotations

import torch

SCALE_BYTES = 4
DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}


def is_quantized(cache: torch.Tensor) -> bool:
    return cache.dtype in QMAX


def quantize_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [..., D] (any float dtype) -> rows [..., D + 4] of `dtype`: q and each row's scale."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True) / QMAX[dtype]  # [..., 1]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = xf / scale
    q = q.round().clamp_(-127, 127) if dtype == torch.int8 else q.clamp_(-448, 448)
    rows = torch.empty(*x.shape[:-1], x.shape[-1] + SCALE_BYTES, dtype=dtype, device=x.device)
    rows[..., :x.shape[-1]] = q.to(dtype)
    rows.view(torch.uint8)[..., x.shape[-1]:] = scale.view(torch.uint8)
    return rows


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """rows [..., D + 4] -> [..., D] in `dtype`: q * s."""
    d = rows.shape[-1] - SCALE_BYTES
    scale = rows.view(torch.uint8)[..., d:].contiguous().view(torch.float32)  # [..., 1]
    return (rows[..., :d].float() * scale).to(dtype)


def store(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          slot_mapping: torch.Tensor) -> None:
    """k, v [T, KVH, D] into the quantized caches' rows at slot_mapping [T] (-1: not stored)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    for cache, x in ((k_cache, k), (v_cache, v)):
        rows = quantize_rows(x[keep], cache.dtype)
        # as bytes: torch's CPU index_copy_ has no float8 kernel
        cache.view(torch.uint8).view(-1, *cache.shape[2:]).index_copy_(0, slots, rows.view(torch.uint8))
