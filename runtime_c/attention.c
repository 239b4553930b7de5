/* attention.c: the KV-cache write and causal GQA attention over the head-major cache.
 *
 * Cache of one layer: k[kv_head][row][head_dim], v likewise, in the cache's type (f32, f16
 * or q8_0): rows are quantized on write and dequantized on read through quant.c's type
 * table, so one attention serves every cache dtype. Position p lives at row p % capacity:
 * global layers have capacity >= ctx, so the row is the position; sliding layers wrap
 * around a ring that the planner sized to hold every row a step can see.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "kernels_mt.h"
#include "quant_impl.h"

void kiln_kv_store(int type, void *k_cache, void *v_cache, const float *k, const float *v, const int32_t *pos,
                   int n_tokens, int capacity, int n_head_kv, int head_dim) {
    const size_t row_bytes = kiln_row_bytes(type, head_dim);
    for (int t = 0; t < n_tokens; t++) {
        const int row = pos[t] % capacity;
        for (int h = 0; h < n_head_kv; h++) {
            const size_t src = ((size_t)t * n_head_kv + h) * head_dim, dst = ((size_t)h * capacity + row) * row_bytes;
            kiln_quantize_row(type, k + src, (uint8_t *)k_cache + dst, head_dim);
            kiln_quantize_row(type, v + src, (uint8_t *)v_cache + dst, head_dim);
        }
    }
}

void kiln_attention_mt(const kiln_thread *th, int type, float *out, const float *q, const int32_t *pos, int n_tokens,
                       const void *k_cache, const void *v_cache, int capacity, int window, int n_head,
                       int n_head_kv, int head_dim, float scale) {
    const int group = n_head / n_head_kv;
    const size_t row_bytes = kiln_row_bytes(type, head_dim);
    float acc[KILN_MAX_HEAD_DIM], kr[KILN_MAX_HEAD_DIM], vr[KILN_MAX_HEAD_DIM];
    for (int item = th->ith; item < n_tokens * n_head; item += th->nth) {
        const int t = item / n_head, h = item % n_head;
        const int p = pos[t];
        const int first = (window > 0 && p - window + 1 > 0) ? p - window + 1 : 0;
        const float *qh = q + ((size_t)t * n_head + h) * head_dim;
        const uint8_t *kh = (const uint8_t *)k_cache + (size_t)(h / group) * capacity * row_bytes;
        const uint8_t *vh = (const uint8_t *)v_cache + (size_t)(h / group) * capacity * row_bytes;
        float *oh = out + ((size_t)t * n_head + h) * head_dim;
        float max = -INFINITY, denom = 0.0f;
        memset(acc, 0, (size_t)head_dim * sizeof(float));
        for (int j = first; j <= p; j++) { /* online softmax: rescale when a new maximum appears */
            const size_t row = (size_t)(j % capacity) * row_bytes;
            kiln_dequantize_row(type, kh + row, kr, head_dim);
            const float s = kiln_dot_f32(head_dim, qh, kr) * scale;
            if (s > max) {
                const float c = expf(max - s);
                denom *= c;
                for (int d = 0; d < head_dim; d++) acc[d] *= c;
                max = s;
            }
            const float w = expf(s - max);
            denom += w;
            kiln_dequantize_row(type, vh + row, vr, head_dim);
            for (int d = 0; d < head_dim; d++) acc[d] += w * vr[d];
        }
        for (int d = 0; d < head_dim; d++) oh[d] = acc[d] / denom;
    }
}

void kiln_attention(int type, float *out, const float *q, const int32_t *pos, int n_tokens, const void *k_cache,
                    const void *v_cache, int capacity, int window, int n_head, int n_head_kv, int head_dim,
                    float scale) {
    const kiln_thread alone = {0, 1, NULL};
    kiln_attention_mt(&alone, type, out, q, pos, n_tokens, k_cache, v_cache, capacity, window, n_head, n_head_kv,
                      head_dim, scale);
}
