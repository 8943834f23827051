"""The model is built in its own dtype on its device: a bf16 model never exists in float32 first
(which needed twice its memory at load), and torch's default dtype is left as it was."""
from __future__ import annotations

import torch
from torch import nn

from nextok import LLM
from nextok.model.registry import default_dtype


def test_parameters_are_made_in_the_models_dtype(model_path, monkeypatch):
    made = []
    real = nn.Linear.reset_parameters

    def record(self):
        made.append(self.weight.dtype)
        real(self)

    monkeypatch.setattr(nn.Linear, "reset_parameters", record)
    llm = LLM(model=model_path, dtype="bfloat16", kv_cache_memory=16 << 20)
    assert made and set(made) == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32
    # the rotary table stays float32 (made with an explicit dtype), whatever the model's
    rope = llm.engine.runner.model.rope
    assert rope.cos.dtype == torch.float32
    out = llm.generate("def add(a, b):", None)
    assert out[0].outputs[0].token_ids


def test_default_dtype_is_restored_after_an_error():
    try:
        with default_dtype(torch.bfloat16):
            assert torch.ones(1).dtype == torch.bfloat16
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert torch.get_default_dtype() == torch.float32
