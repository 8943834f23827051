"""CPU linear layers on weights kept in their GGUF blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
(csrc/gguf_matmul.c) and the K-quants Q4_K, Q5_K, Q6_K (csrc/gguf_unpacked.c).

Packed GGUF inference (issue 7): a decode step at small batch streams every weight once, and
float32 weights are 6x (Q4_1) or 3.8x (Q8_0) the bytes of the blocks. Two kernels per source:
  float32 (default): each block is dequantized in registers exactly as the loader does (the same
    float32 weights, bit for bit) and multiplied into up to 8 rows of float32 activations at a
    time. A row's result depends only on that row, whatever the batch (the engine's invariants:
    batched == one at a time, speculation on == off).
  int8 (--gguf-activations int8; `auto` on a bfloat16 model): each row of x is quantized per 32
    values to int8 with a float scale, as llama.cpp does, and each block's dot product is an
    integer one (VNNI); ~2x faster at one row, relative error ~1e-3 per layer output. Every type
    on AVX-512 VNNI or AVX2: the blocks regrouped 16 weight rows at a time at load
    (csrc/gguf_rows16.c, csrc/gguf_rows16_avx2.h, the same results on both), so 8 rows cost 1.4x
    one row on AVX-512 (2.6x read a row at a time), and a row's result does not depend on the
    batch up to the row limit. CPUs without AVX2 read them a row at a time, where 2+ rows sum
    in another order than 1. Steps of more rows than the blocks take go to the dense weights.
`BlockOrDenseLinear` puts them in the model: blocks for decode-sized steps (weight-read bound), the
float32 layer for prefill (compute bound, where oneDNN's packed GEMM is faster than dequantizing
every block per row group).
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from nextok.kernels import cpu_build

# ggml type id -> (weights per block, bytes per block, the C source of its kernels). gguf_matmul.c
# reads 32-weight blocks as they are; gguf_unpacked.c first unpacks each 256-weight K-quant
# super-block into one common form. Q5_0 is what a Q4_K_M file holds where a row is not a multiple
# of 256 weights (the default model's 576-wide matrices), Q8_0 where Q6_K would be.
BLOCK_TYPES = {
    2: (32, 18, "gguf_matmul"),  # Q4_0
    3: (32, 20, "gguf_matmul"),  # Q4_1
    6: (32, 22, "gguf_matmul"),  # Q5_0
    7: (32, 24, "gguf_matmul"),  # Q5_1
    8: (32, 34, "gguf_matmul"),  # Q8_0
    12: (256, 144, "gguf_unpacked"),  # Q4_K
    13: (256, 176, "gguf_unpacked"),  # Q5_K
    14: (256, 210, "gguf_unpacked"),  # Q6_K
}
TYPE_NAMES = {2: "Q4_0", 3: "Q4_1", 8: "Q8_0", 6: "Q5_0", 7: "Q5_1", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
MAX_ROWS = 8  # rows of x per float32-kernel call (the accumulators stay in registers)
# Steps of up to this many rows read the blocks through the int8 kernel; bigger ones take the
# float32 dense copy (BlockOrDenseLinear) or dequantize + oneDNN (BlockLinear, --gguf-blocks-only).
# All the default model's 211 matrices once, 2-core AVX-512 Xeon, 2 threads, ms
# (benchmarks/results/2026-12-04-gguf-matmul-cpu-int8-r2.txt):
#   rows                 1     2     4     8    12    16    24    32    48
#   blocks int8         6.6   7.6   9.6  17.2  25.5  32.1  48.4  67.3  99.6
#   blocks float32     17.5  18.1  21.8  28.4  (8 rows per call)
#   oneDNN float32     27.9  29.3  30.3  35.4  39.4  43.4  50.6  58.7  75.9   (the dense copy)
#   dequant + oneDNN   31.7  31.2  40.5  49.8  59.4  57.2  67.1  72.5  84.9   (blocks only)
#   oneDNN bfloat16    17.5  17.6  17.6  17.6  18.3  19.1  21.1  20.9  21.4   (AMX; --dtype bfloat16)
# (24 rows against the dense copy is a tie: 48.4 vs 50.6 here, 48.6 vs 47.3 in an earlier run.)
INT8_DENSE_MAX_ROWS = 16
INT8_BLOCKS_MAX_ROWS = 32
# Beside a bfloat16 dense copy (oneDNN on AMX, flat ~18 ms for every row count above) the int8
# blocks pay up to 8 rows (17.2 ms there, a tie).
INT8_BF16_DENSE_MAX_ROWS = 8
# Q4_0, Q4_1 and Q8_0 with int8 activations on AVX-512 VNNI: the blocks regrouped 16 weight rows
# at a time at load (csrc/gguf_rows16.c), one vpdpbusd advancing 16 outputs. All the default
# model's matrices through these layers, same machine, passes interleaved (2026-12-05,
# benchmarks/results/2026-12-05-gguf-rows16-cpu.txt), ms:
#   rows                  1     2     4     8    16    24    32    48
#   int8, 16 rows         5.4   5.5   6.0   7.4  10.4  15.4  17.7  27.4
#   int8, a row at a time 6.3   7.7   9.7  16.4  31.2  49.7  64.3  97.2   (gguf_matmul_q8, direct)
#   oneDNN bfloat16      16.7  16.5  16.5  16.7  17.2  19.3  19.6  20.2
#   oneDNN float32       27.3  27.9  28.4  33.7  40.1  49.0  55.0  72.5
# so they take steps of up to 48 rows beside a float32 copy (or alone: dequantize + oneDNN
# float32 is 80 ms at 48), and of up to 32 beside a bfloat16 one, which they take in bfloat16 and
# give back in bfloat16 (BlockOrDenseLinear): in the engine, 32 requests of 128 -> 128 tokens on
# the bf16 model took 6.37 s with 32-row steps on the blocks, 6.62 at 16 and 6.66 s without
# blocks (3 interleaved rounds). Before the bf16 call (x converted to float32 and back around
# each block call, x quantized on one thread) 32-row steps on the blocks were 3 % slower than
# none (6.76 vs 6.57 s; a server comparison read 0.93x,
# benchmarks/results/2026-12-05-compare-bf16-blocks-vs-bf16-dense-c32-rows16.md).
# On the 2-core AMD EPYC (AVX2 only, csrc/gguf_rows16_avx2.h), the same passes, ms
# (benchmarks/results/2026-12-07-gguf-rows16-avx2-cpu.txt):
#   rows                  1     2     4     8    16    32    48
#   int8, 16 rows         6.4   6.9   8.2  13.3  23.6  45.1  65.6
#   int8, a row at a time 7.4   9.9  13.6  25.2  48.8  96.7 146.8   (gguf_matmul_q8, direct)
#   oneDNN float32       31.3  34.5  37.8  46.9  59.6  83.7 116.5
# (at one row much of the 6.4 ms is the 211 calls' own cost: one Q4_1 gate_up alone, 60 copies
# out of cache, 55 us against 80; in cache 27 against 93), so the same row limits hold there.
# Since 2026-12-07 also Q5_0, Q5_1 and the K-quants (the same arithmetic as their row-at-a-time
# kernels): the Q4_K_M file's matrices (Q5_0, Q4_K, Q6_K, Q8_0) on the 2-core AVX2 machine, ms
# (benchmarks/results/2026-12-07-gguf-rows16-kquants-avx2-cpu.txt):
#   rows                  1     2     4     8    16    32
#   int8, 16 rows         6.4   7.0   9.6  15.9  27.6  51.6
#   int8, a row at a time 9.4  11.5  17.8  31.9  62.4 122.1
#   oneDNN float32       30.0  28.6  33.3  43.2  56.0  82.6
ROWS16_TYPES = (2, 3, 6, 7, 8, 12, 13, 14)
ROWS16_DENSE_MAX_ROWS = 48
ROWS16_BF16_DENSE_MAX_ROWS = 32
ACTIVATIONS = ("int8", "float32")  # --gguf-activations
_ARGTYPES = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
             ctypes.c_void_p, ctypes.c_int]
_DEQUANT_ARGTYPES = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
# source -> its entry points: (float32 matmul, int8 matmul, dequantize)
_SYMBOLS = {"gguf_matmul": ("gguf_matmul_f32", "gguf_matmul_q8", "gguf_dequant_f32"),
            "gguf_unpacked": ("gguf_kq_matmul_f32", "gguf_kq_matmul_q8", "gguf_kq_dequant_f32")}
_libs: dict[str, dict[str, object] | None] = {}


def _kernels(source: str) -> dict[str, object] | None:
    """{"float32": fn, "int8": fn, "dequant": fn} of one C source, or None where it cannot be built."""
    if source not in _libs:
        lib = cpu_build.load(source)
        fns = None
        if lib is not None:
            f32, q8, deq = (getattr(lib, name) for name in _SYMBOLS[source])
            for fn, argtypes in ((f32, _ARGTYPES), (q8, _ARGTYPES), (deq, _DEQUANT_ARGTYPES)):
                fn.restype, fn.argtypes = ctypes.c_int, argtypes
            fns = {"float32": f32, "int8": q8, "dequant": deq}
        _libs[source] = fns
    return _libs[source]


_rows16_lib: list = []


def _rows16() -> dict[str, object] | None:
    """{"pack", "matmul", "dequant"} of csrc/gguf_rows16.c where this CPU runs its int8 kernel
    (AVX-512 VNNI or AVX2), else None."""
    if not _rows16_lib:
        lib = cpu_build.load("gguf_rows16")
        fns = None
        if lib is not None and lib.gguf_rows16_ready() != 0:
            pack, mm, deq = lib.gguf_rows16_pack, lib.gguf_rows16_matmul_q8, lib.gguf_rows16_dequant_f32
            mm16, size = lib.gguf_rows16_matmul_q8_bf16, lib.gguf_rows16_packed_bytes
            pack.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
            size.argtypes, size.restype = [ctypes.c_int, ctypes.c_int, ctypes.c_int], ctypes.c_long
            mm.argtypes, mm16.argtypes, deq.argtypes = _ARGTYPES, _ARGTYPES, _DEQUANT_ARGTYPES
            for fn in (pack, mm, mm16, deq):
                fn.restype = ctypes.c_int
            fns = {"pack": pack, "matmul": mm, "matmul_bf16": mm16, "dequant": deq, "packed_bytes": size}
        _rows16_lib.append(fns)
    return _rows16_lib[0]


def load_gguf_matmul(activations: str = "float32", type_id: int = 3):
    """The kernel's entry point for float32 or int8 activations on `type_id`'s blocks, or None where it
    cannot be built."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"GGUF block activations must be one of {', '.join(ACTIVATIONS)}, not {activations!r}")
    fns = _kernels(BLOCK_TYPES[type_id][2])
    return None if fns is None else fns[activations]


def supported_types() -> tuple[int, ...]:
    """The ggml types whose block kernels this machine has (built here, cached)."""
    return tuple(t for t, (_, _, source) in BLOCK_TYPES.items() if _kernels(source) is not None)


def type_name(type_id: int) -> str:
    return TYPE_NAMES.get(type_id, f"ggml type {type_id}")


class _Segment:
    """Output rows [start, start + rows) of a layer, held as blocks of one type: [rows, row bytes]."""

    def __init__(self, type_id: int, raw: torch.Tensor, start: int, rows: int, in_features: int,
                 activations: str):
        if type_id not in BLOCK_TYPES:
            known = ", ".join(f"{name} = {t}" for t, name in TYPE_NAMES.items())
            raise ValueError(f"ggml type {type_id} has no block kernel (those with one: {known})")
        per_block, nbytes, source = BLOCK_TYPES[type_id]
        if in_features % per_block:
            raise ValueError(f"in_features {in_features} is not a multiple of {type_name(type_id)}'s "
                             f"{per_block}-weight block")
        want = rows * in_features // per_block * nbytes
        if raw.numel() != want:
            raise ValueError(f"{raw.numel()} bytes of {type_name(type_id)} blocks, {want} expected for "
                             f"[{rows}, {in_features}]")
        fns = _kernels(source)
        if fns is None:
            raise RuntimeError(f"the {source} kernel could not be built (no C compiler?)")
        self.type_id, self.start, self.rows = type_id, start, rows
        self.fn, self.dequant = fns[activations], fns["dequant"]
        self.blocks = raw.reshape(rows, -1).contiguous()
        rows16 = _rows16() if activations == "int8" and type_id in ROWS16_TYPES else None
        self.rows16 = rows16 is not None
        if rows16 is not None:  # regrouped: flat uint8, 16 rows at a time (csrc/gguf_rows16.c)
            packed = torch.empty(rows16["packed_bytes"](type_id, rows, in_features), dtype=torch.uint8)
            if rows16["pack"](self.blocks.data_ptr(), type_id, rows, in_features, packed.data_ptr()) != 0:
                raise RuntimeError(f"regrouping {type_name(type_id)} blocks refused its arguments")
            self.blocks, self.fn, self.dequant = packed, rows16["matmul"], rows16["dequant"]
            self.fn_bf16 = rows16["matmul_bf16"]
        self.ptr = self.blocks.data_ptr()  # self.blocks is never replaced


def _as_bytes(blocks: np.ndarray | torch.Tensor) -> torch.Tensor:
    return (blocks.to(torch.uint8) if isinstance(blocks, torch.Tensor)
            else torch.from_numpy(np.array(blocks, dtype=np.uint8)))  # a copy: ours to keep


class GGUFBlockLinear:
    """y = x @ W.T + b, W [out, in] held as its GGUF blocks: blocks [out, in / block * bytes] uint8.
    GGUFBlockLinear.of_parts holds a fused matrix whose parts differ in type (as in *_K_M files:
    q and k Q4_K, v Q6_K), each part's output rows run by its own kernel."""

    def __init__(self, blocks: np.ndarray | torch.Tensor, type_id: int, out_features: int,
                 in_features: int, bias: torch.Tensor | None = None, activations: str = "float32"):
        self._init([(type_id, _as_bytes(blocks), out_features)], in_features, bias, activations)

    @classmethod
    def of_parts(cls, parts: list[tuple[int, np.ndarray | torch.Tensor, int]], in_features: int,
                 bias: torch.Tensor | None = None, activations: str = "float32") -> "GGUFBlockLinear":
        """parts: (ggml type, blocks, output rows), stacked in output rows in this order."""
        layer = cls.__new__(cls)
        layer._init([(t, _as_bytes(b), rows) for t, b, rows in parts], in_features, bias, activations)
        return layer

    def _init(self, parts, in_features: int, bias, activations: str) -> None:
        if activations not in ACTIVATIONS:
            raise ValueError(f"GGUF block activations must be one of {', '.join(ACTIVATIONS)}, not {activations!r}")
        self.segments, start = [], 0
        for type_id, raw, rows in parts:
            self.segments.append(_Segment(type_id, raw, start, rows, in_features, activations))
            start += rows
        self.type_id = self.segments[0].type_id
        self.types = tuple(seg.type_id for seg in self.segments)
        self.out_features, self.in_features = start, in_features
        self.bias = bias
        # int8: any number of rows per call (x quantized once per call, each weight read once);
        # float32: at most MAX_ROWS per call. *_max_rows: the steps the blocks should serve, with
        # a float32 dense copy beside them or as the only weights.
        int8 = activations == "int8"
        rows16 = all(seg.rows16 for seg in self.segments)
        self.activations = activations
        self.rows_per_call = 1 << 30 if int8 else MAX_ROWS
        self.dense_max_rows = (ROWS16_DENSE_MAX_ROWS if rows16 else INT8_DENSE_MAX_ROWS) if int8 else MAX_ROWS
        self.blocks_max_rows = (ROWS16_DENSE_MAX_ROWS if rows16 else INT8_BLOCKS_MAX_ROWS) if int8 else MAX_ROWS
        # the rows up to which the blocks beat a bfloat16 dense copy (use_gguf_blocks)
        self.bf16_dense_max_rows = ROWS16_BF16_DENSE_MAX_ROWS if rows16 else INT8_BF16_DENSE_MAX_ROWS

    @property
    def nbytes(self) -> int:
        """Bytes of blocks held (what a step reading them streams)."""
        return sum(seg.blocks.numel() for seg in self.segments)

    @property
    def blocks(self) -> torch.Tensor:
        """The blocks of a one-type layer, [out, in / block * bytes] uint8 (regrouped 16 rows at a
        time, flat, where the int8 kernel of csrc/gguf_rows16.c reads them)."""
        if len(self.segments) != 1:
            raise AttributeError("a layer of several block types has no single blocks tensor")
        return self.segments[0].blocks

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, in] float32 -> [T, out] float32 (float32 activations: 8 rows per kernel call).
        Row pointers by arithmetic, not x[start] views: at one row this wrapper's own cost is
        ~200 calls x a few us per decode step, next to a ~7 ms kernel total."""
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"x must be float32 [T, {self.in_features}], not {x.dtype} {list(x.shape)}")
        x = x.contiguous()
        t, k, step = x.shape[0], self.in_features, self.rows_per_call
        y = torch.empty(t, self.out_features, dtype=torch.float32)
        xp, threads = x.data_ptr(), torch.get_num_threads()
        for seg in self.segments:
            # one part: straight into y; several: each into its own [T, rows], then y's columns
            out = y if len(self.segments) == 1 else torch.empty(t, seg.rows, dtype=torch.float32)
            yp, n = out.data_ptr(), seg.rows
            for start in range(0, t, step):
                rc = seg.fn(xp + 4 * start * k, min(step, t - start), k, seg.ptr, seg.type_id, n,
                            yp + 4 * start * n, threads)
                if rc != 0:
                    raise RuntimeError(f"the {type_name(seg.type_id)} block kernel ({self.activations}) "
                                       f"refused its arguments ({rc})")
            if out is not y:
                y[:, seg.start:seg.start + seg.rows] = out
        return y if self.bias is None else y + self.bias

    def bf16_call(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """x [T, in] bfloat16 -> [T, out] bfloat16, one kernel call per part (the same values as
        self(x.float()).to(bfloat16)), for a regrouped layer without bias; else None."""
        if not all(seg.rows16 for seg in self.segments) or self.bias is not None:
            return None
        segs, k, n = self.segments, self.in_features, self.out_features

        def call(x: torch.Tensor) -> torch.Tensor:
            x = x.contiguous()
            t, threads = x.shape[0], torch.get_num_threads()
            y = torch.empty(t, n, dtype=torch.bfloat16)
            for seg in segs:  # several parts: each into its own [T, rows], then y's columns
                out = y if len(segs) == 1 else torch.empty(t, seg.rows, dtype=torch.bfloat16)
                rc = seg.fn_bf16(x.data_ptr(), t, k, seg.ptr, seg.type_id, seg.rows, out.data_ptr(), threads)
                if rc != 0:
                    raise RuntimeError(f"the {type_name(seg.type_id)} block kernel (int8, bfloat16) refused its arguments ({rc})")
                if out is not y:
                    y[:, seg.start:seg.start + seg.rows] = out
            return y

        return call

    def dequantize(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The float32 weight [out, in] (into `out` if given, e.g. a reused scratch matrix)."""
        if out is None:
            out = torch.empty(self.out_features, self.in_features, dtype=torch.float32)
        for seg in self.segments:
            rc = seg.dequant(seg.ptr, seg.type_id, seg.rows, self.in_features,
                             out[seg.start:seg.start + seg.rows].data_ptr(), torch.get_num_threads())
            if rc != 0:
                raise RuntimeError(f"dequantizing {type_name(seg.type_id)} blocks refused its arguments")
        return out


class BlockLinear(nn.Module):
    """A linear layer whose only weights are GGUF blocks. x: [T, in] float32 -> [T, out].
    Steps of up to `max_rows` rows read the blocks directly (gguf_matmul); bigger ones (prefill,
    large decode batches) dequantize the weight into a scratch matrix shared by every BlockLinear
    and multiply it with oneDNN/MKL: one dequantization per call, amortized over the rows."""

    _scratch = torch.empty(0)  # float32, grown to the largest weight seen; one for all layers

    def __init__(self, blocks: GGUFBlockLinear, max_rows: int | None = None):
        super().__init__()
        self.blocks = blocks
        self.max_rows = blocks.blocks_max_rows if max_rows is None else max_rows
        self.in_features, self.out_features = blocks.in_features, blocks.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:  # the kernels compute in float32
            return self.forward(x.float()).to(x.dtype)
        if x.shape[0] <= self.max_rows:
            return self.blocks(x)
        n = self.out_features * self.in_features
        if BlockLinear._scratch.numel() < n:
            BlockLinear._scratch = torch.empty(n, dtype=torch.float32)
        w = self.blocks.dequantize(BlockLinear._scratch[:n].view(self.out_features, self.in_features))
        return nn.functional.linear(x.contiguous(), w, self.blocks.bias)

    def extra_repr(self) -> str:
        return (f"types={'+'.join(map(type_name, self.blocks.types))}, in={self.in_features}, out={self.out_features}, "
                f"{self.blocks.activations} up to {self.max_rows} rows")


class BlockOrDenseLinear(nn.Module):
    """One linear layer held twice: as GGUF blocks for steps of at most `max_rows` rows, and as its
    float32 or bfloat16 layer (`dense`, e.g. a PackedLinear) for bigger ones. x: [T, in] -> [T, out].

    float32 activations, measured over all the default model's matrices (2-core AVX2, ms): blocks
    18 / 26 / 36 at 1 / 4 / 8 rows, oneDNN float32 57 / 68 / 71; beyond 8 rows the blocks would be
    dequantized again for every 8, so the dense layer takes over. int8: INT8_DENSE_MAX_ROWS."""

    def __init__(self, dense: nn.Module, blocks: GGUFBlockLinear, max_rows: int | None = None):
        super().__init__()
        if (blocks.out_features, blocks.in_features) != (dense.out_features, dense.in_features):
            raise ValueError(f"blocks [{blocks.out_features}, {blocks.in_features}] do not match the "
                             f"layer [{dense.out_features}, {dense.in_features}]")
        self.dense, self.blocks = dense, blocks
        self.max_rows = blocks.dense_max_rows if max_rows is None else max_rows
        self.in_features, self.out_features = dense.in_features, dense.out_features
        # bfloat16 in and out of the regrouped int8 kernel, without the float32 copies around it
        # (~0.3 ms of a one-token bf16 step on the default model, 121 calls)
        self._bf16_call = blocks.bf16_call()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.max_rows:
            # .forward, not __call__: the dense layer has no hooks, and at 211 layers a step
            # the module call's own cost showed (~1 % of a 32-row bf16 step)
            return self.dense.forward(x)
        if x.dtype == torch.float32:
            return self.blocks(x)
        if x.dtype == torch.bfloat16 and self._bf16_call is not None:
            return self._bf16_call(x)
        return self.blocks(x.float()).to(x.dtype)  # bfloat16 model: the kernels take float32

    # Called straight, not through nn.Module.__call__ (no hooks are ever set on it): the module
    # call's own cost, ~211 times a step, made the bf16 model with blocks ~1-2 % slower than
    # without them at 32 rows, where both run the same dense layer.
    __call__ = forward

    def extra_repr(self) -> str:
        return (f"types={'+'.join(map(type_name, self.blocks.types))}, {self.blocks.activations} blocks "
                f"up to {self.max_rows} rows")
