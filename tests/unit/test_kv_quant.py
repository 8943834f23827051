"""The quantized KV cache (attention/kv_quant.py): rows round-trip within their format's error,
and the torch reference backend reading int8 / fp8 caches stays close to the float cache."""
from __future__ import annotations

import pytest
import torch

from nextok.attention import kv_quant
from nextok.attention.base import AttentionMetadata, PrefillChunk
from nextok.attention.torch_ref import TorchRefBackend, decode_mask


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_rows_round_trip(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, 64, generator=gen) * torch.rand(7, 3, 1, generator=gen) * 10
    x[2, 1] = 0.0  # an all-zero row: scale 1, zeros back
    rows = kv_quant.quantize_rows(x, dtype)
    assert rows.dtype == dtype and rows.shape == (7, 3, 64 + kv_quant.SCALE_BYTES)
    back = kv_quant.dequantize_rows(rows, torch.float32)
    amax = x.abs().amax(dim=-1, keepdim=True)
    if dtype == torch.int8:  # half a step of max|x| / 127
        assert ((back - x).abs() <= amax / 127 / 2 * (1 + 1e-5)).all()
    else:  # e4m3: 3 mantissa bits, relative error <= 2^-4 (values near 0 are subnormal)
        assert ((back - x).abs() <= x.abs() / 16 + amax / 448 * 2 ** -6).all()
    assert torch.equal(back[2, 1], torch.zeros(64))
    assert kv_quant.is_quantized(rows) and not kv_quant.is_quantized(x)


def _step(kv_dtype, seed=0):
    """A paged pool holding three sequences' keys, one decode step and one chunk over a prefix."""
    gen = torch.Generator().manual_seed(seed)
    page, kvh, h, d = 4, 2, 4, 32
    lens = [9, 14, 3]
    tables = [torch.arange(1 + 4 * i, 5 + 4 * i) for i in range(3)]
    row = d + kv_quant.SCALE_BYTES if kv_dtype else d
    caches = [torch.zeros(13, page, kvh, row, dtype=kv_dtype or torch.float32) for _ in range(2)]
    backend = TorchRefBackend()
    # Fill every sequence's first len - 1 keys through the backend's own store (a prefill).
    chunks, slots, q_start = [], [], 0
    for n, table in zip(lens, tables):
        chunks.append(PrefillChunk(q_start, n - 1, n - 1, table))
        slots += [int(table[p // page]) * page + p % page for p in range(n - 1)]
        q_start += n - 1
    t = q_start
    q, k, v = (torch.randn(t, x, d, generator=gen) for x in (h, kvh, kvh))
    prefill = backend.forward(q, k, v, *caches, AttentionMetadata(torch.tensor(slots), 0, None, None, None, chunks), 0.2)
    # Then one decode token each.
    lens_t = torch.tensor(lens)
    dec_slots = torch.tensor([int(tb[(n - 1) // page]) * page + (n - 1) % page for tb, n in zip(tables, lens)])
    table = torch.stack(tables)
    meta = AttentionMetadata(dec_slots, 3, table, lens_t, decode_mask(lens_t, table.shape[1] * page, None), [])
    q, k, v = (torch.randn(3, x, d, generator=gen) for x in (h, kvh, kvh))
    return prefill, backend.forward(q, k, v, *caches, meta, 0.2)


@pytest.mark.parametrize("dtype,tol", [(torch.int8, 0.02), (torch.float8_e4m3fn, 0.12)])
def test_torch_backend_reads_quantized_caches(dtype, tol):
    ref_prefill, ref_decode = _step(None)
    prefill, decode = _step(dtype)
    for got, want in ((prefill, ref_prefill), (decode, ref_decode)):
        err = (got - want).abs().max().item()
        assert err < tol * want.abs().max().item(), err
        assert not torch.equal(got, want)  # the cache really held quantized values
