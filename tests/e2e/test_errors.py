"""Bad input gets a clear error and loses nothing else in flight (real model, float32)."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from nextok import SamplingParams
from nextok.errors import InvalidRequestError, ModelLoadError, NextokError

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _run(engine) -> dict:
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


@pytest.mark.parametrize("prompt, params, message", [
    ("", GREEDY, "prompt is empty"),
    ([], GREEDY, "prompt is empty"),
    ([1, 2, 10**9], GREEDY, "outside the vocabulary"),
    ("x " * 9000, GREEDY, "context window"),
    ("def f():", SamplingParams(max_tokens=8000), "context window"),
    ([1, 2.5, 3], GREEDY, "token ids must be integers, not float"),
    ([[1, 2]], GREEDY, "token ids must be integers, not list"),
    ([True, 5], GREEDY, "token ids must be integers, not bool"),
    ({"text": "def f():"}, GREEDY, "takes one of 'prompt' .* or 'prompt_token_ids'"),
    ({"prompt": "a", "prompt_token_ids": [1]}, GREEDY, "takes one of"),
    (3.5, GREEDY, "a prompt is a string, a list of token ids, or a dict"),
    (None, GREEDY, "got NoneType"),
])
def test_bad_request_is_refused_and_others_finish(llm_f32, prompt, params, message):
    eng = llm_f32.engine
    good = ["def add(a, b):", "SELECT name FROM"]
    ref = [o.outputs[0].token_ids for o in llm_f32.generate(good, GREEDY)]
    eng.add_request("good-0", good[0], GREEDY)
    eng.step()  # the first request is in flight (prefilled) when the bad one arrives
    with pytest.raises(InvalidRequestError, match=message):
        eng.add_request("bad", prompt, params)
    eng.add_request("good-1", good[1], GREEDY)
    done = _run(eng)
    assert [done[f"good-{i}"].outputs[0].token_ids for i in range(2)] == ref
    assert "bad" not in done and not eng.has_unfinished_requests()


def test_prompts_as_vllm_dicts_and_arrays(llm_f32):
    """vLLM's prompt dicts ({"prompt": text}, {"prompt_token_ids": ids}) and ids in a numpy
    array or a tensor give what the plain string and list give."""
    import numpy as np
    import torch

    text = "def add(a, b):"
    ids = llm_f32.get_tokenizer().encode(text)
    want = llm_f32.generate(text, GREEDY)[0].outputs[0].token_ids
    assert llm_f32.generate(ids, GREEDY)[0].outputs[0].token_ids == want
    outs = llm_f32.generate([{"prompt": text}, {"prompt_token_ids": ids}, np.array(ids), torch.tensor(ids)], GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == [want] * 4
    assert outs[0].prompt == text and outs[1].prompt is None and outs[1].prompt_token_ids == ids
    assert llm_f32.generate({"prompt_token_ids": ids}, GREEDY)[0].outputs[0].token_ids == want


def test_duplicate_request_id_is_refused(llm_f32):
    eng = llm_f32.engine
    eng.add_request("dup", "a", GREEDY)
    with pytest.raises(InvalidRequestError, match="already in use"):
        eng.add_request("dup", "b", GREEDY)
    done = _run(eng)
    assert done["dup"].prompt == "a"


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=-3), "max_tokens"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(min_p=2.0), "min_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(presence_penalty=3.0), "presence_penalty"),
    (dict(frequency_penalty=-2.5), "frequency_penalty"),
    (dict(n=0), "n must"),
    (dict(logprobs=50), "logprobs"),
    (dict(logit_bias={5: 1000.0}), "logit_bias"),
    (dict(stop=[""]), "stop strings"),
])
def test_out_of_range_sampling_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_logit_bias_outside_vocabulary_is_refused(llm_f32):
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        llm_f32.engine.add_request("lb", "x", SamplingParams(logit_bias={10**7: 1.0}))
    assert not llm_f32.engine.has_unfinished_requests()


def _llm(path, **kw):
    from nextok import LLM

    return LLM(model=str(path), dtype="float32", kv_cache_memory=16 << 20, download=False, **kw)


def test_missing_model_file(tmp_path):
    with pytest.raises(ModelLoadError):
        _llm(tmp_path / "nope.gguf")


def test_unknown_alias():
    from nextok import LLM

    with pytest.raises(NextokError, match="no-such-model"):
        LLM(model="no-such-model", download=False)


def test_corrupt_and_truncated_gguf(tmp_path, model_path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(ModelLoadError):
        _llm(garbage)
    truncated = tmp_path / "truncated.gguf"
    with open(model_path, "rb") as src:
        truncated.write_bytes(src.read(os.path.getsize(model_path) // 2))
    with pytest.raises(ModelLoadError):
        _llm(truncated)


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["GPTNeoXForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}))
    with pytest.raises(ModelLoadError, match="GPTNeoXForCausalLM"):
        _llm(tmp_path, load_format="dummy")


def test_wrong_sha256_in_cache_is_refused(tmp_path, monkeypatch, model_path):
    """A cached default model whose bytes changed since it was checked is refused, not used."""
    from nextok import LLM, hub

    monkeypatch.setenv("NEXTOK_CACHE_DIR", str(tmp_path))
    target = hub.cached_path(hub.KNOWN_MODELS[hub.DEFAULT_MODEL])
    os.makedirs(os.path.dirname(target))
    shutil.copyfile(model_path, target)
    assert hub.resolve_model(None, download=False) == target  # hashed once, then trusted
    with open(target, "r+b") as f:  # same size, one byte flipped
        f.seek(12345)
        b = f.read(1)
        f.seek(12345)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(ModelLoadError, match="sha256"):
        hub.resolve_model(None, download=False)
    with pytest.raises(ModelLoadError, match="sha256"):
        LLM(download=False)
