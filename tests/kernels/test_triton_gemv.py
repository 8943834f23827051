"""kernels/triton/gemv.py (through TritonFusedOps) against the unfused torch ops of kernels/ref.py.

On CUDA at the Llama-3.1-8B / Qwen2.5-1.5B layer shapes; without a GPU in Triton's interpreter
on small ones (K not a multiple of the tile: a masked tail).
"""
from __future__ import annotations

import zlib

import pytest
import torch

from nextok.kernels.ref import RefFusedOps

triton = pytest.importorskip("triton")
from nextok.kernels.triton.fused import TritonFusedOps  # noqa: E402
from nextok.kernels.triton.gemv import MAX_ROWS, gemv  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# (N out, K in)
SHAPES = [(6144, 4096), (1536, 8960), (2048, 1536)] if CUDA else [(40, 72), (17, 64)]
ROWS = [1, 3, 8]
REF, TRI = RefFusedOps(), TritonFusedOps()
# float32: the summation order only. Below it, an output may round one ulp the other way, and an
# activation rounded the other way (the norm's statistics summed in another order) moves it more.
TOL = {torch.float32: (2e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 4e-3)}


def _data(dtype, n, k, rows, *seed, x_cols=None):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((dtype, n, k, rows) + seed).encode()))
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=gen) * scale).to(DEVICE, dtype)  # noqa: E731
    return (r(rows, x_cols or k), r(rows, k), r(k, scale=0.3) + 1, r(n, k, scale=k ** -0.5), r(n))


def _close(actual, expected):
    rtol, atol = TOL[actual.dtype]
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
def test_linear(dtype, shape, rows):
    x, _, _, w, b = _data(dtype, *shape, rows)
    _close(TRI.linear(x, w, b), REF.linear(x, w, b))
    _close(TRI.linear(x, w, None), REF.linear(x, w, None))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
def test_silu_mul_linear(dtype, shape, rows):
    n, k = shape
    gate_up, _, _, w, _ = _data(dtype, n, k, rows, "silu", x_cols=2 * k)
    _close(TRI.silu_mul_linear(gate_up, w, None), REF.silu_mul_linear(gate_up, w, None))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rms_norm_linear(dtype, shape, rows, with_residual):
    x, res, nw, w, b = _data(dtype, *shape, rows, "norm")
    res_before = res.clone()
    got, got_res = TRI.add_rms_norm_linear(x, res if with_residual else None, nw, 1e-5, w, b)
    want, want_res = REF.add_rms_norm_linear(x, res_before if with_residual else None, nw, 1e-5, w, b)
    _close(got, want)
    assert torch.equal(got_res, want_res)  # x + residual rounds once, the same way
    assert torch.equal(res, res_before)  # the caller's residual is not written


def test_more_rows_fall_back_to_the_separate_ops():
    x, res, nw, w, b = _data(torch.float32, *SHAPES[0], MAX_ROWS + 5, "many")
    _close(TRI.linear(x, w, b), REF.linear(x, w, b))
    got, got_res = TRI.add_rms_norm_linear(x, res.clone(), nw, 1e-5, w, b)
    want, want_res = REF.add_rms_norm_linear(x, res.clone(), nw, 1e-5, w, b)
    _close(got, want)
    _close(got_res, want_res)
    with pytest.raises(ValueError, match="rows"):
        gemv(x, w)


def test_row_strided_input_and_bad_shapes():
    x, _, _, w, b = _data(torch.float32, *SHAPES[1], 3, "strided")
    wide = torch.cat([x, x], dim=1)[:, :x.shape[1]]  # rows with a stride wider than K
    _close(TRI.linear(wide, w, b), REF.linear(x, w, b))
    with pytest.raises(ValueError, match="columns"):
        gemv(x[:, 1:].contiguous(), w)
    with pytest.raises(ValueError, match="contiguous"):
        gemv(x, w.t().contiguous().t())
