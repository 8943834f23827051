"""INT8 weight-only quantization at load (`--quantization int8`), from any float checkpoint.

Symmetric, one scale per output channel: scale[o] = max_i |W[o, i]| / 127, q = round(W / scale),
in [-127, 127]; W ~ scale[o] * q[o, i]. The scale is rounded to float16 first, so that every path
below holds exactly the same dequantized weights.

- CPU, float32, in_features a multiple of 32: the weights are laid out as GGUF Q8_0 blocks
  (a float16 scale and 32 int8 values) with the channel's scale in every block of its row, and
  run through the GGUF block kernels (kernels/cpu_gguf_linear.py): read directly by steps of up
  to 8 rows, dequantized into a scratch matrix for bigger ones. 34 bytes per 32 weights.
- Elsewhere (CUDA, odd shapes): int8 [out, in] and the scales. On CUDA steps of up to
  w8a16_tiles.kernel_rows() rows run the Triton W8A16 kernel (kernels/triton/quant_linear.py):
  y = (x @ q.T) * scale with the product accumulated in float32. Bigger steps, and other
  devices, take (x @ q.T) * scale in x's dtype, where integers up to 127 are exact; that
  converts the weight on every call.

Int8Linear also holds GGUF Q8_0 / Q5_* / Q6_K weights on CUDA, with a scale (and a min) per
group of 16 or 32 columns (quant/gguf_cuda.py); their bigger steps dequantize the weight.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from nextok.quant.base import QuantMethod, bias_parameter, scales_in_order, triton_gemv_rows

Q8_0 = 8  # ggml's type id for Q8_0 blocks
CHUNK = 1 << 24  # weights a group-scaled Int8Linear dequantizes at a time (64 MB of float32)
# Group scales in group order (Int8Linear.set_scale_order): a tile of W then reads one run of its
# rows' scales a group, not a short run a row. w8a16_tiles.GROUP_TILES were swept in this order
# (H100, 2026-12-07-gguf-h100.md); the tile before took 0.70-1.41x its row-order time in it.
GROUP_MAJOR = True


@functools.cache
def _kernel_rows() -> int:
    """Rows up to which a CUDA step runs the W8A16 kernel (0 without triton)."""
    if not triton_gemv_rows():
        return 0
    from nextok.kernels.triton.w8a16_tiles import kernel_rows

    return kernel_rows()


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (q int8 [out, in], scale float16 [out]); all-zero rows get scale 0."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127.0).to(torch.float16)
    s = scale.float().unsqueeze(1)
    q = torch.where(s > 0, torch.round(w / torch.where(s > 0, s, 1.0)), 0.0).clamp_(-127, 127)
    return q.to(torch.int8), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float().unsqueeze(1)


def q8_0_blocks(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(q [out, in], scale [out]) -> Q8_0 blocks [out, in / 32 * 34] uint8, the scale repeated."""
    out, k = q.shape
    nb = k // 32
    d = scale.contiguous().view(torch.uint8).view(out, 1, 2).expand(out, nb, 2)
    return torch.cat([d, q.contiguous().view(torch.uint8).view(out, nb, 32)], dim=2).reshape(out, nb * 34)


class Int8Linear(nn.Module):
    """y = x @ W.T + bias, W = scale * q: q int8 [out, in], scale float16 [out] (one per row), or
    scale (and mins) float16 [out, in / G] for groups of G = 16 or 32 columns, W = scale * q +
    mins (GGUF Q8_0, Q5_*, Q6_K on CUDA: quant/gguf_cuda.py). x: [T, in] -> [T, out], x's dtype."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 mins: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.group = self.in_features // scale.shape[1] if scale.dim() == 2 else 0
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)
        self.register_buffer("mins", mins)
        self.bias = bias_parameter(bias)
        if self.group and GROUP_MAJOR:
            self.set_scale_order(True)

    def set_scale_order(self, group_major: bool) -> None:
        """Group scales (and mins) [out, groups] in row order (False) or group order (True: a
        view of a [groups, out] tensor, base.scales_in_order), which the kernel reads through
        their strides."""
        for name in ("scale", "mins"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, scales_in_order(t, group_major))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.shape[0] <= _kernel_rows() and x.dtype in (torch.bfloat16, torch.float16):
            from nextok.kernels.triton.quant_linear import w8a16

            return w8a16(x if x.stride(-1) == 1 else x.contiguous(), self.qweight, self.scale,
                         None if self.bias is None else self.bias.to(x.dtype), self.mins)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if not self.group:  # integers up to 127 are exact in x's dtype: the scale after the sum
            y = nn.functional.linear(x, self.qweight.to(x.dtype)) * self.scale.to(x.dtype)
            return y if bias is None else y + bias
        return nn.functional.linear(x, self.dequantize(x.dtype), bias)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W [out, in] in dtype: computed in float32 and rounded once, in chunks of rows that
        bound the float32 temporary to CHUNK weights."""
        if not self.group:
            return dequantize(self.qweight, self.scale).to(dtype)
        out = torch.empty(self.out_features, self.in_features, dtype=dtype, device=self.qweight.device)
        step = max(1, CHUNK // self.in_features)
        for a in range(0, self.out_features, step):
            b = min(self.out_features, a + step)
            w = self.qweight[a:b].view(b - a, -1, self.group).float() * self.scale[a:b].float().unsqueeze(2)
            if self.mins is not None:
                w += self.mins[a:b].float().unsqueeze(2)
            out[a:b] = w.view(b - a, self.in_features)
        return out

    def extra_repr(self) -> str:
        kind = "per channel"
        if self.group:
            kind = f"groups of {self.group}" + (" with mins" if self.mins is not None else "")
        return f"in={self.in_features}, out={self.out_features}, int8 {kind}"


class Int8WeightOnly(QuantMethod):
    name = "int8"

    def create_layer(self, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
        q, scale = quantize_per_channel(weight)
        out, k = q.shape
        if weight.device.type == "cpu" and weight.dtype == torch.float32 and k % 32 == 0:
            from nextok.kernels.cpu_gguf_linear import BlockLinear, GGUFBlockLinear, load_gguf_matmul

            if load_gguf_matmul() is not None:
                # weight-only: the activations stay float32
                return BlockLinear(GGUFBlockLinear(q8_0_blocks(q, scale), Q8_0, out, k, bias=bias,
                                                   activations="float32"))
        return Int8Linear(q.to(weight.device), scale.to(weight.device), bias)
