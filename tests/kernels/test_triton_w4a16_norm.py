"""add + RMS norm inside the one-row W4A16 kernels (kernels/triton/norm_prologue.py): a call
with `norm` gives the products of the norm kernel's output (fused.py add_rms_norm) and writes its
new residual, on every tile option of the split-K grid and of the stream.

Without a GPU in Triton's interpreter, where the norm's sum of squares runs in one chunk as the
norm kernel's does: bit for bit. On CUDA the chunks and the reduction's order differ: rstd may
differ in its last bit, so the products are compared within x's dtype's tolerance.
"""
from __future__ import annotations

import zlib

import pytest
import torch

triton = pytest.importorskip("triton")
from nextok.kernels.triton import int4_words as words4  # noqa: E402
from nextok.kernels.triton import w4a16_tiles  # noqa: E402
from nextok.kernels.triton.fused import TritonFusedOps  # noqa: E402
from nextok.kernels.triton.w4a16 import NormIn, takes_norm, w4a16  # noqa: E402
from nextok.model.layers import RMSNorm, norm_then_linear  # noqa: E402
from nextok.quant.int4 import Int4Linear, pack_words, quantize_groups  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
N, K, GROUP = (6144, 4096, 128) if CUDA else (40, 192, 64)
TILES = words4.LAYOUT if CUDA else (4, 4)
EPS = 1e-5


def _layer(dtype, rows, seed):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((dtype, rows, seed)).encode()))
    w = torch.randn(N, K, generator=gen) * K ** -0.5
    q, d, m = quantize_groups(w, GROUP)
    words = words4.tile_words(pack_words(q), TILES).to(DEVICE)
    x = (torch.randn(rows, K, generator=gen) * 3).to(DEVICE, dtype)
    res = (torch.randn(rows, K, generator=gen) * 2).to(DEVICE, dtype)
    weight = (1 + 0.2 * torch.randn(K, generator=gen)).to(DEVICE, dtype)
    bias = (torch.randn(N, generator=gen) * 0.1).to(DEVICE, dtype)
    return q, d.to(DEVICE), m.to(DEVICE), words, x, res, weight, bias


def _check(got, want):
    if CUDA:
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    else:
        assert torch.equal(got, want)


def _with(monkeypatch, **tile):
    config = w4a16_tiles.config
    monkeypatch.setattr(w4a16_tiles, "config", lambda *a: (lambda dot, cfg: (dot, dict(cfg, **tile)))(*config(*a)))


ONE = dict(SPLIT=1, DEPTH=1, XAHEAD=0)
TILE_OPTIONS = [dict(), dict(DEPTH=2, XAHEAD=1), dict(XAHEAD=1, UNROLL=1), dict(PIPE=3), dict(XRUN=1),
                dict(ONE, STREAM=1), dict(ONE, STREAM=3), dict(ONE, STREAM=7, XRUN=1), dict(ONE, STREAM=3, PIPE=3),
                dict(ONE, STREAM=5, PIPE=3, TMA=1)]


@pytest.mark.parametrize("residual", [True, False], ids=["residual", "first-layer"])
@pytest.mark.parametrize("tile", TILE_OPTIONS, ids=str)
def test_norm_in_the_kernel_equals_the_norm_kernel_then_the_product(monkeypatch, tile, residual):
    """y = (rms_norm(x + residual) * weight) @ W.T + b as add_rms_norm then w4a16 give it, and
    residual_out = x + residual rounded as add_rms_norm leaves it (no residual: the first layer,
    x itself is normed), on the split-K grid's tile options and the stream's."""
    rows = 1 if tile.get("STREAM") else 2
    _, d, m, words, x, res, weight, bias = _layer(torch.bfloat16, rows, 0)
    _with(monkeypatch, **tile)
    ops = TritonFusedOps(gemv_rows=0)
    res_ref = res.clone()
    h, res_ref = ops.add_rms_norm(x, res_ref if residual else None, weight, EPS)
    want = w4a16(h, words, d, m, bias, layout=TILES)
    out = torch.full_like(x, float("nan")) if residual else None
    x_before, res_before = x.clone(), res.clone()
    got = w4a16(x, words, d, m, bias, layout=TILES,
                norm=NormIn(res if residual else None, weight, EPS, out))
    _check(got, want)
    assert torch.equal(x, x_before) and torch.equal(res, res_before)  # inputs untouched
    if residual:
        assert torch.equal(out, res_ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 3, 6])
def test_norm_in_the_kernel_at_each_row_class(dtype, rows):
    """1-8 rows (the dp4a kernels' row classes, the committed tiles), in both half dtypes."""
    _, d, m, words, x, res, weight, bias = _layer(dtype, rows, 1)
    ops = TritonFusedOps(gemv_rows=0)
    h, res_ref = ops.add_rms_norm(x, res.clone(), weight, EPS)
    out = torch.empty_like(x)
    got = w4a16(x, words, d, m, None, layout=TILES, norm=NormIn(res, weight, EPS, out))
    _check(got, w4a16(h, words, d, m, None, layout=TILES))
    assert torch.equal(out, res_ref)


def test_int4_linear_norms_inside_the_kernel_as_norm_then_linear_would():
    """Int4Linear.forward_add_norm (model/layers.py norm_then_linear): on CUDA at decode sizes
    the kernel norms x; elsewhere (the CPU, more rows than the dp4a kernels take) the norm's own
    kernel first. Both give (linear(norm(x + residual)), x + residual)."""
    q, d, m, _, x, res, weight, bias = _layer(torch.bfloat16, 1, 2)
    layer = Int4Linear(q, d, m, bias.cpu()).to(DEVICE)
    norm = RMSNorm(K, EPS).to(DEVICE, torch.bfloat16)
    norm.weight.copy_(weight)
    norm.fused = TritonFusedOps(gemv_rows=0) if CUDA else None
    for rows in (1, 16):
        xs, rs = x.repeat(rows, 1), res.repeat(rows, 1)
        h, r = norm(xs, rs.clone())
        want = layer(h)
        if CUDA:
            got, r_got = layer.forward_add_norm(xs, rs.clone(), norm)
            assert layer._fuses_norm(xs, rs, norm) == (rows == 1)
        else:  # (norm_then_linear takes forward_add_norm only with fused ops)
            got, r_got = norm_then_linear(norm, layer, xs, rs.clone())
        _check(got, want)
        assert torch.equal(r_got, r)
    h = norm(x)
    got, r_got = (layer.forward_add_norm(x, None, norm) if CUDA else norm_then_linear(norm, layer, x, None))
    _check(got, layer(h))
    assert r_got is x


def test_a_norm_the_kernel_cannot_take_is_refused():
    _, d, m, words, x, res, weight, bias = _layer(torch.bfloat16, 1, 3)
    out = torch.empty_like(x)
    with pytest.raises(ValueError, match="norm or silu_mul"):
        w4a16(torch.cat([x, x], 1), words, d, m, layout=TILES, silu_mul=True, norm=NormIn(res, weight, EPS, out))
    with pytest.raises(ValueError, match="weight"):
        w4a16(x, words, d, m, layout=TILES, norm=NormIn(res, weight.float(), EPS, out))
    with pytest.raises(ValueError, match="residual_out"):
        w4a16(x, words, d, m, layout=TILES, norm=NormIn(res, weight, EPS, None))
    rows = w4a16_tiles.DP4A_ROWS + 1
    assert not takes_norm(rows, N, K, GROUP, x.device) and takes_norm(1, N, K, GROUP, x.device)
    x16, r16 = x.repeat(rows, 1), res.repeat(rows, 1)
    with pytest.raises(ValueError, match="takes no norm"):
        w4a16(x16, words, d, m, layout=TILES, norm=NormIn(r16, weight, EPS, torch.empty_like(x16)))
