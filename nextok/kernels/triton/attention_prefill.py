"""The paged (chunked) prefill kernel: every chunk of a step that continues a cached prefix, in
one launch, over the paged KV pool in attention.py's layout and with its tile loop (GQA heads
packed into the query tile's rows, base-2 online softmax, int8 / fp8 caches by QUANT).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from nextok.kernels.triton.attention import INTERPRETED, LOG2E, _attend_range, _fp8_query, _head_stride, _scale_views


@triton.jit(do_not_specialize=["s_bt"])
def _prefill_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, out_ptr, info_ptr, bt_ptr, qk_scale,
                    window, s_qt, s_qh, s_qd, s_cb, s_cs, s_ch, s_cd, s_ot, s_oh, s_od, s_bt,
                    G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                    HAS_WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_N: tl.constexpr, QUANT: tl.constexpr, INTERPRET: tl.constexpr):
    # Grid (num_chunks, KVH, cdiv(max_q_len, BLOCK_M // G)). Tile rows pack (token, group head):
    # row r is token qb * TOK + r // G of the chunk and query head kvh * G + r % G.
    # info: [C, 3] int32 (q_start, q_len, ctx_len); bt: [C, max_blocks] int64.
    c, kvh, qb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    TOK: tl.constexpr = BLOCK_M // G
    q_start = tl.load(info_ptr + c * 3)
    q_len = tl.load(info_ptr + c * 3 + 1)
    ctx = tl.load(info_ptr + c * 3 + 2)
    prefix = ctx - q_len  # cached keys before the chunk's first token

    r = tl.arange(0, BLOCK_M)
    tok = qb * TOK + r // G
    head = kvh * G + r % G
    row_ok = (r < TOK * G) & (tok < q_len)
    pos_q = prefix + tok  # [BLOCK_M] absolute positions
    d = tl.arange(0, BLOCK_D)
    d_mask = d < D
    mask = row_ok[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + (q_start + tok)[:, None] * s_qt + head[:, None] * s_qh + d[None, :] * s_qd,
                mask=mask, other=0.0)
    q = _fp8_query(q, QUANT)

    # Keys this tile needs: [lo, hi); none when the tile starts past the chunk's end.
    first = qb * TOK
    hi = prefix + tl.minimum(first + TOK, q_len)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(prefix + first - window + 1, 0)
    hi = tl.where(first < q_len, hi, lo)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    s_ch = _head_stride(s_ch, QUANT)
    k_base, v_base, bt_row = kc_ptr + kvh * s_ch, vc_ptr + kvh * s_ch, bt_ptr + c * s_bt
    ks_base, vs_base = ks_ptr + kvh * (s_ch // 4), vs_ptr + kvh * (s_ch // 4)
    mid = lo  # keys [lo, mid): whole tiles every row of this tile sees (causal, no window)
    if not HAS_WINDOW:
        mid = tl.minimum((prefix + first + 1) // BLOCK_N * BLOCK_N, hi)
        acc, m_i, l_i = _attend_range(q, acc, m_i, l_i, 0, mid, pos_q, window, k_base, v_base,
                                      ks_base, vs_base, bt_row, s_cb, s_cs, d * s_cd, d_mask,
                                      qk_scale, PAGE, BLOCK_N, MASK=0, HAS_WINDOW=False,
                                      QUANT=QUANT, SCALE_COL=D // 4, INTERPRET=INTERPRET)
    acc, m_i, l_i = _attend_range(q, acc, m_i, l_i, mid, hi, pos_q, window, k_base, v_base,
                                  ks_base, vs_base, bt_row, s_cb, s_cs, d * s_cd, d_mask, qk_scale,
                                  PAGE, BLOCK_N, MASK=2, HAS_WINDOW=HAS_WINDOW, QUANT=QUANT,
                                  SCALE_COL=D // 4, INTERPRET=INTERPRET)
    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + (q_start + tok)[:, None] * s_ot + head[:, None] * s_oh + d[None, :] * s_od,
             o.to(out_ptr.dtype.element_ty), mask=mask)


def _prefill_config(d: int, g: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages); BLOCK_M holds at least one token's G heads."""
    if device.type != "cuda":
        m, n, warps, stages = 16, 16, 4, 1
    elif d <= 64:
        m, n, warps, stages = 128, 64, 4, 3
    elif d <= 128:
        m, n, warps, stages = 128, 64, 8, 3
    else:
        m, n, warps, stages = 64, 32, 4, 2
    return max(m, triton.next_power_of_2(g)), n, warps, stages


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  info: torch.Tensor, block_tables: torch.Tensor, max_q_len: int, scale: float,
                  window: int | None, out: torch.Tensor) -> None:
    """q: [T, H, D]; info: [C, 3] int32 (q_start, q_len, ctx_len) per chunk; block_tables:
    [C, max_blocks] int64 (padded). Writes the chunks' rows of out [T, H, D]."""
    h, d = q.shape[1], q.shape[2]
    kvh, page = k_cache.shape[2], k_cache.shape[1]
    g = h // kvh
    block_m, block_n, warps, stages = _prefill_config(d, g, q.device)
    grid = (info.shape[0], kvh, triton.cdiv(max_q_len, block_m // g))
    ks, vs, quant = _scale_views(k_cache, v_cache)
    _prefill_kernel[grid](
        q, k_cache, v_cache, ks, vs, out, info, block_tables, scale * LOG2E, window or 0,
        *q.stride(), *k_cache.stride(), *out.stride(), block_tables.stride(0),
        G=g, D=d, PAGE=page, HAS_WINDOW=window is not None, BLOCK_M=block_m,
        BLOCK_D=triton.next_power_of_2(d), BLOCK_N=block_n, QUANT=quant, INTERPRET=INTERPRETED,
        num_warps=warps, num_stages=stages)
