"""csrc/fused_ops.c (residual add + RMSNorm, silu * up, RoPE) against the torch ops it replaces."""
from __future__ import annotations

import pytest
import torch

from nextok.kernels.cpu_fused import load_fused_ops
from nextok.model.layers import RotaryEmbedding

OPS = load_fused_ops()
pytestmark = pytest.mark.skipif(OPS is None, reason="no C compiler to build the kernels")


def _torch_norm(x, w, eps):
    return x * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + eps).float() * w


@pytest.mark.parametrize("rows", [1, 5, 40])  # 40: the multi-threaded path
@pytest.mark.parametrize("dim", [576, 100])  # 100: a tail after the 8-wide loop
def test_add_rms_norm(rows, dim):
    gen = torch.Generator().manual_seed(rows * dim)
    x, res, w = torch.randn(rows, dim, generator=gen), torch.randn(rows, dim, generator=gen), torch.randn(dim, generator=gen)
    expect_res = x + res
    out, new_res = OPS.add_rms_norm(x, res.clone(), w, 1e-5)
    assert torch.equal(new_res, expect_res)
    torch.testing.assert_close(out, _torch_norm(expect_res, w, 1e-5), rtol=1e-5, atol=1e-5)
    out, same = OPS.add_rms_norm(x, None, w, 1e-5)  # no residual: the norm of x, x the residual
    assert same is x
    torch.testing.assert_close(out, _torch_norm(x, w, 1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3, 33])
def test_silu_mul(rows):
    gate_up = torch.randn(rows, 2 * 96, generator=torch.Generator().manual_seed(rows)) * 6
    gate, up = gate_up.split(96, dim=-1)
    torch.testing.assert_close(OPS.silu_mul(gate_up), torch.nn.functional.silu(gate) * up,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 7, 50])
def test_rope_rotates_q_and_k_heads_in_place_and_leaves_v(rows):
    heads, kv_heads, d = 6, 2, 64
    gen = torch.Generator().manual_seed(rows)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d, generator=gen)
    angles = torch.rand(rows, d // 2, generator=gen) * 50
    cos, sin = angles.cos(), angles.sin()
    qk = qkv[:, :(heads + kv_heads) * d].view(rows, heads + kv_heads, d)
    expect = RotaryEmbedding.rotate(qk, cos.unsqueeze(1), sin.unsqueeze(1))
    v_before = qkv[:, (heads + kv_heads) * d:].clone()
    OPS.rope_neox(qkv, heads + kv_heads, d, cos, sin)
    torch.testing.assert_close(qkv[:, :(heads + kv_heads) * d].view_as(expect), expect, rtol=1e-6, atol=1e-6)
    assert torch.equal(qkv[:, (heads + kv_heads) * d:], v_before)


@pytest.mark.parametrize("rows", [1, 40])
def test_bfloat16_kernels_round_where_the_torch_ops_do(rows):
    """bfloat16: the torch path op for op (kernels/ref.py), to within one bf16 rounding of the
    norm (its statistics are summed in another order) and none elsewhere."""
    from nextok.kernels.ref import RefFusedOps

    ref, bf = RefFusedOps(), torch.bfloat16
    gen = torch.Generator().manual_seed(rows)
    x, res, w = (torch.randn(rows, 576, generator=gen).to(bf), torch.randn(rows, 576, generator=gen).to(bf),
                 torch.randn(576, generator=gen).to(bf))
    out, new_res = OPS.add_rms_norm(x, res.clone(), w, 1e-5)
    want, want_res = ref.add_rms_norm(x, res, w, 1e-5)
    assert new_res.dtype == out.dtype == bf and torch.equal(new_res, want_res)
    torch.testing.assert_close(out, want, rtol=2 ** -7, atol=1e-2)
    assert (out != want).float().mean() < 0.02
    gate_up = (torch.randn(rows, 2 * 96, generator=gen) * 6).to(bf)
    assert torch.equal(OPS.silu_mul(gate_up), ref.silu_mul(gate_up))
    qkv = torch.randn(rows, 10 * 64, generator=gen).to(bf)
    angles = torch.rand(rows, 32, generator=gen) * 50
    cos, sin = angles.cos().to(bf), angles.sin().to(bf)
    want_qkv = qkv.clone()
    ref.rope_neox(want_qkv, 8, 64, cos, sin)
    OPS.rope_neox(qkv, 8, 64, cos, sin)
    assert torch.equal(qkv, want_qkv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 6, 40])
def test_rope_and_kv_store_in_one_call(dtype, rows):
    """rope_neox_store_kv: the rotated k heads and the v heads land in the caches' rows at their
    slots (-1: a row not stored), bit for bit what rope_neox and then the reference store write;
    nothing else in the caches changes."""
    from nextok.kernels.ref import store_rotated_kv

    heads, kv_heads, d, blocks, bs = 9, 3, 64, 6, 16
    gen = torch.Generator().manual_seed(rows)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d + 8, generator=gen).to(dtype)[:, :-8]  # strided rows
    angles = torch.rand(rows, d // 2, generator=gen) * 50
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    slots = torch.randperm(blocks * bs, generator=gen)[:rows]
    slots[::5] = -1
    caches = [torch.randn(blocks, bs, kv_heads, d, generator=gen).to(dtype) for _ in range(2)]
    want_qkv, want = qkv.clone(), [c.clone() for c in caches]
    OPS.rope_neox(want_qkv, heads + kv_heads, d, cos, sin)
    store_rotated_kv(want_qkv, heads, kv_heads, d, *want, slots)
    OPS.rope_neox_store_kv(qkv, heads, kv_heads, d, cos, sin, *caches, slots)
    assert torch.equal(qkv, want_qkv)
    assert all(torch.equal(got, w) for got, w in zip(caches, want))
    kept = slots[slots >= 0]
    assert torch.equal(caches[1].view(-1, kv_heads * d)[kept],
                       qkv[slots >= 0, (heads + kv_heads) * d:])  # the v heads, as they came
    before = [c.clone() for c in caches]
    with pytest.raises(IndexError, match="past the cache"):  # nothing written, nothing overrun
        OPS.rope_neox_store_kv(qkv, heads, kv_heads, d, cos, sin, *caches, torch.full((rows,), blocks * bs))
    assert all(torch.equal(c, b) for c, b in zip(caches, before))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("magnitude", [1e-3, 1.0, 300.0])
def test_rope_and_kv_store_into_an_int8_cache_quantize_as_kv_quant(dtype, magnitude):
    """int8 caches (rows of D int8 and a float32 scale): the C store writes the very bytes
    attention/kv_quant.py's store writes for the rotated k and the v heads (so the C decode
    layers and any torch path read the same rows); an all-zero head gets scale 1; a slot past the
    cache writes nothing."""
    from nextok.attention import kv_quant

    heads, kv_heads, d, blocks, bs, rows = 9, 3, 64, 4, 16, 7
    gen = torch.Generator().manual_seed(int(magnitude * 1000))
    qkv = (torch.randn(rows, (heads + 2 * kv_heads) * d + 8, generator=gen) * magnitude).to(dtype)[:, :-8]
    qkv[1, (heads + 1) * d:(heads + 2) * d] = 0  # one k head of zeros
    angles = torch.rand(rows, d // 2, generator=gen) * 50
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    slots = torch.tensor([0, 3, -1, 5, 9, 15, 62])
    got = [torch.zeros(blocks, bs, kv_heads, d + 4, dtype=torch.int8) for _ in range(2)]
    want = [c.clone() for c in got]
    want_qkv = qkv.clone()
    OPS.rope_neox(want_qkv, heads + kv_heads, d, cos, sin)
    k = want_qkv[:, heads * d:(heads + kv_heads) * d].reshape(rows, kv_heads, d)
    v = want_qkv[:, (heads + kv_heads) * d:].reshape(rows, kv_heads, d)
    kv_quant.store(*want, k, v, slots)
    OPS.rope_neox_store_kv(qkv, heads, kv_heads, d, cos, sin, *got, slots)
    assert torch.equal(qkv, want_qkv)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    zero_row = got[0].view(-1, kv_heads, d + 4)[3, 1]
    assert not zero_row[:d].any() and zero_row[d:].view(torch.float32).item() == 1.0
    before = [c.clone() for c in got]
    with pytest.raises(IndexError, match="past the cache"):
        OPS.rope_neox_store_kv(qkv, heads, kv_heads, d, cos, sin, *got, torch.full((rows,), blocks * bs))
    assert all(torch.equal(c, b) for c, b in zip(got, before))


def test_rope_and_kv_store_into_an_fp8_cache_take_the_reference_store():
    from nextok.kernels.ref import RefFusedOps

    heads, kv_heads, d = 4, 2, 32
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(3, (heads + 2 * kv_heads) * d, generator=gen)
    angles = torch.rand(3, d // 2, generator=gen)
    slots = torch.tensor([5, -1, 17])
    got = [torch.zeros(4, 8, kv_heads, d, dtype=torch.float8_e4m3fn) for _ in range(2)]
    want = [c.clone() for c in got]
    want_qkv = qkv.clone()
    RefFusedOps().rope_neox_store_kv(want_qkv, heads, kv_heads, d, angles.cos(), angles.sin(), *want, slots)
    OPS.rope_neox_store_kv(qkv, heads, kv_heads, d, angles.cos(), angles.sin(), *got, slots)
    torch.testing.assert_close(qkv, want_qkv, rtol=1e-6, atol=1e-6)
    assert all(torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want))
    assert got[0].view(torch.uint8).view(-1, kv_heads * d)[5].any()
