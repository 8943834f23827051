/* What the GGUF block kernels share (gguf_matmul.c: Q4_0, Q4_1, Q8_0; gguf_kquants.c: K-quants):
 * the half-float read, the 8-wide float vector, and the int8 quantization of activations.
 * cpu_build.py keys its cache by this header too. */
#ifndef NEXTOK_GGUF_COMMON_H
#define NEXTOK_GGUF_COMMON_H

#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

typedef float v8 __attribute__((vector_size(32), aligned(4)));

#define MAX_ROWS 8  /* rows of x per float32-kernel call: the accumulators stay in registers */

/* The 32-weight block types (ggml type ids) and their bytes per block; 0 for any other type. */
enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8 };

static inline int block_bytes_of(int type) {
    return type == Q4_0 ? 18 : type == Q4_1 ? 20 : type == Q5_0 ? 22 : type == Q5_1 ? 24
         : type == Q8_0 ? 34 : 0;
}

static inline float hsum(v8 v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* IEEE half -> float, exact (F16C's vcvtph2ps where -march=native has it). */
static inline float half_to_float(const uint8_t *p) {
    _Float16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

/* One 32-value block of activations -> int8, as llama.cpp's Q8 activations:
 * d = max|x| / 127, q = round(x / d) (x * (1 / d), rounded half to even). Returns sum(q). */
static inline int quantize_x_block(const float *xp, int8_t *qp, float *d_out) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xp[j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        const int q = (int)nearbyintf(xp[j] * id);
        qp[j] = (int8_t)q;
        sum += q;
    }
    *d_out = d;
    return sum;
}

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* i32 lanes of sum over groups of 4 of u8 a * s8 b (a: unpacked weights, or |q_w|). */
static inline __m256i dot_u8s8(__m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b);
#else
    /* u8 * s8 pairs fit in i16: 2 * 63 * 127 (6-bit weights) or 2 * 128 * 127 (Q8_0's |q_w|) < 32767 */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

#endif
