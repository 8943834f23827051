"""The fused ops of a decoder layer in plain torch: the oracle the fused kernels are checked against.

Each method is the model's unfused path (model/layers.py, model/llama.py) op for op, so in every
dtype it gives the same bits as running the model with `fused = None`:
- add + RMSNorm: the residual add rounds in the activation dtype; below float32 the statistics are
  taken in float32, and the weight is applied after the cast back (RMSNorm._norm);
- silu * up: silu rounds to the activation dtype, then the product does;
- RoPE: each product, and then their sum, rounds to the activation dtype (RotaryEmbedding.rotate).
The kernels (kernels/cpu_fused.py, kernels/triton/fused.py) implement the same interface.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from nextok.attention import kv_quant
from nextok.model.layers import RotaryEmbedding, rms_norm


class RefFusedOps:
    """The `fused` interface of RMSNorm, Attention and SwiGLU, in torch ops (any device, dtype)."""

    name = "torch"

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(x + residual) * weight, x + residual); without a residual, x is the residual.
        x, residual: [T, D]. The sum is a new tensor (the caller's residual is left alone)."""
        residual = x if residual is None else x + residual
        return rms_norm(residual, weight, eps), residual

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2I] -> silu(gate) * up [T, I]."""
        gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
        return F.silu(gate) * up

    def rope_neox(self, qkv: torch.Tensor, num_heads: int, head_dim: int, cos: torch.Tensor,
                  sin: torch.Tensor) -> None:
        """Rotate heads [0, num_heads) of each row of qkv [T, stride] in place.
        cos, sin: [T, 1, D/2] or [T, D/2] in the activation dtype."""
        t = qkv.shape[0]
        heads = qkv[:, :num_heads * head_dim].view(t, num_heads, head_dim)
        cos, sin = cos.reshape(t, 1, head_dim // 2), sin.reshape(t, 1, head_dim // 2)
        heads.copy_(RotaryEmbedding.rotate(heads, cos, sin))

    def rope_neox_store_kv(self, qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int,
                           head_dim: int, cos: torch.Tensor, sin: torch.Tensor,
                           k_cache: torch.Tensor, v_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        """rope_neox on the q and k heads, then the rotated k heads and the v heads of each row
        into the caches [num_blocks, block_size, KVH, D] at slot_mapping [T] (-1: not stored);
        quantized caches take quantized rows (attention/kv_quant.py)."""
        self.rope_neox(qkv, num_q_heads + num_kv_heads, head_dim, cos, sin)
        store_rotated_kv(qkv, num_q_heads, num_kv_heads, head_dim, k_cache, v_cache, slot_mapping)


def store_rotated_kv(qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """rope_neox_store_kv's store: the k heads and v heads of each row of qkv [T, stride] into
    the caches [num_blocks, block_size, KVH, D] at slot_mapping [T] (-1: not stored); quantized
    caches take quantized rows (attention/kv_quant.py)."""
    t, kv = qkv.shape[0], num_kv_heads * head_dim
    k = qkv[:, num_q_heads * head_dim:][:, :kv].reshape(t, num_kv_heads, head_dim)
    v = qkv[:, num_q_heads * head_dim + kv:][:, :kv].reshape(t, num_kv_heads, head_dim)
    if kv_quant.is_quantized(k_cache):
        kv_quant.store(k_cache, v_cache, k, v, slot_mapping)
        return
    keep = slot_mapping >= 0
    for cache, x in ((k_cache, k), (v_cache, v)):
        cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping[keep], x[keep])
