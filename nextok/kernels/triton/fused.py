"""The elementwise parts of a decoder layer as Triton kernels: one launch per op.

- add + RMSNorm: one program per row reads x (and the residual), writes the new residual in
  place and the normed row: 2 (3) reads + 1 (2) writes of [D] instead of torch's ~6 passes;
- silu(gate) * up: one pass over [T, 2I];
- RoPE (neox): rotates the q and k heads of the fused qkv rows in place; with the KV store, the
  same launch also writes the rotated k and the v heads to the paged caches (one launch less
  per layer: at batch 1 a decode step is bound by launches as much as by bytes).
Numerics follow kernels/ref.py (the model's torch path) in every dtype: each op computes in
float32 and rounds to the activation dtype wherever the torch path has a tensor of that dtype
(the residual sum; the norm before the weight; silu before the product; each RoPE product), so
bf16/fp16 results equal torch's bit for bit except where the norm's float32 sum of squares (a
different summation order) or exp/rsqrt's last bits tip a rounding.
Launch grids depend on shapes only and nothing syncs with the host, so the ops can be captured
in CUDA graphs. Without a GPU they run in Triton's interpreter (TRITON_INTERPRET=1, CPU tensors).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from nextok.kernels.triton import pdl
from nextok.kernels.triton.e4m3 import to_e4m3
from nextok.kernels.triton.fp8_quant import MAX_K as FP8_MAX_K, quant_row
from nextok.kernels.triton.pdl import pdl_wait


# Triton's interpreter runs the kernels (the CPU tests): _round then rounds bfloat16 by hand
_BY_HAND: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def _round(x, dtype: tl.constexpr):
    """float32 x rounded to `dtype` (to nearest even) and back to float32. In the interpreter
    bfloat16 is rounded by hand: it truncates a float32 -> bfloat16 cast (the GPU rounds to
    nearest even), and the CPU tests should see the GPU's bits. On the GPU the cast itself
    (cvt.rn: one instruction, against ~5 by hand). Exact values stay exact under a cast."""
    if dtype == tl.bfloat16 and _BY_HAND:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    else:
        return x.to(dtype).to(tl.float32)


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, s_ptr, x_stride, res_stride, out_stride, d,
                         eps, HAS_RESIDUAL: tl.constexpr, FP8: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
    # One row: [BLOCK >= d] columns, the tail masked. FP8: out is e4m3 and s [T] float32, the
    # row in x's dtype quantized as fp8_quant.py's kernel would (the FP8 layer after the norm).
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0)
        x = _round(x.to(tl.float32) + r.to(tl.float32), x.dtype).to(x.dtype)  # torch's x + residual
        tl.store(res_ptr + row * res_stride + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / d + eps)
    normed = _round(xf * rstd, x.dtype)  # below float32: the cast before the weight
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if FP8:
        quant_row(_round(normed * w, x.dtype), out_ptr + row * out_stride + cols, s_ptr + row, mask)
    else:
        out_dt: tl.constexpr = out_ptr.dtype.element_ty
        tl.store(out_ptr + row * out_stride + cols, _round(normed * w, out_dt).to(out_dt), mask=mask)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, s_ptr, gu_stride, out_stride, inter, FP8: tl.constexpr,
                     BLOCK: tl.constexpr, PDL: tl.constexpr):
    # Program (row, block of columns): out[row, c] = silu(gate[row, c]) * up[row, c]. FP8: one
    # block a row, out e4m3 and s [T] float32 (as in _add_rms_norm_kernel).
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    g = tl.load(gu_ptr + row * gu_stride + cols, mask=mask, other=0.0)
    u = tl.load(gu_ptr + row * gu_stride + inter + cols, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    silu = _round(gf / (1.0 + tl.exp(-gf)), g.dtype)  # torch's silu, rounded
    y = _round(silu * u.to(tl.float32), g.dtype)
    if FP8:
        quant_row(y, out_ptr + row * out_stride + cols, s_ptr + row, mask)
    else:
        tl.store(out_ptr + row * out_stride + cols, y.to(g.dtype), mask=mask)


@triton.jit
def _rope_neox_kernel(qkv_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, slot_ptr, qkv_stride, cos_stride,
                      sin_stride, num_heads, num_q_heads, num_kv_heads, s_cb, s_cs, s_ch,
                      HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, STORE: tl.constexpr,
                      FP8: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                      PDL: tl.constexpr):
    # Program (row, block of heads): (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) per head,
    # x1 the first half of a head, x2 the second; cos/sin [D/2] loaded once for the row.
    # STORE: heads [num_q_heads, num_heads) are the k heads; each rotated k head and the v head
    # of the same index (num_kv_heads heads further along the row) are also written to the
    # caches' row of this token's slot (-1: a padding token, written nowhere). FP8: the caches
    # hold e4m3 rows without a scale (attention/kv_quant.py): values clamp to +-448 and cast.
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_D)
    half: tl.constexpr = HEAD_DIM // 2
    cmask = cols < half
    c = tl.load(cos_ptr + row * cos_stride + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + row * sin_stride + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    mask = (heads[:, None] < num_heads) & cmask[None, :]
    p1 = qkv_ptr + row * qkv_stride + heads[:, None] * HEAD_DIM + cols[None, :]
    p2 = p1 + half
    x1 = tl.load(p1, mask=mask, other=0.0)
    dt = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
    # Every product rounds to the activation dtype before the sum, as torch's eager ops do.
    o1 = _round(_round(x1 * c, dt) - _round(x2 * s, dt), dt).to(dt)
    o2 = _round(_round(x2 * c, dt) + _round(x1 * s, dt), dt).to(dt)
    tl.store(p1, o1, mask=mask)
    tl.store(p2, o2, mask=mask)
    if STORE:
        slot = tl.load(slot_ptr + row)
        kv_head = heads - num_q_heads  # [BLOCK_H]; negative for q heads
        kmask = mask & (kv_head[:, None] >= 0) & (slot >= 0)
        dst = (slot // PAGE) * s_cb + (slot % PAGE) * s_cs + kv_head[:, None] * s_ch + cols[None, :]
        v1 = tl.load(p1 + num_kv_heads * HEAD_DIM, mask=kmask)
        v2 = tl.load(p2 + num_kv_heads * HEAD_DIM, mask=kmask)
        tl.store(kc_ptr + dst, _cache_value(o1, kc_ptr, FP8), mask=kmask)
        tl.store(kc_ptr + dst + half, _cache_value(o2, kc_ptr, FP8), mask=kmask)
        tl.store(vc_ptr + dst, _cache_value(v1, vc_ptr, FP8), mask=kmask)
        tl.store(vc_ptr + dst + half, _cache_value(v2, vc_ptr, FP8), mask=kmask)


@triton.jit
def _cache_value(x, cache_ptr, FP8: tl.constexpr):
    # x as the cache stores it: itself, or (FP8) clamped to +-448 and cast to e4m3. One return:
    # the compiler checks every return's type, also in a branch a constexpr drops.
    if FP8:
        y = to_e4m3(x.to(tl.float32), cache_ptr.dtype.element_ty)
    else:
        y = x
    return y


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t itself if its rows are unit-stride (a [T, D] view with any row stride), else a copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _pdl(device: torch.device) -> dict:
    """The launch arguments of a kernel that keeps pdl.py's contract (waits before any access)."""
    on = pdl.enabled(device)
    return dict(PDL=on, launch_pdl=on)


def _norm_warps(block: int) -> int:
    # H200, bf16, 2048 rows: 4 warps best up to 2048 columns; 4 and 8 tie at 4096.
    return min(16, max(4, block // 512))


class TritonFusedOps:
    """The `fused` interface of RMSNorm, Attention and SwiGLU (see kernels/ref.py), on CUDA; and
    `linear` for the model's dense layers (model/layers.py FusedLinear)."""

    name = "triton"

    def __init__(self, gemv_rows: int | None = None):
        from nextok.kernels.triton.gemv import MAX_ROWS

        # Steps of up to this many rows take the Triton GEMV (NEXTOK_TRITON_GEMV=0: never).
        if gemv_rows is None:
            gemv_rows = MAX_ROWS if os.environ.get("NEXTOK_TRITON_GEMV", "1") != "0" else 0
        self.gemv_rows = min(gemv_rows, MAX_ROWS)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [T, in] @ weight[out, in].T + bias: the GEMV for decode-sized half-precision steps on
        CUDA, torch's (cuBLAS) otherwise."""
        if (x.shape[0] <= self.gemv_rows and x.is_cuda and x.dim() == 2 and x.dtype == weight.dtype
                and x.dtype in (torch.bfloat16, torch.float16) and x.stride(-1) == 1
                and weight.is_contiguous()):
            from nextok.kernels.triton.gemv import gemv

            return gemv(x, weight, bias)
        return torch.nn.functional.linear(x, weight, bias)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """residual += x in place (without a residual, x becomes it), then
        (rms_norm(residual) * weight, residual). x, residual: [T, D]."""
        return self._add_rms_norm(x, residual, weight, eps, False)

    def add_rms_norm_fp8(self, x: torch.Tensor, residual: torch.Tensor | None,
                         weight: torch.Tensor, eps: float) -> tuple[tuple, torch.Tensor]:
        """add_rms_norm with the normed rows quantized for an FP8 layer (quant/fp8.py):
        ((e4m3 [T, D], float32 scales [T, 1]), residual), the bits that quantize_rows_fp8 of
        add_rms_norm's output would give, in one launch. The weight in x's dtype, D <= 16384."""
        if weight.dtype != x.dtype or x.shape[-1] > FP8_MAX_K:
            raise ValueError(f"add_rms_norm_fp8 takes a weight in x's dtype ({x.dtype}, not "
                             f"{weight.dtype}) and rows of at most {FP8_MAX_K} values")
        return self._add_rms_norm(x, residual, weight, eps, True)

    def _add_rms_norm(self, x, residual, weight, eps, fp8: bool):
        x = _rows(x)
        has_res = residual is not None
        residual = _rows(residual) if has_res else x  # (a copy if not unit-stride: returned anyway)
        t, d = x.shape
        dtype = torch.float8_e4m3fn if fp8 else torch.promote_types(x.dtype, weight.dtype)
        out = torch.empty((t, d), dtype=dtype, device=x.device)
        scale = torch.empty(t, 1, dtype=torch.float32, device=x.device) if fp8 else out  # (unused)
        if t:
            block = triton.next_power_of_2(d)
            _add_rms_norm_kernel[(t,)](
                x, residual, weight, out, scale, x.stride(0), residual.stride(0), out.stride(0), d,
                eps, HAS_RESIDUAL=has_res, FP8=fp8, BLOCK=block, num_warps=_norm_warps(block),
                **_pdl(x.device))
        return ((out, scale) if fp8 else out), residual

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2I] -> silu(gate) * up [T, I]."""
        return self._silu_mul(gate_up, False)

    def silu_mul_fp8(self, gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """silu_mul quantized for an FP8 layer: (e4m3 [T, I], float32 scales [T, 1]) as
        quantize_rows_fp8 of silu_mul's output, in one launch (a row a program). I <= 16384."""
        if gate_up.shape[-1] > 2 * FP8_MAX_K:
            raise ValueError(f"silu_mul_fp8 takes rows of at most 2 x {FP8_MAX_K} values")
        return self._silu_mul(gate_up, True)

    def _silu_mul(self, gate_up, fp8: bool):
        gate_up = _rows(gate_up)
        t, inter = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty((t, inter), dtype=torch.float8_e4m3fn if fp8 else gate_up.dtype,
                          device=gate_up.device)
        scale = torch.empty(t, 1, dtype=torch.float32, device=gate_up.device) if fp8 else out
        if t:
            # FP8: the whole row in one program, for its max
            block = triton.next_power_of_2(inter) if fp8 else min(triton.next_power_of_2(inter), 1024)
            _silu_mul_kernel[(t, triton.cdiv(inter, block))](
                gate_up, out, scale, gate_up.stride(0), out.stride(0), inter, FP8=fp8, BLOCK=block,
                num_warps=_norm_warps(block) if fp8 else 4, **_pdl(gate_up.device))
        return (out, scale) if fp8 else out

    def rope_neox(self, qkv: torch.Tensor, num_heads: int, head_dim: int, cos: torch.Tensor,
                  sin: torch.Tensor) -> None:
        """Rotate heads [0, num_heads) of each row of qkv [T, stride] in place.
        cos, sin: [T, 1, D/2] or [T, D/2]."""
        self._rope(qkv, num_heads, head_dim, cos, sin)

    def rope_neox_store_kv(self, qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int,
                           head_dim: int, cos: torch.Tensor, sin: torch.Tensor,
                           k_cache: torch.Tensor, v_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        """rope_neox over the q and k heads of qkv [T, (H + 2 KVH) * D], then the rotated k and
        the v heads of each row into the caches [num_blocks, block_size, KVH, D] at
        slot_mapping [T] (-1: not stored), in one launch instead of two. Caches of the
        activation dtype or fp8 (e4m3 rows without a scale, attention/kv_quant.py)."""
        if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
            raise ValueError("k and v caches need the same strides and unit-stride rows")
        if k_cache.dtype not in (qkv.dtype, torch.float8_e4m3fn):
            raise ValueError(f"rope_neox_store_kv writes {qkv.dtype} or fp8 caches, "
                             f"not {k_cache.dtype}")
        self._rope(qkv, num_q_heads + num_kv_heads, head_dim, cos, sin,
                   (k_cache, v_cache, slot_mapping, num_q_heads, num_kv_heads))

    @staticmethod
    def _rope(qkv, num_heads, head_dim, cos, sin, store=None) -> None:
        if qkv.stride(-1) != 1:
            raise ValueError("rope_neox rotates rows of a [T, stride] tensor, unit column stride")
        t = qkv.shape[0]
        cos, sin = _rows(cos.reshape(t, head_dim // 2)), _rows(sin.reshape(t, head_dim // 2))
        if not t:
            return
        if store is None:
            kc = vc = slots = qkv  # unused
            num_q, num_kv, strides, page = num_heads, 0, (0, 0, 0), 1
        else:
            kc, vc, slots, num_q, num_kv = store
            strides, page = kc.stride()[:3], kc.shape[1]
        block_d = triton.next_power_of_2(head_dim // 2)
        # 16 heads of 128 per program: on an H200 ~20% faster than 32 or 64 at 2048 tokens.
        block_h = min(triton.next_power_of_2(num_heads), max(1, 1024 // block_d))
        # No fma contraction: each product rounds on its own, as torch's (float32 too).
        _rope_neox_kernel[(t, triton.cdiv(num_heads, block_h))](
            qkv, cos, sin, kc, vc, slots, qkv.stride(0), cos.stride(0), sin.stride(0), num_heads,
            num_q, num_kv, *strides, HEAD_DIM=head_dim, PAGE=page, STORE=store is not None,
            FP8=kc.dtype == torch.float8_e4m3fn, BLOCK_H=block_h, BLOCK_D=block_d, num_warps=4,
            enable_fp_fusion=False, **_pdl(qkv.device))
