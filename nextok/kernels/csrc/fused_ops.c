/* The elementwise parts of a decoder layer, float32 and bfloat16, one call each instead of 5-10
 * torch ops.
 *
 * At decode-sized steps (1-8 tokens of a 576-wide model) every torch op costs 3-15 us of
 * dispatch and allocation whatever its size, and a layer runs ~40 of them: 11 ms of a 30 ms
 * token at batch 1, against 16 ms of matmul. These kernels take raw pointers through ctypes.
 *
 *   add_rms_norm  residual [T, D] += x (optional); out [T, D] = rms_norm(residual) * w
 *   silu_mul      gate_up [T, 2I] -> out [T, I] = silu(gate) * up
 *   rope_neox     rows of qkv [T, stride]: heads [0, n_heads) of D, rotate-half RoPE in place,
 *                 cos/sin [T, D/2]
 *   store_kv_rows each row's k heads and v heads of qkv (after the q heads) into the caches'
 *                 rows [N * block_size, KVH * D] at slots [T] (-1: not stored)
 *   store_kv_q8_rows the same into int8 caches (--kv-cache-dtype int8), each head's D values
 *                 quantized to a row of D int8 and a float32 scale
 * Rows are split over threads only when a step has enough of them to pay for waking them.
 */
#include <math.h>
#include <string.h>
#include <stddef.h>
#include <stdint.h>

#define PAR_ROWS 32 /* below this many rows, one thread: waking the pool costs more */

static float sum_squares(const float *x, int d) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= d; i += 8)
#pragma omp simd
        for (int j = 0; j < 8; j++) acc[j] += x[i + j] * x[i + j];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < d; i++) s += x[i] * x[i];
    return s;
}

void add_rms_norm_f32(const float *x, float *residual, const float *w, int rows, int d,
                      float eps, float *out, int add, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows >= PAR_ROWS) schedule(static)
    for (int t = 0; t < rows; t++) {
        float *r = residual + (size_t)t * d;
        if (add) {
            const float *xt = x + (size_t)t * d;
#pragma omp simd
            for (int i = 0; i < d; i++) r[i] += xt[i];
        }
        const float inv = 1.0f / sqrtf(sum_squares(r, d) / (float)d + eps);
        float *o = out + (size_t)t * d;
#pragma omp simd
        for (int i = 0; i < d; i++) o[i] = (r[i] * inv) * w[i];
    }
}

/* exp(x) on 16 lanes for silu: x clamped to [-87, 88] (exp stays a normal float; silu's
 * g / (1 + exp(-g)) is then g or -0 to float rounding), x = k ln2 + r with k rounded to nearest
 * (|r| <= ln2 / 2), exp(r) by its degree-7 Taylor polynomial (relative error ~1e-7, float32
 * rounding), 2^k through the exponent bits. glibc's expf is called one lane at a time here (its
 * vector versions need -ffast-math), ~2 us a 1536-wide row, which each verify row paid. */
typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int v16i __attribute__((vector_size(64)));

static inline v16 exp16(v16 x) {
    const v16 zero = {0};
    const v16i lo = x < -87.f, hi = x > 88.f;  /* all ones where x is out of range */
    x = (v16)(((v16i)x & ~(lo | hi)) | ((v16i)(zero - 87.f) & lo) | ((v16i)(zero + 88.f) & hi));
    const v16 kf = (x * 1.44269504f + 12582912.f) - 12582912.f;  /* round to nearest */
    const v16 r = (x - kf * 0.693359375f) + kf * 2.12194440e-4f;  /* ln2 split in two */
    v16 p = zero + 1.f / 5040.f;
    p = p * r + 1.f / 720.f;
    p = p * r + 1.f / 120.f;
    p = p * r + 1.f / 24.f;
    p = p * r + 1.f / 6.f;
    p = p * r + 0.5f;
    p = p * r + 1.f;
    p = p * r + 1.f;
    const v16i bits = (__builtin_convertvector(kf, v16i) + 127) << 23;
    return p * (v16)bits;
}

void silu_mul_f32(const float *gate_up, int rows, int inter, float *out, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows >= PAR_ROWS) schedule(static)
    for (int t = 0; t < rows; t++) {
        const float *g = gate_up + (size_t)t * 2 * inter, *u = g + inter;
        float *o = out + (size_t)t * inter;
        int i = 0;
        for (; i + 16 <= inter; i += 16) {
            const v16 gv = *(const v16 *)(g + i);
            *(v16 *)(o + i) = gv / (1.0f + exp16(-gv)) * *(const v16 *)(u + i);
        }
        for (; i < inter; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

void rope_neox_f32(float *qkv, int rows, int stride, int n_heads, int d, const float *cos,
                   const float *sin, int num_threads) {
    const int half = d / 2;
#pragma omp parallel for num_threads(num_threads) if (rows >= PAR_ROWS) schedule(static)
    for (int t = 0; t < rows; t++) {
        const float *c = cos + (size_t)t * half, *s = sin + (size_t)t * half;
        for (int h = 0; h < n_heads; h++) {
            float *x1 = qkv + (size_t)t * stride + (size_t)h * d, *x2 = x1 + half;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                const float a = x1[i], b = x2[i];
                x1[i] = a * c[i] - b * s[i];
                x2[i] = b * c[i] + a * s[i];
            }
        }
    }
}

/* bfloat16 (raw uint16_t bits), with the torch path's roundings (kernels/ref.py): the residual
 * sum rounds to bf16; the norm's statistics in float32, the normalized row rounded to bf16 before
 * the weight multiplies it (and that product rounded); silu rounds before the product; each
 * RoPE product rounds before their sum. Rows are converted to float32 on the stack. */
static inline float bf2f(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}

static inline uint16_t f2bf(float f) {  /* round to nearest even, as torch's .to(bfloat16) */
    union { float f; uint32_t u; } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);  /* NaN */
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

static inline float rbf(float f) { return bf2f(f2bf(f)); }

void add_rms_norm_bf16(const uint16_t *x, uint16_t *residual, const uint16_t *w, int rows, int d,
                       float eps, uint16_t *out, int add, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows >= PAR_ROWS) schedule(static)
    for (int t = 0; t < rows; t++) {
        uint16_t *r = residual + (size_t)t * d;
        float rf[d];
        if (add) {
            const uint16_t *xt = x + (size_t)t * d;
            for (int i = 0; i < d; i++) {
                r[i] = f2bf(bf2f(r[i]) + bf2f(xt[i]));
                rf[i] = bf2f(r[i]);
            }
        } else {
            for (int i = 0; i < d; i++) rf[i] = bf2f(r[i]);
        }
        const float inv = 1.0f / sqrtf(sum_squares(rf, d) / (float)d + eps);
        uint16_t *o = out + (size_t)t * d;
        for (int i = 0; i < d; i++) o[i] = f2bf(rbf(rf[i] * inv) * bf2f(w[i]));
    }
}

/* 16 bfloat16 <-> float32 (rounded to nearest even; NaN stays NaN, quiet) */
typedef uint16_t v16h __attribute__((vector_size(32), aligned(2)));
typedef unsigned v16u __attribute__((vector_size(64)));

static inline v16 load_bf16x16(const uint16_t *p) {
    v16h h;
    memcpy(&h, p, 32);
    return (v16)(__builtin_convertvector(h, v16u) << 16);
}

static inline v16 round_bf16x16(v16 f) {
    const v16u u = (v16u)f;
    const v16u nan = (v16u)((u & 0x7fffffffu) > 0x7f800000u);
    const v16u r = ((u + 0x7fffu + ((u >> 16) & 1u)) & ~nan) | ((u | 0x400000u) & nan);
    return (v16)(r & 0xffff0000u);
}

static inline void store_bf16x16(uint16_t *p, v16 f) {
    const v16h h = __builtin_convertvector((v16u)round_bf16x16(f) >> 16, v16h);
    memcpy(p, &h, 32);
}

/* 16 lanes at a time, exp16 for expf (~1e-7 apart before silu's rounding to bf16): a 1536-wide
 * row cost ~8 us one expf at a time, which each row of a verify step paid in each layer. */
void silu_mul_bf16(const uint16_t *gate_up, int rows, int inter, uint16_t *out, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows >= PAR_ROWS) schedule(static)
    for (int t = 0; t < rows; t++) {
        const uint16_t *g = gate_up + (size_t)t * 2 * inter, *u = g + inter;
        uint16_t *o = out + (size_t)t * inter;
        int i = 0;
        for (; i + 16 <= inter; i += 16) {
            const v16 gv = load_bf16x16(g + i);
            store_bf16x16(o + i, round_bf16x16(gv / (1.0f + exp16(-gv))) * load_bf16x16(u + i));
        }
        for (; i < inter; i++) {
            const float gf = bf2f(g[i]);
            o[i] = f2bf(rbf(gf / (1.0f + expf(-gf))) * bf2f(u[i]));
        }
    }
}

void rope_neox_bf16(uint16_t *qkv, int rows, int stride, int n_heads, int d, const uint16_t *cos,
                    const uint16_t *sin, int num_threads) {
    const int half = d / 2;
#pragma omp parallel for num_threads(num_threads) if (rows >= PAR_ROWS) schedule(static)
    for (int t = 0; t < rows; t++) {
        const uint16_t *c = cos + (size_t)t * half, *s = sin + (size_t)t * half;
        for (int h = 0; h < n_heads; h++) {
            uint16_t *x1 = qkv + (size_t)t * stride + (size_t)h * d, *x2 = x1 + half;
            for (int i = 0; i < half; i++) {
                const float a = bf2f(x1[i]), b = bf2f(x2[i]), ci = bf2f(c[i]), si = bf2f(s[i]);
                x1[i] = f2bf(rbf(a * ci) - rbf(b * si));
                x2[i] = f2bf(rbf(b * ci) + rbf(a * si));
            }
        }
    }
}

/* A step's new keys and values into the paged caches, rows of `kv_bytes` bytes (KVH * D values
 * of either dtype): the k heads start at byte `k_off` of each qkv row, the v heads right after.
 * After rope_neox, this is the KV store of a layer without the two index_copy_ calls (~12 us a
 * layer at one token on the AVX2 machine, of a ~16 ms step). Returns -1 for a slot past the
 * caches' rows. */
int store_kv_rows(const char *qkv, int rows, long stride_bytes, long k_off, long kv_bytes,
                  char *k_cache, char *v_cache, const int64_t *slots, int64_t cache_rows) {
    for (int t = 0; t < rows; t++)  /* checked first: nothing is written for a bad slot */
        if (slots[t] >= cache_rows) return -1;
    for (int t = 0; t < rows; t++) {
        const int64_t s = slots[t];
        if (s < 0) continue;
        const char *k = qkv + (size_t)t * stride_bytes + k_off;
        memcpy(k_cache + (size_t)s * kv_bytes, k, (size_t)kv_bytes);
        memcpy(v_cache + (size_t)s * kv_bytes, k + kv_bytes, (size_t)kv_bytes);
    }
    return 0;
}

/* value i of x: float32 (elem 4) or bfloat16 bits (elem 2) */
static inline float value_of(const char *x, int i, int elem) {
    return elem == 4 ? ((const float *)x)[i] : bf2f(((const uint16_t *)x)[i]);
}

/* One head's d values (float32, elem 4, or bfloat16, elem 2) -> d int8 and a float32 scale, as
 * attention/kv_quant.py's quantize_rows: s = max|x| / 127 (1 where that is 0), q = x / s rounded
 * half to even and clamped to +-127 (the same float32 operations: the same bytes). */
static void quantize_row_q8(const char *x, int d, int elem, int8_t *dst) {
    float amax = 0.f;
    for (int i = 0; i < d; i++) amax = fmaxf(amax, fabsf(value_of(x, i, elem)));
    float s = amax / 127.f;
    if (!(s > 0.f)) s = 1.f;
    for (int i = 0; i < d; i++) {
        const float q = rintf(value_of(x, i, elem) / s);
        dst[i] = (int8_t)(q > 127.f ? 127.f : q < -127.f ? -127.f : q);
    }
    memcpy(dst + d, &s, sizeof s);
}

/* store_kv_rows for int8 caches [N * block_size, KVH, D + 4]: the k heads at k_off bytes into
 * each row of qkv, the v heads right after them. Returns 0, or -1 (nothing written) for a slot
 * past the caches. */
int store_kv_q8_rows(const char *qkv, int rows, long stride_bytes, long k_off, int kv_heads, int d,
                     int elem, char *k_cache, char *v_cache, const int64_t *slots, int64_t cache_rows) {
    for (int t = 0; t < rows; t++)
        if (slots[t] >= cache_rows) return -1;
    const size_t head = (size_t)d * elem, row = (size_t)d + 4;
    for (int t = 0; t < rows; t++) {
        const int64_t s = slots[t];
        if (s < 0) continue;
        const char *k = qkv + (size_t)t * stride_bytes + k_off, *v = k + kv_heads * head;
        for (int h = 0; h < kv_heads; h++) {
            quantize_row_q8(k + h * head, d, elem, (int8_t *)k_cache + ((size_t)s * kv_heads + h) * row);
            quantize_row_q8(v + h * head, d, elem, (int8_t *)v_cache + ((size_t)s * kv_heads + h) * row);
        }
    }
    return 0;
}
