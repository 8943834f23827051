"""Triton attention over the paged KV pool (kernels/triton/attention.py), on CUDA or in Triton's
interpreter. Same semantics as TorchRefBackend, read from the same cache layout.

Per layer call: one KV-store launch; one split-KV decode launch (+ one reduce) for all the
single-token queries; one launch for all the multi-token chunks. The decode path reads context
lengths on the device and has no host syncs, so it can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence

from nextok.attention.base import AttentionBackend, AttentionMetadata
from nextok.kernels.triton.attention import paged_decode, paged_prefill, store_kv


class TritonBackend(AttentionBackend):
    name = "triton"
    needs_decode_mask = False

    def __init__(self):
        # The chunk tensors of the last step's metadata: every layer of a step reuses them.
        self._step: tuple | None = None  # (meta, info [C, 3] int32, tables [C, max_blocks], max_q)

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        # q: [T, H, D]; k, v: [T, KVH, D]; caches: [num_blocks, block_size, KVH, D]
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        nd = meta.num_decode
        if nd:
            paged_decode(q[:nd], k_cache, v_cache, meta.decode_block_tables,
                         meta.decode_context_lens, scale, meta.sliding_window, out[:nd])
        if meta.prefills:
            _, info, tables, max_q = self._chunk_tensors(meta, q.device)
            paged_prefill(q, k_cache, v_cache, info, tables, max_q, scale, meta.sliding_window,
                          out)
        return out

    def _chunk_tensors(self, meta: AttentionMetadata, device: torch.device) -> tuple:
        """info: [C, 3] int32 (q_start, q_len, ctx_len), one host->device copy; tables:
        [C, max_blocks] int64, the chunks' block tables padded with block 0 (device-side)."""
        if self._step is None or self._step[0] is not meta:
            chunks = meta.prefills
            info = torch.tensor([[c.q_start, c.q_len, c.ctx_len] for c in chunks],
                                dtype=torch.int32).to(device, non_blocking=True)
            tables = pad_sequence([c.block_table.to(device) for c in chunks], batch_first=True)
            self._step = (meta, info, tables, max(c.q_len for c in chunks))
        return self._step
