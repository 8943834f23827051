"""The GGUF block matmuls with float32 activations (csrc/gguf_matmul.c for the 32-weight formats,
csrc/gguf_unpacked.c for the K-quants) against the loader's float32 dequantization. The
int8-activation kernels: test_cpu_gguf_int8.py."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nextok.kernels.cpu_gguf_linear import BLOCK_TYPES, GGUFBlockLinear, load_gguf_matmul
from nextok.model.gguf_format import dequantize

pytestmark = pytest.mark.skipif(load_gguf_matmul() is None, reason="no C compiler to build the kernel")


ALL_TYPES = sorted(BLOCK_TYPES)  # Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K
# ggml type -> byte offsets of its f16 scales (d, and dmin / m where it has one)
HALF_SCALES = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}


def random_blocks(type_id: int, n: int, k: int, seed: int) -> np.ndarray:
    """Random blocks with realistic scales: [n, k / block * bytes] uint8. Every other byte (the
    quants, the K-quants' packed 6-bit scales) is random, so every bit pattern gets exercised."""
    rng = np.random.default_rng(seed)
    per_block, nbytes, _ = BLOCK_TYPES[type_id]
    nb = n * k // per_block
    raw = rng.integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    big = per_block == 256  # a K-quant's d multiplies a 6-bit (or int8) sub-scale too
    d = rng.uniform(1e-4, 1e-3, size=nb) if big else rng.uniform(1e-3, 5e-2, size=nb)
    d = d.astype(np.float16)
    d[::7] = -d[::7]
    d[5::97] = np.float16(3e-6)  # a subnormal half scale, now and then
    first, *rest = HALF_SCALES[type_id]
    raw[:, first:first + 2] = d.view(np.uint8).reshape(nb, 2)
    for off in rest:  # Q4_1 / Q5_1's offset m, the K-quants' dmin
        lo, hi = (1e-4, 1e-3) if big else (-0.4, 0.1)
        raw[:, off:off + 2] = rng.uniform(lo, hi, size=nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(n, -1)


def dequantized(blocks: np.ndarray, type_id: int, n: int, k: int) -> torch.Tensor:
    return dequantize(blocks.reshape(-1).copy(), type_id, n * k).view(n, k)


@pytest.mark.parametrize("type_id", ALL_TYPES)
def test_one_hot_rows_give_back_the_loaders_weights_bit_for_bit(type_id):
    n, k = 40, 96 if BLOCK_TYPES[type_id][0] == 32 else 512
    blocks = random_blocks(type_id, n, k, seed=type_id)
    w = dequantized(blocks, type_id, n, k)
    layer = GGUFBlockLinear(blocks, type_id, n, k, activations="float32")
    eye = torch.eye(k)
    y = torch.cat([layer(eye[i:i + 8]) for i in range(0, k, 8)])  # row i = column i of W
    assert torch.equal(y, w.T.contiguous())
    assert torch.equal(layer.dequantize(), w)  # what bigger steps multiply


@pytest.mark.parametrize("type_id", ALL_TYPES)
def test_a_rows_result_does_not_depend_on_the_other_rows(type_id):
    """Batch-invariance: batched decode equals one at a time, speculation on equals off."""
    n, k = 33, 512
    layer = GGUFBlockLinear(random_blocks(type_id, n, k, seed=1), type_id, n, k)
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(2))
    y = layer(x)
    for i in range(8):
        assert torch.equal(layer(x[i:i + 1]), y[i:i + 1])


@pytest.mark.parametrize("type_id", ALL_TYPES)
@pytest.mark.parametrize("rows", [1, 3, 8, 13])
def test_matmul_matches_float64_reference(type_id, rows):
    n, k = 200, 576 if BLOCK_TYPES[type_id][0] == 32 else 1536
    blocks = random_blocks(type_id, n, k, seed=10 + rows)
    w = dequantized(blocks, type_id, n, k).double()
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    bias = torch.randn(n)
    y = GGUFBlockLinear(blocks, type_id, n, k, bias=bias, activations="float32")(x)
    ref = x.double() @ w.T + bias.double()
    assert (y.double() - ref).norm() / ref.norm() < 1e-6


def test_real_model_tensors(model_path):
    from nextok.model.gguf import GGUFFile

    g = GGUFFile(model_path)
    x = torch.randn(4, 576, generator=torch.Generator().manual_seed(0))
    for name in ("blk.0.ffn_gate.weight", "blk.3.attn_v.weight", "token_embd.weight"):
        info = g.tensor_infos[name]
        with open(model_path, "rb") as f:
            f.seek(info.offset)
            raw = np.frombuffer(f.read(info.nbytes), dtype=np.uint8)
        n, k = info.shape
        w = dequantize(raw.copy(), info.type_id, math.prod(info.shape)).view(n, k)
        y = GGUFBlockLinear(raw, info.type_id, n, k, activations="float32")(x)
        ref = x.double() @ w.double().T
        assert (y.double() - ref).norm() / ref.norm() < 1e-6, name


def test_bad_arguments_are_refused():
    blocks = random_blocks(3, 4, 64, seed=0)
    with pytest.raises(ValueError, match="ggml type 10 has no block kernel"):  # Q2_K
        GGUFBlockLinear(blocks, 10, 4, 64)
    with pytest.raises(ValueError, match="multiple"):
        GGUFBlockLinear(blocks, 3, 4, 48)
    with pytest.raises(ValueError, match="in_features 576 is not a multiple of Q4_K's 256-weight block"):
        GGUFBlockLinear(np.zeros(4 * 576 // 256 * 144, np.uint8), 12, 4, 576)
    with pytest.raises(ValueError, match="bytes"):
        GGUFBlockLinear(blocks[:2], 3, 4, 64)
    layer = GGUFBlockLinear(blocks, 3, 4, 64)
    with pytest.raises(ValueError, match="float32"):
        layer(torch.zeros(2, 64, dtype=torch.float64))


def test_a_matrix_of_parts_in_different_types():
    """A fused qkv of a *_K_M file: q and k Q4_K, v Q6_K; each part's rows run by its own kernel."""
    k, rows = 512, {"q": (12, 64), "k": (12, 32), "v": (14, 32)}
    parts = [(t, random_blocks(t, n, k, seed=i), n) for i, (t, n) in enumerate(rows.values())]
    layer = GGUFBlockLinear.of_parts(parts, k, bias=torch.randn(128))
    assert layer.types == (12, 12, 14) and layer.out_features == 128
    w = torch.cat([dequantized(b, t, n, k) for t, b, n in parts])
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(0))
    ref = x.double() @ w.double().T + layer.bias.double()
    assert (layer(x).double() - ref).norm() / ref.norm() < 1e-6
    assert torch.equal(layer.dequantize(), w)
    int8 = GGUFBlockLinear.of_parts(parts, k, bias=layer.bias, activations="int8")
    assert (int8(x).double() - ref).norm() / ref.norm() < 1e-2
