"""INT8 weight-only (`--quantization int8`): the quantizer, each layer against
dequantize-then-matmul, the module swap, and the default model end to end."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from nextok.kernels.cpu_gguf_linear import BlockLinear, load_gguf_matmul
from nextok.quant import get_quant_method, quantize_model
from nextok.quant.int8 import Int8Linear, dequantize, q8_0_blocks, quantize_per_channel

needs_kernel = pytest.mark.skipif(load_gguf_matmul() is None, reason="no C compiler")


def _weight(out=96, k=160, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out, k, generator=gen)
    if out > 5:
        w[3] = 0.0  # an all-zero channel
        w[5, 7] = 40.0  # an outlier sets its channel's scale
    return w


def test_quantizer_rounds_to_the_nearest_step_of_each_channel():
    w = _weight()
    q, scale = quantize_per_channel(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float16 and scale.shape == (96,)
    assert int(q.abs().max()) <= 127 and scale[3] == 0 and bool((q[3] == 0).all())
    step = scale.float().unsqueeze(1)
    err = (dequantize(q, scale) - w).abs()
    assert bool((err <= step / 2 + 1e-6).all())  # round to nearest, no clipping inside the range
    assert int(q[5, 7]) == 127


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 64])
def test_cpu_block_layer_equals_dequantize_then_matmul(rows):
    w, bias = _weight(), torch.randn(96)
    layer = get_quant_method("int8").create_layer(w, bias)
    assert isinstance(layer, BlockLinear)  # float32 on CPU, in_features % 32 == 0
    dense = dequantize(*quantize_per_channel(w))
    assert torch.equal(layer.blocks.dequantize(), dense)  # the Q8_0 layout holds the same weights
    x = torch.randn(rows, 160, generator=torch.Generator().manual_seed(rows))
    ref = x @ dense.T + bias
    # Steps of <= 8 rows sum in another order (the block kernel); bigger ones use the same GEMM.
    torch.testing.assert_close(layer(x), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer(x.bfloat16()).float(), ref, rtol=2e-2, atol=0.2)


def test_generic_layer_equals_dequantize_then_matmul():
    w = _weight(k=100)  # not a multiple of 32: the generic layer
    layer = get_quant_method("int8").create_layer(w, None)
    assert isinstance(layer, Int8Linear)
    dense = dequantize(*quantize_per_channel(w))
    x = torch.randn(5, 100)
    torch.testing.assert_close(layer(x), x @ dense.T, rtol=1e-5, atol=1e-5)


def test_q8_0_layout_is_scale_then_values_per_block():
    q, scale = quantize_per_channel(_weight(out=2, k=64))
    blocks = q8_0_blocks(q, scale)
    assert blocks.shape == (2, 2 * 34) and blocks.dtype == torch.uint8
    row = blocks[1].view(2, 34)
    assert torch.equal(row[:, :2].contiguous().view(torch.float16), scale[1].repeat(2, 1))
    assert torch.equal(row[:, 2:].contiguous().view(torch.int8).reshape(-1), q[1])


def test_quantize_model_swaps_decoder_linears_only():
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 64)) for _ in range(2)])
    model.lm_head = nn.Linear(64, 10)
    assert quantize_model(model, get_quant_method("int8")) == 4
    assert isinstance(model.lm_head, nn.Linear)
    assert not any(isinstance(m, nn.Linear) for m in model.layers.modules())


def test_unknown_method_is_a_clear_error():
    from nextok.errors import NextokError

    with pytest.raises(NextokError, match="unknown --quantization 'int3'; known: fp8, int4, int8"):
        get_quant_method("int3")


def test_int8_engine_on_the_default_model(make_llm):
    from nextok import SamplingParams
    from nextok.bench.latency import weight_bytes
    from tests.prompts import PROMPTS

    llm = make_llm(quantization="int8")
    model = llm.engine.runner.model
    assert llm.engine.config.quantization == "int8"
    linears = [m for m in model.layers.modules() if isinstance(m, (BlockLinear, Int8Linear))]
    assert len(linears) == 4 * len(model.layers)  # qkv, o, gate_up, down
    # 34 bytes per 32 decoder weights (the Q8_0 layout), plus the float32 embedding and norms
    dense = make_llm(gguf_blocks=False).engine.runner.model
    linear_weights = sum(m.in_features * m.out_features for m in linears)
    expect = weight_bytes(dense, decode=False) - linear_weights * (4 - 34 / 32)
    assert weight_bytes(model, decode=False) == expect
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    batched = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:6], params)]
    single = [llm.generate([p], params)[0].outputs[0].token_ids for p in PROMPTS[:6]]
    assert batched == single and all(len(t) == 24 for t in batched)


def test_cli_rejects_an_unknown_method(capsys):
    from nextok.cli import main

    assert main(["generate", "x", "--max-tokens", "1", "--quantization", "int3"]) != 0
    assert "unknown --quantization 'int3'" in capsys.readouterr().err
