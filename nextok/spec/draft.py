"""Model-based proposals: a small model guesses the next k tokens greedily.

Two sources of the draft model, one proposer:
- `draft`: a separate smaller model with the target's tokenizer (its own ModelRunner, so its
  own weights, fused ops and attention backend; spec/draft_model.py loads and checks it);
- `self-draft`: the target's first L decoder layers, its final norm and its lm_head, sharing the
  target's weights. `LlamaForCausalLM.forward` runs one layer per KV cache it is given, so
  handing it the draft's L caches runs exactly those L layers, then the norm.

Either way the draft keeps its OWN paged KV pool (a few layers, or a small model: cheap), with
the target's block size and layout, and its own block tables, so the target's pool and
scheduler never see it. Per sequence it remembers how many leading tokens have their draft KV
in the pool (`num_valid`) and which draft tokens it wrote KV for after them (`drafted`). Before
proposing, the drafted tokens the sequence actually took are valid too (KV at position p
depends only on tokens 0..p); the rest are simply overwritten: no rollback.

One `propose_batch` call per engine step, for every speculating sequence together:
1. catch up: one batched forward over each sequence's tokens not yet in the draft pool (the
   first time: the whole prompt, in rounds of at most `max_chunk_tokens`; later: the tokens
   accepted since, and the target's own token); the last token's logits give draft 1;
2. k - 1 batched single-token forwards, each feeding the previous draft (argmax).
Drafts are argmax, never sampled: verify.py treats a draft as a one-hot distribution q, which
an argmax draft is, so greedy and sampled requests both keep the target's exact output law.

The draft pool never makes the engine fail: a sequence it has no room for gets no draft this
step. Its blocks go back when the engine releases the sequence (finished, aborted, preempted).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

log = logging.getLogger("nextok")


@dataclass
class _DraftState:
    block_table: list[int] = field(default_factory=list)
    num_valid: int = 0  # leading tokens of the sequence whose draft KV is in the pool
    drafted: list[int] = field(default_factory=list)  # KV written after them, speculatively


@dataclass
class _Work:
    """One sequence's proposal this step."""
    seq_id: int
    tokens: list[int]  # the sequence's tokens (all known: speculating sequences never lag)
    start: int  # first position fed (the catch-up); len(tokens) - 1 at the latest
    k: int  # drafts to propose
    table: list[int]

    @property
    def n(self) -> int:
        return len(self.tokens)


class DraftModelProposer:
    def __init__(self, name: str, runner, num_layers: int, num_blocks: int, max_model_len: int,
                 max_chunk_tokens: int):
        """runner: the ModelRunner whose model drafts (the target's, for self-draft); num_layers:
        its first layers that run (all of them for a separate draft model)."""
        self.name = name
        self.runner = runner
        self.model = runner.model
        self.num_layers = num_layers
        self.block_size = runner.block_size
        self.num_blocks = num_blocks
        self.kv_caches = runner.new_kv_caches(num_blocks, num_layers)
        # Block 0 pads decode block tables (as in the target's pool): never handed out.
        self.free_blocks = list(range(num_blocks - 1, 0, -1))  # a stack: pop() takes block 1 first
        self.states: dict[int, _DraftState] = {}  # seq_id -> its draft KV
        self.max_model_len = max_model_len
        self.max_chunk_tokens = max_chunk_tokens
        self.num_no_room = 0  # proposals skipped because the draft pool was full
        # On CUDA the draft's single-token steps replay graphs over its own pool, as the
        # target's decode steps do (eagerly, a small model's step is all launch overhead)
        self.graphs = runner.capture_graphs(self.kv_caches)
        k_cache = self.kv_caches[0][0]
        mib = 2 * num_layers * k_cache.numel() * k_cache.element_size() / (1 << 20)
        log.info("%s: %d draft layers, own KV pool of %d blocks (%.0f MiB)", name, num_layers,
                 num_blocks, mib)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def release(self, seq_ids) -> None:
        """The sequences ended or were preempted: their draft KV goes back to the pool."""
        for sid in seq_ids:
            state = self.states.pop(sid, None)
            if state is not None:
                self.free_blocks += reversed(state.block_table)

    def check_integrity(self) -> None:
        """Every block but block 0 is free or held by exactly one sequence (tests)."""
        held = [b for st in self.states.values() for b in st.block_table]
        every = sorted(held + self.free_blocks)
        assert every == list(range(1, self.num_blocks)), "draft blocks leaked or shared"

    # ---- proposing -----------------------------------------------------------------------
    @torch.inference_mode()
    def propose_batch(self, seqs: list, k: int) -> dict[int, list[int]]:
        """seq_id -> up to k greedy draft tokens, for the sequences the pool has room for."""
        work = [w for w in (self._plan(seq, k) for seq in seqs) if w is not None]
        if not work:
            return {}
        first = self._catch_up(work)  # [B]: draft 1 of each
        steps = [(list(range(len(work))), first)]  # (indices into work, their draft i) per step
        for i in range(1, max(w.k for w in work)):
            steps.append(self._decode_step(work, i, *steps[-1]))
        drafts: dict[int, list[int]] = {w.seq_id: [] for w in work}
        for rows, tokens in steps:
            for j, token in zip(rows, tokens.tolist()):
                drafts[work[j].seq_id].append(token)
        for w in work:
            state = self.states[w.seq_id]
            state.num_valid = w.n
            state.drafted = drafts[w.seq_id][:w.k - 1]  # the last draft's KV was never written
        return drafts

    def _plan(self, seq, k: int) -> _Work | None:
        """What to feed for seq, with blocks reserved for it; None if no draft fits."""
        n = seq.num_tokens
        # As the scheduler's _fit_draft: the verify step adds one token of its own, and stays
        # within the context and max_tokens (and positions stay within the RoPE table).
        k = min(k, self.max_model_len - n - 1)
        if seq.params.max_tokens is not None:
            k = min(k, seq.params.max_tokens - seq.num_output_tokens - 1)
        if k < 1:
            return None
        state = self.states.setdefault(seq.seq_id, _DraftState())
        tokens = seq.token_ids
        valid = state.num_valid
        for d in state.drafted:  # drafts the sequence took have valid KV
            if valid < n and tokens[valid] == d:
                valid += 1
            else:
                break
        state.num_valid, state.drafted = valid, []
        # KV for positions [0, n - 1 + k - 1): the tokens, then every draft but the last
        if not self._reserve(state, n + k - 1):
            self.num_no_room += 1
            return None
        # The last token is fed even when its KV is valid: its logits give draft 1.
        return _Work(seq.seq_id, tokens, min(valid, n - 1), k, state.block_table)

    def _reserve(self, state: _DraftState, num_tokens: int) -> bool:
        needed = -(-num_tokens // self.block_size) - len(state.block_table)
        if needed > len(self.free_blocks):
            return False
        for _ in range(needed):
            state.block_table.append(self.free_blocks.pop())
        return True

    def _forward(self, chunks, input_ids: torch.Tensor | None = None):
        """chunks: (token ids, first position, block table) -> (hidden [T, hidden], last rows).
        input_ids: the ids on the device already (decode steps feed the previous drafts)."""
        ids, positions, meta, last_rows = self.runner.chunk_inputs(chunks)
        ids = ids if input_ids is None else input_ids
        n = len(ids)
        if self.graphs is not None and self.graphs.fits(n, meta.num_decode, len(meta.prefills)):
            # (the graph's output buffer: read before the next replay, as every caller does)
            hidden = self.graphs.run(ids, positions, meta.slot_mapping, meta.decode_block_tables,
                                     meta.decode_context_lens)
        else:
            hidden = self.model(ids, positions, self.kv_caches, meta)
        return hidden, last_rows

    def _catch_up(self, work: list[_Work]) -> torch.Tensor:
        """Feeds each sequence's tokens [start, n) (at most max_chunk_tokens per forward);
        returns [B] long: the argmax after each sequence's last token."""
        dev = self.runner.device
        first = torch.zeros(len(work), dtype=torch.long, device=dev)
        fed = [w.start for w in work]
        while True:
            chunks, owners, budget = [], [], self.max_chunk_tokens
            for j, w in enumerate(work):
                m = min(w.n - fed[j], budget)
                if m <= 0:
                    continue
                chunks.append((w.tokens[fed[j]:fed[j] + m], fed[j], w.table))
                owners.append(j)
                fed[j] += m
                budget -= m
            if not chunks:
                return first
            hidden, last_rows = self._forward(chunks)
            done = [(last_rows[c], j) for c, j in enumerate(owners) if fed[j] == work[j].n]
            if done:
                rows, js = zip(*done)
                logits = self.model.compute_logits(hidden.index_select(0, self._long(rows)))
                first.index_copy_(0, self._long(js), logits.argmax(dim=-1))

    def _decode_step(self, work: list[_Work], i: int, prev_rows: list[int], prev: torch.Tensor):
        """Feeds draft i of every sequence that wants more than i drafts, at position n - 1 + i.
        prev: [len(prev_rows)] the drafts i of prev_rows. -> (rows, their drafts i + 1)."""
        keep = [c for c, j in enumerate(prev_rows) if work[j].k > i]
        rows = [prev_rows[c] for c in keep]
        ids = prev if len(keep) == len(prev_rows) else prev.index_select(0, self._long(keep))
        chunks = [([0], work[j].n - 1 + i, work[j].table) for j in rows]  # ids come from `ids`
        hidden, _ = self._forward(chunks, ids)
        return rows, self.model.compute_logits(hidden).argmax(dim=-1)

    def _long(self, values) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.long).to(self.runner.device, non_blocking=True)
