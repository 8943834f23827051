"""benchmarks/gpu/xq_probe.py times the one-row W4A16 loop on x made into dp4a operands
beforehand against the engine's kernel: its operands and kernel must give the engine's products
bit for bit, or the comparison times something else."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from benchmarks.gpu.xq_probe import operands, xq_matmul  # noqa: E402
from nextok.kernels.triton import int4_words as words4  # noqa: E402
from nextok.kernels.triton.w4a16 import w4a16  # noqa: E402
from nextok.quant.int4 import pack_words, quantize_groups  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("split", [1, 3])
def test_premade_operands_give_the_engines_products(split):
    gen = torch.Generator().manual_seed(split)
    n, k = 128, 1024
    w = torch.randn(n, k, generator=gen) * k ** -0.5
    q, d, m = quantize_groups(w, 128)
    words, d, m = words4.tile_words(pack_words(q)).to(DEVICE), d.to(DEVICE), m.to(DEVICE)
    x = (torch.randn(1, k, generator=gen) * torch.logspace(-3, 2, k)).to(DEVICE, torch.bfloat16)
    ops, s, xs = operands(x)
    got = xq_matmul(ops, s, xs, words, d, m, words4.LAYOUT, 64, split, 4)
    assert torch.equal(got, w4a16(x, words, d, m, layout=words4.LAYOUT))
