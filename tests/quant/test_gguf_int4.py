"""GGUF Q4_0 / Q4_1 / Q4_K matrices on CUDA become W4A16 layers (quant/gguf_cuda.py int4_groups,
GGUFLinear): their weight is the loader's (model/gguf_format.py), exactly for Q4_0 and Q4_1 and
within float16's rounding of Q4_K's sub-block scales and mins, and the layer gives what that
weight gives. On CPU the Int4Linear runs its torch path; on CUDA the W4A16 kernels."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from nextok.quant import gguf_cuda  # noqa: E402
from nextok.quant.gguf_cuda import GGUFLinear, int4_groups  # noqa: E402
from nextok.quant.int4 import Int4Linear  # noqa: E402
from tests.kernels.test_triton_gguf_linear import (DEVICE, _x, assert_matches, assert_scales_rounded,  # noqa: E402
                                                   groups_weight, layer_weight, random_blocks,
                                                   reference_weight)


@pytest.mark.parametrize("type_id", [2, 3])
def test_q4_0_and_q4_1_convert_exactly(type_id):
    n, k = 12, 512
    raw = random_blocks(type_id, n, k)
    q, d, m = int4_groups(type_id, torch.from_numpy(raw), k)
    assert q.dtype == torch.uint8 and q.shape == (n, k) and int(q.max()) <= 15
    assert d.dtype == m.dtype == torch.float16 and d.shape == m.shape == (n, k // 32)
    assert torch.equal(groups_weight(q, d, m), reference_weight(raw, type_id, k))


def test_q4_k_converts_within_float16_rounding_of_its_scales():
    n, k = 12, 512
    raw = random_blocks(12, n, k)
    q, d, m = int4_groups(12, torch.from_numpy(raw), k)
    assert_scales_rounded(q, d, m, reference_weight(raw, 12, k))


def test_other_types_are_refused():
    with pytest.raises(ValueError, match="Q6_K blocks are not 4-bit d \\* q \\+ m groups"):
        int4_groups(14, torch.from_numpy(random_blocks(14, 2, 256)), 256)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 40])
def test_a_single_q4_k_layer_is_one_int4_linear(rows, dtype):
    """A Q4_K gate_up (two shards, one type): one Int4Linear with the bias, no blocks, no
    scratch; forward and the down projection's forward_silu_mul are that layer's."""
    k = 256
    shards = [(12, random_blocks(12, 16, k, 0)), (12, random_blocks(12, 16, k, 1))]
    bias = torch.randn(32, generator=torch.Generator().manual_seed(2)) * 0.1
    layer = GGUFLinear([(t, torch.from_numpy(raw).to(DEVICE)) for t, raw in shards], k, bias.to(DEVICE), dtype)
    assert isinstance(layer._whole, Int4Linear) and layer._scratch is None
    assert not [name for name, _ in layer.named_buffers() if name.startswith("blocks")]
    w = torch.cat([layer_weight(raw, 12, k) for _, raw in shards])
    x = _x(rows, k, dtype)
    assert_matches(layer(x), x.float().cpu() @ w.T + bias.to(dtype).float(), dtype)

    class Ops:  # the fused ops' silu_mul, as the engine's SwiGLU hands it over
        @staticmethod
        def silu_mul(gu):
            g, u = gu.chunk(2, dim=-1)
            return torch.nn.functional.silu(g) * u

    gate_up = _x(rows, 2 * k, dtype, seed=3)
    assert_matches(layer.forward_silu_mul(gate_up, Ops), Ops.silu_mul(gate_up.float()).cpu() @ w.T
                   + bias.to(dtype).float(), dtype)


def test_int4_off_keeps_the_blocks():
    k = 256
    raw = random_blocks(3, 8, k)
    layer = GGUFLinear([(3, torch.from_numpy(raw).to(DEVICE))], k, None, torch.float32, int4=False)
    assert not layer.parts and layer._whole is None and layer.blocks0.shape == raw.shape
    x = _x(3, k, torch.float32)
    assert_matches(layer(x), x.cpu() @ reference_weight(raw, 3, k).T, torch.float32)
    assert gguf_cuda.INT4_TYPES == (2, 3, 12)
