/* attention.c: causal GQA attention over the paged, head-major KV cache.
 *
 * Rows are dequantized on read through the type table (types.c), so one attention serves every
 * cache dtype, K and V each their own (f32 rows, and f16 rows where the vector loops convert on
 * load, are read in place).
 *
 * Batch invariance. A query's result must be bit-identical whatever else the step holds and
 * however many threads run it. So every query's history is cut at fixed positions, multiples
 * of KILN_ATTN_SPAN: a span's softmax state (max, denominator, weighted V sum) is computed on its
 * own, from a fresh state, and the spans are folded in ascending order by one function. Inside
 * a span, rows are staged in groups aligned to absolute positions, so a score always lands in
 * the same lane of the same vector sum. Queries that share a span only share its loads: rows a
 * query cannot see score -inf and weigh exactly 0, and rows no query of the pass can see read a
 * row of zeros, so they add exactly 0 as well.
 *
 * Shape. A span is staged once and then taken by every query that sees it: one token's query
 * heads in decode, a block of up to ATTN_ITEM_Q queries in prefill, where the span is read from
 * memory once for the block instead of once per few tokens. The scores read K transposed: an f16
 * or f32 K as the cache holds it (kv_view.h), in place when the span lies in one page; other K
 * types are dequantized and transposed on the stack.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kernels_mt.h"
#include "attn_fetch.h"
#include "attn_span.h"
#include "attn_state.h"
#include "kv_view.h"

#define SPAN KILN_ATTN_SPAN
#define ATTN_ITEM_Q 256 /* queries of one prefill item, which take each span of their history in turn */
#define ATTN_ITEM_FLOATS 16384 /* their running softmax states: [queries][head_dim], 64 KB of stack */

static const float ZERO_ROW[KILN_MAX_HEAD_DIM];

static int part_type(const kiln_kv_view *kv, int part) { return part ? kv->v_type : kv->k_type; }

/* rows[j - j0] for positions j0 .. j0+n-1 of one head: positions outside [lo, hi] read zeros
 * (all-zero bytes, in f32 or f16); rows are pointed at in place, or dequantized into buf as f32
 * a page run at a time. */
static void cache_rows(const kiln_kv_view *kv, const int32_t *table, int part, int h, size_t row_bytes,
                       int j0, int n, int lo, int hi, float *buf, int hd, const void *rows[]) {
    const int type = part_type(kv, part), direct = in_place(type, hd);
    for (int j = j0; j < j0 + n;) {
        if (j < lo || j > hi) {
            rows[j++ - j0] = ZERO_ROW;
            continue;
        }
        const int page_end = (j / kv->page_size + 1) * kv->page_size;
        int end = hi + 1 < j0 + n ? hi + 1 : j0 + n;
        end = page_end < end ? page_end : end;
        const uint8_t *src = kiln_kv_row(kv, table, part, h, j, row_bytes);
        if (!direct) kiln_dequantize_row(type, src, buf + (size_t)(j - j0) * hd, (end - j) * hd);
        for (int k = j; k < end; k++)
            rows[k - j0] = direct ? (const void *)(src + (size_t)(k - j) * row_bytes) : buf + (size_t)(k - j0) * hd;
        j = end;
    }
}

/* A head's sink (gpt-oss): one more logit in the softmax, with no value row: a span of one
 * weight and a zero sum, folded in after the history's spans, as ggml adds it last */
static void fold_sink(attn_state r, float sink, int hd) {
    fold(r, ZERO_ROW, sink, 1.0f, hd);
}

/* Rows are staged in whole groups of KILN_SPAN_KEYS aligned to positions, and the denominators
 * sum a span's weights in lanes by position % 8 (vec_f32.h), whatever the group. */
#define GROUP KILN_SPAN_KEYS

/* One span's rows of one kv head as the kernels take them: positions j0 .. j0+n-1 (whole
 * groups), of which lo .. hi are visible to some query and the rest read zeros. */
typedef struct {
    int j0, n;
    const void *kt;      /* K transposed, kt[d * ld + j - j0]: in the cache, or staged */
    int ld, k_half;      /* its row stride in values; its values are f16 */
    const void *v[SPAN]; /* V rows: in place, or dequantized into the caller's buffer */
    int v_half;          /* the rows in place are f16 */
    kiln_trickle *next;  /* the next item's K and V, asked for as the kernels run; or NULL */
    float staged[KILN_MAX_HEAD_DIM * SPAN];
} span_rows;

/* whether staging a span needs buffers for dequantized rows */
static int needs_rows_buffer(const kiln_kv_view *kv, int hd) {
    return !kiln_k_transposed(kv->k_type) || !in_place(kv->v_type, hd);
}

/* A transposed K across pages: each page's part copied, values unchanged, into sp->staged; zeros
 * where no page holds any of lo .. hi (the page may not exist) */
static void gather_columns(span_rows *sp, const kiln_kv_view *kv, const int32_t *table, int h, size_t row_bytes,
                           int hd, int lo, int hi) {
    const int ps = kv->page_size;
    const size_t es = kiln_k_value_bytes(kv);
    for (int a = sp->j0; a < sp->j0 + sp->n;) {
        const int b = (a / ps + 1) * ps < sp->j0 + sp->n ? (a / ps + 1) * ps : sp->j0 + sp->n;
        const uint8_t *src = a / ps >= lo / ps && a / ps <= hi / ps ? kiln_kv_k_column(kv, table, h, a, row_bytes) : NULL;
        uint8_t *dst = (uint8_t *)sp->staged + (size_t)(a - sp->j0) * es;
        for (int d = 0; d < hd; d++) {
            if (src) memcpy(dst + (size_t)d * SPAN * es, src + (size_t)d * ps * es, (size_t)(b - a) * es);
            else memset(dst + (size_t)d * SPAN * es, 0, (size_t)(b - a) * es);
        }
        a = b;
    }
    sp->kt = sp->staged, sp->ld = SPAN;
}

static void stage_span(span_rows *sp, float *kbuf, float *vbuf, const kiln_kv_view *kv, const int32_t *table, int h,
                       const size_t row_bytes[2], int hd, int lo, int hi) {
    sp->next = NULL;
    sp->v_half = in_place(kv->v_type, hd) && kv->v_type == KILN_F16;
    sp->j0 = lo & ~(GROUP - 1), sp->n = ((hi | (GROUP - 1)) + 1) - sp->j0;
    cache_rows(kv, table, 1, h, row_bytes[1], sp->j0, sp->n, lo, hi, vbuf, hd, sp->v);
    if (kiln_k_transposed(kv->k_type)) {
        sp->k_half = kv->k_type == KILN_F16;
        if (sp->j0 / kv->page_size == (sp->j0 + sp->n - 1) / kv->page_size) /* one page, lo's: read where it lies */
            sp->kt = kiln_kv_k_column(kv, table, h, sp->j0, row_bytes[0]), sp->ld = kv->page_size;
        else
            gather_columns(sp, kv, table, h, row_bytes[0], hd, lo, hi);
        return;
    }
    const void *rows[SPAN];
    cache_rows(kv, table, 0, h, row_bytes[0], sp->j0, sp->n, lo, hi, kbuf, hd, rows);
    kiln_span_transpose(sp->staged, SPAN, (const float *const *)rows, sp->n, hd);
    sp->kt = sp->staged, sp->ld = SPAN, sp->k_half = 0;
}

/* Queries q[i] (i < nq, one sequence, one kv head), query i seeing positions first[i] .. last[i]:
 * each query's state for the staged span alone, from empty. Every query's scores, then its
 * weighted V rows, the queries sharing each row load; each score and each column is summed
 * in one order whoever shares it (attn_span.h).
 *
 * The live queries are taken KILN_SPAN_MAX_Q at a time, and a tile stops at the last group of
 * rows any of its queries sees, as decode's span stops at its token's group: the rows past it
 * would only score -inf, add exp 0 to the denominator's lanes and weigh 0, so leaving them out
 * changes no bit, and on the diagonal of a prefill it saves most of the span. */
static void score_span(const attn_state st[], const float *const q[], const int first[], const int last[], int nq,
                       const span_rows *sp, int hd, float scale, float softcap, const float *slope, const int *at) {
    float s[ATTN_MAX_Q][SPAN]; /* scores, then weights, of the live queries in order */
    const int j0 = sp->j0, n = sp->n;
    int order[ATTN_MAX_Q], n_live = 0;
    for (int i = 0; i < nq; i++) {
        clear(st[i], hd);
        if (first[i] <= j0 + n - 1 && last[i] >= j0) order[n_live++] = i;
    }
    for (int o = 0; o < n_live; o += KILN_SPAN_MAX_Q) {
        const int m = n_live - o < KILN_SPAN_MAX_Q ? n_live - o : KILN_SPAN_MAX_Q;
        int seen = 0; /* rows of the span the tile's queries see: up to the last of them */
        for (int k = 0; k < m; k++) seen = last[order[o + k]] - j0 + 1 > seen ? last[order[o + k]] - j0 + 1 : seen;
        seen = seen < n ? seen : n;
        const int nt = ((seen - 1) | (GROUP - 1)) + 1; /* whole groups of rows, as staged */
        float *so[KILN_SPAN_MAX_Q];
        const float *qo[KILN_SPAN_MAX_Q];
        for (int k = 0; k < m; k++) so[k] = s[o + k], qo[k] = q[order[o + k]];
        kiln_span_scores(so, qo, m, sp->kt, sp->ld, sp->k_half, nt, hd, scale, sp->next ? &sp->next[0] : NULL);
        int from[KILN_SPAN_MAX_Q], to[KILN_SPAN_MAX_Q]; /* the span's edge: the rows each query sees */
        float max[KILN_SPAN_MAX_Q], denom[KILN_SPAN_MAX_Q];
        for (int k = 0; k < m; k++) {
            const int i = order[o + k];
            float *si = s[o + k];
            if (slope) /* ALiBi: each score less the head's slope times its distance (llama.cpp's mask of -|i - j|) */
                for (int j = 0; j < nt; j++) si[j] += slope[i] * (float)-abs(at[i] - (j0 + j));
            if (softcap != 0.0f) kiln_vsoftcap(si, nt, softcap); /* each score on its own: lanes do not matter */
            from[k] = first[i] - j0, to[k] = last[i] - j0;
        }
        kiln_span_softmax(so, m, nt, from, to, max, denom);
        for (int k = 0; k < m; k++) *st[order[o + k]].max = max[k], *st[order[o + k]].denom = denom[k];
        float *acc[KILN_SPAN_MAX_Q];
        for (int k = 0; k < m; k++) acc[k] = st[order[o + k]].acc;
        if (sp->v_half) kiln_span_values(acc, s[o], SPAN, m, sp->v, seen, hd, 1, sp->next ? &sp->next[1] : NULL);
        else kiln_span_values(acc, s[o], SPAN, m, sp->v, seen, hd, 0, sp->next ? &sp->next[1] : NULL);
    }
}

/* The visible positions of span s0 for queries seeing first[i] .. last[i]: lo > hi when none */
static void span_bounds(const int first[], const int last[], int nq, int s0, int *lo, int *hi) {
    *lo = s0 + SPAN, *hi = s0 - 1;
    for (int i = 0; i < nq; i++) {
        const int a = first[i] > s0 ? first[i] : s0, b = last[i] < s0 + SPAN - 1 ? last[i] : s0 + SPAN - 1;
        if (a <= b) *lo = a < *lo ? a : *lo, *hi = b > *hi ? b : *hi;
    }
}

/* Item `item` of a token seeing first .. last: span sp of kv head g, and its visible positions
 * lo .. hi (lo > hi: none). Span-major, so that consecutive items read one page's heads one after
 * another, and each thread walks its own run of pages as two streams (K's, V's). */
static void item_bounds(int item, int n_head_kv, int sp0, int first, int last, int *g, int *sp, int *lo, int *hi) {
    *g = item % n_head_kv, *sp = item / n_head_kv;
    const int s0 = (sp0 + *sp) * SPAN;
    *lo = first > s0 ? first : s0, *hi = last < s0 + SPAN - 1 ? last : s0 + SPAN - 1;
}

/* One token, its (kv head, span) items spread over the threads: each leaves its group's span
 * states in scratch; after a barrier each query head folds its spans in order. A thread asks for
 * its next item's rows while it scores this one's: requested just before their use, the rows of
 * a deep history kept the scoring waiting on memory (the K and V loads took most of its time).
 * The kernels ask for them a few lines an iteration (kiln_trickle), so that memory streams under
 * the arithmetic: asked for at once, the thread waited on its fill buffers before it began. */
static void attend_split(const kiln_thread *th, float *out, const float *q, int seq, int p, int first, int last,
                         const kiln_kv_view *kv, const size_t row_bytes[2], int n_head, int n_head_kv, int hd,
                         float scale, float softcap, const float *sinks, const float *slopes, int max_spans,
                         float *scratch) {
    const int group = n_head / n_head_kv, sp0 = first / SPAN, n_spans = last / SPAN - sp0 + 1;
    const size_t part = (size_t)hd + KILN_ATTN_SPAN_STATE;
    const int32_t *table = kiln_kv_table(kv, seq);
    const int n_items = n_head_kv * n_spans;
    int i0, i1, g, sp, a, b;
    kiln_share(th, n_items, 1, &i0, &i1); /* a run of items a thread: see item_bounds */
    if (i0 < i1) {
        item_bounds(i0, n_head_kv, sp0, first, last, &g, &sp, &a, &b);
        if (a <= b) prefetch_span(kv, table, g, row_bytes, a, b);
    }
    for (int item = i0; item < i1; item++) {
        const float *qs[ATTN_MAX_Q];
        attn_state st[ATTN_MAX_Q];
        int lo[ATTN_MAX_Q], hi[ATTN_MAX_Q], at[ATTN_MAX_Q];
        float sl[ATTN_MAX_Q];
        item_bounds(item, n_head_kv, sp0, first, last, &g, &sp, &a, &b);
        for (int i = 0; i < group; i++) {
            float *slot = scratch + ((size_t)(g * group + i) * max_spans + sp) * part;
            st[i] = (attn_state){slot + KILN_ATTN_SPAN_STATE, slot, slot + 1};
            qs[i] = q + (size_t)(g * group + i) * hd, lo[i] = first, hi[i] = last;
            at[i] = p, sl[i] = slopes ? slopes[g * group + i] : 0.0f;
        }
        kiln_trickle next[2]; /* the next item's rows, asked for a few lines at a time as this one is scored */
        int trickle = 0;      /* or all at once: where they cross a page, or this item has no rows */
        if (item + 1 < i1) {
            int g1, sp1, a1, b1;
            item_bounds(item + 1, n_head_kv, sp0, first, last, &g1, &sp1, &a1, &b1);
            if (a1 <= b1 && !(a <= b && (trickle = trickle_rows(next, kv, table, g1, row_bytes, hd, a1, b1))))
                prefetch_span(kv, table, g1, row_bytes, a1, b1);
        }
        if (a > b) {
            for (int i = 0; i < group; i++) clear(st[i], hd);
            continue;
        }
        const size_t nb = needs_rows_buffer(kv, hd) ? (size_t)SPAN * hd : 0;
        float buf[2 * nb + 1]; /* dequantized rows: K's, V's */
        span_rows rows;
        stage_span(&rows, buf, buf + nb, kv, table, g, row_bytes, hd, a, b);
        rows.next = trickle ? next : NULL;
        score_span(st, qs, lo, hi, group, &rows, hd, scale, softcap, slopes ? sl : NULL, at);
    }
    kiln_barrier(th);
    for (int h = th->ith; h < n_head; h += th->nth) {
        float max, denom, *oh = out + (size_t)h * hd;
        const attn_state r = {oh, &max, &denom};
        clear(r, hd);
        for (int sp = 0; sp < n_spans; sp++) {
            const float *slot = scratch + ((size_t)h * max_spans + sp) * part;
            fold(r, slot + KILN_ATTN_SPAN_STATE, slot[0], slot[1], hd);
        }
        if (sinks) fold_sink(r, sinks[h], hd);
        for (int d = 0; d < hd; d++) oh[d] /= denom;
    }
}

/* Tokens ta..tb-1 of one sequence, query heads h0..h0+heads-1 of kv head g: their history a span
 * at a time, in order. A span's rows come from memory once (fetched while the span before is
 * scored) and stay in cache while the block's queries that see them take them, ATTN_MAX_Q at a
 * time; each query folds its spans in order, as on every path. */
static void attend_block(float *out, const float *q, int seq, const int32_t *row, const int32_t *seen, int ta, int tb,
                         const kiln_kv_view *kv, const size_t row_bytes[2], int h0, int heads, int g, int n_head,
                         int hd, float scale, float softcap, const float *sinks, const float *slopes) {
    float acc[ATTN_ITEM_FLOATS], max[ATTN_ITEM_Q], denom[ATTN_ITEM_Q];
    float pacc[ATTN_MAX_Q][KILN_MAX_HEAD_DIM], pmax[ATTN_MAX_Q], pdenom[ATTN_MAX_Q];
    const float *qs[ATTN_ITEM_Q];
    int first[ATTN_ITEM_Q], last[ATTN_ITEM_Q], lo = row[ta], hi = row[ta];
    const int32_t *table = kiln_kv_table(kv, seq);
    const int nq = (tb - ta) * heads;
    for (int i = 0; i < nq; i++) {
        const int t = ta + i / heads;
        first[i] = kiln_kv_first_visible(kv, row[t]), last[i] = kiln_kv_last_visible(kv, row[t], seen[t]);
        lo = first[i] < lo ? first[i] : lo, hi = last[i] > hi ? last[i] : hi;
        qs[i] = q + ((size_t)t * n_head + h0 + i % heads) * hd;
        clear((attn_state){acc + (size_t)i * hd, &max[i], &denom[i]}, hd);
    }
    const size_t nb = needs_rows_buffer(kv, hd) ? (size_t)SPAN * hd : 0;
    float buf[2 * nb + 1]; /* dequantized rows: K's, V's */
    span_rows rows;
    int a, b;
    span_bounds(first, last, nq, lo / SPAN * SPAN, &a, &b);
    prefetch_span(kv, table, g, row_bytes, a, b);
    for (int s0 = lo / SPAN * SPAN; s0 <= hi; s0 += SPAN) {
        span_bounds(first, last, nq, s0, &a, &b);
        if (a > b) continue;
        stage_span(&rows, buf, buf + nb, kv, table, g, row_bytes, hd, a, b);
        int na, nb_;
        span_bounds(first, last, nq, s0 + SPAN, &na, &nb_);
        if (na <= nb_) prefetch_span(kv, table, g, row_bytes, na, nb_); /* the next span, while this one is scored */
        for (int i0 = 0; i0 < nq;) {
            const float *sq[ATTN_MAX_Q];
            attn_state ps[ATTN_MAX_Q];
            int sf[ATTN_MAX_Q], sl[ATTN_MAX_Q], idx[ATTN_MAX_Q], at[ATTN_MAX_Q], n = 0;
            float slope[ATTN_MAX_Q];
            for (; i0 < nq && n < ATTN_MAX_Q; i0++)
                if (first[i0] <= b && last[i0] >= a) {
                    sq[n] = qs[i0], sf[n] = first[i0], sl[n] = last[i0], idx[n] = i0;
                    at[n] = row[ta + i0 / heads], slope[n] = slopes ? slopes[h0 + i0 % heads] : 0.0f;
                    ps[n] = (attn_state){pacc[n], &pmax[n], &pdenom[n]};
                    n++;
                }
            if (!n) break;
            score_span(ps, sq, sf, sl, n, &rows, hd, scale, softcap, slopes ? slope : NULL, at);
            attn_state rs[ATTN_MAX_Q];
            for (int k = 0; k < n; k++) rs[k] = (attn_state){acc + (size_t)idx[k] * hd, &max[idx[k]], &denom[idx[k]]};
            fold_tile(rs, (const float (*)[KILN_MAX_HEAD_DIM])pacc, pmax, pdenom, n, hd);
        }
    }
    for (int i = 0; i < nq; i++) {
        float *oh = out + ((size_t)(ta + i / heads) * n_head + h0 + i % heads) * hd;
        if (sinks) fold_sink((attn_state){acc + (size_t)i * hd, &max[i], &denom[i]}, sinks[h0 + i % heads], hd);
        for (int d = 0; d < hd; d++) oh[d] = acc[(size_t)i * hd + d] / denom[i];
    }
}

/* A block of tokens ta..tb-1 of one sequence, and the (query, key) pairs a head of it scores */
typedef struct {
    int ta, tb;
    long cost;
} block_cost;

static int by_cost(const void *a, const void *b) {
    const block_cost *x = a, *y = b;
    if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1;
    return x->ta - y->ta; /* one order on every thread */
}

/* Each run of one sequence's tokens cut into equal blocks of at most `block` tokens, the
 * costliest first; returns how many */
static int cut_blocks(block_cost *blocks, const int32_t *seq, const int32_t *row, const int32_t *seen, int n_tokens,
                      const kiln_kv_view *kv, int block) {
    int n = 0;
    for (int t0 = 0; t0 < n_tokens;) {
        int run = 1;
        while (t0 + run < n_tokens && seq[t0 + run] == seq[t0]) run++;
        const int n_run = (run + block - 1) / block;
        for (int b = 0; b < n_run; b++, n++) {
            blocks[n].ta = t0 + (int)((long)run * b / n_run), blocks[n].tb = t0 + (int)((long)run * (b + 1) / n_run);
            blocks[n].cost = 0;
            for (int t = blocks[n].ta; t < blocks[n].tb; t++)
                blocks[n].cost += kiln_kv_last_visible(kv, row[t], seen[t]) - kiln_kv_first_visible(kv, row[t]) + 1;
        }
        t0 += run;
    }
    qsort(blocks, (size_t)n, sizeof *blocks, by_cost);
    return n;
}

void kiln_alibi_slopes(float *slopes, int n_head, float max_bias) {
    const int n_log2 = 1 << (int)floor(log2((double)n_head));
    const float m0 = powf(2.0f, -max_bias / (float)n_log2), m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n_log2);
    for (int h = 0; h < n_head; h++)
        slopes[h] = h < n_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_log2) + 1));
}

void kiln_attention_ext_mt(const kiln_thread *th, float *out, const float *q, const int32_t *seq,
                           const int32_t *row, const int32_t *seen, int n_tokens, const kiln_kv_view *kv, int n_head,
                           int n_head_kv, int head_dim, float scale, float softcap, const float *sinks, float alibi,
                           void *scratch, int max_spans) {
    const int group = n_head / n_head_kv;
    float slope_of[alibi > 0.0f ? n_head : 1];
    const float *slopes = alibi > 0.0f ? slope_of : NULL;
    if (slopes) kiln_alibi_slopes(slope_of, n_head, alibi);
    const size_t row_bytes[2] = {kiln_row_bytes(kv->k_type, head_dim), kiln_row_bytes(kv->v_type, head_dim)};
    if (kv->mass && th->ith == 0) /* H2O's bookkeeping, when asked for: one thread, the others wait at the barrier */
        kiln_attention_mass(q, seq, row, seen, n_tokens, kv, n_head, n_head_kv, head_dim, scale, softcap, sinks, alibi);
    if (n_tokens == 1 && scratch && group <= ATTN_MAX_Q) {
        const int first = kiln_kv_first_visible(kv, row[0]), last = kiln_kv_last_visible(kv, row[0], seen[0]);
        if (last / SPAN - first / SPAN < max_spans) {
            attend_split(th, out, q, seq[0], row[0], first, last, kv, row_bytes, n_head, n_head_kv, head_dim, scale,
                         softcap, sinks, slopes, max_spans, scratch);
            return;
        }
    }
    /* An item is a block of consecutive tokens of one sequence, with the query heads of one kv
     * head (single heads when a group is too large to share a pass). A run of one sequence's
     * tokens is cut into equal blocks that fit ATTN_ITEM_Q queries and ATTN_ITEM_FLOATS of state;
     * that only decides who shares loads, never a result. */
    const int heads = group <= ATTN_MAX_Q ? group : 1, per_block = n_head / heads;
    const int max_q = ATTN_ITEM_FLOATS / head_dim < ATTN_ITEM_Q ? ATTN_ITEM_FLOATS / head_dim : ATTN_ITEM_Q;
    const int block = max_q / heads > 1 ? max_q / heads : 1;
    block_cost blocks[n_tokens];
    const int n_blocks = cut_blocks(blocks, seq, row, seen, n_tokens, kv, block);
    /* Claimed, the costliest first: a causal prefill's later blocks see more history, and a
     * round-robin share of them had left one thread a tenth more work than the other. */
    kiln_claims c = kiln_claims_begin(th, n_blocks * per_block, 1);
    for (int i0, i1; kiln_claim(&c, &i0, &i1);)
        for (int item = i0; item < i1; item++) {
            const block_cost *bl = &blocks[item / per_block];
            const int hb = item % per_block;
            attend_block(out, q, seq[bl->ta], row, seen, bl->ta, bl->tb, kv, row_bytes, hb * heads, heads,
                         hb * heads / group, n_head, head_dim, scale, softcap, sinks, slopes);
        }
}

void kiln_attention_mt(const kiln_thread *th, float *out, const float *q, const int32_t *seq, const int32_t *row,
                       const int32_t *seen, int n_tokens, const kiln_kv_view *kv, int n_head, int n_head_kv,
                       int head_dim, float scale, void *scratch, int max_spans) {
    kiln_attention_ext_mt(th, out, q, seq, row, seen, n_tokens, kv, n_head, n_head_kv, head_dim, scale, 0.0f, NULL,
                          0.0f, scratch, max_spans);
}

void kiln_attention(float *out, const float *q, const int32_t *seq, const int32_t *row, const int32_t *seen,
                    int n_tokens, const kiln_kv_view *kv, int n_head, int n_head_kv, int head_dim, float scale,
                    float softcap, const float *sinks, float alibi, void *scratch, int max_spans) {
    const kiln_thread alone = {0, 1, NULL};
    kiln_attention_ext_mt(&alone, out, q, seq, row, seen, n_tokens, kv, n_head, n_head_kv, head_dim, scale, softcap,
                          sinks, alibi, scratch, max_spans);
}
