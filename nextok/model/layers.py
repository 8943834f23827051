"""Building blocks of the Llama family: RMSNorm, rotary embedding, SwiGLU.

Every op works on flattened tokens: x is [T, hidden], T = tokens of the whole step.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from nextok.config import ModelConfig
from nextok.errors import ModelLoadError


class RMSNorm(nn.Module):
    """rms_norm(x) * weight; given the residual stream too, it first adds x into it (as vLLM's
    layers do, so the add and the norm can be one kernel) and returns (normed, new residual)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps
        self.fused = None  # fused elementwise ops (kernels/select.py), bound by the model runner

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        # x, residual: [T, hidden]
        if self.fused is not None:
            out, residual_out = self.fused.add_rms_norm(x, residual, self.weight, self.eps)
            return out if residual is None else (out, residual_out)
        if residual is None:
            return self._norm(x)
        residual = x + residual
        return self._norm(residual), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(x) * weight, x: [T, D]. torch's fused rms_norm (one pass instead of six ops: 2.4x
    faster at 2048 tokens on CPU). Below float32 the statistics are taken in float32 and the
    weight applied after the cast back, exactly as the reference implementations do."""
    if x.dtype == torch.float32:
        return nn.functional.rms_norm(x, weight.shape, weight, eps)
    normed = nn.functional.rms_norm(x.float(), weight.shape, None, eps)
    return weight * normed.to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim / 2] and the attention scaling factor, per rope_scaling."""
    dim = config.head_dim
    base = config.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / float(scaling["factor"]), 1.0
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling), 1.0
    raise ModelLoadError(f"unsupported rope_scaling type {kind!r} (supported: default, linear, llama3)")


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    # Llama 3.1: leave high frequencies alone, divide low ones by `factor`, blend in between.
    factor = float(s["factor"])
    low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old_len = float(s.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Neox-style (rotate_half) RoPE from a cos/sin table computed once for all positions.

    The model looks up cos/sin once per step (`table`), and every layer rotates its q and k
    heads together in one call (`rotate`), on a [T, heads, D] view of the fused qkv output.
    """

    def __init__(self, config: ModelConfig, max_positions: int):
        super().__init__()
        inv_freq, attn_scale = rope_inv_freq(config)
        pos = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq)  # [P, D/2]: both halves of a head share frequencies
        # Plain attributes, not buffers: the table stays float32 when the model is cast to bf16.
        self.cos = freqs.cos() * attn_scale
        self.sin = freqs.sin() * attn_scale

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [T] -> cos, sin: [T, 1, D/2]
        if self.cos.device != positions.device:
            self.cos, self.sin = self.cos.to(positions.device), self.sin.to(positions.device)
        return (self.cos[positions].unsqueeze(1).to(dtype),
                self.sin[positions].unsqueeze(1).to(dtype))

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [T, heads, D] -> rotated copy; (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def add_norm(norm: RMSNorm, x: torch.Tensor,
             residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual), x: [T, hidden]; without a residual (the first layer)
    x itself is the residual."""
    if residual is None:
        return norm(x), x
    return norm(x, residual)


def norm_then_linear(norm: RMSNorm, linear: nn.Module, x: torch.Tensor,
                     residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(norm(x + residual)), x + residual) (add_norm). A layer with `forward_add_norm`
    (quant/fp8.py) has the norm's kernel write its input as it takes it (FP8: quantized)."""
    if norm.fused is not None and hasattr(linear, "forward_add_norm"):
        return linear.forward_add_norm(x, residual, norm)
    h, residual = add_norm(norm, x, residual)
    return linear(h), residual


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.fused = None  # fused elementwise ops (kernels/select.py), bound by the model runner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.gate_up_proj(x))

    def down(self, gate_up: torch.Tensor) -> torch.Tensor:
        # gate_up: [T, 2 * I] -> down(silu(gate) * up) [T, hidden]
        if self.fused is not None:
            # a down projection that takes gate_up itself saves the silu_mul launch (quant/int4.py)
            # or its output's round trip (quant/fp8.py)
            down = getattr(self.down_proj, "forward_silu_mul", None)
            if down is not None:
                return down(gate_up, self.fused)
            return self.down_proj(self.fused.silu_mul(gate_up))
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)


class FusedLinear(nn.Module):
    """A dense linear layer that multiplies through its fused ops' `linear` (on CUDA: a Triton
    GEMV for decode-sized steps, kernels/triton/gemv.py). It holds the very Parameters of the
    nn.Linear it replaces, under the same names. x: [T, in] -> [T, out]."""

    def __init__(self, linear: nn.Linear, fused):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is None:
            return nn.functional.linear(x, self.weight, self.bias)
        return self.fused.linear(x, self.weight, self.bias)
