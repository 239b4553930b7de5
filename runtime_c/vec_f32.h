/* vec_f32.h: the f32 arithmetic the kernels share, each function with one order of operations
 * that every build follows: the scalar code (any CPU), AVX2 and AVX-512 compute the same bits.
 *
 * That is the runtime's rule for floats, as batch invariance is its rule for rows: a value may
 * not depend on the instruction set that computed it. So each function below fixes where every
 * rounding happens (which products are fused into an add, how partial sums are laid out and in
 * what order they meet), and its vector body and its scalar body are two spellings of that one
 * definition. The runtime is compiled with -ffp-contract=off, so the compiler fuses nothing on
 * its own; where a definition says fma, the code says fmaf or an fma intrinsic.
 */
#ifndef KILN_VEC_F32_H
#define KILN_VEC_F32_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fp16.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KILN_AVX2 1
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define KILN_NEON 1
#include <arm_neon.h>
#endif

/* -- e^x ------------------------------------------------------------------------------------
 * x = k ln2 + r with k = rint(x log2 e), |r| <= ln2/2 (ln2 in two parts, so k ln2 is exact);
 * e^r by its degree-6 Taylor polynomial in Horner's order, each step an fma; 2^k through the
 * exponent bits. Inputs are clamped to [-87, 88]; below -87, -inf and NaN give 0. Relative error
 * < 2e-7 over the range. */
#define KILN_EXP_LOG2E 1.44269504f
#define KILN_EXP_LN2_HI 0.693145752f
#define KILN_EXP_LN2_LO 1.42860677e-6f

static inline float kiln_expf(float x) {
    if (!(x >= -87.0f)) return 0.0f;
    x = x < 88.0f ? x : 88.0f;
    const float k = rintf(x * KILN_EXP_LOG2E);
    float r = fmaf(-k, KILN_EXP_LN2_HI, x);
    r = fmaf(-k, KILN_EXP_LN2_LO, r);
    float p = 1.0f / 720;
    p = fmaf(p, r, 1.0f / 120);
    p = fmaf(p, r, 1.0f / 24);
    p = fmaf(p, r, 1.0f / 6);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    const uint32_t bits = (uint32_t)((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* -- tanh ------------------------------------------------------------------------------------
 * |x| < 0.625: x + x^3 P(x^2), Cephes' tanhf polynomial in Horner's order (each step an fma), then
 * fma(P(x^2) x^2, x, x); else 1 - 2 / (e^2|x| + 1) with kiln_expf, x's sign put back. A vector
 * computes both and keeps, lane by lane, the one the scalar code takes. Relative error < 3e-7. */
#define KILN_TANH_P0 (-5.70498872745e-3f)
#define KILN_TANH_P1 2.06390887954e-2f
#define KILN_TANH_P2 (-5.37397155531e-2f)
#define KILN_TANH_P3 1.33314422036e-1f
#define KILN_TANH_P4 (-3.33332819422e-1f)

static inline float kiln_tanhf(float x) {
    const float a = fabsf(x);
    if (a < 0.625f) {
        const float z = x * x;
        float p = KILN_TANH_P0;
        p = fmaf(p, z, KILN_TANH_P1);
        p = fmaf(p, z, KILN_TANH_P2);
        p = fmaf(p, z, KILN_TANH_P3);
        p = fmaf(p, z, KILN_TANH_P4);
        return fmaf(p * z, x, x);
    }
    return copysignf(1.0f - 2.0f / (kiln_expf(2.0f * a) + 1.0f), x);
}

/* -- a norm's sums ---------------------------------------------------------------------------
 * In double, as ggml sums a norm's row (long rows of large values lose bits in f32): eight partial
 * sums, element i into sum i % 8, then added in order; one fixed order per row that the compiler
 * can run eight lanes wide. `squares`: of (x - centre)^2 (centre 0: RMSNorm's; the mean: a
 * LayerNorm's variance, never E[x^2] - mean^2, which cancels); else of x. */
static inline double kiln_sum8_double(const float *x, int n, int squares, double centre) {
    double part[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) {
            const double d = (double)x[i + k] - centre;
            part[k] += squares ? d * d : d;
        }
    for (; i < n; i++) {
        const double d = (double)x[i] - centre;
        part[i % 8] += squares ? d * d : d;
    }
    double sum = 0.0;
    for (int k = 0; k < 8; k++) sum += part[k];
    return sum;
}

/* -- sums of eight lanes ---------------------------------------------------------------------
 * Eight partial sums s[0..7] meet as ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)): what a
 * 256-bit register folds to by halves. */
static inline float kiln_hsum8_ref(const float s[8]) {
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

#ifdef KILN_AVX2
static inline float kiln_hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static inline __m256 kiln_exp8(__m256 x) {
    const __m256 visible = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(KILN_EXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(KILN_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(KILN_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), visible);
}

#if defined(__AVX512F__)
/* kiln_exp8's operations sixteen lanes at a time: each lane the same bits */
static inline __m512 kiln_exp16(__m512 x) {
    const __mmask16 visible = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(KILN_EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(KILN_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(KILN_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps(visible, _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}
#endif
#endif

#ifdef KILN_NEON
/* the eight-lane sum of s[0..3] in lo, s[4..7] in hi */
static inline float kiln_hsum4x2(float32x4_t lo, float32x4_t hi) {
    const float32x4_t t = vaddq_f32(lo, hi);
    const float32x2_t u = vadd_f32(vget_low_f32(t), vget_high_f32(t));
    return vget_lane_f32(u, 0) + vget_lane_f32(u, 1);
}

static inline float32x4_t kiln_exp4(float32x4_t x) {
    const uint32x4_t visible = vcgeq_f32(x, vdupq_n_f32(-87.0f));
    x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(88.0f)), vdupq_n_f32(-87.0f));
    const float32x4_t k = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(KILN_EXP_LOG2E)));
    float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(KILN_EXP_LN2_HI));
    r = vfmsq_f32(r, k, vdupq_n_f32(KILN_EXP_LN2_LO));
    float32x4_t p = vdupq_n_f32(1.0f / 720);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23);
    const float32x4_t v = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), visible));
}
#endif

#ifdef KILN_AVX2
static inline __m256 kiln_tanh8(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f), a = _mm256_andnot_ps(sign, x), z = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(KILN_TANH_P0);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(KILN_TANH_P1));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(KILN_TANH_P2));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(KILN_TANH_P3));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(KILN_TANH_P4));
    const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
    const __m256 e = kiln_exp8(_mm256_add_ps(a, a));
    const __m256 t = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    const __m256 large = _mm256_or_ps(t, _mm256_and_ps(sign, x));
    return _mm256_blendv_ps(large, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
}
#endif

#ifdef KILN_NEON
static inline float32x4_t kiln_tanh4(float32x4_t x) {
    const float32x4_t a = vabsq_f32(x), z = vmulq_f32(x, x);
    float32x4_t p = vdupq_n_f32(KILN_TANH_P0);
    p = vfmaq_f32(vdupq_n_f32(KILN_TANH_P1), p, z);
    p = vfmaq_f32(vdupq_n_f32(KILN_TANH_P2), p, z);
    p = vfmaq_f32(vdupq_n_f32(KILN_TANH_P3), p, z);
    p = vfmaq_f32(vdupq_n_f32(KILN_TANH_P4), p, z);
    const float32x4_t small = vfmaq_f32(x, vmulq_f32(p, z), x);
    const float32x4_t e = kiln_exp4(vaddq_f32(a, a));
    const float32x4_t t = vsubq_f32(vdupq_n_f32(1.0f), vdivq_f32(vdupq_n_f32(2.0f), vaddq_f32(e, vdupq_n_f32(1.0f))));
    const float32x4_t large = vbslq_f32(vdupq_n_u32(0x80000000u), x, t); /* copysignf(t, x) */
    return vbslq_f32(vcltq_f32(a, vdupq_n_f32(0.625f)), small, large);
}
#endif

/* x[i] = cap tanh(x[i] / cap), the division a product by 1 / cap as llama.cpp's soft-capping */
static inline void kiln_vsoftcap(float *x, int n, float cap) {
    const float inv = 1.0f / cap;
    int i = 0;
#ifdef KILN_AVX2
    const __m256 vinv = _mm256_set1_ps(inv), vcap = _mm256_set1_ps(cap);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(kiln_tanh8(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv)), vcap));
#elif defined(KILN_NEON)
    const float32x4_t vinv = vdupq_n_f32(inv), vcap = vdupq_n_f32(cap);
    for (; i + 4 <= n; i += 4) vst1q_f32(x + i, vmulq_f32(kiln_tanh4(vmulq_f32(vld1q_f32(x + i), vinv)), vcap));
#endif
    for (; i < n; i++) x[i] = kiln_tanhf(x[i] * inv) * cap;
}

/* -- dot products ----------------------------------------------------------------------------
 * a . b over n: element i is fused into partial sum i % 16 while whole blocks of 16 last, then a
 * last block of 8 (if any) into partials 0..7; the partials meet as s[k] = p[k] + p[k + 8] and
 * the eight-lane sum above; the elements after that (n % 8 of them) are fused in one by one.
 * Rows of f16 or bf16 convert exactly to f32 first (the `load` of each spelling). */
#define KILN_DOT16_REF(name, T, load)                                                              \
    static inline float name(const T *a, const float *b, int n) {                                   \
        float p[16] = {0};                                                                          \
        int i = 0;                                                                                  \
        for (; i + 16 <= n; i += 16)                                                                \
            for (int k = 0; k < 16; k++) p[k] = fmaf(load(a[i + k]), b[i + k], p[k]);               \
        if (i + 8 <= n) {                                                                           \
            for (int k = 0; k < 8; k++) p[k] = fmaf(load(a[i + k]), b[i + k], p[k]);                \
            i += 8;                                                                                 \
        }                                                                                           \
        float s[8];                                                                                 \
        for (int k = 0; k < 8; k++) s[k] = p[k] + p[k + 8];                                         \
        float sum = kiln_hsum8_ref(s);                                                              \
        for (; i < n; i++) sum = fmaf(load(a[i]), b[i], sum);                                       \
        return sum;                                                                                 \
    }

static inline float kiln_f32_value(float x) { return x; }
KILN_DOT16_REF(kiln_vdot_ref, float, kiln_f32_value)

#ifdef KILN_AVX2
/* 8 floats of a row stored as f32, or as f16 (`half`), which converts exactly */
static inline __attribute__((always_inline)) __m256 kiln_load8(const void *p, int half) {
    return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)) : _mm256_loadu_ps((const float *)p);
}

/* 8 bf16 as f32: the bits shifted up, exactly */
static inline __attribute__((always_inline)) __m256 kiln_load8_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline __attribute__((always_inline)) __m256 kiln_load8_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* KILN_DOT16_REF's order with a row of T converted 8 at a time by load8 (f32 rows: kiln_vdot) */
#define KILN_VDOT16(name, T, load8, load1)                                                          \
    static inline float name(const T *a, const float *b, int n) {                                   \
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();                                  \
        int i = 0;                                                                                  \
        for (; i + 16 <= n; i += 16) {                                                              \
            s0 = _mm256_fmadd_ps(load8(a + i), _mm256_loadu_ps(b + i), s0);                          \
            s1 = _mm256_fmadd_ps(load8(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);                  \
        }                                                                                           \
        if (i + 8 <= n) s0 = _mm256_fmadd_ps(load8(a + i), _mm256_loadu_ps(b + i), s0), i += 8;      \
        float sum = kiln_hsum8(_mm256_add_ps(s0, s1));                                              \
        for (; i < n; i++) sum = fmaf(load1(a[i]), b[i], sum);                                      \
        return sum;                                                                                 \
    }
KILN_VDOT16(kiln_vdot, float, _mm256_loadu_ps, kiln_f32_value)
KILN_VDOT16(kiln_vdot_f16, uint16_t, kiln_load8_f16, kiln_fp16_to_fp32)
KILN_VDOT16(kiln_vdot_bf16, uint16_t, kiln_load8_bf16, kiln_bf16_to_fp32)

/* The same dot of one row of T against four rows of b (b0 + k * b_row), each with its own sums in
   KILN_VDOT16's order, so each result is that function's bit for bit: a prefill's activation
   rows share each converted load of the weight row. With AVX-512 a 16-lane sum holds s0 in its
   low half and s1 in its high half, the same lanes taking the same products: one multiply-add
   where AVX2 takes two. */
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) __m512 kiln_load16_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __attribute__((always_inline)) __m512 kiln_load16_f16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline __attribute__((always_inline)) __m512 kiln_load16_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#define KILN_X4_SUMS(load8, load16)                                                                 \
        __m512 s[4];                                                                                \
        for (int k = 0; k < 4; k++) s[k] = _mm512_setzero_ps();                                     \
        int i = 0;                                                                                  \
        for (; i + 16 <= n; i += 16) {                                                              \
            const __m512 w = load16(a + i);                                                         \
            for (int k = 0; k < 4; k++) s[k] = _mm512_fmadd_ps(w, _mm512_loadu_ps(b0 + k * b_row + i), s[k]); \
        }                                                                                           \
        __m256 s0[4], s1[4];                                                                        \
        for (int k = 0; k < 4; k++)                                                                 \
            s0[k] = _mm512_castps512_ps256(s[k]), s1[k] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s[k]), 1));
#else
#define KILN_X4_SUMS(load8, load16)                                                                 \
        __m256 s0[4], s1[4];                                                                        \
        for (int k = 0; k < 4; k++) s0[k] = s1[k] = _mm256_setzero_ps();                           \
        int i = 0;                                                                                  \
        for (; i + 16 <= n; i += 16) {                                                              \
            const __m256 w0 = load8(a + i), w1 = load8(a + i + 8);                                  \
            for (int k = 0; k < 4; k++) {                                                           \
                s0[k] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(b0 + k * b_row + i), s0[k]);            \
                s1[k] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(b0 + k * b_row + i + 8), s1[k]);        \
            }                                                                                       \
        }
#endif
#define KILN_VDOT16_X4(name, T, load8, load16, load1)                                               \
    static inline void name(const T *a, const float *b0, size_t b_row, int n, float out[4]) {      \
        KILN_X4_SUMS(load8, load16)                                                                 \
        const int tail = i;                                                                         \
        for (int k = 0; k < 4; k++) {                                                               \
            const float *b = b0 + k * b_row;                                                        \
            i = tail;                                                                               \
            if (i + 8 <= n) s0[k] = _mm256_fmadd_ps(load8(a + i), _mm256_loadu_ps(b + i), s0[k]), i += 8; \
            float sum = kiln_hsum8(_mm256_add_ps(s0[k], s1[k]));                                    \
            for (; i < n; i++) sum = fmaf(load1(a[i]), b[i], sum);                                  \
            out[k] = sum;                                                                           \
        }                                                                                           \
    }
#if defined(__AVX512F__)
/* The sums of sixteen 16-lane accumulators at once, each in KILN_DOT16_REF's order: lanes k and
   k + 8 first, then ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)), the pairs of accumulators sharing
   each shuffle and add. Lane 4 m + n of the result holds s[4 n + m]'s sum. */
static inline __attribute__((always_inline)) __m512 kiln_hsum16x16(const __m512 s[16]) {
    __m512 u[8], v[4], w[2];
    _Pragma("GCC unroll 8") for (int q = 0; q < 8; q++)
        u[q] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * q], s[2 * q + 1], 0x44),
                             _mm512_shuffle_f32x4(s[2 * q], s[2 * q + 1], 0xEE));
    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++)
        v[q] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * q], u[2 * q + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * q], u[2 * q + 1], 0xDD));
    _Pragma("GCC unroll 2") for (int q = 0; q < 2; q++)
        w[q] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * q], v[2 * q + 1], 0x44), _mm512_shuffle_ps(v[2 * q], v[2 * q + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
}

/* Four weight rows (a0 + j * a_row) against four activation rows: out[k][j], each KILN_VDOT16's
   sum bit for bit. Eight loads feed sixteen multiply-adds, and the sixteen sums share one
   transposing reduction. Each loop is unrolled: gcc otherwise keeps the sums in memory, zeroed by
   a call to memset every tile. */
#define KILN_VDOT16_4X4(name, T, load8, load16, load1)                                              \
    static inline void name(const T *a0, size_t a_row, const float *b0, size_t b_row, int n, float out[4][4]) { \
        __m512 s[16]; /* s[4 j + k]: weight row j, activation row k */                              \
        _Pragma("GCC unroll 16") for (int q = 0; q < 16; q++) s[q] = _mm512_setzero_ps();           \
        int i = 0;                                                                                  \
        for (; i + 16 <= n; i += 16) {                                                              \
            __m512 w[4];                                                                            \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) w[j] = load16(a0 + j * a_row + i);  \
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {                                   \
                __m512 b = _mm512_loadu_ps(b0 + k * b_row + i);                                     \
                __asm__("" : "+v"(b)); /* one load for four multiply-adds: gcc would fold it into each */ \
                _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)                                 \
                    s[4 * j + k] = _mm512_fmadd_ps(w[j], b, s[4 * j + k]);                          \
            }                                                                                       \
        }                                                                                           \
        if (i + 8 <= n) { /* the low eight lanes take the next eight products, as KILN_VDOT16's s0 */ \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                   \
                const __m512 w = _mm512_castps256_ps512(load8(a0 + j * a_row + i));                 \
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)                                 \
                    s[4 * j + k] = _mm512_mask3_fmadd_ps(w, _mm512_castps256_ps512(_mm256_loadu_ps(b0 + k * b_row + i)), \
                                                         s[4 * j + k], 0x00FF);                     \
            }                                                                                       \
            i += 8;                                                                                 \
        }                                                                                           \
        _mm512_storeu_ps(&out[0][0], kiln_hsum16x16(s));                                            \
        if (i < n)                                                                                  \
            for (int k = 0; k < 4; k++)                                                             \
                for (int j = 0; j < 4; j++)                                                         \
                    for (int t = i; t < n; t++)                                                     \
                        out[k][j] = fmaf(load1(a0[j * a_row + t]), b0[k * b_row + t], out[k][j]);   \
    }
KILN_VDOT16_4X4(kiln_vdot_4x4, float, _mm256_loadu_ps, kiln_load16_f32, kiln_f32_value)
KILN_VDOT16_4X4(kiln_vdot_f16_4x4, uint16_t, kiln_load8_f16, kiln_load16_f16, kiln_fp16_to_fp32)
KILN_VDOT16_4X4(kiln_vdot_bf16_4x4, uint16_t, kiln_load8_bf16, kiln_load16_bf16, kiln_bf16_to_fp32)
#endif
KILN_VDOT16_X4(kiln_vdot_x4, float, _mm256_loadu_ps, kiln_load16_f32, kiln_f32_value)
KILN_VDOT16_X4(kiln_vdot_f16_x4, uint16_t, kiln_load8_f16, kiln_load16_f16, kiln_fp16_to_fp32)
KILN_VDOT16_X4(kiln_vdot_bf16_x4, uint16_t, kiln_load8_bf16, kiln_load16_bf16, kiln_bf16_to_fp32)
#elif defined(KILN_NEON)
static inline __attribute__((always_inline)) float32x4_t kiln_load4_f16(const uint16_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}
static inline __attribute__((always_inline)) float32x4_t kiln_load4_bf16(const uint16_t *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

/* partial sums 0..15 in p[0..3], four a register; a row of T converted 4 at a time by load4 */
#define KILN_VDOT16(name, T, load4, load1)                                                          \
    static inline float name(const T *a, const float *b, int n) {                                   \
        float32x4_t p[4];                                                                           \
        for (int k = 0; k < 4; k++) p[k] = vdupq_n_f32(0.0f);                                       \
        int i = 0;                                                                                  \
        for (; i + 16 <= n; i += 16)                                                                \
            for (int k = 0; k < 4; k++) p[k] = vfmaq_f32(p[k], load4(a + i + 4 * k), vld1q_f32(b + i + 4 * k)); \
        if (i + 8 <= n) {                                                                           \
            for (int k = 0; k < 2; k++) p[k] = vfmaq_f32(p[k], load4(a + i + 4 * k), vld1q_f32(b + i + 4 * k)); \
            i += 8;                                                                                 \
        }                                                                                           \
        float sum = kiln_hsum4x2(vaddq_f32(p[0], p[2]), vaddq_f32(p[1], p[3]));                     \
        for (; i < n; i++) sum = fmaf(load1(a[i]), b[i], sum);                                      \
        return sum;                                                                                 \
    }
KILN_VDOT16(kiln_vdot, float, vld1q_f32, kiln_f32_value)
KILN_VDOT16(kiln_vdot_f16, uint16_t, kiln_load4_f16, kiln_fp16_to_fp32)
KILN_VDOT16(kiln_vdot_bf16, uint16_t, kiln_load4_bf16, kiln_bf16_to_fp32)
#else
static inline float kiln_vdot(const float *a, const float *b, int n) { return kiln_vdot_ref(a, b, n); }
#endif

/* -- y += a x, x = e^(x - m) with its sum, max ------------------------------------------------ */

/* y[i] = fma(a, x[i], y[i]) */
static inline void kiln_vaxpy(float *y, float a, const float *x, int n) {
    int i = 0;
#ifdef KILN_AVX2
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#elif defined(KILN_NEON)
    const float32x4_t va = vdupq_n_f32(a);
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), va, vld1q_f32(x + i)));
#endif
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* x[i] = e^(x[i] - m); returns their sum: x[i] into lane i % 8 while whole blocks of 8 last, the
 * lanes' eight-lane sum, then the rest added one by one. */
static inline float kiln_vexp_sum(float *x, float m, int n) {
    int i = 0;
    float sum;
#ifdef KILN_AVX2
    const __m256 vm = _mm256_set1_ps(m);
    __m256 s = _mm256_setzero_ps();
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) { /* the exps sixteen at a time; the sums as two blocks of 8, in order */
        const __m512 e = kiln_exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(m)));
        _mm512_storeu_ps(x + i, e);
        const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1));
        s = _mm256_add_ps(_mm256_add_ps(s, _mm512_castps512_ps256(e)), hi);
    }
#endif
    for (; i + 8 <= n; i += 8) {
        const __m256 e = kiln_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        s = _mm256_add_ps(s, e);
    }
    sum = kiln_hsum8(s);
#elif defined(KILN_NEON)
    const float32x4_t vm = vdupq_n_f32(m);
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = vdupq_n_f32(0.0f);
    for (; i + 8 <= n; i += 8) {
        const float32x4_t e0 = kiln_exp4(vsubq_f32(vld1q_f32(x + i), vm));
        const float32x4_t e1 = kiln_exp4(vsubq_f32(vld1q_f32(x + i + 4), vm));
        vst1q_f32(x + i, e0), vst1q_f32(x + i + 4, e1);
        s0 = vaddq_f32(s0, e0), s1 = vaddq_f32(s1, e1);
    }
    sum = kiln_hsum4x2(s0, s1);
#else
    float lanes[8] = {0};
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) lanes[k] += x[i + k] = kiln_expf(x[i + k] - m);
    sum = kiln_hsum8_ref(lanes);
#endif
    for (; i < n; i++) sum += x[i] = kiln_expf(x[i] - m);
    return sum;
}

/* the largest of x[0..n) (-inf for none); max is exact, so any order gives the same value */
static inline float kiln_vmax(const float *x, int n) {
    float m = -INFINITY;
    int i = 0;
#ifdef KILN_AVX2
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(x + i));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    m = _mm_cvtss_f32(m4);
#elif defined(KILN_NEON)
    float32x4_t m4 = vdupq_n_f32(-INFINITY);
    for (; i + 4 <= n; i += 4) m4 = vmaxq_f32(m4, vld1q_f32(x + i));
    m = vmaxvq_f32(m4);
#endif
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

#endif
