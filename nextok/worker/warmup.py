"""Compile at start the Triton kernels that eager steps launch, so that serving never stops for it.

Triton compiles a kernel once per specialization: each value of a constexpr, and each integer
argument's class (1, a multiple of 16, other), costs a compile of ~1-2 s the first time a step
launches it. CUDA graph capture (worker/cuda_graph.py) compiles the decode steps of the captured
batch sizes; the eager steps (prefill chunks mixed with decode rows, steps past the graphs) met
theirs in the middle of serving. On an H200 a batch of 256 prompts took 5.6 s to its last
first token with an fp8 KV cache against 2.9 s with a bf16 one, whose kernels an earlier run
had left in Triton's disk cache (2026-12-05); a user's request would have waited the same.

The kernels take what changes from step to step (split counts, block-table widths) as values
Triton does not specialize on (kernels/triton/attention.py), so what is left to compile is a
handful of shapes: `warm_up` runs eager steps of a few sizes and mixes through the model, on
block 0 of the pool (reserved: no sequence owns it), then the lm_head on logit_rows() rows.
"""
from __future__ import annotations

import time

import torch

# (decode rows, tokens of a chunk that continues a cached prefix, tokens of a fresh chunk).
# Their totals (2, 3, 5, 8, 9, 12, 16, 17, 24, 32, 40, 48, 80, 92, 144, 156, 272) cover 1..8-row
# kernels, the tl.dot W4A16 row classes (9-16, 17-32, 33-64, 65-128, 129-256 rows; W8A16's are
# 1, 2-16, 17-64 and 65-256) in each integer class of the token count (a multiple of 16 or not:
# Triton compiles each apart), and the larger paths (1 is a decode step: CUDA graphs, or the
# first of these on an engine without them). 40 was added when W4A16 took 17-64 rows to tl.dot:
# the first int4 batch-32 prefill of each fresh H100 process then took 0.6-2.6 s, later ones
# 0.17-0.35 s, the size of a compile (2026-12-06-rows-pairs-h100.md). 272 is past every
# kernel's most rows (w4a16.MAX_ROWS, quant_linear.MAX_ROWS: 256): W4A16's prefill path, which
# dequantizes each weight in a Triton pass (int4_words.dequantize) for cuBLAS. Without it an
# int4 engine's first step of over 256 tokens compiled it: an 8B's first 8 x 128-token prefill
# took 793 ms against 44 ms the next time (H200, 2026-12-07-quant-h200.md).
STEPS = ((2, 0, 0), (1, 2, 0), (1, 2, 2), (2, 3, 3), (1, 4, 4), (2, 5, 5), (2, 7, 7), (3, 7, 7),
         (2, 11, 11), (4, 14, 14), (4, 18, 18), (4, 22, 22), (4, 38, 38), (4, 44, 44), (4, 70, 70),
         (4, 76, 76), (4, 134, 134))
PREFIX = 16  # cached tokens before a continuing chunk, a whole block and more
LOGIT_ROWS = 17  # the lm_head GEMV's 1..8 rows, and the first sizes past it
LOGIT_MAX_ROWS = 256  # past it a quantized lm_head dequantizes (a 1 GB bf16 copy for an 8B's)


def steps_for(max_batched_tokens: int, max_model_len: int) -> list[tuple[int, int, int]]:
    """STEPS, with those that would not fit this engine's budget or context left out, plus a
    single decode row."""
    return [(d, c, f) for d, c, f in ((1, 0, 0),) + STEPS
            if d + c + f <= max_batched_tokens and PREFIX + 3 * d + c <= max_model_len]


def logit_rows(max_batched_tokens: int, max_num_seqs: int, spec_tokens: int) -> list[int]:
    """Row counts the lm_head is warmed at: 1..LOGIT_ROWS and STEPS' totals, up to the most rows
    a step can sample (a row a sequence; 1 + spec_tokens with speculation). The lm_head runs
    eagerly after a decode step's graph, on the step's rows; a quantized one (--quantize-lm-head)
    launches the W4A16 / W8A16 kernels at its own shape, which compile per row class and integer
    class as the layers' do: without these, a batch of 18 or more sequences could compile one
    there (where the lm_head's tile is not a layer's)."""
    most = min(max_batched_tokens, max_num_seqs * (1 + spec_tokens), LOGIT_MAX_ROWS)
    return sorted(r for r in {*range(1, LOGIT_ROWS + 1), *(d + c + f for d, c, f in STEPS)}
                  if r <= most)


@torch.inference_mode()
def warm_up(runner) -> float:
    """Eager steps of steps_for()'s shapes through runner's model and lm_head; seconds taken."""
    start = time.perf_counter()
    bs = runner.block_size
    cfg = runner.config
    for decode, cont, fresh in steps_for(cfg.scheduler.max_num_batched_tokens, runner.max_model_len):
        chunks = []
        for i in range(decode):  # decode rows at different lengths: a split count above 1
            pos = PREFIX + 3 * i
            chunks.append(([0], pos, [0] * (pos // bs + 1)))
        if cont:
            chunks.append(([0] * cont, PREFIX, [0] * -(-(PREFIX + cont) // bs)))
        if fresh:
            chunks.append(([0] * fresh, 0, [0] * -(-fresh // bs)))
        ids, positions, meta, last_rows = runner.chunk_inputs(chunks)
        hidden = runner.model(ids, positions, runner.kv_caches, meta)
        runner.model.compute_logits(hidden.index_select(0, ids.new_tensor(last_rows)))
    spec = cfg.speculative
    rows_list = logit_rows(cfg.scheduler.max_num_batched_tokens, cfg.scheduler.max_num_seqs,
                           spec.num_speculative_tokens if spec.method else 0)
    hidden = torch.zeros(rows_list[-1], cfg.model.hidden_size, dtype=runner.dtype, device=runner.device)
    for rows in rows_list:  # the sampling rows of a step: the lm_head's own tiles
        runner.model.compute_logits(hidden[:rows])
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    return time.perf_counter() - start

