"""INT4 weight-only by round-to-nearest at load (`--quantization int4`): the naive baseline
that AWQ and GPTQ are judged against, at the same group size.

Asymmetric, per group of `group_size` consecutive weights of a row (default 128):
d = (max - min) / 15, m = min, q = round((W - m) / d) in [0, 15]; W ~ d * q + m. d and m are
rounded to float16 first, so every path holds the same dequantized weights, except that the
CUDA tl.dot kernel's PAIRS tiles (past 8 rows) round d and m again to x's dtype (bfloat16: +0.04 %
perplexity on the default model; kernels/triton/w4a16_dot.py).

- CPU, float32: GGUF Q4_1 blocks (float16 d and m, 16 bytes of nibbles per 32 weights) with the
  group's d and m in each of its blocks, run through the GGUF block kernels: 5 bits per weight.
- Elsewhere: q packed eight to an int32 word, [out, in / 8], column 8j + i in bits 4i .. 4i + 3
  of word j, with d and m [out, groups]; on CUDA the words in contiguous tiles of 64 rows x 16
  words (kernels/triton/int4_words.py: DRAM streams whole tiles, not short runs of rows).
  On CUDA steps of up to w4a16_tiles.KERNEL_ROWS rows run the Triton W4A16 kernels
  (kernels/triton/w4a16.py), which dequantize in registers; bigger steps dequantize the weight
  once per call (on CUDA in one Triton pass; past DEQUANT_LIMIT elements in row chunks) and run
  a dense matmul.
"""
from __future__ import annotations

import functools
import os

import torch
from torch import nn

from nextok.errors import NextokError
from nextok.quant.base import QuantMethod, bias_parameter, scales_in_order, triton_gemv_rows

Q4_1 = 3  # ggml's type id for Q4_1 blocks
# On CUDA, layers with groups of up to this many columns keep d and m in group order: in row
# order a tile of 128 rows reads them as 128 runs of 2 * groups-in-tile bytes, each a row
# (256 bytes at groups of 32 and K = 4096) apart, the short scattered runs that DRAM serves
# slowly (int4_words.LAYOUT), and at groups of 32 they are 20 % of the bytes. Group order took
# 0.48 / 0.49x row order's time at one row for Q4_K's groups of 32 (gate_up 30.9 us against
# 64.2, down 17.3 against 35.5), 0.95 / 1.01x at 8 rows (H100, 2026-12-06-gguf-w8-h100.md;
# benchmarks/gpu/gguf_probe.py times both orders). Groups of 64 and more were not timed.
# NEXTOK_INT4_GROUP_MAJOR_MAX moves it (benchmarks/gpu/issue7.sh w4a16 GM=1 times 128).
GROUP_MAJOR_MAX = int(os.environ.get("NEXTOK_INT4_GROUP_MAJOR_MAX", "32"))
# A step past the kernels' rows dequantizes W to x's dtype and multiplies densely: at most this
# many elements of W at a time (256 MB in bfloat16), in row chunks past it. Every Llama-3.1-8B
# decoder matrix fits whole; an int4 lm_head (--quantize-lm-head, 128256 x 4096) would take a
# 1 GB temporary a call, more than the start-up memory profile may have seen (it samples fewer
# rows than a big batch with speculation can).
DEQUANT_LIMIT = 1 << 27


@functools.cache
def _kernel_rows() -> int:
    """Rows up to which a CUDA step runs the W4A16 kernels (0 without triton)."""
    if not triton_gemv_rows():
        return 0
    from nextok.kernels.triton.w4a16_tiles import kernel_rows

    return kernel_rows()


def quantize_groups(weight: torch.Tensor, group_size: int):
    """weight [out, in] -> (q uint8 [out, in] in 0..15, d float16 [out, G], m float16 [out, G])."""
    out, k = weight.shape
    w = weight.float().view(out, k // group_size, group_size)
    lo, hi = w.amin(dim=2), w.amax(dim=2)
    d = ((hi - lo) / 15.0).to(torch.float16)
    m = lo.to(torch.float16)
    df, mf = d.float().unsqueeze(2), m.float().unsqueeze(2)
    q = torch.where(df > 0, torch.round((w - mf) / torch.where(df > 0, df, 1.0)), 0.0).clamp_(0, 15)
    return q.to(torch.uint8).view(out, k), d, m


def dequantize_groups(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    out, k = q.shape
    g = k // d.shape[1]
    w = q.float().view(out, -1, g) * d.float().unsqueeze(2) + m.float().unsqueeze(2)
    return w.view(out, k)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q uint8 [out, in] in 0..15 -> [out, in / 2]: per 32 columns, byte j = q[j] | q[j + 16] << 4."""
    out, k = q.shape
    qb = q.view(out, k // 32, 32)
    return (qb[:, :, :16] | (qb[:, :, 16:] << 4)).reshape(out, k // 2)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    out, half = packed.shape
    b = packed.view(out, half // 16, 16)
    return torch.cat([b & 0xF, b >> 4], dim=2).reshape(out, 2 * half)


def pack_words(q: torch.Tensor) -> torch.Tensor:
    """q uint8 [out, in] in 0..15 -> int32 [out, in / 8]: word j = sum_i q[8j + i] << 4i."""
    out, k = q.shape
    cols = q.view(out, k // 8, 8)
    words = torch.zeros(out, k // 8, dtype=torch.int32, device=q.device)
    for i in range(8):  # 4 bytes a word of scratch, not 64 a word in int64 (a GPU at load)
        words |= cols[:, :, i].to(torch.int32) << (4 * i)  # bit 31 wraps into the sign, as meant
    return words


def unpack_words(words: torch.Tensor) -> torch.Tensor:
    out, kw = words.shape
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=words.device)
    return ((words.unsqueeze(2) >> shifts) & 0xF).to(torch.uint8).view(out, kw * 8)


def q4_1_blocks(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """-> Q4_1 blocks [out, in / 32 * 20] uint8: per 32 weights f16 d, f16 m, then byte j holds
    q[j] in its low nibble and q[j + 16] in its high one."""
    out, k = q.shape
    nb = k // 32
    per_group = nb // d.shape[1]
    dm = torch.stack([d, m], dim=2).repeat_interleave(per_group, dim=1)  # [out, nb, 2] f16
    nibbles = pack_nibbles(q).view(out, nb, 16)
    return torch.cat([dm.contiguous().view(torch.uint8), nibbles], dim=2).reshape(out, nb * 20)


def zero_point_blocks(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Weights s * (q - z) (AWQ's and GPTQ's definition; q [out, in], z and s [out, G]) as Q4_1
    blocks: d = s, m = -z * s rounded to float16, at most |z * s| * 2^-11 from the definition."""
    return q4_1_blocks(q, s.to(torch.float16), (-(z.float() * s.float())).to(torch.float16))


class Int4Linear(nn.Module):
    """y = x @ (d * q + m).T + bias. x: [T, in] -> [T, out]; q as packed nibbles."""

    def __init__(self, q, d, m, bias):
        super().__init__()
        self.out_features, self.in_features = q.shape
        group = self.in_features // d.shape[1]
        # the kernel's tiles take groups of a power of two (others: the torch path)
        self._kernel_ok = group >= 32 and group & (group - 1) == 0
        self.layout = None  # on CUDA: the words in contiguous tiles (kernels/triton/int4_words.py)
        for name, t in (("qweight", pack_words(q)), ("scales", d), ("mins", m)):
            self.register_buffer(name, t)
        self.bias = bias_parameter(bias)
        if q.is_cuda and self._kernel_ok and triton_gemv_rows():
            from nextok.kernels.triton.int4_words import LAYOUT

            self.set_layout(LAYOUT)
            self.set_scale_order(group <= GROUP_MAJOR_MAX)

    def set_layout(self, layout: tuple[int, int] | None) -> None:
        """Keep the words row-major (None) or in tiles of layout (rows, words), where their shape
        allows it (kernels/triton/int4_words.py tile_words)."""
        from nextok.kernels.triton.int4_words import can_tile, tile_words

        words = self.row_major_words()
        if layout is not None and can_tile(*words.shape, layout):
            words = tile_words(words, layout)
        else:
            layout = None
        self.qweight, self.layout = words, layout

    def set_scale_order(self, group_major: bool) -> None:
        """d and m [out, groups] in row order (False) or group order (True: a view of a
        [groups, out] tensor, base.scales_in_order), which the kernels read through their
        strides."""
        for name in ("scales", "mins"):
            setattr(self, name, scales_in_order(getattr(self, name), group_major))

    def row_major_words(self) -> torch.Tensor:
        """qweight as int32 [out, in / 8] in row order, whatever its layout."""
        if self.layout is None:
            return self.qweight
        from nextok.kernels.triton.int4_words import untile_words

        return untile_words(self.qweight, self.layout)

    def _kernel_step(self, x: torch.Tensor) -> bool:
        """Whether x [T, K] is a decode-sized CUDA step the W4A16 kernel takes."""
        return (x.is_cuda and self._kernel_ok and x.dtype in (torch.bfloat16, torch.float16)
                and x.shape[0] <= _kernel_rows())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if self._kernel_step(x):
            from nextok.kernels.triton.w4a16 import w4a16

            return w4a16(x if x.stride(-1) == 1 else x.contiguous(), self.qweight, self.scales,
                         self.mins, bias, layout=self.layout)
        n = self.out_features
        # rows of W a chunk (DEQUANT_LIMIT), whole word tiles (the tiles of rows a..b, a and b
        # multiples of the tile's rows, are rows a..b of qweight's [out, in / 8] view)
        step = max(DEQUANT_LIMIT // self.in_features, self.layout[0] if self.layout else 1)
        if self.layout:
            step -= step % self.layout[0]
        if step >= n:
            return nn.functional.linear(x, self._dequantize_rows(0, n, x), bias)
        y = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
        for a in range(0, n, step):
            b = min(n, a + step)
            y[..., a:b] = nn.functional.linear(x, self._dequantize_rows(a, b, x),
                                               None if bias is None else bias[a:b])
        return y

    def _dequantize_rows(self, a: int, b: int, x: torch.Tensor) -> torch.Tensor:
        """Rows a..b of W, d * q + m, in x's dtype [b - a, in] (a, b whole word tiles)."""
        d, m = self.scales[a:b], self.mins[a:b]
        if x.is_cuda and self._kernel_ok and triton_gemv_rows():  # one Triton pass
            from nextok.kernels.triton.int4_words import dequantize

            return dequantize(self.qweight[a:b], d, m, x.dtype, layout=self.layout)
        if self.layout is None:
            words = self.qweight[a:b]
        else:
            from nextok.kernels.triton.int4_words import untile_words

            words = untile_words(self.qweight[a:b], self.layout)
        return dequantize_groups(unpack_words(words), d, m).to(x.dtype)

    def forward_silu_mul(self, gate_up: torch.Tensor, ops) -> torch.Tensor:
        """The down projection of silu(gate) * up, gate_up [T, 2 in] (model/layers.py SwiGLU):
        on CUDA, decode-sized steps read gate_up in the kernel (one launch less a layer); else
        the fused ops' silu_mul first, then forward."""
        if self._kernel_step(gate_up) and gate_up.stride(-1) == 1:
            from nextok.kernels.triton.w4a16 import w4a16

            bias = None if self.bias is None else self.bias.to(gate_up.dtype)
            return w4a16(gate_up, self.qweight, self.scales, self.mins, bias, silu_mul=True,
                         layout=self.layout)
        return self(ops.silu_mul(gate_up))

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int4 groups of " \
               f"{self.in_features // self.scales.shape[1]}"


class Int4RoundToNearest(QuantMethod):
    name = "int4"

    def __init__(self, group_size: int = 128):
        if group_size < 32 or group_size % 32:
            raise NextokError(f"--quant-group-size must be a multiple of 32, got {group_size}")
        self.group_size = group_size

    def create_layer(self, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
        out, k = weight.shape
        if k % self.group_size:
            raise NextokError(f"int4 with --quant-group-size {self.group_size}: a layer has {k} "
                              f"inputs, not a multiple of it")
        q, d, m = quantize_groups(weight, self.group_size)
        if weight.device.type == "cpu" and weight.dtype == torch.float32:
            from nextok.kernels.cpu_gguf_linear import BlockLinear, GGUFBlockLinear, load_gguf_matmul

            if load_gguf_matmul() is not None:
                # weight-only: the activations stay float32
                return BlockLinear(GGUFBlockLinear(q4_1_blocks(q, d, m), Q4_1, out, k, bias=bias,
                                                   activations="float32"))
        return Int4Linear(q.to(weight.device), d.to(weight.device), m.to(weight.device), bias)
