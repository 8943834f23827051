"""The decoder layers as CUDA runs them, against their unfused torch path, on one paged KV state.

CUDA binds TritonFusedOps (kernels/select.py): add + RMSNorm, SiLU-and-mul, and RoPE, which
writes k and v into the cache itself (the backend then skips its own store). Here a tiny random Qwen2-style model (QKV bias, GQA) prefills
three sequences through the plain torch path, then decodes one token of each (a 3-row step),
once with fused=None and once with the Triton ops (in Triton's interpreter without a GPU).
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from nextok.attention.base import AttentionMetadata, PrefillChunk  # noqa: E402
from nextok.attention.torch_ref import TorchRefBackend, decode_mask  # noqa: E402
from nextok.config import ModelConfig  # noqa: E402
from nextok.kernels.triton.fused import TritonFusedOps  # noqa: E402
from nextok.model.llama import LlamaForCausalLM  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CONFIG = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
          "tie_word_embeddings": False, "vocab_size": 300, "attention_bias": True}
PAGE, LENS = 4, (5, 9, 3)


def _model() -> LlamaForCausalLM:
    model = LlamaForCausalLM(ModelConfig.from_hf_dict(CONFIG), TorchRefBackend(), 128)
    model.init_dummy_weights(seed=3)
    for name, p in model.named_parameters():  # the dummy init zeroes biases and sets norms to 1
        if name.endswith(".bias") or name.endswith("norm.weight"):
            p.data.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.2)
    return model.to(DEVICE).eval()


def _tables():
    tables, start = [], 1  # block 0 left unused, as the block manager reserves it
    for n in LENS:
        blocks = -(-(n + 1) // PAGE)
        tables.append(torch.arange(start, start + blocks))
        start += blocks
    return tables, start


def _slots(table, positions):
    return [int(table[p // PAGE]) * PAGE + p % PAGE for p in positions]


@pytest.mark.parametrize("quant", [None, "int4"])
def test_fused_decode_step_equals_the_torch_path(quant):
    """quant int4: the layers as Int4Linear (on CUDA the W4A16 kernels, in bfloat16)."""
    model, (tables, num_blocks) = _model(), _tables()
    dtype = torch.float32
    if quant:
        from nextok.quant.base import quantize_model
        from nextok.quant.int4 import Int4RoundToNearest

        dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
        model = model.to(dtype)
        assert quantize_model(model, Int4RoundToNearest(group_size=32)) == 4 * CONFIG["num_hidden_layers"]
    cfg = model.config
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, cfg.vocab_size, (n + 1,), generator=gen) for n in LENS]
    kv = [tuple(torch.zeros(num_blocks, PAGE, cfg.num_key_value_heads, cfg.head_dim, device=DEVICE,
                            dtype=dtype) for _ in range(2)) for _ in range(cfg.num_hidden_layers)]
    # Prefill tokens [0, n) of each sequence through the torch path (fused=None).
    ids, pos, slots, chunks, q = [], [], [], [], 0
    for p, n, table in zip(prompts, LENS, tables):
        ids += p[:n].tolist()
        pos += list(range(n))
        slots += _slots(table, range(n))
        chunks.append(PrefillChunk(q, n, n, table.to(DEVICE)))
        q += n
    t = lambda v: torch.tensor(v, device=DEVICE)  # noqa: E731
    with torch.inference_mode():
        model(t(ids), t(pos), kv, AttentionMetadata(t(slots), 0, None, None, None, chunks))
        lens = t([n + 1 for n in LENS])
        width = max(len(tb) for tb in tables)
        block_tables = torch.stack([torch.nn.functional.pad(tb, (0, width - len(tb))) for tb in tables])
        dec = AttentionMetadata(t([_slots(tb, [n])[0] for tb, n in zip(tables, LENS)]), len(LENS),
                                block_tables.to(DEVICE), lens, decode_mask(lens, width * PAGE, None), [])
        last, last_pos = t([int(p[n]) for p, n in zip(prompts, LENS)]), t(list(LENS))
        results = []
        for ops in (None, TritonFusedOps()):
            model.set_fused_ops(ops)
            caches = [(k.clone(), v.clone()) for k, v in kv]
            hidden = model(last, last_pos, caches, dec)
            results.append((model.compute_logits(hidden), caches))
    model.set_fused_ops(None)
    assert not model.layers[0].self_attn.store_kv_in_rope
    (ref_logits, ref_caches), (logits, caches) = results
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(logits.float(), ref_logits.float(), rtol=tol, atol=tol)
    for (k, v), (rk, rv) in zip(caches, ref_caches):  # this step's k, v stored by the RoPE kernel
        torch.testing.assert_close(k.float(), rk.float(), rtol=tol / 10, atol=tol / 10)
        torch.testing.assert_close(v.float(), rv.float(), rtol=tol / 10, atol=tol / 10)
