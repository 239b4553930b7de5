/* kv_view.h: addressing a layer's rows in the paged KV pool (kiln_kv_view, kernels.h), shared by
 * the cache's writers (kv_rows.c) and its reader (attention.c).
 *
 * K transposed. Attention scores a query against many keys at once, one multiply-add chain over
 * the head dimension per key, so a vector wants one value of d from each of several keys. An f16
 * or f32 K is therefore held the way it is read: transposed within its page, head h's part of the
 * page (the bytes its page_size rows would take) [head_dim][page_size], value d of position p at
 * [d * page_size + p % page_size]. It is written once by the store instead of transposed at every
 * read. The block-quantized K types (blocks along d) and V keep rows. */
#ifndef KILN_KV_VIEW_H
#define KILN_KV_VIEW_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

static inline int kiln_k_transposed(int k_type) { return k_type >= 0 && k_type < 32 && (KILN_K_TRANSPOSED_TYPES >> k_type & 1); }

/* bytes of one value of a transposed K: f16 or f32 */
static inline size_t kiln_k_value_bytes(const kiln_kv_view *kv) { return kv->k_type == KILN_F16 ? 2 : 4; }

/* value 0 of K position pos of head h in a transposed K; value d is d * page_size values on */
static inline uint8_t *kiln_kv_k_column(const kiln_kv_view *kv, const int32_t *table, int h, int pos, size_t row_bytes) {
    return kiln_kv_row(kv, table, 0, h, pos - pos % kv->page_size, row_bytes) +
           (size_t)(pos % kv->page_size) * kiln_k_value_bytes(kv);
}

/* n values of es bytes from every `from`-th of src to every `to`-th of dst (a row into its column
 * or back); each copy is of a size the compiler knows, so it is one move */
static inline void kiln_k_strided_copy(uint8_t *dst, size_t to, const uint8_t *src, size_t from, size_t n, size_t es) {
    for (size_t d = 0; d < n; d++) {
        if (es == 2) memcpy(dst + d * to * 2, src + d * from * 2, 2);
        else memcpy(dst + d * to * 4, src + d * from * 4, 4);
    }
}

/* K row `pos` of head h in its type's row format (row_bytes of it), gathered or copied */
static inline void kiln_kv_k_read(const kiln_kv_view *kv, const int32_t *table, int h, int pos, size_t row_bytes,
                                  uint8_t *row) {
    if (!kiln_k_transposed(kv->k_type)) {
        memcpy(row, kiln_kv_row(kv, table, 0, h, pos, row_bytes), row_bytes);
        return;
    }
    const size_t es = kiln_k_value_bytes(kv);
    kiln_k_strided_copy(row, 1, kiln_kv_k_column(kv, table, h, pos, row_bytes), kv->page_size, row_bytes / es, es);
}

/* the inverse: K row `pos` of head h from its row format into the cache */
static inline void kiln_kv_k_write(const kiln_kv_view *kv, const int32_t *table, int h, int pos, size_t row_bytes,
                                   const uint8_t *row) {
    if (!kiln_k_transposed(kv->k_type)) {
        memcpy(kiln_kv_row(kv, table, 0, h, pos, row_bytes), row, row_bytes);
        return;
    }
    const size_t es = kiln_k_value_bytes(kv);
    kiln_k_strided_copy(kiln_kv_k_column(kv, table, h, pos, row_bytes), kv->page_size, row, 1, row_bytes / es, es);
}

/* the first and last rows a query at cache row `row`, whose sequence it may see up to `seen`, reads */
static inline int kiln_kv_first_visible(const kiln_kv_view *kv, int row) {
    if (kv->half_window > 0) return row - kv->half_window > 0 ? row - kv->half_window : 0;
    return kiln_window_first(kv->window, row);
}
static inline int kiln_kv_last_visible(const kiln_kv_view *kv, int row, int seen) {
    return kv->half_window > 0 && row + kv->half_window < seen ? row + kv->half_window : seen;
}

#endif
