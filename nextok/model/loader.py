"""A model path -> `Checkpoint`: its format, its HF config dict, and a lazy weight iterator.

Formats: one GGUF file; a Hugging Face directory (config.json + model.safetensors, or shards
listed in model.safetensors.index.json); or `dummy` (config.json only, random weights built by
the model). Everything that can be checked without reading weights (config JSON, shard files,
safetensors headers, GGUF offsets and types) is checked here, so a bad checkpoint fails with
one ModelLoadError before the model is allocated.
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from nextok.errors import ModelLoadError

FORMATS = ("auto", "gguf", "safetensors", "dummy")
_INDEX = "model.safetensors.index.json"


@dataclass
class Checkpoint:
    path: str  # the GGUF file, or the checkpoint directory
    format: str  # "gguf" | "safetensors" | "dummy"
    hf_config: dict  # config.json form; ModelConfig.from_hf_dict consumes it
    _weights: Callable[[], Iterator[tuple[str, torch.Tensor]]] | None = field(
        default=None, repr=False)
    _blocks: Callable[[tuple[int, ...]], Iterator[tuple[str, int, torch.Tensor]]] | None = field(
        default=None, repr=False)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, tensor), one at a time. GGUF: float32, dequantized; safetensors: the
        stored dtype (the model's copy_ casts)."""
        if self._weights is None:
            raise ModelLoadError(f"a {self.format} checkpoint has no weights to load")
        return self._weights()

    def blocks(self, type_ids: tuple[int, ...]) -> Iterator[tuple[str, int, torch.Tensor]]:
        """GGUF only: (HF name, ggml type, raw blocks [rows, row bytes]) of the tensors stored
        in one of `type_ids`, for kernels that read the blocks themselves; else nothing."""
        return iter(()) if self._blocks is None else self._blocks(type_ids)


def load_checkpoint(path: str, load_format: str = "auto") -> Checkpoint:
    if load_format not in FORMATS:
        raise ModelLoadError(f"unknown load format {load_format!r} (expected one of "
                             f"{', '.join(FORMATS)})")
    if not os.path.exists(path):
        raise ModelLoadError(f"model path not found: {path}")
    fmt = _detect(path) if load_format == "auto" else load_format
    if fmt == "gguf":
        return _load_gguf(_gguf_file(path))
    directory = os.path.dirname(path) if _is_config_file(path) else path
    if not os.path.isdir(directory):
        raise ModelLoadError(f"{path} is not a checkpoint directory (with config.json) for "
                             f"--load-format {fmt}")
    if fmt == "dummy":
        return Checkpoint(directory, "dummy", _read_config(directory))
    return _load_safetensors(directory)


# ---- detection ---------------------------------------------------------------------------------
def _is_config_file(path: str) -> bool:
    return os.path.isfile(path) and os.path.basename(path) == "config.json"


def _detect(path: str) -> str:
    if os.path.isfile(path):
        if _is_config_file(path):
            path = os.path.dirname(path) or "."
        elif path.endswith(".gguf") or _has_gguf_magic(path):
            return "gguf"
        else:
            raise ModelLoadError(f"{path} is neither a GGUF file nor a checkpoint directory")
    has_config = os.path.isfile(os.path.join(path, "config.json"))
    if has_config and glob.glob(os.path.join(path, "*.safetensors")):
        return "safetensors"
    if _gguf_files(path):  # e.g. a GGUF downloaded next to its original config.json
        return "gguf"
    if has_config:
        raise ModelLoadError(f"{path} has config.json but no *.safetensors weights (to run "
                             "its architecture with random weights, use --load-format dummy)")
    raise ModelLoadError(f"{path} holds no model: expected a .gguf file, or config.json "
                         "with *.safetensors")


def _has_gguf_magic(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _gguf_files(directory: str) -> list[str]:
    return sorted(glob.glob(os.path.join(directory, "*.gguf")))


def _gguf_file(path: str) -> str:
    if not os.path.isdir(path):
        return path
    files = _gguf_files(path)
    if len(files) != 1:
        found = ", ".join(os.path.basename(f) for f in files) or "none"
        raise ModelLoadError(f"{path} must hold exactly one .gguf file to load (found: {found}); "
                             "pass the file's path instead")
    return files[0]


# ---- GGUF --------------------------------------------------------------------------------------
def _load_gguf(path: str) -> Checkpoint:
    from nextok.model.gguf import GGUFFile

    gguf = GGUFFile(path)
    cfg = gguf.hf_config()
    gguf.tensors()  # checks every tensor name maps before any weight is read
    return Checkpoint(path, "gguf", cfg, gguf.tensors, gguf.blocks)


# ---- Hugging Face directory --------------------------------------------------------------------
def _read_config(directory: str) -> dict:
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{directory} has no config.json")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    if not cfg.get("architectures"):
        raise ModelLoadError(f"{path} has no 'architectures' entry")
    return cfg


def _shards(directory: str) -> dict[str, list[str] | None]:
    """shard file -> the tensor names to read from it (None: all). Sharded checkpoints list
    their tensors in the index; a single file, or a directory without index, is read whole."""
    index_path = os.path.join(directory, _INDEX)
    if os.path.isfile(index_path):
        try:
            with open(index_path, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            items = list(weight_map.items())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
                AttributeError) as e:
            raise ModelLoadError(f"cannot read {index_path}: {type(e).__name__} {e}") from None
        shards: dict[str, list[str] | None] = {}
        for name, shard in items:
            shards.setdefault(os.path.join(directory, str(shard)), []).append(name)
        return shards
    single = os.path.join(directory, "model.safetensors")
    files = [single] if os.path.isfile(single) else sorted(
        glob.glob(os.path.join(directory, "*.safetensors")))
    if not files:
        raise ModelLoadError(f"{directory} has no *.safetensors weights")
    return {f: None for f in files}


def _load_safetensors(directory: str) -> Checkpoint:
    cfg = _read_config(directory)
    shards = _shards(directory)
    for shard, names in shards.items():  # headers only: cheap, and catches corrupt files now
        if not os.path.isfile(shard):
            raise ModelLoadError(f"checkpoint shard not found: {shard} (listed in {_INDEX})")
        with _open_safetensors(shard) as f:
            missing = sorted(set(names or ()) - set(f.keys()))
        if missing:
            raise ModelLoadError(f"{shard} lacks {len(missing)} tensors its index lists, "
                                 f"e.g. {missing[0]!r}")
    qc = cfg.get("quantization_config")
    if qc is None:
        return Checkpoint(directory, "safetensors", cfg, lambda: _iter_safetensors(shards))
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if method not in ("awq", "gptq"):
        raise ModelLoadError(f"{directory}: quantization_config with quant_method {method!r} is "
                             f"not supported (supported: awq, gptq)")
    from nextok.model import awq, gptq

    fmt = awq if method == "awq" else gptq
    group = fmt.check_config(qc)
    return Checkpoint(directory, "safetensors", cfg,
                      lambda: fmt.weights(_iter_safetensors(shards), group),
                      lambda type_ids: fmt.blocks(_iter_safetensors(shards), group, type_ids))


def _open_safetensors(path: str):
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(path, framework="pt")
    except (SafetensorError, OSError) as e:
        raise ModelLoadError(f"{path} is not a readable safetensors file: {e}") from None


def _iter_safetensors(shards: dict[str, list[str] | None]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError

    for shard, names in shards.items():
        with _open_safetensors(shard) as f:
            for name in (names if names is not None else f.keys()):
                try:
                    tensor = f.get_tensor(name)
                except (SafetensorError, OSError) as e:
                    raise ModelLoadError(f"cannot read tensor {name!r} from {shard}: {e}") from None
                yield name, tensor
