"""A quantized KV cache (`--kv-cache-dtype int8|fp8`): one byte per cached value. A row is one
token's D values for one KV head; the two formats differ in whether the row carries a scale.

- int8: rows of D + 4 bytes, [num_blocks, block_size, KVH, D + 4] int8. Bytes [0, D) hold
  q = round(x / s) in [-127, 127] with s = max|x| / 127, bytes [D, D + 4) hold s as float32;
  the row stands for q * s (at most s / 2 off per value). int8 has no exponent, so it needs the
  scale to follow each token's range.
- fp8 (float8_e4m3fn): rows of just D values, no scale (vLLM's default fp8 KV cache, a
  per-tensor scale of 1.0). The row stands for clamp(x, -448, 448) cast to e4m3: the format's
  own exponent scales each value (3 mantissa bits: relative error <= 2^-4 for |x| >= 2^-6;
  below that subnormal steps of 2^-9). Any stored scale, per row or per block, costs more
  than half of a bf16 row; without one an fp8 block is exactly half a bf16 block, and the
  same memory holds exactly twice the tokens (4x a float32 pool's).

A scale per row rather than per block keeps an int8 row writable on its own (a decode step
writes one token). Every cache reader dequantizes to the query's dtype before the attention
math.
"""
from __future__ import annotations

import torch

SCALE_BYTES = 4  # int8 rows: the float32 scale after the D values
DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}


def is_quantized(cache: torch.Tensor) -> bool:
    return cache.dtype in QMAX


def row_width(dtype: torch.dtype, head_dim: int) -> int:
    """Elements (bytes, for the quantized dtypes) per cached row of one token and KV head."""
    return head_dim + SCALE_BYTES if dtype == torch.int8 else head_dim


def quantize_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [..., D] (any float dtype) -> rows [..., row_width(dtype, D)] of `dtype`."""
    xf = x.float()
    if dtype == torch.float8_e4m3fn:
        return xf.clamp(-448.0, 448.0).to(dtype)
    scale = xf.abs().amax(dim=-1, keepdim=True) / QMAX[dtype]  # [..., 1]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (xf / scale).round().clamp_(-127, 127)
    rows = torch.empty(*x.shape[:-1], x.shape[-1] + SCALE_BYTES, dtype=dtype, device=x.device)
    rows[..., :x.shape[-1]] = q.to(dtype)
    rows.view(torch.uint8)[..., x.shape[-1]:] = scale.view(torch.uint8)
    return rows


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """rows [..., row width] of int8 or fp8 -> [..., D] in `dtype`."""
    if rows.dtype == torch.float8_e4m3fn:
        return rows.to(dtype)
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
