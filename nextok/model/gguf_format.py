"""The GGUF byte format: header reads, and ggml tensor types -> float32 (vectorized in numpy).

Header: magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv | n_kv key/values |
n_tensors tensor infos (name, dims, ggml type, offset) | padding to `general.alignment` |
tensor data. It is parsed with `struct` (gguf.GGUFReader builds one numpy view per array
element and takes ~4 s on a 49k-token vocabulary; this takes ~0.1 s).

Every block format stores a fixed number of weights (`block`) in a fixed number of bytes
(`nbytes`). A tensor's bytes are viewed as [n_blocks, nbytes] uint8 and each decoder turns
that into [n_blocks, block] float32. The arithmetic follows ggml's reference order (scale
first, then offset) so results match `gguf.quants.dequantize` bit for bit; tests check that.
K-quants group 256 weights into a super-block of 8 or 16 sub-blocks, each with its own small
integer scale (and min) multiplied by the super-block's f16 scale.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from nextok.errors import ModelLoadError

# GGUF value type id -> (struct format, numpy dtype) for fixed-size scalars; 8 string, 9 array
_SCALARS = {0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"),
            4: ("<I", "<u4"), 5: ("<i", "<i4"), 6: ("<f", "<f4"), 7: ("<?", "?"),
            10: ("<Q", "<u8"), 11: ("<q", "<i8"), 12: ("<d", "<f8")}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str  # GGUF name, e.g. "blk.0.attn_q.weight"
    shape: tuple[int, ...]  # torch order: GGUF dims reversed ([out, in] for a linear weight)
    type_id: int  # ggml type
    offset: int  # absolute byte offset in the file
    nbytes: int


class HeaderParser:
    """Little-endian reads from the header; running past the end means a truncated file."""

    def __init__(self, buf, path: str):
        self.buf, self.path, self.pos, self.size = buf, path, 0, len(buf)

    def fail(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path} is a truncated or corrupt GGUF file ({what})")

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise self.fail(f"header runs past the end of the file at byte {start}")
        self.pos += n
        return start

    def scalar(self, fmt: str):
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        start = self.take(n)
        try:
            return self.buf[start:start + n].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"invalid UTF-8 in a string at byte {start}") from None

    def count(self, min_item_bytes: int) -> int:
        # A corrupt count must not send us looping for 2**60 items.
        n = self.scalar("<Q")
        if n * min_item_bytes > self.size - self.pos:
            raise self.fail(f"count {n} at byte {self.pos - 8} exceeds the file")
        return n

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype][0])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise self.fail(f"unknown value type {vtype}")
        itype = self.scalar("<I")
        if itype in _SCALARS:  # numeric arrays in one numpy read (token types, scores)
            dtype = np.dtype(_SCALARS[itype][1])
            n = self.count(dtype.itemsize)
            start = self.take(n * dtype.itemsize)
            return np.frombuffer(self.buf[start:self.pos], dtype=dtype).tolist()
        n = self.count(8 if itype in (_STRING, _ARRAY) else 1)
        return [self.value(itype) for _ in range(n)]


# ---- dequantization ---------------------------------------------------------------------------
# numpy, not torch: numpy's elementwise ops are single-threaded, and torch's two-thread OpenMP
# regions slowed the real model's load from ~1.3 s to ~14 s whenever another process held a
# core (measured on this project's shared 2-core machine).


def _f16(b: np.ndarray) -> np.ndarray:
    # b: [n, 2] uint8 (little-endian half) -> [n, 1] float32
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    # qs: [..., k] uint8 -> [..., 2k]: the low nibbles first (elements 0..k-1), then the high ones
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits(b: np.ndarray, shifts, mask: int) -> np.ndarray:
    # b: [..., k] uint8 -> [..., len(shifts), k]: field `(b >> s) & mask` for each shift
    sh = np.array(shifts, dtype=np.uint8).reshape(-1, 1)
    return (b[..., None, :] >> sh) & np.uint8(mask)


def _high_bits32(qh: np.ndarray) -> np.ndarray:
    # qh: [n, 4] uint8 = one little-endian uint32 -> [n, 32]: bit i belongs to element i
    return _bits(qh, range(8), 1).swapaxes(-1, -2).reshape(qh.shape[0], 32)


def _i8(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.int8)


F32 = np.float32


# ---- 32-weight blocks ----------------------------------------------------------------------
def _q8_0(b):  # f16 d | int8 q[32]: w = q * d
    return _i8(b[:, 2:]).astype(F32) * _f16(b[:, :2])


def _q4_0(b):  # f16 d | 16 bytes of nibbles: w = d * (q - 8)
    q = _nibbles(b[:, 2:]).astype(np.int8) - 8
    return _f16(b[:, :2]) * q.astype(F32)


def _q4_1(b):  # f16 d | f16 m | 16 bytes of nibbles: w = d * q + m
    return _f16(b[:, :2]) * _nibbles(b[:, 4:]).astype(F32) + _f16(b[:, 2:4])


def _q5_0(b):  # f16 d | u32 fifth bits | 16 bytes of nibbles: w = d * (q - 16)
    q = (_nibbles(b[:, 6:]) | (_high_bits32(b[:, 2:6]) << 4)).astype(np.int8) - 16
    return _f16(b[:, :2]) * q.astype(F32)


def _q5_1(b):  # f16 d | f16 m | u32 fifth bits | 16 bytes of nibbles: w = d * q + m
    q = _nibbles(b[:, 8:]) | (_high_bits32(b[:, 4:8]) << 4)
    return _f16(b[:, :2]) * q.astype(F32) + _f16(b[:, 2:4])


# ---- 256-weight super-blocks ---------------------------------------------------------------
def _q2_k(b):  # scales[16] (lo: scale, hi: min) | qs[64] 2-bit | f16 d | f16 dmin
    n = b.shape[0]
    sc = b[:, :16]
    dl = (_f16(b[:, 80:82]) * (sc & 0x0F).astype(F32)).reshape(n, 16, 1)
    ml = (_f16(b[:, 82:84]) * (sc >> 4).astype(F32)).reshape(n, 16, 1)
    # qs as two 32-byte halves; each byte holds 4 weights at shifts 0,2,4,6 -> [n, 16 subs, 16]
    q = _bits(b[:, 16:80].reshape(n, 2, 32), [0, 2, 4, 6], 3).reshape(n, 16, 16).astype(F32)
    return (dl * q - ml).reshape(n, 256)


def _q3_k(b):  # hmask[32] | qs[64] 2-bit | scales[12] (16 x 6-bit, offset 32) | f16 d
    n = b.shape[0]
    sc = b[:, 96:108]
    low = np.concatenate([sc[:, :8] & 0x0F, sc[:, :8] >> 4], axis=-1)  # [n, 16] low 4 bits
    high = _bits(sc[:, 8:12], [0, 2, 4, 6], 3).reshape(n, 16)  # [n, 16] top 2 bits
    scale = ((low | (high << 4)).astype(np.int8) - 32).astype(F32)
    dl = (_f16(b[:, 108:110]) * scale).reshape(n, 16, 1)
    ql = _bits(b[:, 32:96].reshape(n, 2, 32), [0, 2, 4, 6], 3).reshape(n, 16, 16)
    hm = _bits(b[:, :32].reshape(n, 1, 32), range(8), 1).reshape(n, 16, 16)
    # a clear hmask bit means "subtract 4": q in [-4, 3]
    q = ql.astype(np.int8) - ((hm ^ 1) << 2).astype(np.int8)
    return (dl * q.astype(F32)).reshape(n, 256)


def _k_scale_min(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # sc: [n, 12] -> 8 six-bit scales and 8 six-bit mins, [n, 8] each. Bytes 0-3 hold scales
    # 0-3 (+ top bits of 4-7), bytes 4-7 mins 0-3 (+ top bits), bytes 8-11 low nibbles of 4-7.
    d, m, md = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scale = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return scale.astype(F32), mn.astype(F32)


def _q4_k(b):  # f16 d | f16 dmin | scales[12] | qs[128]: w = d*sc*q - dmin*m, 8 subs of 32
    n = b.shape[0]
    scale, mn = _k_scale_min(b[:, 4:16])
    d = (_f16(b[:, :2]) * scale).reshape(n, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn).reshape(n, 8, 1)
    # each 32-byte chunk gives two sub-blocks: low nibbles, then high nibbles
    q = _nibbles(b[:, 16:].reshape(n, 4, 32)).reshape(n, 8, 32).astype(F32)
    return (d * q - dm).reshape(n, 256)


def _q5_k(b):  # f16 d | f16 dmin | scales[12] | qh[32] | qs[128]
    n = b.shape[0]
    scale, mn = _k_scale_min(b[:, 4:16])
    d = (_f16(b[:, :2]) * scale).reshape(n, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn).reshape(n, 8, 1)
    ql = _nibbles(b[:, 48:].reshape(n, 4, 32)).reshape(n, 8, 32)
    qh = _bits(b[:, 16:48], range(8), 1)  # [n, 8, 32]: bit j of byte l -> sub-block j
    return (d * (ql | (qh << 4)).astype(F32) - dm).reshape(n, 256)


def _q6_k(b):  # ql[128] | qh[64] | int8 scales[16] | f16 d: w = d * sc * (q - 32)
    n = b.shape[0]
    # per 128-weight half: ql's 64 low nibbles are weights 0..63, high nibbles 64..127;
    # qh's 32 bytes carry 2 bits for weights l, l+32, l+64, l+96 at shifts 0, 2, 4, 6
    ql = _nibbles(b[:, :128].reshape(n, 2, 64))  # [n, 2, 128]
    qh = _bits(b[:, 128:192].reshape(n, 2, 32), [0, 2, 4, 6], 3).reshape(n, 2, 128)
    q = ((ql | (qh << 4)).astype(np.int8) - 32).reshape(n, 16, 16).astype(F32)
    d = (_f16(b[:, 208:210]) * _i8(b[:, 192:208]).astype(F32)).reshape(n, 16, 1)
    return (d * q).reshape(n, 256)


def _q8_k(b):  # f32 d | int8 q[256] | int16 bsums[16] (sums for dot products; unused here)
    return _i8(b[:, 4:260]).astype(F32) * np.ascontiguousarray(b[:, :4]).view(F32)


def _bf16(b):  # bfloat16 is the top half of a float32
    return (np.ascontiguousarray(b).view(np.uint16).astype(np.uint32) << 16).view(F32)


def _plain(dtype):
    # [n, itemsize] uint8 -> [n, 1] float32 (no copy for float32)
    return lambda b: np.ascontiguousarray(b).view(dtype).astype(F32, copy=False)


@dataclass(frozen=True)
class BlockFormat:
    block: int  # weights per block
    nbytes: int  # bytes per block
    decode: Callable[[np.ndarray], np.ndarray]  # [n, nbytes] uint8 -> [n, block] float32


# ggml type id -> format. Ids are ggml's (GGMLQuantizationType); names come from the gguf package.
FORMATS: dict[int, BlockFormat] = {
    0: BlockFormat(1, 4, _plain(np.float32)),  # F32: a view of the caller's fresh buffer
    1: BlockFormat(1, 2, _plain(np.float16)),  # F16
    30: BlockFormat(1, 2, _bf16),  # BF16
    2: BlockFormat(32, 18, _q4_0),
    3: BlockFormat(32, 20, _q4_1),
    6: BlockFormat(32, 22, _q5_0),
    7: BlockFormat(32, 24, _q5_1),
    8: BlockFormat(32, 34, _q8_0),
    10: BlockFormat(256, 84, _q2_k),
    11: BlockFormat(256, 110, _q3_k),
    12: BlockFormat(256, 144, _q4_k),
    13: BlockFormat(256, 176, _q5_k),
    14: BlockFormat(256, 210, _q6_k),
    15: BlockFormat(256, 292, _q8_k),
}

# Weights decoded per step: bounds the temporaries (a few [chunk, block] arrays) and keeps
# them near the CPU caches.
_CHUNK_WEIGHTS = 1 << 16


def dequantize(raw: np.ndarray, type_id: int, numel: int) -> torch.Tensor:
    """raw: [numel / block * nbytes] uint8, writable -> [numel] float32. Sizes checked by caller."""
    fmt = FORMATS[type_id]
    blocks = raw.reshape(-1, fmt.nbytes)  # [n_blocks, nbytes]
    n_blocks = blocks.shape[0]
    if n_blocks * fmt.block <= _CHUNK_WEIGHTS:
        return torch.from_numpy(fmt.decode(blocks).reshape(numel))
    out = np.empty((n_blocks, fmt.block), dtype=F32)
    step = max(1, _CHUNK_WEIGHTS // fmt.block)
    for start in range(0, n_blocks, step):
        out[start:start + step] = fmt.decode(blocks[start:start + step])
    return torch.from_numpy(out.reshape(numel))
