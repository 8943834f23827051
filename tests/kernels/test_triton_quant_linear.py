"""The W4A16 and W8A16 Triton kernels (kernels/triton/w4a16.py, quant_linear.py) equal
dequantize-then-matmul.

On CUDA at Llama-3.1-8B / Qwen2.5 layer shapes; without a GPU in Triton's interpreter on small
ones. The torch path rounds the dequantized 4-bit weight to x's dtype before the product; the
one-row kernel multiplies it unrounded (float32), the tl.dot path rounds it as torch does.
"""
from __future__ import annotations

import zlib

import pytest
import torch

triton = pytest.importorskip("triton")
from nextok.kernels.triton.quant_linear import MAX_ROWS, w8a16  # noqa: E402
from nextok.kernels.triton.w4a16 import w4a16  # noqa: E402
from nextok.quant.int4 import (Int4Linear, dequantize_groups, pack_nibbles, pack_words,  # noqa: E402
                               quantize_groups, unpack_nibbles, unpack_words)
from nextok.quant.int8 import dequantize, quantize_per_channel  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
SHAPES = ([(6144, 4096, 128), (4096, 14336, 128), (1536, 8960, 64), (28672, 4096, 128), (896, 4864, 32)]
          if CUDA else [(40, 192, 64), (24, 96, 32), (20, 320, 32)])
ROWS = [1, 5, 16]
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 4e-3)}


def _data(dtype, n, k, rows):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((dtype, n, k, rows)).encode()))
    w = torch.randn(n, k, generator=gen) * k ** -0.5
    x = torch.randn(rows, k, generator=gen).to(DEVICE, dtype)
    return w, x, (torch.randn(n, generator=gen) * 0.1).to(DEVICE, dtype)


def _close(actual, expected):
    rtol, atol = TOL[actual.dtype]
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


def test_nibbles_round_trip_in_q4_1_order():
    q = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    packed = pack_nibbles(q)
    assert packed.shape == (3, 32)
    assert torch.equal(packed[:, 0], q[:, 0] | (q[:, 16] << 4))  # byte j: columns j and j + 16
    assert torch.equal(packed[:, 16], q[:, 32] | (q[:, 48] << 4))
    assert torch.equal(unpack_nibbles(packed), q)


def test_words_round_trip_in_column_order():
    q = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    q[0, 7] = 15  # the top nibble of a word: the int32 is negative
    words = pack_words(q)
    assert words.shape == (3, 8) and words.dtype == torch.int32
    assert words[0, 0].item() < 0
    assert int(words[1, 2]) & 0xF == q[1, 16] and (int(words[1, 2]) >> 4) & 0xF == q[1, 17]
    assert torch.equal(unpack_words(words), q)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16] + ([] if CUDA else [torch.float32]))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
def test_w4a16(dtype, shape, rows):
    n, k, group = shape
    w, x, b = _data(dtype, n, k, rows)
    q, d, m = quantize_groups(w, group)
    deq = dequantize_groups(q, d, m).to(DEVICE, dtype)  # Int4Linear's torch path
    args = (pack_words(q).to(DEVICE), d.to(DEVICE), m.to(DEVICE))
    _close(w4a16(x, *args, b), torch.nn.functional.linear(x, deq, b))
    _close(w4a16(x, *args), torch.nn.functional.linear(x, deq))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
def test_w8a16(dtype, shape, rows):
    n, k, _ = shape
    w, x, b = _data(dtype, n, k, rows)
    q, scale = quantize_per_channel(w)
    want = (x.float() @ dequantize(q, scale).to(DEVICE).T + b.float()).to(dtype)
    _close(w8a16(x, q.to(DEVICE), scale.to(DEVICE), b), want)


def test_int4_linear_runs_the_kernel_or_the_torch_path_alike():
    """Int4Linear holds packed nibbles; on CUDA its small steps take the kernel, big ones and the
    CPU dequantize: the same answer either way."""
    n, k, group = SHAPES[0]
    w, x, b = _data(torch.float32, n, k, MAX_ROWS + 4)
    q, d, m = quantize_groups(w, group)
    layer = Int4Linear(q, d, m, b.cpu()).to(DEVICE)
    assert layer.qweight.shape == (n, k // 8)
    want = torch.nn.functional.linear(x, dequantize_groups(q, d, m).to(DEVICE), b)
    _close(layer(x), want)  # 20 rows: the dense path
    _close(layer(x[:3]), want[:3])  # on CUDA: the kernel


def test_bad_shapes_are_refused():
    q = torch.zeros(8, 12, dtype=torch.int32)  # K = 96: groups of 48, not a power of two
    d = torch.ones(8, 2, dtype=torch.float16)
    with pytest.raises(ValueError, match="power of two"):
        w4a16(torch.zeros(1, 96, device=DEVICE), q.to(DEVICE), d.to(DEVICE), d.to(DEVICE))
    with pytest.raises(ValueError, match="rows"):
        w4a16(torch.zeros(MAX_ROWS + 1, 96, device=DEVICE), q.to(DEVICE), d[:, :1].to(DEVICE),
              d[:, :1].to(DEVICE))
    with pytest.raises(ValueError, match="rows"):
        w8a16(torch.zeros(MAX_ROWS + 1, 32, device=DEVICE), torch.zeros(4, 32, dtype=torch.int8, device=DEVICE),
              torch.ones(4, dtype=torch.float16, device=DEVICE))
