"""Medusa heads (Medusa-1, Cai et al. 2024): small extra heads on a frozen model's last hidden
state that guess the tokens after the next one, and the file they are kept in.

Head i (0-based) reads h_t, the final hidden state (after the final norm) at position t, and
predicts the token at t + 2 + i (the model's own lm_head already predicts t + 1):

    logits_i = P_i(h_t + SiLU(W_i h_t + b_i))

W_i, b_i start at zero, so a fresh head is the base model's head. P_i is the base model's own
(frozen) vocabulary projection ("shared", 576 x 576 + 576 parameters per head on SmolLM2-135M)
or a trainable copy of it per head ("own", + vocab x hidden each).

The file (`medusa_heads.safetensors`, alone or in a directory) records the base model it was
trained for: hidden size, vocabulary size, layer count, and a fingerprint of its embedding
(FINGERPRINT_ROWS rows of it, compared to a tolerance so that the same model served in another
dtype still matches; their short hash names it in errors). Heads made for another model are
refused with what differs.
"""
from __future__ import annotations

import hashlib
import json
import os

import torch
from torch import nn

from nextok.errors import NextokError

FILE_NAME = "medusa_heads.safetensors"
FORMAT = "nextok-medusa-1"
FINGERPRINT_ROWS = 64  # embedding rows kept in the file to recognise the base model
PROJECTIONS = ("shared", "own")


class MedusaHeads(nn.Module):
    def __init__(self, num_heads: int, hidden_size: int, vocab_size: int, projection: str = "shared",
                 base_projection: torch.Tensor | None = None):
        """base_projection [vocab, hidden]: the base model's lm_head (or tied embedding) weight;
        "own" heads start from a copy of it, "shared" heads use it as is and never train it."""
        super().__init__()
        if projection not in PROJECTIONS:
            raise NextokError(f"medusa head projection must be one of {PROJECTIONS}, got {projection!r}")
        self.num_heads, self.hidden_size, self.vocab_size = num_heads, hidden_size, vocab_size
        self.projection = projection
        self.weight = nn.Parameter(torch.zeros(num_heads, hidden_size, hidden_size))  # W_i [out, in]
        self.bias = nn.Parameter(torch.zeros(num_heads, hidden_size))
        self.proj = None  # [H, vocab, hidden], "own" heads only
        if projection == "own":
            start = (base_projection.detach().float() if base_projection is not None
                     else torch.zeros(vocab_size, hidden_size))
            self.proj = nn.Parameter(start.unsqueeze(0).repeat(num_heads, 1, 1))

    def residual(self, h: torch.Tensor, num: int) -> torch.Tensor:
        """h [N, hidden] -> the first `num` heads' inputs to their projection [N, num, hidden]."""
        z = torch.einsum("nd,hed->nhe", h, self.weight[:num]) + self.bias[:num]  # W_i h + b_i
        return h.unsqueeze(1) + nn.functional.silu(z)

    def logits(self, h: torch.Tensor, base_projection, num: int | None = None) -> torch.Tensor:
        """h [N, hidden] -> [N, num, vocab] for heads 0..num-1 (default all). base_projection: a
        callable [M, hidden] -> [M, vocab] (the base model's lm_head) for "shared" heads."""
        num = self.num_heads if num is None else num
        x = self.residual(h, num)
        if self.proj is None:
            n = x.shape[0]
            return base_projection(x.reshape(n * num, self.hidden_size)).view(n, num, -1)
        return torch.einsum("nhd,hvd->nhv", x, self.proj[:num])

    # ---- the file ----------------------------------------------------------------------------
    def save(self, path: str, base: dict, extra: dict | None = None) -> str:
        """Writes OUT/medusa_heads.safetensors (path: a directory); base: base_identity(model)."""
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        tensors = {"weight": self.weight.detach().float().contiguous().cpu(),
                   "bias": self.bias.detach().float().contiguous().cpu(),
                   "base.embedding_rows": base["embedding_rows"].contiguous().cpu()}
        if self.proj is not None:
            tensors["proj"] = self.proj.detach().float().contiguous().cpu()
        meta = {"format": FORMAT, "num_heads": self.num_heads, "projection": self.projection,
                **{k: v for k, v in base.items() if k != "embedding_rows"}, **(extra or {})}
        file = os.path.join(path, FILE_NAME)
        save_file(tensors, file, metadata={k: json.dumps(v) for k, v in meta.items()})
        return file


def heads_file(path: str) -> str:
    """The heads file that --medusa-heads PATH names (the file, or a directory holding it)."""
    return os.path.join(path, FILE_NAME) if os.path.isdir(path) else path


def read_metadata(path: str) -> dict:
    """The file's metadata (decoded), or NextokError if it is missing or not a heads file; reads
    only the header, so the CLI checks it before any model loads."""
    from safetensors import safe_open

    file = heads_file(path)
    if not os.path.isfile(file):
        raise NextokError(f"--medusa-heads {path}: no such file (expected a {FILE_NAME} or a "
                          f"directory holding one; `nextok train medusa` writes them)")
    try:
        with safe_open(file, framework="pt") as f:
            raw = f.metadata() or {}
        meta = {k: json.loads(v) for k, v in raw.items()}
    except Exception as e:  # safetensors raises its own error types for a bad header
        raise NextokError(f"--medusa-heads {path}: cannot read {file}: {e}") from None
    if meta.get("format") != FORMAT:
        raise NextokError(f"--medusa-heads {path}: {file} is not a nextok medusa heads file "
                          f"(format {meta.get('format')!r}, expected {FORMAT!r})")
    return meta


def base_identity(model) -> dict:
    """What identifies a base model to its heads: sizes and an embedding fingerprint."""
    cfg = model.config
    emb = model.embed_tokens.weight.detach()
    rows = torch.linspace(0, cfg.vocab_size - 1, FINGERPRINT_ROWS).long().to(emb.device)
    sample = emb.index_select(0, rows).float().cpu()  # [FINGERPRINT_ROWS, hidden]
    return {"hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
            "num_hidden_layers": cfg.num_hidden_layers, "architecture": cfg.architecture,
            "fingerprint": fingerprint_hash(sample), "embedding_rows": sample}


def fingerprint_hash(rows: torch.Tensor) -> str:
    """A short name for an embedding sample: sha256 of its bfloat16 rounding (so float32 and
    bfloat16 copies of one model usually share it; matching itself uses a tolerance)."""
    raw = rows.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()[:16]


def load_heads(path: str, model) -> MedusaHeads:
    """The heads in `path` for `model` (on its device, in its dtype); NextokError naming what
    differs if they were trained for another model."""
    from safetensors.torch import load_file

    meta = read_metadata(path)
    file = heads_file(path)
    tensors = load_file(file)
    check_base(path, meta, tensors["base.embedding_rows"], base_identity(model))
    heads = MedusaHeads(meta["num_heads"], meta["hidden_size"], meta["vocab_size"], meta["projection"])
    state = {k: v for k, v in tensors.items() if not k.startswith("base.")}
    try:
        heads.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise NextokError(f"--medusa-heads {path}: tensors do not match the header: {e}") from None
    w = model.embed_tokens.weight
    return heads.to(device=w.device, dtype=w.dtype).eval()


def check_base(path: str, meta: dict, rows: torch.Tensor, model_base: dict) -> None:
    diffs = [f"{key} {meta.get(key)} != this model's {model_base[key]}"
             for key in ("hidden_size", "vocab_size", "num_hidden_layers")
             if meta.get(key) != model_base[key]]
    if not diffs:
        want = model_base["embedding_rows"]
        if rows.shape != want.shape or not torch.allclose(rows, want, rtol=1e-2, atol=1e-3):
            diffs.append(f"embedding fingerprint {meta.get('fingerprint')} != this model's "
                         f"{model_base['fingerprint']}")
    if diffs:
        raise NextokError(f"--medusa-heads {path} were trained for another model "
                          f"({meta.get('base_model', 'unknown')}): " + "; ".join(diffs))
