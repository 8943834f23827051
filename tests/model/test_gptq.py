"""GPTQ checkpoints (AutoGPTQ's "gptq" format): a tiny random Llama written from the format's
definition, with and without act-order, loads and matches its dequantized weights."""
from __future__ import annotations

import json

import pytest
import torch

from nextok.errors import ModelLoadError
from nextok.model import gptq

from .test_awq import CONFIG, LINEARS

GROUP = 32


def gptq_quantize(w: torch.Tensor, group: int, act_order: bool, gen: torch.Generator):
    """Round-to-nearest in GPTQ's layout (the algorithm does not matter to the format) ->
    (qweight, qzeros, scales, g_idx) as AutoGPTQ stores them, and the weights they define."""
    out, k = w.shape
    g_idx = torch.arange(k) // group
    if act_order:  # channels quantized in another order: groups are no longer contiguous runs
        g_idx = g_idx[torch.randperm(k, generator=gen)]
    ng = k // group
    lo = torch.stack([w[:, g_idx == g].amin(dim=1) for g in range(ng)], dim=1).clamp(max=0)  # [out, G]
    hi = torch.stack([w[:, g_idx == g].amax(dim=1) for g in range(ng)], dim=1).clamp(min=0)
    s = ((hi - lo).clamp(min=1e-5) / 15).to(torch.float16)
    z = torch.round(-lo / s.float()).clamp(1, 15)  # the format stores z - 1: z = 0 has no form
    q = (torch.round(w / s.float()[:, g_idx]) + z[:, g_idx]).clamp(0, 15).to(torch.uint8)  # [out, in]
    defined = s.float()[:, g_idx] * (q.float() - z[:, g_idx])
    qzeros = gptq.pack_cols((z - 1).to(torch.uint8).T.contiguous())  # stores z - 1
    return gptq.pack_rows(q.T.contiguous()), qzeros, s.T.contiguous(), g_idx.to(torch.int32), defined


def write_checkpoint(path, act_order=False, group=GROUP, mutate=None) -> dict[str, torch.Tensor]:
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(1)
    tensors, defined = {"model.embed_tokens.weight": torch.randn(49152, 64, generator=gen) * 0.02,
                        "model.norm.weight": torch.ones(64)}, {}
    for layer in range(2):
        pre = f"model.layers.{layer}."
        tensors[pre + "input_layernorm.weight"] = torch.ones(64)
        tensors[pre + "post_attention_layernorm.weight"] = torch.ones(64)
        for name, shape in LINEARS.items():
            w = torch.randn(*shape, generator=gen) * 0.1
            qw, qz, s, g_idx, d = gptq_quantize(w, group, act_order, gen)
            tensors.update({pre + name + ".qweight": qw, pre + name + ".qzeros": qz,
                            pre + name + ".scales": s, pre + name + ".g_idx": g_idx})
            defined[pre + name + ".weight"] = d
    if mutate:
        mutate(tensors)
    path.mkdir(exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    qc = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order, "sym": False}
    (path / "config.json").write_text(json.dumps({**CONFIG, "quantization_config": qc}))
    return defined


def test_packing_orders():
    v = torch.arange(16, dtype=torch.uint8).view(16, 1).repeat(1, 3)  # rows 0..15
    assert torch.equal(gptq.unpack_rows(gptq.pack_rows(v)), v)
    assert int(gptq.pack_rows(v)[0, 0]) == 0x76543210  # nibble j of row 0: input channel j
    assert torch.equal(gptq.unpack_cols(gptq.pack_cols(v.T.contiguous())), v.T)


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_checkpoint_loads_dense_and_as_blocks(tmp_path, model_path, act_order):
    from nextok import LLM
    from nextok.kernels.cpu_gguf_linear import BlockLinear

    defined = write_checkpoint(tmp_path / "gptq", act_order)
    common = dict(model=str(tmp_path / "gptq"), tokenizer=model_path, dtype="float32", num_kv_blocks=64)
    dense = LLM(cpu_kernels=False, **common)
    attn = dense.engine.runner.model.layers[1].self_attn
    want = torch.cat([defined[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(attn.qkv_proj.weight, want)
    down = dense.engine.runner.model.layers[0].mlp.down_proj.weight
    assert torch.equal(down, defined["model.layers.0.mlp.down_proj.weight"])
    packed = LLM(gguf_dense_copy=False, **common)
    layer = packed.engine.runner.model.layers[1].self_attn.qkv_proj
    if act_order:  # permuted groups are not runs of blocks: the layer stays dense
        assert not isinstance(layer, BlockLinear)
    else:
        assert isinstance(layer, BlockLinear)
        torch.testing.assert_close(layer.blocks.dequantize(), want, rtol=0, atol=15 * 0.1 * 2 ** -10)


def test_mismatched_gptq_tensors_are_refused(tmp_path, model_path):
    from nextok import LLM

    def drop_groups(t):
        t["model.layers.0.mlp.gate_proj.scales"] = t["model.layers.0.mlp.gate_proj.scales"][:1]

    write_checkpoint(tmp_path / "bad", mutate=drop_groups)
    with pytest.raises(ModelLoadError, match="'model.layers.0.mlp.gate_proj' does not match group_size 32"):
        LLM(model=str(tmp_path / "bad"), tokenizer=model_path, dtype="float32", num_kv_blocks=64)
    cfg = json.loads((tmp_path / "bad" / "config.json").read_text())
    cfg["quantization_config"]["bits"] = 8
    (tmp_path / "bad" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="only 4-bit GPTQ"):
        LLM(model=str(tmp_path / "bad"), tokenizer=model_path, dtype="float32", num_kv_blocks=64)
