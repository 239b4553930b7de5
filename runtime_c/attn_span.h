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

#if defined(__AVX512F__)
/* queries one call of kiln_span_scores or kiln_span_values takes: 6 x 4 accumulators, 4 rows and a broadcast
   fill the 32 registers, and each f16 row's conversion serves 6 queries (4 had been 1.008-1.013x slower in
   SmolLM2's prefill, Zen 4) */
#define KILN_SPAN_MAX_Q 6
#else
#define KILN_SPAN_MAX_Q 4
#endif

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

/* Cache lines a kernel asks for a few at a time as it runs: the next item's K or V rows, so that
 * they stream in under this item's arithmetic. Asked for all at once, the 256 lines of a span of
 * 64 rows had stalled the thread on its fill buffers before it scored the span it already held.
 * Into L2: L1 holds the span being scored.
 *
 * The caller sizes a step to the loop that takes it, so that its iterations cover the range
 * exactly: a d of the scores (K), a row and 64 columns of the values (V), in the first query's
 * pass where a kernel makes one a query (attention.c's trickle_rows). Each iteration
 * asks for two lines of it (a longer step's others come by L2's adjacent-line prefetch), from a
 * copy held in registers, and tests nothing: the loops are bound by the two vector ports, which
 * scalar work shares, and a test of each line against the end had cost them 8-15%. So a kernel
 * takes a trickle whole or, where its range is done, not at all (kiln_trickle_begin). */
typedef struct {
    const char *at, *end; /* the next lines to ask for, and the end of the range */
    size_t step;          /* bytes an iteration: a multiple of 128; 0, none */
} kiln_trickle;

static inline kiln_trickle kiln_trickle_of(const void *p, size_t bytes, size_t step) {
    return (kiln_trickle){(const char *)((uintptr_t)p & ~(uintptr_t)63), (const char *)p + bytes,
                          (step + 127) & ~(size_t)127};
}

/* a kernel's copy: none for NULL, or once the range is done */
KILN_INLINE kiln_trickle kiln_trickle_begin(const kiln_trickle *pf) {
    return pf && pf->at < pf->end ? *pf : (kiln_trickle){NULL, NULL, 0};
}

KILN_INLINE void kiln_trickle_step(kiln_trickle *t) {
    if (t->step) { /* the same every iteration: GCC makes the loop twice, with and without */
        __builtin_prefetch(t->at, 0, 2);
        __builtin_prefetch(t->at + t->step / 2, 0, 2);
        t->at += t->step;
    }
}

/* what the kernel leaves for the next */
KILN_INLINE void kiln_trickle_end(kiln_trickle *pf, const kiln_trickle *t) {
    if (pf && t->step) pf->at = t->at;
}

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
                                    const int nv, int hd, float scale, const int half, kiln_trickle *pf) {
    const size_t es = half ? 2 : 4;
    __m512 a[KILN_SPAN_MAX_Q][4];
    for (int i = 0; i < nq; i++)
        for (int v = 0; v < nv; v++) a[i][v] = _mm512_setzero_ps();
    kiln_trickle t = kiln_trickle_begin(pf);
    for (int d = 0; d < hd; d++) {
        kiln_trickle_step(&t);
        const char *k = (const char *)kt + (size_t)d * ld * es;
        __m512 kv[4];
        for (int v = 0; v < nv; v++) kv[v] = kiln_load16(k + 16 * v * es, half);
        for (int i = 0; i < nq; i++) {
            const __m512 qi = _mm512_set1_ps(q[i][d]);
            for (int v = 0; v < nv; v++) a[i][v] = _mm512_fmadd_ps(qi, kv[v], a[i][v]);
        }
    }
    kiln_trickle_end(pf, &t);
    const __m512 sc = _mm512_set1_ps(scale);
    for (int i = 0; i < nq; i++)
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(s[i] + 16 * v, _mm512_mul_ps(a[i][v], sc));
}

#define KILN_SCORES_CASE(nq, nv)                                        \
    case (nq) * 8 + (nv):                                               \
        if (half) kiln_span_scores_n(s, q, nq, kt, ld, nv, hd, scale, 1, pf); \
        else kiln_span_scores_n(s, q, nq, kt, ld, nv, hd, scale, 0, pf);      \
        break;
/* scores of nq <= 6 queries against n = 16 nv <= 64 transposed keys: each shape its own unrolled body */
KILN_INLINE void kiln_span_scores_sw(float *const s[], const float *const q[], int nq, const void *kt, int ld, int half,
                                    int n, int hd, float scale, kiln_trickle *pf) {
    switch (nq * 8 + n / 16) {
        KILN_SCORES_CASE(1, 1) KILN_SCORES_CASE(1, 2) KILN_SCORES_CASE(1, 3) KILN_SCORES_CASE(1, 4)
        KILN_SCORES_CASE(2, 1) KILN_SCORES_CASE(2, 2) KILN_SCORES_CASE(2, 3) KILN_SCORES_CASE(2, 4)
        KILN_SCORES_CASE(3, 1) KILN_SCORES_CASE(3, 2) KILN_SCORES_CASE(3, 3) KILN_SCORES_CASE(3, 4)
        KILN_SCORES_CASE(4, 1) KILN_SCORES_CASE(4, 2) KILN_SCORES_CASE(4, 3) KILN_SCORES_CASE(4, 4)
        KILN_SCORES_CASE(5, 1) KILN_SCORES_CASE(5, 2) KILN_SCORES_CASE(5, 3) KILN_SCORES_CASE(5, 4)
        KILN_SCORES_CASE(6, 1) KILN_SCORES_CASE(6, 2) KILN_SCORES_CASE(6, 3) KILN_SCORES_CASE(6, 4)
    }
}
#undef KILN_SCORES_CASE

/* acc[i][d] += w[i * ldw + j] * rows[j][d] for i < nq, rows in order: 64 columns (16 a register) at a
 * time for every query, so each row load serves all of them. hd is a multiple of 16. The weights
 * are one array with a stride, not a pointer each: one register addresses them all, where the
 * pointers had spilled and were reloaded before every broadcast. */
KILN_INLINE void kiln_span_values_n(float *const acc[], const float *w, int ldw, const int nq,
                                    const void *const rows[], int n, int hd, int half, kiln_trickle *pf) {
    const int es = half ? 2 : 4;
    int d = 0;
    kiln_trickle t = kiln_trickle_begin(pf);
    for (; d + 64 <= hd; d += 64) {
        __m512 a[KILN_SPAN_MAX_Q][4];
        for (int i = 0; i < nq; i++)
            for (int c = 0; c < 4; c++) a[i][c] = _mm512_loadu_ps(acc[i] + d + 16 * c);
        for (int j = 0; j < n; j++) {
            kiln_trickle_step(&t);
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
            kiln_trickle_step(&t);
            const __m512 r = kiln_load16((const char *)rows[j] + d * es, half);
            for (int i = 0; i < nq; i++) a[i] = _mm512_fmadd_ps(_mm512_set1_ps(w[(size_t)i * ldw + j]), r, a[i]);
        }
        for (int i = 0; i < nq; i++) _mm512_storeu_ps(acc[i] + d, a[i]);
    }
    kiln_trickle_end(pf, &t);
}

KILN_INLINE void kiln_span_values_sw(float *const acc[], const float *w, int ldw, int nq, const void *const rows[],
                                    int n, int hd, int half, kiln_trickle *pf) {
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
    case 1: kiln_span_values_n(acc, w, ldw, 1, rows, n, hd, half, pf); break;
    case 2: kiln_span_values_n(acc, w, ldw, 2, rows, n, hd, half, pf); break;
    case 3: kiln_span_values_n(acc, w, ldw, 3, rows, n, hd, half, pf); break;
    case 4: kiln_span_values_n(acc, w, ldw, 4, rows, n, hd, half, pf); break;
    case 5: kiln_span_values_n(acc, w, ldw, 5, rows, n, hd, half, pf); break;
    default: kiln_span_values_n(acc, w, ldw, 6, rows, n, hd, half, pf); break;
    }
}

#elif defined(KILN_AVX2)
/* one query's scores against n <= 64 transposed keys, 8 a register */
KILN_INLINE void kiln_span_scores1(float *s, const float *q, const void *kt, int ld, const int nv, int hd,
                                   float scale, const int half, kiln_trickle *pf) {
    const size_t es = half ? 2 : 4;
    __m256 a[8];
    for (int v = 0; v < nv; v++) a[v] = _mm256_setzero_ps();
    kiln_trickle t = kiln_trickle_begin(pf);
    for (int d = 0; d < hd; d++) {
        kiln_trickle_step(&t);
        const __m256 qd = _mm256_set1_ps(q[d]);
        const char *k = (const char *)kt + (size_t)d * ld * es;
        for (int v = 0; v < nv; v++) a[v] = _mm256_fmadd_ps(qd, kiln_load8(k + 8 * v * es, half), a[v]);
    }
    kiln_trickle_end(pf, &t);
    for (int v = 0; v < nv; v++) _mm256_storeu_ps(s + 8 * v, _mm256_mul_ps(a[v], _mm256_set1_ps(scale)));
}

#define KILN_SCORES_CASE(nv)                                              \
    case nv:                                                              \
        if (half) kiln_span_scores1(s[i], q[i], kt, ld, nv, hd, scale, 1, i ? NULL : pf); \
        else kiln_span_scores1(s[i], q[i], kt, ld, nv, hd, scale, 0, i ? NULL : pf);      \
        break;
KILN_INLINE void kiln_span_scores_sw(float *const s[], const float *const q[], int nq, const void *kt, int ld, int half,
                                    int n, int hd, float scale, kiln_trickle *pf) {
    for (int i = 0; i < nq; i++) switch (n / 8) { /* each width its own unrolled body */
        KILN_SCORES_CASE(1) KILN_SCORES_CASE(2) KILN_SCORES_CASE(3) KILN_SCORES_CASE(4)
        KILN_SCORES_CASE(5) KILN_SCORES_CASE(6) KILN_SCORES_CASE(7) KILN_SCORES_CASE(8)
        }
}
#undef KILN_SCORES_CASE

/* one query's weighted rows: 64 columns in registers across the rows, then 8 at a time, then one */
KILN_INLINE void kiln_span_values_sw(float *const acc[], const float *w, int ldw, int nq, const void *const rows[],
                                    int n, int hd, int half, kiln_trickle *pf) {
    const int es = half ? 2 : 4;
    kiln_trickle t = kiln_trickle_begin(pf);
    for (int i = 0; i < nq; i++) {
        float *o = acc[i];
        const float *wi = w + (size_t)i * ldw;
        int d = 0;
        for (; d + 64 <= hd; d += 64) {
            __m256 a[8];
            for (int k = 0; k < 8; k++) a[k] = _mm256_loadu_ps(o + d + 8 * k);
            for (int j = 0; j < n; j++) {
                kiln_trickle_step(&t);
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
        if (i == 0) kiln_trickle_end(pf, &t), t.step = 0; /* in the first query's pass alone */
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
                                   float scale, const int half, kiln_trickle *pf) {
    const size_t es = half ? 2 : 4;
    float32x4_t a[16];
    for (int v = 0; v < nv; v++) a[v] = vdupq_n_f32(0.0f);
    kiln_trickle t = kiln_trickle_begin(pf);
    for (int d = 0; d < hd; d++) {
        kiln_trickle_step(&t);
        const float32x4_t qd = vdupq_n_f32(q[d]);
        const char *k = (const char *)kt + (size_t)d * ld * es;
        for (int v = 0; v < nv; v++) a[v] = vfmaq_f32(a[v], qd, kiln_load4(k + 4 * v * es, half));
    }
    kiln_trickle_end(pf, &t);
    for (int v = 0; v < nv; v++) vst1q_f32(s + 4 * v, vmulq_f32(a[v], vdupq_n_f32(scale)));
}

#define KILN_SCORES_CASE(n8)                                                  \
    case n8:                                                                  \
        if (half) kiln_span_scores1(s[i], q[i], kt, ld, 2 * n8, hd, scale, 1, i ? NULL : pf); \
        else kiln_span_scores1(s[i], q[i], kt, ld, 2 * n8, hd, scale, 0, i ? NULL : pf);      \
        break;
KILN_INLINE void kiln_span_scores_sw(float *const s[], const float *const q[], int nq, const void *kt, int ld, int half,
                                    int n, int hd, float scale, kiln_trickle *pf) {
    for (int i = 0; i < nq; i++) switch (n / 8) { /* each width its own unrolled body */
        KILN_SCORES_CASE(1) KILN_SCORES_CASE(2) KILN_SCORES_CASE(3) KILN_SCORES_CASE(4)
        KILN_SCORES_CASE(5) KILN_SCORES_CASE(6) KILN_SCORES_CASE(7) KILN_SCORES_CASE(8)
        }
}
#undef KILN_SCORES_CASE

/* one query's weighted rows: 64 columns in registers across the rows, then 4 at a time, then one */
KILN_INLINE void kiln_span_values_sw(float *const acc[], const float *w, int ldw, int nq, const void *const rows[],
                                    int n, int hd, int half, kiln_trickle *pf) {
    const int es = half ? 2 : 4;
    kiln_trickle t = kiln_trickle_begin(pf);
    for (int i = 0; i < nq; i++) {
        float *o = acc[i];
        const float *wi = w + (size_t)i * ldw;
        int d = 0;
        for (; d + 64 <= hd; d += 64) {
            float32x4_t a[16];
            for (int k = 0; k < 16; k++) a[k] = vld1q_f32(o + d + 4 * k);
            for (int j = 0; j < n; j++) {
                kiln_trickle_step(&t);
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
        if (i == 0) kiln_trickle_end(pf, &t), t.step = 0; /* in the first query's pass alone */
    }
}

#else
/* kt[d * ld + j] = rows[j][d] for j < n and d < hd: dequantized rows */
static inline void kiln_span_transpose(float *kt, int ld, const float *const rows[], int n, int hd) {
    for (int d = 0; d < hd; d++)
        for (int j = 0; j < n; j++) kt[(size_t)d * ld + j] = rows[j][d];
}

/* each score's chain on its own */
KILN_INLINE void kiln_span_scores_sw(float *const s[], const float *const q[], int nq, const void *kt, int ld, int half,
                                    int n, int hd, float scale, kiln_trickle *pf) {
    (void)pf; /* no trickle in the scalar build: the hardware's prefetchers alone */
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
KILN_INLINE void kiln_span_values_sw(float *const acc[], const float *w, int ldw, int nq, const void *const rows[],
                                    int n, int hd, int half, kiln_trickle *pf) {
    (void)half, (void)pf;
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < n; j++) kiln_vaxpy(acc[i], w[(size_t)i * ldw + j], rows[j], hd);
}
#endif

/* The kernels as attention.c calls them: the copy without a trickle made with a literal NULL, so
 * that prefill's loops (never given one) hold no prefetches and no test of them. */
static inline void kiln_span_scores(float *const s[], const float *const q[], int nq, const void *kt, int ld, int half,
                                    int n, int hd, float scale, kiln_trickle *pf) {
    if (pf) kiln_span_scores_sw(s, q, nq, kt, ld, half, n, hd, scale, pf);
    else kiln_span_scores_sw(s, q, nq, kt, ld, half, n, hd, scale, NULL);
}

static inline void kiln_span_values(float *const acc[], const float *w, int ldw, int nq, const void *const rows[],
                                    int n, int hd, int half, kiln_trickle *pf) {
    if (pf) kiln_span_values_sw(acc, w, ldw, nq, rows, n, hd, half, pf);
    else kiln_span_values_sw(acc, w, ldw, nq, rows, n, hd, half, NULL);
}

/* A tile's softmax numerators: query i < nq sees rows from[i] .. to[i] of its scores s[i][0 .. n)
 * (n a multiple of KILN_SPAN_KEYS; the others score -inf and weigh 0). Each row becomes
 * e^(s - max), max[i] is the largest visible score (kiln_vmax) and den[i] the numerators' sum
 * (kiln_vexp_sum). The AVX-512 body takes the tile's queries side by side, so that their latency
 * chains (max, then exps, then sums) overlap: one query after another, each had waited on its
 * own. It computes each of them op for op as below, which is the definition. */
static inline void kiln_span_softmax_ref(float *const s[], int nq, int n, const int from[], const int to[],
                                         float max[], float den[]) {
    for (int i = 0; i < nq; i++) {
        for (int j = 0; j < n && j < from[i]; j++) s[i][j] = -INFINITY;
        for (int j = to[i] + 1 > 0 ? to[i] + 1 : 0; j < n; j++) s[i][j] = -INFINITY;
        max[i] = kiln_vmax(s[i], n);
        den[i] = kiln_vexp_sum(s[i], max[i], n); /* exp(-inf) = 0 for the rows it cannot see */
    }
}

#if defined(__AVX512F__)
KILN_INLINE __m256 kiln_high8(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

KILN_INLINE void kiln_span_softmax_n(float *const s[], const int nq, const int nv, const int from[], const int to[],
                                     float max[], float den[]) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 x[KILN_SPAN_MAX_Q][4];
    __m256 m8[KILN_SPAN_MAX_Q], s8[KILN_SPAN_MAX_Q];
    for (int i = 0; i < nq; i++) { /* kiln_vmax's eight-lane maxes, in order, of the masked scores */
        const __m512i lo = _mm512_set1_epi32(from[i]), hi = _mm512_set1_epi32(to[i]);
        m8[i] = _mm256_set1_ps(-INFINITY);
        for (int v = 0; v < nv; v++) {
            const __m512i j = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * v));
            const __mmask16 seen = _mm512_cmp_epi32_mask(j, lo, _MM_CMPINT_NLT) & _mm512_cmp_epi32_mask(j, hi, _MM_CMPINT_LE);
            x[i][v] = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), seen, s[i] + 16 * v);
            m8[i] = _mm256_max_ps(m8[i], _mm512_castps512_ps256(x[i][v]));
            m8[i] = _mm256_max_ps(m8[i], kiln_high8(x[i][v]));
        }
    }
    for (int i = 0; i < nq; i++) { /* its folds */
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8[i]), _mm256_extractf128_ps(m8[i], 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        max[i] = _mm_cvtss_f32(m4);
    }
    for (int i = 0; i < nq; i++) { /* kiln_vexp_sum's exps and sums */
        const __m512 m = _mm512_set1_ps(max[i]);
        s8[i] = _mm256_setzero_ps();
        for (int v = 0; v < nv; v++) {
            const __m512 e = kiln_exp16(_mm512_sub_ps(x[i][v], m));
            _mm512_storeu_ps(s[i] + 16 * v, e);
            s8[i] = _mm256_add_ps(_mm256_add_ps(s8[i], _mm512_castps512_ps256(e)), kiln_high8(e));
        }
    }
    for (int i = 0; i < nq; i++) den[i] = kiln_hsum8(s8[i]);
}

#define KILN_SOFTMAX_CASE(nq, nv) \
    case (nq) * 8 + (nv): kiln_span_softmax_n(s, nq, nv, from, to, max, den); break;
static inline void kiln_span_softmax(float *const s[], int nq, int n, const int from[], const int to[], float max[],
                                     float den[]) {
    switch (nq * 8 + n / 16) { /* each shape its own unrolled body */
        KILN_SOFTMAX_CASE(1, 1) KILN_SOFTMAX_CASE(1, 2) KILN_SOFTMAX_CASE(1, 3) KILN_SOFTMAX_CASE(1, 4)
        KILN_SOFTMAX_CASE(2, 1) KILN_SOFTMAX_CASE(2, 2) KILN_SOFTMAX_CASE(2, 3) KILN_SOFTMAX_CASE(2, 4)
        KILN_SOFTMAX_CASE(3, 1) KILN_SOFTMAX_CASE(3, 2) KILN_SOFTMAX_CASE(3, 3) KILN_SOFTMAX_CASE(3, 4)
        KILN_SOFTMAX_CASE(4, 1) KILN_SOFTMAX_CASE(4, 2) KILN_SOFTMAX_CASE(4, 3) KILN_SOFTMAX_CASE(4, 4)
        KILN_SOFTMAX_CASE(5, 1) KILN_SOFTMAX_CASE(5, 2) KILN_SOFTMAX_CASE(5, 3) KILN_SOFTMAX_CASE(5, 4)
        KILN_SOFTMAX_CASE(6, 1) KILN_SOFTMAX_CASE(6, 2) KILN_SOFTMAX_CASE(6, 3) KILN_SOFTMAX_CASE(6, 4)
    default: kiln_span_softmax_ref(s, nq, n, from, to, max, den);
    }
}
#undef KILN_SOFTMAX_CASE
#else
#define kiln_span_softmax kiln_span_softmax_ref
#endif

#endif
