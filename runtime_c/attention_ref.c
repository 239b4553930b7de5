/* attention_ref.c: attention one cache row at a time in scalar float, the reference the span
 * kernels (attention.c) are tested against, and the same scores for heavy-hitter eviction's
 * bookkeeping (H2O), which wants each position's weight rather than a weighted sum. Both read
 * K a row at a time, gathered from a transposed K (kv_view.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kv_view.h"
#include "vec_f32.h"

void kiln_attention_mass(const float *q, const int32_t *seq, const int32_t *row, const int32_t *seen, int n_tokens,
                         const kiln_kv_view *kv, int n_head, int n_head_kv, int head_dim, float scale, float softcap,
                         const float *sinks, float alibi) {
    const int group = n_head / n_head_kv;
    const size_t k_row = kiln_row_bytes(kv->k_type, head_dim);
    float kr[KILN_MAX_HEAD_DIM];
    uint8_t raw[KILN_MAX_HEAD_DIM * sizeof(float)];
    float *s = malloc(sizeof(float) * (size_t)kv->mass_stride); /* one head's scores over a history */
    float slopes[alibi > 0.0f ? n_head : 1];
    if (!s) return; /* the bookkeeping is skipped, never the attention */
    if (alibi > 0.0f) kiln_alibi_slopes(slopes, n_head, alibi);
    for (int t = 0; t < n_tokens; t++) {
        const int32_t *table = kiln_kv_table(kv, seq[t]);
        const int first = kiln_kv_first_visible(kv, row[t]), n = kiln_kv_last_visible(kv, row[t], seen[t]) - first + 1;
        float *mass = kv->mass + (size_t)seq[t] * kv->mass_stride + first;
        for (int h = 0; h < n_head; h++) {
            const float *qh = q + ((size_t)t * n_head + h) * head_dim;
            float max = -INFINITY, denom = 0.0f;
            for (int j = 0; j < n; j++) {
                kiln_kv_k_read(kv, table, h / group, first + j, k_row, raw);
                kiln_dequantize_row_ref(kv->k_type, raw, kr, head_dim);
                float dot = 0.0f; /* the scores' chain (attn_span.h) */
                for (int d = 0; d < head_dim; d++) dot = fmaf(qh[d], kr[d], dot);
                s[j] = dot * scale;
                if (alibi > 0.0f) s[j] += slopes[h] * (float)-abs(row[t] - (first + j));
                if (softcap != 0.0f) kiln_vsoftcap(&s[j], 1, softcap);
                max = s[j] > max ? s[j] : max;
            }
            if (sinks) max = sinks[h] > max ? sinks[h] : max;
            for (int j = 0; j < n; j++) denom += s[j] = kiln_expf(s[j] - max);
            if (sinks) denom += kiln_expf(sinks[h] - max);
            for (int j = 0; j < n; j++) mass[j] += s[j] / denom;
        }
    }
    free(s);
}

/* The reference: one row at a time, online softmax in scalar float. */
void kiln_attention_ref(float *out, const float *q, const int32_t *seq, const int32_t *row, const int32_t *seen,
                        int n_tokens, const kiln_kv_view *kv, int n_head, int n_head_kv, int head_dim, float scale,
                        float softcap, const float *sinks, float alibi) {
    const int group = n_head / n_head_kv;
    float slopes[alibi > 0.0f ? n_head : 1];
    if (alibi > 0.0f) kiln_alibi_slopes(slopes, n_head, alibi);
    const size_t k_row = kiln_row_bytes(kv->k_type, head_dim), v_row = kiln_row_bytes(kv->v_type, head_dim);
    float acc[KILN_MAX_HEAD_DIM], kr[KILN_MAX_HEAD_DIM], vr[KILN_MAX_HEAD_DIM];
    uint8_t raw[KILN_MAX_HEAD_DIM * sizeof(float)];
    for (int item = 0; item < n_tokens * n_head; item++) {
        const int t = item / n_head, h = item % n_head, p = row[t];
        const int32_t *table = kiln_kv_table(kv, seq[t]);
        const float *qh = q + ((size_t)t * n_head + h) * head_dim;
        float *oh = out + ((size_t)t * n_head + h) * head_dim;
        float max = -INFINITY, denom = 0.0f;
        memset(acc, 0, (size_t)head_dim * sizeof(float));
        const int last = kiln_kv_last_visible(kv, p, seen[t]);
        for (int j = kiln_kv_first_visible(kv, p); j <= last; j++) { /* online softmax: rescale on a new maximum */
            kiln_kv_k_read(kv, table, h / group, j, k_row, raw);
            kiln_dequantize_row_ref(kv->k_type, raw, kr, head_dim);
            float s = 0.0f;
            for (int d = 0; d < head_dim; d++) s += qh[d] * kr[d];
            s *= scale;
            if (alibi > 0.0f) s += slopes[h] * (float)-abs(p - j);
            if (softcap != 0.0f) s = tanhf(s * (1.0f / softcap)) * softcap;
            if (s > max) {
                const float c = expf(max - s);
                denom *= c;
                for (int d = 0; d < head_dim; d++) acc[d] *= c;
                max = s;
            }
            const float w = expf(s - max);
            denom += w;
            kiln_dequantize_row_ref(kv->v_type, kiln_kv_row(kv, table, 1, h / group, j, v_row), vr, head_dim);
            for (int d = 0; d < head_dim; d++) acc[d] += w * vr[d];
        }
        if (sinks) { /* the sink: a logit with no value row, last (ggml's order) */
            const float m = sinks[h] > max ? sinks[h] : max;
            denom = denom * expf(max - m) + expf(sinks[h] - m);
            for (int d = 0; d < head_dim; d++) acc[d] *= expf(max - m);
        }
        for (int d = 0; d < head_dim; d++) oh[d] = acc[d] / denom;
    }
}
