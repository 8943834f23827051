"""The GGUF block matmul with float32 activations (csrc/gguf_matmul.c, gguf_matmul_f32) against the
loader's float32 dequantization. The int8-activation kernel: test_cpu_gguf_int8.py."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nextok.kernels.cpu_gguf_linear import BLOCK_BYTES, GGUFBlockLinear, load_gguf_matmul
from nextok.model.gguf_format import dequantize

pytestmark = pytest.mark.skipif(load_gguf_matmul() is None, reason="no C compiler to build the kernel")


def random_blocks(type_id: int, n: int, k: int, seed: int) -> np.ndarray:
    """Random blocks with realistic scales: [n, k / 32 * bytes] uint8."""
    rng = np.random.default_rng(seed)
    nb = n * k // 32
    raw = rng.integers(0, 256, size=(nb, BLOCK_BYTES[type_id]), dtype=np.uint8)
    d = rng.uniform(1e-3, 5e-2, size=nb).astype(np.float16)
    d[::7] = -d[::7]
    d[5::97] = np.float16(3e-6)  # a subnormal half scale, now and then
    raw[:, 0:2] = d.view(np.uint8).reshape(nb, 2)
    if type_id == 3:  # Q4_1's offset m
        raw[:, 2:4] = rng.uniform(-0.4, 0.1, size=nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(n, -1)


def dequantized(blocks: np.ndarray, type_id: int, n: int, k: int) -> torch.Tensor:
    return dequantize(blocks.reshape(-1).copy(), type_id, n * k).view(n, k)


@pytest.mark.parametrize("type_id", [3, 8])
def test_one_hot_rows_give_back_the_loaders_weights_bit_for_bit(type_id):
    n, k = 40, 96
    blocks = random_blocks(type_id, n, k, seed=type_id)
    w = dequantized(blocks, type_id, n, k)
    layer = GGUFBlockLinear(blocks, type_id, n, k, activations="float32")
    cols = [0, 1, 15, 16, 17, 31, 32, 63, 95]
    x = torch.zeros(len(cols), k)
    x[torch.arange(len(cols)), torch.tensor(cols)] = 1.0
    y = layer(x)  # row i = column cols[i] of W
    assert torch.equal(y, w[:, cols].T.contiguous())


@pytest.mark.parametrize("type_id", [3, 8])
@pytest.mark.parametrize("rows", [1, 3, 8, 13])
def test_matmul_matches_float64_reference(type_id, rows):
    n, k = 200, 576
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
    with pytest.raises(ValueError, match="type"):
        GGUFBlockLinear(blocks, 2, 4, 64)
    with pytest.raises(ValueError, match="multiple"):
        GGUFBlockLinear(blocks, 3, 4, 48)
    with pytest.raises(ValueError, match="bytes"):
        GGUFBlockLinear(blocks[:2], 3, 4, 64)
    layer = GGUFBlockLinear(blocks, 3, 4, 64)
    with pytest.raises(ValueError, match="float32"):
        layer(torch.zeros(2, 64, dtype=torch.float64))
