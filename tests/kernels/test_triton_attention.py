"""The Triton attention backend == the torch reference backend, on the same paged KV state.

On CUDA: realistic shapes (32 heads / 8 KV heads, head_dim 128, contexts up to 4k). Without a GPU
the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET=1) on small shapes.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from nextok.attention.base import AttentionMetadata, PrefillChunk  # noqa: E402
from nextok.attention.torch_ref import TorchRefBackend, _decode, decode_mask  # noqa: E402
from nextok.attention.triton_backend import TritonBackend  # noqa: E402
from nextok.kernels.triton.attention import paged_decode, store_kv  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
if CUDA:  # (heads, kv_heads, head_dim, block_size, window, decode lens, chunks (ctx_len, q_len))
    HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, WINDOW = 32, 8, 128, 16, 1000
    DECODE_LENS = [1, 17, 1000, 4096, 2500, 333]
    CHUNKS = [(512, 512), (4096, 300), (2, 2), (1500, 700)]
else:
    HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, WINDOW = 4, 2, 32, 4, 7
    DECODE_LENS = [1, 5, 33, 64, 97]
    CHUNKS = [(20, 20), (50, 13), (9, 2)]
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}


class Step:
    """A random paged KV pool, block tables of shuffled block ids, and one step's new tokens:
    `lens` = (ctx_len, q_len) per sequence, single-token queries first. q, k, v are views into
    one fused projection (strided), as the model passes them."""

    def __init__(self, lens, heads, kv_heads, head_dim, block_size, window, dtype, seed=0):
        gen = torch.Generator().manual_seed(seed)
        need = [-(-ctx // block_size) for ctx, _ in lens]
        num_blocks = sum(need) + 8
        shape = (num_blocks, block_size, kv_heads, head_dim)
        self.k_cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
        self.v_cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
        ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()  # block 0: padding
        tables = [ids[sum(need[:i]):sum(need[:i + 1])] for i in range(len(lens))]
        slots, decode_tables, decode_lens, chunks, t = [], [], [], [], 0
        for (ctx, n), table in zip(lens, tables):
            slots += [table[p // block_size] * block_size + p % block_size
                      for p in range(ctx - n, ctx)]
            if n == 1:
                decode_tables.append(table)
                decode_lens.append(ctx)
            else:
                chunks.append(PrefillChunk(t, n, ctx, torch.tensor(table, device=DEVICE)))
            t += n
        qkv = torch.randn(t, (heads + 2 * kv_heads) * head_dim, generator=gen).to(DEVICE, dtype)
        q_size, kv_size = heads * head_dim, kv_heads * head_dim
        self.q = qkv[:, :q_size].view(t, heads, head_dim)
        self.k = qkv[:, q_size:q_size + kv_size].view(t, kv_heads, head_dim)
        self.v = qkv[:, q_size + kv_size:].view(t, kv_heads, head_dim)
        self.meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, device=DEVICE), num_decode=len(decode_lens),
            decode_block_tables=None, decode_context_lens=None, decode_mask=None,
            prefills=chunks, sliding_window=window)
        if decode_lens:
            width = max(len(tb) for tb in decode_tables)
            padded = [tb + [0] * (width - len(tb)) for tb in decode_tables]
            self.meta.decode_block_tables = torch.tensor(padded, device=DEVICE)
            self.meta.decode_context_lens = torch.tensor(decode_lens, device=DEVICE)
        self.scale = head_dim ** -0.5

    def run_triton(self, backend=None):
        kc, vc = self.k_cache.clone(), self.v_cache.clone()
        out = (backend or TritonBackend()).forward(self.q, self.k, self.v, kc, vc, self.meta, self.scale)
        return out, kc, vc

    def run_reference(self):
        """The torch backend in float32 on the same state (a low-precision run is compared with
        the exact answer, not with another rounding of it)."""
        meta = dataclasses.replace(self.meta)
        if meta.num_decode:
            width = meta.decode_block_tables.shape[1] * self.k_cache.shape[1]
            meta.decode_mask = decode_mask(meta.decode_context_lens, width, meta.sliding_window)
        kc, vc = self.k_cache.float(), self.v_cache.float()
        out = TorchRefBackend().forward(self.q.float(), self.k.float(), self.v.float(), kc, vc,
                                        meta, self.scale)
        return out, kc, vc


def check(step: Step, dtype, backend=None):
    out, kc, vc = step.run_triton(backend)
    want, want_kc, want_vc = step.run_reference()
    assert out.dtype == dtype and out.shape == step.q.shape
    torch.testing.assert_close(kc, want_kc.to(dtype), rtol=0, atol=0)
    torch.testing.assert_close(vc, want_vc.to(dtype), rtol=0, atol=0)
    tol = TOL[dtype]
    torch.testing.assert_close(out.float(), want, rtol=tol, atol=tol)


HEAD_LAYOUTS = [pytest.param((HEADS, KV_HEADS), id="gqa"),
                pytest.param((KV_HEADS, KV_HEADS), id="mha")]
DTYPES = [pytest.param(torch.float32, id="f32"), pytest.param(torch.bfloat16, id="bf16")]
WINDOWS = [pytest.param(None, id="full"), pytest.param(WINDOW, id="window")]


@pytest.mark.parametrize("heads", HEAD_LAYOUTS)
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode(heads, window, dtype):
    lens = [(n, 1) for n in DECODE_LENS]
    check(Step(lens, *heads, HEAD_DIM, BLOCK_SIZE, window, dtype), dtype)


@pytest.mark.parametrize("heads", HEAD_LAYOUTS)
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_chunks(heads, window, dtype):
    check(Step(CHUNKS, *heads, HEAD_DIM, BLOCK_SIZE, window, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fresh_chunks_through_the_paged_kernel_too(dtype):
    # The backend gives chunks without a cached prefix to SDPA; the paged kernel must still be
    # right for them (it takes them when SDPA is switched off, and under a sliding window).
    check(Step(CHUNKS, HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, None, dtype), dtype,
          TritonBackend(sdpa_for_fresh_chunks=False))


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mixed_step(window, dtype):
    lens = [(n, 1) for n in DECODE_LENS[:3]] + CHUNKS
    check(Step(lens, HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, window, dtype, seed=1), dtype)


@pytest.mark.parametrize("head_dim, block_size, heads",
                         [(16, 1, (6, 2)), (64, 8, (3, 1)), (96, 16, (4, 2))])
def test_other_shapes(head_dim, block_size, heads):
    """Small and non-power-of-two head sizes, a block size of 1, G = 3 (rows of a tile that do
    not divide evenly into query heads)."""
    lens = [(n, 1) for n in DECODE_LENS[:3]] + CHUNKS[:2]
    check(Step(lens, *heads, head_dim, block_size, None, torch.float32, seed=2), torch.float32)


@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("window", WINDOWS)
def test_decode_splits(num_splits, window):
    """Every split count gives the same answer; splits past a short sequence's end are empty."""
    step = Step([(n, 1) for n in DECODE_LENS], HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, window,
                torch.float32, seed=3)
    meta = step.meta
    out = torch.empty_like(step.q)
    paged_decode(step.q, step.k_cache, step.v_cache, meta.decode_block_tables,
                 meta.decode_context_lens, step.scale, window, out, num_splits=num_splits)
    width = meta.decode_block_tables.shape[1] * BLOCK_SIZE
    meta.decode_mask = decode_mask(meta.decode_context_lens, width, window)
    want = _decode(step.q, step.k_cache, step.v_cache, meta, step.scale)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


def test_store_kv_writes_exactly_the_slots():
    kc = torch.randn(6, BLOCK_SIZE, 2, 16, device=DEVICE)
    vc = torch.randn(6, BLOCK_SIZE, 2, 16, device=DEVICE)
    k = torch.randn(5, 2, 32, device=DEVICE)[:, :, :16]  # strided, like a slice of qkv
    v = torch.randn(5, 2, 16, device=DEVICE)
    slots = torch.tensor([3, 4 * BLOCK_SIZE + 1, -1, BLOCK_SIZE, 6 * BLOCK_SIZE - 1], device=DEVICE)
    want_k, want_v = kc.clone(), vc.clone()
    real = slots >= 0  # -1: a padding token, written nowhere
    want_k.view(-1, 2, 16)[slots[real]] = k[real]
    want_v.view(-1, 2, 16)[slots[real]] = v[real]
    store_kv(k, v, kc, vc, slots)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", WINDOWS)
def test_int8_kv_cache(window, dtype):
    """An int8 pool (rows of D values and a float32 scale, attention/kv_quant.py): the Triton
    store quantizes this step's rows as the torch backend does, and the decode and paged
    prefill kernels read the pool as the torch backend dequantizes it."""
    from nextok.attention import kv_quant

    lens = [(n, 1) for n in DECODE_LENS] + CHUNKS
    step = Step(lens, HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, window, dtype, seed=5)
    kc = kv_quant.quantize_rows(step.k_cache, torch.int8)
    vc = kv_quant.quantize_rows(step.v_cache, torch.int8)
    meta = dataclasses.replace(step.meta)
    tri_kc, tri_vc = kc.clone(), vc.clone()
    out = TritonBackend(sdpa_for_fresh_chunks=False).forward(step.q, step.k, step.v, tri_kc, tri_vc,
                                                             meta, step.scale)
    width = meta.decode_block_tables.shape[1] * BLOCK_SIZE
    meta.decode_mask = decode_mask(meta.decode_context_lens, width, window)
    ref_kc, ref_vc = kc.clone(), vc.clone()
    want = TorchRefBackend().forward(step.q, step.k, step.v, ref_kc, ref_vc, meta, step.scale)
    for got, ref in ((tri_kc, ref_kc), (tri_vc, ref_vc)):
        d = HEAD_DIM
        # the same values but for rounding ties (half away from zero vs half to even)
        assert (got[..., :d] != ref[..., :d]).float().mean().item() < 1e-3
        assert ((got[..., :d].int() - ref[..., :d].int()).abs() <= 1).all()
        # the rows' scales (their last 4 bytes, float32): max|x| / 127, the GPU's division within
        # an ulp or two of torch's. (A value off by one step differs by its row's scale, ~0.025
        # here: on an H100 a dequantized check with atol 0.02 failed on such steps.)
        torch.testing.assert_close(got[..., d:].contiguous().view(torch.float32),
                                   ref[..., d:].contiguous().view(torch.float32), rtol=1e-6, atol=0)
        assert not torch.equal(got, kc)  # this step's rows were written
    tol = 2e-3 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", WINDOWS)
def test_fp8_kv_cache(window, dtype):
    """An fp8 pool (rows of D e4m3 values, no scale, attention/kv_quant.py): the Triton store
    writes the bytes the torch backend writes (clamped to +-448), and the decode and paged
    prefill kernels read the pool as the torch backend does. (A bfloat16 q meets the fp8 keys
    in float16 there, _fp8_query; the reference works in bfloat16.)"""
    from nextok.attention import kv_quant

    lens = [(n, 1) for n in DECODE_LENS] + CHUNKS
    step = Step(lens, HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, window, dtype, seed=6)
    step.v[0, 0, :2] = torch.tensor([1000.0, -600.0])  # beyond e4m3's range: stored as +-448
    kc = kv_quant.quantize_rows(step.k_cache, torch.float8_e4m3fn)
    vc = kv_quant.quantize_rows(step.v_cache, torch.float8_e4m3fn)
    meta = dataclasses.replace(step.meta)
    tri_kc, tri_vc = kc.clone(), vc.clone()
    out = TritonBackend(sdpa_for_fresh_chunks=False).forward(step.q, step.k, step.v, tri_kc, tri_vc,
                                                             meta, step.scale)
    width = meta.decode_block_tables.shape[1] * BLOCK_SIZE
    meta.decode_mask = decode_mask(meta.decode_context_lens, width, window)
    ref_kc, ref_vc = kc.clone(), vc.clone()
    want = TorchRefBackend().forward(step.q, step.k, step.v, ref_kc, ref_vc, meta, step.scale)
    for got, ref in ((tri_kc, ref_kc), (tri_vc, ref_vc)):
        assert torch.equal(got.view(torch.uint8), ref.view(torch.uint8))
        assert not torch.equal(got.view(torch.uint8), kc.view(torch.uint8))  # this step's rows
    slot = int(meta.slot_mapping[0])
    assert tri_vc.view(-1, KV_HEADS, HEAD_DIM)[slot, 0, :2].float().tolist() == [448.0, -448.0]
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)


def test_fp8_store_rounds_as_torch():
    """The Triton store's e4m3 rounding (kernels/triton/e4m3.py, by hand: the interpreter's own
    cast is wrong) gives torch's bytes at every tie between two e4m3 values, on subnormals,
    on -0 and past +-448."""
    from nextok.attention import kv_quant

    e4m3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    e4m3 = e4m3[~e4m3.isnan()].unique()  # ascending, -448 .. 448
    ties = (e4m3[1:] + e4m3[:-1]) / 2
    special = torch.tensor([0.0, -0.0, -1e-4, 3e-3, 460.0, -1e5, 1e-7, 0.1])
    x = torch.cat([ties, special, torch.zeros(-(len(ties) + 8) % (KV_HEADS * HEAD_DIM))])
    k = x.view(-1, KV_HEADS, HEAD_DIM).to(DEVICE)
    n = k.shape[0]
    kc, vc = (torch.zeros(n, 1, KV_HEADS, HEAD_DIM, dtype=torch.float8_e4m3fn, device=DEVICE)
              for _ in range(2))
    want_k, want_v = kc.clone(), vc.clone()
    slots = torch.arange(n, device=DEVICE)
    store_kv(k, -k, kc, vc, slots)
    kv_quant.store(want_k, want_v, k, -k, slots)
    assert torch.equal(kc.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8), want_v.view(torch.uint8))


def test_triton_refuses_other_byte_caches():
    kc = torch.zeros(4, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=torch.float8_e5m2, device=DEVICE)
    with pytest.raises(ValueError, match="int8 or fp8"):
        store_kv(torch.zeros(1, KV_HEADS, HEAD_DIM, device=DEVICE), torch.zeros(1, KV_HEADS, HEAD_DIM, device=DEVICE),
                 kc, kc.clone(), torch.zeros(1, dtype=torch.long, device=DEVICE))


def test_fp8_decode_refuses_rows_it_cannot_read_as_words():
    """The decode kernel reads an fp8 cache's rows as int32 words: a cache view whose rows are
    strided, or start off a 4-byte boundary, is refused with a clear error, not read wrong."""
    q = torch.zeros(1, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
    tables = torch.zeros(1, 1, dtype=torch.long, device=DEVICE)
    lens = torch.ones(1, dtype=torch.long, device=DEVICE)
    strided = torch.zeros(4, BLOCK_SIZE, KV_HEADS, 2 * HEAD_DIM, device=DEVICE).to(torch.float8_e4m3fn)[..., ::2]
    n = 4 * BLOCK_SIZE * KV_HEADS * HEAD_DIM
    shifted = torch.zeros(n + 1, device=DEVICE).to(torch.float8_e4m3fn)[1:].view(4, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    for bad in (strided, shifted):
        with pytest.raises(ValueError, match="unit-stride rows starting on 4-byte boundaries"):
            paged_decode(q, bad, bad, tables, lens, 1.0, None, torch.empty_like(q))
