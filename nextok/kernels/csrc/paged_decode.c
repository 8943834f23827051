/* Paged decode attention on CPU, float32 and bfloat16: one query token per sequence, keys and values read
 * straight from the paged KV pool (no gathered copy, each K/V row read once).
 *
 * Layouts (as nextok/attention/base.py):
 *   q, out        [B, H, D]
 *   k/v cache     [num_blocks, block_size, KVH, D]
 *   block_tables  [B, max_blocks] int64      context_lens [B] int64
 * Query head h reads KV head h / (H / KVH) (GQA). With a sliding window W, query at position
 * p = len - 1 sees keys (p - W, p].
 *
 * One task per (sequence, KV head, span of 256 keys); a sequence of several spans is merged by
 * their log-sum-exps (decode_groups). Two passes over a span's keys (scores, then the weighted
 * sum of values) with an exact softmax in between, so results match a reference softmax to
 * float rounding.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 8-wide float vectors (AVX2 registers on x86; GCC splits them on narrower targets). The kernel
 * is memory bound only if its inner loops vectorize; plain loops with a float reduction do not
 * (the compiler may not reorder the sum), so the sums are written over vectors explicitly. */
typedef float v8 __attribute__((vector_size(32), aligned(4)));

static inline float hsum(v8 v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

static inline float dot(const float *restrict a, const float *restrict b, int d) {
    int i = 0;
    float s = 0.f;
    if (d >= 8) {
        v8 acc = *(const v8 *)a * *(const v8 *)b;
        for (i = 8; i + 8 <= d; i += 8) acc += *(const v8 *)(a + i) * *(const v8 *)(b + i);
        s = hsum(acc);
    }
    for (; i < d; i++) s += a[i] * b[i];
    return s;
}

static inline void axpy(float *restrict y, float a, const float *restrict x, int d) {
    int i = 0;
    for (; i + 8 <= d; i += 8) *(v8 *)(y + i) += a * *(const v8 *)(x + i);
    for (; i < d; i++) y[i] += a * x[i];
}

/* exp(x) for x <= 0 on 8 lanes: x = k ln2 + r, |r| <= ln2 / 2, exp(r) by its degree-6 Taylor
 * polynomial (relative error < 2e-7, below float32 rounding of the sum), 2^k through the
 * exponent bits. Lanes below -87 (exp < 1.6e-38, a softmax weight that rounds to 0) give 0. */
typedef int v8i __attribute__((vector_size(32)));

static inline v8 exp_neg(v8 x) {
    const v8 zero = {0};
    v8i alive = x >= -87.f;  /* all ones where exp(x) is a normal float */
    x = (v8)(((v8i)x & alive) | ((v8i)(zero - 87.f) & ~alive));
    v8 kf = __builtin_convertvector(__builtin_convertvector(x * 1.44269504f - 0.5f, v8i), v8);
    v8 r = x - kf * 0.693359375f + kf * 2.12194440e-4f;  /* ln2 split in two for precision */
    v8 p = zero + 1.f / 720.f;
    p = p * r + 1.f / 120.f;
    p = p * r + 1.f / 24.f;
    p = p * r + 1.f / 6.f;
    p = p * r + 0.5f;
    p = p * r + 1.f;
    p = p * r + 1.f;
    v8i bits = (__builtin_convertvector(kf, v8i) + 127) << 23;
    return (v8)((v8i)(p * (v8)bits) & alive);
}

/* s[i] = exp(s[i] - m); returns the sum. */
static float exp_sub_sum(float *s, int64_t n, float m) {
    int64_t i = 0;
    v8 acc = {0};
    for (; i + 8 <= n; i += 8) {
        v8 e = exp_neg(*(v8 *)(s + i) - m);
        *(v8 *)(s + i) = e;
        acc += e;
    }
    float sum = hsum(acc);
    for (; i < n; i++) { s[i] = expf(s[i] - m); sum += s[i]; }
    return sum;
}


/* scores [G, n] -> each row's softmax in place, maxs [G] its largest score; lse [G] (unless
 * NULL): each row's log-sum-exp, max + log(sum), by which decode_groups merges key spans. */
static void softmax_rows(float *scores, const float *maxs, int G, int64_t n, float *lse) {
    for (int g = 0; g < G; g++) {
        float *sg = scores + g * n;
        const float sum = exp_sub_sum(sg, n, maxs[g]), inv = 1.f / sum;
        for (int64_t i = 0; i < n; i++) sg[i] *= inv;
        if (lse) lse[g] = maxs[g] + logf(sum);
    }
}
/* One sequence, the G query heads that share KV head `kvh`: each token's K and V rows are read
 * once, front to back, so the hardware prefetcher streams whole 16-token blocks.
 * q, out: the sequence's [H, D]; scores: scratch of G * len floats. */
static void one_group(const float *q, const float *k_cache, const float *v_cache,
                      const int64_t *table, int64_t len, float *out, float *scores, float *lse,
                      int H, int KVH, int kvh, int D, int bs, float scale, int window) {
    const int G = H / KVH, h0 = kvh * G;
    const int64_t start = (window > 0 && len > window) ? len - window : 0;
    const int64_t n = len - start;
    const int64_t row = (int64_t)KVH * D;
    float maxs[256];
    for (int g = 0; g < G; g++) maxs[g] = -INFINITY;
    for (int64_t t = start; t < len; t++) {
        const float *k = k_cache + (table[t / bs] * bs + t % bs) * row + (int64_t)kvh * D;
        for (int g = 0; g < G; g++) {
            float sc = dot(q + (int64_t)(h0 + g) * D, k, D) * scale;
            scores[g * n + (t - start)] = sc;
            if (sc > maxs[g]) maxs[g] = sc;
        }
    }
    softmax_rows(scores, maxs, G, n, lse);
    memset(out + (int64_t)h0 * D, 0, sizeof(float) * (size_t)G * D);
    for (int64_t t = start; t < len; t++) {
        const float *v = v_cache + (table[t / bs] * bs + t % bs) * row + (int64_t)kvh * D;
        for (int g = 0; g < G; g++)
            axpy(out + (int64_t)(h0 + g) * D, scores[g * n + (t - start)], v, D);
    }
}

/* A group kernel: the G query heads of one sequence that share KV head `kvh`, over its first
 * `len` keys (the last `window` of them if window > 0): out's heads kvh * G .. kvh * G + G - 1
 * (the sequence's [H, D], in the caches' type). With lse (not NULL), a span of a longer
 * sequence: out is float32, whatever the caches' type (rounding each span's result to bfloat16
 * before the merge cost up to 0.2 relative error where spans cancel), and lse [G] gets the
 * heads' log-sum-exps. scores: scratch of G * (keys read) floats. */
typedef void (*group_fn)(const void *q, const void *k_cache, const void *v_cache,
                         const int64_t *table, int64_t len, void *out, float *scores, float *lse,
                         int H, int KVH, int kvh, int D, int bs, float scale, int window);

/* Keys per task of a long sequence (rounded up to whole blocks). One task per (sequence, KV
 * head) left a batch-1 step with KVH tasks (the default model: 3, on 16 cores) however long the
 * context, each streaming its keys alone: at 4000 keys the step's attention ran at ~4 GB/s,
 * 4/5 of the whole step. A sequence's keys are cut at fixed multiples of SPAN_KEYS, so where
 * they are cut depends only on its own length: a row's result does not depend on the batch
 * or the thread count. */
#define SPAN_KEYS 256

/* Heads h0 .. h0 + G - 1 of out [H, D] (elem: 4 float32, 2 bfloat16) from a sequence's nsp
 * spans: part [nsp][H][D] float32 (each span's softmax over its own keys) and lse [nsp][H]:
 * sum_s w_s o_s / sum_s w_s, with w_s = exp(lse_s - the largest lse), spans in order. */
static void merge_spans(const float *part, const float *lse, int64_t nsp, char *out, int H, int D,
                        int h0, int G, int elem) {
    float acc[D];
    for (int h = h0; h < h0 + G; h++) {
        float m = -INFINITY, wsum = 0.f;
        for (int64_t s = 0; s < nsp; s++) m = fmaxf(m, lse[s * H + h]);
        memset(acc, 0, sizeof(float) * (size_t)D);
        for (int64_t s = 0; s < nsp; s++) {
            const float w = expf(lse[s * H + h] - m);
            const float *o = part + (s * H + h) * (int64_t)D;
            wsum += w;
            for (int d = 0; d < D; d++) acc[d] += w * o[d];
        }
        const float inv = 1.f / wsum;
        for (int d = 0; d < D; d++) {
            union { float f; uint32_t u; } v = {.f = acc[d] * inv};
            if (elem == 4) ((float *)out)[(int64_t)h * D + d] = v.f;
            else ((uint16_t *)out)[(int64_t)h * D + d] = (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
        }
    }
}

/* One task per (sequence, KV head, span of SPAN_KEYS keys), then a merge per (sequence, KV head)
 * of more than one span. A sequence within one span runs as one task straight into out (short
 * contexts: as before). `elem`: bytes per value of q, the caches and out (4: float32, 2:
 * bfloat16), which `group` reads. Returns 0, or -1 when H > 256 or scratch memory could not
 * be had. */
static int decode_groups(group_fn group, int elem, const void *q, const void *k_cache,
                         const void *v_cache, const int64_t *block_tables,
                         const int64_t *context_lens, void *out, int B, int H, int KVH, int D,
                         int bs, int max_blocks, float scale, int window, int num_threads) {
    if (H > 256 || KVH <= 0 || H % KVH || bs <= 0) return -1;
    const int G = H / KVH;
    const int64_t span = (SPAN_KEYS + bs - 1) / bs * bs;
    /* sequence b: tasks first[b] .. first[b + 1] - 1 (one a span), its spans' results from slot[b] */
    int64_t *first = malloc(sizeof(int64_t) * (2 * (size_t)B + 1));
    if (!first) return -1;
    int64_t *slot = first + B + 1, tasks = 0, slots = 0, max_n = 1;
    for (int b = 0; b < B; b++) {
        const int64_t len = context_lens[b], lo = (window > 0 && len > window) ? len - window : 0;
        const int64_t nsp = len > 0 ? (len - 1) / span - lo / span + 1 : 1;
        first[b] = tasks;
        slot[b] = slots;
        tasks += nsp;
        if (nsp > 1) slots += nsp;
        if (len - lo > max_n) max_n = len - lo;
    }
    first[B] = tasks;
    if (max_n > span) max_n = span;  /* the most keys one task reads */
    int *seq_of = malloc(sizeof(int) * (size_t)(tasks + 1));
    float *lses = malloc(sizeof(float) * (size_t)(slots * H + 1));
    float *parts = malloc(sizeof(float) * (size_t)(slots * H * D + 1));
    int failed = !seq_of || !lses || !parts;
    for (int b = 0; b < B && !failed; b++)
        for (int64_t i = first[b]; i < first[b + 1]; i++) seq_of[i] = b;
#pragma omp parallel num_threads(num_threads) if (!failed)
    {
        float *scores = failed ? NULL : malloc(sizeof(float) * (size_t)G * (size_t)max_n);
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks * KVH; task++) {
            if (!scores) continue;
            const int64_t i = task / KVH;
            const int b = seq_of[i], kvh = (int)(task % KVH);
            const int64_t seq = (int64_t)b * H * D * elem;  /* bytes to the sequence's [H, D] */
            const int64_t *table = block_tables + (int64_t)b * max_blocks, len = context_lens[b];
            if (first[b + 1] - first[b] == 1) {
                group((const char *)q + seq, k_cache, v_cache, table, len, (char *)out + seq, scores,
                      NULL, H, KVH, kvh, D, bs, scale, window);
                continue;
            }
            /* span c holds keys [a, e); the window's first key lo may cut into the first */
            const int64_t lo = (window > 0 && len > window) ? len - window : 0;
            const int64_t a = (lo / span + i - first[b]) * span, e = a + span < len ? a + span : len;
            const int64_t s = slot[b] + i - first[b];
            group((const char *)q + seq, k_cache, v_cache, table + a / bs, e - a,
                  parts + s * H * D, scores, lses + s * H + (int64_t)kvh * G, H, KVH, kvh, D,
                  bs, scale, lo > a ? (int)(e - lo) : 0);
        }
        free(scores);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < (int64_t)B * KVH; task++) {
            const int b = (int)(task / KVH), kvh = (int)(task % KVH);
            const int64_t nsp = first[b + 1] - first[b];
            if (failed || nsp == 1) continue;
            merge_spans(parts + slot[b] * H * D, lses + slot[b] * H, nsp,
                        (char *)out + (int64_t)b * H * D * elem, H, D, kvh * G, G, elem);
        }
    }
    free(seq_of);
    free(lses);
    free(parts);
    free(first);
    return failed ? -1 : 0;
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* Keys t0 .. t0 + result - 1: at most 16, all in t0's block, none past len. */
static inline int64_t chunk_len(int64_t t0, int64_t len, int bs) {
    int64_t cnt = bs - t0 % bs;
    if (cnt > 16) cnt = 16;
    return len - t0 < cnt ? len - t0 : cnt;
}

/* Lane j of the result: the sum of v[j]'s 16 lanes, for 16 vectors at once. A transposing tree
 * (within 128-bit lanes, then across them): ~3 instructions a vector instead of a full
 * horizontal sum each (~8, most on the shuffle port). Each lane's sum is of its own vector's
 * lanes in a fixed order, whatever the other 15 hold. */
static inline __m512 hsum16(const __m512 v[16]) {
    __m512 a[8], b[4];
    for (int i = 0; i < 8; i++)  /* per 128-bit lane: v2i 0+2, v2i+1 0+2, v2i 1+3, v2i+1 1+3 */
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)  /* per 128-bit lane L: that lane's sum of v4i .. v4i+3 */
        b[i] = _mm512_add_ps(  /* 64-bit moves of float pairs, float adds */
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a[2 * i]), _mm512_castps_pd(a[2 * i + 1]))),
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a[2 * i]), _mm512_castps_pd(a[2 * i + 1]))));
    const __m512 c0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(b[0], b[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 c1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(b[2], b[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c0, c1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(c0, c1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* 16 values at p + i as float32: p float32, or bfloat16 (raw bits) widened exactly. */
static inline __m512 load16(const void *p, int64_t i, const int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)p + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 float32 -> p + i: float32, or bfloat16 rounded to nearest even (as one_group_bf16). */
static inline void store16(void *p, int64_t i, __m512 v, const int bf16) {
    if (!bf16) {
        _mm512_storeu_ps((float *)p + i, v);
        return;
    }
    const __m512i u = _mm512_castps_si512(v);
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                       _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
}

/* one_group for float32 on 16-wide registers, D = 16 * C and G heads a KV head, both compile-time
 * constants (the call sites below). Scores 16 keys at a time: each key's C-FMA partial dot
 * product per head, then one transposing sum (hsum16) gives the 16 scores as a vector; the 16
 * keys' rows stay in L1 for the G heads. The weighted sum of values keeps the G output rows in
 * registers for the whole pass, each V row loaded once for all G heads. A verify step's rows
 * each run this, so it is most of what a draft row adds to attention. The softmax is one_group's
 * (exp_sub_sum), in the same order. bfloat16 caches run it too, on rows widened to float32 as
 * they are loaded, where the CPU lacks AVX512_BF16 (one_group_dpbf16 below). Keys go in chunks
 * of up to 16 within one block: one block-table lookup a chunk (a division by the block size
 * a key cost ~8 % at 8 rows). Default model's shape, ~500-token context, 2 threads, per layer:
 * float32 20.5 -> 18.6-19.3 us at 1 row, 94 -> 91 us at 8 rows of one sequence (the
 * transposing sum); bfloat16 in the engine 40 -> 28 us at 1 row, 181 -> 96 us at 8
 * (one_group_bf16 before). */
static inline __attribute__((always_inline)) void one_group_512(
        const void *q, const void *k_cache, const void *v_cache, const int64_t *table,
        int64_t len, void *out, float *scores, float *lse, int H, int KVH, int kvh, int bs,
        float scale, int window, const int G, const int C, const int bf16) {
    const int D = 16 * C, h0 = kvh * G;
    const int64_t start = (window > 0 && len > window) ? len - window : 0;
    const int64_t n = len - start;
    const int64_t row = (int64_t)KVH * D;
    __m512 qv[16], acc[16], maxv[16];
    float maxs[16];
    for (int g = 0; g < G; g++) {
        maxv[g] = _mm512_set1_ps(-INFINITY);
        for (int c = 0; c < C; c++) qv[g * C + c] = load16(q, (int64_t)(h0 + g) * D + 16 * c, bf16);
    }
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t t0 = start, cnt; t0 < len; t0 += cnt) {
        cnt = chunk_len(t0, len, bs);
        const __mmask16 live = (__mmask16)((1u << cnt) - 1u);
        int64_t kp[16];  /* element offsets of the chunk's keys' rows (one block) */
        const int64_t k0 = (table[t0 / bs] * bs + t0 % bs) * row + (int64_t)kvh * D;
        for (int i = 0; i < cnt; i++) kp[i] = k0 + i * row;
        for (int g = 0; g < G; g++) {
            __m512 v[16];
            for (int i = 0; i < 16; i++) {
                if (i >= cnt) {
                    v[i] = _mm512_setzero_ps();
                    continue;
                }
                __m512 a = _mm512_mul_ps(qv[g * C], load16(k_cache, kp[i], bf16));
                for (int c = 1; c < C; c++) a = _mm512_fmadd_ps(qv[g * C + c], load16(k_cache, kp[i] + 16 * c, bf16), a);
                v[i] = a;
            }
            const __m512 sc = _mm512_mul_ps(hsum16(v), vscale);
            _mm512_mask_storeu_ps(scores + g * n + (t0 - start), live, sc);
            maxv[g] = _mm512_mask_max_ps(maxv[g], live, maxv[g], sc);
        }
    }
    for (int g = 0; g < G; g++) maxs[g] = _mm512_reduce_max_ps(maxv[g]);
    softmax_rows(scores, maxs, G, n, lse);
    for (int i = 0; i < G * C; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t t0 = start, cnt; t0 < len; t0 += cnt) {
        cnt = chunk_len(t0, len, bs);
        const int64_t v0 = (table[t0 / bs] * bs + t0 % bs) * row + (int64_t)kvh * D;
        for (int i = 0; i < cnt; i++) {
            const int64_t v = v0 + i * row, t = t0 + i;
            __m512 vv[8];
            for (int c = 0; c < C; c++) vv[c] = load16(v_cache, v + 16 * c, bf16);
            for (int g = 0; g < G; g++) {
                const __m512 p = _mm512_set1_ps(scores[g * n + (t - start)]);
                for (int c = 0; c < C; c++) acc[g * C + c] = _mm512_fmadd_ps(p, vv[c], acc[g * C + c]);
            }
        }
    }
    for (int g = 0; g < G; g++)
        for (int c = 0; c < C; c++) store16(out, (int64_t)(h0 + g) * D + 16 * c, acc[g * C + c], bf16 && !lse);
}

/* The (G, D) pairs with a register kernel: G * D / 16 <= 16 (queries and outputs, 32 registers). */
static inline __attribute__((always_inline)) int group_512(
        const void *q, const void *k, const void *v, const int64_t *table, int64_t len, void *out,
        float *scores, float *lse, int H, int KVH, int kvh, int D, int bs, float scale, int window,
        const int bf16) {
#define G512(g, c) one_group_512(q, k, v, table, len, out, scores, lse, H, KVH, kvh, bs, scale, window, g, c, bf16)
    switch (H / KVH * 1000 + D) {
    case 1064: G512(1, 4); return 1;
    case 2064: G512(2, 4); return 1;
    case 3064: G512(3, 4); return 1;
    case 4064: G512(4, 4); return 1;
    case 1128: G512(1, 8); return 1;
    case 2128: G512(2, 8); return 1;
    default: return 0;
    }
#undef G512
}

#if defined(__AVX512BF16__)
/* exp(x) on 16 lanes for x <= 0 (softmax): exp_neg's polynomial, lanes below -87 give 0. */
static inline __m512 exp_neg16(__m512 x) {
    const __mmask16 alive = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.f), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
    const __m512 kf = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fmadd_ps(kf, _mm512_set1_ps(2.12194440e-4f),
                                     _mm512_fnmadd_ps(kf, _mm512_set1_ps(0.693359375f), x));
    __m512 p = _mm512_set1_ps(1.f / 720.f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(kf), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(alive, p, _mm512_castsi512_ps(bits));
}

/* 32 bfloat16 at p as float32: the even columns (each 32-bit word shifted left 16) and the odd
 * ones (the word with its low half cleared), both exact, two integer ops and no shuffle. */
static inline void load_pairs(const uint16_t *p, __m512 *even, __m512 *odd) {
    const __m512i w = _mm512_loadu_si512(p);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xffff0000u)));
}

/* even * s and odd * s rounded to bfloat16 (nearest even) and joined back into 32 columns at p. */
static inline void store_pairs(uint16_t *p, __m512 even, __m512 odd, __m512 s) {
    const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i e = _mm512_castps_si512(_mm512_mul_ps(even, s));
    const __m512i o = _mm512_castps_si512(_mm512_mul_ps(odd, s));
    const __m512i re = _mm512_add_epi32(_mm512_add_epi32(e, half), _mm512_and_si512(_mm512_srli_epi32(e, 16), one));
    const __m512i ro = _mm512_add_epi32(_mm512_add_epi32(o, half), _mm512_and_si512(_mm512_srli_epi32(o, 16), one));
    _mm512_storeu_si512(p, _mm512_or_si512(_mm512_srli_epi32(re, 16),
                                           _mm512_and_si512(ro, _mm512_set1_epi32((int)0xffff0000u))));
}

/* bfloat16 without widening (AVX512_BF16), G heads a KV head, D = 32 * C2, compile-time:
 * - scores: vdpbf16ps multiplies 32 bfloat16 pairs of q and a key row and adds them to 16
 *   float32 lanes (each product exact, as an FMA's), so a 64-wide row is 2 instructions where
 *   widening it took 4 conversions and 4 FMAs; 16 keys' lanes then go through hsum16.
 * - values: a row's 32-bit words hold two bfloat16 each; the even one is the word shifted left
 *   16, the odd one the word with its low half cleared, both exact float32 (two cheap integer
 *   ops, no shuffle). The outputs are kept split the same way and joined when rounded.
 * - softmax: exp(s - max) per score, the 1 / sum applied to the outputs at the end.
 * Every row is its own task, so a row's result does not depend on the other rows of its step.
 * Default model's shape, 400-token context, 2 threads, per layer (the widening kernel above,
 * chunked, -> this): 17.4 -> 14.9 us at 1 row, 61.9 -> 49.4 at 5 rows, 84.1 -> 67.0 at 8. */
static inline __attribute__((always_inline)) void one_group_dpbf16(
        const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, const int64_t *table,
        int64_t len, uint16_t *out, float *scores, float *lse, int KVH, int kvh, int bs,
        float scale, int window, const int G, const int C2) {
    const int D = 32 * C2, h0 = kvh * G;
    const int64_t start = (window > 0 && len > window) ? len - window : 0;
    const int64_t n = len - start;
    const int64_t row = (int64_t)KVH * D;
    __m512bh qv[8];
    __m512 maxv[4], acc[16];
    float inv[4];
    for (int g = 0; g < G; g++) {
        maxv[g] = _mm512_set1_ps(-INFINITY);
        for (int c = 0; c < C2; c++)
            qv[g * C2 + c] = (__m512bh)_mm512_loadu_si512(q + (int64_t)(h0 + g) * D + 32 * c);
    }
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t t0 = start, cnt; t0 < len; t0 += cnt) {
        cnt = chunk_len(t0, len, bs);
        const __mmask16 live = (__mmask16)((1u << cnt) - 1u);
        const uint16_t *kb = k_cache + (table[t0 / bs] * bs + t0 % bs) * row + (int64_t)kvh * D;
        for (int g = 0; g < G; g++) {
            __m512 v[16];
            for (int i = 0; i < 16; i++) {
                v[i] = _mm512_setzero_ps();
                if (i >= cnt) continue;
                for (int c = 0; c < C2; c++)
                    v[i] = _mm512_dpbf16_ps(v[i], qv[g * C2 + c],
                                            (__m512bh)_mm512_loadu_si512(kb + i * row + 32 * c));
            }
            const __m512 sc = _mm512_mul_ps(hsum16(v), vscale);
            _mm512_mask_storeu_ps(scores + g * n + (t0 - start), live, sc);
            maxv[g] = _mm512_mask_max_ps(maxv[g], live, maxv[g], sc);
        }
    }
    for (int g = 0; g < G; g++) {
        float *sg = scores + g * n;
        const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(maxv[g]));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 live = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
            const __m512 e = exp_neg16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, sg + i), m));
            _mm512_mask_storeu_ps(sg + i, live, e);
            sum = _mm512_mask_add_ps(sum, live, sum, e);
        }
        const float total = _mm512_reduce_add_ps(sum);
        inv[g] = 1.f / total;
        if (lse) lse[g] = _mm512_reduce_max_ps(maxv[g]) + logf(total);
    }
    for (int i = 0; i < 2 * G * C2; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t t0 = start, cnt; t0 < len; t0 += cnt) {
        cnt = chunk_len(t0, len, bs);
        const uint16_t *vb = v_cache + (table[t0 / bs] * bs + t0 % bs) * row + (int64_t)kvh * D;
        const float *p0 = scores + (t0 - start);
        for (int i = 0; i < cnt; i++) {
            __m512 ev[4], od[4];  /* the row's even and odd columns of each 32, as float32 */
            for (int c = 0; c < C2; c++) load_pairs(vb + i * row + 32 * c, &ev[c], &od[c]);
            for (int g = 0; g < G; g++) {
                const __m512 p = _mm512_set1_ps(p0[g * n + i]);
                for (int c = 0; c < C2; c++) {
                    acc[(g * C2 + c) * 2] = _mm512_fmadd_ps(p, ev[c], acc[(g * C2 + c) * 2]);
                    acc[(g * C2 + c) * 2 + 1] = _mm512_fmadd_ps(p, od[c], acc[(g * C2 + c) * 2 + 1]);
                }
            }
        }
    }
    for (int g = 0; g < G; g++)
        for (int c = 0; c < C2; c++) {
            const __m512 s = _mm512_set1_ps(inv[g]);
            if (!lse) {
                store_pairs(out + (int64_t)(h0 + g) * D + 32 * c, acc[(g * C2 + c) * 2],
                            acc[(g * C2 + c) * 2 + 1], s);
                continue;
            }
            float ev[16], od[16], *o = (float *)out + (int64_t)(h0 + g) * D + 32 * c;  /* a span: float32 */
            _mm512_storeu_ps(ev, _mm512_mul_ps(acc[(g * C2 + c) * 2], s));
            _mm512_storeu_ps(od, _mm512_mul_ps(acc[(g * C2 + c) * 2 + 1], s));
            for (int j = 0; j < 16; j++) {
                o[2 * j] = ev[j];
                o[2 * j + 1] = od[j];
            }
        }
}

static inline __attribute__((always_inline)) int group_dpbf16(
        const void *q, const void *k, const void *v, const int64_t *table, int64_t len, void *out,
        float *scores, float *lse, int KVH, int kvh, int G, int D, int bs, float scale, int window) {
#define GDP(g, c) one_group_dpbf16(q, k, v, table, len, out, scores, lse, KVH, kvh, bs, scale, window, g, c)
    switch (G * 1000 + D) {
    case 1064: GDP(1, 2); return 1;
    case 2064: GDP(2, 2); return 1;
    case 3064: GDP(3, 2); return 1;
    case 4064: GDP(4, 2); return 1;
    case 1128: GDP(1, 4); return 1;
    case 2128: GDP(2, 4); return 1;
    default: return 0;
    }
#undef GDP
}
#endif  /* __AVX512BF16__ */
#else
static int group_512(const void *q, const void *k, const void *v, const int64_t *table,
                     int64_t len, void *out, float *scores, float *lse, int H, int KVH, int kvh,
                     int D, int bs, float scale, int window, int bf16) {
    return 0;
}
#endif

#if !defined(__AVX512F__) || !defined(__AVX512BF16__)
static int group_dpbf16(const void *q, const void *k, const void *v, const int64_t *table,
                        int64_t len, void *out, float *scores, float *lse, int KVH, int kvh, int G,
                        int D, int bs, float scale, int window) {
    return 0;
}
#endif

#include "paged_decode_avx2.h"

static void group_f32(const void *q, const void *k, const void *v, const int64_t *table,
                      int64_t len, void *out, float *scores, float *lse, int H, int KVH, int kvh,
                      int D, int bs, float scale, int window) {
    if (!group_512(q, k, v, table, len, out, scores, lse, H, KVH, kvh, D, bs, scale, window, 0)
        && !group_256(q, k, v, table, len, out, scores, lse, H, KVH, kvh, D, bs, scale, window, 0))
        one_group(q, k, v, table, len, out, scores, lse, H, KVH, kvh, D, bs, scale, window);
}

int paged_decode_f32(const float *q, const float *k_cache, const float *v_cache,
                     const int64_t *block_tables, const int64_t *context_lens, float *out,
                     int B, int H, int KVH, int D, int bs, int max_blocks, float scale,
                     int window, int num_threads) {
    return decode_groups(group_f32, 4, q, k_cache, v_cache, block_tables, context_lens, out, B,
                         H, KVH, D, bs, max_blocks, scale, window, num_threads);
}

/* bfloat16 (raw uint16_t bits) q, caches and out: each K and V row is widened to float32 once
 * (for all G heads that read it), the math is the float32 kernel's, out rounds to bfloat16 at
 * the end (as torch's bf16 SDPA, which also accumulates in float32). */
static inline void widen(const uint16_t *src, float *dst, int d) {
    for (int i = 0; i < d; i++) {
        union { uint32_t u; float f; } v = {.u = (uint32_t)src[i] << 16};
        dst[i] = v.f;
    }
}

static void one_group_bf16(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
                           const int64_t *table, int64_t len, uint16_t *out, float *scores,
                           float *lse, int H, int KVH, int kvh, int D, int bs, float scale,
                           int window) {
    const int G = H / KVH, h0 = kvh * G;
    const int64_t start = (window > 0 && len > window) ? len - window : 0;
    const int64_t n = len - start;
    const int64_t row = (int64_t)KVH * D;
    float qf[G * D], acc[G * D], kv[D];
    float maxs[256];
    widen(q + (int64_t)h0 * D, qf, G * D);
    for (int g = 0; g < G; g++) maxs[g] = -INFINITY;
    for (int64_t t = start; t < len; t++) {
        widen(k_cache + (table[t / bs] * bs + t % bs) * row + (int64_t)kvh * D, kv, D);
        for (int g = 0; g < G; g++) {
            float sc = dot(qf + (int64_t)g * D, kv, D) * scale;
            scores[g * n + (t - start)] = sc;
            if (sc > maxs[g]) maxs[g] = sc;
        }
    }
    softmax_rows(scores, maxs, G, n, lse);
    memset(acc, 0, sizeof(float) * (size_t)G * D);
    for (int64_t t = start; t < len; t++) {
        widen(v_cache + (table[t / bs] * bs + t % bs) * row + (int64_t)kvh * D, kv, D);
        for (int g = 0; g < G; g++) axpy(acc + (int64_t)g * D, scores[g * n + (t - start)], kv, D);
    }
    if (lse) {  /* a span: float32 out */
        memcpy((float *)out + (int64_t)h0 * D, acc, sizeof(float) * (size_t)G * D);
        return;
    }
    for (int i = 0; i < G * D; i++) {  /* round to nearest even */
        union { float f; uint32_t u; } v = {.f = acc[i]};
        out[(int64_t)h0 * D + i] = (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
    }
}

static void group_bf16(const void *q, const void *k, const void *v, const int64_t *table,
                       int64_t len, void *out, float *scores, float *lse, int H, int KVH,
                       int kvh, int D, int bs, float scale, int window) {
    /* the float32 register kernel on widened rows where it has the (G, D) pair: at 8 rows of a
     * verify step, ~4x faster per row than one_group_bf16's widen-to-stack loops */
    if (!group_dpbf16(q, k, v, table, len, out, scores, lse, KVH, kvh, H / KVH, D, bs, scale, window)
        && !group_512(q, k, v, table, len, out, scores, lse, H, KVH, kvh, D, bs, scale, window, 1)
        && !group_256(q, k, v, table, len, out, scores, lse, H, KVH, kvh, D, bs, scale, window, 1))
        one_group_bf16(q, k, v, table, len, out, scores, lse, H, KVH, kvh, D, bs, scale, window);
}

#include "paged_decode_amx.h"

int paged_decode_bf16(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
                      const int64_t *block_tables, const int64_t *context_lens, uint16_t *out,
                      int B, int H, int KVH, int D, int bs, int max_blocks, float scale,
                      int window, int num_threads) {
    if (D > 1024) return -1;
    if (amx_shape_ok(H / KVH, D) && amx_ready())  /* the scores on the tile unit */
        return decode_groups_amx(q, k_cache, v_cache, block_tables, context_lens, out, B, H, KVH,
                                 D, bs, max_blocks, scale, window, num_threads);
    return decode_groups(group_bf16, 2, q, k_cache, v_cache, block_tables, context_lens, out, B,
                         H, KVH, D, bs, max_blocks, scale, window, num_threads);
}

/* int8 caches (attention/kv_quant.py: [num_blocks, block_size, KVH, D + 4] int8, each row's
 * float32 scale after its values) with float32 (_f32) or bfloat16 (_bf16) q and out, the
 * arguments as paged_decode_f32's. Returns -3 where this build has no kernel for the shape
 * (paged_decode_q8_supported), else as paged_decode_f32. Before them the torch path gathered
 * and dequantized the whole context every layer: ~3 ms a layer at 1000 keys on the 2-core AVX2
 * machine. */
int paged_decode_q8_supported(int H, int KVH, int D) { return q8_shape_ok(H, KVH, D); }

int paged_decode_q8_f32(const float *q, const int8_t *k_cache, const int8_t *v_cache,
                        const int64_t *block_tables, const int64_t *context_lens, float *out,
                        int B, int H, int KVH, int D, int bs, int max_blocks, float scale,
                        int window, int num_threads) {
    if (!q8_shape_ok(H, KVH, D)) return -3;
    return decode_groups(group_q8_f32, 4, q, k_cache, v_cache, block_tables, context_lens, out, B,
                         H, KVH, D, bs, max_blocks, scale, window, num_threads);
}

int paged_decode_q8_bf16(const uint16_t *q, const int8_t *k_cache, const int8_t *v_cache,
                         const int64_t *block_tables, const int64_t *context_lens, uint16_t *out,
                         int B, int H, int KVH, int D, int bs, int max_blocks, float scale,
                         int window, int num_threads) {
    if (!q8_shape_ok(H, KVH, D)) return -3;
    return decode_groups(group_q8_bf16, 2, q, k_cache, v_cache, block_tables, context_lens, out, B,
                         H, KVH, D, bs, max_blocks, scale, window, num_threads);
}
