"""INT4 round-to-nearest (`--quantization int4`): the quantizer, the Q4_1 layout, each layer
against dequantize-then-matmul."""
from __future__ import annotations

import pytest
import torch

from nextok.errors import NextokError
from nextok.kernels.cpu_gguf_linear import BlockLinear, load_gguf_matmul
from nextok.quant.int4 import Int4Linear, Int4RoundToNearest, dequantize_groups, quantize_groups

needs_kernel = pytest.mark.skipif(load_gguf_matmul() is None, reason="no C compiler")


def _weight(out=48, k=256):
    w = torch.randn(out, k, generator=torch.Generator().manual_seed(1))
    w[2, :128] = 0.5  # a constant group: d = 0
    return w


def test_quantizer_rounds_each_group_to_its_16_levels():
    w = _weight()
    q, d, m = quantize_groups(w, 128)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15 and d.shape == m.shape == (48, 2)
    assert d[2, 0] == 0 and bool((dequantize_groups(q, d, m)[2, :128] == m[2, 0].float()).all())
    err = (dequantize_groups(q, d, m) - w).abs().view(48, 2, 128)
    # within half a step, plus float16's rounding of the group's minimum
    assert bool((err <= d.float().unsqueeze(2) / 2 + m.float().abs().unsqueeze(2) * 2 ** -10 + 1e-6).all())


@needs_kernel
@pytest.mark.parametrize("rows", [1, 4, 8, 12])
def test_cpu_block_layer_equals_dequantize_then_matmul(rows):
    w, bias = _weight(), torch.randn(48)
    layer = Int4RoundToNearest(128).create_layer(w, bias)
    assert isinstance(layer, BlockLinear) and layer.blocks.type_id == 3  # Q4_1 blocks
    dense = dequantize_groups(*quantize_groups(w, 128))
    assert torch.equal(layer.blocks.dequantize(), dense)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
    torch.testing.assert_close(layer(x), x @ dense.T + bias, rtol=1e-5, atol=1e-5)


def test_generic_layer_and_bad_group_sizes():
    w = _weight()
    q, d, m = quantize_groups(w, 64)
    layer = Int4Linear(q, d, m, None)
    x = torch.randn(3, 256)
    torch.testing.assert_close(layer(x), x @ dequantize_groups(q, d, m).T, rtol=1e-5, atol=1e-5)
    with pytest.raises(NextokError, match="--quant-group-size must be a multiple of 32"):
        Int4RoundToNearest(48)
    with pytest.raises(NextokError, match="not a multiple of it"):
        Int4RoundToNearest(128).create_layer(torch.randn(8, 96), None)


@pytest.mark.parametrize("layout", [None, (4, 4)])
def test_big_steps_dequantize_in_row_chunks(monkeypatch, layout):
    """Past the kernels' rows W is dequantized and multiplied densely, at most DEQUANT_LIMIT
    elements at a time: in chunks of whole word tiles (here 3 x 8 rows of 48, on tiled and
    row-major words, group-major scales too), the same products as the whole weight at once."""
    import nextok.quant.int4 as int4

    w, bias = _weight(), torch.randn(48)
    q, d, m = quantize_groups(w, 32)
    layer = Int4Linear(q, d, m, bias)
    if layout:
        pytest.importorskip("triton")
        layer.set_layout(layout)
        assert layer.layout == layout
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1))
    want = x @ dequantize_groups(q, d, m).T + bias
    whole = layer(x)
    torch.testing.assert_close(whole, want, rtol=1e-5, atol=1e-5)
    chunks = []
    real = Int4Linear._dequantize_rows
    monkeypatch.setattr(Int4Linear, "_dequantize_rows",
                        lambda self, a, b, x: (chunks.append((a, b)), real(self, a, b, x))[1])
    monkeypatch.setattr(int4, "DEQUANT_LIMIT", 10 * 256)  # 10 rows: 8, whole tiles of 4
    for group_major in (False, True):
        layer.set_scale_order(group_major)
        chunks.clear()
        torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)  # (BLAS may sum in another order)
        assert chunks == ([(0, 8), (8, 16), (16, 24), (24, 32), (32, 40), (40, 48)] if layout else
                          [(0, 10), (10, 20), (20, 30), (30, 40), (40, 48)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton dequantize pass of a CUDA layer")
def test_big_cuda_steps_dequantize_in_row_chunks(monkeypatch):
    """On CUDA a step past the kernels' rows dequantizes in one Triton pass per chunk of whole
    64-row word tiles: the products of the whole weight."""
    import nextok.quant.int4 as int4

    w, bias = _weight(256, 512), torch.randn(256)
    q, d, m = quantize_groups(w, 128)
    layer = Int4Linear(q, d, m, bias).cuda()
    layer.set_layout((64, 16))
    x = torch.randn(300, 512, generator=torch.Generator().manual_seed(2)).cuda().bfloat16()
    whole = layer(x).float()
    chunks = []
    real = Int4Linear._dequantize_rows
    monkeypatch.setattr(Int4Linear, "_dequantize_rows",
                        lambda self, a, b, x: (chunks.append((a, b)), real(self, a, b, x))[1])
    monkeypatch.setattr(int4, "DEQUANT_LIMIT", 100 * 512)  # 100 rows: 64, whole tiles
    torch.testing.assert_close(layer(x).float(), whole, rtol=2e-2, atol=2e-2)
    assert chunks == [(0, 64), (64, 128), (128, 192), (192, 256)]


def test_int4_engine_on_the_default_model(make_llm):
    from nextok import SamplingParams
    from tests.prompts import PROMPTS

    with pytest.raises(NextokError, match="576 inputs, not a multiple of it"):
        make_llm(quantization="int4")  # SmolLM2's hidden size is 576: groups of 128 do not fit
    llm = make_llm(quantization="int4", quant_group_size=64)
    layers = [m for m in llm.engine.runner.model.layers.modules() if isinstance(m, BlockLinear)]
    assert len(layers) == 4 * 30 and all(m.blocks.type_id == 3 for m in layers)
    out = llm.generate(PROMPTS[:3], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 8 for o in out)


def _tiny_model(tied: bool):
    from nextok.attention.torch_ref import TorchRefBackend
    from nextok.config import ModelConfig
    from nextok.model.llama import LlamaForCausalLM

    config = ModelConfig.from_hf_dict({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": tied, "vocab_size": 96})
    model = LlamaForCausalLM(config, TorchRefBackend(), max_positions=64)
    model.init_dummy_weights(3)
    return model


@pytest.mark.parametrize("tied", [False, True])
def test_quantize_lm_head_is_opt_in_and_multiplies_the_quantized_weight(tied):
    from nextok.quant import quantize_model

    model = _tiny_model(tied)
    dense = (model.embed_tokens.weight if tied else model.lm_head.weight).detach().clone()
    embed = model.embed_tokens.weight.detach().clone()
    # the layer's four linears: qkv, o, gate_up, down
    assert quantize_model(_tiny_model(tied), Int4RoundToNearest(64)) == 4
    assert quantize_model(model, Int4RoundToNearest(64), lm_head=True) == 5
    assert isinstance(model.lm_head, (Int4Linear, BlockLinear))
    assert torch.equal(model.embed_tokens.weight, embed)  # lookups keep the dense embedding
    h = torch.randn(3, 128, generator=torch.Generator().manual_seed(0))
    want = h @ dequantize_groups(*quantize_groups(dense, 64)).T
    torch.testing.assert_close(model.compute_logits(h), want, rtol=1e-5, atol=1e-5)


def test_quantize_lm_head_on_the_default_model(make_llm):
    from nextok import SamplingParams
    from tests.prompts import PROMPTS

    with pytest.raises(NextokError, match="--quantize-lm-head needs --quantization"):
        make_llm(quantize_lm_head=True)
    llm = make_llm(quantization="int4", quant_group_size=64, quantize_lm_head=True)
    model = llm.engine.runner.model
    assert isinstance(model.lm_head, BlockLinear) and model.lm_head.blocks.type_id == 3
    from nextok.bench.latency import weight_bytes

    plain = make_llm(quantization="int4", quant_group_size=64).engine.runner.model
    # the quantized copy of the tied embedding is memory of its own; a step reads it, not the
    # embedding
    assert weight_bytes(model, False) == weight_bytes(plain, False) + model.lm_head.blocks.nbytes
    assert weight_bytes(model, True) < weight_bytes(plain, True) - model.lm_head.blocks.nbytes
    out = llm.generate(PROMPTS[:3], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 8 for o in out)
