"""FP8 W8A8 (`--quantization fp8`) on GPUs with FP8 tensor cores (compute capability 8.9 or
newer: Ada, Hopper), from a bf16 / fp16 checkpoint at load.

- Weights: e4m3 [out, in] with one float32 scale per output channel, s_w = max|W[o]| / 448
  (448: e4m3's largest finite value), so each channel uses the format's whole range.
- Activations: quantized per token at run time, s_x = max|x[t]| / 448, by one Triton kernel
  (kernels/triton/fp8_quant.py), or in a decoder layer by the add + RMSNorm or silu_mul kernel
  that makes them (forward_add_norm, forward_silu_mul).
- y = (x_q @ W_q^T) * s_x * s_w, through torch._scaled_mm with row-wise scales (float32
  accumulation, output in the activation dtype), then + bias.
Half the weight bytes of bf16, and twice its tensor-core rate for large steps.
"""
from __future__ import annotations

import torch
from torch import nn

from nextok.errors import NextokError
from nextok.quant.base import QuantMethod, bias_parameter

E4M3_MAX = 448.0
MAX_K = 16384  # kernels/triton/fp8_quant.py quantizes rows of up to this many values in one pass


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, C] -> (e4m3 [R, C], float32 scales [R, 1]): x ~ q * s, one scale per row."""
    xf = x.float()
    s = xf.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
    return (xf / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), s


class FP8Linear(nn.Module):
    """x [T, in] (bf16 / fp16, CUDA) -> [T, out] in x's dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, s = quantize_rows(weight)
        self.register_buffer("qweight", q)  # [out, in] e4m3
        self.register_buffer("scale", s.reshape(1, -1).contiguous())  # [1, out] float32
        self.bias = bias_parameter(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        if x2.stride(-1) == 1 and self.in_features <= MAX_K:
            from nextok.kernels.triton.fp8_quant import quantize_rows_fp8

            xq, sx = quantize_rows_fp8(x2)  # one kernel instead of six
        else:
            xq, sx = quantize_rows(x2)
        return self.matmul(xq, sx, x.dtype).reshape(*shape[:-1], self.out_features)

    def matmul(self, xq: torch.Tensor, sx: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Quantized rows xq e4m3 [T, in] with scales sx float32 [T, 1] -> [T, out] in dtype."""
        # _scaled_mm wants its second operand column-major: qweight.t() of a row-major [out, in].
        y = torch._scaled_mm(xq, self.qweight.t(), scale_a=sx, scale_b=self.scale, out_dtype=dtype)
        if self.bias is not None:
            y = y + self.bias.to(dtype)
        return y

    # The two producers of an FP8 layer's input in a decoder layer, the add + RMSNorm before qkv
    # and gate_up and the silu_mul before down, write it quantized when their fused ops can
    # (kernels/triton/fused.py): the quantize kernel's launch and its read of the rows saved, 3
    # of a layer's 4 (~3 us each at 256 rows of an 8B, ~25 us at a prefill chunk of 8192).

    def forward_add_norm(self, x: torch.Tensor, residual: torch.Tensor | None, norm):
        """self(norm(x + residual)) and the new residual, x + residual (x if None), for the RMSNorm
        `norm` before this layer (model/layers.py norm_then_linear)."""
        ops = norm.fused
        if (hasattr(ops, "add_rms_norm_fp8") and x.dim() == 2 and norm.weight.dtype == x.dtype
                and self.in_features <= MAX_K):
            (xq, sx), residual = ops.add_rms_norm_fp8(x, residual, norm.weight, norm.eps)
            return self.matmul(xq, sx, x.dtype), residual
        from nextok.model.layers import add_norm

        h, residual = add_norm(norm, x, residual)
        return self(h), residual

    def forward_silu_mul(self, gate_up: torch.Tensor, ops) -> torch.Tensor:
        """The down projection of silu(gate) * up, gate_up [T, 2 in], with the fused ops `ops`
        (model/layers.py SwiGLU)."""
        if hasattr(ops, "silu_mul_fp8") and gate_up.dim() == 2 and self.in_features <= MAX_K:
            return self.matmul(*ops.silu_mul_fp8(gate_up), gate_up.dtype)
        return self(ops.silu_mul(gate_up))

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, fp8 e4m3 W8A8"


class FP8(QuantMethod):
    name = "fp8"

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        device = torch.device(device)
        if device.type != "cuda":
            raise NextokError(f"--quantization fp8 needs an NVIDIA GPU with FP8 tensor cores "
                              f"(compute capability 8.9 or newer); this engine runs on {device.type}")
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise NextokError(f"--quantization fp8 needs FP8 tensor cores (compute capability 8.9 "
                              f"or newer); {torch.cuda.get_device_name(device)} is {major}.{minor}")
        if dtype not in (torch.bfloat16, torch.float16):
            raise NextokError(f"--quantization fp8 runs with --dtype bfloat16 or float16, not {dtype}")

    def create_layer(self, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
        out, k = weight.shape
        if out % 16 or k % 16:
            raise NextokError(f"--quantization fp8: a layer of [{out}, {k}] is not in multiples "
                              f"of 16, which FP8 tensor-core matmuls need")
        return FP8Linear(weight, bias)
