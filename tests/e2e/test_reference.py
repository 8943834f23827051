"""The engine against `transformers` loading the same GGUF, in float32.

- Prefill: every position's logits match to ABS_TOL.
- Greedy: 24 prompts x 64 new tokens match token for token, except where the reference's top-2
  logit gap is under NEAR_TIE at the first differing step (a tie summation order can flip).
"""
from __future__ import annotations


import pytest
import torch

from nextok import SamplingParams
from nextok.attention.base import AttentionMetadata, PrefillChunk
from tests.prompts import PROMPTS

ABS_TOL = 2e-3  # fp32 logits; differences come only from summation order
NEAR_TIE = 1e-3
NEW_TOKENS = 64


def _engine_logits(llm, ids: list[int]) -> torch.Tensor:
    """All-position logits [T, V] from one prefill through the engine's model and KV pool."""
    runner = llm.engine.runner
    bs = runner.block_size
    nb = -(-len(ids) // bs)
    table = list(range(1, nb + 1))  # scratch blocks; the engine is idle during this test
    slots = [table[p // bs] * bs + p % bs for p in range(len(ids))]
    meta = AttentionMetadata(slot_mapping=torch.tensor(slots), num_decode=0,
                             decode_block_tables=None, decode_context_lens=None, decode_mask=None,
                             prefills=[PrefillChunk(0, len(ids), len(ids), torch.tensor(table))])
    with torch.inference_mode():
        hidden = runner.model(torch.tensor(ids), torch.arange(len(ids)), runner.kv_caches, meta)
        return runner.model.compute_logits(hidden).float()


def _hf_greedy(model, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy tokens of every prompt, in one left-padded batch (24 prompts one at a time took
    ~70 s of the suite), and the logits [B, steps, V] each was chosen from. Nothing stops at
    EOS, as with ignore_eos."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # [B, W]
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # each prompt's positions start at 0
    tokens, logits_seen = [], []
    with torch.inference_mode():
        out = model(ids, attention_mask=mask, position_ids=pos, use_cache=True)
        for _ in range(steps):
            logits = out.logits[:, -1].float()  # [B, V]
            tok = logits.argmax(-1)
            tokens.append(tok)
            logits_seen.append(logits)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            pos = pos[:, -1:] + 1
            out = model(tok[:, None], attention_mask=mask, position_ids=pos,
                        past_key_values=out.past_key_values, use_cache=True)
    return torch.stack(tokens, 1).tolist(), torch.stack(logits_seen, 1)


def test_prefill_logits_match(llm_f32, hf_model):
    tok = llm_f32.get_tokenizer()
    for prompt in PROMPTS[:6]:
        ids = tok.encode(prompt)
        ours = _engine_logits(llm_f32, ids)
        with torch.inference_mode():
            ref = hf_model(torch.tensor([ids])).logits[0].float()
        assert ours.shape == ref.shape
        diff = (ours - ref).abs().max().item()
        assert diff < ABS_TOL, f"prefill logits differ by {diff} on {prompt!r}"


def test_greedy_matches_transformers(llm_f32, hf_model):
    tok = llm_f32.get_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm_f32.generate(prompts, params)
    refs, ref_logits = _hf_greedy(hf_model, prompts, NEW_TOKENS)
    exact, near_ties = 0, []
    for prompt, ref, logits, out in zip(PROMPTS, refs, ref_logits, outs):
        ours = out.outputs[0].token_ids
        if ours == ref:
            exact += 1
            continue
        step = next(i for i, (a, b) in enumerate(zip(ours, ref)) if a != b)
        top2 = logits[step].topk(2).values
        gap = (top2[0] - top2[1]).item()
        assert gap < NEAR_TIE, (
            f"{prompt!r}: differs at step {step} ({ours[step]} vs {ref[step]}), top-2 gap {gap}")
        near_ties.append((prompt, step, gap))
    assert exact >= len(PROMPTS) - 4, f"only {exact} exact; near ties: {near_ties}"
