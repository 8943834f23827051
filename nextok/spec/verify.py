"""The verify step: the target model's logits at a sequence's last token and at each of its
draft tokens decide which drafts to keep.

Row i of a verify step (i = 0..k) holds the logits after the sequence's tokens and drafts d_1..d_i;
it gives the target's distribution p_i for the token at the place of d_{i+1} (row k: after the
last draft).
- Greedy: keep d_{i+1} while it is argmax p_i, then add the argmax of the first row that
  disagrees (or of row k). The tokens are those greedy decoding yields one step at a time.
- Sampling: the proposers here are deterministic (the draft distribution q_i puts all its mass on
  d_{i+1}), so the speculative-sampling rule (accept with probability min(1, p/q), else sample
  from the normalised max(0, p - q)) becomes: keep d_{i+1} with probability p_i(d_{i+1}); at the
  first rejection sample from p_i with d_{i+1} removed; if all are kept, sample one more token
  from p_k. Each emitted token is then distributed as the target's own sampling would give it.
  A seeded sequence draws its k uniforms and its final sample from its own generator, so a seed
  still reproduces the output.
Requests with penalties, min_tokens or logprobs are not speculated (engine.py): the logits of
all their rows would need per-position state.
"""
from __future__ import annotations

import torch

from nextok.worker.sampler import Sampler, SamplingMetadata, argmax_rows


def verify_drafts(logits: torch.Tensor, items: list, generators: list, sampler: Sampler
                  ) -> dict[int, list[int]]:
    """logits [R, V]: the rows of every verify step, in order; items: (ScheduledSeq, its rows);
    generators: each sequence's generator or None. Returns seq_id -> emitted tokens (the kept
    drafts, then one token of the target's)."""
    params = [it.seq.params for it, rows in items for _ in rows]
    meta = SamplingMetadata.build(params, None, None, [None] * len(params), [[]] * len(params),
                                  logits.shape[-1], logits.device)
    logits = sampler.apply_penalties(logits.float(), meta)  # logit_bias (no history here)
    greedy_tokens = argmax_rows(logits).tolist()
    probs = None
    if not meta.all_greedy:
        temp = meta.temperature.unsqueeze(1)
        probs = torch.softmax(sampler.truncate(logits / temp, meta), dim=-1)  # [R, V]
    out: dict[int, list[int]] = {}
    row0 = 0
    for (item, rows), gen in zip(items, generators):
        k = len(item.draft)
        if item.seq.params.greedy:
            target = greedy_tokens[row0:row0 + k + 1]
            kept = 0
            while kept < k and item.draft[kept] == target[kept]:
                kept += 1
            out[item.seq.seq_id] = item.draft[:kept] + [target[kept]]
        else:
            out[item.seq.seq_id] = _speculative_sample(probs[row0:row0 + k + 1], item.draft, gen)
        row0 += k + 1
    return out


def _speculative_sample(probs: torch.Tensor, draft: list[int], gen) -> list[int]:
    """probs [k + 1, V]: the target's distributions at the k drafts' places and after them."""
    k = len(draft)
    dev = probs.device
    p_draft = probs[torch.arange(k, device=dev), torch.tensor(draft, device=dev)].tolist()
    u = torch.rand(k, generator=gen, device=dev).tolist() if gen is not None else torch.rand(k, device=dev).tolist()
    kept = 0
    while kept < k and u[kept] < p_draft[kept]:
        kept += 1
    p = probs[kept]
    if kept < k:  # rejected: the residual max(0, p - q) with q one-hot on the draft token
        p = p.clone()
        p[draft[kept]] = 0.0
    return draft[:kept] + [_sample(p, gen)]


def _sample(p: torch.Tensor, gen) -> int:
    """One token from the (unnormalised) distribution p [V]: the sampler's exponential race."""
    q = Sampler.exponential_noise(p.unsqueeze(0), [gen])[0]
    return int((p / q).argmax())
