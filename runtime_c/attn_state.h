/* attn_state.h: attention's running softmax state and its one merge (attention.c). Spans are
 * scored from an empty state and folded into a query's running one in span order, on every path:
 * fold() one state at a time (decode), fold_tile() a prefill tile's at once, lane for lane the same. */
#ifndef KILN_ATTN_STATE_H
#define KILN_ATTN_STATE_H

#include <math.h>
#include <string.h>

#include "kernels.h"
#include "vec_f32.h"

#define ATTN_MAX_Q 16 /* queries that share one pass over a kv head's rows */

/* A softmax state: weighted V sum (not yet divided), max score, denominator. In scratch a
 * span's state is laid out as [max, denom, acc[head_dim]]. max = -inf: the state is empty. */
typedef struct {
    float *acc;
    float *max, *denom;
} attn_state;

/* Fold span state p into running state r: the one merge every path uses, in span order. */
static void fold(attn_state r, const float *p_acc, float p_max, float p_denom, int hd) {
    if (p_max == -INFINITY) return;
    const float m = p_max > *r.max ? p_max : *r.max;
    const float a = kiln_expf(*r.max - m), b = kiln_expf(p_max - m); /* a = 0 while r is empty */
    *r.denom = fmaf(*r.denom, a, p_denom * b);
    for (int d = 0; d < hd; d++) r.acc[d] = fmaf(r.acc[d], a, p_acc[d] * b);
    *r.max = m;
}

/* fold() for a tile's n states at once (prefill's queries after each span): their exps eight
 * lanes at a time, each lane kiln_expf's bits (vec_f32.h), then each state's columns as fold()
 * takes them. Scalar one by one, the exps' chains had waited on each other. */
static void fold_tile(const attn_state r[], const float (*p_acc)[KILN_MAX_HEAD_DIM], const float p_max[],
                      const float p_denom[], int n, int hd) {
    float m[ATTN_MAX_Q], a[ATTN_MAX_Q], b[ATTN_MAX_Q];
    int k = 0;
#ifdef KILN_AVX2
    for (; k + 8 <= n; k += 8) {
        float rm[8];
        for (int l = 0; l < 8; l++) rm[l] = *r[k + l].max;
        const __m256 pm = _mm256_loadu_ps(p_max + k), vr = _mm256_loadu_ps(rm);
        const __m256 vm = _mm256_max_ps(pm, vr); /* pm > rm ? pm : rm, as fold() */
        _mm256_storeu_ps(m + k, vm);
        _mm256_storeu_ps(a + k, kiln_exp8(_mm256_sub_ps(vr, vm)));
        _mm256_storeu_ps(b + k, kiln_exp8(_mm256_sub_ps(pm, vm)));
    }
#endif
    for (; k < n; k++) {
        m[k] = p_max[k] > *r[k].max ? p_max[k] : *r[k].max;
        a[k] = kiln_expf(*r[k].max - m[k]), b[k] = kiln_expf(p_max[k] - m[k]);
    }
    for (k = 0; k < n; k++) {
        if (p_max[k] == -INFINITY) continue;
        float *restrict acc = r[k].acc;
        const float *restrict pa = p_acc[k];
        const float ak = a[k], bk = b[k];
        *r[k].denom = fmaf(*r[k].denom, ak, p_denom[k] * bk);
        for (int d = 0; d < hd; d++) acc[d] = fmaf(acc[d], ak, pa[d] * bk);
        *r[k].max = m[k];
    }
}

static void clear(attn_state st, int hd) {
    *st.max = -INFINITY, *st.denom = 0.0f;
    memset(st.acc, 0, (size_t)hd * sizeof(float));
}

#endif
