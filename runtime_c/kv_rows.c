/* kv_rows.c: writing K and V rows into the paged cache, and moving them for a context shift.
 *
 * Rows are quantized on write through the type table (types.c), so every cache dtype, K and V
 * each their own, is written by the same code; an f16 or f32 K row then goes to its place in the
 * page's transposed K (kv_view.h). */
#include <string.h>

#include "kernels.h"
#include "kernels_mt.h"
#include "kv_view.h"

/* the (token, head) rows [i0, i1) of the step, counted token-major */
static void store_rows(const kiln_kv_view *kv, const float *k, const float *v, const int32_t *seq, const int32_t *row,
                       int i0, int i1, int n_head_kv, int head_dim) {
    const size_t k_row = kiln_row_bytes(kv->k_type, head_dim), v_row = kiln_row_bytes(kv->v_type, head_dim);
    uint8_t k_buf[KILN_MAX_HEAD_DIM * sizeof(float)];
    for (int i = i0; i < i1; i++) {
        const int t = i / n_head_kv, h = i % n_head_kv;
        const int32_t *table = kiln_kv_table(kv, seq[t]);
        const size_t src = (size_t)i * head_dim;
        kiln_quantize_row(kv->k_type, k + src, k_buf, head_dim); /* the row, then into place (a transposed K's column) */
        kiln_kv_k_write(kv, table, h, row[t], k_row, k_buf);
        kiln_quantize_row(kv->v_type, v + src, kiln_kv_row(kv, table, 1, h, row[t], v_row), head_dim);
    }
}

void kiln_kv_store(const kiln_kv_view *kv, const float *k, const float *v, const int32_t *seq, const int32_t *row,
                   int n_tokens, int n_head_kv, int head_dim) {
    store_rows(kv, k, v, seq, row, 0, n_tokens * n_head_kv, n_head_kv, head_dim);
}

/* by (token, head) rows, so that a decode token's heads are shared: a transposed K row writes a
   value into each of head_dim cache lines, which the weights read since have evicted */
void kiln_kv_store_mt(const kiln_thread *t, const kiln_kv_view *kv, const float *k, const float *v, const int32_t *seq,
                      const int32_t *row, int n_tokens, int n_head_kv, int head_dim) {
    int i0, i1;
    kiln_share(t, n_tokens * n_head_kv, 1, &i0, &i1);
    if (i1 > i0) store_rows(kv, k, v, seq, row, i0, i1, n_head_kv, head_dim);
}

void kiln_kv_move_rows(const kiln_kv_view *kv, int seq, const int32_t *keep, int first_changed, int n, int n_head_kv,
                       int head_dim, int n_rot, float rope_base, int neox, const kiln_rope_scaling *sc,
                       const float *factors, int hadamard) {
    const size_t k_row = kiln_row_bytes(kv->k_type, head_dim), v_row = kiln_row_bytes(kv->v_type, head_dim);
    /* a rotation by the position delta: the keys already carry the rope's magnitude */
    kiln_rope_scaling rotate = sc ? *sc : (kiln_rope_scaling)KILN_ROPE_UNSCALED;
    rotate.mscale = 1.0f;
    const int32_t *table = kiln_kv_table(kv, seq);
    const int lo = kiln_kv_first_visible(kv, n), r0 = first_changed > lo ? first_changed : lo;
    float x[KILN_MAX_HEAD_DIM];
    uint8_t k_buf[KILN_MAX_HEAD_DIM * sizeof(float)];
    for (int r = r0; r < n; r++) {
        if (keep[r] == r) continue;
        const int32_t delta = r - keep[r];
        for (int h = 0; h < n_head_kv; h++) { /* rows never overlap: keep[r] > r, and rows are moved in order */
            kiln_kv_k_read(kv, table, h, keep[r], k_row, k_buf);
            if (rope_base > 0.0f) {
                kiln_dequantize_row_ref(kv->k_type, k_buf, x, head_dim);
                if (hadamard) kiln_hadamard(x, x, head_dim);
                kiln_rope_ext(x, x, &delta, 1, 1, head_dim, n_rot, rope_base, neox, &rotate, factors);
                if (hadamard) kiln_hadamard(x, x, head_dim);
                kiln_quantize_row(kv->k_type, x, k_buf, head_dim);
            }
            kiln_kv_k_write(kv, table, h, r, k_row, k_buf);
            memcpy(kiln_kv_row(kv, table, 1, h, r, v_row), kiln_kv_row(kv, table, 1, h, keep[r], v_row), v_row);
        }
    }
}
