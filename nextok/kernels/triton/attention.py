"""Triton kernels over the paged KV pool: KV store, split-KV paged decode; the paged (chunked)
prefill is in attention_prefill.py, over this file's tile loop.

Cache layout per layer: [num_blocks, block_size, KVH, D]. Key position t of a sequence lives in
page `block_table[t // block_size]`, row `t % block_size`. The kernels gather pages per key (the
block id of each key is loaded from the block table), so block_size need not be a power of two.

GQA: query head h reads KV head h // G with G = H // KVH. Every kernel runs one program per KV
head and packs the G query heads that share it into the rows of its query tile, so each K/V tile
is loaded once for all of them.

Quantized caches (attention/kv_quant.py), one constexpr QUANT per launch: 0 none; 1 int8,
rows of D + 4 bytes, D int8 values and their float32 scale; 2 fp8 (e4m3), rows of D values
and no scale. The store quantizes each row (fp8: clamps to +-448 and casts); the attention
kernels convert each K/V tile to the query's dtype as they load it (fp8: float16, see
_fp8_query); int8 tiles enter the dots as integers, and their row scales, read through a
float32 view of the same cache (row strides in bytes / 4), multiply the scores and the
probabilities instead.

Softmax runs in base 2: scores are scaled by scale * log2(e), and the split-KV partials store
their log-sum-exp in base 2 as well. Accumulation is float32; tl.dot runs at "ieee" precision so
float32 inputs are not rounded to tf32.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from nextok.kernels.triton import pdl
from nextok.kernels.triton.e4m3 import fp8_tile, to_e4m3
from nextok.kernels.triton.pdl import pdl_wait

LOG2E = 1.4426950408889634


# ---- KV store ------------------------------------------------------------------------------------
@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, slot_ptr,
                     s_kt, s_kh, s_kd, s_vt, s_vh, s_vd,
                     s_cb, s_cs, s_ch, s_cd,
                     KVH: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, QUANT: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    # One program per token: copies its [KVH, D] key and value rows into the slot's page row.
    # QUANT 1: int8 rows, q = round(x / s) with s = max|x| / 127, and s as float32 in the row's
    # last 4 bytes (ks_ptr, vs_ptr: the caches viewed as float32; attention/kv_quant.py).
    # QUANT 2: fp8 rows, clamp(x, -448, 448) cast to e4m3 (round to nearest even), no scale.
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < KVH) & (d < D) & (slot >= 0)  # slot -1: a padding token (CUDA-graph batches)
    dst = (slot // PAGE) * s_cb + (slot % PAGE) * s_cs + h * s_ch + d * s_cd
    k = tl.load(k_ptr + t * s_kt + h * s_kh + d * s_kd, mask=mask)
    v = tl.load(v_ptr + t * s_vt + h * s_vh + d * s_vd, mask=mask)
    if QUANT == 1:
        srow = (slot // PAGE) * (s_cb // 4) + (slot % PAGE) * (s_cs // 4) + h * (s_ch // 4) + D // 4
        _store_int8_rows(kc_ptr + dst, ks_ptr + srow, k.to(tl.float32), mask, (h < KVH) & (slot >= 0))
        _store_int8_rows(vc_ptr + dst, vs_ptr + srow, v.to(tl.float32), mask, (h < KVH) & (slot >= 0))
    elif QUANT == 2:
        tl.store(kc_ptr + dst, to_e4m3(k.to(tl.float32), kc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc_ptr + dst, to_e4m3(v.to(tl.float32), vc_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(kc_ptr + dst, k, mask=mask)
        tl.store(vc_ptr + dst, v, mask=mask)


@triton.jit
def _store_int8_rows(q_ptrs, s_ptrs, x, mask, row_mask):
    # x: [BLOCK_H, BLOCK_D] float32 rows (masked entries 0) -> int8 values and one scale per row
    scale = tl.max(tl.abs(x), axis=1) / 127.0  # [BLOCK_H]
    scale = tl.where(scale > 0, scale, 1.0)[:, None]
    y = x / scale
    q = tl.where(y >= 0, tl.floor(y + 0.5), tl.ceil(y - 0.5))  # round half away from zero
    tl.store(q_ptrs, tl.minimum(tl.maximum(q, -127.0), 127.0).to(tl.int8), mask=mask)
    tl.store(s_ptrs, scale, mask=row_mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v: [T, KVH, D] -> caches [num_blocks, block_size, KVH, D] at slot_mapping [T] (int64);
    int8 caches [num_blocks, block_size, KVH, D + 4] and fp8 ones take quantized rows
    (attention/kv_quant.py)."""
    t, kvh, d = k.shape
    if t == 0:
        return
    assert k_cache.stride() == v_cache.stride()
    ks, vs, quant = _scale_views(k_cache, v_cache)
    _store_kv_kernel[(t,)](k, v, k_cache, v_cache, ks, vs, slot_mapping, *k.stride(), *v.stride(),
                           *k_cache.stride(), KVH=kvh, D=d, PAGE=k_cache.shape[1], QUANT=quant,
                           BLOCK_H=triton.next_power_of_2(kvh), BLOCK_D=triton.next_power_of_2(d))


def _scale_views(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple:
    """(k float32 view, v float32 view, 1) of int8 caches, whose rows end in a float32 scale;
    (k_cache, v_cache, QUANT) otherwise, the views unused: QUANT 2 for fp8 caches, else 0."""
    if k_cache.dtype == torch.int8:
        return k_cache.view(torch.float32), v_cache.view(torch.float32), 1
    if k_cache.dtype == torch.float8_e4m3fn:
        return k_cache, v_cache, 2
    if k_cache.element_size() == 1:
        raise ValueError(f"the Triton kernels read int8 or fp8 KV caches, not {k_cache.dtype}")
    return k_cache, v_cache, 0


# ---- shared: online softmax over a range of keys -------------------------------------------------
@triton.jit
def _fp8_query(q, QUANT: tl.constexpr):
    """A bfloat16 q [M, BD] -> float16 for an fp8 cache (QUANT 2), else q as it is. Every e4m3
    value is exact in float16, which Hopper converts to in one instruction per two values
    (to bfloat16 it took ~4, through float32): on sm_90 the decode kernel's 64-key tile was 944
    instructions on fp8 caches and 495 on bf16 ones, and an fp8 cache's decode step was no
    faster than bf16's (H200, 2026-12-05); 764 then, 566 with the decode kernel's words
    (e4m3.fp8_tile). float16 holds every bfloat16 q exactly but
    for |q| over 65504 (clamped) or under 2^-14; p in [0, 1] loses nothing either."""
    if QUANT == 2 and q.dtype == tl.bfloat16:
        q = tl.minimum(tl.maximum(q.to(tl.float32), -65504.0), 65504.0).to(tl.float16)
    return q


@triton.jit
def _head_stride(s_ch, QUANT: tl.constexpr):
    # An int8 cache's row of D + 4 bytes (the scale at its end) is 4-aligned, never 16 (132 at
    # D 128): Triton specializes strides on divisibility by 16 only, so it would load the rows
    # byte by byte (on sm_90 the decode kernel then spilled 885 registers and ran at 5 % of the
    # copy bandwidth). (s_ch // 4) * 4 is the same stride, known to be a multiple of 4.
    if QUANT == 1:
        s_ch = (s_ch // 4) * 4
    return s_ch


@triton.jit
def _from_byte(x, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    # an fp8 or int8 tile to q's dtype: one conversion on the GPU; the interpreter converts
    # them right only through float32 (int8 to bfloat16 directly gave NaNs)
    if INTERPRET:
        return x.to(tl.float32).to(dtype)
    return x.to(dtype)


@triton.jit
def _attend_tile(q, acc, m_i, l_i, n0, end, pos_q, window, k_base, v_base, ks_base, vs_base, bt_row,
                 s_cb, s_cs, d_off, d_mask, qk_scale, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                 MASK: tl.constexpr, HAS_WINDOW: tl.constexpr, QUANT: tl.constexpr,
                 SCALE_COL: tl.constexpr, INTERPRET: tl.constexpr, WORDS: tl.constexpr = False):
    # q: [M, BD]; acc: [M, BD] f32; m_i, l_i: [M] f32 (base-2 running max and sum).
    # Keys n0 + [0, BLOCK_N), only those < end loaded. MASK 0: every row sees every key (no
    # masking work); 1: keys < end; 2: causal on pos_q [M] (+ sliding window). Padding rows
    # (q = 0) may see unloaded keys (k = v = 0): they are never stored.
    pos_k = n0 + tl.arange(0, BLOCK_N)
    k_ok = pos_k < end
    blk = tl.load(bt_row + pos_k // PAGE, mask=k_ok, other=0)  # page of each key, int64
    off = blk[:, None] * s_cb + (pos_k % PAGE)[:, None] * s_cs + d_off[None, :]
    kv_mask = k_ok[:, None] & d_mask[None, :]
    if WORDS:  # fp8 rows of exactly BD values, read as words and converted in registers
        k = fp8_tile(k_base, blk * s_cb + (pos_k % PAGE) * s_cs, k_ok, d_off.shape[0],
                      INTERPRET).to(q.dtype)  # (float16 already but for a float32 q)
    else:
        k = tl.load(k_base + off, mask=kv_mask, other=0.0)  # [N, BD]
    # int8 rows, each with its float32 scale (ks_base: the cache viewed as float32): the dots
    # take the integers, exact in q's dtype, and the scales multiply the [M, N] scores and
    # probabilities, 8 products a thread instead of 64 in each of K's and V's tiles
    row_scale = qk_scale
    if QUANT == 1:
        srow = blk * (s_cb // 4) + (pos_k % PAGE) * (s_cs // 4) + SCALE_COL
        row_scale = qk_scale * tl.load(ks_base + srow, mask=k_ok, other=0.0)[None, :]  # [1, N]
        k = _from_byte(k, q.dtype, INTERPRET)
    if QUANT == 2 and not WORDS:  # fp8 rows: the values themselves, to q's float16 (_fp8_query)
        k = _from_byte(k, q.dtype, INTERPRET)
    if INTERPRET:  # the interpreter's tl.dot multiplies bfloat16's raw bits: upcast there
        q, k = q.to(tl.float32), k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * row_scale  # [M, N]
    if MASK == 1:
        s = tl.where(k_ok[None, :], s, float("-inf"))
    if MASK == 2:
        visible = pos_k[None, :] <= pos_q[:, None]
        if HAS_WINDOW:
            visible = visible & (pos_k[None, :] > pos_q[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = m_new
    if MASK != 0:
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet: 0
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    if WORDS:
        v = fp8_tile(v_base, blk * s_cb + (pos_k % PAGE) * s_cs, k_ok, d_off.shape[0],
                      INTERPRET).to(q.dtype)
    else:
        v = tl.load(v_base + off, mask=kv_mask, other=0.0)
    pv = p
    if QUANT == 1:  # p @ (v_int * scale) = (p * scale) @ v_int
        pv = p * tl.load(vs_base + srow, mask=k_ok, other=0.0)[None, :]
        v = _from_byte(v, q.dtype, INTERPRET)
    if QUANT == 2 and not WORDS:
        v = _from_byte(v, q.dtype, INTERPRET)
    pv = pv.to(v.dtype)
    if INTERPRET:
        pv, v = pv.to(tl.float32), v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision="ieee")
    l_i = l_i * alpha + tl.sum(p, axis=1)
    return acc, m_new, l_i


@triton.jit
def _attend_range(q, acc, m_i, l_i, start, end, pos_q, window, k_base, v_base, ks_base, vs_base,
                  bt_row, s_cb, s_cs, d_off, d_mask, qk_scale, PAGE: tl.constexpr,
                  BLOCK_N: tl.constexpr, MASK: tl.constexpr, HAS_WINDOW: tl.constexpr,
                  QUANT: tl.constexpr, SCALE_COL: tl.constexpr, INTERPRET: tl.constexpr,
                  WORDS: tl.constexpr = False):
    # Tiles n0 = start, start + BLOCK_N, ... < end. Triton 3.6's interpreter cannot take tensor
    # bounds in range() under numpy >= 2.4 (triton-lang/triton#9171), so it runs a while loop;
    # compiled code keeps the for loop, which Triton software-pipelines.
    if INTERPRET:
        n0 = start
        while n0 < end:
            acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, n0, end, pos_q, window, k_base, v_base,
                                         ks_base, vs_base, bt_row, s_cb, s_cs, d_off, d_mask,
                                         qk_scale, PAGE, BLOCK_N, MASK, HAS_WINDOW, QUANT,
                                         SCALE_COL, INTERPRET, WORDS)
            n0 += BLOCK_N
    else:
        for n0 in range(start, end, BLOCK_N):
            acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, n0, end, pos_q, window, k_base, v_base,
                                         ks_base, vs_base, bt_row, s_cb, s_cs, d_off, d_mask,
                                         qk_scale, PAGE, BLOCK_N, MASK, HAS_WINDOW, QUANT,
                                         SCALE_COL, INTERPRET, WORDS)
    return acc, m_i, l_i


# ---- paged decode: split-KV, then a reduce over splits -------------------------------------------
# Runtime values that change from step to step (a step's split count and block-table width)
# are not specialized on: each value of a constexpr, and each integer argument that is 1 or a
# multiple of 16, would be another compile of ~1-2 s, paid in the middle of serving the first
# step that meets it (worker/warmup.py compiles what serving launches, once, at start).
@triton.jit(do_not_specialize=["num_splits", "s_bt"])
def _decode_split_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, out_ptr, mid_o_ptr,
                         mid_lse_ptr, qk_scale, window, num_splits,
                         s_qt, s_qh, s_qd, s_cb, s_cs, s_ch, s_cd, s_bt, s_ot, s_oh, s_od,
                         G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                         HAS_WINDOW: tl.constexpr,
                         BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                         QUANT: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr):
    # Grid (B, KVH, num_splits). The visible keys [lo, len) are cut into num_splits ranges of
    # whole BLOCK_N tiles, sized from this sequence's length; a split past the end does nothing
    # and writes an empty partial (lse = -inf, o = 0) that the reduce ignores.
    b, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    s_ch = _head_stride(s_ch, QUANT)
    pdl_wait(PDL)
    ctx = tl.load(lens_ptr + b).to(tl.int32)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(ctx - window, 0)
    per_split = tl.cdiv(tl.cdiv(ctx - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
    end = tl.minimum(start + per_split, ctx)

    g = tl.arange(0, BLOCK_G)
    head = kvh * G + g
    d = tl.arange(0, BLOCK_D)
    d_mask = d < D
    q_mask = (g < G)[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + b * s_qt + head[:, None] * s_qh + d[None, :] * s_qd, mask=q_mask, other=0.0)
    q = _fp8_query(q, QUANT)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc, m_i, l_i = _attend_range(q, acc, m_i, l_i, start, end, None, window,
                                  kc_ptr + kvh * s_ch, vc_ptr + kvh * s_ch,
                                  ks_ptr + kvh * (s_ch // 4), vs_ptr + kvh * (s_ch // 4),
                                  bt_ptr + b * s_bt, s_cb, s_cs, d * s_cd, d_mask, qk_scale, PAGE,
                                  BLOCK_N, MASK=1, HAS_WINDOW=False, QUANT=QUANT,
                                  SCALE_COL=D // 4, INTERPRET=INTERPRET,
                                  WORDS=(QUANT == 2) and (D == BLOCK_D))
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # 0 for an empty split
    o = acc / l_safe[:, None]
    if num_splits == 1:  # nothing to reduce: write the output directly
        tl.store(out_ptr + b * s_ot + head[:, None] * s_oh + d[None, :] * s_od,
                 o.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        # mid_o: [B, H, num_splits, D] f32 (contiguous); mid_lse: [B, H, num_splits] f32
        row = (b * G * tl.num_programs(1) + head) * num_splits + split  # [BLOCK_G]
        tl.store(mid_o_ptr + row[:, None] * D + d[None, :], o, mask=q_mask)
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_safe))
        tl.store(mid_lse_ptr + row, lse, mask=g < G)


@triton.jit(do_not_specialize=["num_splits"])
def _decode_reduce_kernel(mid_o_ptr, mid_lse_ptr, out_ptr, num_splits, s_ot, s_oh, s_od,
                          D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
                          PDL: tl.constexpr):
    # Grid (B, H): out = sum_s w_s * o_s / sum_s w_s with w_s = 2^(lse_s - max lse).
    b, h = tl.program_id(0), tl.program_id(1)
    pdl_wait(PDL)
    row = b * tl.num_programs(1) + h
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    lse = tl.load(mid_lse_ptr + row * num_splits + s, mask=s < num_splits, other=float("-inf"))
    m = tl.max(lse, axis=0)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # [BLOCK_S], 0 for empty splits
    o = tl.load(mid_o_ptr + (row * num_splits + s[:, None]) * D + d[None, :],
                mask=(s < num_splits)[:, None] & (d < D)[None, :], other=0.0)
    denom = tl.sum(w, axis=0)
    res = tl.sum(o * w[:, None], axis=0) / tl.where(denom == 0.0, 1.0, denom)
    tl.store(out_ptr + b * s_ot + h * s_oh + d * s_od, res.to(out_ptr.dtype.element_ty), mask=d < D)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a handful of splits exercises the reduce on small shapes
    return torch.cuda.get_device_properties(device).multi_processor_count


MAX_SPLITS = 32  # the reduce kernel's one tile of partials (BLOCK_S)


def decode_num_splits(batch: int, kv_heads: int, max_len: int, device: torch.device) -> int:
    """Splits per (sequence, KV head): enough programs for ~2 waves over the SMs, at least
    `min_tokens` keys of max_len per split, at most MAX_SPLITS. Depends on shapes only (CUDA graphs)."""
    min_tokens = 256 if device.type == "cuda" else 16
    want = triton.cdiv(2 * _num_sms(device), batch * kv_heads)
    return max(1, min(want, triton.cdiv(max_len, min_tokens), MAX_SPLITS))


DECODE_OVERRIDE: tuple[int, int, int] | None = None  # benchmarks/gpu/decode_probe.py sweeps tiles


def _decode_config(d: int, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages)."""
    if device.type != "cuda":
        return 16, 4, 1
    if DECODE_OVERRIDE is not None:
        return DECODE_OVERRIDE
    return (64 if d <= 128 else 32), 4, 3


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                 window: int | None, out: torch.Tensor, num_splits: int | None = None) -> None:
    """q: [B, H, D] (one query per sequence, at position len - 1); block_tables: [B, max_blocks];
    context_lens: [B]; writes out [B, H, D]. Launch grid and arguments depend on shapes only."""
    b, h, d = q.shape
    kvh, page = k_cache.shape[2], k_cache.shape[1]
    g = h // kvh
    if num_splits is None:
        num_splits = decode_num_splits(b, kvh, block_tables.shape[1] * page, q.device)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be 1..{MAX_SPLITS}, not {num_splits}")
    block_n, warps, stages = _decode_config(d, q.device)
    block_d = triton.next_power_of_2(d)
    mid_o = mid_lse = out  # unused when num_splits == 1
    if num_splits > 1:
        mid_o = torch.empty(b, h, num_splits, d, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(b, h, num_splits, dtype=torch.float32, device=q.device)
    ks, vs, quant = _scale_views(k_cache, v_cache)
    if quant == 2 and d == block_d:
        _check_word_rows(k_cache, v_cache)
    use_pdl = pdl.enabled(q.device)  # each kernel waits before it reads (kernels/triton/pdl.py)
    _decode_split_kernel[(b, kvh, num_splits)](
        q, k_cache, v_cache, ks, vs, block_tables, context_lens, out, mid_o, mid_lse,
        scale * LOG2E, window or 0, num_splits, *q.stride(), *k_cache.stride(),
        block_tables.stride(0), *out.stride(), G=g, D=d, PAGE=page, HAS_WINDOW=window is not None,
        BLOCK_G=max(16, triton.next_power_of_2(g)), BLOCK_D=block_d, BLOCK_N=block_n,
        QUANT=quant, INTERPRET=INTERPRETED, num_warps=warps, num_stages=stages, PDL=use_pdl,
        launch_pdl=use_pdl)
    if num_splits > 1:
        _decode_reduce_kernel[(b, h)](mid_o, mid_lse, out, num_splits, *out.stride(), D=d,
                                      BLOCK_S=MAX_SPLITS, BLOCK_D=block_d, PDL=use_pdl,
                                      launch_pdl=use_pdl)


def _check_word_rows(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """The decode kernel reads an fp8 cache's rows as int32 words (e4m3.fp8_tile): refuse a
    cache whose rows are not unit-stride and 4-byte aligned rather than read it wrong."""
    for c in (k_cache, v_cache):
        if c.stride(-1) != 1 or any(s % 4 for s in c.stride()[:3]) or c.data_ptr() % 4:
            raise ValueError(f"an fp8 KV cache needs unit-stride rows starting on 4-byte boundaries "
                             f"(strides {list(c.stride())}, address {c.data_ptr()})")


# triton.jit gives an interpreter function instead of a JITFunction under TRITON_INTERPRET=1.
INTERPRETED = not isinstance(_decode_split_kernel, JITFunction)
