/* Paged decode attention on 8-wide registers (AVX2 + FMA) for float32 and bfloat16 caches, one
 * KV head's query heads at a time (group_256): included by paged_decode.c after its generic
 * kernel (it uses softmax_rows), tried after the AVX-512 kernels, before the generic loops.
 * The same kernel reads int8 caches (--kv-cache-dtype int8, attention/kv_quant.py: rows of D
 * int8 values and their float32 scale), for float32 or bfloat16 queries (paged_decode_q8).
 */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* 8 values at p + i as float32: p float32, or bfloat16 (raw bits) widened exactly. */
static inline __m256 load8(const void *p, int64_t i, const int bf16) {
    if (!bf16) return _mm256_loadu_ps((const float *)p + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 int8 values at p + i as float32 (exact). */
static inline __m256 load8_q8(const void *p, int64_t i) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)((const int8_t *)p + i));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

/* An int8 row's scale: the float32 after its D values, at p + i (bytes). */
static inline float row_scale(const void *p, int64_t i) {
    float s;
    memcpy(&s, (const char *)p + i, sizeof s);
    return s;
}

/* Lane j of the result: the sum of v[j]'s 8 lanes, ((0+1)+(2+3))+((4+5)+(6+7)) whatever the
 * other vectors hold; 6 horizontal adds and 2 lane moves for 8 sums. */
static inline __m256 hsum8(const __m256 v[8]) {
    const __m256 a0 = _mm256_hadd_ps(v[0], v[1]), a1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 a2 = _mm256_hadd_ps(v[4], v[5]), a3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3);
    /* b0: v0..v3's sums of lanes 0-3, then of lanes 4-7; b1 the same of v4..v7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}

/* Keys t0 .. t0 + result - 1: at most `most`, all in t0's block, none past len. */
static inline int64_t chunk_of(int64_t t0, int64_t len, int bs, int most) {
    int64_t cnt = bs - t0 % bs;
    if (cnt > most) cnt = most;
    return len - t0 < cnt ? len - t0 : cnt;
}

/* one_group on 8-wide registers (AVX2), D = 8 * C8 (32, 64 or 128, compile-time), G <= 16 heads
 * a KV head. one_group scored a key with one dot product per head and a full horizontal sum
 * each, and added every weighted V row into the outputs in memory: ~190 ns a key at the default
 * model's shape (G 3, D 64), compute bound even from cache. Here 8 keys' partial dot products
 * become one vector of 8 scores (hsum8), and the values pass keeps one head's 8 output vectors
 * in registers over a block's keys (up to 16), their rows in L1 for the G heads.
 * bf16: q and out are bfloat16 (else float32); q8: the caches hold int8 rows of W = D + 4 bytes
 * (a key's score is its integer-valued dot product times its row's scale, a value row's weight
 * its probability times its scale), else rows of D values in q's type. */
static inline __attribute__((always_inline)) void one_group_256(
        const void *q, const void *k_cache, const void *v_cache, const int64_t *table,
        int64_t len, void *out, float *scores, float *lse, int H, int KVH, int kvh, int bs,
        float scale, int window, const int G, const int C8, const int bf16, const int q8) {
    const int D = 8 * C8, h0 = kvh * G, W = q8 ? D + 4 : D;  /* W: a row's elements */
    const int64_t start = (window > 0 && len > window) ? len - window : 0;
    const int64_t n = len - start;
    const int64_t row = (int64_t)KVH * W;
    float qf[16 * 128], acc[16 * 128], maxs[16];
    __m256 maxv[16];
    for (int i = 0; i < G * D; i += 8) _mm256_storeu_ps(qf + i, load8(q, (int64_t)h0 * D + i, bf16));
    for (int g = 0; g < G; g++) maxv[g] = _mm256_set1_ps(-INFINITY);
    const __m256 vscale = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t t0 = start, cnt; t0 < len; t0 += cnt) {
        cnt = chunk_of(t0, len, bs, 8);
        const int64_t k0 = (table[t0 / bs] * bs + t0 % bs) * row + (int64_t)kvh * W;
        const __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)cnt), lane));
        __m256 kscale = vscale;  /* q8: each key's row scale times the softmax scale */
        if (q8) {
            float s[8] = {0};
            for (int i = 0; i < cnt; i++) s[i] = row_scale(k_cache, k0 + i * row + D);
            kscale = _mm256_mul_ps(_mm256_loadu_ps(s), vscale);
        }
        for (int g = 0; g < G; g++) {
            __m256 v[8], qr[C8 < 8 ? C8 : 8];  /* the head's q in registers (D <= 64) */
            for (int c = 0; c < (C8 < 8 ? C8 : 8); c++) qr[c] = _mm256_loadu_ps(qf + g * D + 8 * c);
            for (int i = 0; i < 8; i++) {
                if (i >= cnt) {
                    v[i] = _mm256_setzero_ps();
                    continue;
                }
#define KROW(c) (q8 ? load8_q8(k_cache, k0 + i * row + 8 * (c)) : load8(k_cache, k0 + i * row + 8 * (c), bf16))
                __m256 a = _mm256_mul_ps(qr[0], KROW(0));
                for (int c = 1; c < C8; c++)
                    a = _mm256_fmadd_ps(c < 8 ? qr[c < 8 ? c : 0] : _mm256_loadu_ps(qf + g * D + 8 * c), KROW(c), a);
#undef KROW
                v[i] = a;
            }
            const __m256 sc = _mm256_mul_ps(hsum8(v), kscale);
            _mm256_maskstore_ps(scores + g * n + (t0 - start), _mm256_castps_si256(live), sc);
            maxv[g] = _mm256_max_ps(maxv[g], _mm256_blendv_ps(ninf, sc, live));
        }
    }
    for (int g = 0; g < G; g++) {
        float m[8];
        _mm256_storeu_ps(m, maxv[g]);
        maxs[g] = m[0];
        for (int i = 1; i < 8; i++) maxs[g] = m[i] > maxs[g] ? m[i] : maxs[g];
    }
    softmax_rows(scores, maxs, G, n, lse);
    memset(acc, 0, sizeof(float) * (size_t)G * D);
    for (int64_t t0 = start, cnt; t0 < len; t0 += cnt) {
        cnt = chunk_of(t0, len, bs, 16);
        const int64_t v0 = (table[t0 / bs] * bs + t0 % bs) * row + (int64_t)kvh * W;
        float vs[16];  /* q8: the value rows' scales */
        for (int i = 0; i < cnt; i++) vs[i] = q8 ? row_scale(v_cache, v0 + i * row + D) : 1.f;
        for (int g = 0; g < G; g++)
            for (int c0 = 0; c0 < C8; c0 += 8) {  /* up to 8 output vectors at a time */
                const int w = C8 - c0 < 8 ? C8 - c0 : 8;
                float *o = acc + g * D + 8 * c0;
                __m256 a[8];
                for (int c = 0; c < w; c++) a[c] = _mm256_loadu_ps(o + 8 * c);
                for (int i = 0; i < cnt; i++) {
                    const float pi = scores[g * n + (t0 - start) + i];
                    const __m256 p = _mm256_set1_ps(q8 ? pi * vs[i] : pi);
                    for (int c = 0; c < w; c++)
                        a[c] = _mm256_fmadd_ps(p, q8 ? load8_q8(v_cache, v0 + i * row + 8 * (c0 + c))
                                                     : load8(v_cache, v0 + i * row + 8 * (c0 + c), bf16), a[c]);
                }
                for (int c = 0; c < w; c++) _mm256_storeu_ps(o + 8 * c, a[c]);
            }
    }
    for (int i = 0; i < G * D; i++) {
        union { float f; uint32_t u; } v = {.f = acc[i]};
        if (!bf16 || lse) ((float *)out)[(int64_t)h0 * D + i] = v.f;
        else ((uint16_t *)out)[(int64_t)h0 * D + i] = (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
    }
}

static int group_256(const void *q, const void *k, const void *v, const int64_t *table,
                     int64_t len, void *out, float *scores, float *lse, int H, int KVH, int kvh,
                     int D, int bs, float scale, int window, const int bf16) {
    const int G = H / KVH;
    if (G > 16) return 0;
#define G256(c8) one_group_256(q, k, v, table, len, out, scores, lse, H, KVH, kvh, bs, scale, window, G, c8, bf16, 0)
    switch (D) {
    case 32: G256(4); return 1;
    case 64: G256(8); return 1;
    case 128: G256(16); return 1;
    default: return 0;
    }
#undef G256
}

static int q8_shape_ok(int H, int KVH, int D) {
    return KVH > 0 && H % KVH == 0 && H / KVH <= 16 && (D == 32 || D == 64 || D == 128);
}

/* group_fn over int8 caches (q8_shape_ok shapes only): q and out float32 (bf16 = 0) or bfloat16 */
static inline __attribute__((always_inline)) void group_q8(
        const void *q, const void *k, const void *v, const int64_t *table, int64_t len, void *out,
        float *scores, float *lse, int H, int KVH, int kvh, int D, int bs, float scale, int window,
        const int bf16) {
    const int G = H / KVH;
#define Q8(c8) one_group_256(q, k, v, table, len, out, scores, lse, H, KVH, kvh, bs, scale, window, G, c8, bf16, 1)
    switch (D) {
    case 32: Q8(4); break;
    case 64: Q8(8); break;
    default: Q8(16); break;
    }
#undef Q8
}

static void group_q8_f32(const void *q, const void *k, const void *v, const int64_t *table,
                         int64_t len, void *out, float *scores, float *lse, int H, int KVH,
                         int kvh, int D, int bs, float scale, int window) {
    group_q8(q, k, v, table, len, out, scores, lse, H, KVH, kvh, D, bs, scale, window, 0);
}

static void group_q8_bf16(const void *q, const void *k, const void *v, const int64_t *table,
                          int64_t len, void *out, float *scores, float *lse, int H, int KVH,
                          int kvh, int D, int bs, float scale, int window) {
    group_q8(q, k, v, table, len, out, scores, lse, H, KVH, kvh, D, bs, scale, window, 1);
}
#else
static int q8_shape_ok(int H, int KVH, int D) { return 0; }
#define group_q8_f32 NULL
#define group_q8_bf16 NULL
static int group_256(const void *q, const void *k, const void *v, const int64_t *table,
                     int64_t len, void *out, float *scores, float *lse, int H, int KVH, int kvh,
                     int D, int bs, float scale, int window, int bf16) {
    return 0;
}
#endif
