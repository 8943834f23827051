"""A step's scheduled sequences -> the model's input tensors and attention metadata (ModelRunner's
part that lays out a step: token ids, positions, KV slots, decode block tables, prefill chunks,
the rows that sample), on the host first, then copied to the device without a sync.

A mixin of ModelRunner: it reads the runner's device, block_size, config, backend and the last
step's sampled tokens (`_last_sampled`, `_last_rows`), which the runner owns.
"""
from __future__ import annotations

import torch

from nextok.attention.base import AttentionMetadata, PrefillChunk
from nextok.attention.torch_ref import decode_mask
from nextok.engine.scheduler import ScheduledSeq
from nextok.engine.sequence import PENDING


class StepInputs:
    def _prepare(self, items: list[ScheduledSeq]):
        """The step's inputs as host tensors (pinned on CUDA, for asynchronous copies):
        ids, pos, slots [T]; decode tables [num_decode, max blocks] (padded with block 0) and
        lens [num_decode]; plus the prefill chunks, the rows that sample, and each verify
        step's rows (its last token, then its drafts: 1 + len(draft) decode rows)."""
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        sample_items: list[ScheduledSeq] = []
        decode_tables, decode_lens, prefills = [], [], []
        pending: list[tuple[int, int]] = []  # (row of ids, row of the last sampled tokens)
        verify: list[tuple[ScheduledSeq, list[int]]] = []
        for it in items:
            seq, start, n = it.seq, it.start, it.num_new_tokens
            q_start = len(ids)
            ids += seq.token_ids[start:start + n - len(it.draft)] + it.draft
            if ids[-1] == PENDING:  # only a sequence's newest token can be PENDING
                pending.append((len(ids) - 1, self._last_rows[seq.seq_id]))
            pos += range(start, start + n)
            table = seq.block_table
            slots += [table[p // bs] * bs + p % bs for p in range(start, start + n)]
            if n == 1 or it.draft:
                # a verify step's rows are decode queries too: row j attends to positions
                # <= start + j (this step's KV is stored before attention reads it), so verify
                # steps run in the decode kernels and fit the decode CUDA graphs
                decode_tables += [table] * n
                decode_lens += range(start + 1, start + n + 1)
            else:
                nb = -(-(start + n) // bs)
                prefills.append(PrefillChunk(q_start, n, start + n, self._host(table[:nb])))
            if it.draft:
                verify.append((it, list(range(q_start, len(ids)))))
            elif it.samples:
                sample_rows.append(len(ids) - 1)
                sample_items.append(it)
        max_blocks = max((-(-n // bs) for n in decode_lens), default=0)
        padded = [t[:max_blocks] + [0] * (max_blocks - min(len(t), max_blocks)) for t in decode_tables]
        host = {"ids": self._host(ids), "pos": self._host(pos), "slots": self._host(slots),
                "tables": self._host(padded).view(len(padded), max_blocks),
                "lens": self._host(decode_lens)}
        return host, prefills, sample_rows, sample_items, pending, verify

    def chunk_inputs(self, chunks: list[tuple[list[int], int, list[int]]]):
        """The inputs of a model run outside the scheduler's steps (a draft model's, spec/draft.py),
        laid out as `_prepare` lays out a step: chunks of (token ids, position of the first, block
        table). -> device ids [T], positions [T], AttentionMetadata, and the row of each chunk's
        last token, in the order of `chunks` (single-token chunks go first in the rows)."""
        bs = self.block_size
        order = sorted(range(len(chunks)), key=lambda i: len(chunks[i][0]) != 1)
        ids, pos, slots, tables, lens, prefills = [], [], [], [], [], []
        last_rows = [0] * len(chunks)
        for i in order:
            tokens, start, table = chunks[i]
            n = len(tokens)
            q_start = len(ids)
            ids += tokens
            pos += range(start, start + n)
            slots += [table[p // bs] * bs + p % bs for p in range(start, start + n)]
            if n == 1:
                tables.append(table)
                lens.append(start + 1)
            else:
                prefills.append(PrefillChunk(q_start, n, start + n, self._host(table[:-(-(start + n) // bs)])))
            last_rows[i] = len(ids) - 1
        max_blocks = max((-(-n // bs) for n in lens), default=0)
        padded = [t[:max_blocks] + [0] * (max_blocks - min(len(t), max_blocks)) for t in tables]
        host = {"ids": self._host(ids), "pos": self._host(pos), "slots": self._host(slots),
                "tables": self._host(padded).view(len(padded), max_blocks), "lens": self._host(lens)}
        positions, meta = self._device_inputs(host, prefills)
        return host["ids"].to(self.device, non_blocking=True), positions, meta, last_rows

    def _host(self, values: list) -> torch.Tensor:
        t = torch.tensor(values, dtype=torch.long)
        return t.pin_memory() if self.device.type == "cuda" else t

    def _to_device(self, values: list) -> torch.Tensor:
        """A long tensor on the device, copied without a host sync (a pageable copy would wait
        for the GPU to drain, serializing host and device)."""
        return self._host(values).to(self.device, non_blocking=True)

    def _input_ids(self, ids: torch.Tensor, pending: list[tuple[int, int]]) -> torch.Tensor:
        """Host ids [T] (PENDING where unknown) -> device ids with the previous step's tokens."""
        dev = ids.to(self.device, non_blocking=True)
        if pending:
            rows, src = zip(*pending)
            dev.index_copy_(0, self._to_device(list(rows)),
                            self._last_sampled.index_select(0, self._to_device(list(src))))
        return dev

    def _device_inputs(self, host: dict, prefills: list[PrefillChunk]):
        dev = self.device

        def to_dev(t: torch.Tensor) -> torch.Tensor:
            return t.to(dev, non_blocking=True)

        for chunk in prefills:
            chunk.block_table = to_dev(chunk.block_table)
        num_decode = len(host["lens"])
        meta = AttentionMetadata(
            slot_mapping=to_dev(host["slots"]), num_decode=num_decode, decode_block_tables=None,
            decode_context_lens=None, decode_mask=None, prefills=prefills,
            sliding_window=self.config.model.sliding_window)
        if num_decode:
            meta.decode_block_tables = to_dev(host["tables"])
            meta.decode_context_lens = to_dev(host["lens"])
            if self.backend.needs_decode_mask:
                meta.decode_mask = decode_mask(meta.decode_context_lens,
                                               host["tables"].shape[1] * self.block_size,
                                               meta.sliding_window)
        return to_dev(host["pos"]), meta
