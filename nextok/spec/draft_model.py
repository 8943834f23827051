"""`--speculative draft --draft-model PATH`: open the draft checkpoint and check, before any
weights load, that it speaks the target's vocabulary; then build its ModelRunner.

A draft must share the target's tokenizer exactly: its token ids are handed to the target as
they are, so one id meaning another string in the draft would only cost acceptance, but a
different vocabulary size breaks the verify step's shapes. We refuse both at startup, naming
both models, rather than speculate silently badly.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nextok.config import EngineConfig, ModelConfig, SpeculativeConfig
from nextok.errors import NextokError


@dataclass
class DraftCheckpoint:
    path: str
    checkpoint: object  # model.loader.Checkpoint
    model: ModelConfig


def open_draft(path: str, target_path: str, target_model: ModelConfig, target_tokenizer) -> DraftCheckpoint:
    """The draft's checkpoint and config, its tokenizer checked against the target's. Reads
    configs and tokenizers only (no weights)."""
    from nextok.engine.factory import _load_tokenizer
    from nextok.model.loader import load_checkpoint
    from nextok.model.registry import model_class

    ckpt = load_checkpoint(path)
    mc = ModelConfig.from_hf_dict(ckpt.hf_config)
    model_class(mc.architecture)  # unsupported architecture: fail before loading
    names = f"the draft model {path} and the target model {target_path}"
    if mc.vocab_size != target_model.vocab_size:
        raise NextokError(f"{names} have different vocabulary sizes ({mc.vocab_size} vs "
                          f"{target_model.vocab_size}); a draft model needs the target's tokenizer")
    check_same_tokenizer(_load_tokenizer(ckpt.path, ckpt.format), target_tokenizer, names)
    return DraftCheckpoint(path, ckpt, mc)


def check_same_tokenizer(draft, target, names: str) -> None:
    """NextokError unless both tokenizers map every token string to the same id and mark the
    same ids special."""
    dv = draft.backend.get_vocab(with_added_tokens=True)
    tv = target.backend.get_vocab(with_added_tokens=True)
    if dv != tv:
        diff = sorted(set(dv.items()) ^ set(tv.items()), key=lambda kv: kv[1])[0]
        token_id = diff[1]
        raise NextokError(
            f"{names} have different tokenizers: token id {token_id} is "
            f"{draft.id_to_token(token_id)!r} in the draft and {target.id_to_token(token_id)!r} "
            f"in the target ({len(dv)} vs {len(tv)} tokens)")
    if draft.all_special_ids != target.all_special_ids:
        only = sorted(set(draft.all_special_ids) ^ set(target.all_special_ids))
        raise NextokError(f"{names} have different special tokens: e.g. id {only[0]} "
                          f"({target.id_to_token(only[0])!r}) is special in only one of them")


def draft_runner(config: EngineConfig, draft: DraftCheckpoint, max_model_len: int):
    """The draft model's ModelRunner: the target's device, dtype, kernels and KV cache dtype,
    not its quantization (a draft is small already) or its speculation."""
    from nextok.worker.model_runner import ModelRunner

    ckpt = draft.checkpoint
    cfg = dataclasses.replace(config, model_path=draft.path, model=draft.model, load_format=ckpt.format,
                              quantization=None, speculative=SpeculativeConfig())
    weights = None if ckpt.format == "dummy" else ckpt.weights()
    try:
        return ModelRunner(cfg, weights, max_model_len, ckpt.blocks)
    except NextokError as e:
        raise NextokError(f"the draft model {draft.path}: {e}") from None
