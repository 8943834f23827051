"""Paged decode attention: one query per sequence (at position len - 1) against its cached keys,
split over the keys (split-KV) so that a few sequences still fill the GPU.

Layout, GQA packing, quantized caches and the base-2 softmax: kernels/triton/attention.py, whose
tile helpers this kernel shares with the prefill kernel there.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from nextok.kernels.triton import pdl
from nextok.kernels.triton.attention import (LOG2E, _accumulate, _as_dtype, _attend_range, _load_rows,
                                             _scale_views, _scores, _tile_rows)
from nextok.kernels.triton.pdl import pdl_wait


# ---- paged decode: split-KV; the last split of each head group to finish reduces -------------
@triton.jit
def _decode_split_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, out_ptr, mid_o_ptr,
                         mid_lse_ptr, count_ptr, qk_scale, window,
                         s_qt, s_qh, s_qd, s_cb, s_cs, s_ch, s_cd, s_bt, s_ot, s_oh, s_od,
                         G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                         NUM_SPLITS: tl.constexpr, HAS_WINDOW: tl.constexpr,
                         BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                         QUANT: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr):
    # Grid (B, KVH, NUM_SPLITS). The visible keys [lo, len) are cut into NUM_SPLITS ranges of
    # whole BLOCK_N tiles, sized from this sequence's length; a split past the end does nothing
    # and leaves an empty partial (lse = -inf, o = 0) that the reduce ignores.
    b, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    # Before the PDL wait: the length and the first tile's pages. Lengths and block tables were
    # copied in before the step's first kernel, so the chain of dependent loads (length ->
    # pages) runs while the kernel before this one (RoPE + KV store) finishes. The keys and
    # values wait: that kernel stores this step's (a verify step's rows read several).
    ctx = tl.load(lens_ptr + b).to(tl.int32)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(ctx - window, 0)
    per_split = tl.cdiv(tl.cdiv(ctx - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
    end = tl.minimum(start + per_split, ctx)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < D
    k_base, v_base = kc_ptr + kvh * s_ch, vc_ptr + kvh * s_ch
    ks_base, vs_base = ks_ptr + kvh * (s_ch // 4), vs_ptr + kvh * (s_ch // 4)
    bt_row = bt_ptr + b * s_bt
    pos_k, k_ok, off, srow = _tile_rows(start, end, bt_row, s_cb, s_cs, d * s_cd, PAGE, BLOCK_N, D // 4)
    pdl_wait(PDL)
    k, ks = _load_rows(k_base, ks_base, off, srow, k_ok, d_mask, QUANT)
    v, vs = _load_rows(v_base, vs_base, off, srow, k_ok, d_mask, QUANT)

    g = tl.arange(0, BLOCK_G)
    head = kvh * G + g
    q_mask = (g < G)[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + b * s_qt + head[:, None] * s_qh + d[None, :] * s_qd, mask=q_mask, other=0.0)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    p, alpha, m_i = _scores(q, m_i, _as_dtype(k, ks, q.dtype, QUANT), pos_k, k_ok, None, window,
                            qk_scale, MASK=1, HAS_WINDOW=False, INTERPRET=INTERPRET)
    acc, l_i = _accumulate(acc, l_i, p, alpha, _as_dtype(v, vs, q.dtype, QUANT), INTERPRET)
    acc, m_i, l_i = _attend_range(q, acc, m_i, l_i, start + BLOCK_N, end, None, window,
                                  k_base, v_base, ks_base, vs_base, bt_row, s_cb, s_cs, d * s_cd, d_mask,
                                  qk_scale, PAGE, BLOCK_N, MASK=1, HAS_WINDOW=False, QUANT=QUANT,
                                  SCALE_COL=D // 4, INTERPRET=INTERPRET)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # 0 for an empty split
    o = acc / l_safe[:, None]
    out = out_ptr + b * s_ot + head[:, None] * s_oh + d[None, :] * s_od
    if NUM_SPLITS == 1:  # nothing to reduce: write the output directly
        tl.store(out, o.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        # mid_o: [B, H, NUM_SPLITS, D] f32 (contiguous); mid_lse: [B, H, NUM_SPLITS] f32;
        # count: [B, KVH] int32, zeros between calls
        row = (b * G * tl.num_programs(1) + head) * NUM_SPLITS  # [BLOCK_G], split 0's
        tl.store(mid_o_ptr + (row + split)[:, None] * D + d[None, :], o, mask=q_mask)
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_safe))
        tl.store(mid_lse_ptr + row + split, lse, mask=g < G)
        # The last of the NUM_SPLITS programs of this (sequence, KV head) to get here adds the
        # partials: out = sum_s w_s o_s / sum_s w_s with w_s = 2^lse_s, online over the splits
        # in their order. (Instead of a reduce kernel: one launch a layer less.)
        tl.debug_barrier()  # every lane's partials stored before the count says so
        counter = count_ptr + b * tl.num_programs(1) + kvh
        done = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if done == NUM_SPLITS - 1:
            m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
            den = tl.zeros([BLOCK_G], dtype=tl.float32)
            res = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
            for sp in tl.static_range(NUM_SPLITS):  # .cg: from L2, not a stale L1 line
                lse_s = tl.load(mid_lse_ptr + row + sp, mask=g < G, other=float("-inf"),
                                cache_modifier=".cg")
                o_s = tl.load(mid_o_ptr + (row + sp)[:, None] * D + d[None, :], mask=q_mask, other=0.0,
                              cache_modifier=".cg")
                m_new = tl.maximum(m, lse_s)
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                w_old, w_s = tl.exp2(m - m_safe), tl.exp2(lse_s - m_safe)
                res = res * w_old[:, None] + o_s * w_s[:, None]
                den = den * w_old + w_s
                m = m_new
            res = res / tl.where(den == 0.0, 1.0, den)[:, None]
            tl.store(out, res.to(out_ptr.dtype.element_ty), mask=q_mask)
            tl.store(counter, 0)


INTERPRETED = not isinstance(_decode_split_kernel, JITFunction)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a handful of splits exercises the reduce on small shapes
    return torch.cuda.get_device_properties(device).multi_processor_count


def decode_num_splits(batch: int, kv_heads: int, max_len: int, device: torch.device) -> int:
    """Splits per (sequence, KV head): enough programs for ~2 waves over the SMs, at least
    `min_tokens` keys of max_len per split, at most 32. Depends on shapes only (CUDA graphs)."""
    min_tokens = 256 if device.type == "cuda" else 16
    want = triton.cdiv(2 * _num_sms(device), batch * kv_heads)
    return max(1, min(want, triton.cdiv(max_len, min_tokens), 32))


def _decode_config(d: int, device: torch.device) -> tuple[int, int]:
    """(BLOCK_N, num_warps)."""
    if device.type != "cuda":
        return 16, 4
    return (64 if d <= 128 else 32), 4


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
    block_n, warps = _decode_config(d, q.device)
    block_d = triton.next_power_of_2(d)
    mid_o = mid_lse = count = out  # unused when num_splits == 1
    if num_splits > 1:
        mid_o = torch.empty(b, h, num_splits, d, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(b, h, num_splits, dtype=torch.float32, device=q.device)
        count = _split_counts(q.device, b * kvh)
    ks, vs, quant = _scale_views(k_cache, v_cache)
    use_pdl = pdl.enabled(q.device)  # the kernel waits before it reads q (kernels/triton/pdl.py)
    _decode_split_kernel[(b, kvh, num_splits)](
        q, k_cache, v_cache, ks, vs, block_tables, context_lens, out, mid_o, mid_lse, count,
        scale * LOG2E, window or 0, *q.stride(), *k_cache.stride(), block_tables.stride(0),
        *out.stride(), G=g, D=d, PAGE=page, NUM_SPLITS=num_splits, HAS_WINDOW=window is not None,
        BLOCK_G=max(16, triton.next_power_of_2(g)), BLOCK_D=block_d, BLOCK_N=block_n,
        QUANT=quant, INTERPRET=INTERPRETED, num_warps=warps, PDL=use_pdl, launch_pdl=use_pdl)


_COUNTS: dict = {}  # device -> int32 zeros, one per (sequence, KV head), grown as needed
_OUTGROWN: list = []  # counts replaced by bigger ones: a captured CUDA graph may still use them


def _split_counts(device: torch.device, n: int) -> torch.Tensor:
    """The decode kernel's per-(sequence, KV head) counts of finished splits: zeros, and each
    call leaves them zero; shared by every call on the device (one stream runs them in turn)."""
    count = _COUNTS.get(device)
    if count is None or count.numel() < n:
        if count is not None:
            _OUTGROWN.append(count)
        count = torch.zeros(max(n, 1 << 12), dtype=torch.int32, device=device)
        _COUNTS[device] = count
    return count
