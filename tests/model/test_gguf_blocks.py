"""GGUF weights kept as blocks for decode-sized steps (LlamaForCausalLM.use_gguf_blocks): the
raw blocks come out in HF row order, and a quantized model gives the same logits through them
as through its dequantized float32 weights."""
from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from nextok.attention.base import AttentionMetadata, PrefillChunk  # noqa: E402
from nextok.attention.torch_ref import TorchRefBackend  # noqa: E402
from nextok.config import ModelConfig  # noqa: E402
from nextok.kernels.cpu_gguf_linear import (BLOCK_TYPES, BlockOrDenseLinear, load_gguf_matmul,  # noqa: E402
                                            supported_types)
from nextok.model.gguf_format import dequantize  # noqa: E402
from nextok.model.llama import LlamaForCausalLM  # noqa: E402
from nextok.model.loader import load_checkpoint  # noqa: E402
from tests.model.test_gguf import _llama_permute, _random_blocks, write_gguf  # noqa: E402

pytestmark = pytest.mark.skipif(load_gguf_matmul() is None, reason="no C compiler to build the kernel")
HEADS, KV_HEADS, HIDDEN, FFN, VOCAB = 4, 2, 64, 128, 100


def _tiny_gguf(path, arch: str, v_type=T.Q4_1) -> str:
    """One layer, every matrix quantized (Q4_1, the embedding Q8_0); llama: tied and Q/K rows
    permuted as llama.cpp's converter writes them; qwen2: QKV bias and an untied output."""
    rng = np.random.default_rng(7)
    head_dim = HIDDEN // HEADS

    def q(shape, qtype):
        return gguf.quants.quantize(rng.standard_normal(shape).astype(np.float32) * 0.2, qtype), qtype

    t = {"token_embd.weight": q((VOCAB, HIDDEN), T.Q8_0),
         "output_norm.weight": (np.ones(HIDDEN, np.float32), None),
         "blk.0.attn_norm.weight": (rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32), None),
         "blk.0.ffn_norm.weight": (rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32), None),
         "blk.0.attn_q.weight": q((HEADS * head_dim, HIDDEN), T.Q4_1),
         "blk.0.attn_k.weight": q((KV_HEADS * head_dim, HIDDEN), T.Q4_1),
         "blk.0.attn_v.weight": q((KV_HEADS * head_dim, HIDDEN), v_type),
         "blk.0.attn_output.weight": q((HIDDEN, HEADS * head_dim), T.Q4_1),
         "blk.0.ffn_gate.weight": q((FFN, HIDDEN), T.Q4_1),
         "blk.0.ffn_up.weight": q((FFN, HIDDEN), T.Q4_1),
         "blk.0.ffn_down.weight": q((HIDDEN, FFN), T.Q8_0)}
    if arch == "qwen2":
        t["output.weight"] = q((VOCAB, HIDDEN), T.Q4_1)
        for name, rows in (("attn_q", HEADS), ("attn_k", KV_HEADS), ("attn_v", KV_HEADS)):
            t[f"blk.0.{name}.bias"] = (rng.standard_normal(rows * head_dim).astype(np.float32), None)
    return write_gguf(path, t, arch=arch, heads=HEADS, kv_heads=KV_HEADS)


def _model(path, blocks: bool, activations: str = "float32"):
    ckpt = load_checkpoint(path)
    cfg = ModelConfig.from_hf_dict(ckpt.hf_config)
    model = LlamaForCausalLM(cfg, TorchRefBackend(), max_positions=64)
    model.load_weights(ckpt.weights())
    model.pack_for_cpu(torch.float32)
    swapped = model.use_gguf_blocks(ckpt.blocks(supported_types()), activations=activations) if blocks else 0
    return model.eval(), cfg, swapped


def _logits(model, cfg, ids):
    """Prefill `ids` into a fresh pool; logits of every position."""
    bs = 16
    nblocks = 2 + -(-len(ids) // bs)  # slots from 16 on
    caches = [(torch.zeros(nblocks, bs, cfg.num_key_value_heads, cfg.head_dim),
               torch.zeros(nblocks, bs, cfg.num_key_value_heads, cfg.head_dim))]
    meta = AttentionMetadata(slot_mapping=torch.arange(bs, bs + len(ids)), num_decode=0,
                             decode_block_tables=None, decode_context_lens=None, decode_mask=None,
                             prefills=[PrefillChunk(0, len(ids), len(ids), torch.tensor([1]))])
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), caches, meta)
        return model.compute_logits(hidden)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_block_path_gives_the_dequantized_models_logits(tmp_path, arch):
    """float32 activations: the same weights, only the summation order differs."""
    path = _tiny_gguf(tmp_path / f"{arch}.gguf", arch)
    dense, cfg, _ = _model(path, blocks=False)
    packed, _, swapped = _model(path, blocks=True, activations="float32")
    assert swapped == 4 + 1  # qkv, o, gate_up, down + the lm_head (tied or not)
    assert isinstance(packed.lm_head, BlockOrDenseLinear)
    for ids in ([5], [3, 17, 42, 99, 0, 8, 61, 23]):
        torch.testing.assert_close(_logits(packed, cfg, ids), _logits(dense, cfg, ids), rtol=1e-4, atol=1e-4)
    long = list(range(20))  # 20 rows: the dense layers
    torch.testing.assert_close(_logits(packed, cfg, long), _logits(dense, cfg, long), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_int8_block_path_is_close_to_the_dequantized_models_logits(tmp_path, arch):
    """int8 activations (the default): every linear's input rounded to 8 bits per 32 values."""
    path = _tiny_gguf(tmp_path / f"{arch}.gguf", arch)
    dense, cfg, _ = _model(path, blocks=False)
    packed, _, _ = _model(path, blocks=True, activations="int8")
    assert packed.lm_head.blocks.activations == "int8"
    for ids in ([5], [3, 17, 42, 99, 0, 8, 61, 23]):
        a, b = _logits(packed, cfg, ids), _logits(dense, cfg, ids)
        assert (a - b).norm() / b.norm() < 5e-2  # measured 1.3-2.0%
    rows = packed.lm_head.max_rows + 1  # the dense layers take over, exact
    assert rows > 8
    long = [i % 50 for i in range(rows)]
    torch.testing.assert_close(_logits(packed, cfg, long), _logits(dense, cfg, long), rtol=1e-4, atol=1e-4)


def test_a_fused_matrix_of_mixed_types_holds_one_part_per_type(tmp_path):
    path = _tiny_gguf(tmp_path / "mixed.gguf", "llama", v_type=T.Q8_0)  # q, k Q4_1; v Q8_0
    dense, cfg, _ = _model(path, blocks=False)
    model, _, swapped = _model(path, blocks=True)
    assert swapped == 4 + 1
    assert model.layers[0].self_attn.qkv_proj.blocks.types == (T.Q4_1, T.Q8_0)
    for ids in ([5], [3, 17, 42, 99, 0, 8, 61, 23]):
        torch.testing.assert_close(_logits(model, cfg, ids), _logits(dense, cfg, ids), rtol=1e-4, atol=1e-4)


def _k_quant_gguf(path) -> str:
    """What a Q4_K_M file holds, on a model wide enough for 256-weight super-blocks: q, k Q4_K and
    v Q6_K (one fused matrix of two types), o Q5_K, gate Q4_K and up Q5_0, down Q6_K, the tied
    embedding Q8_0. Random blocks (gguf cannot quantize K-quants) with sane f16 scales."""
    rng = np.random.default_rng(3)
    hidden, ffn, heads, kv_heads = 256, 512, 4, 2
    head_dim = hidden // heads

    def k_quant(rows, cols, qtype):
        return _random_blocks(qtype, rows, cols, rng), qtype

    def q(shape, qtype):
        return gguf.quants.quantize(rng.standard_normal(shape).astype(np.float32) * 0.1, qtype), qtype

    t = {"token_embd.weight": q((VOCAB, hidden), T.Q8_0),
         "output_norm.weight": (np.ones(hidden, np.float32), None),
         "blk.0.attn_norm.weight": (np.ones(hidden, np.float32), None),
         "blk.0.ffn_norm.weight": (np.ones(hidden, np.float32), None),
         "blk.0.attn_q.weight": k_quant(heads * head_dim, hidden, T.Q4_K),
         "blk.0.attn_k.weight": k_quant(kv_heads * head_dim, hidden, T.Q4_K),
         "blk.0.attn_v.weight": k_quant(kv_heads * head_dim, hidden, T.Q6_K),
         "blk.0.attn_output.weight": k_quant(hidden, heads * head_dim, T.Q5_K),
         "blk.0.ffn_gate.weight": k_quant(ffn, hidden, T.Q4_K),
         "blk.0.ffn_up.weight": q((ffn, hidden), T.Q5_0),
         "blk.0.ffn_down.weight": k_quant(hidden, ffn, T.Q6_K)}
    return write_gguf(path, t, heads=heads, kv_heads=kv_heads, hidden=hidden, ffn=ffn)


@pytest.mark.parametrize("activations", ["float32", "int8"])
def test_k_quant_blocks_give_the_dequantized_models_logits(tmp_path, activations):
    path = _k_quant_gguf(tmp_path / "k.gguf")
    dense, cfg, _ = _model(path, blocks=False)
    packed, _, swapped = _model(path, blocks=True, activations=activations)
    attn, mlp = packed.layers[0].self_attn, packed.layers[0].mlp
    assert swapped == 4 + 1
    assert attn.qkv_proj.blocks.types == (T.Q4_K, T.Q6_K) and attn.o_proj.blocks.types == (T.Q5_K,)
    assert mlp.gate_up_proj.blocks.types == (T.Q4_K, T.Q5_0) and mlp.down_proj.blocks.types == (T.Q6_K,)
    for ids in ([5], [3, 17, 42, 99, 0, 8, 61, 23]):
        a, b = _logits(packed, cfg, ids), _logits(dense, cfg, ids)
        if activations == "float32":  # the same weights, another summation order
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        else:
            assert (a - b).norm() / b.norm() < 5e-2


def test_real_blocks_dequantize_to_the_loaders_weights(model_path):
    ckpt = load_checkpoint(model_path)
    wanted = {"model.layers.2.self_attn.q_proj.weight", "model.layers.2.self_attn.k_proj.weight",
              "model.layers.2.self_attn.v_proj.weight", "model.embed_tokens.weight"}
    weights = {n: w for n, w in ckpt.weights() if n in wanted}
    seen = 0
    for name, type_id, raw in ckpt.blocks(supported_types()):
        if name in wanted:
            per_block, nbytes, _ = BLOCK_TYPES[type_id]
            w = dequantize(raw.numpy().reshape(-1).copy(), type_id, raw.shape[0] * raw.shape[1]
                           // nbytes * per_block).view(raw.shape[0], -1)
            assert torch.equal(w, weights[name]), name  # q/k: the rows unpermuted as blocks
            seen += 1
    assert seen == len(wanted)
