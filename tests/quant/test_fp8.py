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


# The Triton kernels run on CUDA, or in Triton's interpreter on small rows (the FP8 matmul does
# not run without a GPU; the kernels that make its input do).
DEVICE = "cuda" if FP8_GPU else "cpu"
ON_GPU = torch.cuda.is_available()


def _rows(gen, rows, cols, dtype=torch.bfloat16, scale=8.0):
    """Rows of different magnitudes, the last all zeros (scale 1e-12 / 448, values 0)."""
    x = torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen) * scale
    x[-1] = 0.0
    return x.to(DEVICE, dtype)


@pytest.mark.skipif(ON_GPU and not FP8_GPU, reason="a GPU without FP8 (the interpreter runs on CPU)")
@pytest.mark.parametrize("shape", [(1, 4096), (37, 14336), (300, 896)] if FP8_GPU else
                         [(2, 64), (5, 200)], ids=str)
def test_the_triton_row_quantizer_equals_the_torch_one(shape):
    from nextok.kernels.triton.fp8_quant import quantize_rows_fp8

    x = _rows(torch.Generator().manual_seed(shape[1]), *shape)
    q, s = quantize_rows_fp8(x)
    q_ref, s_ref = quantize_rows(x)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
    # the same scale: the same e4m3 values, but for a division rounded once in float32 either way
    assert (q.float() - q_ref.float()).abs().max().item() <= 32  # one e4m3 step at 448
    assert (q.float() != q_ref.float()).float().mean().item() < 1e-3
    assert torch.equal(q[-1].float(), torch.zeros(shape[1], device=DEVICE))


@pytest.mark.skipif(ON_GPU and not FP8_GPU, reason="a GPU without FP8 (the interpreter runs on CPU)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 4096), (40, 3584), (256, 4096)] if FP8_GPU else
                         [(1, 96), (5, 200)], ids=str)
def test_norm_and_silu_mul_write_the_fp8_rows_the_quantizer_makes_of_their_output(shape, dtype):
    # add + RMSNorm and silu_mul quantized in their own kernels: the very bytes and scales of
    # the unfused path (the kernel's output, then quantize_rows_fp8), the residual add as well
    from nextok.kernels.triton.fp8_quant import quantize_rows_fp8
    from nextok.kernels.triton.fused import TritonFusedOps

    ops = TritonFusedOps()
    gen = torch.Generator().manual_seed(shape[1])
    rows, dim = shape
    x, res = _rows(gen, rows, dim, dtype, 2.0), _rows(gen, rows, dim, dtype, 8.0)
    res[-1] = 1.0  # the last row's sum is not zero: its norm is
    w = (torch.randn(dim, generator=gen) * 0.3 + 1).to(DEVICE, dtype)
    for residual in (res, None):
        r1 = None if residual is None else residual.clone()
        r2 = None if residual is None else residual.clone()
        (q, s), new_res = ops.add_rms_norm_fp8(x.clone(), r1, w, 1e-5)
        normed, want_res = ops.add_rms_norm(x.clone(), r2, w, 1e-5)
        q_want, s_want = quantize_rows_fp8(normed)
        assert q.dtype == torch.float8_e4m3fn and s.shape == (rows, 1)
        assert torch.equal(s, s_want) and torch.equal(q.view(torch.uint8), q_want.view(torch.uint8))
        assert torch.equal(new_res, want_res)
    gate_up = _rows(gen, rows, 2 * dim, dtype, 4.0)
    q, s = ops.silu_mul_fp8(gate_up)
    q_want, s_want = quantize_rows_fp8(ops.silu_mul(gate_up))
    assert torch.equal(s, s_want) and torch.equal(q.view(torch.uint8), q_want.view(torch.uint8))


def test_the_fused_fp8_producers_refuse_what_they_cannot_take():
    from nextok.kernels.triton.fused import TritonFusedOps

    ops = TritonFusedOps()
    with pytest.raises(ValueError, match="weight in x's dtype"):
        ops.add_rms_norm_fp8(torch.zeros(1, 64, dtype=torch.bfloat16), None, torch.ones(64), 1e-5)
    with pytest.raises(ValueError, match="at most 16384"):
        ops.add_rms_norm_fp8(torch.zeros(1, 16400), None, torch.ones(16400), 1e-5)
    with pytest.raises(ValueError, match="2 x 16384"):
        ops.silu_mul_fp8(torch.zeros(1, 2 * 16400))


@pytest.mark.skipif(not FP8_GPU, reason="needs a GPU with FP8 tensor cores")
@pytest.mark.parametrize("rows", [1, 7, 256])
def test_layer_takes_its_input_from_the_norm_and_silu_mul_as_it_would_from_them(rows):
    # FP8Linear.forward_add_norm / forward_silu_mul (the decoder layer's path) against the
    # norm's and silu_mul's outputs through forward: the same quantized input, the same product
    from nextok.kernels.triton.fused import TritonFusedOps
    from nextok.model.layers import RMSNorm, add_norm

    gen = torch.Generator().manual_seed(rows)
    layer = FP8Linear((torch.randn(512, 1024, generator=gen) * 0.05).cuda().bfloat16(), None)
    down = FP8Linear((torch.randn(1024, 256, generator=gen) * 0.05).cuda().bfloat16(), None)
    norm = RMSNorm(1024, 1e-5).cuda().bfloat16()
    norm.weight.data = (torch.randn(1024, generator=gen) * 0.3 + 1).cuda().bfloat16()
    norm.fused = TritonFusedOps()
    x, res = _rows(gen, rows, 1024, scale=2.0), _rows(gen, rows, 1024)
    y, new_res = layer.forward_add_norm(x.clone(), res.clone(), norm)
    h, want_res = add_norm(norm, x.clone(), res.clone())
    assert torch.equal(new_res, want_res) and torch.equal(y, layer(h))
    gate_up = _rows(gen, rows, 512, scale=4.0)
    assert torch.equal(down.forward_silu_mul(gate_up, norm.fused),
                       down(norm.fused.silu_mul(gate_up)))
