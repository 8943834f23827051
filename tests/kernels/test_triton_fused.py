"""kernels/triton/fused.py against kernels/ref.py, and kernels/ref.py against the model's unfused
torch path (RMSNorm / SwiGLU with fused=None, RotaryEmbedding.rotate).

On CUDA at the real models' shapes; without a GPU in Triton's interpreter on small ones.
"""
from __future__ import annotations

import zlib

import pytest
import torch

from nextok.kernels.ref import RefFusedOps
from nextok.model.layers import RMSNorm, RotaryEmbedding, SwiGLU

triton = pytest.importorskip("triton")
from nextok.kernels.triton.fused import TritonFusedOps  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ROWS = [1, 3, 40]
# Hidden sizes: SmolLM2 576, Qwen2.5-1.5B 1536, Qwen2.5-7B 3584, Llama-3.1-8B 4096 (all but the last
# not a power of two: a masked tail); the interpreter gets two small ones.
DIMS = [576, 1536, 3584, 4096] if CUDA else [576, 100]
INTER = [8960, 14336] if CUDA else [96, 200]
# (q heads, kv heads, head_dim): Llama-3.1-8B, Qwen2.5-1.5B; head_dim 80: a masked half-head;
# 20 + 4 heads of 64: a second, partly masked block of heads.
HEADS = [(32, 8, 128), (12, 2, 128), (32, 32, 80)] if CUDA else [(6, 2, 64), (3, 1, 80), (20, 4, 64)]
REF, TRI = RefFusedOps(), TritonFusedOps()


def _gen(*seed) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(seed).encode()))


def _randn(gen, *shape, dtype, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(DEVICE, dtype)


# A rounding tipped the other way (by the norm's summation order, or the last bit of the GPU's
# exp) and carried through one more rounding: 2 ulps. torch's float16 default (1e-3) is ~1 ulp.
RTOL = {torch.float32: 1.3e-6, torch.bfloat16: 1.6e-2, torch.float16: 4e-3}


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, max_mismatch: float = 0.01):
    """Close to a couple of ulps; below float32 also bit-equal but for a few elements."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=RTOL[actual.dtype], atol=1e-5)
    if actual.dtype != torch.float32:
        assert (actual != expected).float().mean().item() <= max_mismatch


# ---- the reference is the model's unfused path, bit for bit ------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_ref_add_rms_norm_equals_rmsnorm_module(dtype, rows):
    gen = _gen("ref-norm", rows)
    norm = RMSNorm(576, 1e-6)
    norm.weight.data = torch.randn(576, generator=gen) * 0.3 + 1
    norm = norm.to(DEVICE, dtype)
    x, res = _randn(gen, rows, 576, dtype=dtype), _randn(gen, rows, 576, dtype=dtype, scale=4)
    plain = norm(x), norm(x, res)
    norm.fused = REF
    fused = norm(x), norm(x, res)
    assert torch.equal(fused[0], plain[0])
    assert torch.equal(fused[1][0], plain[1][0]) and torch.equal(fused[1][1], plain[1][1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_ref_silu_mul_equals_swiglu_module(dtype):
    gen = _gen("ref-silu")
    mlp = SwiGLU(64, 96)
    for p in mlp.parameters():
        p.data = torch.randn(p.shape, generator=gen) * 0.2
    mlp = mlp.to(DEVICE, dtype)
    x = _randn(gen, 7, 64, dtype=dtype)
    plain = mlp(x)
    mlp.fused = REF
    assert torch.equal(mlp(x), plain)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ref_rope_equals_rotary_rotate(dtype):
    heads, kv_heads, d, t = 6, 2, 64, 9
    gen = _gen("ref-rope")
    qkv = _randn(gen, t, (heads + 2 * kv_heads) * d, dtype=dtype)
    cos, sin = _cos_sin(gen, t, d, dtype)
    qk = qkv[:, :(heads + kv_heads) * d].view(t, heads + kv_heads, d)
    expect = RotaryEmbedding.rotate(qk, cos, sin)
    v_before = qkv[:, (heads + kv_heads) * d:].clone()
    REF.rope_neox(qkv, heads + kv_heads, d, cos, sin)
    assert torch.equal(qkv[:, :(heads + kv_heads) * d].view_as(expect), expect)
    assert torch.equal(qkv[:, (heads + kv_heads) * d:], v_before)


def _cos_sin(gen, t, d, dtype):
    # [T, 1, D/2] in the activation dtype, as RotaryEmbedding.table gives them
    angles = torch.rand(t, 1, d // 2, generator=gen) * 100
    return angles.cos().to(DEVICE, dtype), angles.sin().to(DEVICE, dtype)


# ---- the Triton kernels against the reference --------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("rows", ROWS)
def test_add_rms_norm(dtype, dim, rows):
    gen = _gen("norm", dtype, dim, rows)
    x, res = _randn(gen, rows, dim, dtype=dtype), _randn(gen, rows, dim, dtype=dtype, scale=4)
    w = _randn(gen, dim, dtype=dtype, scale=0.3) + 1
    expect_out, expect_res = REF.add_rms_norm(x, res, w, 1e-5)
    out, new_res = TRI.add_rms_norm(x, res, w, 1e-5)
    assert new_res is res and torch.equal(res, expect_res)  # the residual add, in place
    assert_matches(out, expect_out)
    expect_out, _ = REF.add_rms_norm(x, None, w, 1e-5)
    out, same = TRI.add_rms_norm(x, None, w, 1e-5)  # no residual: x itself becomes it
    assert same is x
    assert_matches(out, expect_out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", INTER)
@pytest.mark.parametrize("rows", ROWS)
def test_silu_mul(dtype, inter, rows):
    gate_up = _randn(_gen("silu", dtype, inter, rows), rows, 2 * inter, dtype=dtype, scale=4)
    assert_matches(TRI.silu_mul(gate_up), REF.silu_mul(gate_up))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS, ids=str)
@pytest.mark.parametrize("rows", ROWS)
def test_rope_rotates_q_and_k_heads_in_place(dtype, heads, rows):
    q_heads, kv_heads, d = heads
    gen = _gen("rope", dtype, heads, rows)
    qkv = _randn(gen, rows, (q_heads + 2 * kv_heads) * d, dtype=dtype)
    cos, sin = _cos_sin(gen, rows, d, dtype)
    expect = qkv.clone()
    REF.rope_neox(expect, q_heads + kv_heads, d, cos, sin)
    TRI.rope_neox(qkv, q_heads + kv_heads, d, cos, sin)
    assert_matches(qkv, expect)
    v = slice((q_heads + kv_heads) * d, None)
    assert torch.equal(qkv[:, v], expect[:, v])  # v heads untouched


def test_rope_takes_row_strided_qkv_and_flat_cos_sin():
    # qkv as a column slice of a wider buffer (row stride > width); cos/sin as [T, D/2]
    gen = _gen("rope-strided")
    buf = _randn(gen, 5, 4 * 64 + 32, dtype=torch.float32)
    qkv = buf[:, :4 * 64]
    cos, sin = _cos_sin(gen, 5, 64, torch.float32)
    expect = buf.clone()
    REF.rope_neox(expect[:, :4 * 64], 3, 64, cos, sin)
    TRI.rope_neox(qkv, 3, 64, cos.view(5, 32), sin.view(5, 32))
    torch.testing.assert_close(buf, expect)
    assert torch.equal(buf[:, 3 * 64:], expect[:, 3 * 64:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS, ids=str)
def test_rope_and_kv_store_in_one_launch(dtype, heads):
    """rope_neox_store_kv = rope_neox, then the rotated k heads and the v heads of each row into
    the paged caches at its slot; slot -1 (a CUDA-graph padding row) is written nowhere."""
    q_heads, kv_heads, d = heads
    rows, page, blocks = 5, 3, 4
    gen = _gen("rope-store", dtype, heads)
    qkv = _randn(gen, rows, (q_heads + 2 * kv_heads) * d, dtype=dtype)
    cos, sin = _cos_sin(gen, rows, d, dtype)
    caches = [_randn(gen, blocks, page, kv_heads, d, dtype=dtype) for _ in range(2)]
    slots = torch.tensor([4, 0, -1, 11, 7], device=DEVICE)
    want_qkv, want, orig = qkv.clone(), [c.clone() for c in caches], [c.clone() for c in caches]
    REF.rope_neox_store_kv(want_qkv, q_heads, kv_heads, d, cos, sin, *want, slots)
    TRI.rope_neox_store_kv(qkv, q_heads, kv_heads, d, cos, sin, *caches, slots)
    assert_matches(qkv, want_qkv)
    assert torch.equal(caches[1], want[1])  # v: copied, not computed
    assert_matches(caches[0], want[0])
    untouched = torch.ones(blocks * page, dtype=torch.bool, device=DEVICE)
    untouched[[4, 0, 11, 7]] = False
    for got, before in zip(caches, orig):
        assert torch.equal(got.view(-1, kv_heads, d)[untouched], before.view(-1, kv_heads, d)[untouched])
    k = want_qkv[:, q_heads * d:(q_heads + kv_heads) * d].reshape(rows, kv_heads, d)
    assert torch.equal(want[0].view(-1, kv_heads, d)[11], k[3])  # the reference stores the rotated k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_and_kv_store_into_fp8_caches(dtype):
    """With fp8 caches (e4m3 rows without a scale, attention/kv_quant.py) the same launch stores
    clamp(x, -448, 448) cast to e4m3 (nearest even) of the rotated k and of v: the bytes the
    torch store (kv_quant.store) writes for them, here and in the reference ops."""
    from nextok.attention import kv_quant

    q_heads, kv_heads, d = HEADS[0]
    rows, page, blocks = 5, 3, 4
    gen = _gen("rope-store-fp8", dtype)
    qkv = _randn(gen, rows, (q_heads + 2 * kv_heads) * d, dtype=dtype, scale=4.0)
    qkv[1, -3:] = torch.tensor([1000.0, -500.0, 0.001])  # v values past e4m3's range, and small
    cos, sin = _cos_sin(gen, rows, d, dtype)
    caches = [torch.zeros(blocks, page, kv_heads, d, dtype=torch.float8_e4m3fn, device=DEVICE)
              for _ in range(2)]
    ref_caches = [c.clone() for c in caches]
    slots = torch.tensor([4, 0, -1, 11, 7], device=DEVICE)
    ref_qkv = qkv.clone()
    TRI.rope_neox_store_kv(qkv, q_heads, kv_heads, d, cos, sin, *caches, slots)
    REF.rope_neox_store_kv(ref_qkv, q_heads, kv_heads, d, cos, sin, *ref_caches, slots)
    want = [torch.zeros_like(c) for c in caches]
    kv = qkv[:, q_heads * d:].reshape(rows, 2, kv_heads, d)  # the kernel's own rotated k, and v
    kv_quant.store(*want, kv[:, 0], kv[:, 1], slots)
    for got, ref, exact in zip(caches, ref_caches, want):
        assert torch.equal(got.view(torch.uint8), exact.view(torch.uint8))
        # the reference rotates with torch's roundings (the same bits but for a rare tie)
        assert (got.view(torch.uint8) != ref.view(torch.uint8)).float().mean() < 0.01
    assert caches[1].view(-1, kv_heads, d)[0, -1, -3:].float().tolist() == [448.0, -448.0, 2 ** -9]


def test_fused_ops_for_binds_once_per_device_and_dtype():
    from nextok.kernels.cpu_fused import FusedOps, load_fused_ops
    from nextok.kernels.select import fused_ops_for

    cpu_ops = fused_ops_for(torch.device("cpu"), torch.float32)
    assert cpu_ops is load_fused_ops() and (cpu_ops is None or isinstance(cpu_ops, FusedOps))
    assert fused_ops_for(torch.device("cpu"), torch.bfloat16) is cpu_ops  # the C kernels take bf16 too
    assert fused_ops_for(torch.device("cpu"), torch.float16) is None
    assert fused_ops_for(torch.device("meta"), torch.float32) is None
    if CUDA:
        assert isinstance(fused_ops_for(torch.device("cuda"), torch.bfloat16), TritonFusedOps)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_ops_replay_in_a_cuda_graph():
    gen = _gen("graph")
    x, res = (_randn(gen, 32, 4096, dtype=torch.bfloat16) for _ in range(2))
    w = _randn(gen, 4096, dtype=torch.bfloat16)
    gate_up = _randn(gen, 32, 2 * 14336, dtype=torch.bfloat16)
    qkv = _randn(gen, 32, 48 * 128, dtype=torch.bfloat16)
    cos, sin = _cos_sin(gen, 32, 128, torch.bfloat16)
    inputs = [x, res, gate_up, qkv]
    saved = [t.clone() for t in inputs]

    def step():
        out, _ = TRI.add_rms_norm(x, res, w, 1e-5)
        TRI.rope_neox(qkv, 40, 128, cos, sin)
        return out, TRI.silu_mul(gate_up)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    for t, s in zip(inputs, saved):
        t.copy_(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for t, s in zip(inputs, saved):
        t.copy_(s)
    graph.replay()
    expect_out, expect_res = REF.add_rms_norm(saved[0], saved[1].clone(), w, 1e-5)
    assert_matches(outs[0], expect_out)
    assert torch.equal(res, expect_res)
    assert_matches(outs[1], REF.silu_mul(saved[2]))
    expect_qkv = saved[3].clone()
    REF.rope_neox(expect_qkv, 40, 128, cos, sin)
    assert_matches(qkv, expect_qkv)
