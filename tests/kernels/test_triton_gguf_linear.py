"""The Triton GGUF kernels (kernels/triton/gguf_linear.py) and their layer (quant/gguf_cuda.py)
equal the loader's float32 dequantization (model/gguf_format.py) then a matmul.

Random valid blocks per type: random nibbles, ints and 6-bit scales, finite small f16 scales.
On CPU in Triton's interpreter (conftest sets TRITON_INTERPRET=1) on small shapes; on CUDA the
same shapes. Tolerance, relative to the output's largest entry: float32 1e-5 (only the
summation order differs from torch's), bfloat16 2e-2 (the output is rounded to bfloat16; on
CUDA the tl.dot path also rounds the dequantized weight to it, as a bfloat16 dense layer does).
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
from nextok.kernels.triton.gguf_linear import MAX_ROWS, TYPES, dequantize, gguf_matmul  # noqa: E402
from nextok.errors import NextokError  # noqa: E402
from nextok.model import gguf_format  # noqa: E402
from nextok.quant import gguf_cuda  # noqa: E402
from nextok.quant.gguf_cuda import KERNEL_ROWS, GGUFLinear  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# ggml type -> byte offsets of its f16 scales (d first; a second one: Q4_1 / Q5_1's m, K-quants'
# dmin)
F16_FIELDS = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}
SCALES = {2: 1e-2, 3: 1e-2, 6: 1e-2, 7: 1e-2, 8: 1e-2, 12: 1e-4, 13: 1e-4, 14: 1e-4}  # |d| below this
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def random_blocks(type_id: int, n: int, k: int, seed=0) -> np.ndarray:
    """Valid random blocks uint8 [n, k / QK * NB]: random bytes, the f16 fields set to finite
    scales in [hi / 10, hi) (the second one, a min, of either sign)."""
    qk, nb, _ = TYPES[type_id]
    rng = np.random.default_rng(zlib.crc32(repr((type_id, n, k, seed)).encode()))
    raw = rng.integers(0, 256, size=(n * k // qk, nb), dtype=np.uint8)
    hi = SCALES[type_id]
    for i, off in enumerate(F16_FIELDS[type_id]):
        v = rng.uniform(hi / 10, hi, (raw.shape[0], 1)) * (rng.choice([-1, 1], (raw.shape[0], 1)) if i else 1)
        raw[:, off:off + 2] = v.astype(np.float16).view(np.uint8)
    return raw.reshape(n, -1)


def reference_weight(raw: np.ndarray, type_id: int, k: int) -> torch.Tensor:
    """The loader's float32 weight [n, k] for these blocks."""
    n = raw.shape[0]
    return gguf_format.dequantize(raw.reshape(-1).copy(), type_id, n * k).view(n, k)


def layer_weight(raw: np.ndarray, type_id: int, k: int, int8: bool = True) -> torch.Tensor:
    """The weight a GGUFLinear holds for these blocks: the loader's, but the K-quants' d * sc and
    dmin * mn rounded to float16 where the layer converts them to the W4A16 layout
    (gguf_cuda.int4_groups) or, with int8, the int8 one (int8_groups)."""
    if type_id in gguf_cuda.INT4_TYPES:
        return groups_weight(*gguf_cuda.int4_groups(type_id, torch.from_numpy(raw), k))
    if int8 and type_id in gguf_cuda.INT8_TYPES:
        return groups_weight(*gguf_cuda.int8_groups(type_id, torch.from_numpy(raw), k))
    return reference_weight(raw, type_id, k)


def groups_weight(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    """float32 W = d * q (+ m) per group of K / d.shape[1] columns: q [n, K], d and m [n, groups]."""
    g = q.shape[1] // d.shape[1]
    w = d.float().repeat_interleave(g, 1) * q.float()
    return w if m is None else w + m.float().repeat_interleave(g, 1)


def assert_scales_rounded(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, ref: torch.Tensor):
    """groups_weight(q, d, m) is ref within float16's rounding of each d and m (2^-11 of each:
    K-quants' d * sc and dmin * mn rounded once; random blocks keep them normal float16s), and
    does round somewhere (so that bound is what is tested)."""
    g = q.shape[1] // d.shape[1]
    bound = 2 ** -11 * d.float().abs().repeat_interleave(g, 1) * q.float().abs()
    if m is not None:
        bound += 2 ** -11 * m.float().abs().repeat_interleave(g, 1)
    err = (groups_weight(q, d, m) - ref).abs()
    assert (err <= bound + 1e-12).all()
    assert err.max() > 0


def assert_matches(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype):
    assert y.dtype == dtype and y.shape == ref.shape
    tol = TOL[dtype]
    torch.testing.assert_close(y.float().cpu(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def _x(rows, k, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=gen).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 3, 16, 40])  # 40: three blocks of rows (16 a block here)
@pytest.mark.parametrize("type_id", list(TYPES))
def test_kernel_equals_dequantize_then_matmul(type_id, rows, dtype):
    n, k = 20, 512  # N: a partial tile of rows; K: two 256-column tiles
    raw = random_blocks(type_id, n, k)
    w = reference_weight(raw, type_id, k)
    blocks = torch.from_numpy(raw).to(DEVICE)
    x = _x(rows, k, dtype)
    bias = (torch.randn(n, generator=torch.Generator().manual_seed(1)) * w.abs().max()).to(DEVICE, dtype)
    assert_matches(gguf_matmul(x, blocks, type_id, k), x.float().cpu() @ w.T, dtype)
    assert_matches(gguf_matmul(x, blocks, type_id, k, bias), x.float().cpu() @ w.T + bias.float().cpu(),
                   dtype)


@pytest.mark.parametrize("type_id", [2, 3, 6, 7, 8])
def test_32_weight_blocks_take_k_in_partial_tiles(type_id):
    n, k = 5, 96  # three 32-weight blocks: less than one 256-column tile
    raw = random_blocks(type_id, n, k)
    w = reference_weight(raw, type_id, k)
    x = _x(2, k, torch.float32)
    assert_matches(gguf_matmul(x, torch.from_numpy(raw).to(DEVICE), type_id, k), x.cpu() @ w.T, torch.float32)


@pytest.mark.parametrize("type_id", list(TYPES))
def test_dequantize_is_the_loaders_weight(type_id):
    """The big-step path's dequantization gives gguf_format's float32 weights bit for bit (the
    same operations in the same order), into a slice of a bigger scratch matrix."""
    n, k = 20, 512
    raw = random_blocks(type_id, n, k)
    scratch = torch.full((n + 3, k), float("nan"), device=DEVICE)
    out = dequantize(torch.from_numpy(raw).to(DEVICE), type_id, k, scratch[2:2 + n])
    assert torch.equal(out.cpu(), reference_weight(raw, type_id, k))
    assert scratch[:2].isnan().all() and scratch[2 + n:].isnan().all()
    bf16 = dequantize(torch.from_numpy(raw).to(DEVICE), type_id, k,
                      torch.empty(n, k, dtype=torch.bfloat16, device=DEVICE))
    # within one bfloat16 step: Triton's interpreter truncates float32 -> bfloat16 (CUDA rounds)
    torch.testing.assert_close(bf16.cpu().float(), reference_weight(raw, type_id, k), rtol=2 ** -7, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,kernel_rows", [(3, None), (KERNEL_ROWS + 1, None), (40, None), (40, "64")])
def test_layer_of_mixed_shards_with_bias(rows, kernel_rows, dtype, monkeypatch):
    """A fused qkv as a *_K_M file stores it: q and k Q4_K (one matrix), v Q6_K (another, its
    blocks kept: int8=False), with a bias. Up to KERNEL_ROWS (or NEXTOK_GGUF_ROWS) rows: the
    kernel, each matrix writing its columns; more: dequantize into the scratch matrix, then one
    matmul."""
    if kernel_rows:
        monkeypatch.setenv("NEXTOK_GGUF_ROWS", kernel_rows)
    k = 256
    shards = [(12, random_blocks(12, 16, k, 0)), (12, random_blocks(12, 8, k, 1)),
              (14, random_blocks(14, 8, k))]
    w = torch.cat([layer_weight(raw, t, k, int8=False) for t, raw in shards])
    bias = torch.randn(32, generator=torch.Generator().manual_seed(2)) * 0.1
    layer = GGUFLinear([(t, torch.from_numpy(raw).to(DEVICE)) for t, raw in shards], k,
                       bias.to(DEVICE), dtype, int8=False)
    assert layer.types == [12, 14] and layer.offsets == [0, 24] and layer.out_features == 32
    assert list(layer.parts) == ["0"] and layer._whole is None  # q + k: W4A16; v: blocks
    assert layer.kernel_rows == (int(kernel_rows) if kernel_rows else KERNEL_ROWS)
    x = _x(rows, k, dtype)
    layer._scratch.fill_(7.0)
    assert_matches(layer(x), x.float().cpu() @ w.T + bias.to(dtype).float(), dtype)
    # the kernel leaves the scratch matrix alone; a dense step dequantizes into it
    assert bool((layer._scratch == 7.0).all()) == (rows <= layer.kernel_rows)


def test_gguf_rows_setting_is_checked(monkeypatch):
    for bad in ("0", "257", "x", "-3"):
        monkeypatch.setenv("NEXTOK_GGUF_ROWS", bad)
        with pytest.raises(NextokError, match=f"NEXTOK_GGUF_ROWS must be a whole number from 1 to {MAX_ROWS}"):
            gguf_cuda.kernel_rows()
    monkeypatch.setenv("NEXTOK_GGUF_ROWS", "48")
    assert gguf_cuda.kernel_rows() == 48


def test_big_steps_with_a_small_scratch_go_in_row_chunks():
    k, n = 256, 40
    raw = random_blocks(13, n, k)
    layer = GGUFLinear([(13, torch.from_numpy(raw).to(DEVICE))], k, None, torch.float32, int8=False)
    layer._scratch = torch.empty(12 * k, device=DEVICE)  # 12 rows of W at a time: 4 chunks
    x = _x(KERNEL_ROWS + 4, k, torch.float32)
    assert_matches(layer(x), x.cpu() @ reference_weight(raw, 13, k).T, torch.float32)


def test_scratch_is_shared_and_grown_at_construction():
    def q8_0_layer(rows):  # its blocks kept (int8=False): a scratch matrix for big steps
        raw = torch.from_numpy(random_blocks(8, rows, 64)).to(DEVICE)
        return GGUFLinear([(8, raw)], 64, None, torch.float32, int8=False)

    gguf_cuda._scratch.clear()
    a, b = q8_0_layer(4), q8_0_layer(2)
    assert b._scratch is a._scratch and a._scratch.numel() == 4 * 64
    c = q8_0_layer(8)
    assert c._scratch.numel() == 8 * 64 and a._scratch.numel() == 4 * 64  # a keeps its own


def test_bad_arguments_give_clear_errors():
    x = _x(1, 64, torch.float32)
    raw = torch.from_numpy(random_blocks(8, 4, 64)).to(DEVICE)
    with pytest.raises(ValueError, match="ggml type 10 has no Triton GGUF kernel"):
        gguf_matmul(x, raw, 10, 64)  # Q2_K
    with pytest.raises(ValueError, match="K = 288 is not a positive multiple of Q4_K's block of 256"):
        gguf_matmul(_x(1, 288, torch.float32), torch.zeros(4, 144, dtype=torch.uint8, device=DEVICE), 12, 288)
    with pytest.raises(ValueError, match=r"Q8_0 blocks for \[4, 64\] must be contiguous uint8 \[4, 68\]"):
        gguf_matmul(x, raw[:, :60], 8, 64)
    with pytest.raises(ValueError, match=f"x must be \\[<= {MAX_ROWS}, 64\\]"):
        gguf_matmul(_x(MAX_ROWS + 1, 64, torch.float32), raw, 8, 64)
    with pytest.raises(ValueError, match="K = 48 is not a positive multiple of Q8_0's block of 32"):
        GGUFLinear([(8, torch.zeros(4, 51, dtype=torch.uint8))], 48, None, torch.float32)


COMPILE_SM90 = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from nextok.kernels.triton import gguf_linear as g

target = GPUTarget("cuda", 90, 32)
ARGS = "K TYPE QK NB S HAS_BIAS USE_DOT IEEE BLOCK_M BLOCK_N".split()
for t, (qk, nb, s) in g.TYPES.items():
    for block_m in (1, 16, 64):  # 1: CUDA cores; 16, 64: tl.dot (64: the blocks past 32 rows)
        dot = block_m > 1
        sig = dict(x_ptr="*bf16", w_ptr="*u8", b_ptr="*bf16", y_ptr="*bf16", M="i32", N="i32",
                   s_xm="i32", s_ym="i32", **{a: "constexpr" for a in ARGS})
        const = dict(K=512, TYPE=t, QK=qk, NB=nb, S=s, HAS_BIAS=True, USE_DOT=dot, IEEE=False,
                     BLOCK_M=block_m, BLOCK_N=32 if dot else 16)
        k = triton.compile(ASTSource(g._gguf_linear_kernel, sig, const), target=target,
                           options=dict(num_warps=4, num_stages=3))
        assert k.asm["cubin"] and ".local" not in k.asm["ptx"], (t, block_m)  # no register spills
    sig = dict(w_ptr="*u8", out_ptr="*bf16", N="i32", s_on="i32",
               **{a: "constexpr" for a in "K TYPE QK NB S BLOCK_N".split()})
    triton.compile(ASTSource(g._dequant_kernel, sig, dict(K=512, TYPE=t, QK=qk, NB=nb, S=s, BLOCK_N=32)),
                   target=target, options=dict(num_warps=4))
print("compiled")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the tests above already ran them on the GPU")
def test_kernels_compile_for_hopper_without_a_gpu():
    """The interpreter runs Python, not the compiler: build every type's kernels for sm_90
    (Triton's own ptxas, no GPU needed), so code that only the compiler rejects fails here."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", COMPILE_SM90], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and "compiled" in out.stdout, out.stderr[-3000:]
