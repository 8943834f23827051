"""The default model with its Q4_1/Q8_0 weights read as blocks at decode (the default on CPU
float32) against the dequantized float32 weights only (--no-gguf-blocks): the weights are the same
numbers, only the summation order differs, so greedy outputs agree (issue 7 asks 18 of 20)."""
from __future__ import annotations

from nextok import SamplingParams
from nextok.kernels.cpu_gguf_linear import BlockOrDenseLinear
from tests.prompts import PROMPTS


def test_blocks_equal_dequantized_greedy(make_llm):
    blocks, dense = make_llm(), make_llm(gguf_blocks=False)
    layers = [m for m in blocks.engine.runner.model.modules() if isinstance(m, BlockOrDenseLinear)]
    assert len(layers) == 30 * 4 + 1  # qkv, o, gate_up, down per layer, and the tied lm_head
    assert not any(isinstance(m, BlockOrDenseLinear) for m in dense.engine.runner.model.modules())
    sp = SamplingParams(temperature=0.0, max_tokens=32)
    same = 0
    for i in range(0, 20, 5):  # decode steps of <= 5 rows: every one takes the block path
        a = blocks.generate(PROMPTS[i:i + 5], sp)
        b = dense.generate(PROMPTS[i:i + 5], sp)
        same += sum(x.outputs[0].token_ids == y.outputs[0].token_ids for x, y in zip(a, b))
    assert same >= 18, f"only {same} of 20 prompts gave the same greedy tokens"


def test_blocks_only_drops_the_float32_copy_and_keeps_the_outputs(make_llm):
    from nextok.bench.latency import weight_bytes
    from nextok.kernels.cpu_gguf_linear import BlockLinear

    only, blocks = make_llm(gguf_dense_copy=False), make_llm()
    model = only.engine.runner.model
    assert sum(isinstance(m, BlockLinear) for m in model.modules()) == 30 * 4 + 1
    assert not any(isinstance(m, BlockOrDenseLinear) for m in model.modules())
    # What stays float32 is the embedding (for lookups) and the norms: ~94 MB of blocks besides.
    assert weight_bytes(model, decode=False) < 0.45 * weight_bytes(blocks.engine.runner.model, decode=False)
    # 6 sequences: decode steps read the blocks; the prefill (> 8 rows) dequantizes them per call.
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    a = only.generate(PROMPTS[:6], sp)
    b = blocks.generate(PROMPTS[:6], sp)
    same = sum(x.outputs[0].token_ids == y.outputs[0].token_ids for x, y in zip(a, b))
    assert same >= 5, f"only {same} of 6 prompts gave the same greedy tokens"
