"""GGUF files (llama.cpp's format): metadata -> HF config dict, tensors -> HF-named float32.

The byte format (header reads, block dequantization) lives in gguf_format.py. Every size
and offset is checked against the file's length up front, so a truncated or corrupt file fails
with one ModelLoadError before any weight is read.
"""
from __future__ import annotations

import math
import mmap
import os
import re
from typing import Any, Iterator

import numpy as np
import torch

from nextok.errors import ModelLoadError
from nextok.model.gguf_format import FORMATS, TensorInfo, HeaderParser, dequantize

# GGUF architecture -> (HF architecture, Q/K rows permuted by llama.cpp's converter)
_ARCHS = {"llama": ("LlamaForCausalLM", True), "qwen2": ("Qwen2ForCausalLM", False)}

_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
                "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def _type_name(type_id: int) -> str:
    from gguf.constants import GGMLQuantizationType

    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type id {type_id}"


class GGUFFile:
    """One GGUF file: `.metadata`, `.architecture`, `.hf_config()`, `.tensors()`."""

    def __init__(self, path: str):
        self.path = path
        if not os.path.exists(path):
            raise ModelLoadError(f"model file not found: {path}")
        if os.path.isdir(path):
            raise ModelLoadError(f"{path} is a directory, not a GGUF file")
        try:
            self.file_size = os.path.getsize(path)
            with open(path, "rb") as f:
                if f.read(4) != b"GGUF":
                    raise ModelLoadError(f"{path} is not a GGUF file (bad magic bytes)")
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    self._parse(HeaderParser(mm, path))
        except OSError as e:
            raise ModelLoadError(f"cannot read {path}: {e.strerror or e}") from None
        self.architecture = str(self.metadata.get("general.architecture", ""))

    # ---- header ------------------------------------------------------------------------------
    def _parse(self, p: HeaderParser) -> None:
        p.take(4)  # magic, checked by the caller
        version = p.scalar("<I")
        if version not in (2, 3):
            raise ModelLoadError(f"{self.path}: GGUF version {version} is not supported "
                                 "(expected 2 or 3; big-endian files are not supported)")
        n_tensors, n_kv = p.scalar("<Q"), p.scalar("<Q")
        if n_kv * 13 + n_tensors * 32 > p.size:  # minimal sizes of one key/value and one info
            raise p.fail(f"{n_tensors} tensors and {n_kv} keys cannot fit in the file")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = p.string()
            self.metadata[key] = p.value(p.scalar("<I"))
        infos = [self._tensor_info(p) for _ in range(n_tensors)]
        align = self.metadata.get("general.alignment", 32)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise p.fail(f"general.alignment {align!r} is not a power of two")
        data_start = -(-p.pos // align) * align
        self.tensor_infos: dict[str, TensorInfo] = {}
        for name, shape, type_id, rel in infos:
            info = self._check_tensor(name, shape, type_id, data_start + rel)
            if name in self.tensor_infos:
                raise p.fail(f"tensor {name} appears twice")
            self.tensor_infos[name] = info

    @staticmethod
    def _tensor_info(p: HeaderParser) -> tuple[str, tuple[int, ...], int, int]:
        name = p.string()
        n_dims = p.scalar("<I")
        if not 1 <= n_dims <= 4:
            raise p.fail(f"tensor {name} has {n_dims} dimensions")
        dims = [p.scalar("<Q") for _ in range(n_dims)]  # ne0 (contiguous) first
        return name, tuple(reversed(dims)), p.scalar("<I"), p.scalar("<Q")

    def _check_tensor(self, name: str, shape: tuple[int, ...], type_id: int,
                      offset: int) -> TensorInfo:
        fmt = FORMATS.get(type_id)
        if fmt is None:
            raise ModelLoadError(f"tensor {name} has unsupported GGUF type {_type_name(type_id)} "
                                 f"in {self.path}")
        if shape[-1] % fmt.block:
            raise ModelLoadError(f"{self.path}: tensor {name} row of {shape[-1]} is not a "
                                 f"multiple of its {_type_name(type_id)} block of {fmt.block}")
        nbytes = math.prod(shape) // fmt.block * fmt.nbytes
        if offset + nbytes > self.file_size:
            raise ModelLoadError(f"{self.path} is truncated: tensor {name} ends at byte "
                                 f"{offset + nbytes}, the file has {self.file_size}")
        return TensorInfo(name, shape, type_id, offset, nbytes)

    # ---- config ------------------------------------------------------------------------------
    def _arch(self) -> tuple[str, bool]:
        if self.architecture not in _ARCHS:
            raise ModelLoadError(f"unsupported GGUF architecture {self.architecture!r} in "
                                 f"{self.path} (supported: {', '.join(sorted(_ARCHS))})")
        return _ARCHS[self.architecture]

    def _key(self, suffix: str, default: Any = None, required: bool = False) -> Any:
        value = self.metadata.get(f"{self.architecture}.{suffix}", default)
        if required and not isinstance(value, (int, float)):  # absent, or a per-layer list
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.architecture}.{suffix} = "
                                 f"{value!r}, expected one number")
        return value

    def hf_config(self) -> dict:
        """The model's architecture as a Hugging Face config.json dict."""
        hf_arch, _ = self._arch()
        hidden = int(self._key("embedding_length", required=True))
        heads = int(self._key("attention.head_count", required=True))
        head_dim = int(self._key("attention.key_length") or hidden // heads)
        rope_dim = self._key("rope.dimension_count")
        if rope_dim is not None and int(rope_dim) != head_dim:
            raise ModelLoadError(f"{self.path}: partial rotary embeddings ({rope_dim} of "
                                 f"{head_dim} dims) are not supported")
        embed = self.tensor_infos.get("token_embd.weight")
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        vocab = embed.shape[0] if embed else len(tokens) if tokens else self._key("vocab_size")
        if not isinstance(vocab, int):
            raise ModelLoadError(f"{self.path}: no token_embd.weight, tokenizer.ggml.tokens or "
                                 "vocab_size tells the vocabulary size")
        attn_q = self.tensor_infos.get("blk.0.attn_q.weight")
        return {
            "architectures": [hf_arch],
            "hidden_size": hidden,
            "intermediate_size": int(self._key("feed_forward_length", required=True)),
            "num_hidden_layers": int(self._key("block_count", required=True)),
            "num_attention_heads": heads,
            "num_key_value_heads": int(self._key("attention.head_count_kv", heads, True)),
            "head_dim": head_dim,
            "max_position_embeddings": int(self._key("context_length", 2048)),
            "rms_norm_eps": float(self._key("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(self._key("rope.freq_base", 10000.0)),
            "rope_scaling": self._rope_scaling(head_dim),
            "vocab_size": int(vocab),
            "tie_word_embeddings": "output.weight" not in self.tensor_infos,
            "attention_bias": "blk.0.attn_q.bias" in self.tensor_infos,
            "bos_token_id": self.metadata.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": self.metadata.get("tokenizer.ggml.eos_token_id"),
            # the attention weights' type names the file: F16, BF16, else (quantized) float32
            "torch_dtype": {1: "float16", 30: "bfloat16"}.get(attn_q and attn_q.type_id, "float32"),
        }

    def _rope_scaling(self, head_dim: int) -> dict | None:
        kind = self._key("rope.scaling.type")
        factor = self._key("rope.scaling.factor")
        orig = self._key("rope.scaling.original_context_length")
        if "rope_freqs.weight" in self.tensor_infos:
            return self._llama3_scaling(head_dim, factor, orig)
        if kind in (None, "none") or not factor:
            return None
        out = {"rope_type": kind, "factor": float(factor)}
        if orig:
            out["original_max_position_embeddings"] = int(orig)
        return out  # kinds RotaryEmbedding lacks (yarn, ...) are refused when the model is built

    def _llama3_scaling(self, head_dim: int, factor, orig) -> dict | None:
        """llama.cpp stores Llama 3.1's RoPE scaling as per-frequency divisors (rope_freqs
        [head_dim / 2]) instead of parameters. Rebuild the parameters (Meta's release values)
        and accept them only if they reproduce the stored divisors."""
        stored = self._load(self.tensor_infos["rope_freqs.weight"]).double()
        if torch.allclose(stored, torch.ones_like(stored)):
            return None
        params = {"rope_type": "llama3", "factor": float(factor or stored.max().item()),
                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": int(orig or 8192)}
        theta = float(self._key("rope.freq_base", 10000.0))
        inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        wavelen = 2 * math.pi / inv  # [head_dim / 2]
        old, f = params["original_max_position_embeddings"], params["factor"]
        low, high = params["low_freq_factor"], params["high_freq_factor"]
        smooth = ((old / wavelen - low) / (high - low)).clamp(0.0, 1.0)  # 0: long waves
        expected = 1.0 / ((1 - smooth) / f + smooth)  # divisor of each frequency
        if stored.shape != expected.shape or not torch.allclose(stored, expected, rtol=1e-4):
            raise ModelLoadError(f"{self.path}: rope_freqs does not match llama3 RoPE scaling; "
                                 "this RoPE variant is not supported")
        return params

    # ---- tensors -----------------------------------------------------------------------------
    def hf_name(self, name: str) -> str | None:
        """GGUF tensor name -> HF name; None for tensors folded into the config."""
        if name in _GLOBAL_NAMES:
            return _GLOBAL_NAMES[name]
        if name == "rope_freqs.weight":  # llama3 RoPE divisors: hf_config's rope_scaling
            return None
        m = _LAYER_RE.fullmatch(name)
        if m and m.group(2) in _LAYER_NAMES:
            return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
        raise ModelLoadError(f"{self.path}: tensor {name!r} has no counterpart in "
                             f"{self._arch()[0]}")

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, float32 tensor in HF layout), one tensor read at a time. Names and the
        architecture are checked now, before the first weight is read."""
        names = [(info, self.hf_name(name)) for name, info in self.tensor_infos.items()]
        return self._iter([(i, n) for i, n in names if n], self._permuted_heads())

    def _permuted_heads(self) -> dict[str, int]:
        """Tensor kind -> head count, for the kinds whose rows llama.cpp's converter permuted."""
        _, permuted = self._arch()
        if not permuted:
            return {}
        q = int(self._key("attention.head_count", required=True))
        return {"attn_q": q, "attn_k": int(self._key("attention.head_count_kv", q))}

    def blocks(self, type_ids: tuple[int, ...]) -> Iterator[tuple[str, int, torch.Tensor]]:
        """(HF name, ggml type, raw blocks [rows, row bytes] uint8) of the 2-D tensors stored in
        one of `type_ids`, rows in HF order (a Q/K row permutation moves whole rows of blocks)."""
        heads = self._permuted_heads()
        todo = [(info, self.hf_name(name)) for name, info in self.tensor_infos.items()
                if info.type_id in type_ids and len(info.shape) == 2]
        with open(self.path, "rb") as f:
            for info, hf_name in todo:
                if hf_name is None:
                    continue
                raw = torch.from_numpy(self._read(info, f)).view(info.shape[0], -1)
                kind = info.name.split(".")[2] if info.name.startswith("blk.") else ""
                if kind in heads:
                    raw = unpermute_rows(raw, heads[kind])
                yield hf_name, info.type_id, raw

    def _iter(self, todo: list, heads: dict[str, int]) -> Iterator[tuple[str, torch.Tensor]]:
        with open(self.path, "rb") as f:
            for info, hf_name in todo:
                w = self._load(info, f)
                kind = info.name.split(".")[2] if info.name.startswith("blk.") else ""
                if kind in heads:
                    if w.shape[0] % (2 * heads[kind]):
                        raise ModelLoadError(f"{self.path}: {info.name} has {w.shape[0]} rows, "
                                             f"not a multiple of 2 x {heads[kind]} heads")
                    w = unpermute_rows(w, heads[kind])
                yield hf_name, w

    def _load(self, info: TensorInfo, f=None) -> torch.Tensor:
        """One tensor -> float32 [info.shape]; `f`: an open handle to reuse."""
        return dequantize(self._read(info, f), info.type_id, math.prod(info.shape)).view(info.shape)

    def _read(self, info: TensorInfo, f=None) -> np.ndarray:
        """One tensor's bytes as stored: [info.nbytes] uint8."""
        raw = np.empty(info.nbytes, dtype=np.uint8)
        try:
            if f is None:
                with open(self.path, "rb") as own:
                    own.seek(info.offset)
                    got = own.readinto(raw)
            else:
                f.seek(info.offset)
                got = f.readinto(raw)
        except OSError as e:
            raise ModelLoadError(f"cannot read {self.path}: {e.strerror or e}") from None
        if got != info.nbytes:  # the file shrank after it was opened
            raise ModelLoadError(f"{self.path} is truncated: tensor {info.name} is incomplete")
        return raw


def unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row order. Its converter regroups each head's rows from HF's
    rotate-half layout (first half, second half) into interleaved pairs for its RoPE kernel:
    rows (h, 2, d/2) -> (h, d/2, 2). w: [n_head * head_dim, ...] (weight or bias)."""
    rest = w.shape[1:]
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *rest).transpose(1, 2).reshape(w.shape).contiguous()
