"""CPU linear layers on weights kept in their GGUF blocks (Q4_1, Q8_0), through csrc/gguf_matmul.c.

Groundwork for packed GGUF inference (issue 7): a decode step at small batch streams every weight
once, and float32 weights are 6x (Q4_1) or 3.8x (Q8_0) the bytes of the blocks. The kernel
dequantizes each block in registers, exactly as the loader does (the same float32 weights, bit for
bit), and multiplies it into up to 8 rows of activations at a time. `BlockOrDenseLinear` puts it
in the model: blocks for decode-sized steps (weight-read bound), the float32 layer for prefill
(compute bound, where oneDNN's packed GEMM is faster than dequantizing every block per row group).
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch
from torch import nn

from nextok.kernels import cpu_build

BLOCK_BYTES = {3: 20, 8: 34}  # ggml type id -> bytes per 32-weight block (Q4_1, Q8_0)
MAX_ROWS = 8  # rows of x per kernel call (the accumulators stay in registers)
_fn = None
_dequant = None


def load_gguf_matmul():
    """The kernel's entry point, or None where it cannot be built."""
    global _fn, _dequant
    if _fn is None:
        lib = cpu_build.load("gguf_matmul")
        if lib is None:
            return None
        fn = lib.gguf_matmul_f32
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                       ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        deq = lib.gguf_dequant_f32
        deq.restype = ctypes.c_int
        deq.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                        ctypes.c_int]
        _fn, _dequant = fn, deq
    return _fn


class GGUFBlockLinear:
    """y = x @ W.T + b, W [out, in] held as its GGUF blocks: blocks [out, in / 32 * bytes] uint8."""

    def __init__(self, blocks: np.ndarray | torch.Tensor, type_id: int, out_features: int,
                 in_features: int, bias: torch.Tensor | None = None):
        if type_id not in BLOCK_BYTES:
            raise ValueError(f"ggml type {type_id} has no block kernel (Q4_1 = 3, Q8_0 = 8)")
        if in_features % 32:
            raise ValueError(f"in_features {in_features} is not a multiple of the 32-weight block")
        raw = (blocks.to(torch.uint8) if isinstance(blocks, torch.Tensor)
               else torch.from_numpy(np.array(blocks, dtype=np.uint8)))  # a copy: ours to keep
        want = out_features * in_features // 32 * BLOCK_BYTES[type_id]
        if raw.numel() != want:
            raise ValueError(f"{raw.numel()} bytes of blocks, {want} expected for [{out_features}, {in_features}]")
        self.blocks = raw.reshape(out_features, -1).contiguous()
        self.type_id, self.out_features, self.in_features = type_id, out_features, in_features
        self.bias = bias
        self.fn = load_gguf_matmul()
        if self.fn is None:
            raise RuntimeError("the gguf_matmul kernel could not be built (no C compiler?)")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, in] float32 -> [T, out] float32, 8 rows per kernel call."""
        x = x.contiguous()
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"x must be float32 [T, {self.in_features}], not {x.dtype} {list(x.shape)}")
        y = torch.empty(x.shape[0], self.out_features, dtype=torch.float32)
        for start in range(0, x.shape[0], MAX_ROWS):
            rows = min(MAX_ROWS, x.shape[0] - start)
            rc = self.fn(x[start].data_ptr(), rows, self.in_features, self.blocks.data_ptr(), self.type_id,
                         self.out_features, y[start].data_ptr(), torch.get_num_threads())
            if rc != 0:
                raise RuntimeError("gguf_matmul_f32 refused its arguments")
        return y if self.bias is None else y + self.bias

    def dequantize(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The float32 weight [out, in] (into `out` if given, e.g. a reused scratch matrix)."""
        if out is None:
            out = torch.empty(self.out_features, self.in_features, dtype=torch.float32)
        rc = _dequant(self.blocks.data_ptr(), self.type_id, self.out_features, self.in_features,
                      out.data_ptr(), torch.get_num_threads())
        if rc != 0:
            raise RuntimeError("gguf_dequant_f32 refused its arguments")
        return out


class BlockLinear(nn.Module):
    """A linear layer whose only weights are GGUF blocks. x: [T, in] float32 -> [T, out].
    Steps of up to `max_rows` rows read the blocks directly (gguf_matmul); bigger ones (prefill,
    large decode batches) dequantize the weight into a scratch matrix shared by every BlockLinear
    and multiply it with oneDNN/MKL: one dequantization per call, amortized over the rows."""

    _scratch = torch.empty(0)  # float32, grown to the largest weight seen; one for all layers

    def __init__(self, blocks: GGUFBlockLinear, max_rows: int = MAX_ROWS):
        super().__init__()
        self.blocks, self.max_rows = blocks, max_rows
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
        return f"type={self.blocks.type_id}, in={self.in_features}, out={self.out_features}"


class BlockOrDenseLinear(nn.Module):
    """One linear layer held twice: as GGUF blocks for steps of at most `max_rows` rows, and as its
    float32 layer (`dense`, e.g. a PackedLinear) for bigger ones. x: [T, in] -> [T, out].

    Measured over all the default model's matrices (2-core AVX2, ms): blocks 18 / 26 / 36 at
    1 / 4 / 8 rows, oneDNN float32 57 / 68 / 71; beyond 8 rows the blocks would be dequantized
    again for every 8, so the dense layer takes over."""

    def __init__(self, dense: nn.Module, blocks: GGUFBlockLinear, max_rows: int = MAX_ROWS):
        super().__init__()
        if (blocks.out_features, blocks.in_features) != (dense.out_features, dense.in_features):
            raise ValueError(f"blocks [{blocks.out_features}, {blocks.in_features}] do not match the "
                             f"layer [{dense.out_features}, {dense.in_features}]")
        self.dense, self.blocks, self.max_rows = dense, blocks, max_rows
        self.in_features, self.out_features = dense.in_features, dense.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= self.max_rows and x.dtype == torch.float32:
            return self.blocks(x)
        return self.dense(x)

    def extra_repr(self) -> str:
        return f"type={self.blocks.type_id}, blocks up to {self.max_rows} rows"
