"""What every attention backend receives for one step, and the interface it implements.

The paged KV layout is the same for every backend: per layer, K and V each of shape
[num_blocks, block_size, num_kv_heads, head_dim]. Token t of a sequence lives in slot
`block_table[t // block_size] * block_size + t % block_size` of the flattened pool.

The worker orders a step's tokens as: all single-token queries first (decode, or a 1-token
prefill chunk; they share one batched kernel), then the multi-token chunks (prefill), each
contiguous.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PrefillChunk:
    q_start: int  # index of the chunk's first token in the step's flattened token list
    q_len: int  # tokens computed now
    ctx_len: int  # keys attended by the last token: cached prefix + this chunk
    block_table: torch.Tensor  # [ceil(ctx_len / block_size)] int64


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: pool slot of each token's K/V
    num_decode: int  # the first `num_decode` tokens are single-token queries
    decode_block_tables: torch.Tensor | None  # [num_decode, max_blocks] int64, padded with block 0
    decode_context_lens: torch.Tensor | None  # [num_decode] int64, keys per query (incl. itself)
    decode_mask: torch.Tensor | None  # [num_decode, 1, 1, max_blocks * block_size] bool, True = attend
    prefills: list[PrefillChunk]
    sliding_window: int | None = None


class AttentionBackend:
    """Reads and writes the paged KV pool. Chosen once at start (torch reference on CPU)."""

    name = "base"

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int,
                       head_dim: int) -> tuple[int, ...]:
        return (num_blocks, block_size, num_kv_heads, head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, kv_stored: bool = False) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, KVH, D] (new tokens). Stores k, v at meta.slot_mapping unless
        the caller already has (kv_stored: the fused RoPE kernel did), returns [T, H, D]."""
        raise NotImplementedError
