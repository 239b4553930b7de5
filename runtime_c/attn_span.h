/* attn_span.h: the inner kernels of attention over one span of cached rows (attention.c).
 *
 * What every path computes (vec_f32.h's rule: one order of operations on every instruction set):
 *   score  s[i][j] = (q[i] . k[j]) * scale, the dot one fma chain over d = 0 .. hd-1 from 0;
 *   values acc[i][d] = fma(w[i][j], v[j][d], acc[i][d]) over the rows j in order.
 * Keys are read transposed, kt[d * ld + j] = k[j][d], so that one vector holds 4, 8 or 16 keys'
 * chains: an f16 or f32 K as the cache holds it (kv_view.h), other types transposed from their
 * dequantized rows (kiln_span_transpose). Keys and rows are f32, or f16 (`half`, read in place where
 * the vector loops convert on load), which converts exactly.
 */
#ifndef KILN_ATTN_SPAN_H
#define KILN_ATTN_SPAN_H

#include "fp16.h"
#include "vec_f32.h"

#define KILN_SPAN_MAX_Q 4 /* queries one call of kiln_span_scores or kiln_span_values takes */

#if defined(__AVX512F__)
#define KILN_SPAN_KEYS 16 /* keys a vector of scores holds: rows are staged in groups of this many */
#elif defined(KILN_AVX2)
#define KILN_SPAN_KEYS 8
#else
#define KILN_SPAN_KEYS 8
#endif
#if defined(KILN_AVX2) || defined(KILN_NEON)
#define KILN_SPAN_F16_ROWS 1 /* the values kernel reads f16 rows in place */
#endif

#define KILN_INLINE static inline __attribute__((always_inline))

#if defined(__AVX512F__)
KILN_INLINE __m512 kiln_load16(const void *p, int half) {
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)) : _mm512_loadu_ps((const float *)p);
}

/* r[k][j] = r[j][k]: a 16x16 block transposed in registers */
KILN_INLINE void kiln_transpose16(__m512 r[16]) {
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
#endif

#if defined(KILN_AVX2)
/* kt[d * ld + j] = rows[j][d] for j < n (a multiple of KILN_SPAN_KEYS) and d < hd: dequantized rows */
KILN_INLINE void kiln_span_transpose(float *kt, int ld, const float *const rows[], int n, int hd) {
    int d0 = 0;
#if defined(__AVX512F__)
    for (; d0 + 16 <= hd; d0 += 16)
        for (int j = 0; j < n; j += 16) {
            __m512 r[16];
            for (int k = 0; k < 16; k++) r[k] = _mm512_loadu_ps(rows[j + k] + d0);
            kiln_transpose16(r);
            for (int k = 0; k < 16; k++) _mm512_storeu_ps(kt + (size_t)(d0 + k) * ld + j, r[k]);
        }
#else
    for (; d0 + 8 <= hd; d0 += 8)
        for (int j = 0; j < n; j += 8) {
            __m256 r[8], t[8];
            for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_ps(rows[j + k] + d0);
            for (int k = 0; k < 8; k += 2) t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]), t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
            for (int k = 0; k < 8; k += 4) {
                r[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44), r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
                r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44), r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
            }
            for (int k = 0; k < 4; k++) {
                t[k] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x20), t[k + 4] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x31);
            }
            for (int k = 0; k < 8; k++) _mm256_storeu_ps(kt + (size_t)(d0 + k) * ld + j, t[k]);
        }
#endif
    for (int d = d0; d < hd; d++)
        for (int j = 0; j < n; j++) kt[(size_t)d * ld + j] = rows[j][d];
}
#endif

#if defined(__AVX512F__)
/* s[i][16v + l] for i < nq and v < nv (n = 16 nv keys), each score one fma chain over d */
KILN_INLINE void kiln_span_scores_n(float *const s[], const float *const q[], const int nq, const void *kt, int ld,
                                    const int nv, int hd, float scale, const int half) {
    const size_t es = half ? 2 : 4;
    __m512 a[KILN_SPAN_MAX_Q][4];
    for (int i = 0; i < nq; i++)
        for (int v = 0; v < nv; v++) a[i][v] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const char *k = (const char *)kt + (size_t)d * ld * es;
        __m512 kv[4];
        for (int v = 0; v < nv; v++) kv[v] = kiln_load16(k + 16 * v * es, half);
        for (int i = 0; i < nq; i++) {
            const __m512 qi = _mm512_set1_ps(q[i][d]);
            for (int v = 0; v < nv; v++) a[i][v] = _mm512_fmadd_ps(qi, kv[v], a[i][v]);
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int i = 0; i < nq; i++)
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(s[i] + 16 * v, _mm512_mul_ps(a[i][v], sc));
}

#define KILN_SCORES_CASE(nq, nv)                                        \
    case (nq) * 8 + (nv):                                               \
        if (half) kiln_span_scores_n(s, q, nq, kt, ld, nv, hd, scale, 1); \
        else kiln_span_scores_n(s, q, nq, kt, ld, nv, hd, scale, 0);      \
        break;
/* scores of nq <= 4 queries against n = 16 nv <= 64 transposed keys: each shape its own unrolled body */
static inline void kiln_span_scores(float *const s[], const float *const q[], int nq, const void *kt, int ld, int half,
                                    int n, int hd, float scale) {
    switch (nq * 8 + n / 16) {
        KILN_SCORES_CASE(1, 1) KILN_SCORES_CASE(1, 2) KILN_SCORES_CASE(1, 3) KILN_SCORES_CASE(1, 4)
        KILN_SCORES_CASE(2, 1) KILN_SCORES_CASE(2, 2) KILN_SCORES_CASE(2, 3) KILN_SCORES_CASE(2, 4)
        KILN_SCORES_CASE(3, 1) KILN_SCORES_CASE(3, 2) KILN_SCORES_CASE(3, 3) KILN_SCORES_CASE(3, 4)
        KILN_SCORES_CASE(4, 1) KILN_SCORES_CASE(4, 2) KILN_SCORES_CASE(4, 3) KILN_SCORES_CASE(4, 4)
    }
}
#undef KILN_SCORES_CASE

/* acc[i][d] += w[i * ldw + j] * rows[j][d] for i < nq, rows in order: 64 columns (16 a register) at a
 * time for every query, so each row load serves all of them. hd is a multiple of 16. The weights
 * are one array with a stride, not a pointer each: one register addresses them all, where the
 * pointers had spilled and were reloaded before every broadcast. */
KILN_INLINE void kiln_span_values_n(float *const acc[], const float *w, int ldw, const int nq,
                                    const void *const rows[], int n, int hd, int half) {
    const int es = half ? 2 : 4;
    int d = 0;
    for (; d + 64 <= hd; d += 64) {
        __m512 a[KILN_SPAN_MAX_Q][4];
        for (int i = 0; i < nq; i++)
            for (int c = 0; c < 4; c++) a[i][c] = _mm512_loadu_ps(acc[i] + d + 16 * c);
        for (int j = 0; j < n; j++) {
            const char *row = (const char *)rows[j] + d * es;
            const __m512 r0 = kiln_load16(row, half), r1 = kiln_load16(row + 16 * es, half),
                         r2 = kiln_load16(row + 32 * es, half), r3 = kiln_load16(row + 48 * es, half);
            for (int i = 0; i < nq; i++) {
                const __m512 wi = _mm512_set1_ps(w[(size_t)i * ldw + j]);
                a[i][0] = _mm512_fmadd_ps(wi, r0, a[i][0]), a[i][1] = _mm512_fmadd_ps(wi, r1, a[i][1]);
                a[i][2] = _mm512_fmadd_ps(wi, r2, a[i][2]), a[i][3] = _mm512_fmadd_ps(wi, r3, a[i][3]);
            }
        }
        for (int i = 0; i < nq; i++)
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(acc[i] + d + 16 * c, a[i][c]);
    }
    for (; d < hd; d += 16) {
        __m512 a[KILN_SPAN_MAX_Q];
        for (int i = 0; i < nq; i++) a[i] = _mm512_loadu_ps(acc[i] + d);
        for (int j = 0; j < n; j++) {
            const __m512 r = kiln_load16((const char *)rows[j] + d * es, half);
            for (int i = 0; i < nq; i++) a[i] = _mm512_fmadd_ps(_mm512_set1_ps(w[(size_t)i * ldw + j]), r, a[i]);
        }
        for (int i = 0; i < nq; i++) _mm512_storeu_ps(acc[i] + d, a[i]);
    }
}

static inline void kiln_span_values(float *const acc[], const float *w, int ldw, int nq, const void *const rows[],
                                    int n, int hd, int half) {
    if (hd % 16) { /* the scalar order, column by column */
        for (int i = 0; i < nq; i++)
            for (int j = 0; j < n; j++) {
                const float *r32 = rows[j];
                const uint16_t *r16 = rows[j];
                for (int d = 0; d < hd; d++) acc[i][d] = fmaf(w[(size_t)i * ldw + j], half ? _cvtsh_ss(r16[d]) : r32[d], acc[i][d]);
            }
        return;
    }
    switch (nq) { /* each count its own unrolled body */
    case 1: kiln_span_values_n(acc, w, ldw, 1, rows, n, hd, half); break;
    case 2: kiln_span_values_n(acc, w, ldw, 2, rows, n, hd, half); break;
    case 3: kiln_span_values_n(acc, w, ldw, 3, rows, n, hd, half); break;
    default: kiln_span_values_n(acc, w, ldw, 4, rows, n, hd, half); break;
    }
}

#elif defined(KILN_AVX2)
/* one query's scores against n <= 64 transposed keys, 8 a register */
KILN_INLINE void kiln_span_scores1(float *s, const float *q, const void *kt, int ld, const int nv, int hd,
                                   float scale, const int half) {
    const size_t es = half ? 2 : 4;
    __m256 a[8];
    for (int v = 0; v < nv; v++) a[v] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const __m256 qd = _mm256_set1_ps(q[d]);
        const char *k = (const char *)kt + (size_t)d * ld * es;
        for (int v = 0; v < nv; v++) a[v] = _mm256_fmadd_ps(qd, kiln_load8(k + 8 * v * es, half), a[v]);
    }
    for (int v = 0; v < nv; v++) _mm256_storeu_ps(s + 8 * v, _mm256_mul_ps(a[v], _mm256_set1_ps(scale)));
}

#define KILN_SCORES_CASE(nv)                                              \
    case nv:                                                              \
        if (half) kiln_span_scores1(s[i], q[i], kt, ld, nv, hd, scale, 1); \
        else kiln_span_scores1(s[i], q[i], kt, ld, nv, hd, scale, 0);      \
        break;
static inline void kiln_span_scores(float *const s[], const float *const q[], int nq, const void *kt, int ld, int half,
                                    int n, int hd, float scale) {
    for (int i = 0; i < nq; i++) switch (n / 8) { /* each width its own unrolled body */
        KILN_SCORES_CASE(1) KILN_SCORES_CASE(2) KILN_SCORES_CASE(3) KILN_SCORES_CASE(4)
        KILN_SCORES_CASE(5) KILN_SCORES_CASE(6) KILN_SCORES_CASE(7) KILN_SCORES_CASE(8)
        }
}
#undef KILN_SCORES_CASE

/* one query's weighted rows: 64 columns in registers across the rows, then 8 at a time, then one */
static inline void kiln_span_values(float *const acc[], const float *w, int ldw, int nq, const void *const rows[],
                                    int n, int hd, int half) {
    const int es = half ? 2 : 4;
    for (int i = 0; i < nq; i++) {
        float *o = acc[i];
        const float *wi = w + (size_t)i * ldw;
        int d = 0;
        for (; d + 64 <= hd; d += 64) {
            __m256 a[8];
            for (int k = 0; k < 8; k++) a[k] = _mm256_loadu_ps(o + d + 8 * k);
            for (int j = 0; j < n; j++) {
                const __m256 wj = _mm256_set1_ps(wi[j]);
                for (int k = 0; k < 8; k++)
                    a[k] = _mm256_fmadd_ps(wj, kiln_load8((const char *)rows[j] + (d + 8 * k) * es, half), a[k]);
            }
            for (int k = 0; k < 8; k++) _mm256_storeu_ps(o + d + 8 * k, a[k]);
        }
        for (; d + 8 <= hd; d += 8) {
            __m256 a = _mm256_loadu_ps(o + d);
            for (int j = 0; j < n; j++)
                a = _mm256_fmadd_ps(_mm256_set1_ps(wi[j]), kiln_load8((const char *)rows[j] + d * es, half), a);
            _mm256_storeu_ps(o + d, a);
        }
        for (; d < hd; d++)
            for (int j = 0; j < n; j++)
                o[d] = fmaf(wi[j], half ? _cvtsh_ss(((const uint16_t *)rows[j])[d]) : ((const float *)rows[j])[d], o[d]);
    }
}

#elif defined(KILN_NEON)
/* 4 floats of a row stored as f32, or as f16 (`half`), which converts exactly */
KILN_INLINE float32x4_t kiln_load4(const void *p, int half) {
    return half ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p))) : vld1q_f32((const float *)p);
}

KILN_INLINE float kiln_row_value(const void *row, int d, int half) {
    if (!half) return ((const float *)row)[d];
    return vget_lane_f32(vget_low_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(((const uint16_t *)row)[d])))), 0);
}

KILN_INLINE float32x4_t kiln_trn64(float32x4_t a, float32x4_t b, int second) {
    const float64x2_t x = vreinterpretq_f64_f32(a), y = vreinterpretq_f64_f32(b);
    return vreinterpretq_f32_f64(second ? vtrn2q_f64(x, y) : vtrn1q_f64(x, y));
}

/* kt[d * ld + j] = rows[j][d] for j < n (a multiple of KILN_SPAN_KEYS) and d < hd: 4x4 blocks of dequantized rows */
KILN_INLINE void kiln_span_transpose(float *kt, int ld, const float *const rows[], int n, int hd) {
    int d0 = 0;
    for (; d0 + 4 <= hd; d0 += 4)
        for (int j = 0; j < n; j += 4) {
            float32x4_t r[4];
            for (int k = 0; k < 4; k++) r[k] = vld1q_f32(rows[j + k] + d0);
            const float32x4_t t0 = vtrn1q_f32(r[0], r[1]), t1 = vtrn2q_f32(r[0], r[1]);
            const float32x4_t t2 = vtrn1q_f32(r[2], r[3]), t3 = vtrn2q_f32(r[2], r[3]);
            vst1q_f32(kt + (size_t)d0 * ld + j, kiln_trn64(t0, t2, 0));
            vst1q_f32(kt + (size_t)(d0 + 1) * ld + j, kiln_trn64(t1, t3, 0));
            vst1q_f32(kt + (size_t)(d0 + 2) * ld + j, kiln_trn64(t0, t2, 1));
            vst1q_f32(kt + (size_t)(d0 + 3) * ld + j, kiln_trn64(t1, t3, 1));
        }
    for (int d = d0; d < hd; d++)
        for (int j = 0; j < n; j++) kt[(size_t)d * ld + j] = rows[j][d];
}

/* one query's scores against n = 4 nv <= 64 transposed keys, 4 a register */
KILN_INLINE void kiln_span_scores1(float *s, const float *q, const void *kt, int ld, const int nv, int hd,
                                   float scale, const int half) {
    const size_t es = half ? 2 : 4;
    float32x4_t a[16];
    for (int v = 0; v < nv; v++) a[v] = vdupq_n_f32(0.0f);
    for (int d = 0; d < hd; d++) {
        const float32x4_t qd = vdupq_n_f32(q[d]);
        const char *k = (const char *)kt + (size_t)d * ld * es;
        for (int v = 0; v < nv; v++) a[v] = vfmaq_f32(a[v], qd, kiln_load4(k + 4 * v * es, half));
    }
    for (int v = 0; v < nv; v++) vst1q_f32(s + 4 * v, vmulq_f32(a[v], vdupq_n_f32(scale)));
}

#define KILN_SCORES_CASE(n8)                                                  \
    case n8:                                                                  \
        if (half) kiln_span_scores1(s[i], q[i], kt, ld, 2 * n8, hd, scale, 1); \
        else kiln_span_scores1(s[i], q[i], kt, ld, 2 * n8, hd, scale, 0);      \
        break;
static inline void kiln_span_scores(float *const s[], const float *const q[], int nq, const void *kt, int ld, int half,
                                    int n, int hd, float scale) {
    for (int i = 0; i < nq; i++) switch (n / 8) { /* each width its own unrolled body */
        KILN_SCORES_CASE(1) KILN_SCORES_CASE(2) KILN_SCORES_CASE(3) KILN_SCORES_CASE(4)
        KILN_SCORES_CASE(5) KILN_SCORES_CASE(6) KILN_SCORES_CASE(7) KILN_SCORES_CASE(8)
        }
}
#undef KILN_SCORES_CASE

/* one query's weighted rows: 64 columns in registers across the rows, then 4 at a time, then one */
static inline void kiln_span_values(float *const acc[], const float *w, int ldw, int nq, const void *const rows[],
                                    int n, int hd, int half) {
    const int es = half ? 2 : 4;
    for (int i = 0; i < nq; i++) {
        float *o = acc[i];
        const float *wi = w + (size_t)i * ldw;
        int d = 0;
        for (; d + 64 <= hd; d += 64) {
            float32x4_t a[16];
            for (int k = 0; k < 16; k++) a[k] = vld1q_f32(o + d + 4 * k);
            for (int j = 0; j < n; j++) {
                const float32x4_t wj = vdupq_n_f32(wi[j]);
                for (int k = 0; k < 16; k++)
                    a[k] = vfmaq_f32(a[k], wj, kiln_load4((const char *)rows[j] + (d + 4 * k) * es, half));
            }
            for (int k = 0; k < 16; k++) vst1q_f32(o + d + 4 * k, a[k]);
        }
        for (; d + 4 <= hd; d += 4) {
            float32x4_t a = vld1q_f32(o + d);
            for (int j = 0; j < n; j++)
                a = vfmaq_f32(a, vdupq_n_f32(wi[j]), kiln_load4((const char *)rows[j] + d * es, half));
            vst1q_f32(o + d, a);
        }
        for (; d < hd; d++)
            for (int j = 0; j < n; j++) o[d] = fmaf(wi[j], kiln_row_value(rows[j], d, half), o[d]);
    }
}

#else
/* kt[d * ld + j] = rows[j][d] for j < n and d < hd: dequantized rows */
static inline void kiln_span_transpose(float *kt, int ld, const float *const rows[], int n, int hd) {
    for (int d = 0; d < hd; d++)
        for (int j = 0; j < n; j++) kt[(size_t)d * ld + j] = rows[j][d];
}

/* each score's chain on its own */
static inline void kiln_span_scores(float *const s[], const float *const q[], int nq, const void *kt, int ld, int half,
                                    int n, int hd, float scale) {
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < n; j++) {
            float a = 0.0f;
            for (int d = 0; d < hd; d++) {
                const size_t at = (size_t)d * ld + j;
                a = fmaf(q[i][d], half ? kiln_fp16_to_fp32(((const kiln_half *)kt)[at]) : ((const float *)kt)[at], a);
            }
            s[i][j] = a * scale;
        }
}

/* V rows are f32 here: the attention dequantizes f16 ones first */
static inline void kiln_span_values(float *const acc[], const float *w, int ldw, int nq, const void *const rows[],
                                    int n, int hd, int half) {
    (void)half;
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < n; j++) kiln_vaxpy(acc[i], w[(size_t)i * ldw + j], rows[j], hd);
}
#endif

#endif
