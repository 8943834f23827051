"""oneDNN packed linear == F.linear (to float32 rounding), on the shapes and strides a step brings."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from nextok.kernels.cpu_linear import PackedLinear, _ops_work, pack_linears

pytestmark = pytest.mark.skipif(not _ops_work(torch.float32), reason="no oneDNN linear in this torch")


@pytest.mark.parametrize("m", [1, 3, 16, 67])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_equals_linear(m, bias):
    gen = torch.Generator().manual_seed(m)
    lin = nn.Linear(96, 200, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(200, 96, generator=gen))
        if bias:
            lin.bias.copy_(torch.randn(200, generator=gen))
    x = torch.randn(m, 96, generator=gen)
    torch.testing.assert_close(PackedLinear(lin.weight, lin.bias)(x), lin(x), rtol=1e-5, atol=1e-4)


def test_non_contiguous_input():
    lin = nn.Linear(32, 40, bias=False)
    x = torch.randn(5, 64)[:, ::2]  # a strided view, like a split of a fused projection
    torch.testing.assert_close(PackedLinear(lin.weight, None)(x), lin(x), rtol=1e-5, atol=1e-5)


def test_pack_linears_swaps_every_linear_and_keeps_outputs():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 8, bias=False)))
    x = torch.randn(4, 16)
    ref = model(x)
    assert pack_linears(model, torch.float32) == 2
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    torch.testing.assert_close(model(x), ref, rtol=1e-5, atol=1e-5)
