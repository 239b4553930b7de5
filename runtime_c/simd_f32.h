/* simd_f32.h: the f32 vector loops the runtime shares (attention, f32 weights), inline so the
 * attention inner loops pay no call per row. AVX2+FMA where the build targets it; the plain
 * loops below the #else are the scalar reference. */
#ifndef KILN_SIMD_F32_H
#define KILN_SIMD_F32_H

#include <math.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KILN_SIMD_F16_ROWS 1 /* kiln_vdots and kiln_vaxpys read f16 rows in place */
#include <immintrin.h>

static inline float kiln_hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* e^x for 8 floats, relative error < 2e-7 on [-87, 88], 0 below (and for -inf): x = k ln2 + r,
 * |r| <= ln2/2, e^r by its degree-6 Taylor polynomial, 2^k through the exponent bits */
static inline __m256 kiln_exp8(__m256 x) {
    const __m256 visible = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145752f), x); /* ln2 split in two for an exact product */
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.42860677e-6f), r);
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

/* a . b */
static inline float kiln_vdot(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float sum = kiln_hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* y += a * x */
static inline void kiln_vaxpy(float *y, float a, const float *x, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* x = exp(x - m); returns the sum of the new x */
static inline float kiln_vexp_sum(float *x, float m, int n) {
    const __m256 vm = _mm256_set1_ps(m);
    __m256 s = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = kiln_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        s = _mm256_add_ps(s, e);
    }
    float sum = kiln_hsum8(s);
    for (; i < n; i++) sum += x[i] = expf(x[i] - m);
    return sum;
}

/* lane k = the sum of v[k]'s 8 lanes */
static inline __m256 kiln_reduce8(const __m256 v[8]) {
    const __m256 q0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 q1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31));
}

/* 8 floats of a row stored as f32, or as f16 (`half`), which converts exactly */
static inline __attribute__((always_inline)) __m256 kiln_load8(const void *p, int half) {
    return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)) : _mm256_loadu_ps((const float *)p);
}

/* s[j] = scale * (q . rows[j]) for j < n, eight rows at a time sharing one lane reduction;
 * rows hold f32, or f16 when `half` (then n and hd are multiples of 8).
 * `stream`: rows come from memory, so each is read front to back before the next (rows are
 * usually adjacent, and the hardware prefetcher follows that order but not eight rows read
 * side by side). Otherwise rows are in cache and each load of q serves eight rows. */
static inline __attribute__((always_inline)) void kiln_vdots(float *s, const float *q, const void *const rows[], int n,
                                                             int hd, float scale, int stream, int half) {
    const int es = half ? 2 : 4; /* bytes per element */
    int j = 0;
    if (hd % 8 == 0)
        for (; j + 8 <= n; j += 8) {
            __m256 a[8];
            for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
            if (stream)
                for (int k = 0; k < 8; k++)
                    for (int d = 0; d < hd; d += 8)
                        a[k] = _mm256_fmadd_ps(_mm256_loadu_ps(q + d),
                                               kiln_load8((const char *)rows[j + k] + d * es, half), a[k]);
            else
                for (int d = 0; d < hd; d += 8) {
                    const __m256 qv = _mm256_loadu_ps(q + d);
                    for (int k = 0; k < 8; k++)
                        a[k] = _mm256_fmadd_ps(qv, kiln_load8((const char *)rows[j + k] + d * es, half), a[k]);
                }
            _mm256_storeu_ps(s + j, _mm256_mul_ps(kiln_reduce8(a), _mm256_set1_ps(scale)));
        }
    for (; j < n; j++) s[j] = kiln_vdot(q, (const float *)rows[j], hd) * scale;
}

/* acc[d] += sum_j w[j] * rows[j][d], rows as in kiln_vdots: 64 columns at a time stay in
 * registers across the rows, then 8 at a time; each column adds its rows in order. */
static inline __attribute__((always_inline)) void kiln_vaxpys(float *acc, const float *w, const void *const rows[],
                                                              int n, int hd, int half) {
    const int es = half ? 2 : 4;
    int d = 0;
    for (; d + 64 <= hd; d += 64) {
        __m256 a[8];
        for (int k = 0; k < 8; k++) a[k] = _mm256_loadu_ps(acc + d + 8 * k);
        for (int j = 0; j < n; j++) {
            const __m256 wj = _mm256_set1_ps(w[j]);
            for (int k = 0; k < 8; k++)
                a[k] = _mm256_fmadd_ps(wj, kiln_load8((const char *)rows[j] + (d + 8 * k) * es, half), a[k]);
        }
        for (int k = 0; k < 8; k++) _mm256_storeu_ps(acc + d + 8 * k, a[k]);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 a = _mm256_loadu_ps(acc + d);
        for (int j = 0; j < n; j++) a = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), kiln_load8((const char *)rows[j] + d * es, half), a);
        _mm256_storeu_ps(acc + d, a);
    }
    for (int j = 0; j < n && d < hd; j++) kiln_vaxpy(acc + d, w[j], (const float *)rows[j] + d, hd - d);
}

/* kiln_vdots for two queries over the same rows, from cache: each row load serves both, and each
 * (query, row) score is summed in exactly kiln_vdots' order, so the bits are those of two calls. */
static inline __attribute__((always_inline)) void kiln_vdots2(float *s0, float *s1, const float *q0, const float *q1,
                                                              const void *const rows[], int n, int hd, float scale,
                                                              int half) {
    const int es = half ? 2 : 4;
    int j = 0;
    if (hd % 8 == 0)
        for (; j + 8 <= n; j += 8) {
            __m256 a[8], b[8];
            for (int k = 0; k < 8; k++) a[k] = b[k] = _mm256_setzero_ps();
            for (int d = 0; d < hd; d += 8) {
                const __m256 qa = _mm256_loadu_ps(q0 + d), qb = _mm256_loadu_ps(q1 + d);
                for (int k = 0; k < 8; k++) {
                    const __m256 r = kiln_load8((const char *)rows[j + k] + d * es, half);
                    a[k] = _mm256_fmadd_ps(qa, r, a[k]);
                    b[k] = _mm256_fmadd_ps(qb, r, b[k]);
                }
            }
            _mm256_storeu_ps(s0 + j, _mm256_mul_ps(kiln_reduce8(a), _mm256_set1_ps(scale)));
            _mm256_storeu_ps(s1 + j, _mm256_mul_ps(kiln_reduce8(b), _mm256_set1_ps(scale)));
        }
    for (; j < n; j++) {
        s0[j] = kiln_vdot(q0, (const float *)rows[j], hd) * scale;
        s1[j] = kiln_vdot(q1, (const float *)rows[j], hd) * scale;
    }
}

/* kiln_vaxpys for two queries' weights over the same rows: each column adds its rows in
 * kiln_vaxpys' order, so the bits are those of two calls. */
static inline __attribute__((always_inline)) void kiln_vaxpys2(float *acc0, float *acc1, const float *w0,
                                                               const float *w1, const void *const rows[], int n,
                                                               int hd, int half) {
    const int es = half ? 2 : 4;
    int d = 0;
    for (; d + 64 <= hd; d += 64) {
        __m256 a[8], b[8];
        for (int k = 0; k < 8; k++) a[k] = _mm256_loadu_ps(acc0 + d + 8 * k), b[k] = _mm256_loadu_ps(acc1 + d + 8 * k);
        for (int j = 0; j < n; j++) {
            const __m256 wa = _mm256_set1_ps(w0[j]), wb = _mm256_set1_ps(w1[j]);
            for (int k = 0; k < 8; k++) {
                const __m256 r = kiln_load8((const char *)rows[j] + (d + 8 * k) * es, half);
                a[k] = _mm256_fmadd_ps(wa, r, a[k]);
                b[k] = _mm256_fmadd_ps(wb, r, b[k]);
            }
        }
        for (int k = 0; k < 8; k++) _mm256_storeu_ps(acc0 + d + 8 * k, a[k]), _mm256_storeu_ps(acc1 + d + 8 * k, b[k]);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 a = _mm256_loadu_ps(acc0 + d), b = _mm256_loadu_ps(acc1 + d);
        for (int j = 0; j < n; j++) {
            const __m256 r = kiln_load8((const char *)rows[j] + d * es, half);
            a = _mm256_fmadd_ps(_mm256_set1_ps(w0[j]), r, a);
            b = _mm256_fmadd_ps(_mm256_set1_ps(w1[j]), r, b);
        }
        _mm256_storeu_ps(acc0 + d, a), _mm256_storeu_ps(acc1 + d, b);
    }
    for (int j = 0; j < n && d < hd; j++) {
        kiln_vaxpy(acc0 + d, w0[j], (const float *)rows[j] + d, hd - d);
        kiln_vaxpy(acc1 + d, w1[j], (const float *)rows[j] + d, hd - d);
    }
}

/* the largest of x[0..n) (-inf for none); max is exact, so any order gives the same value */
static inline float kiln_vmax(const float *x, int n) {
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(x + i));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float m = _mm_cvtss_f32(m4);
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

#else

static inline float kiln_vdot(const float *a, const float *b, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static inline void kiln_vaxpy(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static inline float kiln_vexp_sum(float *x, float m, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += x[i] = expf(x[i] - m);
    return sum;
}

/* rows are f32 here: without F16C the attention dequantizes f16 rows first (half is 0) */
static inline void kiln_vdots(float *s, const float *q, const void *const rows[], int n, int hd, float scale,
                              int stream, int half) {
    (void)stream, (void)half;
    for (int j = 0; j < n; j++) s[j] = kiln_vdot(q, (const float *)rows[j], hd) * scale;
}

static inline void kiln_vaxpys(float *acc, const float *w, const void *const rows[], int n, int hd, int half) {
    (void)half;
    for (int j = 0; j < n; j++) kiln_vaxpy(acc, w[j], (const float *)rows[j], hd);
}

static inline void kiln_vdots2(float *s0, float *s1, const float *q0, const float *q1, const void *const rows[],
                               int n, int hd, float scale, int half) {
    kiln_vdots(s0, q0, rows, n, hd, scale, 0, half);
    kiln_vdots(s1, q1, rows, n, hd, scale, 0, half);
}

static inline void kiln_vaxpys2(float *acc0, float *acc1, const float *w0, const float *w1, const void *const rows[],
                                int n, int hd, int half) {
    kiln_vaxpys(acc0, w0, rows, n, hd, half);
    kiln_vaxpys(acc1, w1, rows, n, hd, half);
}

static inline float kiln_vmax(const float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

#endif

static inline void kiln_vscale(float *y, float a, int n) {
    for (int i = 0; i < n; i++) y[i] *= a;
}

#endif
