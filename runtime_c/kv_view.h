/* kv_view.h: addressing a layer's rows in the paged KV pool (kiln_kv_view, kernels.h), shared by
 * the cache's writers (kv_rows.c) and its reader (attention.c). */
#ifndef KILN_KV_VIEW_H
#define KILN_KV_VIEW_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "window.h"

static inline const int32_t *kiln_kv_table(const kiln_kv_view *kv, int seq) {
    return kv->tables + (size_t)seq * kv->max_blocks;
}

/* position `pos` of kv head h, K (part 0) or V (part 1), whose rows are row_bytes long */
static inline uint8_t *kiln_kv_row(const kiln_kv_view *kv, const int32_t *table, int part, int h, int pos,
                                   size_t row_bytes) {
    return kv->pages + (size_t)table[pos / kv->page_size] * kv->page_bytes + (part ? kv->v_off : kv->k_off) +
           ((size_t)h * kv->page_size + pos % kv->page_size) * row_bytes;
}

static inline int kiln_kv_first_visible(const kiln_kv_view *kv, int pos) { return kiln_window_first(kv->window, pos); }

#endif
