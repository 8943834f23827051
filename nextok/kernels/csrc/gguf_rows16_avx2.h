/* gguf_rows16.c's kernel on AVX2 (no VNNI): the same regrouped blocks, the same results bit for
 * bit (exact integer dots, then the same float operations per output in the same order).
 *
 * Why: gguf_matmul_q8 on AVX2 dots one weight row at a time: per block and row a nibble unpack, a
 * vpmaddubsw, a vpmaddwd, a convert, two scalar half conversions, a broadcast and two FMAs, then a
 * horizontal sum per output. On the 2-core AMD EPYC (AVX2 only) it ran at ~8 G weights/s per core
 * in cache, compute bound, far under the memory's ~30 GB/s. Here one vpmaddubsw against 4
 * broadcast bytes of x advances 8 rows, and 8 of them (32 weights per row) add up in 16 bits
 * before one vpmaddwd widens them:
 *   4-bit weights (Q4_0, Q4_1, Q4_K), x in [-127, 127]: a pair <= 2 * 15 * 127 = 3810, 8 pairs <= 30480;
 *   5-bit (Q5_0, Q5_1, Q5_K): the block's first and last 16 weights in two sums, 4 pairs <= 31496 each;
 *   Q6_K (6 bits): per 16 weights (its scales' span) two sums of 2 pairs <= 32004;
 *   Q8_0: each q + 128 split into its high and low nibble (q + 128 = 16 h + l), two such sums.
 * A group of 16 rows runs as two halves of 8 (an AVX2 register holds 8 outputs): half 0 streams
 * the group's blocks from memory, half 1 reads them again from L1/L2 (a group is nb * 320 bytes
 * for Q4_1: 5.6 KB at K = 576, 15 KB at K = 1536).
 * Included by gguf_rows16.c (the layout helpers, ROWS_PER_PASS, PREFETCH_BYTES come from there). */
#include <immintrin.h>

/* quantize_x_block (gguf_common.h) on 8-wide registers, the same results: d = max|x| / 127,
 * q = x * (1 / d) rounded half to even (vcvtps2dq in the default rounding mode, as nearbyintf).
 * x: 32 float32, or 32 bfloat16 (raw bits) widened exactly. Returns sum(q). */
static inline int quantize_block(const void *x, int bf16, int8_t *qp, float *d_out) {
    __m256 v[4];
    for (int i = 0; i < 4; i++)
        v[i] = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(
                          _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)x + 8 * i))), 16))
                    : _mm256_loadu_ps((const float *)x + 8 * i);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                                    _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    __m256i q[4];
    for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
    /* |q| <= 127: the packs do not saturate. Per 128-bit lane they leave 4-value runs of q[0],
     * q[1], q[2], q[3] (lane 0 their first halves, lane 1 their second); the permute puts the
     * runs back in order. */
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)qp, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    *d_out = d;
    return _mm_cvtsi128_si32(s4);
}

/* 8 outputs -> y (float32, or bfloat16 rounded to nearest even as torch's .to(bfloat16)); only
 * the first `live` are stored (the last group's padding rows are not). */
static inline void store8(__m256 acc, void *y, int y_bf16, size_t at, int live) {
    if (!y_bf16) {
        if (live == 8) { _mm256_storeu_ps((float *)y + at, acc); return; }
        float tmp[8];
        _mm256_storeu_ps(tmp, acc);
        memcpy((float *)y + at, tmp, (size_t)live * sizeof(float));
        return;
    }
    const __m256i u = _mm256_castps_si256(acc);
    const __m256i rne = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                         _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
    const __m256i hi = _mm256_srli_epi32(rne, 16);  /* < 65536: packus keeps it */
    const __m128i h8 = _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
    uint16_t tmp[8];
    _mm_storeu_si128((__m128i *)tmp, h8);
    memcpy((uint16_t *)y + at, tmp, (size_t)live * sizeof(uint16_t));
}

/* Group g (16 weight rows) against x rows [r0, r0 + M), M <= ROWS_PER_PASS a compile-time
 * constant at each call site; outputs past N are not stored. sqa: per x block, the sum of its
 * first 16 q (for Q6_K). */
static inline __attribute__((always_inline)) void group16(
        const int8_t *xq, const float *xd, const float *xs, const int *sq, const int *sqa, int k,
        const uint8_t *p, const int type, int n, void *y, int y_bf16, int g, int r0, const int M) {
    const int sub = rows16_sub(type), head = rows16_head(type), part = rows16_part(type);
    const int gbytes = rows16_group_bytes(type), nb = k / 32, nsb = nb / sub;
    const int n0 = g * 16, rows = n - n0 < 16 ? n - n0 : 16;
    const int nib = nib_at(type), hb = bits_at(type);
    const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i bit4 = _mm256_set1_epi8(0x10), bit5 = _mm256_set1_epi8(0x20);
    const uint8_t *group = p + (size_t)g * nsb * gbytes;
    for (int h = 0; h < 2 && 8 * h < rows; h++) {
        __m256 acc[ROWS_PER_PASS];
        for (int r = 0; r < M; r++) acc[r] = _mm256_setzero_ps();
        const uint8_t *gb = group;
        for (int s = 0; s < nsb; s++, gb += gbytes) {
            if (h == 0)  /* as the AVX-512 kernel: every line PREFETCH_BYTES ahead, kept cached */
                for (int e = 0; e < gbytes; e += 64) __builtin_prefetch(gb + PREFETCH_BYTES + e, 0, 1);
            __m256 kd = _mm256_setzero_ps(), kdmin = _mm256_setzero_ps();  /* a K-quant's d, dmin */
            if (is_kquant(type)) kd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16 * h)));
            if (type == Q4_K || type == Q5_K)
                kdmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 32 + 16 * h)));
            for (int u = 0; u < sub; u++) {
                const uint8_t *pb = gb + head + u * part;
                const int b = s * sub + u;  /* x's 32-value block */
                __m256 d, m = _mm256_setzero_ps(), d2 = _mm256_setzero_ps();
#define U8S(at) _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(at))))
#define I8S(at) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(at))))
                if (type == Q4_1 || type == Q5_1) {  /* u32 [16] d | m << 16: rows 8h .. 8h + 7 */
                    const __m128i a = _mm_loadu_si128((const __m128i *)(pb + 32 * h));
                    const __m128i c = _mm_loadu_si128((const __m128i *)(pb + 32 * h + 16));
                    const __m128i lo16 = _mm_set1_epi32(0xffff);
                    d = _mm256_cvtph_ps(_mm_packus_epi32(_mm_and_si128(a, lo16), _mm_and_si128(c, lo16)));
                    m = _mm256_cvtph_ps(_mm_packus_epi32(_mm_srli_epi32(a, 16), _mm_srli_epi32(c, 16)));
                } else if (type == Q4_K || type == Q5_K) {  /* D = d sc, M = -(dmin mn): exact */
                    d = _mm256_mul_ps(kd, U8S(gb + 64 + 16 * u + 8 * h));
                    m = _mm256_mul_ps(_mm256_mul_ps(kdmin, U8S(gb + 192 + 16 * u + 8 * h)), _mm256_set1_ps(-1.0f));
                } else if (type == Q6_K) {  /* D of weights 0..15 and of 16..31 */
                    d = _mm256_mul_ps(kd, I8S(gb + 32 + 32 * u + 8 * h));
                    d2 = _mm256_mul_ps(kd, I8S(gb + 48 + 32 * u + 8 * h));
                } else {
                    d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pb + 16 * h)));
                    if (type == Q4_0) m = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));  /* exact */
                    if (type == Q5_0) m = _mm256_mul_ps(d, _mm256_set1_ps(-16.0f));
                }
#undef U8S
#undef I8S
                /* 4 bytes of x (row r, weights 4j .. 4j + 3) in every 32-bit lane */
#define XB(r, j) _mm256_set1_epi32(*(const int32_t *)(xq + ((size_t)(r0 + (r)) * nb + b) * 32 + 4 * (j)))
                __m256i sv[ROWS_PER_PASS], s2[ROWS_PER_PASS];  /* i32: row r of x . the 8 weight rows */
                if (type == Q8_0) {
                    __m256i sl[ROWS_PER_PASS], sh[ROWS_PER_PASS];  /* i16 sums of the low, high nibbles */
                    for (int r = 0; r < M; r++) sl[r] = sh[r] = _mm256_setzero_si256();
                    for (int j = 0; j < 8; j++) {
                        const __m256i v = _mm256_loadu_si256((const __m256i *)(pb + 32 + 64 * j + 32 * h));
                        const __m256i wl = _mm256_and_si256(v, low4);
                        const __m256i wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                        for (int r = 0; r < M; r++) {
                            const __m256i xb = XB(r, j);
                            sl[r] = _mm256_add_epi16(sl[r], _mm256_maddubs_epi16(wl, xb));
                            sh[r] = _mm256_add_epi16(sh[r], _mm256_maddubs_epi16(wh, xb));
                        }
                    }
                    for (int r = 0; r < M; r++) {
                        const int at = (r0 + r) * nb + b;
                        sv[r] = _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(sh[r], ones), 4),
                                                 _mm256_madd_epi16(sl[r], ones));
                        sv[r] = _mm256_sub_epi32(sv[r], _mm256_set1_epi32(128 * sq[at]));
                    }
                } else if (type == Q6_K) {
                    /* 6-bit weights: a pair of products <= 2 * 63 * 127, two pairs fit in i16 */
                    __m256i wq[8];
                    const __m256i h0 = _mm256_loadu_si256((const __m256i *)(pb + 32 * h));
                    const __m256i h1 = _mm256_loadu_si256((const __m256i *)(pb + 64 + 32 * h));
                    for (int j = 0; j < 4; j++) {
                        const __m256i v = _mm256_loadu_si256((const __m256i *)(pb + nib + 64 * j + 32 * h));
                        wq[j] = _mm256_or_si256(_mm256_and_si256(v, low4), _mm256_or_si256(
                            _mm256_and_si256(_mm256_slli_epi32(h0, 4 - j), bit4),
                            _mm256_and_si256(_mm256_slli_epi32(h1, 5 - j), bit5)));
                        wq[j + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi32(h0, j), bit4),
                            _mm256_and_si256(j ? _mm256_srli_epi32(h1, j - 1) : _mm256_slli_epi32(h1, 1), bit5)));
                    }
                    for (int r = 0; r < M; r++) {
#define PAIR(a, c) _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(wq[a], XB(r, a)), \
                                                      _mm256_maddubs_epi16(wq[c], XB(r, c))), ones)
                        const int at = (r0 + r) * nb + b;
                        sv[r] = _mm256_sub_epi32(_mm256_add_epi32(PAIR(0, 1), PAIR(2, 3)), _mm256_set1_epi32(32 * sqa[at]));
                        s2[r] = _mm256_sub_epi32(_mm256_add_epi32(PAIR(4, 5), PAIR(6, 7)),
                                                 _mm256_set1_epi32(32 * (sq[at] - sqa[at])));
#undef PAIR
                    }
                } else {
                    /* 4-bit weights: 16 products <= 16 * 15 * 127 add up in i16; 5-bit ones: the
                     * low and high halves apart (8 products <= 8 * 31 * 127 each) */
                    const int five = hb >= 0;
                    const __m256i h0 = five ? _mm256_loadu_si256((const __m256i *)(pb + hb + 32 * h)) : _mm256_setzero_si256();
                    __m256i s16[ROWS_PER_PASS], t16[ROWS_PER_PASS];
                    for (int r = 0; r < M; r++) s16[r] = t16[r] = _mm256_setzero_si256();
                    for (int j = 0; j < 4; j++) {
                        const __m256i v = _mm256_loadu_si256((const __m256i *)(pb + nib + 64 * j + 32 * h));
                        __m256i wl = _mm256_and_si256(v, low4);  /* weights 4j .. 4j + 3 */
                        __m256i wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);  /* 16 + 4j .. */
                        if (five) {  /* bit 8t + j of the plane -> bit 4 of byte t; 8t + 4 + j likewise */
                            wl = _mm256_or_si256(wl, _mm256_and_si256(_mm256_slli_epi32(h0, 4 - j), bit4));
                            wh = _mm256_or_si256(wh, _mm256_and_si256(_mm256_srli_epi32(h0, j), bit4));
                        }
                        for (int r = 0; r < M; r++) {
                            s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(wl, XB(r, j)));
                            if (five) t16[r] = _mm256_add_epi16(t16[r], _mm256_maddubs_epi16(wh, XB(r, j + 4)));
                            else s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(wh, XB(r, j + 4)));
                        }
                    }
                    for (int r = 0; r < M; r++) {
                        sv[r] = _mm256_madd_epi16(s16[r], ones);
                        if (five) sv[r] = _mm256_add_epi32(sv[r], _mm256_madd_epi16(t16[r], ones));
                    }
                }
#undef XB
                for (int r = 0; r < M; r++) {
                    const size_t at = (size_t)(r0 + r) * nb + b;
                    const __m256 dx = _mm256_set1_ps(xd[at]);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sv[r]), _mm256_mul_ps(d, dx), acc[r]);
                    if (type == Q6_K)
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s2[r]), _mm256_mul_ps(d2, dx), acc[r]);
                    else if (type != Q8_0)
                        acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[at]), acc[r]);
                }
            }
        }
        const int live = rows - 8 * h < 8 ? rows - 8 * h : 8;
        for (int r = 0; r < M; r++) store8(acc[r], y, y_bf16, (size_t)(r0 + r) * n + n0 + 8 * h, live);
    }
}
