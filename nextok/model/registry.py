"""Maps a checkpoint's `architectures` entry to the class that runs it (imported lazily), and the
dtype context the model is built in."""
from __future__ import annotations

import contextlib
import importlib

import torch

from nextok.errors import ModelLoadError

# architecture -> "module:Class". Mistral and Qwen2 differ from Llama only in config fields
# (sliding window; QKV bias), which the one implementation reads.
_MODELS = {
    "LlamaForCausalLM": "nextok.model.llama:LlamaForCausalLM",
    "MistralForCausalLM": "nextok.model.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "nextok.model.llama:LlamaForCausalLM",
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def model_class(architecture: str):
    target = _MODELS.get(architecture)
    if target is None:
        raise ModelLoadError(
            f"unsupported model architecture {architecture!r}; nextok runs "
            f"{', '.join(supported_architectures())}")
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default dtype set to `dtype` inside, restored after (the caller's thread alone
    builds tensors meanwhile: model construction at start-up)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)
