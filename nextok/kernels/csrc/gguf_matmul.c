/* y = x @ W^T with W kept in its GGUF blocks (Q4_0, Q4_1 or Q8_0), float32 activations, for the few
 * rows of a decode step: each weight block is read from memory once and dequantized once, in
 * registers, for all (at most 8) rows of x. Decode at small batch streams every weight once per
 * step, so reading ~5 (Q4_1) or ~8.5 (Q8_0) bits per weight instead of 32 is the whole point.
 *
 * Layouts:
 *   x  [M, K] float32, M <= 8        y [M, N] float32
 *   w  [N, K / 32] blocks, row-major; a block holds 32 consecutive weights of one row:
 *      Q4_1 (20 bytes): f16 d | f16 m | 16 bytes, byte j = q[j] | q[j + 16] << 4;  w = d * q + m
 *      Q4_0 (18 bytes): f16 d | the same 16 bytes;                        w = d * (q - 8)
 *      Q8_0 (34 bytes): f16 d | int8 q[32];                                           w = d * q
 * d * q is exact in float32 (an 11-bit by at most 8-bit product), so the weights equal the
 * loader's float32 dequantization bit for bit; only the order of the dot product's sum differs
 * from a float32 matmul. K-quants (256-weight super-blocks) have their own file, gguf_kquants.c.
 */
#include "gguf_common.h"

/* Blocks ahead to prefetch. A decode step streams ~100 MB of blocks, which the hardware
 * prefetcher alone did not keep up with: 4 GB/s of a 22 GB/s machine. Measured on a 2-core Xeon
 * (2026-12-04), all the default model's layers at 1 row: 24.3 ms -> 15.5 ms (24 blocks ahead:
 * 17.5, 128: 15.5); the engine's float32 decode 27.3 -> 18.2 ms per token. */
#define PREFETCH_BLOCKS 64
/* The int8 kernel, ~2x less work per block, wants its blocks earlier and kept (prefetcht2, not
 * the non-temporal hint above): all the default model's layers at 1 row 10.8 -> 7.8 ms (same
 * machine, same day; 32 ahead: 11.9, 256: 8.0). The float32 kernel gained nothing from it. */
#define PREFETCH_BLOCKS_Q8 128
#define PREFETCH_Q8(p) __builtin_prefetch(p, 0, 1)

/* Q4_0, Q4_1, Q5_0, Q5_1 all run as w = d * q + m, q unsigned: Q4_0 (d * (q - 8)) with m = -8 d,
 * Q5_0 (d * (q - 16)) with m = -16 d; d * q + m is then exact, as d * (q - 8) is. */
static inline float block_min(const uint8_t *b, int type) {
    return type == Q4_1 || type == Q5_1 ? half_to_float(b + 2)
         : (type == Q4_0 ? -8.0f : -16.0f) * half_to_float(b);
}

/* the 16 bytes of nibbles: byte j = q[j] & 15 | (q[j + 16] & 15) << 4 */
static inline const uint8_t *block_nibbles(const uint8_t *b, int type) {
    return b + (type == Q4_0 ? 2 : type == Q4_1 ? 4 : type == Q5_0 ? 6 : 8);  /* Q5_1: 8 */
}

static inline int has_fifth_bits(int type) { return type == Q5_0 || type == Q5_1; }

/* Q5_0 / Q5_1's u32 of fifth bits (bit i: weight i), after d (and m) */
static inline uint32_t fifth_bits(const uint8_t *b, int type) {
    uint32_t h;
    memcpy(&h, b + (type == Q5_0 ? 2 : 4), 4);
    return h;
}
#if defined(__AVX2__)

/* 8 bytes -> 8 floats */
static inline v8 u8_to_v8(__m128i bytes) {
    v8 r;
    __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    memcpy(&r, &f, 32);
    return r;
}

/* 16 bits -> 16 bytes, byte i = 16 if bit i is set, else 0 (the fifth bit of a 5-bit weight) */
static inline __m128i bits_to_bytes16(uint32_t h16) {
    const __m128i spread = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)h16),
                                            _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    const __m128i bit = _mm_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(spread, bit), bit), _mm_set1_epi8(16));
}

/* The 32 unsigned weights of a Q4_0 / Q4_1 / Q5_0 / Q5_1 block as bytes, in two halves: lo
 * weights 0..15, hi 16..31. */
static inline void block_u8(const uint8_t *b, int type, __m128i *lo, __m128i *hi) {
    const __m128i q = _mm_loadu_si128((const __m128i *)block_nibbles(b, type));
    const __m128i mask = _mm_set1_epi8(0x0f);
    *lo = _mm_and_si128(q, mask), *hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    if (has_fifth_bits(type)) {
        const uint32_t h = fifth_bits(b, type);
        *lo = _mm_or_si128(*lo, bits_to_bytes16(h & 0xffff));
        *hi = _mm_or_si128(*hi, bits_to_bytes16(h >> 16));
    }
}

/* The same 32 weights in one 256-bit vector, weight i in byte i (for the int8 kernels): the
 * fifth bits expanded all at once (byte i picks byte i / 8 of qh, then tests bit i % 8). */
static inline __m256i block_u8_256(const uint8_t *b, int type) {
    const __m128i q = _mm_loadu_si128((const __m128i *)block_nibbles(b, type));
    __m256i v = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1),
                                 _mm256_set1_epi8(0x0f));
    if (has_fifth_bits(type)) {
        const __m256i spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32((int)fifth_bits(b, type)),
            _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        v = _mm256_or_si256(v, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                                                _mm256_set1_epi8(16)));
    }
    return v;
}

static inline v8 i8_to_v8(__m128i bytes) {
    v8 r;
    __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    memcpy(&r, &f, 32);
    return r;
}

/* The 32 weights of one block, as four 8-wide vectors. */
static inline void dequant_block(const uint8_t *b, int type, v8 out[4]) {
    if (type != Q8_0) {
        const v8 d = (v8){0} + half_to_float(b), m = (v8){0} + block_min(b, type);
        __m128i lo, hi;
        block_u8(b, type, &lo, &hi);
        out[0] = u8_to_v8(lo) * d + m;
        out[1] = u8_to_v8(_mm_srli_si128(lo, 8)) * d + m;
        out[2] = u8_to_v8(hi) * d + m;
        out[3] = u8_to_v8(_mm_srli_si128(hi, 8)) * d + m;
    } else {
        const v8 d = (v8){0} + half_to_float(b);
        const __m128i q0 = _mm_loadu_si128((const __m128i *)(b + 2));
        const __m128i q1 = _mm_loadu_si128((const __m128i *)(b + 18));
        out[0] = i8_to_v8(q0) * d;
        out[1] = i8_to_v8(_mm_srli_si128(q0, 8)) * d;
        out[2] = i8_to_v8(q1) * d;
        out[3] = i8_to_v8(_mm_srli_si128(q1, 8)) * d;
    }
}
#else
/* The 32 weights of one block, as four 8-wide vectors (portable). */
static inline void dequant_block(const uint8_t *b, int type, v8 out[4]) {
    float tmp[32];
    if (type != Q8_0) {
        const float d = half_to_float(b), m = block_min(b, type);
        const uint8_t *q = block_nibbles(b, type);
        const uint32_t h = has_fifth_bits(type) ? fifth_bits(b, type) : 0;
        for (int j = 0; j < 16; j++) {
            tmp[j] = d * (float)((q[j] & 0x0f) | ((h >> j) & 1) << 4) + m;
            tmp[j + 16] = d * (float)((q[j] >> 4) | ((h >> (j + 16)) & 1) << 4) + m;
        }
    } else {
        const float d = half_to_float(b);
        for (int j = 0; j < 32; j++) tmp[j] = d * (float)(int8_t)b[2 + j];
    }
    memcpy(out, tmp, sizeof(tmp));
}
#endif

/* acc + a * b, one fused multiply-add (rounded once) wherever the compiler has FMA. */
static inline v8 fma8(v8 a, v8 b, v8 acc) {
#if defined(__AVX2__) && defined(__FMA__)
    __m256 ra, rb, rc;
    memcpy(&ra, &a, 32); memcpy(&rb, &b, 32); memcpy(&rc, &acc, 32);
    rc = _mm256_fmadd_ps(ra, rb, rc);
    memcpy(&acc, &rc, 32);
    return acc;
#else
    return acc + a * b;
#endif
}

/* Output rows [lo, hi) for M rows of x, M a compile-time constant at each call site below: the
 * accumulators then live in registers. (With a runtime M gcc kept acc[] on the stack, and every
 * block waited on a store-to-load round trip.) Factoring Q4_1 as d * (q . x) + m * sum(x) saved
 * nothing at one row and cost 2x at eight (register pressure), so blocks are dequantized whole.
 * Each row of x has two accumulators, one for a block's first 16 weights and one for its last
 * 16, and every product goes into one with an FMA: 4 vector ops per block and row, where a sum
 * of products added to one accumulator took 6 (2 mul, 2 fma, 2 add). All the default model's
 * matrices, 2-core Xeon (2026-12-05): 17.0 -> 12.3 ms at 1 row, 28.0 -> 20.2 ms at 8 (several
 * rows, as verify steps and batches have, are bound by those ops). The sum's order is the same
 * for every M, so a row's result does not depend on the rows beside it (batched == alone,
 * speculation on == off). With AVX-512 rows_dot16 runs instead. */
static inline __attribute__((always_inline)) void rows_dot(
        const float *x, int k, const uint8_t *w, int type, int block_bytes, int n, float *y,
        int lo, int hi, const int M) {
    const int nb = k / 32;
    for (int row = lo; row < hi; row++) {
        const uint8_t *blocks = w + (size_t)row * nb * block_bytes;
        v8 acc0[MAX_ROWS], acc1[MAX_ROWS];
        for (int i = 0; i < M; i++) acc0[i] = acc1[i] = (v8){0};
        for (int b = 0; b < nb; b++) {
            v8 wv[4];
            __builtin_prefetch(blocks + (size_t)(b + PREFETCH_BLOCKS) * block_bytes, 0, 0);
            dequant_block(blocks + (size_t)b * block_bytes, type, wv);
            for (int i = 0; i < M; i++) {
                const float *xp = x + (size_t)i * k + b * 32;
                acc0[i] = fma8(*(const v8 *)xp, wv[0], acc0[i]);
                acc1[i] = fma8(*(const v8 *)(xp + 16), wv[2], acc1[i]);
                acc0[i] = fma8(*(const v8 *)(xp + 8), wv[1], acc0[i]);
                acc1[i] = fma8(*(const v8 *)(xp + 24), wv[3], acc1[i]);
            }
        }
        for (int i = 0; i < M; i++) y[(size_t)i * n + row] = hsum(acc0[i] + acc1[i]);
    }
}

#if defined(__AVX512F__)
/* The 32 weights of one block as two 16-wide vectors (weights 0..15, 16..31). */
static inline void dequant_block16(const uint8_t *b, int type, __m512 *w0, __m512 *w1) {
    if (type != Q8_0) {  /* Q4_0, Q4_1, Q5_0, Q5_1: d * q + m, as dequant_block */
        const __m512 d = _mm512_set1_ps(half_to_float(b)), m = _mm512_set1_ps(block_min(b, type));
        __m128i lo, hi;
        block_u8(b, type, &lo, &hi);
        *w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), d, m);
        *w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), d, m);
    } else {
        const __m512 d = _mm512_set1_ps(half_to_float(b));
        *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)))), d);
        *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)))), d);
    }
}

/* rows_dot on 16-wide vectors: one FMA per half block and row, two accumulators a row (the
 * halves of a block). Same machine: 12.3 -> 9.2 ms at 1 row, 20.2 -> 16.3 ms at 8 (Sapphire
 * Rapids issues two 512-bit FMAs a cycle). Per M as rows_dot: a row's sum is the same whatever
 * M, though not the same as rows_dot's (another order). */
static inline __attribute__((always_inline)) void rows_dot16(
        const float *x, int k, const uint8_t *w, int type, int block_bytes, int n, float *y,
        int lo, int hi, const int M) {
    const int nb = k / 32;
    for (int row = lo; row < hi; row++) {
        const uint8_t *blocks = w + (size_t)row * nb * block_bytes;
        __m512 acc0[MAX_ROWS], acc1[MAX_ROWS];
        for (int i = 0; i < M; i++) acc0[i] = acc1[i] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++) {
            __m512 w0, w1;
            __builtin_prefetch(blocks + (size_t)(b + PREFETCH_BLOCKS) * block_bytes, 0, 0);
            dequant_block16(blocks + (size_t)b * block_bytes, type, &w0, &w1);
            for (int i = 0; i < M; i++) {
                const float *xp = x + (size_t)i * k + b * 32;
                acc0[i] = _mm512_fmadd_ps(_mm512_loadu_ps(xp), w0, acc0[i]);
                acc1[i] = _mm512_fmadd_ps(_mm512_loadu_ps(xp + 16), w1, acc1[i]);
            }
        }
        for (int i = 0; i < M; i++) y[(size_t)i * n + row] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i]));
    }
}
#define ROWS_DOT rows_dot16
#else
#define ROWS_DOT rows_dot
#endif

/* The block type as a compile-time constant for the default model's two (Q4_1, Q8_0): the
 * per-block type tests of dequant (block_u8, block_min) then fold away; all the default model's
 * matrices at 1 row 10.8 -> 9.9 ms (2-core Xeon, 2026-12-05). */
#define ROWS_DOT_TYPED(M) do {                                                               \
        if (type == Q4_1) ROWS_DOT(x, k, w, Q4_1, block_bytes, n, y, lo, hi, M);              \
        else if (type == Q8_0) ROWS_DOT(x, k, w, Q8_0, block_bytes, n, y, lo, hi, M);         \
        else ROWS_DOT(x, k, w, type, block_bytes, n, y, lo, hi, M);                           \
    } while (0)

/* Returns 0, or 1 for an unsupported type, K not a multiple of 32, or M outside 1..8. */
int gguf_matmul_f32(const float *x, int m_rows, int k, const uint8_t *w, int type, int n,
                    float *y, int num_threads) {
    const int block_bytes = block_bytes_of(type);
    if (!block_bytes || k % 32 || m_rows < 1 || m_rows > MAX_ROWS) return 1;
    /* One contiguous share of the output rows per thread (the weights are streamed once). */
#pragma omp parallel num_threads(num_threads)
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int lo = (int)((long)n * t / nt), hi = (int)((long)n * (t + 1) / nt);
        switch (m_rows) {
        case 1: ROWS_DOT_TYPED(1); break;
        case 2: ROWS_DOT_TYPED(2); break;
        case 3: ROWS_DOT_TYPED(3); break;
        case 4: ROWS_DOT_TYPED(4); break;
        case 5: ROWS_DOT_TYPED(5); break;
        case 6: ROWS_DOT_TYPED(6); break;
        case 7: ROWS_DOT_TYPED(7); break;
        default: ROWS_DOT_TYPED(8); break;
        }
    }
    return 0;
}

/* out [N, K] float32 = the weights of w [N, K / 32 blocks], the same values as the loader's
 * dequantization: for steps too big for gguf_matmul_f32, dequantized into a scratch matrix that
 * a float32 GEMM then reads (the blocks stay the only copy kept). Returns 0, or 1 as above. */
int gguf_dequant_f32(const uint8_t *w, int type, int n, int k, float *out, int num_threads) {
    const int block_bytes = block_bytes_of(type);
    if (!block_bytes || k % 32) return 1;
    const int nb = k / 32;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int row = 0; row < n; row++) {
        const uint8_t *blocks = w + (size_t)row * nb * block_bytes;
        for (int b = 0; b < nb; b++) {
            v8 wv[4];
            __builtin_prefetch(blocks + (size_t)(b + PREFETCH_BLOCKS) * block_bytes, 0, 0);
            dequant_block(blocks + (size_t)b * block_bytes, type, wv);
            memcpy(out + (size_t)row * k + b * 32, wv, sizeof(wv));
        }
    }
    return 0;
}


/* ---- int8 activations (gguf_matmul_q8) ---------------------------------------------------
 * llama.cpp's way: each row of x is quantized per 32-value block to int8 with one float scale,
 *   d_x = max|x| / 127,  q_x = round(x / d_x) (x * (1 / d_x), rounded half to even),
 * and a weight block's dot with it is an integer dot product (one vpdpbusd, u8 x s8 -> i32 lanes),
 * scaled once per block in float:
 *   Q8_0: sum_j w_j x_j ~= d_w d_x (q_w . q_x)
 *   Q4_1: sum_j w_j x_j ~= d_w d_x (q_w . q_x) + m_w s_x,  s_x = d_x sum_j q_x,j
 * The weights are exact; the activations lose ~8 bits (relative error ~1e-3 on a layer's output,
 * the same as llama.cpp's Q8_1 activations). Q4_1's nibbles are unpacked into 32 u8 in weight
 * order (low nibbles are weights 0..15, high 16..31) once per block and used for all M rows. */

/* x [M, K] -> xq [M, K] int8, xd [M, K / 32] = d_x, xs [M, K / 32] = d_x * sum(q_x). */
static void quantize_x(const float *x, int m_rows, int k, int8_t *xq, float *xd, float *xs) {
    const int nb = k / 32;
    for (int r = 0; r < m_rows; r++)
        for (int b = 0; b < nb; b++) {
            const size_t at = (size_t)r * nb + b;
            const int sum = quantize_x_block(x + at * 32, xq + at * 32, &xd[at]);
            xs[at] = xd[at] * (float)sum;
        }
}

#if defined(__AVX2__) && defined(__FMA__)
/* Weight row `row` against x rows [r0, r0 + M), M a compile-time constant at each call site
 * (accumulators in registers, as in rows_dot). Q4_1 unpacks its block for all M rows at once;
 * Q8_0 moves the weight's sign onto x (u8 |q_w| x s8 sign(q_x, q_w)) per row. */
static inline __attribute__((always_inline)) void row_q8(
        const int8_t *xq, const float *xd, const float *xs, int k, const uint8_t *blocks, int type,
        int block_bytes, int n, float *y, int row, int r0, const int M) {
    const int nb = k / 32;
    __m256 acc[MAX_ROWS];
    float macc[MAX_ROWS];
    for (int i = 0; i < M; i++) acc[i] = _mm256_setzero_ps(), macc[i] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *bp = blocks + (size_t)b * block_bytes;
        PREFETCH_Q8(bp + (size_t)PREFETCH_BLOCKS_Q8 * block_bytes);
        const float dw = half_to_float(bp);
        if (type != Q8_0) {
            const float mw = block_min(bp, type);
            const __m256i wq = block_u8_256(bp, type);
            for (int i = 0; i < M; i++) {
                const size_t r = (size_t)(r0 + i);
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + r * k + b * 32));
                const __m256 dot = _mm256_cvtepi32_ps(dot_u8s8(wq, xv));
                acc[i] = _mm256_fmadd_ps(dot, _mm256_set1_ps(dw * xd[r * nb + b]), acc[i]);
                macc[i] += mw * xs[r * nb + b];
            }
        } else {
            const __m256i wq = _mm256_loadu_si256((const __m256i *)(bp + 2));
            const __m256i wabs = _mm256_abs_epi8(wq);
            for (int i = 0; i < M; i++) {
                const size_t r = (size_t)(r0 + i);
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + r * k + b * 32));
                const __m256 dot = _mm256_cvtepi32_ps(dot_u8s8(wabs, _mm256_sign_epi8(xv, wq)));
                acc[i] = _mm256_fmadd_ps(dot, _mm256_set1_ps(dw * xd[r * nb + b]), acc[i]);
            }
        }
    }
    for (int i = 0; i < M; i++) y[(size_t)(r0 + i) * n + row] = hsum256(acc[i]) + macc[i];
}

/* One row of x against weight rows 2 at a time (p0, p1: their first blocks): the x block and its
 * scales are loaded once for both, and the two accumulator chains overlap. Measured (2-core Xeon,
 * 2026-12-04, all the default model's matrices at 1 row): 5.3-5.6 -> 4.4-4.6 ms; 88 MB of Q4_1
 * at K = 576: 2.14 -> 1.79-1.93 ms, 50 MB of Q8_0: 1.31 -> 1.04 ms. */
static inline void two_rows_q8(const int8_t *xq, const float *xd, const float *xs, int k,
                               const uint8_t *p0, const uint8_t *p1, int type, int block_bytes,
                               float *y0, float *y1) {
    const int nb = k / 32;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float m0 = 0.0f, m1 = 0.0f;
    for (int b = 0; b < nb; b++, p0 += block_bytes, p1 += block_bytes) {
        PREFETCH_Q8(p0 + (size_t)PREFETCH_BLOCKS_Q8 * block_bytes);
        PREFETCH_Q8(p1 + (size_t)PREFETCH_BLOCKS_Q8 * block_bytes);
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + b * 32));
        const float dx = xd[b];
        __m256i d0, d1;
        if (type != Q8_0) {
            d0 = dot_u8s8(block_u8_256(p0, type), xv);
            d1 = dot_u8s8(block_u8_256(p1, type), xv);
            m0 += block_min(p0, type) * xs[b];
            m1 += block_min(p1, type) * xs[b];
        } else {
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(p0 + 2));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(p1 + 2));
            d0 = dot_u8s8(_mm256_abs_epi8(w0), _mm256_sign_epi8(xv, w0));
            d1 = dot_u8s8(_mm256_abs_epi8(w1), _mm256_sign_epi8(xv, w1));
        }
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_set1_ps(half_to_float(p0) * dx), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_set1_ps(half_to_float(p1) * dx), acc1);
    }
    *y0 = hsum256(acc0) + m0;
    *y1 = hsum256(acc1) + m1;
}
#define HAVE_TWO_ROWS 1
#else
/* Portable: the same sums, integer dot then one float scale per block. */
static inline __attribute__((always_inline)) void row_q8(
        const int8_t *xq, const float *xd, const float *xs, int k, const uint8_t *blocks, int type,
        int block_bytes, int n, float *y, int row, int r0, const int M) {
    const int nb = k / 32;
    for (int i = 0; i < M; i++) {
        const size_t r = (size_t)(r0 + i);
        float acc = 0.0f, macc = 0.0f;
        for (int b = 0; b < nb; b++) {
            const uint8_t *bp = blocks + (size_t)b * block_bytes;
            const int8_t *xp = xq + r * k + b * 32;
            int dot = 0;
            if (type != Q8_0) {
                const uint8_t *q = block_nibbles(bp, type);
                const uint32_t h = has_fifth_bits(type) ? fifth_bits(bp, type) : 0;
                for (int j = 0; j < 16; j++)
                    dot += ((q[j] & 0x0f) | ((h >> j) & 1) << 4) * xp[j]
                         + ((q[j] >> 4) | ((h >> (j + 16)) & 1) << 4) * xp[j + 16];
                macc += block_min(bp, type) * xs[r * nb + b];
            } else {
                for (int j = 0; j < 32; j++) dot += (int8_t)bp[2 + j] * xp[j];
            }
            acc += (float)dot * (half_to_float(bp) * xd[r * nb + b]);
        }
        y[r * n + row] = acc + macc;
    }
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* AVX-512: two blocks per instruction. Each x row's scales are spread beforehand over 16 lanes
 * per block pair, xd16 = [d_x(2p) x 8, d_x(2p + 1) x 8] (and xs16 = s_x / 8 likewise, so that the
 * 8 lanes of a block add up to m_w s_x), so a row costs dpbusd, cvt, mul, fma (+ fma for Q4_1)
 * per pair. K must be a multiple of 64. */
#define HAVE_PAIRS 1

static void spread_scales(const float *xd, const float *xs, int m_rows, int nb, float *xd16,
                          float *xs16) {
    for (size_t b = 0; b < (size_t)m_rows * nb; b++)  /* rows are whole pairs: nb is even */
        for (int j = 0; j < 8; j++) {
            xd16[(b / 2) * 16 + (b % 2) * 8 + j] = xd[b];
            xs16[(b / 2) * 16 + (b % 2) * 8 + j] = xs[b] * 0.125f;
        }
}

/* [a x 8, b x 8] */
static inline __m512 pair_ps(float a, float b) {
    return _mm512_mask_broadcastss_ps(_mm512_set1_ps(a), 0xff00, _mm_set_ss(b));
}

static inline __attribute__((always_inline)) void row_q8_pairs(
        const int8_t *xq, const float *xd16, const float *xs16, int k, const uint8_t *blocks,
        int type, int block_bytes, int n, float *y, int row, int r0, const int M, const int R) {
    /* R (1 or 2) weight rows from `row` on, their blocks consecutive: each x load serves R, and
     * m_w s_x goes into the same accumulator (fewer registers: 2 x 8 rows fit in 32 zmm).
     * Measured, 53 MB of Q4_1 at K = 576, ms, R = 1 -> 2: 2 rows 2.1 -> 1.5, 4 rows 2.5 -> 2.2,
     * 8 rows 4.3 -> 4.0, 16 and 32 rows the same. */
    const int np = k / 64;
    const size_t row_bytes = (size_t)np * 2 * block_bytes;
    __m512 acc[2][MAX_ROWS];
    for (int j = 0; j < R; j++)
        for (int i = 0; i < M; i++) acc[j][i] = _mm512_setzero_ps();
    for (int p = 0; p < np; p++) {
        __m512 dw[2], mw[2];
        __m512i wq[2];
        __mmask64 neg[2];
        for (int j = 0; j < R; j++) {
            const uint8_t *bp = blocks + j * row_bytes + (size_t)2 * p * block_bytes, *bq = bp + block_bytes;
            PREFETCH_Q8(bp + (size_t)PREFETCH_BLOCKS_Q8 * block_bytes);
            dw[j] = pair_ps(half_to_float(bp), half_to_float(bq));
            if (type != Q8_0) {
                mw[j] = pair_ps(block_min(bp, type), block_min(bq, type));
                wq[j] = _mm512_inserti64x4(_mm512_castsi256_si512(block_u8_256(bp, type)),
                                           block_u8_256(bq, type), 1);
            } else {
                PREFETCH_Q8(bp + (size_t)PREFETCH_BLOCKS_Q8 * block_bytes + 64); /* 68 B */
                const __m512i v = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(bp + 2))),
                    _mm256_loadu_si256((const __m256i *)(bq + 2)), 1);
                wq[j] = _mm512_abs_epi8(v);
                neg[j] = _mm512_movepi8_mask(v);
            }
        }
        for (int i = 0; i < M; i++) {
            const size_t r = (size_t)(r0 + i), at = (r * np + p) * 16;
            const __m512i xv = _mm512_loadu_si512(xq + r * k + p * 64);
            const __m512 xd = _mm512_loadu_ps(xd16 + at);
            for (int j = 0; j < R; j++) {
                const __m512i xs = type != Q8_0 ? xv /* sign(q_x, q_w) for Q8_0's |q_w|: */
                    : _mm512_mask_sub_epi8(xv, neg[j], _mm512_setzero_si512(), xv);
                const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[j], xs));
                acc[j][i] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw[j], xd), acc[j][i]);
                if (type != Q8_0) acc[j][i] = _mm512_fmadd_ps(mw[j], _mm512_loadu_ps(xs16 + at), acc[j][i]);
            }
        }
    }
    for (int j = 0; j < R; j++)
        for (int i = 0; i < M; i++)
            y[(size_t)(r0 + i) * n + row + j] = _mm512_reduce_add_ps(acc[j][i]);
}
#endif

/* Output rows [lo, hi) for all m_rows rows of x, in groups of up to MAX_ROWS: a weight row is
 * read from memory by the first group and from L1 by the rest. xd16, xs16: spread_scales' (NULL
 * without AVX-512 or where K is not a multiple of 64), for groups of 2+ rows. Measured on a 2-core
 * Xeon (2026-12-04), 88 MB of Q4_1 blocks, K = 576, ms per call: 1 row 3.6 (256-bit) vs 5.6
 * (pairs); 2 rows 5.1 vs 4.1; 4 rows 10.2 vs 8.5; 8 rows 16.2 vs 13.7 (Q8_0 alike). */
static void rows_q8(const int8_t *xq, const float *xd, const float *xs, const float *xd16,
                    const float *xs16, int m_rows, int k, const uint8_t *w, int type,
                    int block_bytes, int n, float *y, int lo, int hi) {
    const int nb = k / 32;
    int row = lo;
#ifdef HAVE_PAIRS
    if (xd16)  /* weight rows two at a time: each x load serves both */
        for (; row + 1 < hi; row += 2) {
            const uint8_t *blocks = w + (size_t)row * nb * block_bytes;
            for (int r0 = 0; r0 < m_rows; r0 += MAX_ROWS) {
                const int g = m_rows - r0 < MAX_ROWS ? m_rows - r0 : MAX_ROWS;
                switch (g) {
#define ROW_Q8(G) row_q8_pairs(xq, xd16, xs16, k, blocks, type, block_bytes, n, y, row, r0, G, 2); break
                case 1: ROW_Q8(1); case 2: ROW_Q8(2); case 3: ROW_Q8(3); case 4: ROW_Q8(4);
                case 5: ROW_Q8(5); case 6: ROW_Q8(6); case 7: ROW_Q8(7); default: ROW_Q8(8);
#undef ROW_Q8
                }
            }
        }
#endif
#ifdef HAVE_TWO_ROWS
    if (m_rows == 1)
        for (; row + 1 < hi; row += 2) {
            const uint8_t *p0 = w + (size_t)row * nb * block_bytes;
            two_rows_q8(xq, xd, xs, k, p0, p0 + (size_t)nb * block_bytes, type, block_bytes,
                        y + row, y + row + 1);
        }
#endif
    for (; row < hi; row++) {  /* the rest: one weight row at a time */
        const uint8_t *blocks = w + (size_t)row * nb * block_bytes;
        for (int r0 = 0; r0 < m_rows; r0 += MAX_ROWS) {
            const int g = m_rows - r0 < MAX_ROWS ? m_rows - r0 : MAX_ROWS;
#ifdef HAVE_PAIRS
            if (xd16) {
                switch (g) {
#define ROW_Q8(G) row_q8_pairs(xq, xd16, xs16, k, blocks, type, block_bytes, n, y, row, r0, G, 1); break
                case 1: ROW_Q8(1); case 2: ROW_Q8(2); case 3: ROW_Q8(3); case 4: ROW_Q8(4);
                case 5: ROW_Q8(5); case 6: ROW_Q8(6); case 7: ROW_Q8(7); default: ROW_Q8(8);
#undef ROW_Q8
                }
                continue;
            }
#endif
            switch (g) {
#define ROW_Q8(G) row_q8(xq, xd, xs, k, blocks, type, block_bytes, n, y, row, r0, G); break
            case 1: ROW_Q8(1); case 2: ROW_Q8(2); case 3: ROW_Q8(3); case 4: ROW_Q8(4);
            case 5: ROW_Q8(5); case 6: ROW_Q8(6); case 7: ROW_Q8(7); default: ROW_Q8(8);
#undef ROW_Q8
            }
        }
    }
}

/* y [M, N] = x [M, K] @ W^T through int8 activations (above); any M >= 1. Returns 0, 1 for an
 * unsupported type or K not a multiple of 32, 2 if the activations' scratch could not be had. */
int gguf_matmul_q8(const float *x, int m_rows, int k, const uint8_t *w, int type, int n, float *y,
                   int num_threads) {
    const int block_bytes = block_bytes_of(type);
    if (!block_bytes || k % 32 || m_rows < 1) return 1;
    const size_t nq = (size_t)m_rows * k, ns = (size_t)m_rows * (k / 32);
#ifdef HAVE_PAIRS
    const int pairs = k % 64 == 0 && m_rows > 1;
#else
    const int pairs = 0;
#endif
    /* xq | xd | xs (| xd16 | xs16) in one buffer; quantized once here, read by every thread */
    const size_t at = (nq + 63) & ~(size_t)63;
    uint8_t *scratch = aligned_alloc(64, (at + (pairs ? 18 : 2) * ns * sizeof(float) + 63) & ~(size_t)63);
    if (!scratch) return 2;
    int8_t *xq = (int8_t *)scratch;
    float *xd = (float *)(scratch + at), *xs = xd + ns;
    float *xd16 = pairs ? xs + ns : NULL, *xs16 = pairs ? xs + 9 * ns : NULL;
    quantize_x(x, m_rows, k, xq, xd, xs);
#ifdef HAVE_PAIRS
    if (pairs) spread_scales(xd, xs, m_rows, k / 32, xd16, xs16);
#endif
#pragma omp parallel num_threads(num_threads)
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int lo = (int)((long)n * t / nt), hi = (int)((long)n * (t + 1) / nt);
        rows_q8(xq, xd, xs, xd16, xs16, m_rows, k, w, type, block_bytes, n, y, lo, hi);
    }
    free(scratch);
    return 0;
}

/* Which gguf_matmul_q8 code this build runs (for logs and tests): 0 portable, 1 AVX2, 2 AVX-VNNI,
 * 3 AVX-512 VNNI (256-bit at one row, block pairs in 512-bit lanes for more). */
int gguf_q8_path(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    return 3;
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
    return 2;
#elif defined(__AVX2__)
    return 1;
#else
    return 0;
#endif
}
