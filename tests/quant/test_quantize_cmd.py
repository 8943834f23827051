"""`nextok quantize`: GPTQ and round-to-nearest checkpoints written in the GPTQ format load back
bit-exactly, and GPTQ's error feedback beats plain rounding on correlated inputs."""
from __future__ import annotations

import json

import pytest
import torch

from nextok.cli import main
from nextok.model import gptq
from nextok.quant.gptq_algo import quantize

CONFIG = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
          "tie_word_embeddings": False, "vocab_size": 49152}  # Qwen2: q/k/v biases too


def _defined(tensors: dict, prefix: str) -> torch.Tensor:
    """The float32 weight [out, in] that a GPTQ layer's tensors define."""
    q, z, s, g_idx = gptq._parts(prefix, {p: tensors[f"{prefix}.{p}"] for p in
                                          ("qweight", "qzeros", "scales", "g_idx")}, 32)
    return gptq.dequantize(q, z, s, g_idx)


@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_written_checkpoint_loads_back_bit_exactly(tmp_path, model_path, method):
    from safetensors.torch import load_file

    from nextok import LLM

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(CONFIG))
    out = tmp_path / method
    rc = main(["quantize", str(out), "--method", method, "--group-size", "32", "--num-calib", "4",
               "--calib-len", "64", "--model", str(src), "--load-format", "dummy",
               "--tokenizer", model_path])
    assert rc == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "gptq" and cfg["quantization_config"]["group_size"] == 32
    tensors = load_file(str(out / "model.safetensors"))
    llm = LLM(model=str(out), dtype="float32", cpu_kernels=False, num_kv_blocks=64)
    model = llm.engine.runner.model
    for layer in range(2):
        pre = f"model.layers.{layer}."
        want = torch.cat([_defined(tensors, pre + f"self_attn.{p}_proj") for p in "qkv"])
        assert torch.equal(model.layers[layer].self_attn.qkv_proj.weight, want)
        assert torch.equal(model.layers[layer].self_attn.qkv_proj.bias,
                           torch.cat([tensors[pre + f"self_attn.{p}_proj.bias"] for p in "qkv"]))
        want = torch.cat([_defined(tensors, pre + f"mlp.{p}_proj") for p in ("gate", "up")])
        assert torch.equal(model.layers[layer].mlp.gate_up_proj.weight, want)
        assert torch.equal(model.layers[layer].mlp.down_proj.weight, _defined(tensors, pre + "mlp.down_proj"))
    assert torch.equal(model.lm_head.weight, tensors["lm_head.weight"])  # untied: as loaded
    # and the tokenizer travelled with it
    ref = LLM(model=str(src), load_format="dummy", tokenizer=model_path, num_kv_blocks=64)
    assert llm.get_tokenizer().encode("def f(x):") == ref.get_tokenizer().encode("def f(x):")


def test_gptq_error_feedback_beats_rounding():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(128, 256, generator=gen)
    x = torch.randn(2048, 256, generator=gen) @ torch.randn(256, 256, generator=gen) * 0.3
    h = x.T @ x

    def output_error(q, s, z):
        idx = torch.arange(256) // 64
        return ((x @ (s.float()[:, idx] * (q.float() - z.float()[:, idx]) - w).T) ** 2).mean()

    rtn, ours = output_error(*quantize(w, 64)), output_error(*quantize(w, 64, h))
    assert ours < 0.7 * rtn, f"GPTQ {ours:.1f} vs round-to-nearest {rtn:.1f}"


def test_bad_group_sizes_are_refused(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(CONFIG))
    assert main(["quantize", str(tmp_path / "o"), "--group-size", "48", "--model", str(src),
                 "--load-format", "dummy"]) != 0
    assert "--group-size must be a multiple of 32" in capsys.readouterr().err
