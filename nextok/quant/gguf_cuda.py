"""GGUF checkpoints kept packed on CUDA: each linear holds its quantized weights and no dense
weight.

- Q4_0, Q4_1 and Q4_K matrices (INT4_TYPES) are converted at load to the W4A16 layout
  (quant/int4.py Int4Linear: the same 4-bit q, a float16 scale and min per 32 weights; 5 bits a
  weight, Q4_K's 4.5 + its float16 rounding of d * sc) and run the W4A16 kernels, as
  `--quantization int4` does.
- Q8_0, Q5_0, Q5_1, Q5_K and Q6_K matrices (INT8_TYPES) are converted at load to int8 q with
  float16 scales (and mins) per group of 32 weights (16 for Q6_K) and run the W8A16 kernel
  (quant/int8.py Int8Linear). Q8_0 keeps its 8.5 bits a weight and is exact, as are Q5_0 and
  Q5_1 (8.5 and 9 bits, from 5.5 and 6); Q5_K (9 bits, from 5.5) and Q6_K (9, from 6.56) round
  their sub-block scales to float16 as Q4_K does. The GGUF kernel below reads every weight byte
  alone (its block sizes leave no aligned words) and was slower than bf16 at every point.
- With int8=False (--gguf-blocks-only: the least memory) those types keep their raw ggml
  blocks. Steps of up to kernel_rows() rows run the Triton kernel that dequantizes them in
  registers (kernels/triton/gguf_linear.py); bigger ones (prefill, large batches) dequantize
  the weight into a scratch matrix shared by every layer, then one dense matmul. KERNEL_ROWS is
  32: at 32 rows the kernel beat dequantize + cuBLAS for every type and 8B shape, at 64 it lost
  at some (H100, 2026-12-06-gguf-h100.md); NEXTOK_GGUF_ROWS (1..MAX_ROWS) moves it.

A fused matrix (qkv, gate_up) takes its shards in output-row order; shards of one type are
concatenated into one matrix, and shards of different types (*_K_M files: a Q6_K v_proj beside
Q4_K q and k) stay separate matrices of the same layer, each writing its columns of the one
output.
"""
from __future__ import annotations

import torch
from torch import nn

from nextok.kernels.triton.gguf_linear import MAX_ROWS, NAMES, TYPES, check, dequantize, gguf_matmul
from nextok.kernels.triton.tile_tables import rows_limit
from nextok.model import gguf_format
from nextok.quant.int4 import Int4Linear, unpack_nibbles
from nextok.quant.int8 import Int8Linear

TYPE_IDS = tuple(TYPES)  # the ggml types a GGUFLinear holds
# Q4_0, Q4_1, Q4_K: 4-bit q with a scale and a min per 32 weights, the W4A16 layout's own form
# (quant/int4.py Int4Linear), whose kernels read 2.6 TB/s where the GGUF kernel's byte gathers
# read 0.3-0.6 (H100, 2026-12-06-gguf-h100.md): such matrices are converted at load
INT4_TYPES = (2, 3, 12)
# Q8_0, Q5_0, Q5_1, Q5_K, Q6_K: int8 q with float16 scales (and mins) per group (int8_groups)
INT8_TYPES = (8, 6, 7, 13, 14)
KERNEL_ROWS = 32  # steps of up to this many rows take the GGUF kernel


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


def _f16(b: torch.Tensor, lo: int) -> torch.Tensor:
    """The little-endian half at byte lo of each block b [n, blocks, NB] -> float32 [n, blocks, 1]."""
    return b[:, :, lo:lo + 2].contiguous().view(torch.float16).float()


def _halves(qs: torch.Tensor) -> torch.Tensor:
    """qs [..., L] uint8 -> [..., 2, L]: the low nibbles, then the high ones (ggml's K-quant order)."""
    return torch.stack([qs & 0x0F, qs >> 4], dim=-2)


def _bits(b: torch.Tensor, shifts: range, mask: int) -> torch.Tensor:
    """b [..., L] uint8 -> [..., len(shifts), L]: the field (b >> s) & mask for each shift."""
    return torch.stack([(b >> s) & mask for s in shifts], dim=-2)


def _k_scales(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K blocks [n, blocks, NB] -> d * sc and -(dmin * mn) float32 [n, blocks, 8, 1] per
    sub-block of 32: the 6-bit scales and mins as the loader unpacks them (12 bytes a block, on
    the CPU)."""
    n, blocks, _ = b.shape
    scale, mins = (torch.from_numpy(v).to(b.device).view(n, blocks, 8, 1) for v in
                   gguf_format._k_scale_min(b[:, :, 4:16].reshape(-1, 12).cpu().numpy()))
    return _f16(b, 0).unsqueeze(3) * scale, -(_f16(b, 2).unsqueeze(3) * mins)


def int4_groups(type_id: int, raw: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_0 / Q4_1 / Q4_K blocks uint8 [N, K / QK * NB] -> the W4A16 layout's q uint8 [N, K] in
    0..15 and d, m float16 [N, K / 32], W = d * q + m per 32 columns, on raw's device.
    Q4_0 (w = d (q - 8): m = -8 d) and Q4_1 are exact. Q4_K's d * sc and dmin * mn (an f16 times a
    6-bit integer) are rounded to float16: 2^-11 of each, far below the 4-bit step."""
    qk, nb, _ = TYPES[type_id]
    n = raw.shape[0]
    b = raw.reshape(n, k // qk, nb)

    def nibbles(lo: int) -> torch.Tensor:  # qs[16] at byte lo of each block -> q [n, K] (Q4_1's order)
        return unpack_nibbles(b[:, :, lo:lo + 16].reshape(n, -1))

    if type_id == 2:  # f16 d | qs[16]
        d = _f16(b, 0)
        m, q = -8 * d, nibbles(2)
    elif type_id == 3:  # f16 d | f16 m | qs[16]
        d, m, q = _f16(b, 0), _f16(b, 2), nibbles(4)
    elif type_id == 12:  # f16 d | f16 dmin | scales[12] | qs[128]: 8 sub-blocks of 32
        d, m = _k_scales(b)
        # 32-byte chunk c: sub-block 2c in its low nibbles, 2c + 1 in its high ones
        q = _halves(b[:, :, 16:].reshape(n, -1, 4, 32))  # [n, blocks, 4, 2, 32]
    else:
        raise ValueError(f"{NAMES.get(type_id, type_id)} blocks are not 4-bit d * q + m groups")
    return q.reshape(n, k), d.reshape(n, k // 32).half(), m.reshape(n, k // 32).half()


def int8_groups(type_id: int, raw: torch.Tensor,
                k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Q8_0 / Q5_0 / Q5_1 / Q5_K / Q6_K blocks uint8 [N, K / QK * NB] -> int8 q [N, K] and float16
    d [N, K / G] (and m, else None), W = d * q (+ m) per G columns (G 16 for Q6_K, else 32), on
    raw's device. Q8_0, Q5_0 (q - 16) and Q5_1 are exact; Q5_K's d * sc and dmin * mn and Q6_K's
    d * sc (an f16 times a 6- or 8-bit integer) are rounded to float16, 2^-11 of each."""
    qk, nb, _ = TYPES[type_id]
    n = raw.shape[0]
    b = raw.reshape(n, k // qk, nb)

    def five(ql: int, qh: int) -> torch.Tensor:  # Q5_0 / Q5_1 q in 0..31 -> [n, blocks, 32]
        # qs[16] at byte ql as Q4_1's nibbles; the u32 at byte qh: bit i is weight i's 16
        fifth = _bits(b[:, :, qh:qh + 4], range(8), 1).transpose(-1, -2).reshape(n, -1, 32)
        return unpack_nibbles(b[:, :, ql:ql + 16].reshape(n, -1)).view(n, -1, 32) | (fifth << 4)

    m = None
    if type_id == 8:  # f16 d | int8 q[32]
        d, q = _f16(b, 0), b[:, :, 2:].contiguous().view(torch.int8)
    elif type_id == 6:  # f16 d | u32 fifth bits | qs[16]: w = d (q - 16)
        d, q = _f16(b, 0), five(6, 2).to(torch.int8) - 16
    elif type_id == 7:  # f16 d | f16 m | u32 fifth bits | qs[16]: w = d q + m
        d, m, q = _f16(b, 0), _f16(b, 2), five(8, 4)
    elif type_id == 13:  # f16 d | f16 dmin | scales[12] | qh[32] | qs[128]: 8 sub-blocks of 32
        d, m = _k_scales(b)
        # 32-byte chunk c of qs: sub-block 2c in its low nibbles, 2c + 1 in its high ones; bit j
        # of qh's byte l is the fifth bit of sub-block j's weight l
        low = _halves(b[:, :, 48:].reshape(n, -1, 4, 32)).reshape(n, -1, 8, 32)
        q = low | (_bits(b[:, :, 16:48], range(8), 1) << 4)  # [n, blocks, 8, 32]
    elif type_id == 14:  # ql[128] | qh[64] | int8 scales[16] | f16 d: w = d sc (q - 32), 16 subs of 16
        d = _f16(b, 208) * b[:, :, 192:208].contiguous().view(torch.int8).float()
        # per half of 128 weights: ql's 64 low nibbles are weights 0..63, its high ones 64..127;
        # qh's 32 bytes hold the top 2 bits of weights l, l + 32, l + 64, l + 96 at shifts 0, 2, 4, 6
        low = _halves(b[:, :, :128].reshape(n, -1, 2, 64)).reshape(n, -1, 2, 128)
        high = _bits(b[:, :, 128:192].reshape(n, -1, 2, 32), range(0, 8, 2), 3).reshape(n, -1, 2, 128)
        q = (low | (high << 4)).to(torch.int8) - 32
    else:
        raise ValueError(f"{NAMES.get(type_id, type_id)} blocks are not int8 groups")
    group = 16 if type_id == 14 else 32
    return (q.reshape(n, k).to(torch.int8), d.reshape(n, k // group).half(),
            None if m is None else m.reshape(n, k // group).half())


class GGUFLinear(nn.Module):
    """y = x @ W.T + bias, W [out, in] held only as GGUF blocks. x: [T, in] -> [T, out], x's dtype.

    shards: (ggml type, blocks uint8 [rows, in / QK * NB]) in output-row order, on the device;
    dtype: the model's, for the shared scratch matrix of bigger steps. int4: matrices of INT4_TYPES
    become Int4Linear parts (the same nibbles, with float16 d and m per 32 columns) and run the
    W4A16 kernels; int8: those of INT8_TYPES become Int8Linear parts (int8 q, float16 scales per
    group) and run the W8A16 kernel. Other matrices keep their blocks and the GGUF kernel."""

    def __init__(self, shards: list[tuple[int, torch.Tensor]], in_features: int,
                 bias: torch.Tensor | None, dtype: torch.dtype, int4: bool = True, int8: bool = True):
        super().__init__()
        merged: list[tuple[int, list[torch.Tensor]]] = []
        for type_id, raw in shards:
            check(type_id, raw.shape[0], in_features, raw.contiguous())
            if merged and merged[-1][0] == type_id:
                merged[-1][1].append(raw)
            else:
                merged.append((type_id, [raw]))
        self.in_features = in_features
        self.out_features = sum(raw.shape[0] for _, raw in shards)
        if bias is not None and tuple(bias.shape) != (self.out_features,):
            raise ValueError(f"bias of shape {list(bias.shape)} for {self.out_features} output rows")
        bias = None if bias is None else bias.detach().to(dtype)
        self.types: list[int] = []
        self.offsets: list[int] = []  # each matrix's first output row
        self.parts = nn.ModuleDict()  # matrix index -> Int4Linear / Int8Linear (with its part of the bias)
        rows = block_rows = 0
        for i, (type_id, parts) in enumerate(merged):
            blocks = torch.cat(parts).contiguous() if len(parts) > 1 else parts[0].contiguous()
            end = rows + blocks.shape[0]
            part_bias = None if bias is None else bias[rows:end]
            if int4 and type_id in INT4_TYPES:
                self.parts[str(i)] = Int4Linear(*int4_groups(type_id, blocks, in_features), part_bias)
            elif int8 and type_id in INT8_TYPES:
                q, d, m = int8_groups(type_id, blocks, in_features)
                self.parts[str(i)] = Int8Linear(q, d, part_bias, m)
            else:
                self.register_buffer(f"blocks{i}", blocks)
                block_rows += blocks.shape[0]
            self.types.append(type_id)
            self.offsets.append(rows)
            rows = end
        self.register_buffer("bias", bias)
        device = shards[0][1].device
        self._scratch = scratch(device, dtype, min(block_rows * in_features, SCRATCH_LIMIT)) if block_rows else None
        self.kernel_rows = kernel_rows()
        # one Int4Linear / Int8Linear for the whole layer (the usual case): forward is that layer's
        self._whole = self.parts["0"] if len(self.types) == 1 and self.parts else None

    def matrices(self) -> list[tuple[int, int, torch.Tensor | nn.Module]]:
        """(first output row, ggml type, its blocks or the layer it became) of each matrix."""
        return [(off, t, self.parts[str(i)] if str(i) in self.parts else getattr(self, f"blocks{i}"))
                for i, (off, t) in enumerate(zip(self.offsets, self.types))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in] -> [T, out]
        if self._whole is not None:
            return self._whole(x)
        if x.stride(-1) != 1:
            x = x.contiguous()
        bias = self.bias if self.bias is None or self.bias.dtype == x.dtype else self.bias.to(x.dtype)
        mats = self.matrices()
        small = x.shape[0] <= self.kernel_rows
        if len(mats) == 1:  # blocks
            return (gguf_matmul(x, mats[0][2], mats[0][1], self.in_features, bias) if small
                    else self._dense_rows(x, bias, 0, self.out_features))
        if not small and not self.parts:  # blocks only: one dequantization, one matmul
            return self._dense_rows(x, bias, 0, self.out_features)
        y = torch.empty(x.shape[0], self.out_features, dtype=x.dtype, device=x.device)
        for off, type_id, w in mats:  # each matrix writes its columns of y
            end = off + w.out_features if isinstance(w, nn.Module) else off + w.shape[0]
            part = None if bias is None else bias[off:end]
            if isinstance(w, nn.Module):
                y[:, off:end] = w(x)
            elif small:
                gguf_matmul(x, w, type_id, self.in_features, part, out=y[:, off:end])
            else:
                y[:, off:end] = self._dense_rows(x, part, off, end)
        return y

    def forward_silu_mul(self, gate_up: torch.Tensor, ops) -> torch.Tensor:
        """The down projection of silu(gate) * up (model/layers.py SwiGLU): an Int4Linear's own
        where it is the whole layer, else silu_mul first."""
        if isinstance(self._whole, Int4Linear):
            return self._whole.forward_silu_mul(gate_up, ops)
        return self(ops.silu_mul(gate_up))

    def _dense_rows(self, x: torch.Tensor, bias: torch.Tensor | None, a0: int, b0: int) -> torch.Tensor:
        """Output columns a0..b0 (blocks matrices only) for a big step: dequantize those rows of W
        into the scratch matrix (in row chunks if it holds less), then multiply."""
        k, n = self.in_features, b0 - a0
        buf = self._scratch
        if buf.dtype != x.dtype:  # not the model's dtype (checks): a buffer of its own
            buf = torch.empty(min(n * k, SCRATCH_LIMIT), dtype=x.dtype, device=x.device)
        step = max(1, min(n, buf.numel() // k))
        if step == n:
            return nn.functional.linear(x, self._dequantize_rows(a0, b0, buf), bias)
        y = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
        for a in range(a0, b0, step):
            b = min(b0, a + step)
            y[:, a - a0:b - a0] = nn.functional.linear(x, self._dequantize_rows(a, b, buf),
                                                       None if bias is None else bias[a - a0:b - a0])
        return y

    def _dequantize_rows(self, a: int, b: int, buf: torch.Tensor) -> torch.Tensor:
        """Rows a..b of W (blocks matrices) -> a [b - a, in] view at the start of buf."""
        w = buf[:(b - a) * self.in_features].view(b - a, self.in_features)
        for off, type_id, blocks in self.matrices():
            if isinstance(blocks, nn.Module):
                continue
            lo, hi = max(a, off), min(b, off + blocks.shape[0])
            if lo < hi:
                dequantize(blocks[lo - off:hi - off], type_id, self.in_features, w[lo - a:hi - a])
        return w

    def extra_repr(self) -> str:
        kernel = {i: " (W4A16)" if isinstance(p, Int4Linear) else " (W8A16)" for i, p in self.parts.items()}
        types = "+".join(NAMES[t] + kernel.get(str(i), "") for i, t in enumerate(self.types))
        return f"in={self.in_features}, out={self.out_features}, {types}, blocks up to {self.kernel_rows} rows"
