"""The decode GEMV (kernels/triton/gemv.py) against torch's matmul, and the dense layers' swap to
FusedLinear. On CPU in Triton's interpreter (TRITON_INTERPRET=1, set in conftest) on small
shapes; on a GPU, the same tests at the Llama-3.1-8B shapes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

from nextok.kernels.triton.gemv import MAX_ROWS, gemv  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# (N, K): K not a multiple of the tile (masking), N not a multiple of BLOCK_N
SHAPES = [(4096, 4096), (6144, 4096), (4096, 14336)] if DEV == "cuda" else [(37, 80), (16, 64)]


@pytest.mark.parametrize("m", [1, 3, MAX_ROWS])
@pytest.mark.parametrize("n,k", SHAPES)
# float32 only in the interpreter: on the GPU float32 layers stay on cuBLAS (ops.linear)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16 if DEV == "cuda" else torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_equals_matmul(m, n, k, dtype, with_bias):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(DEV, dtype)
    w = (torch.randn(n, k, generator=g) * 0.05).to(DEV, dtype)
    b = torch.randn(n, generator=g).to(DEV, dtype) if with_bias else None
    y = gemv(x, w, b)
    assert y.shape == (m, n) and y.dtype == dtype
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    # float32 accumulation in both; bf16 output rounding (2^-8 relative) is the tolerance
    tol = 1e-3 if dtype == torch.float32 else 8e-3  # fp16/bf16: the output's rounding
    torch.testing.assert_close(y.float(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_gemv_strided_rows_and_bad_input():
    dt = torch.bfloat16 if DEV == "cuda" else torch.float32
    x = torch.randn(2, 160, device=DEV, dtype=dt)[:, :80]  # rows with stride 160
    w = torch.randn(24, 80, device=DEV, dtype=dt)
    torch.testing.assert_close(gemv(x, w).float(), F.linear(x.float(), w.float()), rtol=1e-2, atol=5e-2)
    with pytest.raises(ValueError, match="unit-stride"):
        gemv(torch.randn(MAX_ROWS + 1, 80, device=DEV, dtype=dt), w)
    with pytest.raises(ValueError):
        gemv(torch.randn(2, 81, device=DEV, dtype=dt), w)


def test_model_dense_layers_go_through_fused_linear():
    """With ops that multiply, every nn.Linear becomes a FusedLinear that holds the same
    Parameters under the same names, and the tied lm_head goes through the ops too."""
    from torch import nn

    from nextok.attention.torch_ref import TorchRefBackend
    from nextok.config import ModelConfig
    from nextok.kernels.triton.fused import TritonFusedOps
    from nextok.model.layers import FusedLinear
    from nextok.model.llama import LlamaForCausalLM

    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "tie_word_embeddings": True, "vocab_size": 100}
    model = LlamaForCausalLM(ModelConfig.from_hf_dict(cfg), TorchRefBackend(), 64)
    model.init_dummy_weights(seed=1)
    before = dict(model.named_parameters())
    hidden = torch.randn(3, 64)
    ref = model.compute_logits(hidden)
    calls = []

    class CountingOps(TritonFusedOps):
        def linear(self, x, weight, bias):
            calls.append(weight.shape)
            return super().linear(x, weight, bias)

    model.set_fused_ops(CountingOps())
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert sum(isinstance(m, FusedLinear) for m in model.modules()) == 2 * 4
    torch.testing.assert_close(model.compute_logits(hidden), ref)
    assert calls == [(100, 64)]  # the tied lm_head
    model.set_fused_ops(None)  # unbound: plain torch matmuls again
    torch.testing.assert_close(model.compute_logits(hidden), ref)
    assert model.layers[0].mlp.down_proj(torch.randn(2, 96)).shape == (2, 64)
