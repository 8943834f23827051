"""GGUF checkpoints kept packed on CUDA: each linear holds its raw ggml blocks (Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) and no dense weight.

Decode-sized steps (<= kernel_rows() rows) run the Triton kernel that dequantizes in registers
(kernels/triton/gguf_linear.py): a step streams the blocks, 2-4x fewer bytes than bfloat16.
Bigger ones (prefill, large batches) dequantize the weight into a scratch matrix shared by every
layer, then one dense matmul: the dequantization is amortized over the rows. KERNEL_ROWS is 16
until the kernel's blocks of 32-64 rows are timed against that on a GPU; NEXTOK_GGUF_ROWS
(1..MAX_ROWS) moves it.

A fused matrix (qkv, gate_up) takes its shards' blocks in output-row order; shards of one type
are concatenated into one matrix, and shards of different types (*_K_M files: a Q6_K v_proj
beside Q4_K q and k) stay separate matrices of the same layer, each writing its columns of the
one output (no concatenation per step).
"""
from __future__ import annotations

import torch
from torch import nn

from nextok.kernels.triton.gguf_linear import MAX_ROWS, NAMES, TYPES, check, dequantize, gguf_matmul
from nextok.kernels.triton.tile_tables import rows_limit

TYPE_IDS = tuple(TYPES)  # the ggml types a GGUFLinear holds
KERNEL_ROWS = 16  # steps of up to this many rows take the kernel


def kernel_rows() -> int:
    """KERNEL_ROWS, or NEXTOK_GGUF_ROWS (a whole number in 1..MAX_ROWS; NextokError otherwise)."""
    return rows_limit("gguf", KERNEL_ROWS, 1, MAX_ROWS)


# Elements of the shared scratch matrix, at most: 256 MB in bfloat16. Every Llama-3.1-8B decoder
# matrix fits whole; a bigger one (a 128k-row lm_head) is dequantized and multiplied in row chunks.
SCRATCH_LIMIT = 1 << 27
_scratch: dict[tuple[str, torch.dtype], torch.Tensor] = {}


def scratch(device: torch.device, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """A flat buffer of >= numel elements, shared by the layers built on (device, dtype). Grown
    by replacing it: layers keep the one they were given alive (a captured CUDA graph holds its
    address), so growing only wastes the old buffer, never frees it under a graph."""
    key = (str(device), dtype)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < numel:
        buf = _scratch[key] = torch.empty(numel, dtype=dtype, device=device)
    return buf


class GGUFLinear(nn.Module):
    """y = x @ W.T + bias, W [out, in] held only as GGUF blocks. x: [T, in] -> [T, out], x's dtype.

    shards: (ggml type, blocks uint8 [rows, in / QK * NB]) in output-row order, on the device;
    dtype: the model's, for the shared scratch matrix of bigger steps."""

    def __init__(self, shards: list[tuple[int, torch.Tensor]], in_features: int,
                 bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__()
        merged: list[tuple[int, list[torch.Tensor]]] = []
        for type_id, raw in shards:
            check(type_id, raw.shape[0], in_features, raw.contiguous())
            if merged and merged[-1][0] == type_id:
                merged[-1][1].append(raw)
            else:
                merged.append((type_id, [raw]))
        self.in_features = in_features
        self.types: list[int] = []
        self.offsets: list[int] = []  # each matrix's first output row
        rows = 0
        for i, (type_id, parts) in enumerate(merged):
            blocks = torch.cat(parts).contiguous() if len(parts) > 1 else parts[0].contiguous()
            self.register_buffer(f"blocks{i}", blocks)
            self.types.append(type_id)
            self.offsets.append(rows)
            rows += blocks.shape[0]
        self.out_features = rows
        if bias is not None and tuple(bias.shape) != (rows,):
            raise ValueError(f"bias of shape {list(bias.shape)} for {rows} output rows")
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))
        device = self.blocks0.device
        self._scratch = scratch(device, dtype, min(rows * in_features, SCRATCH_LIMIT))
        self.kernel_rows = kernel_rows()

    def matrices(self) -> list[tuple[int, int, torch.Tensor]]:
        """(first output row, ggml type, blocks) of each matrix."""
        return [(off, t, getattr(self, f"blocks{i}"))
                for i, (off, t) in enumerate(zip(self.offsets, self.types))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in] -> [T, out]
        if x.stride(-1) != 1:
            x = x.contiguous()
        bias = self.bias if self.bias is None or self.bias.dtype == x.dtype else self.bias.to(x.dtype)
        if x.shape[0] <= self.kernel_rows:
            return self._blocks_step(x, bias)
        return self._dense_step(x, bias)

    def _blocks_step(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        mats = self.matrices()
        if len(mats) == 1:
            return gguf_matmul(x, mats[0][2], mats[0][1], self.in_features, bias)
        y = torch.empty(x.shape[0], self.out_features, dtype=x.dtype, device=x.device)
        for off, type_id, blocks in mats:  # each matrix writes its columns of y
            end = off + blocks.shape[0]
            gguf_matmul(x, blocks, type_id, self.in_features,
                        None if bias is None else bias[off:end], out=y[:, off:end])
        return y

    def _dense_step(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Dequantize into the scratch matrix (in row chunks if it holds less than W), then
        multiply: one dequantization per call, whatever the rows."""
        k, n = self.in_features, self.out_features
        buf = self._scratch
        if buf.dtype != x.dtype:  # not the model's dtype (checks): a buffer of its own
            buf = torch.empty(min(n * k, SCRATCH_LIMIT), dtype=x.dtype, device=x.device)
        step = max(1, min(n, buf.numel() // k))
        if step == n:
            return nn.functional.linear(x, self._dequantize_rows(0, n, buf), bias)
        y = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
        for a in range(0, n, step):
            b = min(n, a + step)
            y[:, a:b] = nn.functional.linear(x, self._dequantize_rows(a, b, buf),
                                             None if bias is None else bias[a:b])
        return y

    def _dequantize_rows(self, a: int, b: int, buf: torch.Tensor) -> torch.Tensor:
        """Rows a..b of W -> a [b - a, in] view at the start of buf."""
        w = buf[:(b - a) * self.in_features].view(b - a, self.in_features)
        for off, type_id, blocks in self.matrices():
            lo, hi = max(a, off), min(b, off + blocks.shape[0])
            if lo < hi:
                dequantize(blocks[lo - off:hi - off], type_id, self.in_features, w[lo - a:hi - a])
        return w

    def extra_repr(self) -> str:
        types = "+".join(NAMES[t] for t in self.types)
        return f"in={self.in_features}, out={self.out_features}, {types} blocks up to {self.kernel_rows} rows"
