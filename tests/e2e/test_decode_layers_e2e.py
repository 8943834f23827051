"""Decode steps through every layer in one C call (kernels/cpu_decode.py, csrc/decode_layers.c)
on the default model: the same kernels in the same order as the Python layers, so the same
tokens and the same logprobs, bit for bit; steps it cannot take run the Python layers."""
from __future__ import annotations

import pytest

from nextok import LLM, SamplingParams
from tests.prompts import PROMPTS


def run_both(llm, prompts, batch, max_tokens=12):
    """Greedy outputs (token ids, logprobs) with the C decode layers, then with the Python
    layers, and how many steps the C call took."""
    model = llm.engine.runner.model
    bound = model.decode_layers
    calls = []
    real_run = bound.run
    bound.run = lambda *a: calls.append(a[0].shape[0]) or real_run(*a)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=3)

    def outputs():
        out = []
        for i in range(0, len(prompts), batch):
            out += [r.outputs[0] for r in llm.generate(prompts[i:i + batch], params)]
        return [(o.token_ids, [(lp.logprob, lp.top) for lp in o.logprobs]) for o in out]

    try:
        with_c = outputs()
        model.decode_layers = None
        without = outputs()
    finally:
        model.decode_layers = bound
        bound.run = real_run
    return with_c, without, calls


@pytest.mark.parametrize("dtype, activations, kv", [("float32", "int8", "auto"), ("float32", "float32", "auto"),
                                                   ("bfloat16", "int8", "auto"), ("float32", "float32", "int8"),
                                                   ("bfloat16", "int8", "int8")])
def test_c_decode_layers_equal_the_python_layers(model_path, dtype, activations, kv):
    """kv int8: the C store quantizes each row as the Python layers' store does (the same C
    function on both paths) and the attention reads the int8 rows in both."""
    from nextok.kernels.cpu_gguf_linear import _rows16

    if dtype == "bfloat16" and _rows16() is None:
        pytest.skip("no regrouped int8 kernel here: a bfloat16 model's blocks convert x to float32")
    llm = LLM(model=model_path, dtype=dtype, gguf_activations=activations, kv_cache_memory=64 << 20,
              enable_prefix_caching=False, kv_cache_dtype=kv)  # both runs prefill alike
    assert llm.engine.runner.model.decode_layers is not None
    if kv == "int8" and llm.engine.runner.model.decode_layers.fns_int8 is None:
        pytest.skip("no int8-cache attention kernel on this CPU")
    with_c, without, calls = run_both(llm, PROMPTS[:6], batch=3)
    assert with_c == without
    # every decode step of 1-3 rows went through the C call: 11 per prompt batch after the prefill
    assert len(calls) == 2 * 11 and set(calls) <= {1, 2, 3}


def test_steps_past_the_row_limit_run_the_python_layers(model_path):
    """float32 blocks take at most 8 rows per step: a step of 10 decoding sequences runs the
    Python layers (and their dense weights), and still gives the same outputs."""
    # (dtype pinned: on a CPU with bfloat16 instructions the model's own dtype is bfloat16, whose
    # blocks take no float32 activations)
    llm = LLM(model=model_path, dtype="float32", gguf_activations="float32", kv_cache_memory=64 << 20,
              enable_prefix_caching=False)
    assert llm.engine.runner.model.decode_layers.max_rows == 8
    with_c, without, calls = run_both(llm, PROMPTS[:10], batch=10, max_tokens=4)
    assert with_c == without
    assert calls == []


@pytest.mark.parametrize("kwargs", [{"dtype": "bfloat16", "gguf_activations": "float32"},
                                    {"gguf_blocks": False}, {"kv_cache_dtype": "fp8"}])
def test_models_without_the_c_path_keep_the_python_layers(model_path, kwargs):
    llm = LLM(model=model_path, kv_cache_memory=64 << 20, **kwargs)
    model = llm.engine.runner.model
    if model.decode_layers is not None:  # an fp8 cache: bound, but never taken
        assert kwargs == {"kv_cache_dtype": "fp8"}
        calls = []
        real_run = model.decode_layers.run
        model.decode_layers.run = lambda *a: calls.append(1) or real_run(*a)
        llm.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=4))
        assert calls == []


def test_a_slot_past_the_cache_is_an_index_error_and_writes_nothing(model_path):
    """As the Python layers' KV store: every slot is checked before any row is written."""
    import torch

    from nextok.attention.base import AttentionMetadata

    llm = LLM(model=model_path, gguf_activations="int8", kv_cache_memory=16 << 20)
    runner = llm.engine.runner
    k_cache = runner.kv_caches[0][0]
    rows = k_cache.shape[0] * k_cache.shape[1]
    before = k_cache.clone()
    meta = AttentionMetadata(slot_mapping=torch.tensor([3, rows + 5]), num_decode=2,
                             decode_block_tables=torch.zeros(2, 1, dtype=torch.int64),
                             decode_context_lens=torch.ones(2, dtype=torch.int64), decode_mask=None,
                             prefills=[])
    assert runner.model.decode_layers.takes(meta, 2, runner.kv_caches)
    with torch.no_grad(), pytest.raises(IndexError, match=f"past the cache's {rows} rows"):
        runner.model(torch.tensor([1, 2]), torch.tensor([0, 0]), runner.kv_caches, meta)
    assert torch.equal(k_cache, before)
