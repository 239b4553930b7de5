/* kv_state.c: a sequence's KV state as bytes, for a file (the layout is in kv_pool.h), and back
 * into an empty sequence of a pool with the same shape. A load checks the whole state before it
 * takes a page, so a bad buffer changes nothing.
 */
#include <string.h>

#include "kv_pool.h"
#include "status.h"

/* The blocks a state holds: ceil(n_past / page_size). */
static int state_blocks(const kiln_kv *kv, int n_past) { return (n_past + kv->page_size - 1) / kv->page_size; }

size_t kiln_kv_state_size(const kiln_kv *kv, int seq) {
    if (kiln_kv_check(kv, seq) != KILN_OK) return 0;
    const int nb = state_blocks(kv, kv->n_past[seq]);
    size_t size = sizeof(int32_t);
    for (int gi = 0; gi < kv->n_groups; gi++) {
        const int32_t *t = kiln_pool_table(kv, gi, seq);
        size += (size_t)nb;
        for (int b = 0; b < nb; b++) size += t[b] >= 0 ? kv->g[gi].page_bytes : 0;
    }
    return size;
}

int kiln_kv_state_save(const kiln_kv *kv, int seq, uint8_t *buf, size_t size) {
    if (kiln_kv_check(kv, seq) != KILN_OK) return KILN_E_SEQ;
    if (!buf || size != kiln_kv_state_size(kv, seq)) return KILN_E_ARG;
    const int32_t n_past = kv->n_past[seq];
    const int nb = state_blocks(kv, n_past);
    memcpy(buf, &n_past, sizeof n_past);
    uint8_t *at = buf + sizeof n_past;
    for (int gi = 0; gi < kv->n_groups; gi++) {
        const int32_t *t = kiln_pool_table(kv, gi, seq);
        for (int b = 0; b < nb; b++) *at++ = t[b] >= 0;
        for (int b = 0; b < nb; b++)
            if (t[b] >= 0) {
                memcpy(at, kv->g[gi].pages + (size_t)t[b] * kv->g[gi].page_bytes, kv->g[gi].page_bytes);
                at += kv->g[gi].page_bytes;
            }
    }
    return KILN_OK;
}

int kiln_kv_state_load(kiln_kv *kv, int seq, const uint8_t *buf, size_t size) {
    if (kiln_kv_check(kv, seq) != KILN_OK) return KILN_E_SEQ;
    if (kv->n_past[seq] != 0) return KILN_E_SEQ;
    int32_t n_past;
    if (!buf || size < sizeof n_past) return KILN_E_ARG;
    memcpy(&n_past, buf, sizeof n_past);
    if (n_past < 0 || n_past > kv->n_ctx) return KILN_E_CTX_FULL;
    const int nb = state_blocks(kv, n_past);
    /* walk the state once to check it, counting the pages each group needs */
    size_t want = sizeof n_past;
    const uint8_t *at = buf + sizeof n_past;
    for (int gi = 0; gi < kv->n_groups; gi++) {
        if (want + (size_t)nb > size) return KILN_E_ARG;
        const int first_read = n_past > 0 ? kiln_window_first(kv->g[gi].window, n_past) / kv->page_size : nb;
        int held = 0;
        for (int b = 0; b < nb; b++) {
            if (at[b] > 1 || (!at[b] && b >= first_read)) return KILN_E_ARG;
            held += at[b];
        }
        if (held > kv->g[gi].n_free) return KILN_E_KV_FULL;
        want += (size_t)nb + (size_t)held * kv->g[gi].page_bytes;
        at += nb + (size_t)held * kv->g[gi].page_bytes;
        if (want > size) return KILN_E_ARG;
    }
    if (want != size) return KILN_E_ARG;
    at = buf + sizeof n_past;
    for (int gi = 0; gi < kv->n_groups; gi++) {
        kiln_kv_group *g = &kv->g[gi];
        int32_t *t = kiln_pool_table(kv, gi, seq);
        const uint8_t *present = at;
        at += nb;
        for (int b = 0; b < nb; b++)
            if (present[b]) {
                t[b] = kiln_kv_take_page(g);
                memcpy(g->pages + (size_t)t[b] * g->page_bytes, at, g->page_bytes);
                at += g->page_bytes;
            }
    }
    kv->n_past[seq] = n_past;
    return KILN_OK;
}
