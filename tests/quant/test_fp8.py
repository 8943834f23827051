"""FP8 W8A8 (`--quantization fp8`): the row quantizer, the refusals where FP8 cannot run (here: a
CPU; before any weight loads), and on a GPU with FP8 tensor cores the layer against
dequantize-then-matmul."""
from __future__ import annotations

import pytest
import torch

from nextok.errors import NextokError
from nextok.quant import get_quant_method
from nextok.quant.fp8 import E4M3_MAX, FP8Linear, quantize_rows

FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def test_rows_use_the_whole_e4m3_range():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=gen) * torch.rand(64, 1, generator=gen) * 5
    w[7] = 0.0
    q, s = quantize_rows(w)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (64, 1)
    assert torch.allclose(q.float().abs().amax(dim=1)[:7], torch.full((7,), E4M3_MAX))
    back = q.float() * s
    # e4m3: 3 mantissa bits, a relative error of at most 2^-4 (values far below a row's max are
    # subnormal: an absolute error of at most 2^-10 of the row's scale step)
    assert ((back - w).abs() <= w.abs() / 16 + s * 2 ** -9).all()
    assert torch.equal(back[7], torch.zeros(128))


def test_fp8_is_refused_on_a_cpu_before_loading():
    from nextok import LLM

    with pytest.raises(NextokError, match="FP8 tensor cores.*runs on cpu"):
        get_quant_method("fp8").check(torch.device("cpu"), torch.bfloat16)
    with pytest.raises(NextokError, match="FP8 tensor cores"):
        LLM(model="/nonexistent/model.gguf", quantization="fp8", device="cpu")  # refused first


def test_bad_shapes_and_dtypes_are_refused():
    with pytest.raises(NextokError, match="multiples of 16"):
        get_quant_method("fp8").create_layer(torch.zeros(24, 40), None)
    if FP8_GPU:
        with pytest.raises(NextokError, match="bfloat16 or float16"):
            get_quant_method("fp8").check(torch.device("cuda"), torch.float32)


@pytest.mark.skipif(not FP8_GPU, reason="needs a GPU with FP8 tensor cores")
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_layer_equals_dequantize_then_matmul(rows):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(256, 512, generator=gen) * 0.05
    b = torch.randn(256, generator=gen) * 0.1
    x = torch.randn(rows, 512, generator=gen).cuda().bfloat16()
    layer = FP8Linear(w.cuda().bfloat16(), b.cuda().bfloat16())
    xq, sx = quantize_rows(x)
    want = (xq.float() * sx) @ (layer.qweight.float() * layer.scale.T).T + b.cuda()
    torch.testing.assert_close(layer(x).float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not FP8_GPU, reason="needs a GPU with FP8 tensor cores")
@pytest.mark.parametrize("shape", [(1, 4096), (37, 14336), (300, 896)], ids=str)
def test_the_triton_row_quantizer_equals_the_torch_one(shape):
    from nextok.kernels.triton.fp8_quant import quantize_rows_fp8

    gen = torch.Generator().manual_seed(shape[1])
    x = (torch.randn(*shape, generator=gen) * torch.rand(shape[0], 1, generator=gen) * 8).cuda().bfloat16()
    x[-1, :] = 0.0  # a row of zeros: scale 1e-12 / 448, values 0
    q, s = quantize_rows_fp8(x)
    q_ref, s_ref = quantize_rows(x)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
    # the same scale: the same e4m3 values, but for a division rounded once in float32 either way
    assert (q.float() - q_ref.float()).abs().max().item() <= 32  # one e4m3 step at 448
    assert (q.float() != q_ref.float()).float().mean().item() < 1e-3
    assert torch.equal(q[-1].float(), torch.zeros(shape[1], device="cuda"))
