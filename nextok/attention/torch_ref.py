"""Reference attention over the paged KV pool: gather pages through the block table + SDPA.

It is the CPU path and the oracle the Triton kernels are checked against.
- Single-token queries (decode) of the whole batch run as ONE batched SDPA call: keys are
  gathered into [B, max_blocks * block_size, KVH, D] and padding is masked.
- Multi-token chunks (prefill, chunked prefill over a cached prefix) run one SDPA call each,
  with a causal mask offset by the cached prefix.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from nextok.attention import kv_quant
from nextok.attention.base import AttentionBackend, AttentionMetadata, PrefillChunk


class TorchRefBackend(AttentionBackend):
    """`decode_kernel`: the C paged-decode entry points (kernels/cpu_attention.py) for CPU
    decode on float32, bfloat16 or int8 caches (the runner binds them only where they take
    its caches), bound once at construction; None keeps everything on torch ops."""

    name = "torch"

    def __init__(self, decode_kernel=None):
        self.decode_kernel = decode_kernel
        self.needs_decode_mask = decode_kernel is None
        if decode_kernel is not None:
            from nextok.kernels.cpu_attention import paged_decode

            self._paged_decode = paged_decode

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                kv_stored: bool = False):
        # q: [T, H, D]; k, v: [T, KVH, D]; caches: [num_blocks, block_size, KVH, D]
        quantized = kv_quant.is_quantized(k_cache)
        if kv_stored:
            pass
        elif quantized:  # int8 rows with their scale, or fp8 rows (attention/kv_quant.py)
            kv_quant.store(k_cache, v_cache, k, v, meta.slot_mapping)
        else:
            num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
            k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, meta.slot_mapping, k)
            v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        nd = meta.num_decode
        if nd and self.decode_kernel is not None and (not quantized or k_cache.dtype == torch.int8):
            out[:nd] = self._paged_decode(self.decode_kernel, q[:nd], k_cache, v_cache,
                                          meta.decode_block_tables, meta.decode_context_lens,
                                          scale, meta.sliding_window)
        elif nd:
            out[:nd] = _decode(q[:nd], k_cache, v_cache, meta, scale)
        for chunk in meta.prefills:
            sl = slice(chunk.q_start, chunk.q_start + chunk.q_len)
            out[sl] = _prefill(q[sl], k_cache, v_cache, chunk, meta.sliding_window, scale)
        return out


def _gather(cache: torch.Tensor, block_table: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # cache: [N, bs, KVH, row]; block_table: [..., nb] -> [..., nb * bs, KVH, D] in dtype
    # (row: D, or D + 4 for an int8 cache's rows with their scale, attention/kv_quant.py)
    # index_select of whole blocks as rows is a row memcpy, ~2.5x faster than cache[block_table].
    n, bs, kvh, d = cache.shape
    quantized = kv_quant.is_quantized(cache)
    src = cache.view(torch.uint8) if quantized else cache  # bytes: no float8 index_select on CPU
    rows = src.view(n, bs * kvh * d).index_select(0, block_table.reshape(-1))
    rows = rows.view(*block_table.shape[:-1], block_table.shape[-1] * bs, kvh, d)
    return kv_quant.dequantize_rows(rows.view(cache.dtype), dtype) if quantized else rows


def _decode(q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    # q: [B, H, D]. Query heads sharing a KV head become SDPA's "query length" axis, so the
    # grouped heads need no repeated K/V: q -> [B, KVH, G, D], keys [B, KVH, L, D].
    b, h, d = q.shape
    kvh = k_cache.shape[2]
    keys = _gather(k_cache, meta.decode_block_tables, q.dtype).transpose(1, 2)  # [B, KVH, L, D]
    vals = _gather(v_cache, meta.decode_block_tables, q.dtype).transpose(1, 2)
    qg = q.view(b, kvh, h // kvh, d)
    out = F.scaled_dot_product_attention(qg, keys, vals, attn_mask=meta.decode_mask, scale=scale)
    return out.reshape(b, h, d)


def _prefill(q, k_cache, v_cache, chunk: PrefillChunk, window: int | None, scale: float):
    # q: [n, H, D] for positions [ctx_len - n, ctx_len)
    n, h, d = q.shape
    kvh = k_cache.shape[2]
    keys = _gather(k_cache, chunk.block_table, q.dtype)[:chunk.ctx_len].transpose(0, 1)  # [KVH, L, D]
    vals = _gather(v_cache, chunk.block_table, q.dtype)[:chunk.ctx_len].transpose(0, 1)
    qh = q.transpose(0, 1)  # [H, n, D]
    if chunk.ctx_len == n and window is None:
        out = F.scaled_dot_product_attention(qh.unsqueeze(0), keys.unsqueeze(0), vals.unsqueeze(0),
                                             is_causal=True, scale=scale, enable_gqa=kvh != h)
    else:
        mask = causal_mask(n, chunk.ctx_len, window, q.device)
        out = F.scaled_dot_product_attention(qh.unsqueeze(0), keys.unsqueeze(0), vals.unsqueeze(0),
                                             attn_mask=mask, scale=scale, enable_gqa=kvh != h)
    return out[0].transpose(0, 1)


def causal_mask(q_len: int, ctx_len: int, window: int | None, device) -> torch.Tensor:
    """[q_len, ctx_len] bool: query i (at position ctx_len - q_len + i) sees key j iff j <= pos
    and, with a sliding window W, j > pos - W."""
    pos = torch.arange(ctx_len - q_len, ctx_len, device=device)[:, None]
    key = torch.arange(ctx_len, device=device)[None, :]
    mask = key <= pos
    if window is not None:
        mask &= key > pos - window
    return mask


def decode_mask(context_lens: torch.Tensor, max_len: int, window: int | None) -> torch.Tensor:
    """[B, 1, 1, max_len] bool for single-token queries at position context_len - 1."""
    key = torch.arange(max_len, device=context_lens.device)[None, :]
    mask = key < context_lens[:, None]
    if window is not None:
        mask &= key > (context_lens[:, None] - 1 - window)
    return mask[:, None, None, :]
