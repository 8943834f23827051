"""GGUF weights kept packed on the GPU: y [M, N] = x [M, K] @ W.T (+ bias), W read as its raw
ggml blocks and dequantized in registers (W4A16 / W8A16 for GGUF files).

W: `blocks` uint8 [N, K / QK * NB], row n of W as its K / QK blocks of NB bytes each, rows in HF
order (exactly what GGUFFile.blocks yields). Types (ggml id: QK weights in NB bytes):
  Q4_0 (2): 32 in 18:  f16 d | qs[16]              w = d * (q - 8)
  Q4_1 (3): 32 in 20:  f16 d | f16 m | qs[16]      w = d * q + m
  Q5_0 (6): 32 in 22:  f16 d | u32 qh | qs[16]     w = d * (q - 16)
  Q5_1 (7): 32 in 24:  f16 d | f16 m | u32 qh | qs[16]   w = d * q + m
  Q8_0 (8): 32 in 34:  f16 d | int8 q[32]          w = q * d
    (qs: byte i holds weight i in its low nibble, weight i + 16 in its high one; Q5_0 / Q5_1's
    fifth bit of weight i is bit i of the little-endian qh)
  Q4_K (12): 256 in 144: f16 d | f16 dmin | scales[12] | qs[128]
  Q5_K (13): 256 in 176: f16 d | f16 dmin | scales[12] | qh[32] | qs[128]
    8 sub-blocks of 32, each with a 6-bit scale sc and min mn: w = (d * sc) * q - dmin * mn.
    qs: 32-byte chunk c holds sub-block 2c in its low nibbles, 2c + 1 in its high ones; Q5_K's
    fifth bit of weight l of sub-block s is bit s of qh[l].
  Q6_K (14): 256 in 210: ql[128] | qh[64] | int8 scales[16] | f16 d
    16 sub-blocks of 16: w = (d * sc) * (q - 32); per 128-weight half h, weight r: low 4 bits in
    ql[64h + r % 64] (low nibble for r < 64), top 2 in qh[32h + r % 32] at shift 2 (r // 32).
The arithmetic is gguf_format.py's (the loader's float32 weights), in the same order.

One program: BLOCK_N rows of W, all of K in tiles of 256 columns, for BLOCK_M rows of x (the
grid's second axis takes blocks of rows, up to MAX_ROWS in all; each block dequantizes W again).
A tile is dequantized as [BLOCK_N, G, S]: G sub-blocks of S weights (S = 16 for Q6_K, else 32),
so each sub-block's scale is loaded once and broadcast. One row of x: products summed on CUDA
cores; more: tl.dot with the rows padded to BLOCK_M (16 or more). Bigger steps (prefill)
dequantize the whole weight with the same code into a scratch matrix (`dequantize`), then a dense
matmul (quant/gguf_cuda.py decides where, at KERNEL_ROWS).

Measured on an H100 (2026-12-06-gguf-h100.md, benchmarks/gpu/gguf_probe.py): correct (within
bfloat16 rounding at every tile) but slow. Every weight byte is gathered per element (a nibble
byte twice; a scale, or Q5_0 / Q5_1's qh word, once per sub-block) from blocks whose sizes (18,
22, 34, 210 bytes) leave no aligned words: at one row an 8B gate_up read 0.6-0.85 TB/s of Q4_K /
Q6_K blocks and 1.4 of Q8_0, 0.7-0.85x bf16's time, and at 8 rows 0.4-0.7x. So the 4-bit types
with a scale and min per 32 weights (Q4_0, Q4_1, Q4_K) do not come here on CUDA: the layer
converts them to the W4A16 layout (quant/gguf_cuda.py). For the rest a faster kernel needs the
blocks repacked into aligned planes at load.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

MAX_ROWS = 256  # rows of x one call takes (blocks of BLOCK_M rows)
TILE_K = 256  # columns per tile: one K-quant super-block, eight 32-weight blocks
# ggml type id -> (weights per block, bytes per block, weights per sub-block)
TYPES = {2: (32, 18, 32), 3: (32, 20, 32), 6: (32, 22, 32), 7: (32, 24, 32), 8: (32, 34, 32),
         12: (256, 144, 32), 13: (256, 176, 32), 14: (256, 210, 16)}
NAMES = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}


@triton.jit
def _u8(p, mask):
    return tl.load(p, mask=mask, other=0).to(tl.int32)


@triton.jit
def _f16(p, mask):
    # two little-endian bytes at p -> float32 (through their float16 bits)
    lo = tl.load(p, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(p + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _fifth_bit(p, j, mask):
    # Q5_0 / Q5_1: bit j of the little-endian u32 at p (a block's qh, [BLOCK_N, G, 1], read once
    # per block; it is not 4-byte aligned, so as four bytes) -> int32 0 or 1, j's shape
    qh = (_u8(p, mask) | (_u8(p + 1, mask) << 8) | (_u8(p + 2, mask) << 16)).to(tl.uint32)
    qh = qh | (_u8(p + 3, mask).to(tl.uint32) << 24)
    return ((qh >> j.to(tl.uint32)) & 1).to(tl.int32)


@triton.jit
def _k_scale_min(sc, sub, mask):
    # Q4_K / Q5_K: 6-bit scale and min of sub-block `sub` (0..7) from the 12 bytes at sc.
    # Sub-blocks 0-3: scale sc[s] & 63, min sc[s + 4] & 63. 4-7: low 4 bits in sc[s + 4]
    # (scale low nibble, min high nibble), top 2 in bits 6-7 of sc[s - 4] (scale), sc[s] (min).
    a = _u8(sc + sub, mask)
    b = _u8(sc + sub + 4, mask)
    c = _u8(sc + sub % 4, mask)
    lo = sub < 4
    scale = tl.where(lo, a & 63, (b & 0xF) | ((c >> 2) & 0x30))
    mn = tl.where(lo, b & 63, (b >> 4) | ((a >> 2) & 0x30))
    return scale.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _dequant_tile(w_ptr, n3, n_ok3, k0, K: tl.constexpr, TYPE: tl.constexpr, QK: tl.constexpr,
                  NB: tl.constexpr, S: tl.constexpr, G: tl.constexpr):
    # -> float32 [BLOCK_N, G, S]: columns k0 .. k0 + G * S of rows n3 ([BLOCK_N, 1, 1]); zeros
    # outside W. Per element: its block's first byte `bb` and its index j in the block; per
    # sub-block: `bg` and `jg` of its first weight.
    RB: tl.constexpr = K // QK * NB  # bytes per row
    g3 = tl.arange(0, G)[None, :, None]
    s3 = tl.arange(0, S)[None, None, :]
    colg = k0 + g3 * S  # [1, G, 1]
    col = colg + s3  # [1, G, S]
    row = w_ptr + n3.to(tl.int64) * RB
    mg = n_ok3 & (colg < K)
    m = n_ok3 & (col < K)
    bg = row + (colg // QK) * NB
    bb = row + (col // QK) * NB
    j = col % QK
    if TYPE == 2:  # Q4_0
        q = (_u8(bb + 2 + j % 16, m) >> ((j // 16) * 4)) & 0xF
        w = _f16(bg, mg) * (q.to(tl.float32) - 8.0)
    elif TYPE == 3:  # Q4_1
        q = (_u8(bb + 4 + j % 16, m) >> ((j // 16) * 4)) & 0xF
        w = _f16(bg, mg) * q.to(tl.float32) + _f16(bg + 2, mg)
    elif TYPE == 6:  # Q5_0: qh at byte 2, qs at 6
        q = (_u8(bb + 6 + j % 16, m) >> ((j // 16) * 4)) & 0xF
        q = q | (_fifth_bit(bg + 2, j, mg) << 4)
        w = _f16(bg, mg) * (q.to(tl.float32) - 16.0)
    elif TYPE == 7:  # Q5_1: m at byte 2, qh at 4, qs at 8
        q = (_u8(bb + 8 + j % 16, m) >> ((j // 16) * 4)) & 0xF
        q = q | (_fifth_bit(bg + 4, j, mg) << 4)
        w = _f16(bg, mg) * q.to(tl.float32) + _f16(bg + 2, mg)
    elif TYPE == 8:  # Q8_0
        q = tl.load(bb + 2 + j, mask=m, other=0).to(tl.int8, bitcast=True)
        w = q.to(tl.float32) * _f16(bg, mg)
    elif TYPE == 12 or TYPE == 13:  # Q4_K, Q5_K
        sub = (colg % QK) // 32  # [1, G, 1]
        scale, mn = _k_scale_min(bg + 4, sub, mg)
        d = _f16(bg, mg) * scale
        dm = _f16(bg + 2, mg) * mn
        s = j // 32  # the weight's sub-block; qs starts at byte 16 (Q4_K) or 48 (Q5_K)
        if TYPE == 12:
            q = (_u8(bb + 16 + (s // 2) * 32 + j % 32, m) >> ((s % 2) * 4)) & 0xF
        else:
            q = (_u8(bb + 48 + (s // 2) * 32 + j % 32, m) >> ((s % 2) * 4)) & 0xF
            q = q | (((_u8(bb + 16 + j % 32, m) >> s) & 1) << 4)
        w = d * q.to(tl.float32) - dm
    else:  # Q6_K (TYPE == 14)
        sc = tl.load(bg + 192 + (colg % QK) // 16, mask=mg, other=0).to(tl.int8, bitcast=True)
        d = _f16(bg + 208, mg) * sc.to(tl.float32)
        h = j // 128
        r = j % 128
        lo4 = (_u8(bb + h * 64 + r % 64, m) >> ((r // 64) * 4)) & 0xF
        hi2 = (_u8(bb + 128 + h * 32 + r % 32, m) >> ((r // 32) * 2)) & 3
        w = d * ((lo4 | (hi2 << 4)) - 32).to(tl.float32)
    return w


@triton.jit
def _gguf_linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, s_xm, s_ym, K: tl.constexpr,
                        TYPE: tl.constexpr, QK: tl.constexpr, NB: tl.constexpr, S: tl.constexpr,
                        HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr, IEEE: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Grid (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M)). x [M, K] unit-stride rows; y [M, N] (may be a
    # column slice of a wider output: s_ym is its row stride); bias [N].
    G: tl.constexpr = 256 // S
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    n3 = n[:, None, None]
    n_ok3 = n_ok[:, None, None]
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        t = tl.arange(0, G * S)
    else:
        acc3 = tl.zeros([BLOCK_N, G, S], dtype=tl.float32)
        col3 = tl.arange(0, G)[None, :, None] * S + tl.arange(0, S)[None, None, :]  # [1, G, S]
    for k0 in range(0, K, G * S):
        w = _dequant_tile(w_ptr, n3, n_ok3, k0, K, TYPE, QK, NB, S, G)  # [BLOCK_N, G, S]
        if USE_DOT:
            a = tl.load(x_ptr + rows[:, None] * s_xm + (k0 + t)[None, :],
                        mask=row_ok[:, None] & (k0 + t < K)[None, :], other=0.0)
            w2 = tl.reshape(w, [BLOCK_N, G * S])
            if IEEE:  # float32 x, or the interpreter (whose tl.dot multiplies bfloat16's raw bits)
                acc += tl.dot(a.to(tl.float32), tl.trans(w2), input_precision="ieee")
            else:
                acc += tl.dot(a, tl.trans(w2.to(a.dtype)))
        else:
            xs = tl.load(x_ptr + k0 + col3, mask=k0 + col3 < K, other=0.0).to(tl.float32)
            acc3 += w * xs
    if not USE_DOT:
        acc = tl.sum(tl.sum(acc3, axis=2), axis=1)[None, :]  # [1, BLOCK_N]
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * s_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def _dequant_kernel(w_ptr, out_ptr, N, s_on, K: tl.constexpr, TYPE: tl.constexpr,
                    QK: tl.constexpr, NB: tl.constexpr, S: tl.constexpr, BLOCK_N: tl.constexpr):
    # Grid (cdiv(N, BLOCK_N), cdiv(K, 256)): out [N, K] (row stride s_on) in out's dtype.
    G: tl.constexpr = 256 // S
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n3 = n[:, None, None]
    n_ok3 = (n < N)[:, None, None]
    k0 = tl.program_id(1) * (G * S)
    w = _dequant_tile(w_ptr, n3, n_ok3, k0, K, TYPE, QK, NB, S, G)
    col = k0 + tl.arange(0, G)[None, :, None] * S + tl.arange(0, S)[None, None, :]
    tl.store(out_ptr + n3.to(tl.int64) * s_on + col, w.to(out_ptr.dtype.element_ty),
             mask=n_ok3 & (col < K))


INTERPRETED = not isinstance(_gguf_linear_kernel, JITFunction)


def check(type_id: int, n: int, k: int, blocks: torch.Tensor | None = None) -> tuple[int, int, int]:
    """(QK, NB, S) of `type_id`; ValueError for a type without this kernel, a K that is not a
    multiple of the type's block, or blocks that are not uint8 [n, k / QK * NB]."""
    if type_id not in TYPES:
        known = ", ".join(f"{NAMES[t]} = {t}" for t in TYPES)
        raise ValueError(f"ggml type {type_id} has no Triton GGUF kernel (known: {known})")
    qk, nb, s = TYPES[type_id]
    if k <= 0 or k % qk:
        raise ValueError(f"K = {k} is not a positive multiple of {NAMES[type_id]}'s block of {qk}")
    if blocks is not None and (blocks.dtype != torch.uint8 or tuple(blocks.shape) != (n, k // qk * nb)
                               or not blocks.is_contiguous()):
        raise ValueError(f"{NAMES[type_id]} blocks for [{n}, {k}] must be contiguous uint8 "
                         f"[{n}, {k // qk * nb}], not {blocks.dtype} {list(blocks.shape)}")
    return qk, nb, s


_override: dict | None = None  # set_config: one tile for every call (benchmarks/gpu/gguf_probe.py)


def set_config(cfg: dict | None) -> None:
    """Force BLOCK_N / num_warps / num_stages (and USE_DOT, BLOCK_M) for every call; None: the defaults."""
    global _override
    _override = cfg


def _config(m: int, device: torch.device) -> dict:
    # rows of x per program: 1 (CUDA cores); 16 up to 16 rows; past that 32 or 64, so W is
    # dequantized once per 64 rows (the interpreter: 16, to test several row blocks)
    block_m = 1 if m == 1 else 16 if m <= 16 or device.type != "cuda" else 32 if m <= 32 else 64
    if _override is not None and device.type == "cuda":
        return {**dict(USE_DOT=m > 1, BLOCK_M=block_m), **_override}
    if device.type != "cuda":  # the interpreter: small tiles
        return dict(USE_DOT=m > 1, BLOCK_M=block_m, BLOCK_N=16, num_warps=4, num_stages=1)
    if m == 1:
        return dict(USE_DOT=False, BLOCK_M=1, BLOCK_N=16, num_warps=4, num_stages=3)
    return dict(USE_DOT=True, BLOCK_M=block_m, BLOCK_N=32, num_warps=4, num_stages=3)


def gguf_matmul(x: torch.Tensor, blocks: torch.Tensor, type_id: int, k: int,
                bias: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W.T (+ bias) in x's dtype, M <= MAX_ROWS; W [N, K] as `blocks` [N, row bytes]
    of ggml type `type_id`. `out`: [M, N] with unit column stride (e.g. a column slice of a wider
    output) to write into, instead of a new tensor."""
    n = blocks.shape[0]
    qk, nb, s = check(type_id, n, k, blocks)
    rows = x.shape[0]
    if x.dim() != 2 or x.shape[1] != k or x.stride(-1) != 1 or rows > MAX_ROWS:
        raise ValueError(f"x must be [<= {MAX_ROWS}, {k}] with unit-stride rows, not {list(x.shape)}")
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device) if out is None else out
    if rows:
        cfg = _config(rows, x.device)
        _gguf_linear_kernel[(triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(rows, cfg["BLOCK_M"]))](
            x, blocks, bias if bias is not None else x, y, rows, n, x.stride(0), y.stride(0),
            K=k, TYPE=type_id, QK=qk, NB=nb, S=s, HAS_BIAS=bias is not None,
            IEEE=INTERPRETED or x.dtype == torch.float32, **cfg)
    return y


def dequantize(blocks: torch.Tensor, type_id: int, k: int, out: torch.Tensor) -> torch.Tensor:
    """blocks [N, row bytes] of type `type_id` -> W [N, K] written into `out` (its dtype; unit
    column stride, e.g. a slice of a reused scratch matrix). Returns `out`."""
    n = blocks.shape[0]
    qk, nb, s = check(type_id, n, k, blocks)
    if tuple(out.shape) != (n, k) or out.stride(-1) != 1:
        raise ValueError(f"out must be [{n}, {k}] with unit-stride rows, not {list(out.shape)}")
    if n:
        block_n = 16 if INTERPRETED else 32
        _dequant_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, TILE_K))](
            blocks, out, n, out.stride(0), K=k, TYPE=type_id, QK=qk, NB=nb, S=s, BLOCK_N=block_n)
    return out
