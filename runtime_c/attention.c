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
#include "simd_f32.h"

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

void kiln_kv_store_mt(const kiln_thread *t, int type, void *k_cache, void *v_cache, const float *k, const float *v,
                      const int32_t *pos, int n_tokens, int capacity, int n_head_kv, int head_dim) {
    int t0, t1;
    kiln_share(t, n_tokens, 1, &t0, &t1);
    const size_t at = (size_t)t0 * n_head_kv * head_dim;
    if (t1 > t0) kiln_kv_store(type, k_cache, v_cache, k + at, v + at, pos + t0, t1 - t0, capacity, n_head_kv, head_dim);
}

/* Rows first .. first+n-1 (mod capacity) of one head's cache as f32: f32 rows are read in
 * place, others are dequantized into buf in as few calls as the ring allows (one, or two
 * when the rows wrap), since a call per row cost more than the conversion. */
static void cache_rows(int type, const uint8_t *head, size_t row_bytes, int first, int n, int capacity, float *buf,
                       int hd, const float *rows[]) {
    for (int done = 0; done < n;) {
        const int row = (first + done) % capacity, run = n - done < capacity - row ? n - done : capacity - row;
        const uint8_t *src = head + (size_t)row * row_bytes;
        if (type != KILN_F32) kiln_dequantize_row(type, src, buf + (size_t)done * hd, run * hd);
        for (int k = 0; k < run; k++)
            rows[done + k] = type == KILN_F32 ? (const float *)(src + k * row_bytes) : buf + (size_t)(done + k) * hd;
        done += run;
    }
}

#define ATTN_CHUNK 64 /* cache rows scored at once: softmax runs over a chunk, rescaling between chunks */
#define ATTN_MAX_Q 16 /* queries that share one pass over a kv head's rows */

/* The running softmax of one query: weighted V sum (not yet divided), max score, denominator.
 * In scratch, a split's partial state is laid out as [max, denom, acc[head_dim]]. */
typedef struct {
    float *acc;
    float *max, *denom;
} attn_state;

/* Queries q[i] (i < nq, all reading one kv head), query i seeing cache positions first[i] ..
 * last[i], against the rows of the union of those ranges, a chunk at a time: scores of every
 * query against the chunk's K rows (-inf outside a query's range), the running max and
 * denominator rescaled when the max grows (online softmax by chunks), then the chunk's V rows
 * weighted into every query. Each K and V row is read (or dequantized) once for all queries. */
static void attend(int type, const attn_state st[], const float *const q[], const int first[], const int last[], int nq,
                   const uint8_t *kh, const uint8_t *vh, size_t row_bytes, int capacity, int hd, float scale) {
    float s[ATTN_MAX_Q][ATTN_CHUNK];
    float buf[type == KILN_F32 ? 1 : ATTN_CHUNK * hd]; /* dequantized rows of one chunk */
    const float *rows[ATTN_CHUNK];
    int lo = first[0], hi = last[0];
    for (int i = 0; i < nq; i++) {
        *st[i].max = -INFINITY, *st[i].denom = 0.0f;
        memset(st[i].acc, 0, (size_t)hd * sizeof(float));
        lo = first[i] < lo ? first[i] : lo, hi = last[i] > hi ? last[i] : hi;
    }
    for (int j0 = lo; j0 <= hi; j0 += ATTN_CHUNK) {
        const int nj = hi - j0 + 1 < ATTN_CHUNK ? hi - j0 + 1 : ATTN_CHUNK;
        cache_rows(type, kh, row_bytes, j0, nj, capacity, buf, hd, rows);
        for (int i = 0; i < nq; i++) {
            kiln_vdots(s[i], q[i], rows, nj, hd, scale, i == 0); /* the first query pulls the rows in */
            for (int jj = 0; jj < nj; jj++)
                if (j0 + jj < first[i] || j0 + jj > last[i]) s[i][jj] = -INFINITY;
            const float m = kiln_vmax(s[i], nj);
            if (m == -INFINITY) { /* none of this chunk's rows is visible to query i */
                memset(s[i], 0, (size_t)nj * sizeof(float));
                continue;
            }
            if (m > *st[i].max) {
                const float c = expf(*st[i].max - m); /* 0 on the first chunk */
                *st[i].denom *= c;
                kiln_vscale(st[i].acc, c, hd);
                *st[i].max = m;
            }
            *st[i].denom += kiln_vexp_sum(s[i], *st[i].max, nj); /* exp(-inf) = 0 for the rows it cannot see */
        }
        cache_rows(type, vh, row_bytes, j0, nj, capacity, buf, hd, rows);
        for (int i = 0; i < nq; i++) kiln_vaxpys(st[i].acc, s[i], rows, nj, hd);
    }
}

/* Decode with split positions: one query token's heads, grouped by kv head, against `splits`
 * equal ranges of the positions it sees; each (kv head, range) item leaves its queries' partial
 * softmax in scratch, and after a barrier each head merges its ranges. The group shares each
 * pass over its rows and the threads get equal shares, whatever the number of kv heads. The
 * ranges depend on the position alone, never on the thread count. */
static void attend_split(const kiln_thread *th, int type, float *out, const float *q, int p, int first,
                         const uint8_t *k_cache, const uint8_t *v_cache, size_t row_bytes, int capacity, int n_head,
                         int n_head_kv, int hd, float scale, int splits, float *scratch) {
    const int group = n_head / n_head_kv, per = (p - first + splits) / splits;
    const size_t part = (size_t)hd + 2;
    for (int item = th->ith; item < n_head_kv * splits; item += th->nth) {
        const int g = item / splits, sp = item % splits, a = first + sp * per, b = a + per - 1 < p ? a + per - 1 : p;
        const float *qs[ATTN_MAX_Q];
        attn_state st[ATTN_MAX_Q];
        int lo[ATTN_MAX_Q], hi[ATTN_MAX_Q];
        for (int i = 0; i < group; i++) {
            float *slot = scratch + ((size_t)(g * group + i) * splits + sp) * part;
            st[i] = (attn_state){slot + 2, slot, slot + 1};
            qs[i] = q + (size_t)(g * group + i) * hd, lo[i] = a, hi[i] = b;
        }
        if (a > b) { /* fewer positions than ranges: this one is empty */
            for (int i = 0; i < group; i++) *st[i].max = -INFINITY, *st[i].denom = 0.0f;
            continue;
        }
        attend(type, st, qs, lo, hi, group, k_cache + (size_t)g * capacity * row_bytes,
               v_cache + (size_t)g * capacity * row_bytes, row_bytes, capacity, hd, scale);
    }
    kiln_barrier(th);
    for (int h = th->ith; h < n_head; h += th->nth) {
        const float *slot = scratch + (size_t)h * splits * part;
        float m = -INFINITY, denom = 0.0f;
        for (int sp = 0; sp < splits; sp++) m = slot[sp * part] > m ? slot[sp * part] : m;
        float *oh = out + (size_t)h * hd;
        memset(oh, 0, (size_t)hd * sizeof(float));
        for (int sp = 0; sp < splits; sp++) {
            const float *ps = slot + sp * part;
            if (ps[0] == -INFINITY) continue;
            const float c = expf(ps[0] - m);
            denom += c * ps[1];
            kiln_vaxpy(oh, c, ps + 2, hd);
        }
        kiln_vscale(oh, 1.0f / denom, hd);
    }
}

void kiln_attention_mt(const kiln_thread *th, int type, float *out, const float *q, const int32_t *pos, int n_tokens,
                       const void *k_cache, const void *v_cache, int capacity, int window, int n_head,
                       int n_head_kv, int head_dim, float scale, int splits, void *scratch) {
    const int group = n_head / n_head_kv;
    const size_t row_bytes = kiln_row_bytes(type, head_dim);
    if (n_tokens == 1 && splits > 1 && scratch && group <= ATTN_MAX_Q) {
        const int p = pos[0], first = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
        attend_split(th, type, out, q, p, first, k_cache, v_cache, row_bytes, capacity, n_head, n_head_kv, head_dim,
                     scale, splits, scratch);
        return;
    }
    /* An item is a block of tokens' query heads that read one kv head. Prefill: the whole group
     * of every token in the block shares each pass over the rows. Otherwise single heads, so that
     * the threads get equal shares. The choice must not depend on the thread count, or logits
     * would change with it. */
    const int prefill = n_tokens > 1 && group <= ATTN_MAX_Q;
    const int heads = prefill ? group : 1, block = prefill ? ATTN_MAX_Q / group : 1;
    const int per_block = n_head / heads, n_blocks = (n_tokens + block - 1) / block;
    for (int item = th->ith; item < n_blocks * per_block; item += th->nth) {
        const int t0 = item / per_block * block, h0 = item % per_block * heads, g = h0 / group;
        const int nt = n_tokens - t0 < block ? n_tokens - t0 : block;
        const float *qs[ATTN_MAX_Q];
        float *os[ATTN_MAX_Q];
        float acc[ATTN_MAX_Q][KILN_MAX_HEAD_DIM], max[ATTN_MAX_Q], denom[ATTN_MAX_Q];
        attn_state st[ATTN_MAX_Q];
        int first[ATTN_MAX_Q], last[ATTN_MAX_Q], nq = 0;
        for (int t = t0; t < t0 + nt; t++)
            for (int h = h0; h < h0 + heads; h++, nq++) {
                const int p = pos[t];
                first[nq] = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0, last[nq] = p;
                qs[nq] = q + ((size_t)t * n_head + h) * head_dim;
                os[nq] = out + ((size_t)t * n_head + h) * head_dim;
                st[nq] = (attn_state){acc[nq], &max[nq], &denom[nq]};
            }
        attend(type, st, qs, first, last, nq, (const uint8_t *)k_cache + (size_t)g * capacity * row_bytes,
               (const uint8_t *)v_cache + (size_t)g * capacity * row_bytes, row_bytes, capacity, head_dim, scale);
        for (int i = 0; i < nq; i++)
            for (int d = 0; d < head_dim; d++) os[i][d] = acc[i][d] / denom[i];
    }
}

void kiln_attention(int type, float *out, const float *q, const int32_t *pos, int n_tokens, const void *k_cache,
                    const void *v_cache, int capacity, int window, int n_head, int n_head_kv, int head_dim,
                    float scale, int splits, void *scratch) {
    const kiln_thread alone = {0, 1, NULL};
    kiln_attention_mt(&alone, type, out, q, pos, n_tokens, k_cache, v_cache, capacity, window, n_head, n_head_kv,
                      head_dim, scale, splits, scratch);
}

/* The reference: one row at a time, online softmax in scalar float. */
void kiln_attention_ref(int type, float *out, const float *q, const int32_t *pos, int n_tokens, const void *k_cache,
                        const void *v_cache, int capacity, int window, int n_head, int n_head_kv, int head_dim,
                        float scale) {
    const int group = n_head / n_head_kv;
    const size_t row_bytes = kiln_row_bytes(type, head_dim);
    float acc[KILN_MAX_HEAD_DIM], kr[KILN_MAX_HEAD_DIM], vr[KILN_MAX_HEAD_DIM];
    for (int item = 0; item < n_tokens * n_head; item++) {
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
            float s = 0.0f;
            for (int d = 0; d < head_dim; d++) s += qh[d] * kr[d];
            s *= scale;
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
