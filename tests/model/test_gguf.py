"""GGUF reading: the real SmolLM2 file against transformers, each block format against
gguf.quants' reference dequantizer, and every broken-file case against ModelLoadError."""
from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from nextok.errors import ModelLoadError  # noqa: E402
from nextok.model.gguf import GGUFFile, unpermute_rows  # noqa: E402

# ---- the real model --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real(model_path):
    start = time.perf_counter()
    g = GGUFFile(model_path)
    weights = dict(g.tensors())
    print(f"\nGGUF header + dequantize all tensors: {time.perf_counter() - start:.2f} s")
    return g, weights


@pytest.fixture(scope="module")
def hf_state(hf_model):
    return hf_model.state_dict()


def test_real_config(real):
    g, _ = real
    cfg = g.hf_config()
    assert g.architecture == "llama"
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]) == (30, 576, 1536)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert cfg["vocab_size"] == 49152 == len(g.metadata["tokenizer.ggml.tokens"])
    assert cfg["rope_theta"] == 100000.0 and cfg["rope_scaling"] is None
    assert cfg["rms_norm_eps"] == pytest.approx(1e-5)
    assert cfg["tie_word_embeddings"] is True and cfg["max_position_embeddings"] == 8192
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    from nextok.config import ModelConfig

    assert ModelConfig.from_hf_dict(cfg).head_dim == 64


def test_real_tensors_match_transformers(real, hf_state):
    _, ours = real
    theirs = {k: v for k, v in hf_state.items() if k != "lm_head.weight"}  # tied copy
    assert set(ours) == set(theirs)
    for name, ref in theirs.items():
        assert ours[name].dtype == torch.float32
        assert ours[name].shape == ref.shape, name
        assert torch.equal(ours[name], ref), name  # q/k included: un-permuted exactly


# ---- tiny files ------------------------------------------------------------------------------
def write_gguf(path, tensors, arch="llama", heads=4, kv_heads=2, extra=None, hidden=64, ffn=128):
    """tensors: {gguf name: (np array, raw ggml type or None)}."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(100)
    for key, value in (extra or {}).items():
        (w.add_string if isinstance(value, str) else w.add_float32)(key, value)
    for name, (arr, raw) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


QUANTIZABLE = [T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]
# gguf can dequantize these but not quantize them: test on random blocks with sane scales
K_QUANTS = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def _random_blocks(qtype, rows, cols, rng):
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows * cols // block, nbytes), dtype=np.uint8)
    for off in K_QUANTS[qtype]:  # f16 scales in [0.001, 0.01): no inf/NaN from random bits
        raw[:, off:off + 2] = rng.uniform(1e-3, 1e-2, (raw.shape[0], 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.fixture(scope="module")
def formats_file(tmp_path_factory):
    """One file with an [8, 512] tensor per type -> ({qtype: our tensor}, {qtype: (bytes, original)})."""
    rng = np.random.default_rng(0)
    tensors, expect = {}, {}
    for i, qtype in enumerate(QUANTIZABLE + list(K_QUANTS)):
        if qtype in K_QUANTS:
            data, original = _random_blocks(qtype, 8, 512, rng), None
        else:
            original = rng.standard_normal((8, 512)).astype(np.float32)
            data = gguf.quants.quantize(original, qtype)
        tensors[f"blk.{i}.ffn_up.weight"] = (data, None if qtype == T.F16 else qtype)
        expect[qtype] = (data, original)
    weights = dict(GGUFFile(write_gguf(tmp_path_factory.mktemp("fmt") / "f.gguf", tensors)).tensors())
    got = {q: weights[f"model.layers.{i}.mlp.up_proj.weight"] for i, q in enumerate(expect)}
    return got, expect


@pytest.mark.parametrize("qtype", QUANTIZABLE + list(K_QUANTS), ids=lambda q: q.name)
def test_dequant_matches_reference(formats_file, qtype):
    got, expect = formats_file
    data, original = expect[qtype]
    ours = got[qtype]
    ref = gguf.quants.dequantize(data, qtype).astype(np.float32)
    assert ours.shape == (8, 512) and ours.dtype == torch.float32
    assert np.array_equal(ours.numpy(), ref.reshape(8, 512))  # bit for bit
    if original is not None:  # and near what was quantized
        tol = {T.F16: 1e-3, T.BF16: 1e-2, T.Q8_0: 0.03, T.Q5_0: 0.25, T.Q5_1: 0.25}.get(qtype, 0.5)
        assert np.abs(ours.numpy() - original).max() < tol


def test_q8_k(tmp_path):
    # gguf has no reference for Q8_K: f32 d | int8 q[256] | int16 bsums[16]; w = d * q
    q = np.arange(-128, 128, dtype=np.int8)
    block = np.concatenate([np.float32(0.5).reshape(1).view(np.uint8), q.view(np.uint8),
                            np.zeros(32, np.uint8)])
    path = write_gguf(tmp_path / "q8k.gguf", {"output_norm.weight": (block, T.Q8_K)})
    (name, w), = GGUFFile(path).tensors()
    assert name == "model.norm.weight" and torch.equal(w, torch.arange(-128, 128) * 0.5)


def _llama_permute(w, n_head):
    # llama.cpp's converter, written independently: rows (h, 2, d/2) -> (h, d/2, 2)
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_llama_qk_unpermuted_qwen2_not(tmp_path):
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((64, 64), np.float32), rng.standard_normal((32, 64), np.float32)
    bias = rng.standard_normal(64).astype(np.float32)
    names = {"blk.0.attn_q.weight": q, "blk.0.attn_k.weight": k}
    llama = {n: (_llama_permute(w, 4 if "attn_q" in n else 2), None) for n, w in names.items()}
    out = dict(GGUFFile(write_gguf(tmp_path / "l.gguf", llama)).tensors())
    assert np.array_equal(out["model.layers.0.self_attn.q_proj.weight"].numpy(), q)
    assert np.array_equal(out["model.layers.0.self_attn.k_proj.weight"].numpy(), k)
    assert torch.equal(unpermute_rows(torch.from_numpy(_llama_permute(bias, 4)), 4),
                       torch.from_numpy(bias))

    qwen = {n: (w, None) for n, w in names.items()} | {"blk.0.attn_q.bias": (bias, None)}
    g = GGUFFile(write_gguf(tmp_path / "q.gguf", qwen, arch="qwen2"))
    cfg = g.hf_config()
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["attention_bias"] is True
    out = dict(g.tensors())
    assert np.array_equal(out["model.layers.0.self_attn.q_proj.weight"].numpy(), q)
    assert np.array_equal(out["model.layers.0.self_attn.q_proj.bias"].numpy(), bias)


def _llama3_factors(head_dim, theta, factor, old=8192, low=1.0, high=4.0):
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def test_rope_freqs_become_llama3_scaling(tmp_path):
    freqs = _llama3_factors(16, 500000.0, 8.0)
    extra = {"llama.rope.freq_base": 500000.0}
    path = write_gguf(tmp_path / "r.gguf", {"rope_freqs.weight": (freqs, None)}, extra=extra)
    scaling = GGUFFile(path).hf_config()["rope_scaling"]
    assert scaling["rope_type"] == "llama3" and scaling["factor"] == 8.0
    assert list(GGUFFile(path).tensors()) == []  # folded into the config, not a weight
    bad = write_gguf(tmp_path / "b.gguf", {"rope_freqs.weight": (freqs * 1.5, None)}, extra=extra)
    with pytest.raises(ModelLoadError, match="rope_freqs"):
        GGUFFile(bad).hf_config()


# ---- errors ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    arr = np.ones((64, 64), np.float32)
    return write_gguf(tmp_path_factory.mktemp("small") / "small.gguf",
                      {"blk.0.ffn_up.weight": (arr, None), "output_norm.weight": (arr[0], None)})


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        GGUFFile(str(tmp_path / "nope.gguf"))


@pytest.mark.parametrize("content", [b"", b"\x00" * 100, b"not a model at all" * 50],
                         ids=["empty", "zeros", "text"])
def test_garbage(tmp_path, content):
    path = tmp_path / "junk.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        GGUFFile(str(path))


def test_truncated(tmp_path, small_gguf):
    data = open(small_gguf, "rb").read()
    data_start = min(info.offset for info in GGUFFile(small_gguf).tensor_infos.values())
    path = tmp_path / "cut.gguf"
    # every cut inside the header, in the padding before the data, and inside the data
    for keep in [*range(4, data_start, 7), data_start, len(data) - 100, len(data) - 1]:
        path.write_bytes(data[:keep])
        with pytest.raises(ModelLoadError, match="truncated") as e:
            GGUFFile(str(path))
        assert str(path) in str(e.value) and "\n" not in str(e.value)
    path.write_bytes(data)
    assert len(list(GGUFFile(str(path)).tensors())) == 2


def test_unsupported_type(tmp_path):
    raw = np.zeros((4, 66), np.uint8)  # 4 IQ2_XXS blocks: 256 weights in 66 bytes each
    path = write_gguf(tmp_path / "iq.gguf", {"blk.0.ffn_up.weight": (raw, T.IQ2_XXS)})
    with pytest.raises(ModelLoadError, match="blk.0.ffn_up.weight has unsupported GGUF type IQ2_XXS"):
        GGUFFile(path)


def test_unsupported_architecture_and_tensor(tmp_path):
    arr = np.ones(64, np.float32)
    g = GGUFFile(write_gguf(tmp_path / "a.gguf", {"output_norm.weight": (arr, None)}, arch="gpt2"))
    with pytest.raises(ModelLoadError, match="unsupported GGUF architecture 'gpt2'"):
        g.hf_config()
    g = GGUFFile(write_gguf(tmp_path / "t.gguf", {"blk.0.attn_qkv.weight": (arr, None)}))
    with pytest.raises(ModelLoadError, match="attn_qkv"):
        g.tensors()
