"""The whole engine with `--attention-backend triton` (in Triton's interpreter here, on CUDA on
the GPU machine) gives the torch reference backend's greedy tokens: decode batches, prefill
chunks over a cached prefix (chunked prefill), and prefix-cache hits, on a small random model."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("triton")

from nextok import LLM, SamplingParams  # noqa: E402

CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "tie_word_embeddings": True, "vocab_size": 49152}


@pytest.fixture(scope="module")
def engines(tmp_path_factory, tokenizer_path):
    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text(json.dumps(CONFIG))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    common = dict(model=str(d), load_format="dummy", tokenizer=tokenizer_path, dtype="float32",
                  device=device, max_num_batched_tokens=24, num_kv_blocks=64)
    return LLM(attention_backend="triton", **common), LLM(attention_backend="torch", **common)


def test_triton_engine_equals_torch_engine(engines):
    triton_llm, torch_llm = engines
    assert triton_llm.engine.runner.backend.name == "triton"
    gen = torch.Generator().manual_seed(0)
    shared = torch.randint(100, 40000, (20,), generator=gen).tolist()
    prompts = [torch.randint(100, 40000, (n,), generator=gen).tolist() for n in (5, 37)]
    prompts += [shared + [7, 8, 9], shared + [10, 11]]  # the second hits the first's cached blocks
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in triton_llm.generate(prompts, params)]
    ref = [o.outputs[0].token_ids for o in torch_llm.generate(prompts, params)]
    assert ours == ref
    again = [o.outputs[0].token_ids for o in triton_llm.generate(prompts[2:], params)]
    assert again == ref[2:]  # now served from the prefix cache


def test_fused_rope_and_kv_store_keep_the_tokens(engines):
    """The CUDA binding: Triton's fused ops, whose RoPE kernel also writes k and v to the cache
    (the backend then skips its own store), on the same fresh prompts as the torch engine. (The
    GEMV half of the binding needs plain nn.Linear layers, which the CPU engine packs:
    tests/model/test_fused_decode_layers.py covers it.)"""
    from nextok.kernels.triton.fused import TritonFusedOps

    triton_llm, torch_llm = engines
    model = triton_llm.engine.runner.model
    before = model.layers[0].self_attn.fused
    model.set_fused_ops(TritonFusedOps())
    try:
        assert model.layers[0].self_attn.store_kv_in_rope
        gen = torch.Generator().manual_seed(1)
        prompts = [torch.randint(100, 40000, (n,), generator=gen).tolist() for n in (3, 30, 17)]
        params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
        ours = [o.outputs[0].token_ids for o in triton_llm.generate(prompts, params)]
        ref = [o.outputs[0].token_ids for o in torch_llm.generate(prompts, params)]
        assert ours == ref
    finally:
        model.set_fused_ops(before)
    assert model.layers[0].self_attn.store_kv_in_rope == hasattr(before, "rope_neox_store_kv")


@pytest.mark.parametrize("kind,dtype", [("int8", torch.int8), ("fp8", torch.float8_e4m3fn)])
def test_quantized_kv_cache_engine(tokenizer_path, tmp_path, kind, dtype):
    """--kv-cache-dtype int8 / fp8 through the Triton kernels gives the torch backend's tokens.
    (Fresh prompts go to SDPA on the step's own float k and v in the Triton backend, and read
    back the quantized rows in the torch one: the same tokens here, not the same bits.) fp8 runs
    with Triton's fused ops, as on CUDA: the RoPE kernel stores the e4m3 rows."""
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    common = dict(model=str(tmp_path), load_format="dummy", tokenizer=tokenizer_path, dtype="float32",
                  device=device, max_num_batched_tokens=24, num_kv_blocks=64, kv_cache_dtype=kind)
    tri, ref = LLM(attention_backend="triton", **common), LLM(attention_backend="torch", **common)
    assert tri.engine.runner.backend.name == "triton"
    assert tri.engine.runner.kv_caches[0][0].dtype == dtype
    if kind == "fp8":
        from nextok.kernels.triton.fused import TritonFusedOps

        tri.engine.runner.model.set_fused_ops(TritonFusedOps())
        assert tri.engine.runner.model.layers[0].self_attn.store_kv_in_rope
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(100, 40000, (n,), generator=gen).tolist() for n in (4, 30, 11)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    assert ([o.outputs[0].token_ids for o in tri.generate(prompts, params)]
            == [o.outputs[0].token_ids for o in ref.generate(prompts, params)])


def test_verify_steps_in_the_triton_decode_kernels(engines, tokenizer_path):
    """ngram speculation on the Triton backend: a verify step's rows run as decode queries (each
    row attends to the positions up to its own), and greedy output equals the plain engine's."""
    triton_llm, _ = engines
    cfg = triton_llm.engine.config
    spec_llm = LLM(model=cfg.model_path, load_format="dummy", tokenizer=tokenizer_path, dtype="float32",
                   device=triton_llm.engine.runner.device.type, max_num_batched_tokens=24,
                   num_kv_blocks=64, attention_backend="triton", speculative="ngram",
                   num_speculative_tokens=3)
    gen = torch.Generator().manual_seed(2)
    loop = torch.randint(100, 40000, (6,), generator=gen).tolist()
    prompts = [loop * 4, torch.randint(100, 40000, (9,), generator=gen).tolist() + loop * 2]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in spec_llm.generate(prompts, params)]
    ref = [o.outputs[0].token_ids for o in triton_llm.generate(prompts, params)]
    assert ours == ref
    assert spec_llm.engine.spec_stats["steps"] > 0  # drafts were verified
