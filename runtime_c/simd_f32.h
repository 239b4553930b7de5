/* simd_f32.h: the f32 vector loops the runtime shares (attention, f32 weights), inline so the
 * attention inner loops pay no call per row. AVX2+FMA where the build targets it; the plain
 * loops below the #else are the scalar reference. */
#ifndef KILN_SIMD_F32_H
#define KILN_SIMD_F32_H

#include <math.h>
#include <stdint.h>

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
 * rows hold f32, or f16 when `half` (then n and hd are multiples of 8); each load of q serves
 * eight rows. */
static inline __attribute__((always_inline)) void kiln_vdots(float *s, const float *q, const void *const rows[], int n,
                                                             int hd, float scale, int half) {
    const int es = half ? 2 : 4; /* bytes per element */
    int j = 0;
    if (hd % 8 == 0)
        for (; j + 8 <= n; j += 8) {
            __m256 a[8];
            for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
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

#ifdef __AVX512F__
#define KILN_ATTN_WIDE 4 /* AVX-512 attention: keys transposed (kiln_tdots), values kiln_vaxpys_wide; queries a call */
/* 16 floats of a row stored as f32, or as f16 (`half`) */
static inline __attribute__((always_inline)) __m512 kiln_load16(const void *p, int half) {
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)) : _mm512_loadu_ps((const float *)p);
}

/* r[k][j] = r[j][k]: a 16x16 block transposed in registers */
static inline __attribute__((always_inline)) void kiln_transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int k = 0; k < 16; k += 2) t[k] = _mm512_unpacklo_ps(r[k], r[k + 1]), t[k + 1] = _mm512_unpackhi_ps(r[k], r[k + 1]);
    for (int k = 0; k < 16; k += 4) {
        r[k] = _mm512_shuffle_ps(t[k], t[k + 2], 0x44), r[k + 1] = _mm512_shuffle_ps(t[k], t[k + 2], 0xEE);
        r[k + 2] = _mm512_shuffle_ps(t[k + 1], t[k + 3], 0x44), r[k + 3] = _mm512_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) {
        t[k] = _mm512_shuffle_f32x4(r[k], r[k + 4], 0x88), t[k + 4] = _mm512_shuffle_f32x4(r[k], r[k + 4], 0xDD);
        t[k + 8] = _mm512_shuffle_f32x4(r[k + 8], r[k + 12], 0x88), t[k + 12] = _mm512_shuffle_f32x4(r[k + 8], r[k + 12], 0xDD);
    }
    for (int k = 0; k < 8; k++) r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88), r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xDD);
}

/* kt[d * ld + j] = rows[j][d] for j < n (a multiple of 16) and d < hd: rows as in kiln_vdots */
static inline __attribute__((always_inline)) void kiln_transpose_rows(float *kt, int ld, const void *const rows[], int n,
                                                                      int hd, int half) {
    const int es = half ? 2 : 4;
    for (int j = 0; j < n; j += 16) {
        int d = 0;
        for (; d + 16 <= hd; d += 16) {
            __m512 r[16];
            for (int k = 0; k < 16; k++) r[k] = kiln_load16((const char *)rows[j + k] + d * es, half);
            kiln_transpose16(r);
            for (int k = 0; k < 16; k++) _mm512_storeu_ps(kt + (size_t)(d + k) * ld + j, r[k]);
        }
        for (; d < hd; d++)
            for (int k = 0; k < 16; k++)
                kt[(size_t)d * ld + j + k] = half ? _cvtsh_ss(((const uint16_t *)rows[j + k])[d]) : ((const float *)rows[j + k])[d];
    }
}

/* s[i][16v + l] = scale * (q[i] . key 16v + l) for i < nq <= 4 and v < nv <= 4, the keys
 * transposed in kt (kt[d * ld + j]): each score one fma chain over d in order, from zero. */
static inline __attribute__((always_inline)) void kiln_tdots_n(float *const s[], const float *const q[], const int nq,
                                                               const float *kt, int ld, const int nv, int hd,
                                                               float scale) {
    __m512 a[4][4];
    for (int i = 0; i < nq; i++)
        for (int v = 0; v < nv; v++) a[i][v] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const float *k = kt + (size_t)d * ld;
        __m512 kv[4];
        for (int v = 0; v < nv; v++) kv[v] = _mm512_loadu_ps(k + 16 * v);
        for (int i = 0; i < nq; i++) {
            const __m512 qi = _mm512_set1_ps(q[i][d]);
            for (int v = 0; v < nv; v++) a[i][v] = _mm512_fmadd_ps(qi, kv[v], a[i][v]);
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int i = 0; i < nq; i++)
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(s[i] + 16 * v, _mm512_mul_ps(a[i][v], sc));
}

#define KILN_TDOTS_CASE(nq, nv) \
    case (nq) * 4 + (nv): kiln_tdots_n(s, q, nq, kt, ld, nv, hd, scale); break;
/* kiln_tdots_n for any nq <= 4 and n = 16 nv <= 64 keys, each shape its own unrolled body */
static inline void kiln_tdots(float *const s[], const float *const q[], int nq, const float *kt, int ld, int n, int hd,
                              float scale) {
    switch (nq * 4 + n / 16) {
        KILN_TDOTS_CASE(1, 1) KILN_TDOTS_CASE(1, 2) KILN_TDOTS_CASE(1, 3) KILN_TDOTS_CASE(1, 4)
        KILN_TDOTS_CASE(2, 1) KILN_TDOTS_CASE(2, 2) KILN_TDOTS_CASE(2, 3) KILN_TDOTS_CASE(2, 4)
        KILN_TDOTS_CASE(3, 1) KILN_TDOTS_CASE(3, 2) KILN_TDOTS_CASE(3, 3) KILN_TDOTS_CASE(3, 4)
        KILN_TDOTS_CASE(4, 1) KILN_TDOTS_CASE(4, 2) KILN_TDOTS_CASE(4, 3) KILN_TDOTS_CASE(4, 4)
    }
}
#undef KILN_TDOTS_CASE

/* kiln_vaxpys for nq <= 4 queries' weights over the same rows, 16 columns a register and 64 at a
 * time for all of them: each row load serves every query, and each column still adds its rows
 * in order, so the bits are those of nq calls of kiln_vaxpys. hd is a multiple of 16. */
static inline __attribute__((always_inline)) void kiln_vaxpys_wide_n(float *const acc[], const float *const w[],
                                                                     const int nq, const void *const rows[], int n,
                                                                     int hd, int half) {
    const int es = half ? 2 : 4;
    int d = 0;
    for (; d + 64 <= hd; d += 64) {
        __m512 a[4][4];
        for (int i = 0; i < nq; i++)
            for (int c = 0; c < 4; c++) a[i][c] = _mm512_loadu_ps(acc[i] + d + 16 * c);
        for (int j = 0; j < n; j++) {
            const char *row = (const char *)rows[j] + d * es;
            const __m512 r0 = kiln_load16(row, half), r1 = kiln_load16(row + 16 * es, half),
                         r2 = kiln_load16(row + 32 * es, half), r3 = kiln_load16(row + 48 * es, half);
            for (int i = 0; i < nq; i++) {
                const __m512 wi = _mm512_set1_ps(w[i][j]);
                a[i][0] = _mm512_fmadd_ps(wi, r0, a[i][0]), a[i][1] = _mm512_fmadd_ps(wi, r1, a[i][1]);
                a[i][2] = _mm512_fmadd_ps(wi, r2, a[i][2]), a[i][3] = _mm512_fmadd_ps(wi, r3, a[i][3]);
            }
        }
        for (int i = 0; i < nq; i++)
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(acc[i] + d + 16 * c, a[i][c]);
    }
    for (; d < hd; d += 16) {
        __m512 a[4];
        for (int i = 0; i < nq; i++) a[i] = _mm512_loadu_ps(acc[i] + d);
        for (int j = 0; j < n; j++) {
            const __m512 r = kiln_load16((const char *)rows[j] + d * es, half);
            for (int i = 0; i < nq; i++) a[i] = _mm512_fmadd_ps(_mm512_set1_ps(w[i][j]), r, a[i]);
        }
        for (int i = 0; i < nq; i++) _mm512_storeu_ps(acc[i] + d, a[i]);
    }
}

static inline __attribute__((always_inline)) void kiln_vaxpys_wide(float *const acc[], const float *const w[], int nq,
                                                                   const void *const rows[], int n, int hd, int half) {
    switch (nq) { /* each count its own unrolled body */
    case 1: kiln_vaxpys_wide_n(acc, w, 1, rows, n, hd, half); break;
    case 2: kiln_vaxpys_wide_n(acc, w, 2, rows, n, hd, half); break;
    case 3: kiln_vaxpys_wide_n(acc, w, 3, rows, n, hd, half); break;
    default: kiln_vaxpys_wide_n(acc, w, 4, rows, n, hd, half); break;
    }
}
#endif

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
                              int half) {
    (void)half;
    for (int j = 0; j < n; j++) s[j] = kiln_vdot(q, (const float *)rows[j], hd) * scale;
}

static inline void kiln_vaxpys(float *acc, const float *w, const void *const rows[], int n, int hd, int half) {
    (void)half;
    for (int j = 0; j < n; j++) kiln_vaxpy(acc, w[j], (const float *)rows[j], hd);
}

static inline void kiln_vdots2(float *s0, float *s1, const float *q0, const float *q1, const void *const rows[],
                               int n, int hd, float scale, int half) {
    kiln_vdots(s0, q0, rows, n, hd, scale, half);
    kiln_vdots(s1, q1, rows, n, hd, scale, half);
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
