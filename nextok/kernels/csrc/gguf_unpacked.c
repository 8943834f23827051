/* y = x @ W^T with W kept in GGUF K-quant super-blocks (Q4_K, Q5_K, Q6_K: the types of the
 * *_K_M files most GGUF users have), for the few rows of a decode step. The 32-weight formats
 * (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) are in gguf_matmul.c; this file follows its two kernels:
 *   gguf_kq_matmul_f32: float32 activations, weights dequantized exactly as the loader does (bit
 *     for bit), a row's result independent of the other rows (batch-invariant); M <= 8 per call.
 *   gguf_kq_matmul_q8: int8 activations per 32 values (as gguf_matmul_q8), integer dot products.
 *
 * Layouts: x [M, K] float32, y [M, N] float32, w [N, K / 256] super-blocks, row-major, each
 * holding 256 consecutive weights of one row:
 *   Q4_K (144 B): f16 d | f16 dmin | scales[12] | qs[128]
 *     8 sub-blocks of 32, each a 6-bit scale s and min m packed in scales[12]; qs's 32-byte chunk
 *     c holds sub-block 2c in its low nibbles and 2c + 1 in its high ones. w = d s q - dmin m.
 *   Q5_K (176 B): f16 d | f16 dmin | scales[12] | qh[32] | qs[128]: Q4_K's nibbles plus a fifth
 *     bit, bit j of qh[l] for weight l of sub-block j.
 *   Q6_K (210 B): ql[128] | qh[64] | int8 scales[16] | f16 d: 16 sub-blocks of 16, q in 0..63 from
 *     a nibble of ql and two bits of qh (see unpack_q6_k); w = d s (q - 32).
 * Each super-block is unpacked once per call into one common form, u8 q[256] and per 16 weights a
 * float scale and offset, w = sc q - mn (Q6_K: mn = 32 sc), used by every row of x. sc, mn and
 * sc q are exact in float32 (at most 24 significant bits), so w rounds once, at the subtraction,
 * as the loader's does.
 */
#include "gguf_common.h"

enum { Q4_K = 12, Q5_K = 13, Q6_K = 14 };

/* Bytes ahead to prefetch (as gguf_matmul_q8's 128 blocks of 20 bytes). */
#define PREFETCH_BYTES 2560

static inline int block_bytes(int type) {
    return type == Q4_K ? 144 : type == Q5_K ? 176 : type == Q6_K ? 210 : 0;
}

typedef struct {
    uint8_t q[256] __attribute__((aligned(32)));
    float sc[16], mn[16];  /* per 16 weights: w = sc * q - mn */
} unpacked;

/* Sub-block j's 6-bit scale and min from Q4_K / Q5_K's 12 bytes: bytes 0-3 hold scales 0-3 (top
 * bits: scales 4-7's high bits), bytes 4-7 mins 0-3 (likewise), bytes 8-11 low nibbles of 4-7. */
static inline void k_scale_min(const uint8_t *s, int j, float *sc, float *mn) {
    if (j < 4) {
        *sc = (float)(s[j] & 63), *mn = (float)(s[j + 4] & 63);
    } else {
        *sc = (float)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
        *mn = (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

static inline void unpack_q45_k(const uint8_t *b, int type, unpacked *u) {
    const float d = half_to_float(b), dmin = half_to_float(b + 2);
    for (int j = 0; j < 8; j++) {
        float s, m;
        k_scale_min(b + 4, j, &s, &m);
        u->sc[2 * j] = u->sc[2 * j + 1] = d * s;
        u->mn[2 * j] = u->mn[2 * j + 1] = dmin * m;
    }
    const uint8_t *qs = b + (type == Q4_K ? 16 : 48);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            u->q[64 * c + l] = qs[32 * c + l] & 0x0f;
            u->q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
        }
    if (type == Q5_K) {
        const uint8_t *qh = b + 16;
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 32; l++) u->q[32 * j + l] |= ((qh[l] >> j) & 1) << 4;
    }
}

/* Per 128-weight half h: ql[64 h ..] low nibbles are weights 0..63, high nibbles 64..127; qh[32 h
 * + l] gives weights l, l + 32, l + 64, l + 96 their top two bits at shifts 0, 2, 4, 6. */
static inline void unpack_q6_k(const uint8_t *b, unpacked *u) {
    const float d = half_to_float(b + 208);
    for (int i = 0; i < 16; i++) {
        u->sc[i] = d * (float)(int8_t)b[192 + i];
        u->mn[i] = 32.0f * u->sc[i];
    }
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        uint8_t *q = u->q + 128 * h;
        for (int l = 0; l < 32; l++) {
            q[l] = (ql[l] & 0x0f) | ((qh[l] & 3) << 4);
            q[l + 32] = (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4);
            q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
}

static inline void unpack(const uint8_t *b, int type, unpacked *u) {
    if (type == Q6_K) unpack_q6_k(b, u);
    else unpack_q45_k(b, type, u);
}

static inline void prefetch_ahead(const uint8_t *b, int bytes) {
    for (int o = 0; o < bytes; o += 64) __builtin_prefetch(b + PREFETCH_BYTES + o, 0, 1);
}

/* Weights 32 c .. 32 c + 31 of an unpacked super-block as float32, four 8-wide vectors (exactly
 * the loader's values): two 16-weight groups, each with its own scale and offset. */
static inline void chunk_f32(const unpacked *u, int c, v8 w[4]) {
    const v8 s0 = (v8){0} + u->sc[2 * c], m0 = (v8){0} + u->mn[2 * c];
    const v8 s1 = (v8){0} + u->sc[2 * c + 1], m1 = (v8){0} + u->mn[2 * c + 1];
    v8 q[4];
#if defined(__AVX2__)
    const __m128i lo = _mm_load_si128((const __m128i *)(u->q + 32 * c));
    const __m128i hi = _mm_load_si128((const __m128i *)(u->q + 32 * c + 16));
    const __m256 f[4] = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)))};
    memcpy(q, f, sizeof(q));
#else
    for (int j = 0; j < 32; j++) q[j / 8][j % 8] = (float)u->q[32 * c + j];
#endif
    w[0] = s0 * q[0] - m0;
    w[1] = s0 * q[1] - m0;
    w[2] = s1 * q[2] - m1;
    w[3] = s1 * q[3] - m1;
}

static inline v8 dot32(const float *xp, const v8 *w) {
    return (*(const v8 *)xp * w[0] + *(const v8 *)(xp + 8) * w[1])
         + (*(const v8 *)(xp + 16) * w[2] + *(const v8 *)(xp + 24) * w[3]);
}

/* Output rows [lo, hi) for M rows of x, M a compile-time constant at each call site (the
 * accumulators then live in registers). A row's sum runs in the same order whatever M is. */
static inline __attribute__((always_inline)) void rows_f32(
        const float *x, int k, const uint8_t *w, int type, int n, float *y, int lo, int hi,
        const int M) {
    const int bytes = block_bytes(type), nb = k / 256;
    for (int row = lo; row < hi; row++) {
        const uint8_t *blocks = w + (size_t)row * nb * bytes;
        v8 acc[MAX_ROWS];
        for (int i = 0; i < M; i++) acc[i] = (v8){0};
        for (int b = 0; b < nb; b++) {
            unpacked u;
            prefetch_ahead(blocks + (size_t)b * bytes, bytes);
            unpack(blocks + (size_t)b * bytes, type, &u);
            for (int c = 0; c < 8; c++) {
                v8 wv[4];
                chunk_f32(&u, c, wv);
                for (int i = 0; i < M; i++) acc[i] += dot32(x + (size_t)i * k + (size_t)b * 256 + 32 * c, wv);
            }
        }
        for (int i = 0; i < M; i++) y[(size_t)i * n + row] = hsum(acc[i]);
    }
}

/* 0 if the kernels take this type and K, else 1 */
static inline int refuse(int type, int k) { return !block_bytes(type) || k % 256; }

/* Returns 0, or 1 for an unsupported type, K not a multiple of 256, or M outside 1..8. */
int gguf_kq_matmul_f32(const float *x, int m_rows, int k, const uint8_t *w, int type, int n,
                       float *y, int num_threads) {
    if (refuse(type, k) || m_rows < 1 || m_rows > MAX_ROWS) return 1;
#pragma omp parallel num_threads(num_threads)
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int lo = (int)((long)n * t / nt), hi = (int)((long)n * (t + 1) / nt);
        switch (m_rows) {
#define ROWS(M) rows_f32(x, k, w, type, n, y, lo, hi, M); break
        case 1: ROWS(1); case 2: ROWS(2); case 3: ROWS(3); case 4: ROWS(4);
        case 5: ROWS(5); case 6: ROWS(6); case 7: ROWS(7); default: ROWS(8);
#undef ROWS
        }
    }
    return 0;
}

/* out [N, K] float32 = the weights, for steps too big for the kernels (then one float32 GEMM). */
int gguf_kq_dequant_f32(const uint8_t *w, int type, int n, int k, float *out, int num_threads) {
    if (refuse(type, k)) return 1;
    const int bytes = block_bytes(type), nb = k / 256;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int row = 0; row < n; row++)
        for (int b = 0; b < nb; b++) {
            unpacked u;
            v8 wv[32];
            unpack(w + ((size_t)row * nb + b) * bytes, type, &u);
            for (int c = 0; c < 8; c++) chunk_f32(&u, c, wv + 4 * c);
            memcpy(out + (size_t)row * k + (size_t)b * 256, wv, sizeof(wv));
        }
    return 0;
}

/* ---- int8 activations ----------------------------------------------------------------------
 * x is quantized per 32 values (d_x, q_x), as in gguf_matmul_q8, and per 16 values its sums
 * s_x = d_x sum(q_x) are kept for the offsets:
 *   sum_j w_j x_j ~= sum over 16-weight groups g of  sc_g d_x (q . q_x)_g - mn_g s_x,g
 * One 32-weight chunk is one u8 x s8 dot product whose lanes 0-3 hold group 2c, lanes 4-7 group
 * 2c + 1, so the two groups' scales apply per half of the vector. */

/* x [M, K] -> xq [M, K] int8, xd [M, K / 32] = d_x, xs [M, K / 16] = d_x * sum(q_x) per 16. */
static void quantize_x16(const float *x, int m_rows, int k, int8_t *xq, float *xd, float *xs) {
    const size_t nb = (size_t)m_rows * k / 32;
    for (size_t b = 0; b < nb; b++) {
        int8_t *qp = xq + b * 32;
        quantize_x_block(x + b * 32, qp, &xd[b]);
        int s0 = 0, s1 = 0;
        for (int j = 0; j < 16; j++) s0 += qp[j], s1 += qp[j + 16];
        xs[2 * b] = xd[b] * (float)s0;
        xs[2 * b + 1] = xd[b] * (float)s1;
    }
}

/* Weight row `row` (its blocks from `blocks`) against x rows [r0, r0 + M). */
static inline __attribute__((always_inline)) void row_q8(
        const int8_t *xq, const float *xd, const float *xs, int k, const uint8_t *blocks, int type,
        int n, float *y, int row, int r0, const int M) {
    const int bytes = block_bytes(type), nb = k / 256;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc[MAX_ROWS];
    for (int i = 0; i < M; i++) acc[i] = _mm256_setzero_ps();
#else
    float acc[MAX_ROWS];
    for (int i = 0; i < M; i++) acc[i] = 0.0f;
#endif
    float macc[MAX_ROWS];
    for (int i = 0; i < M; i++) macc[i] = 0.0f;
    for (int b = 0; b < nb; b++) {
        unpacked u;
        prefetch_ahead(blocks + (size_t)b * bytes, bytes);
        unpack(blocks + (size_t)b * bytes, type, &u);
        for (int i = 0; i < M; i++) {
            const size_t r = (size_t)(r0 + i), c0 = (r * k + (size_t)b * 256) / 32;  /* x's block */
            const int8_t *xp = xq + c0 * 32;
            float m = 0.0f;
            for (int g = 0; g < 16; g++) m += u.mn[g] * xs[2 * c0 + g];
            macc[i] += m;
            for (int c = 0; c < 8; c++) {
                const float dx = xd[c0 + c];
#if defined(__AVX2__) && defined(__FMA__)
                const __m256i wq = _mm256_load_si256((const __m256i *)(u.q + 32 * c));
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xp + 32 * c));
                const __m256 dot = _mm256_cvtepi32_ps(dot_u8s8(wq, xv));
                const __m256 scale = _mm256_set_m128(_mm_set1_ps(u.sc[2 * c + 1] * dx),
                                                     _mm_set1_ps(u.sc[2 * c] * dx));
                acc[i] = _mm256_fmadd_ps(dot, scale, acc[i]);
#else
                for (int h = 0; h < 2; h++) {
                    int dot = 0;
                    for (int j = 0; j < 16; j++) dot += u.q[32 * c + 16 * h + j] * xp[32 * c + 16 * h + j];
                    acc[i] += (float)dot * (u.sc[2 * c + h] * dx);
                }
#endif
            }
        }
    }
    for (int i = 0; i < M; i++) {
#if defined(__AVX2__) && defined(__FMA__)
        y[(size_t)(r0 + i) * n + row] = hsum256(acc[i]) - macc[i];
#else
        y[(size_t)(r0 + i) * n + row] = acc[i] - macc[i];
#endif
    }
}

/* y [M, N] = x [M, K] @ W^T through int8 activations; any M >= 1. Returns 0, 1 for an
 * unsupported type or K not a multiple of 256, 2 if the activations' scratch could not be
 * had. */
int gguf_kq_matmul_q8(const float *x, int m_rows, int k, const uint8_t *w, int type, int n, float *y,
                      int num_threads) {
    if (refuse(type, k) || m_rows < 1) return 1;
    const size_t nq = (size_t)m_rows * k, at = (nq + 63) & ~(size_t)63;
    uint8_t *scratch = aligned_alloc(64, (at + 3 * (nq / 32) * sizeof(float) + 63) & ~(size_t)63);
    if (!scratch) return 2;
    int8_t *xq = (int8_t *)scratch;
    float *xd = (float *)(scratch + at), *xs = xd + nq / 32;
    quantize_x16(x, m_rows, k, xq, xd, xs);
    const size_t row_bytes = (size_t)k / 256 * block_bytes(type);
#pragma omp parallel num_threads(num_threads)
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int lo = (int)((long)n * t / nt), hi = (int)((long)n * (t + 1) / nt);
        for (int row = lo; row < hi; row++)
            for (int r0 = 0; r0 < m_rows; r0 += MAX_ROWS) {
                const int g = m_rows - r0 < MAX_ROWS ? m_rows - r0 : MAX_ROWS;
                switch (g) {
#define ROW(M) row_q8(xq, xd, xs, k, w + row * row_bytes, type, n, y, row, r0, M); break
                case 1: ROW(1); case 2: ROW(2); case 3: ROW(3); case 4: ROW(4);
                case 5: ROW(5); case 6: ROW(6); case 7: ROW(7); default: ROW(8);
#undef ROW
                }
            }
    }
    free(scratch);
    return 0;
}
