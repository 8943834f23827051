"""GGUF Q8_0 / Q5_0 / Q5_1 / Q5_K / Q6_K matrices on CUDA become W8A16 layers with group scales
(quant/gguf_cuda.py int8_groups, GGUFLinear): their weight is the loader's (model/gguf_format.py),
exactly for Q8_0, Q5_0 and Q5_1 and within float16's rounding of the K-quants' sub-block scales
(and mins), and the layer gives what that weight gives. On CPU the Int8Linear runs its torch
path; on CUDA the W8A16 kernel."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from nextok.quant.gguf_cuda import INT8_TYPES, GGUFLinear, int8_groups  # noqa: E402
from nextok.quant.int4 import Int4Linear  # noqa: E402
from nextok.quant.int8 import Int8Linear  # noqa: E402
from tests.kernels.test_triton_gguf_linear import (DEVICE, _x, assert_matches, assert_scales_rounded,  # noqa: E402
                                                   groups_weight, layer_weight, random_blocks,
                                                   reference_weight)

GROUP = {8: 32, 6: 32, 7: 32, 13: 32, 14: 16}
Q_RANGE = {8: (-128, 127), 6: (-16, 15), 7: (0, 31), 13: (0, 31), 14: (-32, 31)}


@pytest.mark.parametrize("type_id", [8, 6, 7])
def test_32_weight_blocks_convert_exactly(type_id):
    n, k = 12, 512
    raw = random_blocks(type_id, n, k)
    q, d, m = int8_groups(type_id, torch.from_numpy(raw), k)
    lo, hi = Q_RANGE[type_id]
    assert q.dtype == torch.int8 and q.shape == (n, k) and int(q.min()) >= lo and int(q.max()) <= hi
    assert int(q.min()) == lo and int(q.max()) == hi  # random bytes reach both ends: every bit read
    assert d.dtype == torch.float16 and d.shape == (n, k // 32) and (m is None) == (type_id != 7)
    assert torch.equal(groups_weight(q, d, m), reference_weight(raw, type_id, k))


@pytest.mark.parametrize("type_id", [13, 14])
def test_k_quants_convert_within_float16_rounding_of_their_scales(type_id):
    n, k = 12, 512
    raw = random_blocks(type_id, n, k)
    q, d, m = int8_groups(type_id, torch.from_numpy(raw), k)
    g, (lo, hi) = GROUP[type_id], Q_RANGE[type_id]
    assert d.shape == (n, k // g) and (m is None) == (type_id == 14)
    assert int(q.min()) == lo and int(q.max()) == hi
    assert_scales_rounded(q, d, m, reference_weight(raw, type_id, k))


def test_other_types_are_refused():
    with pytest.raises(ValueError, match="Q4_K blocks are not int8 groups"):
        int8_groups(12, torch.from_numpy(random_blocks(12, 2, 256)), 256)
    assert set(INT8_TYPES) == set(GROUP)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 40])
def test_a_k_m_qkv_is_an_int4_and_an_int8_part(rows, dtype):
    """A fused qkv as a *_K_M file stores it: q and k Q4_K, v Q6_K, with a bias: a W4A16 part and
    a W8A16 part, no blocks, no scratch matrix; each writes its columns."""
    k = 256
    shards = [(12, random_blocks(12, 16, k, 0)), (12, random_blocks(12, 8, k, 1)), (14, random_blocks(14, 8, k))]
    bias = torch.randn(32, generator=torch.Generator().manual_seed(2)) * 0.1
    layer = GGUFLinear([(t, torch.from_numpy(raw).to(DEVICE)) for t, raw in shards], k, bias.to(DEVICE), dtype)
    assert layer.types == [12, 14] and layer._whole is None and layer._scratch is None
    assert isinstance(layer.parts["0"], Int4Linear) and isinstance(layer.parts["1"], Int8Linear)
    assert layer.parts["1"].group == 16 and "Q4_K (W4A16)+Q6_K (W8A16)" in repr(layer)
    assert not [name for name, _ in layer.named_buffers() if name.startswith("blocks")]
    w = torch.cat([layer_weight(raw, t, k) for t, raw in shards])
    x = _x(rows, k, dtype)
    assert_matches(layer(x), x.float().cpu() @ w.T + bias.to(dtype).float(), dtype)


@pytest.mark.parametrize("type_id", [8, 13])
def test_a_single_type_layer_is_one_int8_linear(type_id):
    """A Q8_0 (or Q5_K, with mins) down projection: one Int8Linear; forward_silu_mul takes
    silu_mul first, then that layer."""
    k = 512
    raw = random_blocks(type_id, 24, k)
    layer = GGUFLinear([(type_id, torch.from_numpy(raw).to(DEVICE))], k, None, torch.bfloat16)
    assert isinstance(layer._whole, Int8Linear) and layer._scratch is None
    w = layer_weight(raw, type_id, k)

    class Ops:  # the fused ops' silu_mul, as the engine's SwiGLU hands it over
        @staticmethod
        def silu_mul(gu):
            g, u = gu.chunk(2, dim=-1)
            return torch.nn.functional.silu(g) * u

    gate_up = _x(3, 2 * k, torch.bfloat16, seed=3)
    act = Ops.silu_mul(gate_up)
    assert_matches(layer.forward_silu_mul(gate_up, Ops), act.float().cpu() @ w.T, torch.bfloat16)


def test_int8_off_keeps_the_blocks():
    k = 256
    raw = random_blocks(14, 8, k)
    layer = GGUFLinear([(14, torch.from_numpy(raw).to(DEVICE))], k, None, torch.float32, int8=False)
    assert not layer.parts and layer._whole is None and layer.blocks0.shape == raw.shape
    x = _x(3, k, torch.float32)
    assert_matches(layer(x), x.cpu() @ reference_weight(raw, 14, k).T, torch.float32)
