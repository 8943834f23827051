"""Decode steps on CUDA replayed from graphs captured once at start, one per padded batch size.

A decode step of an 8B model launches ~10 kernels per layer; eagerly, the CPU cannot issue them
as fast as the GPU runs them (a batch-1 step is ~4 ms of weight reads on an H200 but ~20 ms of
launches). A CUDA graph replays the whole step's launches in one call.

What a graph needs and gets: fixed tensor addresses (static input buffers, filled before each
replay), fixed shapes (the batch is padded up to the next captured size; the block-table width
is the model's whole context, so the Triton decode kernel's grid never changes) and no host
syncs inside the model (the Triton backend and fused ops have none). Padding rows decode token 0
at position 0 into slot 0: block 0 is reserved by the block manager and never holds a sequence.
The logits and the sampler run after the replay, eagerly, on the real rows only.
"""
from __future__ import annotations

import logging
import time

import torch

from nextok.attention.base import AttentionMetadata

log = logging.getLogger("nextok")


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to max_batch (and max_batch itself)."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_batch]
    sizes += list(range(16, max_batch + 1, 16))
    if max_batch and max_batch not in sizes:
        sizes.append(max_batch)
    return sizes


class CudaGraphRunner:
    def __init__(self, model, kv_caches, max_batch: int, max_blocks: int,
                 sliding_window: int | None, device: torch.device):
        self.model, self.kv_caches = model, kv_caches
        self.sizes = capture_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        self.sliding_window = sliding_window
        b, dev = self.max_batch, device
        # Static inputs: every graph reads its first `size` rows of these.
        self.input_ids = torch.zeros(b, dtype=torch.long, device=dev)
        self.positions = torch.zeros(b, dtype=torch.long, device=dev)
        self.slots = torch.zeros(b, dtype=torch.long, device=dev)
        self.tables = torch.zeros(b, max_blocks, dtype=torch.long, device=dev)  # [B, max_blocks]
        self.lens = torch.ones(b, dtype=torch.long, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # size -> hidden [size, hidden], graph-owned

    def _meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(slot_mapping=self.slots[:size], num_decode=size,
                                 decode_block_tables=self.tables[:size],
                                 decode_context_lens=self.lens[:size], decode_mask=None,
                                 prefills=[], sliding_window=self.sliding_window)

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):  # the largest first: the others fit in its pool
            args = (self.input_ids[:size], self.positions[:size], self.kv_caches, self._meta(size))
            self.model(*args)  # warm-up: compiles the Triton kernels for this shape
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self.model(*args)
            self.graphs[size] = graph
        torch.cuda.synchronize()
        log.info("captured %d CUDA graphs (decode batch 1..%d) in %.1f s", len(self.sizes),
                 self.max_batch, time.perf_counter() - start)

    def fits(self, num_tokens: int, num_decode: int, num_prefills: int) -> bool:
        return bool(self.graphs) and num_prefills == 0 and num_decode == num_tokens <= self.max_batch

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
            tables: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """One decode step of n sequences. Inputs (any device): ids, positions, slots, lens [n],
        tables [n, w] with w <= max_blocks. Returns hidden states [n, hidden]."""
        n, w = tables.shape
        size = next(s for s in self.sizes if s >= n)
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slots[:n].copy_(slots, non_blocking=True)
        self.tables[:n, :w].copy_(tables, non_blocking=True)  # columns past w: never read
        self.lens[:n].copy_(lens, non_blocking=True)
        if size > n:  # padding rows: token 0 at position 0 in reserved slot 0
            self.input_ids[n:size].zero_()
            self.positions[n:size].zero_()
            self.slots[n:size].zero_()
            self.tables[n:size, 0].zero_()
            self.lens[n:size].fill_(1)
        self.graphs[size].replay()
        return self.outputs[size][:n]
