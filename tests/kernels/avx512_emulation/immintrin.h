/* The AVX-512 intrinsics csrc/gguf_rows16.c's AVX-512 VNNI kernel and csrc/paged_decode.c's
 * AVX-512 attention kernel (one_group_512) use, in plain C, lane by lane, so their code can run
 * (slowly) and be checked on a CPU without AVX-512 (tests/kernels/test_cpu_gguf_int8.py and
 * test_cpu_attention.py build them with -I this folder and the AVX-512 macros defined, instead
 * of the compiler's own immintrin.h). Each function does what Intel's guide
 * says of its instruction for the operands the kernel gives it: conversions round to nearest
 * even, vpmov* truncate, vpdpbusd wraps, fmadd rounds once (build with -ffp-contract=off so that
 * mul_ps and add do not fuse where the hardware would not). */
#ifndef NEXTOK_AVX512_EMULATION_H
#define NEXTOK_AVX512_EMULATION_H

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef union { float f[16]; int32_t i[16]; uint32_t u[16]; uint16_t h[32]; uint8_t b[64]; double d[8]; } __m512, __m512i, __m512d;
typedef union { int32_t i[8]; uint16_t h[16]; uint8_t b[32]; } __m256i;
typedef union { int32_t i[4]; uint8_t b[16]; int8_t s[16]; } __m128i;
typedef uint16_t __mmask16;

#define LANES(body) for (int l = 0; l < 16; l++) { body; }

static inline __m512 _mm512_setzero_ps(void) { __m512 r; memset(&r, 0, sizeof r); return r; }
static inline __m512i _mm512_setzero_si512(void) { return _mm512_setzero_ps(); }
static inline __m512 _mm512_set1_ps(float a) { __m512 r; LANES(r.f[l] = a); return r; }
static inline __m512i _mm512_set1_epi32(int a) { __m512i r; LANES(r.i[l] = a); return r; }
static inline __m512 _mm512_loadu_ps(const void *p) { __m512 r; memcpy(&r, p, 64); return r; }
static inline __m512i _mm512_loadu_si512(const void *p) { __m512i r; memcpy(&r, p, 64); return r; }
static inline __m256i _mm256_loadu_si256(const void *p) { __m256i r; memcpy(&r, p, 32); return r; }
static inline __m128i _mm_loadu_si128(const void *p) { __m128i r; memcpy(&r, p, 16); return r; }
static inline __m128i _mm_loadu_si32(const void *p) { __m128i r; memset(&r, 0, 16); memcpy(&r, p, 4); return r; }
static inline void _mm_storeu_si128(void *p, __m128i a) { memcpy(p, &a, 16); }
static inline __m512 _mm512_castsi512_ps(__m512i a) { return a; }
static inline __m512i _mm512_castps_si512(__m512 a) { return a; }

static inline __m512 _mm512_mul_ps(__m512 a, __m512 b) { __m512 r; LANES(r.f[l] = a.f[l] * b.f[l]); return r; }
static inline __m512 _mm512_max_ps(__m512 a, __m512 b) { __m512 r; LANES(r.f[l] = a.f[l] > b.f[l] ? a.f[l] : b.f[l]); return r; }
static inline __m512 _mm512_abs_ps(__m512 a) { __m512 r; LANES(r.u[l] = a.u[l] & 0x7fffffffu); return r; }
static inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) { __m512 r; LANES(r.f[l] = fmaf(a.f[l], b.f[l], c.f[l])); return r; }
static inline float _mm512_reduce_max_ps(__m512 a) { float m = a.f[0]; LANES(m = a.f[l] > m ? a.f[l] : m); return m; }

static inline __m512i _mm512_add_epi32(__m512i a, __m512i b) { __m512i r; LANES(r.u[l] = a.u[l] + b.u[l]); return r; }
static inline __m512i _mm512_sub_epi32(__m512i a, __m512i b) { __m512i r; LANES(r.u[l] = a.u[l] - b.u[l]); return r; }
static inline __m512i _mm512_and_si512(__m512i a, __m512i b) { __m512i r; LANES(r.u[l] = a.u[l] & b.u[l]); return r; }
static inline __m512i _mm512_or_si512(__m512i a, __m512i b) { __m512i r; LANES(r.u[l] = a.u[l] | b.u[l]); return r; }
static inline __m512i _mm512_srli_epi32(__m512i a, unsigned n) { __m512i r; LANES(r.u[l] = n > 31 ? 0 : a.u[l] >> n); return r; }
static inline __m512i _mm512_slli_epi32(__m512i a, unsigned n) { __m512i r; LANES(r.u[l] = n > 31 ? 0 : a.u[l] << n); return r; }
static inline int _mm512_reduce_add_epi32(__m512i a) { uint32_t s = 0; LANES(s += a.u[l]); return (int)s; }
static inline __m512i _mm512_broadcastd_epi32(__m128i a) { __m512i r; LANES(r.i[l] = a.i[0]); return r; }

/* vpdpbusd: each lane adds the 4 products of a's unsigned bytes and b's signed bytes */
static inline __m512i _mm512_dpbusd_epi32(__m512i src, __m512i a, __m512i b) {
    __m512i r;
    LANES(uint32_t s = src.u[l];
          for (int t = 0; t < 4; t++) s += (uint32_t)((int32_t)a.b[4 * l + t] * (int32_t)(int8_t)b.b[4 * l + t]);
          r.u[l] = s);
    return r;
}

static inline __m512 _mm512_cvtepi32_ps(__m512i a) { __m512 r; LANES(r.f[l] = (float)a.i[l]); return r; }
static inline __m512i _mm512_cvtps_epi32(__m512 a) { __m512i r; LANES(r.i[l] = (int32_t)nearbyintf(a.f[l])); return r; }
static inline __m512 _mm512_cvtph_ps(__m256i a) {
    __m512 r;
    LANES(_Float16 h; memcpy(&h, &a.h[l], 2); r.f[l] = (float)h);
    return r;
}
static inline __m512i _mm512_cvtepu8_epi32(__m128i a) { __m512i r; LANES(r.i[l] = a.b[l]); return r; }
static inline __m512i _mm512_cvtepi8_epi32(__m128i a) { __m512i r; LANES(r.i[l] = a.s[l]); return r; }
static inline __m512i _mm512_cvtepu16_epi32(__m256i a) { __m512i r; LANES(r.i[l] = a.h[l]); return r; }
static inline __m256i _mm512_cvtepi32_epi16(__m512i a) { __m256i r; LANES(r.h[l] = (uint16_t)a.u[l]); return r; }
static inline __m128i _mm512_cvtepi32_epi8(__m512i a) { __m128i r; LANES(r.b[l] = (uint8_t)a.u[l]); return r; }

static inline void _mm512_mask_storeu_ps(void *p, __mmask16 k, __m512 a) {
    LANES(if (k >> l & 1) memcpy((float *)p + l, &a.f[l], 4));
}
static inline void _mm256_mask_storeu_epi16(void *p, __mmask16 k, __m256i a) {
    LANES(if (k >> l & 1) memcpy((uint16_t *)p + l, &a.h[l], 2));
}

/* one_group_512's transposing sum and running maxima */
#define _MM_SHUFFLE(a, b, c, d) (((a) << 6) | ((b) << 4) | ((c) << 2) | (d))
static inline __m512d _mm512_castps_pd(__m512 a) { return a; }
static inline __m512 _mm512_castpd_ps(__m512d a) { return a; }
static inline __m512 _mm512_add_ps(__m512 a, __m512 b) { __m512 r; LANES(r.f[l] = a.f[l] + b.f[l]); return r; }
static inline void _mm512_storeu_ps(void *p, __m512 a) { memcpy(p, &a, 64); }
static inline void _mm256_storeu_si256(void *p, __m256i a) { memcpy(p, &a, 32); }
static inline __m512 _mm512_mask_max_ps(__m512 src, __mmask16 k, __m512 a, __m512 b) {
    __m512 r;
    LANES(r.f[l] = (k >> l & 1) ? (a.f[l] > b.f[l] ? a.f[l] : b.f[l]) : src.f[l]);
    return r;
}
/* per 128-bit lane j: unpacklo [a0 b0 a1 b1], unpackhi [a2 b2 a3 b3] (floats of that lane) */
static inline __m512 _mm512_unpacklo_ps(__m512 a, __m512 b) {
    __m512 r;
    for (int j = 0; j < 4; j++) {
        r.f[4 * j] = a.f[4 * j], r.f[4 * j + 1] = b.f[4 * j];
        r.f[4 * j + 2] = a.f[4 * j + 1], r.f[4 * j + 3] = b.f[4 * j + 1];
    }
    return r;
}
static inline __m512 _mm512_unpackhi_ps(__m512 a, __m512 b) {
    __m512 r;
    for (int j = 0; j < 4; j++) {
        r.f[4 * j] = a.f[4 * j + 2], r.f[4 * j + 1] = b.f[4 * j + 2];
        r.f[4 * j + 2] = a.f[4 * j + 3], r.f[4 * j + 3] = b.f[4 * j + 3];
    }
    return r;
}
/* per 128-bit lane j: unpacklo [a0 b0], unpackhi [a1 b1] (doubles of that lane) */
static inline __m512d _mm512_unpacklo_pd(__m512d a, __m512d b) {
    __m512d r;
    for (int j = 0; j < 4; j++) r.d[2 * j] = a.d[2 * j], r.d[2 * j + 1] = b.d[2 * j];
    return r;
}
static inline __m512d _mm512_unpackhi_pd(__m512d a, __m512d b) {
    __m512d r;
    for (int j = 0; j < 4; j++) r.d[2 * j] = a.d[2 * j + 1], r.d[2 * j + 1] = b.d[2 * j + 1];
    return r;
}
/* 128-bit lanes: a's imm[1:0], a's imm[3:2], b's imm[5:4], b's imm[7:6] */
static inline __m512 _mm512_shuffle_f32x4(__m512 a, __m512 b, int imm) {
    __m512 r;
    for (int j = 0; j < 4; j++) memcpy(&r.f[4 * j], &(j < 2 ? a : b).f[4 * (imm >> (2 * j) & 3)], 16);
    return r;
}

#undef LANES
#endif
