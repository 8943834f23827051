"""Medusa proposals: the top-1 token of each Medusa head (spec/medusa_heads.py), read from the
target's own final hidden state at the sequence's last computed position.

After every step the runner hands over, for each sequence that got new tokens, the hidden state
of the row whose logits gave its newest token (a verify step: the row of its last accepted
token; a prefill: the prompt's last position). From h_t the base head gave token t + 1 (the
newest), and head i guesses t + 2 + i: the drafts that follow it. Drafts are argmaxes
(deterministic), so the verifier's one-hot draft distribution (spec/verify.py) stays exact for
greedy and sampled requests alike.
"""
from __future__ import annotations

import logging

import torch

from nextok.spec.medusa_heads import load_heads

log = logging.getLogger("nextok")


class MedusaProposer:
    name = "medusa"
    needs_hidden_states = True  # the runner returns ModelOutput.hidden (worker/step_output.py)

    def __init__(self, heads, model):
        self.heads = heads
        self.model = model  # the target: its compute_logits projects "shared" heads
        # seq_id -> (position of the row, its hidden state [hidden]) of the last step's sequences
        self._hidden: dict[int, tuple[int, torch.Tensor]] = {}

    @classmethod
    def load(cls, path: str, model) -> "MedusaProposer":
        heads = load_heads(path, model)
        log.info("medusa: %d heads (%s projection) from %s; drafts per step: the heads' count or "
                 "--num-speculative-tokens, whichever is smaller", heads.num_heads, heads.projection, path)
        return cls(heads, model)

    def observe(self, hidden) -> None:
        """hidden: a step's LastHidden (seq ids, positions, rows [N, hidden]). Replaces the last
        step's: a sequence decodes next only if it got a token now (one that sat this step out
        loses a draft, not correctness), and rows of ended sequences are never kept."""
        self._hidden = {sid: (pos, hidden.rows[i])
                        for i, (sid, pos) in enumerate(zip(hidden.seq_ids, hidden.positions))}

    @torch.inference_mode()
    def propose_batch(self, seqs: list, k: int) -> dict[int, list[int]]:
        """Up to k drafts for each sequence (whose next step decodes its newest token): the heads'
        argmaxes from the hidden state of the token before it; left out if that state is not known
        (the sequence sat out the last step)."""
        rows, which = [], []
        for i, seq in enumerate(seqs):
            entry = self._hidden.get(seq.seq_id)
            if entry is not None and entry[0] == seq.num_tokens - 2:  # newest token came from it
                rows.append(entry[1])
                which.append(i)
        k = min(k, self.heads.num_heads)
        if not rows or k < 1:
            return {}
        h = torch.stack(rows)  # [N, hidden]
        logits = self.heads.logits(h, self.model.compute_logits, k)  # [N, k, vocab]
        tokens = logits.argmax(dim=-1).tolist()  # [N, k]: the one host sync
        return {seqs[i].seq_id: toks for i, toks in zip(which, tokens)}
