/* attn_fetch.h: how attention.c reads a span's rows and asks for them ahead of their use: in
 * place or dequantized (in_place), all at once (prefetch_span), or a few lines an iteration of
 * the kernels (trickle_rows, attn_span.h's kiln_trickle). Static helpers of attention.c alone. */
#ifndef KILN_ATTN_FETCH_H
#define KILN_ATTN_FETCH_H

#include <stddef.h>
#include <stdint.h>

#include "attn_span.h"
#include "kernels.h"
#include "kv_view.h"

/* V rows the vector loops read where they lie: f32, and f16 where they convert on load. */
static int in_place(int type, int hd) {
#ifdef KILN_SPAN_F16_ROWS
    if (type == KILN_F16 && hd % 8 == 0) return 1;
#endif
    (void)hd;
    return type == KILN_F32;
}

/* Ask for positions [lo, hi] of one head's K or V ahead of their use, a page run at a time: a
 * page holds a head's rows side by side, one sequential range of cache lines, or its transposed
 * K, one such range for each d. */
static void prefetch_bytes(const uint8_t *p, size_t len) { /* every cache line of [p, p + len) */
    for (uintptr_t at = (uintptr_t)p & ~(uintptr_t)63; at < (uintptr_t)p + len; at += 64) __builtin_prefetch((const void *)at);
}

static void prefetch_rows(const kiln_kv_view *kv, const int32_t *table, int part, int h, size_t row_bytes, int lo,
                          int hi) {
    const int columns = !part && kiln_k_transposed(kv->k_type);
    for (int j = lo; j <= hi;) {
        const int page_end = (j / kv->page_size + 1) * kv->page_size, end = hi + 1 < page_end ? hi + 1 : page_end;
        if (columns) {
            const size_t es = kiln_k_value_bytes(kv), hd = row_bytes / es;
            const uint8_t *col = kiln_kv_k_column(kv, table, h, j, row_bytes);
            for (size_t d = 0; d < hd; d++) prefetch_bytes(col + d * kv->page_size * es, (size_t)(end - j) * es);
        } else {
            prefetch_bytes(kiln_kv_row(kv, table, part, h, j, row_bytes), (size_t)(end - j) * row_bytes);
        }
        j = end;
    }
}

/* Fetch a span's visible K and V rows ahead of their use */
static void prefetch_span(const kiln_kv_view *kv, const int32_t *table, int h, const size_t row_bytes[2], int lo,
                          int hi) {
    prefetch_rows(kv, table, 0, h, row_bytes[0], lo, hi);
    prefetch_rows(kv, table, 1, h, row_bytes[1], lo, hi);
}

/* Positions lo .. hi of kv head h as the kernels ask for them while they run (kiln_trickle), where
 * the kernels' loops cover them exactly: an f16 or f32 cache read in place, a whole page of one
 * span (page_size == KILN_ATTN_SPAN, the default), head_dim a multiple of 64. K's lines in t[0], a
 * step a d of the scores (the page's values of that d), V's in t[1], a step a row and 64 columns
 * of the values. Returns 0 otherwise, and prefetch_span takes them. */
static int trickle_rows(kiln_trickle t[2], const kiln_kv_view *kv, const int32_t *table, int h,
                        const size_t row_bytes[2], int hd, int lo, int hi) {
    const int n = hi - lo + 1;
    if (n != kv->page_size || lo % kv->page_size || hd % 64 || !kiln_k_transposed(kv->k_type) ||
        !in_place(kv->v_type, hd))
        return 0;
    const size_t ek = kiln_k_value_bytes(kv), ev = row_bytes[1] / (size_t)hd;
    t[0] = kiln_trickle_of(kiln_kv_k_column(kv, table, h, lo, row_bytes[0]), (size_t)n * row_bytes[0], n * ek);
    t[1] = kiln_trickle_of(kiln_kv_row(kv, table, 1, h, lo, row_bytes[1]), (size_t)n * row_bytes[1], 64 * ev);
    return 1;
}

#endif
