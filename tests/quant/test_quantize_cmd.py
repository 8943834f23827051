"""`nextok quantize`: GPTQ and round-to-nearest checkpoints written in the GPTQ format, and AWQ
checkpoints in AutoAWQ's gemm format, load back bit-exactly; GPTQ's error feedback and AWQ's
scales beat plain rounding where each should; AWQ's folded scales leave the float model's
function unchanged."""
from __future__ import annotations

import json

import pytest
import torch

from nextok.cli import main
from nextok.model import awq, gptq
from nextok.quant import awq_algo
from nextok.quant.gptq_algo import quantize

CONFIG = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
          "tie_word_embeddings": False, "vocab_size": 49152}  # Qwen2: q/k/v biases too


def _defined(tensors: dict, prefix: str) -> torch.Tensor:
    """The float32 weight [out, in] that a GPTQ or AWQ layer's tensors define."""
    if f"{prefix}.g_idx" not in tensors:
        q, z, s = awq._parts(prefix, {p: tensors[f"{prefix}.{p}"] for p in ("qweight", "qzeros", "scales")}, 32)
        return awq.dequantize(q, z, s)
    q, z, s, g_idx = gptq._parts(prefix, {p: tensors[f"{prefix}.{p}"] for p in
                                          ("qweight", "qzeros", "scales", "g_idx")}, 32)
    return gptq.dequantize(q, z, s, g_idx)


@pytest.mark.parametrize("method", ["rtn", "gptq", "awq"])
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
    assert cfg["quantization_config"]["quant_method"] == ("awq" if method == "awq" else "gptq")
    assert cfg["quantization_config"]["group_size"] == 32
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
        for norm in ("input_layernorm", "post_attention_layernorm"):  # AWQ divides them by its scales
            assert torch.equal(getattr(model.layers[layer], norm).weight, tensors[pre + norm + ".weight"])
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


def test_awq_scales_beat_rounding_on_outlier_channels():
    """A few input channels with 20x the activations of the rest: AWQ scales their weight columns
    up before rounding, and the output error drops well below round-to-nearest's."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(128, 256, generator=gen)
    x = torch.randn(2048, 256, generator=gen)
    x[:, torch.randperm(256, generator=gen)[:8]] *= 20
    ref = x @ w.T

    def error(weight, inputs):
        return ((ref - inputs @ awq_algo.fake_quantize(weight, 64).T) ** 2).mean().item()

    s = awq_algo.search_scale(x, x.abs().mean(dim=0), [w], 64)
    rtn, scaled = error(w, x), error(w * s, x / s)
    assert scaled < 0.6 * rtn, f"AWQ {scaled:.2f} vs round-to-nearest {rtn:.2f}"
    clipped = awq_algo.search_clip(x / s, w * s, 64)
    assert error(clipped, x / s) <= scaled  # r = 1 is on the grid: clipping never loses


def test_awq_folds_leave_the_float_model_unchanged(tmp_path, model_path, monkeypatch):
    """With the clip search off, AWQ's scales only move between ops: the float model (MHA, so the
    v -> o_proj fold runs too) gives the same log-probabilities before and after."""
    from types import SimpleNamespace

    from torch import nn

    from nextok import LLM, SamplingParams
    from nextok.quant.awq_quantize import awq_tensors

    src = tmp_path / "mha"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({**CONFIG, "num_key_value_heads": 4}))
    llm = LLM(model=str(src), load_format="dummy", tokenizer=model_path, dtype="float32",
              cpu_kernels=False, gguf_blocks=False, enable_prefix_caching=False, num_kv_blocks=64)
    model = llm.engine.runner.model
    norm_before = model.layers[0].input_layernorm.weight.clone()
    prompts = [llm.get_tokenizer().encode("def add(a, b):\n    return a + b\n" * 3)]
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=3, ignore_eos=True)

    def logprobs():
        out = llm.generate(prompts, params)[0].outputs[0]
        return out.token_ids, torch.tensor([[v for _, v in lp.top] for lp in out.logprobs])
    ids_before, lp_before = logprobs()
    monkeypatch.setattr(awq_algo, "search_clip", lambda x, w, g: w.detach().float().clone())
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith("layers.")}
    awq_tensors(llm, linears, SimpleNamespace(group_size=32, num_calib=4, calib_len=64))
    assert not torch.allclose(model.layers[0].input_layernorm.weight, norm_before)  # scales moved
    ids_after, lp_after = logprobs()
    assert ids_after == ids_before
    torch.testing.assert_close(lp_after, lp_before, rtol=1e-4, atol=1e-4)


def test_bad_group_sizes_are_refused(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(CONFIG))
    assert main(["quantize", str(tmp_path / "o"), "--group-size", "48", "--model", str(src),
                 "--load-format", "dummy"]) != 0
    assert "--group-size must be a multiple of 32" in capsys.readouterr().err
