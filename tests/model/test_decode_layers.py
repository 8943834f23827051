"""The C decode layers (kernels/cpu_decode.py) on GGUF files other than the default model's: a
*_K_M file's fused matrices of two block types (K-quants beside Q5_0) and Qwen2's QKV bias. A
decode step through them equals the Python layers' bit for bit: hidden states and caches."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("gguf")

from nextok.attention.base import AttentionMetadata  # noqa: E402
from nextok.attention.torch_ref import TorchRefBackend  # noqa: E402
from nextok.config import ModelConfig  # noqa: E402
from nextok.kernels.cpu_attention import load_paged_decode  # noqa: E402
from nextok.kernels.cpu_fused import load_fused_ops  # noqa: E402
from nextok.kernels.cpu_gguf_linear import supported_types  # noqa: E402
from nextok.model.llama import LlamaForCausalLM  # noqa: E402
from nextok.model.loader import load_checkpoint  # noqa: E402
from tests.model.test_gguf_blocks import _k_quant_gguf, _tiny_gguf  # noqa: E402

pytestmark = pytest.mark.skipif(load_fused_ops() is None or load_paged_decode() is None,
                                reason="no C compiler to build the kernels")


def _model(path, activations, dtype=torch.float32):
    """As the model runner builds a CPU model: fused ops, packed linears, then the blocks."""
    ckpt = load_checkpoint(path)
    cfg = ModelConfig.from_hf_dict(ckpt.hf_config)
    model = LlamaForCausalLM(cfg, TorchRefBackend(load_paged_decode()), max_positions=64)
    model.load_weights(ckpt.weights())
    model.to(dtype)
    model.set_fused_ops(load_fused_ops())
    model.pack_for_cpu(dtype)
    model.use_gguf_blocks(ckpt.blocks(supported_types()), activations=activations)
    return model.eval(), cfg


def _decode_step(model, cfg, rows, use_c, dtype=torch.float32):
    """`rows` sequences decoding one token each over random caches (contexts of 5 + i tokens)."""
    gen = torch.Generator().manual_seed(1)
    bs = 16
    caches = [(torch.randn(2 * rows + 1, bs, cfg.num_key_value_heads, cfg.head_dim, generator=gen).to(dtype),
               torch.randn(2 * rows + 1, bs, cfg.num_key_value_heads, cfg.head_dim, generator=gen).to(dtype))]
    lens = torch.tensor([5 + i for i in range(rows)])
    tables = torch.tensor([[1 + 2 * i, 2 + 2 * i] for i in range(rows)])
    meta = AttentionMetadata(slot_mapping=tables[:, 0] * bs + lens - 1, num_decode=rows,
                             decode_block_tables=tables, decode_context_lens=lens, decode_mask=None,
                             prefills=[])
    bound, calls = model.decode_layers, []
    real_run = bound.run
    bound.run = lambda *a: calls.append(1) or real_run(*a)
    if not use_c:
        model.decode_layers = None
    try:
        with torch.inference_mode():
            hidden = model(torch.arange(3, 3 + rows), lens - 1, caches, meta)
    finally:
        model.decode_layers, bound.run = bound, real_run
    assert len(calls) == int(use_c)  # the step went where it was sent
    return hidden, caches


@pytest.mark.parametrize("activations", ["float32", "int8"])
@pytest.mark.parametrize("kind", ["k_quant", "qwen2", "mixed"])
def test_c_decode_layers_equal_the_python_layers(tmp_path, kind, activations):
    if kind == "k_quant":  # q, k Q4_K + v Q6_K; gate Q4_K + up Q5_0
        path = _k_quant_gguf(tmp_path / "k.gguf")
    else:  # qwen2: QKV bias; mixed: q, k Q4_1 + v Q8_0
        path = _tiny_gguf(tmp_path / f"{kind}.gguf", "qwen2" if kind == "qwen2" else "llama",
                          **({"v_type": 8} if kind == "mixed" else {}))
    model, cfg = _model(path, activations)
    assert model.decode_layers is not None
    parts = model.decode_layers.table[0, 5].item()  # the qkv's parts
    assert parts == (1 if kind == "qwen2" else 2)
    assert (model.decode_layers.table[0, 6] != 0).item() == (kind == "qwen2")  # its bias
    for rows in (1, 3):
        (h_c, caches_c), (h_py, caches_py) = (_decode_step(model, cfg, rows, c) for c in (True, False))
        assert torch.equal(h_c, h_py), (kind, activations, rows)
        assert all(torch.equal(a, b) for pc, pp in zip(caches_c, caches_py) for a, b in zip(pc, pp))



@pytest.mark.parametrize("kind", ["k_quant", "mixed"])
def test_a_bfloat16_models_matrices_of_two_block_types_run_in_c_too(tmp_path, kind):
    """On a bfloat16 model every regrouped part takes bf16 x and gives bf16 y (one call a part),
    so a *_K_M file's two-type qkv and gate_up run in the C layers as well, bit for bit the
    Python layers' step (which convert nothing either: GGUFBlockLinear.bf16_call)."""
    from nextok.kernels.cpu_gguf_linear import _rows16

    if _rows16() is None:
        pytest.skip("no regrouped int8 kernel here: a bfloat16 model's blocks convert x to float32")
    path = (_k_quant_gguf(tmp_path / "k.gguf") if kind == "k_quant"
            else _tiny_gguf(tmp_path / "mixed.gguf", "llama", v_type=8))
    model, cfg = _model(path, "int8", torch.bfloat16)
    assert model.decode_layers is not None and model.decode_layers.table[0, 5].item() == 2
    for rows in (1, 3):
        (h_c, caches_c), (h_py, caches_py) = (_decode_step(model, cfg, rows, c, torch.bfloat16) for c in (True, False))
        assert h_c.dtype == torch.bfloat16 and torch.equal(h_c, h_py), (kind, rows)
        assert all(torch.equal(a, b) for pc, pp in zip(caches_c, caches_py) for a, b in zip(pc, pp))
