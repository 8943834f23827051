"""The quantized KV cache (attention/kv_quant.py): rows round-trip within their format's error,
an fp8 block is exactly half a bf16 one, and the torch reference backend reading int8 / fp8
caches stays close to the float cache."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nextok.attention import kv_quant
from nextok.attention.base import AttentionMetadata, PrefillChunk
from nextok.attention.torch_ref import TorchRefBackend, decode_mask


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_rows_round_trip(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, 64, generator=gen) * torch.rand(7, 3, 1, generator=gen) * 10
    x[2, 1] = 0.0  # an all-zero row: zeros back
    rows = kv_quant.quantize_rows(x, dtype)
    width = 64 + kv_quant.SCALE_BYTES if dtype == torch.int8 else 64  # fp8: no scale
    assert rows.dtype == dtype and rows.shape == (7, 3, width)
    assert kv_quant.row_width(dtype, 64) == width
    back = kv_quant.dequantize_rows(rows, torch.float32)
    if dtype == torch.int8:  # half a step of max|x| / 127
        amax = x.abs().amax(dim=-1, keepdim=True)
        assert ((back - x).abs() <= amax / 127 / 2 * (1 + 1e-5)).all()
    else:  # e4m3: 3 mantissa bits, relative error <= 2^-4 at |x| >= 2^-6; subnormal steps 2^-9
        normal = x.abs() >= 2 ** -6
        assert normal.float().mean() > 0.9  # (the zero row is 1 in 21)
        assert ((back - x).abs()[normal] <= x.abs()[normal] / 16).all()
        assert ((back - x).abs()[~normal] <= 2 ** -10).all()
    assert torch.equal(back[2, 1], torch.zeros(64))
    assert kv_quant.is_quantized(rows) and not kv_quant.is_quantized(x)


def test_fp8_rows_clamp_to_e4m3_range():
    x = torch.tensor([1000.0, -1e6, 448.0, 500.0, -450.0, 0.3, float(2 ** -9)])
    back = kv_quant.dequantize_rows(kv_quant.quantize_rows(x, torch.float8_e4m3fn), torch.float32)
    assert back.tolist() == [448.0, -448.0, 448.0, 448.0, -448.0, 0.3125, 2 ** -9]


def test_fp8_blocks_are_half_of_bf16():
    """Llama-3.1-8B's KV shape: an fp8 block takes exactly half a bf16 block's bytes (no stored
    scale), so a budget holds exactly twice the tokens; int8 rows carry their 4-byte scale."""
    from nextok.worker.model_runner import ModelRunner

    model = SimpleNamespace(head_dim=128, num_hidden_layers=32, num_key_value_heads=8)

    def per_block(kind):
        config = SimpleNamespace(model=model, cache=SimpleNamespace(kv_cache_dtype=kind))
        runner = SimpleNamespace(config=config, dtype=torch.bfloat16, block_size=16)
        runner._kv_row = lambda: ModelRunner._kv_row(runner)
        return ModelRunner.kv_bytes_per_block(runner)

    assert per_block("auto") == 2 * 32 * 16 * 8 * 128 * 2
    assert per_block("fp8") * 2 == per_block("auto")
    assert per_block("int8") == per_block("fp8") * (128 + 4) // 128


def test_fp8_attention_backend_choice(monkeypatch):
    """fp8 caches go to Triton where Triton has e4m3 (compute capability 8.9+, or its interpreter,
    which conftest turns on), to the torch backend on older GPUs."""
    from nextok.engine.factory import _attention_backend
    from nextok.errors import NextokError

    assert _attention_backend("triton", "cpu", "fp8") == "triton"  # the interpreter
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert _attention_backend("auto", "cuda", "fp8") == "torch"
    with pytest.raises(NextokError, match="8.9 or newer"):
        _attention_backend("triton", "cuda", "fp8")


def _step(kv_dtype, seed=0):
    """A paged pool holding three sequences' keys, one decode step and one chunk over a prefix."""
    gen = torch.Generator().manual_seed(seed)
    page, kvh, h, d = 4, 2, 4, 32
    lens = [9, 14, 3]
    tables = [torch.arange(1 + 4 * i, 5 + 4 * i) for i in range(3)]
    row = kv_quant.row_width(kv_dtype, d) if kv_dtype else d
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
