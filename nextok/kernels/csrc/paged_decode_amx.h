/* Paged decode attention for bfloat16 caches with the scores on the AMX tile unit (Sapphire
 * Rapids and later), included by paged_decode.c after its AVX-512 helpers.
 *
 * Why: with vdpbf16ps a key's score still costs two dot-product instructions per query head and
 * a share of a 16-key transposing sum (one_group_dpbf16), and the rows of a verify step
 * (speculative decoding: rows of one sequence at positions len, len + 1, ...) each paid it alone:
 * the scores were ~60 % of attention at 8 rows. One TDPBF16PS multiplies 16 keys by up to 16
 * query heads over 32 dimensions, so the consecutive rows of one sequence (up to 16 / G of them)
 * go through in one task: each 16-key chunk of K is loaded once into a tile and scored against
 * all their heads at once, and comes out transposed, as [key][head].
 *
 * Per task (a group of R rows of one sequence, one KV head; N = R * G query heads, lane n of a
 * vector = head n, row n / G):
 *   B tiles  q [16 pairs of dimensions][16 heads][2] bfloat16, the tile unit's pairwise layout,
 *            one tile per 32 dimensions, heads past N zero
 *   A tile   16 keys x 32 dimensions, read straight from the paged block (rows KVH * D apart);
 *            a chunk that would run past its block is copied to a zero-padded buffer first
 *   C tile   16 keys x 16 heads float32 -> S[key][head], then scaled and masked per lane (row
 *            n / G sees keys [start, len) of its own), the running max per lane
 *   softmax  exp(s - max) in place, the sum per lane; 1 / sum applied to the outputs
 *   values   float32 FMAs as one_group_dpbf16 (load_pairs, store_pairs), heads in passes of a few
 *            (the accumulators of all N heads do not fit in registers)
 * A head's result depends on its own row only: the tile unit computes every C[key][head] from
 * that key and that head alone, masked keys add exact zeros to the sum and to the outputs (the
 * values of those keys are rows written by the step: finite), so a row alone, in a verify step
 * or in a batch gives the same bits (speculation on == off).
 */
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_PAIRS_MAX 4  /* D <= 128: up to 4 tiles of 32 dimensions */

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tile_config;

/* Linux hands out the tile state only on request, once per process: 1 if it may be used. */
static int amx_ready(void) {
    static int ready = -1;  /* (a benign race: every caller gets the same answer) */
    if (ready < 0) ready = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return ready;
}

/* Tiles 0, 1: A (keys); 2..5: B (queries, one per 32 dimensions); 6: C. All 16 x 64 bytes. */
static void amx_configure(void) {
    amx_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 7; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* The values pass for heads n0 .. n0 + cnt - 1 (cnt <= HP) of the task: keys [s0, s1), weights
 * S[key - s0][head] (zero where masked), out rows as the task's. */
static inline __attribute__((always_inline)) void amx_values(
        const uint16_t *v_cache, const int64_t *table, int64_t s0, int64_t s1, const float *S,
        const float *inv, int n0, int cnt, uint16_t *out, int H, int KVH, int kvh, int bs,
        const int G, const int C2, const int HP) {
    const int D = 32 * C2;
    const int64_t row = (int64_t)KVH * D;
    __m512 acc[20];
    for (int i = 0; i < 2 * HP * C2; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t t0 = s0, n; t0 < s1; t0 += n) {
        n = chunk_len(t0, s1, bs);
        const uint16_t *vb = v_cache + (table[t0 / bs] * bs + t0 % bs) * row + (int64_t)kvh * D;
        const float *p0 = S + (t0 - s0) * 16 + n0;
        for (int i = 0; i < n; i++) {
            __m512 ev[4], od[4];
            for (int c = 0; c < C2; c++) load_pairs(vb + i * row + 32 * c, &ev[c], &od[c]);
            for (int h = 0; h < HP; h++) {
                if (h >= cnt) break;
                const __m512 p = _mm512_set1_ps(p0[i * 16 + h]);
                for (int c = 0; c < C2; c++) {
                    acc[(h * C2 + c) * 2] = _mm512_fmadd_ps(p, ev[c], acc[(h * C2 + c) * 2]);
                    acc[(h * C2 + c) * 2 + 1] = _mm512_fmadd_ps(p, od[c], acc[(h * C2 + c) * 2 + 1]);
                }
            }
        }
    }
    for (int h = 0; h < cnt; h++) {
        const int nh = n0 + h;
        uint16_t *o = out + ((int64_t)(nh / G) * H + (int64_t)kvh * G + nh % G) * D;
        for (int c = 0; c < C2; c++)
            store_pairs(o + 32 * c, acc[(h * C2 + c) * 2], acc[(h * C2 + c) * 2 + 1], _mm512_set1_ps(inv[nh]));
    }
}

/* One task: rows 0 .. R - 1 of q / out ([R][H][D], consecutive rows of one sequence, lens[r] =
 * lens[0] + r), KV head kvh. S: scratch of (max len + 16) x 16 floats; kbuf 16 x D bfloat16;
 * bbuf AMX_PAIRS_MAX x 256 words. */
static inline __attribute__((always_inline)) void amx_group(
        const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, const int64_t *table,
        const int64_t *lens, int R, uint16_t *out, float *S, uint16_t *kbuf, uint32_t *bbuf,
        int H, int KVH, int kvh, int bs, float scale, int window, const int G, const int C2,
        const int HP) {
    const int D = 32 * C2, N = R * G;
    const int64_t row = (int64_t)KVH * D;
    int32_t lo[16], hi[16];  /* lane n's keys: [lo, hi) */
    int64_t s0 = INT64_MAX, s1 = 0;
    for (int n = 0; n < 16; n++) {
        lo[n] = hi[n] = 0;
        if (n >= N) continue;
        const int64_t len = lens[n / G], start = (window > 0 && len > window) ? len - window : 0;
        lo[n] = (int32_t)start;
        hi[n] = (int32_t)len;
        if (start < s0) s0 = start;
        if (len > s1) s1 = len;
    }
    /* B: word j of tile c, column n = head n's dimensions 32c + 2j and 32c + 2j + 1 */
    const uint32_t *qw = (const uint32_t *)q;
    for (int c = 0; c < C2; c++)
        for (int j = 0; j < 16; j++)
            for (int n = 0; n < 16; n++)
                bbuf[(c * 16 + j) * 16 + n] =
                    n < N ? qw[((int64_t)(n / G) * H + (int64_t)kvh * G + n % G) * (D / 2) + 16 * c + j] : 0;
    _tile_loadd(2, bbuf, 64);
    if (C2 > 1) _tile_loadd(3, bbuf + 256, 64);
    if (C2 > 2) {
        _tile_loadd(4, bbuf + 512, 64);
        _tile_loadd(5, bbuf + 768, 64);
    }
    const __m512i vlo = _mm512_loadu_si512(lo), vhi = _mm512_loadu_si512(hi);
    const __m512 vscale = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    __m512 maxv = ninf;
    for (int64_t t0 = s0, n; t0 < s1; t0 += n) {
        n = chunk_len(t0, s1, bs);
        const uint16_t *kb = k_cache + (table[t0 / bs] * bs + t0 % bs) * row + (int64_t)kvh * D;
        size_t stride = (size_t)row * 2;
        if (t0 % bs + 16 > bs) {  /* 16 rows from here would leave the block: copy the chunk */
            for (int i = 0; i < 16; i++) {
                if (i < n) memcpy(kbuf + i * D, kb + i * row, (size_t)D * 2);
                else memset(kbuf + i * D, 0, (size_t)D * 2);
            }
            kb = kbuf;
            stride = (size_t)D * 2;
        }
        _tile_zero(6);
        _tile_loadd(0, kb, stride);
        _tile_dpbf16ps(6, 0, 2);
        if (C2 > 1) {
            _tile_loadd(1, kb + 32, stride);
            _tile_dpbf16ps(6, 1, 3);
        }
        if (C2 > 2) {
            _tile_loadd(0, kb + 64, stride);
            _tile_dpbf16ps(6, 0, 4);
            _tile_loadd(1, kb + 96, stride);
            _tile_dpbf16ps(6, 1, 5);
        }
        float *st = S + (t0 - s0) * 16;
        _tile_stored(6, st, 64);  /* 16 keys' rows; those past n are overwritten next chunk */
        for (int i = 0; i < n; i++) {
            const __m512i t = _mm512_set1_epi32((int)(t0 + i));
            const __mmask16 live = _mm512_cmpge_epi32_mask(t, vlo) & _mm512_cmplt_epi32_mask(t, vhi);
            const __m512 s = _mm512_mask_mul_ps(ninf, live, _mm512_loadu_ps(st + 16 * i), vscale);
            _mm512_storeu_ps(st + 16 * i, s);
            maxv = _mm512_max_ps(maxv, s);
        }
    }
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < s1 - s0; t++) {  /* masked keys: exp(-inf) = 0 */
        const __m512 e = exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(S + t * 16), maxv));
        _mm512_storeu_ps(S + t * 16, e);
        sum = _mm512_add_ps(sum, e);
    }
    float inv[16];
    _mm512_storeu_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.f), sum));
    for (int n0 = 0; n0 < N; n0 += HP)
        amx_values(v_cache, table, s0, s1, S, inv, n0, N - n0 < HP ? N - n0 : HP, out, H, KVH, kvh,
                   bs, G, C2, HP);
}

/* Supported shapes: D = 32 * C2 (C2 = 1, 2, 4), G <= 16 query heads a KV head. */
static int amx_shape_ok(int G, int D) {
    return (D == 32 || D == 64 || D == 128) && G >= 1 && G <= 16;
}

static void amx_task(const uint16_t *q, const uint16_t *k, const uint16_t *v, const int64_t *table,
                     const int64_t *lens, int R, uint16_t *out, float *S, uint16_t *kbuf,
                     uint32_t *bbuf, int H, int KVH, int kvh, int D, int bs, float scale, int window) {
    const int G = H / KVH;
    switch (D) {  /* HP: heads a values pass, their accumulators in <= 20 registers */
    case 32: amx_group(q, k, v, table, lens, R, out, S, kbuf, bbuf, H, KVH, kvh, bs, scale, window, G, 1, 8); break;
    case 64: amx_group(q, k, v, table, lens, R, out, S, kbuf, bbuf, H, KVH, kvh, bs, scale, window, G, 2, 5); break;
    default: amx_group(q, k, v, table, lens, R, out, S, kbuf, bbuf, H, KVH, kvh, bs, scale, window, G, 4, 2); break;
    }
}

/* Rows b .. b + R - 1 form a group when they share a block table and their lengths go up by
 * one (a verify step's rows), at most 16 / G of them. Returns 0, or -1 (no scratch memory). */
static int decode_groups_amx(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
                             const int64_t *block_tables, const int64_t *context_lens,
                             uint16_t *out, int B, int H, int KVH, int D, int bs, int max_blocks,
                             float scale, int window, int num_threads) {
    const int G = H / KVH, rmax = 16 / G;
    int *first = malloc(sizeof(int) * (size_t)(B + 1));  /* group i: rows first[i] .. first[i + 1] - 1 */
    if (!first) return -1;
    int groups = 0;
    int64_t max_len = 1;
    for (int b = 0; b < B; b++) {
        if (context_lens[b] > max_len) max_len = context_lens[b];
        const int joins = b > 0 && b - first[groups - 1] < rmax
            && context_lens[b] == context_lens[b - 1] + 1
            && !memcmp(block_tables + (int64_t)b * max_blocks, block_tables + (int64_t)(b - 1) * max_blocks,
                       sizeof(int64_t) * (size_t)max_blocks);
        if (!joins) first[groups++] = b;
    }
    first[groups] = B;
    int failed = 0;
#pragma omp parallel num_threads(num_threads)
    {
        float *S = malloc(sizeof(float) * 16 * (size_t)(max_len + 16));
        uint16_t *kbuf = malloc(sizeof(uint16_t) * 16 * (size_t)D);
        uint32_t *bbuf = aligned_alloc(64, sizeof(uint32_t) * 256 * AMX_PAIRS_MAX);
        if (!S || !kbuf || !bbuf) {
#pragma omp atomic write
            failed = 1;
        } else {
            amx_configure();
        }
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < groups * KVH; task++) {
            if (!S || !kbuf || !bbuf) continue;
            const int g = task / KVH, kvh = task % KVH, b = first[g];
            const int64_t seq = (int64_t)b * H * D;
            amx_task(q + seq, k_cache, v_cache, block_tables + (int64_t)b * max_blocks, context_lens + b,
                     first[g + 1] - b, out + seq, S, kbuf, bbuf, H, KVH, kvh, D, bs, scale, window);
        }
        if (S && kbuf && bbuf) _tile_release();
        free(S);
        free(kbuf);
        free(bbuf);
    }
    free(first);
    return failed ? -1 : 0;
}
#else
static int amx_ready(void) { return 0; }
static int amx_shape_ok(int G, int D) { return 0; }
static int decode_groups_amx(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
                             const int64_t *block_tables, const int64_t *context_lens,
                             uint16_t *out, int B, int H, int KVH, int D, int bs, int max_blocks,
                             float scale, int window, int num_threads) {
    return -1;
}
#endif
