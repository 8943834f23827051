/* GGUF blocks (Q4_0, Q4_1, Q8_0) regrouped sixteen weight rows at a time, and y = x @ W^T on them
 * through int8 activations on AVX-512 VNNI (here) or AVX2 (gguf_rows16_avx2.h, the same results
 * bit for bit): gguf_matmul.c's gguf_matmul_q8 arithmetic, at a cost that hardly grows with the
 * rows of x.
 *
 * Why: gguf_matmul_q8 dots one weight row with one row of x at a time (per block and row: a
 * vpdpbusd, a convert, two FMAs; per output a horizontal sum), so 8 rows of x (a verify step of
 * speculative decoding, or 8 decoding sequences) cost 2.6x one row on the 2-core Xeon. Here one
 * vector holds 4 consecutive weights of each of 16 rows, and one vpdpbusd against 4 broadcast
 * bytes of x advances 16 outputs: per 16 outputs, block and row of x, 8 vpdpbusd, a convert, a
 * multiply and two FMAs, no horizontal sum. The regrouping is done once, at load: gathering 16
 * rows' blocks at run time (gathers, or loads and a transpose) read memory in 16 interleaved
 * streams and cost more than the arithmetic (7.3 ms for all the default model's matrices with
 * the arithmetic taken out, against 5.6 for gguf_matmul_q8 whole).
 *
 * Layout of a regrouped matrix: groups of 16 rows (the last one padded with zero blocks), each
 * group's blocks in order; one group-block is the 16 rows' block b, the same bytes as 16 blocks:
 *   Q4_1 (320 B): u32 [16] d | m << 16;  u32 [4][16] nibbles: [j][i] = row i's nibble bytes 4j..4j+3
 *   Q4_0 (288 B): f16 [16] d;            u32 [4][16] nibbles as Q4_1
 *   Q8_0 (544 B): f16 [16] d;            u32 [8][16] q bytes 4j..4j+3 of row i, each q + 128 (unsigned)
 * (a nibble byte t holds weight t in its low half and weight t + 16 in its high half).
 *
 * Arithmetic (as gguf_matmul_q8): x quantized per 32 values, d_x = max|x| / 127, q_x = round(x / d_x);
 *   Q4_0 / Q4_1: sum_j w_j x_j ~= d_w d_x (q_w . q_x) + m_w s_x,  s_x = d_x sum(q_x)  (Q4_0: m_w = -8 d_w)
 *   Q8_0:        sum_j w_j x_j ~= d_w d_x ((q_w + 128) . q_x - 128 sum(q_x))  (exact in integers)
 * The integer dot products are exact and each output's float sum runs over the blocks in order,
 * so a row's result does not depend on the other rows of x (batched == alone, speculation on ==
 * off) nor on the number of threads.
 *
 * Layouts: x [M, K] float32 (any M >= 1), y [M, N] float32.
 */
#include "gguf_common.h"

/* the types this file regroups (block_bytes_of: gguf_common.h) */
static inline int rows16_bytes(int type) {
    return type == Q4_0 || type == Q4_1 || type == Q8_0 ? block_bytes_of(type) : 0;
}

/* w [N, K / 32] blocks -> out, regrouped (above): ceil(N / 16) * 16 * K / 32 blocks' bytes.
 * Returns 0, or 1 for an unsupported type or K not a multiple of 32. */
int gguf_rows16_pack(const uint8_t *w, int type, int n, int k, uint8_t *out) {
    const int bytes = rows16_bytes(type);
    if (!bytes || k % 32 || n < 1) return 1;
    const int nb = k / 32, ng = (n + 15) / 16;
    const int words = type == Q8_0 ? 8 : 4, head = type == Q4_1 ? 64 : 32;
    for (int g = 0; g < ng; g++)
        for (int b = 0; b < nb; b++) {
            uint8_t *o = out + ((size_t)g * nb + b) * 16 * bytes;
            memset(o, 0, (size_t)16 * bytes);
            for (int i = 0; i < 16 && g * 16 + i < n; i++) {
                const uint8_t *blk = w + ((size_t)(g * 16 + i) * nb + b) * bytes;
                memcpy(o + i * (head / 16), blk, head / 16);  /* d (and m) */
                const uint8_t *q = blk + (type == Q4_1 ? 4 : 2);
                for (int j = 0; j < words; j++) {
                    uint32_t v;
                    memcpy(&v, q + 4 * j, 4);
                    if (type == Q8_0) v ^= 0x80808080u;
                    memcpy(o + head + ((size_t)j * 16 + i) * 4, &v, 4);
                }
            }
        }
    return 0;
}

/* The float32 weights [N, K] of a regrouped matrix, the same values as the loader's
 * dequantization (d * q + m is exact before its one rounding). Returns 0, or 1 as above. */
int gguf_rows16_dequant_f32(const uint8_t *p, int type, int n, int k, float *out, int num_threads) {
    const int bytes = rows16_bytes(type);
    if (!bytes || k % 32 || n < 1) return 1;
    const int nb = k / 32, head = type == Q4_1 ? 64 : 32;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int row = 0; row < n; row++) {
        const int g = row / 16, i = row % 16;
        for (int b = 0; b < nb; b++) {
            const uint8_t *o = p + ((size_t)g * nb + b) * 16 * bytes;
            float *dst = out + (size_t)row * k + b * 32;
            if (type == Q8_0) {
                const float d = half_to_float(o + 2 * i);
                for (int j = 0; j < 8; j++)
                    for (int t = 0; t < 4; t++)
                        dst[4 * j + t] = d * (float)(int8_t)(o[head + (j * 16 + i) * 4 + t] ^ 0x80);
                continue;
            }
            const float d = half_to_float(o + (head / 16) * i);
            const float m = type == Q4_1 ? half_to_float(o + 4 * i + 2) : -8.0f * d;
            for (int j = 0; j < 4; j++)
                for (int t = 0; t < 4; t++) {
                    const uint8_t byte = o[head + (j * 16 + i) * 4 + t];
                    dst[4 * j + t] = fmaf(d, (float)(byte & 15), m);
                    dst[16 + 4 * j + t] = fmaf(d, (float)(byte >> 4), m);
                }
        }
    }
    return 0;
}

#define PREFETCH_BYTES 8192
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>
#define ROWS16_KERNEL 3  /* gguf_rows16_ready()'s answer: AVX-512 VNNI */
#define ROWS_PER_PASS 16  /* rows of x per pass over the weights (accumulators in registers) */

/* quantize_x_block (gguf_common.h) on 16-wide registers, the same results: d = max|x| / 127,
 * q = x * (1 / d) rounded half to even (the default rounding mode, as nearbyintf). The scalar
 * loop cost ~40 ns a block, a few percent of a step at 8 rows. x: 32 float32, or 32 bfloat16
 * (raw bits) widened exactly, so a bfloat16 x quantizes as its float32 copy would. Returns sum(q). */
static inline int quantize_block(const void *x, int bf16, int8_t *qp, float *d_out) {
    __m512 x0, x1;
    if (bf16) {
        const uint16_t *h = x;
        x0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)h)), 16));
        x1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(h + 16))), 16));
    } else {
        x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps((const float *)x + 16);
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(id)));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(id)));
    _mm_storeu_si128((__m128i *)qp, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(qp + 16), _mm512_cvtepi32_epi8(q1));
    *d_out = d;
    return _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
}

/* Group g (16 weight rows) against x rows [r0, r0 + M), M <= ROWS_PER_PASS a compile-time
 * constant at each call site; outputs past N are not stored. */
static inline __attribute__((always_inline)) void group16(
        const int8_t *xq, const float *xd, const float *xs, const int *sq, int k,
        const uint8_t *p, const int type, int n, void *y, int y_bf16, int g, int r0, const int M) {
    const int nb = k / 32, bytes = rows16_bytes(type), head = type == Q4_1 ? 64 : 32;
    const int n0 = g * 16, rows = n - n0 < 16 ? n - n0 : 16;
    const __m512i low4 = _mm512_set1_epi32(0x0f0f0f0f);
    __m512 acc[ROWS_PER_PASS];
    for (int r = 0; r < M; r++) acc[r] = _mm512_setzero_ps();
    const uint8_t *gb = p + (size_t)g * nb * 16 * bytes;
    for (int b = 0; b < nb; b++, gb += 16 * bytes) {
        /* every line of the group-block PREFETCH_BYTES ahead, kept in the caches (prefetcht2):
         * all the default model's Q4_1 matrices at 1 row 2.7 -> 2.0 ms against two lines 1 KB
         * ahead non-temporally (2 KB ahead: 3.3; 16 KB: the same as 8) */
        for (int e = 0; e < 16 * bytes; e += 64) __builtin_prefetch(gb + PREFETCH_BYTES + e, 0, 1);
        __m512 d, m = _mm512_setzero_ps();
        __m512i wq[8];  /* wq[j], lane i: row i's weights 4j .. 4j + 3 as unsigned bytes */
        if (type == Q4_1) {
            const __m512i dm = _mm512_loadu_si512(gb);
            d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
            m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
        } else {
            d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
            if (type == Q4_0) m = _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));  /* exact */
        }
        if (type == Q8_0) {
            for (int j = 0; j < 8; j++) wq[j] = _mm512_loadu_si512(gb + head + 64 * j);
        } else {
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_loadu_si512(gb + head + 64 * j);
                wq[j] = _mm512_and_si512(v, low4);
                wq[j + 4] = _mm512_and_si512(_mm512_srli_epi32(v, 4), low4);
            }
        }
        for (int r = 0; r < M; r++) {
            const size_t at = (size_t)(r0 + r) * nb + b;
            const int8_t *xr = xq + at * 32;
            /* 4 bytes of x broadcast straight from memory (a load; gcc had moved them through a
             * general register and broadcast that, a shuffle-port op per vpdpbusd); two chains
             * (even and odd groups of 4), added as integers: exact either way */
#define XB(j) _mm512_broadcastd_epi32(_mm_loadu_si32(xr + 4 * (j)))
            __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[0], XB(0));
            __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[1], XB(1));
            for (int j = 2; j < 8; j += 2) {
                s0 = _mm512_dpbusd_epi32(s0, wq[j], XB(j));
                s1 = _mm512_dpbusd_epi32(s1, wq[j + 1], XB(j + 1));
            }
#undef XB
            __m512i s = _mm512_add_epi32(s0, s1);
            if (type == Q8_0) s = _mm512_sub_epi32(s, _mm512_set1_epi32(128 * sq[at]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(xd[at])), acc[r]);
            if (type != Q8_0) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[at]), acc[r]);
        }
    }
    const __mmask16 live = (__mmask16)((1u << rows) - 1u);
    for (int r = 0; r < M; r++) {
        const size_t at = (size_t)(r0 + r) * n + n0;
        if (!y_bf16) {
            _mm512_mask_storeu_ps((float *)y + at, live, acc[r]);
            continue;
        }
        /* rounded to nearest even, as torch's .to(bfloat16) of the float32 result */
        const __m512i u = _mm512_castps_si512(acc[r]);
        const __m512i rne = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                             _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
        _mm256_mask_storeu_epi16((uint16_t *)y + at, live, _mm512_cvtepi32_epi16(_mm512_srli_epi32(rne, 16)));
    }
}

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ROWS16_KERNEL 1  /* AVX2 */
#define ROWS_PER_PASS 4  /* 16 ymm registers: accumulators, 16-bit sums and the weights */
#include "gguf_rows16_avx2.h"
#endif

#ifdef ROWS16_KERNEL
/* 0: no kernel here (the layers keep gguf_matmul_q8); 1: AVX2; 3: AVX-512 VNNI */
int gguf_rows16_ready(void) { return ROWS16_KERNEL; }

static inline __attribute__((always_inline)) void groups_typed(
        const int8_t *xq, const float *xd, const float *xs, const int *sq, int m_rows, int k,
        const uint8_t *p, const int type, int n, void *y, int y_bf16, int g0, int g1) {
    for (int g = g0; g < g1; g++)
        for (int r0 = 0; r0 < m_rows; r0 += ROWS_PER_PASS) {
            const int M = m_rows - r0 < ROWS_PER_PASS ? m_rows - r0 : ROWS_PER_PASS;
            switch (M) {
#define G16(MM) group16(xq, xd, xs, sq, k, p, type, n, y, y_bf16, g, r0, MM); break
            case 1: G16(1); case 2: G16(2); case 3: G16(3);
#if ROWS_PER_PASS > 4
            case 4: G16(4); case 5: G16(5); case 6: G16(6); case 7: G16(7); case 8: G16(8);
            case 9: G16(9); case 10: G16(10); case 11: G16(11); case 12: G16(12);
            case 13: G16(13); case 14: G16(14); case 15: G16(15);
#endif
            default: G16(ROWS_PER_PASS);
#undef G16
            }
        }
}

/* y [M, N] = x [M, K] @ W^T, W regrouped by gguf_rows16_pack; x and y float32, or bfloat16
 * (raw bits: x widened exactly, y rounded to nearest even, the same values as converting around
 * the float32 call, without the two conversions). x is quantized by all threads, then each takes
 * a share of the groups. Returns 0; 1 for an unsupported type or K not a multiple of 32; 2 if
 * scratch memory could not be had. */
static int rows16_matmul(const void *x, int x_bf16, int m_rows, int k, const uint8_t *p, int type,
                         int n, void *y, int y_bf16, int num_threads) {
    if (!rows16_bytes(type) || k % 32 || m_rows < 1 || n < 1) return 1;
    const int nb = k / 32;
    const size_t nq = (size_t)m_rows * k, ns = (size_t)m_rows * nb;
    /* xq | xd | xs | sq, quantized once here and read by every thread */
    const size_t at = (nq + 63) & ~(size_t)63;
    uint8_t *scratch = aligned_alloc(64, (at + 3 * ns * sizeof(float) + 63) & ~(size_t)63);
    if (!scratch) return 2;
    int8_t *xq = (int8_t *)scratch;
    float *xd = (float *)(scratch + at), *xs = xd + ns;
    int *sq = (int *)(xs + ns);
    const int ng = (n + 15) / 16;
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (size_t i = 0; i < ns; i++) {
            const void *xb = x_bf16 ? (const void *)((const uint16_t *)x + i * 32) : (const void *)((const float *)x + i * 32);
            sq[i] = quantize_block(xb, x_bf16, xq + i * 32, &xd[i]);
            xs[i] = xd[i] * (float)sq[i];
        }  /* (the loop's barrier: every block quantized before any group reads it) */
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int g0 = (int)((long)ng * t / nt), g1 = (int)((long)ng * (t + 1) / nt);
        if (type == Q4_1) groups_typed(xq, xd, xs, sq, m_rows, k, p, Q4_1, n, y, y_bf16, g0, g1);
        else if (type == Q8_0) groups_typed(xq, xd, xs, sq, m_rows, k, p, Q8_0, n, y, y_bf16, g0, g1);
        else groups_typed(xq, xd, xs, sq, m_rows, k, p, Q4_0, n, y, y_bf16, g0, g1);
    }
    free(scratch);
    return 0;
}

int gguf_rows16_matmul_q8(const float *x, int m_rows, int k, const uint8_t *p, int type, int n,
                          float *y, int num_threads) {
    return rows16_matmul(x, 0, m_rows, k, p, type, n, y, 0, num_threads);
}

int gguf_rows16_matmul_q8_bf16(const uint16_t *x, int m_rows, int k, const uint8_t *p, int type,
                               int n, uint16_t *y, int num_threads) {
    return rows16_matmul(x, 1, m_rows, k, p, type, n, y, 1, num_threads);
}
#else
int gguf_rows16_ready(void) { return 0; }

int gguf_rows16_matmul_q8(const float *x, int m_rows, int k, const uint8_t *p, int type, int n,
                          float *y, int num_threads) {
    return 1;
}

int gguf_rows16_matmul_q8_bf16(const uint16_t *x, int m_rows, int k, const uint8_t *p, int type,
                               int n, uint16_t *y, int num_threads) {
    return 1;
}
#endif
