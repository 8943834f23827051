/* GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q4_K, Q5_K, Q6_K) regrouped sixteen
 * weight rows at a time, and y = x @ W^T on them through int8 activations on AVX-512 VNNI (here) or
 * AVX2 (gguf_rows16_avx2.h, the same results bit for bit): the arithmetic of the row-at-a-time
 * int8 kernels (gguf_matmul.c, gguf_unpacked.c), at a cost that hardly grows with the rows of x.
 *
 * Why: gguf_matmul_q8 dots one weight row with one row of x at a time (per block and row: a
 * vpdpbusd, a convert, two FMAs; per output a horizontal sum), so 8 rows of x (a verify step of
 * speculative decoding, or 8 decoding sequences) cost 2.6x one row on the 2-core Xeon. Here one
 * vector holds 4 consecutive weights of each of 16 rows, and one vpdpbusd against 4 broadcast
 * bytes of x advances 16 outputs: per 16 outputs, block and row of x, 8 vpdpbusd, a convert, a
 * multiply and two FMAs, no horizontal sum. The regrouping is done once, at load: gathering 16
 * rows' blocks at run time (gathers, or loads and a transpose) read memory in 16 interleaved
 * streams and cost more than the arithmetic (7.3 ms for all the default model's matrices with
 * the arithmetic taken out, against 5.6 for gguf_matmul_q8 whole). The K-quants' row-at-a-time
 * kernel also unpacked every super-block on every call (all the Q4_K_M file's matrices at one
 * row, 2-core AVX2: 9.4 ms a row at a time, 6.4 regrouped).
 *
 * Layout of a regrouped matrix: groups of 16 rows (the last one padded with zero blocks), each
 * group's blocks in order; one group-block holds the 16 rows' source block b in the same bytes
 * (the K-quants' 12 bytes of 6-bit scales take 16 as bytes: Q4_K 148 B a row, Q5_K 180):
 * gguf_rows16_pack has the layouts. Within 32 weights of a row, weights are unsigned bytes of
 * 4 to 8 bits: a nibble byte t of word j holds weight 4j + t in its low half and 16 + 4j + t in
 * its high half, and the 5th (Q6_K: and 6th) bits come in a plane of one u32 a row, placed so
 * that each word's bits move into place with a shift and an and.
 *
 * Arithmetic: x quantized per 32 values, d_x = max|x| / 127, q_x = round(x / d_x); per 32 weights
 * of a row w = D q + M (D, M exact in float32; the K-quants: D = d sc, M = -dmin mn per sub-block):
 *   Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K: sum_j w_j x_j ~= D d_x (q_w . q_x) + M s_x,  s_x = d_x sum(q_x)
 *     (Q4_0: M = -8 D; Q5_0: M = -16 D)
 *   Q8_0: D d_x ((q_w + 128) . q_x - 128 sum(q_x))  (exact in integers)
 *   Q6_K: per 16 weights (its scales' span) D d_x ((q_w . q_x) - 32 sum(q_x))  (likewise)
 * The integer dot products are exact and each output's float sum runs over the blocks in order,
 * so a row's result does not depend on the other rows of x (batched == alone, speculation on ==
 * off) nor on the number of threads.
 *
 * Layouts: x [M, K] float32 (any M >= 1), y [M, N] float32.
 */
#include "gguf_common.h"

enum { Q4_K = 12, Q5_K = 13, Q6_K = 14 };

static inline int is_kquant(int type) { return type == Q4_K || type == Q5_K || type == Q6_K; }

/* Bytes of one source block: 32 weights, or a K-quant's 256-weight super-block. */
static inline int src_bytes(int type) {
    return type == Q4_K ? 144 : type == Q5_K ? 176 : type == Q6_K ? 210 : block_bytes_of(type);
}

/* A group-block (16 rows' source block b) is a head, then SUB parts of 32 weights a row:
 * rows16_sub 32-weight parts of rows16_part bytes after rows16_head bytes (0 for the
 * 32-weight types, whose part is the whole group-block). 0 bytes: a type this file does not take. */
static inline int rows16_sub(int type) { return is_kquant(type) ? 8 : 1; }
static inline int rows16_head(int type) { return type == Q4_K || type == Q5_K ? 320 : type == Q6_K ? 288 : 0; }
static inline int rows16_part(int type) {
    switch (type) {
    case Q4_0: return 288;  case Q4_1: return 320;  case Q5_0: return 352;  case Q5_1: return 384;
    case Q8_0: return 544;  case Q4_K: return 256;  case Q5_K: return 320;  case Q6_K: return 384;
    default: return 0;
    }
}
static inline int rows16_group_bytes(int type) {
    return rows16_part(type) ? rows16_head(type) + rows16_sub(type) * rows16_part(type) : 0;
}
/* offsets in a part: the nibble words, the fifth-bit plane (-1: none; Q6_K's sixth bits follow it) */
static inline int nib_at(int type) {
    switch (type) {
    case Q4_0: return 32;  case Q4_1: return 64;  case Q5_0: return 96;  case Q5_1: return 128;
    case Q5_K: return 64;  case Q6_K: return 128; default: return 0;  /* Q4_K */
    }
}
static inline int bits_at(int type) {
    return type == Q5_0 ? 32 : type == Q5_1 ? 64 : type == Q5_K || type == Q6_K ? 0 : -1;
}

/* Sub-block j's 6-bit scale and min of Q4_K / Q5_K's 12 bytes (as gguf_unpacked.c). */
static inline void k_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = s[j] & 63, *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Part u's 32 unsigned weights (4, 5 or 6 bits) of one source block, in order. */
static void source_q(const uint8_t *blk, int type, int u, uint8_t q[32]) {
    if (type == Q6_K) {  /* per 128-weight half: ql nibbles and two bits of qh (gguf_unpacked.c) */
        const int h = u / 4, c = u % 4;  /* weights 128 h + 32 c + l */
        const uint8_t *ql = blk + 64 * h + (c & 1) * 32, *qh = blk + 128 + 32 * h;
        for (int l = 0; l < 32; l++)
            q[l] = ((ql[l] >> (4 * (c >> 1))) & 15) | (((qh[l] >> (2 * c)) & 3) << 4);
        return;
    }
    if (is_kquant(type)) {  /* chunk u / 2 of qs: sub-block u in its low (u even) or high nibbles */
        const uint8_t *qs = blk + (type == Q4_K ? 16 : 48) + 32 * (u / 2);
        for (int l = 0; l < 32; l++) {
            q[l] = (qs[l] >> (4 * (u & 1))) & 15;
            if (type == Q5_K) q[l] |= ((blk[16 + l] >> u) & 1) << 4;
        }
        return;
    }
    if (type == Q8_0) {
        for (int l = 0; l < 32; l++) q[l] = (uint8_t)(blk[2 + l] ^ 0x80);  /* q + 128 */
        return;
    }
    const uint8_t *qs = blk + (type == Q4_0 ? 2 : type == Q4_1 ? 4 : type == Q5_0 ? 6 : 8);
    uint32_t qh = 0;
    if (type == Q5_0 || type == Q5_1) memcpy(&qh, blk + (type == Q5_0 ? 2 : 4), 4);
    for (int l = 0; l < 16; l++) {
        q[l] = (qs[l] & 15) | (((qh >> l) & 1) << 4);
        q[l + 16] = (qs[l] >> 4) | (((qh >> (l + 16)) & 1) << 4);
    }
}

/* Row i's 32 weights q into part pb: nibble byte t of word j holds weight 4j + t (low) and
 * 16 + 4j + t (high); bit plane word, bit 8t + c: bit 4 (Q6_K's second plane: bit 5) of weight
 * 4c + t (c < 4) or 16 + 4(c - 4) + t, so the kernels move a vector's bits into place with one
 * shift and one and. Q8_0: words of 4 whole bytes, q + 128. */
static void emit_part(uint8_t *pb, int type, int i, const uint8_t q[32]) {
    if (type == Q8_0) {
        for (int j = 0; j < 8; j++) memcpy(pb + 32 + ((size_t)j * 16 + i) * 4, q + 4 * j, 4);
        return;
    }
    for (int j = 0; j < 4; j++)
        for (int t = 0; t < 4; t++)
            pb[nib_at(type) + (j * 16 + i) * 4 + t] = (q[4 * j + t] & 15) | ((q[16 + 4 * j + t] & 15) << 4);
    for (int plane = 0; plane < (type == Q6_K ? 2 : 1) && bits_at(type) >= 0; plane++) {
        uint32_t word = 0;
        for (int c = 0; c < 8; c++)
            for (int t = 0; t < 4; t++)
                word |= (uint32_t)((q[(c < 4 ? 4 * c : 16 + 4 * (c - 4)) + t] >> (4 + plane)) & 1) << (8 * t + c);
        memcpy(pb + bits_at(type) + 64 * plane + 4 * i, &word, 4);
    }
}

/* Bytes of a regrouped [n, k] matrix (ceil(n / 16) groups of 16 rows), or 0 for a type this
 * file does not take or k not a whole number of source blocks. */
long gguf_rows16_packed_bytes(int type, int n, int k) {
    const int per = 32 * rows16_sub(type);
    if (!rows16_part(type) || n < 1 || k < per || k % per) return 0;
    return (long)((n + 15) / 16) * (k / per) * rows16_group_bytes(type);
}

/* w [N, K / per block] source blocks -> out, regrouped: gguf_rows16_packed_bytes bytes.
 * Group-block (16 rows, source block b):
 *   Q4_0 part (288 B): f16 [16] d; u32 [4][16] nibbles
 *   Q4_1 (320 B): u32 [16] d | m << 16; nibbles;   Q5_0 (352): d; u32 [16] fifth bits; nibbles
 *   Q5_1 (384 B): d | m << 16; fifth bits; nibbles;  Q8_0 (544): d; u32 [8][16] q + 128
 *   Q4_K, Q5_K: head (320 B) f16 [16] d | f16 [16] dmin | u8 [8][16] scales | u8 [8][16] mins,
 *     then 8 parts: Q4_K (256 B) nibbles; Q5_K (320 B) fifth bits, nibbles
 *   Q6_K: head (288 B) f16 [16] d | i8 [16][16] scales (per 16 weights), then 8 parts (384 B):
 *     fifth bits, sixth bits, nibbles
 * Returns 0, or 1 for an unsupported type or shape. */
int gguf_rows16_pack(const uint8_t *w, int type, int n, int k, uint8_t *out) {
    const long total = gguf_rows16_packed_bytes(type, n, k);
    if (!total) return 1;
    const int sub = rows16_sub(type), head = rows16_head(type), part = rows16_part(type);
    const int nb = k / (32 * sub), ng = (n + 15) / 16, gbytes = rows16_group_bytes(type), sb = src_bytes(type);
    /* groups in parallel (each writes only its own bytes): one thread regrouped ~0.3 G weights/s,
     * some 20 s of a 7B model's load */
#pragma omp parallel for schedule(dynamic, 16)
    for (int g = 0; g < ng; g++)
        for (int b = 0; b < nb; b++) {
            uint8_t *o = out + ((size_t)g * nb + b) * gbytes;
            memset(o, 0, (size_t)gbytes);
            for (int i = 0; i < 16 && g * 16 + i < n; i++) {
                const uint8_t *blk = w + ((size_t)(g * 16 + i) * nb + b) * sb;
                if (type == Q4_K || type == Q5_K) {
                    memcpy(o + 2 * i, blk, 2), memcpy(o + 32 + 2 * i, blk + 2, 2);
                    for (int j = 0; j < 8; j++) k_scale_min(blk + 4, j, o + 64 + 16 * j + i, o + 192 + 16 * j + i);
                } else if (type == Q6_K) {
                    memcpy(o + 2 * i, blk + 208, 2);
                    for (int j = 0; j < 16; j++) o[32 + 16 * j + i] = blk[192 + j];
                } else if (type == Q4_1 || type == Q5_1) {
                    memcpy(o + 4 * i, blk, 4);  /* d, m */
                } else {
                    memcpy(o + 2 * i, blk, 2);  /* d */
                }
                for (int u = 0; u < sub; u++) {
                    uint8_t q[32];
                    source_q(blk, type, u, q);
                    emit_part(o + head + u * part, type, i, q);
                }
            }
        }
    return 0;
}

/* Part u's D and M for row i (w = D q + M, exact: D q and M are exact in float32, so the one
 * rounding is the sum's, as the loader's d * q - m). Q6_K: D, M of its first 16 weights,
 * D2, M2 of the other 16. */
static void part_scales(const uint8_t *o, int type, int u, int i, float *D, float *M, float *D2, float *M2) {
    const uint8_t *pb = o + rows16_head(type) + u * rows16_part(type);
    if (type == Q4_K || type == Q5_K) {
        *D = half_to_float(o + 2 * i) * (float)o[64 + 16 * u + i];
        *M = -(half_to_float(o + 32 + 2 * i) * (float)o[192 + 16 * u + i]);
    } else if (type == Q6_K) {
        *D = half_to_float(o + 2 * i) * (float)(int8_t)o[32 + 16 * (2 * u) + i];
        *D2 = half_to_float(o + 2 * i) * (float)(int8_t)o[32 + 16 * (2 * u + 1) + i];
        *M = -32.0f * *D, *M2 = -32.0f * *D2;
        return;
    } else if (type == Q4_1 || type == Q5_1) {
        *D = half_to_float(pb + 4 * i), *M = half_to_float(pb + 4 * i + 2);
    } else {
        *D = half_to_float(pb + 2 * i);
        *M = type == Q4_0 ? -8.0f * *D : type == Q5_0 ? -16.0f * *D : 0.0f;
    }
    *D2 = *D, *M2 = *M;
}

/* The float32 weights [N, K] of a regrouped matrix, the same values as the loader's
 * dequantization. Returns 0, or 1 as above. */
int gguf_rows16_dequant_f32(const uint8_t *p, int type, int n, int k, float *out, int num_threads) {
    if (!gguf_rows16_packed_bytes(type, n, k)) return 1;
    const int sub = rows16_sub(type), part = rows16_part(type), head = rows16_head(type);
    const int nb = k / (32 * sub), gbytes = rows16_group_bytes(type);
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int row = 0; row < n; row++) {
        const int g = row / 16, i = row % 16;
        for (int b = 0; b < nb; b++) {
            const uint8_t *o = p + ((size_t)g * nb + b) * gbytes;
            for (int u = 0; u < sub; u++) {
                const uint8_t *pb = o + head + u * part;
                float *dst = out + (size_t)row * k + (b * sub + u) * 32;
                if (type == Q8_0) {
                    const float d = half_to_float(pb + 2 * i);
                    for (int j = 0; j < 8; j++)
                        for (int t = 0; t < 4; t++)
                            dst[4 * j + t] = d * (float)(int8_t)(pb[32 + (j * 16 + i) * 4 + t] ^ 0x80);
                    continue;
                }
                float D, M, D2, M2;
                part_scales(o, type, u, i, &D, &M, &D2, &M2);
                uint32_t h0 = 0, h1 = 0;
                if (bits_at(type) >= 0) memcpy(&h0, pb + bits_at(type) + 4 * i, 4);
                if (type == Q6_K) memcpy(&h1, pb + 64 + 4 * i, 4);
                for (int j = 0; j < 4; j++)
                    for (int t = 0; t < 4; t++) {
                        const uint8_t byte = pb[nib_at(type) + (j * 16 + i) * 4 + t];
                        const int lo = (byte & 15) | (((h0 >> (8 * t + j)) & 1) << 4) | (((h1 >> (8 * t + j)) & 1) << 5);
                        const int hi = (byte >> 4) | (((h0 >> (8 * t + 4 + j)) & 1) << 4) | (((h1 >> (8 * t + 4 + j)) & 1) << 5);
                        dst[4 * j + t] = fmaf(D, (float)lo, M);
                        dst[16 + 4 * j + t] = fmaf(D2, (float)hi, M2);
                    }
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
 * constant at each call site; outputs past N are not stored. sqa: per x block, the sum of its
 * first 16 q (Q6_K's scales change every 16 weights). */
static inline __attribute__((always_inline)) void group16(
        const int8_t *xq, const float *xd, const float *xs, const int *sq, const int *sqa, int k,
        const uint8_t *p, const int type, int n, void *y, int y_bf16, int g, int r0, const int M) {
    const int sub = rows16_sub(type), head = rows16_head(type), part = rows16_part(type);
    const int gbytes = rows16_group_bytes(type), nb = k / 32, nsb = nb / sub;
    const int n0 = g * 16, rows = n - n0 < 16 ? n - n0 : 16;
    const __m512i low4 = _mm512_set1_epi32(0x0f0f0f0f), bit4 = _mm512_set1_epi32(0x10101010);
    const __m512i bit5 = _mm512_set1_epi32(0x20202020);
    __m512 acc[ROWS_PER_PASS];
    for (int r = 0; r < M; r++) acc[r] = _mm512_setzero_ps();
    const uint8_t *gb = p + (size_t)g * nsb * gbytes;
    for (int s = 0; s < nsb; s++, gb += gbytes) {
        /* every line of the group-block PREFETCH_BYTES ahead, kept in the caches (prefetcht2):
         * all the default model's Q4_1 matrices at 1 row 2.7 -> 2.0 ms against two lines 1 KB
         * ahead non-temporally (2 KB ahead: 3.3; 16 KB: the same as 8) */
        for (int e = 0; e < gbytes; e += 64) __builtin_prefetch(gb + PREFETCH_BYTES + e, 0, 1);
        __m512 kd = _mm512_setzero_ps(), kdmin = _mm512_setzero_ps();  /* a K-quant's d, dmin */
        if (is_kquant(type)) kd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
        if (type == Q4_K || type == Q5_K) kdmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 32)));
        for (int u = 0; u < sub; u++) {
            const uint8_t *pb = gb + head + u * part;
            const int b = s * sub + u;  /* x's 32-value block */
            __m512 d, m = _mm512_setzero_ps(), d2 = _mm512_setzero_ps();
#define U8S(at) _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(at))))
#define I8S(at) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(at))))
            if (type == Q4_1 || type == Q5_1) {
                const __m512i dm = _mm512_loadu_si512(pb);
                d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
                m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
            } else if (type == Q4_K || type == Q5_K) {  /* D = d sc, M = -(dmin mn): exact */
                d = _mm512_mul_ps(kd, U8S(gb + 64 + 16 * u));
                m = _mm512_mul_ps(_mm512_mul_ps(kdmin, U8S(gb + 192 + 16 * u)), _mm512_set1_ps(-1.0f));
            } else if (type == Q6_K) {  /* D of weights 0..15 and of 16..31 */
                d = _mm512_mul_ps(kd, I8S(gb + 32 + 32 * u));
                d2 = _mm512_mul_ps(kd, I8S(gb + 48 + 32 * u));
            } else {
                d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pb));
                if (type == Q4_0) m = _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));  /* exact */
                if (type == Q5_0) m = _mm512_mul_ps(d, _mm512_set1_ps(-16.0f));
            }
#undef U8S
#undef I8S
            __m512i wq[8];  /* wq[j], lane i: row i's weights 4j .. 4j + 3 (j >= 4: 16 + 4(j - 4) ..) */
            if (type == Q8_0) {
                for (int j = 0; j < 8; j++) wq[j] = _mm512_loadu_si512(pb + 32 + 64 * j);
            } else {
                const int at = nib_at(type), hb = bits_at(type);
                const __m512i h0 = hb >= 0 ? _mm512_loadu_si512(pb + hb) : _mm512_setzero_si512();
                const __m512i h1 = type == Q6_K ? _mm512_loadu_si512(pb + 64) : _mm512_setzero_si512();
                for (int j = 0; j < 4; j++) {
                    const __m512i v = _mm512_loadu_si512(pb + at + 64 * j);
                    wq[j] = _mm512_and_si512(v, low4);
                    wq[j + 4] = _mm512_and_si512(_mm512_srli_epi32(v, 4), low4);
                    if (hb >= 0) {  /* bit 8t + j of the plane -> bit 4 of byte t; 8t + 4 + j likewise */
                        wq[j] = _mm512_or_si512(wq[j], _mm512_and_si512(_mm512_slli_epi32(h0, 4 - j), bit4));
                        wq[j + 4] = _mm512_or_si512(wq[j + 4], _mm512_and_si512(_mm512_srli_epi32(h0, j), bit4));
                    }
                    if (type == Q6_K) {  /* the sixth bits -> bit 5 */
                        wq[j] = _mm512_or_si512(wq[j], _mm512_and_si512(_mm512_slli_epi32(h1, 5 - j), bit5));
                        wq[j + 4] = _mm512_or_si512(wq[j + 4], _mm512_and_si512(
                            j ? _mm512_srli_epi32(h1, j - 1) : _mm512_slli_epi32(h1, 1), bit5));
                    }
                }
            }
            for (int r = 0; r < M; r++) {
                const size_t at = (size_t)(r0 + r) * nb + b;
                const int8_t *xr = xq + at * 32;
                /* 4 bytes of x broadcast straight from memory (a load; gcc had moved them through a
                 * general register and broadcast that, a shuffle-port op per vpdpbusd); two chains
                 * (Q6_K: weights 0..15 and 16..31; else even and odd groups of 4) */
#define XB(j) _mm512_broadcastd_epi32(_mm_loadu_si32(xr + 4 * (j)))
                __m512i s0, s1;
                if (type == Q6_K) {
                    s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[0], XB(0));
                    s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[4], XB(4));
                    for (int j = 1; j < 4; j++) {
                        s0 = _mm512_dpbusd_epi32(s0, wq[j], XB(j));
                        s1 = _mm512_dpbusd_epi32(s1, wq[j + 4], XB(j + 4));
                    }
                } else {
                    s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[0], XB(0));
                    s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[1], XB(1));
                    for (int j = 2; j < 8; j += 2) {
                        s0 = _mm512_dpbusd_epi32(s0, wq[j], XB(j));
                        s1 = _mm512_dpbusd_epi32(s1, wq[j + 1], XB(j + 1));
                    }
                }
#undef XB
                const __m512 dx = _mm512_set1_ps(xd[at]);
                if (type == Q6_K) {  /* sum (q - 32) x per 16 weights, exact in integers */
                    s0 = _mm512_sub_epi32(s0, _mm512_set1_epi32(32 * sqa[at]));
                    s1 = _mm512_sub_epi32(s1, _mm512_set1_epi32(32 * (sq[at] - sqa[at])));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(d, dx), acc[r]);
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(d2, dx), acc[r]);
                    continue;
                }
                __m512i sum = _mm512_add_epi32(s0, s1);
                if (type == Q8_0) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(128 * sq[at]));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, dx), acc[r]);
                if (type != Q8_0) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[at]), acc[r]);
            }
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
        const int8_t *xq, const float *xd, const float *xs, const int *sq, const int *sqa, int m_rows,
        int k, const uint8_t *p, const int type, int n, void *y, int y_bf16, int g0, int g1) {
    for (int g = g0; g < g1; g++)
        for (int r0 = 0; r0 < m_rows; r0 += ROWS_PER_PASS) {
            const int M = m_rows - r0 < ROWS_PER_PASS ? m_rows - r0 : ROWS_PER_PASS;
            switch (M) {
#define G16(MM) group16(xq, xd, xs, sq, sqa, k, p, type, n, y, y_bf16, g, r0, MM); break
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
    if (!gguf_rows16_packed_bytes(type, n, k) || m_rows < 1) return 1;
    const int nb = k / 32;
    const size_t nq = (size_t)m_rows * k, ns = (size_t)m_rows * nb;
    /* xq | xd | xs | sq | sqa, quantized once here and read by every thread */
    const size_t at = (nq + 63) & ~(size_t)63;
    uint8_t *scratch = aligned_alloc(64, (at + 4 * ns * sizeof(float) + 63) & ~(size_t)63);
    if (!scratch) return 2;
    int8_t *xq = (int8_t *)scratch;
    float *xd = (float *)(scratch + at), *xs = xd + ns;
    int *sq = (int *)(xs + ns), *sqa = sq + ns;
    const int ng = (n + 15) / 16;
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (size_t i = 0; i < ns; i++) {
            const void *xb = x_bf16 ? (const void *)((const uint16_t *)x + i * 32) : (const void *)((const float *)x + i * 32);
            sq[i] = quantize_block(xb, x_bf16, xq + i * 32, &xd[i]);
            xs[i] = xd[i] * (float)sq[i];
            if (type == Q6_K) {  /* the only type whose scales change within 32 weights */
                int first = 0;
                for (int j = 0; j < 16; j++) first += xq[i * 32 + j];
                sqa[i] = first;
            }
        }  /* (the loop's barrier: every block quantized before any group reads it) */
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int g0 = (int)((long)ng * t / nt), g1 = (int)((long)ng * (t + 1) / nt);
        switch (type) {  /* one copy of the kernel per type, its branches resolved */
#define TYPED(T) case T: groups_typed(xq, xd, xs, sq, sqa, m_rows, k, p, T, n, y, y_bf16, g0, g1); break
        TYPED(Q4_0); TYPED(Q4_1); TYPED(Q5_0); TYPED(Q5_1); TYPED(Q8_0); TYPED(Q4_K); TYPED(Q5_K); TYPED(Q6_K);
#undef TYPED
        }
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
