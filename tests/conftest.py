"""Shared fixtures. The real model is pulled once per session (`make test` pulls it first)."""
from __future__ import annotations

import os

import pytest
import torch

# Without a GPU the Triton kernels run in Triton's interpreter (on CPU tensors). It reads this at
# import, so it is set here, before any test module imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def model_path() -> str:
    """Path of the default model (SmolLM2-135M-Instruct GGUF), pulled into the cache if absent."""
    from nextok import hub

    return hub.resolve_model(None)


_ENGINES: dict = {}


@pytest.fixture(scope="session")
def make_llm(model_path):
    """make_llm(**engine kwargs) -> LLM on the default model in float32, built once per kwargs."""

    def make(**kwargs):
        from nextok import LLM

        kwargs.setdefault("kv_cache_memory", 256 << 20)
        key = tuple(sorted(kwargs.items()))
        if key not in _ENGINES:
            _ENGINES[key] = LLM(model=model_path, dtype="float32", **kwargs)
        return _ENGINES[key]

    return make


@pytest.fixture(scope="session")
def llm_f32(make_llm):
    """The default engine configuration, float32 (exactness tests use float32)."""
    return make_llm()


@pytest.fixture(scope="session")
def hf_model(model_path):
    """transformers' model from the same GGUF, float32: the numerical reference (~20 s, once)."""
    import os

    import torch

    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(model_path), gguf_file=os.path.basename(model_path), dtype=torch.float32)
    return model.eval()
