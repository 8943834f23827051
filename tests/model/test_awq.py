"""AWQ checkpoints (AutoAWQ's "gemm" layout): a tiny random Llama written from the format's
definition loads, dense and as Q4_1 blocks, and matches its dequantized weights; checkpoints
whose tensors contradict their quantization_config are refused, naming the tensor."""
from __future__ import annotations

import json

import pytest
import torch

from nextok.errors import ModelLoadError
from nextok.model import awq

GROUP = 32
CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "tie_word_embeddings": True, "vocab_size": 49152,
          "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": GROUP,
                                  "zero_point": True, "version": "gemm"}}
LINEARS = {"self_attn.q_proj": (64, 64), "self_attn.k_proj": (32, 64), "self_attn.v_proj": (32, 64),
           "self_attn.o_proj": (64, 64), "mlp.gate_proj": (128, 64), "mlp.up_proj": (128, 64),
           "mlp.down_proj": (64, 128)}


def awq_quantize(w: torch.Tensor, group: int):
    """AutoAWQ's zero-point quantization of W [out, in] along input groups ->
    (qweight, qzeros, scales) as it stores them, and the weights they define."""
    out, k = w.shape
    wg = w.T.reshape(k // group, group, out)  # [G, g, out]
    lo, hi = wg.amin(dim=1), wg.amax(dim=1)  # [G, out]
    s = ((hi - lo).clamp(min=1e-5) / 15).to(torch.float16)
    z = torch.round(-lo / s.float()).clamp(0, 15)
    q = (torch.round(wg / s.float().unsqueeze(1)) + z.unsqueeze(1)).clamp(0, 15)  # [G, g, out]
    q = q.reshape(k, out).to(torch.uint8)
    defined = ((q.float().view(k // group, group, out) - z.unsqueeze(1)) * s.float().unsqueeze(1))
    return awq.pack(q), awq.pack(z.to(torch.uint8)), s, defined.reshape(k, out).T.contiguous()


def write_checkpoint(path, mutate=None) -> dict[str, torch.Tensor]:
    """A tiny AWQ checkpoint at `path`; returns each linear's defined float32 weight [out, in]."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    tensors, defined = {"model.embed_tokens.weight": torch.randn(49152, 64, generator=gen) * 0.02,
                        "model.norm.weight": torch.ones(64)}, {}
    for layer in range(2):
        pre = f"model.layers.{layer}."
        tensors[pre + "input_layernorm.weight"] = torch.ones(64)
        tensors[pre + "post_attention_layernorm.weight"] = torch.ones(64)
        for name, shape in LINEARS.items():
            qw, qz, s, w = awq_quantize(torch.randn(*shape, generator=gen) * 0.1, GROUP)
            tensors.update({pre + name + ".qweight": qw, pre + name + ".qzeros": qz,
                            pre + name + ".scales": s})
            defined[pre + name + ".weight"] = w
    if mutate:
        mutate(tensors)
    path.mkdir(exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(CONFIG))
    return defined


def test_pack_is_autoawqs_column_order():
    v = torch.arange(16, dtype=torch.uint8).repeat(2, 1)[:, :8]  # channels 0..7 hold 0..7
    packed = int(awq.pack(v)[0, 0]) & 0xFFFFFFFF
    assert [(packed >> (4 * i)) & 0xF for i in range(8)] == awq.ORDER  # nibble i: channel ORDER[i]
    assert torch.equal(awq.unpack(awq.pack(v)), v)


def test_awq_checkpoint_loads_dense_and_as_blocks(tmp_path, model_path):
    from nextok import LLM, SamplingParams
    from nextok.kernels.cpu_gguf_linear import BlockLinear

    defined = write_checkpoint(tmp_path / "awq")
    common = dict(model=str(tmp_path / "awq"), tokenizer=model_path, dtype="float32", num_kv_blocks=64)
    dense = LLM(cpu_kernels=False, **common)  # plain nn.Linear: the weights can be read back
    attn = dense.engine.runner.model.layers[1].self_attn
    want = torch.cat([defined[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(attn.qkv_proj.weight, want)  # exact: (q - z) * s in float32
    mlp = dense.engine.runner.model.layers[0].mlp
    assert torch.equal(mlp.down_proj.weight, defined["model.layers.0.mlp.down_proj.weight"])
    packed = LLM(gguf_dense_copy=False, **common)
    layer = packed.engine.runner.model.layers[1].self_attn.qkv_proj
    assert isinstance(layer, BlockLinear) and layer.blocks.type_id == 3
    # Q4_1's m = -z * s is rounded to float16: off by at most |z * s| * 2^-11 = 15 * s * 2^-11
    torch.testing.assert_close(layer.blocks.dequantize(), want, rtol=0, atol=15 * 0.1 * 2 ** -10)
    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = [[101, 202, 303, 404], [505, 606]]
    a = [o.outputs[0].token_ids for o in dense.generate(prompts, sp)]
    b = [o.outputs[0].token_ids for o in packed.generate(prompts, sp)]
    assert a == b and len(a[0]) == len(a[1]) == 6  # the blocks' m rounding flips no argmax here


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.__setitem__("model.layers.0.mlp.up_proj.scales",
                             t["model.layers.0.mlp.up_proj.scales"][:1]),
     "'model.layers.0.mlp.up_proj' does not match group_size 32"),
    (lambda t: t.pop("model.layers.1.self_attn.o_proj.qzeros"),
     "lacks model.layers.1.self_attn.o_proj.qzeros"),
    (lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.qweight",
                             t["model.layers.0.self_attn.q_proj.qweight"].float()),
     "qweight and qzeros must be int32"),
])
def test_tensors_that_contradict_the_config_are_refused(tmp_path, model_path, mutate, message):
    from nextok import LLM

    write_checkpoint(tmp_path / "bad", mutate)
    with pytest.raises(ModelLoadError, match=message):
        LLM(model=str(tmp_path / "bad"), tokenizer=model_path, dtype="float32", num_kv_blocks=64)


def test_unsupported_quantization_configs_are_refused(tmp_path):
    from nextok.model.loader import load_checkpoint

    write_checkpoint(tmp_path / "q")
    for qc, message in (({"quant_method": "awq", "bits": 3, "group_size": 32}, "only 4-bit"),
                        ({"quant_method": "bitsandbytes"}, "'bitsandbytes' is not supported")):
        (tmp_path / "q" / "config.json").write_text(json.dumps({**CONFIG, "quantization_config": qc}))
        with pytest.raises(ModelLoadError, match=message):
            load_checkpoint(str(tmp_path / "q"))
