"""Per-token FP8 (e4m3) quantization of activations in one kernel, for FP8 W8A8 (quant/fp8.py).

x [T, K] bf16 / fp16 -> (q e4m3 [T, K], s float32 [T, 1]) with s = max|x[t]| / 448, q = x / s.
The torch version takes six kernels (upcast, abs, amax, clamp, divide, cast) that each read or
write the whole [T, K] in float32; at a prefill chunk of 8192 tokens x 4096 that is ~0.8 GB of
traffic per linear layer, about as long as the FP8 GEMM itself. This reads x once and writes one
byte per value. One program per row, the row held in registers (K <= 16384 at one pass).
`quant_row` is the same quantization for kernels that make the row themselves: the add + RMSNorm
and silu_mul kernels (fused.py) write their output quantized for the FP8 layer after them.
The casts round by hand (e4m3.py: on CUDA the hardware's cast, bit for bit), so the kernels also
run in Triton's interpreter for the CPU tests; the engine runs FP8 on CUDA only (quant/fp8.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from nextok.kernels.triton.e4m3 import to_e4m3

E4M3_MAX = 448.0
MAX_K = 16384


@triton.jit
def quant_row(x, q_ptrs, s_ptr, mask):
    """One row x float32 [BLOCK] (0 where ~mask) -> e4m3 x / s at q_ptrs, s = max|x| / 448 at s_ptr."""
    s = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / 448.0
    tl.store(q_ptrs, to_e4m3(x / s, q_ptrs.dtype.element_ty), mask=mask)
    tl.store(s_ptr, s)


@triton.jit
def _quant_rows_kernel(x_ptr, q_ptr, s_ptr, K, s_xt, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + t * s_xt + k, mask=k < K, other=0.0).to(tl.float32)
    quant_row(x, q_ptr + t * K + k, s_ptr + t, k < K)


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K], unit-stride rows, K <= MAX_K -> (e4m3 [T, K], float32 [T, 1]) (on CUDA, or in
    Triton's interpreter)."""
    t, k = x.shape
    if x.stride(-1) != 1 or k > MAX_K:
        raise ValueError(f"quantize_rows_fp8 takes rows of at most {MAX_K} unit-stride values")
    q = torch.empty(t, k, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(t, 1, dtype=torch.float32, device=x.device)
    if t:
        block = triton.next_power_of_2(k)
        _quant_rows_kernel[(t,)](x, q, s, k, x.stride(0), BLOCK=block,
                                 num_warps=min(16, max(4, block // 1024)))
    return q, s
