"""load_checkpoint on tiny random checkpoints written to temporary directories."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from nextok.errors import ModelLoadError
from nextok.model.loader import load_checkpoint

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "vocab_size": 50, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}


def _tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    h, f, v, kv = 32, 64, 50, 2 * 8  # kv: num_key_value_heads * head_dim

    def rnd(*shape):  # bfloat16, as most HF checkpoints store it: weights() keeps the dtype
        return torch.randn(*shape, generator=gen).to(torch.bfloat16)

    out = {"model.embed_tokens.weight": rnd(v, h), "model.norm.weight": rnd(h),
           "lm_head.weight": rnd(v, h)}
    for i in range(2):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": rnd(h, h), p + "self_attn.k_proj.weight": rnd(kv, h),
                p + "self_attn.v_proj.weight": rnd(kv, h), p + "self_attn.o_proj.weight": rnd(h, h),
                p + "mlp.gate_proj.weight": rnd(f, h), p + "mlp.up_proj.weight": rnd(f, h),
                p + "mlp.down_proj.weight": rnd(h, f), p + "input_layernorm.weight": rnd(h),
                p + "post_attention_layernorm.weight": rnd(h)}
    return out


TENSORS = _tensors()


def _write_config(d, cfg=CONFIG):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return str(d)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    d = _write_config(tmp_path_factory.mktemp("single"))
    save_file(TENSORS, os.path.join(d, "model.safetensors"))
    return d


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    d = _write_config(tmp_path_factory.mktemp("sharded"))
    names = sorted(TENSORS)
    parts = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
             "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in parts.items():
        save_file({k: TENSORS[k] for k in keys}, os.path.join(d, shard))
    weight_map = {k: shard for shard, keys in parts.items() for k in keys}
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return d


def _copy(src, tmp_path) -> str:
    dst = str(tmp_path / "ckpt")
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("layout", ["single", "sharded"])
def test_safetensors_roundtrip(request, layout):
    d = request.getfixturevalue(layout)
    for fmt in ("auto", "safetensors"):
        ckpt = load_checkpoint(d, fmt)
        assert (ckpt.format, ckpt.path, ckpt.hf_config) == ("safetensors", d, CONFIG)
        got = dict(ckpt.weights())
        assert set(got) == set(TENSORS)
        for name, t in got.items():
            assert t.dtype == torch.bfloat16 and torch.equal(t, TENSORS[name]), name
    # a path to the config.json file means its directory
    assert load_checkpoint(os.path.join(d, "config.json")).format == "safetensors"


def test_dummy(tmp_path):
    d = _write_config(tmp_path / "cfg-only")
    for path in (d, os.path.join(d, "config.json")):
        ckpt = load_checkpoint(path, "dummy")
        assert (ckpt.format, ckpt.hf_config) == ("dummy", CONFIG)
        with pytest.raises(ModelLoadError):
            ckpt.weights()
    with pytest.raises(ModelLoadError, match="--load-format dummy"):
        load_checkpoint(d)  # auto: config.json alone is not a checkpoint


def test_gguf_auto_detection(model_path, tmp_path):
    # the real file, and a directory holding only it (a symlink: no 98 MB copy)
    d = tmp_path / "gguf-dir"
    d.mkdir()
    os.symlink(model_path, d / os.path.basename(model_path))
    for path, fmt in ((model_path, "auto"), (model_path, "gguf"), (str(d), "auto")):
        ckpt = load_checkpoint(path, fmt)
        assert ckpt.format == "gguf" and ckpt.path.endswith(".gguf")
        assert ckpt.hf_config["num_hidden_layers"] == 30
    with pytest.raises(ModelLoadError, match="not a checkpoint directory"):
        load_checkpoint(model_path, "safetensors")


def test_errors(single, sharded, tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load_checkpoint(str(tmp_path / "missing"))
    with pytest.raises(ModelLoadError, match="unknown load format 'pickle'"):
        load_checkpoint(single, "pickle")
    with pytest.raises(ModelLoadError, match="holds no model"):
        load_checkpoint(str(tmp_path))  # empty directory

    no_config = _copy(single, tmp_path / "a")
    os.remove(os.path.join(no_config, "config.json"))
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_checkpoint(no_config, "safetensors")

    bad_json = _copy(single, tmp_path / "b")
    with open(os.path.join(bad_json, "config.json"), "w") as f:
        f.write('{"architectures": ["LlamaForCausalLM"], ')
    with pytest.raises(ModelLoadError, match="config.json"):
        load_checkpoint(bad_json)

    missing_shard = _copy(sharded, tmp_path / "c")
    os.remove(os.path.join(missing_shard, "model-00002-of-00002.safetensors"))
    with pytest.raises(ModelLoadError, match="shard not found.*00002"):
        load_checkpoint(missing_shard)

    corrupt = _copy(single, tmp_path / "d")
    path = os.path.join(corrupt, "model.safetensors")
    data = bytearray(open(path, "rb").read())
    data[8:20] = b"{garbage!!!!"  # inside the JSON header
    open(path, "wb").write(bytes(data))
    with pytest.raises(ModelLoadError, match="not a readable safetensors file"):
        load_checkpoint(corrupt)

    truncated = _copy(single, tmp_path / "e")
    path = os.path.join(truncated, "model.safetensors")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-64])
    with pytest.raises(ModelLoadError, match="not a readable safetensors file"):
        load_checkpoint(truncated)


def test_index_lists_absent_tensor(sharded, tmp_path):
    d = _copy(sharded, tmp_path / "f")
    index = os.path.join(d, "model.safetensors.index.json")
    with open(index) as f:
        meta = json.load(f)
    meta["weight_map"]["model.layers.9.extra.weight"] = "model-00001-of-00002.safetensors"
    with open(index, "w") as f:
        json.dump(meta, f)
    with pytest.raises(ModelLoadError, match="model.layers.9.extra.weight"):
        load_checkpoint(d)


def test_loads_into_llama(single):
    """The tiny checkpoint fills every parameter of nextok's Llama, fused q/k/v included."""
    from nextok.attention.torch_ref import TorchRefBackend
    from nextok.config import ModelConfig
    from nextok.model.registry import model_class

    ckpt = load_checkpoint(single)
    mc = ModelConfig.from_hf_dict(ckpt.hf_config)
    model = model_class(mc.architecture)(mc, TorchRefBackend(), max_positions=64)
    model.load_weights(ckpt.weights())
    qkv = model.layers[1].self_attn.qkv_proj.weight
    want = torch.cat([TENSORS[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(qkv, want.float())
    assert np.array_equal(model.lm_head.weight.detach().numpy(),
                          TENSORS["lm_head.weight"].float().numpy())
