/* kv_pool.c: pages, reference counts and block tables (see kv_pool.h).
 *
 * A page is free when its count is 0 and its id is on the group's free stack. A block-table
 * entry holds one reference. Fork copies the table and takes a reference per page; a step
 * that writes into a page someone else also holds copies it first, so a shared page is
 * never written.
 */
#include "kv_pool.h"

#include <stdlib.h>
#include <string.h>

#include "huge_pages.h"
#include "status.h"

int kiln_kv_init(kiln_kv *kv, const kiln_kv_shape *s) {
    memset(kv, 0, sizeof *kv);
    kv->n_seq = s->n_seq, kv->n_ctx = s->n_ctx, kv->page_size = s->page_size, kv->n_groups = s->n_groups;
    kv->max_blocks = (s->n_ctx + s->page_size - 1) / s->page_size;
    kv->n_past = malloc(sizeof(int32_t) * (size_t)s->n_seq);
    int ok = kv->n_past != NULL;
    for (int gi = 0; gi < s->n_groups && ok; gi++) {
        kiln_kv_group *g = &kv->g[gi];
        g->window = s->window[gi], g->n_pages = s->n_pages[gi], g->page_bytes = s->page_bytes[gi];
        /* in huge pages: decode attention reads a span of each layer's page, 1.5 MB from the next in
           SmolLM2's pool (its decode at depth 1024 1.03-1.04x, Cascade Lake VM). Zeroed, so that a
           page's unwritten rows are finite numbers (attention multiplies them by 0) */
        g->pages = kiln_huge_pages(g->page_bytes * (size_t)g->n_pages);
        g->refs = calloc((size_t)g->n_pages, sizeof(int32_t));
        g->free_list = malloc(sizeof(int32_t) * (size_t)g->n_pages);
        g->tables = malloc(sizeof(int32_t) * (size_t)s->n_seq * kv->max_blocks);
        ok = g->pages && g->refs && g->free_list && g->tables;
        if (!ok) break;
        memset(g->pages, 0, g->page_bytes * (size_t)g->n_pages);
        for (int p = 0; p < g->n_pages; p++) g->free_list[p] = g->n_pages - 1 - p; /* page 0 is taken first */
        g->n_free = g->n_pages;
        for (size_t i = 0; i < (size_t)s->n_seq * kv->max_blocks; i++) g->tables[i] = -1;
    }
    if (!ok) {
        kiln_kv_free(kv);
        return -1;
    }
    for (int s_ = 0; s_ < s->n_seq; s_++) kv->n_past[s_] = -1;
    return 0;
}

void kiln_kv_free(kiln_kv *kv) {
    for (int gi = 0; gi < KILN_KV_MAX_GROUPS; gi++) {
        free(kv->g[gi].pages), free(kv->g[gi].refs), free(kv->g[gi].free_list), free(kv->g[gi].tables);
    }
    free(kv->n_past);
    memset(kv, 0, sizeof *kv);
}

int kiln_kv_take_page(kiln_kv_group *g) {
    const int p = g->free_list[--g->n_free];
    g->refs[p] = 1;
    return p;
}

static void drop_page(kiln_kv_group *g, int p) {
    if (--g->refs[p] == 0) g->free_list[g->n_free++] = p;
}

int kiln_kv_check(const kiln_kv *kv, int seq) {
    return seq >= 0 && seq < kv->n_seq && kv->n_past[seq] >= 0 ? KILN_OK : KILN_E_SEQ;
}

int kiln_kv_open(kiln_kv *kv) {
    for (int s = 0; s < kv->n_seq; s++)
        if (kv->n_past[s] < 0) {
            kv->n_past[s] = 0;
            return s;
        }
    return KILN_E_NO_SEQ;
}

/* drop the pages of blocks b >= first_block */
static void release_from(kiln_kv *kv, int seq, int first_block) {
    for (int gi = 0; gi < kv->n_groups; gi++) {
        int32_t *t = kiln_pool_table(kv, gi, seq);
        for (int b = first_block; b < kv->max_blocks; b++)
            if (t[b] >= 0) drop_page(&kv->g[gi], t[b]), t[b] = -1;
    }
}

void kiln_kv_close(kiln_kv *kv, int seq) {
    release_from(kv, seq, 0);
    kv->n_past[seq] = -1;
}

int kiln_kv_fork(kiln_kv *kv, int src) {
    if (kiln_kv_check(kv, src) != KILN_OK) return KILN_E_SEQ;
    const int dst = kiln_kv_open(kv);
    if (dst < 0) return dst;
    for (int gi = 0; gi < kv->n_groups; gi++) {
        const int32_t *from = kiln_pool_table(kv, gi, src);
        int32_t *to = kiln_pool_table(kv, gi, dst);
        for (int b = 0; b < kv->max_blocks; b++)
            if ((to[b] = from[b]) >= 0) kv->g[gi].refs[from[b]]++;
    }
    kv->n_past[dst] = kv->n_past[src];
    return dst;
}

int kiln_kv_rollback(kiln_kv *kv, int seq, int n_keep) {
    if (kiln_kv_check(kv, seq) != KILN_OK) return KILN_E_SEQ;
    if (n_keep < 0) return KILN_E_ARG;
    if (n_keep > kv->n_past[seq]) return KILN_E_ROLLBACK;
    /* the next query (at n_keep) reads back to kiln_window_first(window, n_keep): those pages must still be held */
    for (int gi = 0; gi < kv->n_groups && n_keep > 0; gi++) {
        const int32_t *t = kiln_pool_table(kv, gi, seq);
        for (int b = kiln_window_first(kv->g[gi].window, n_keep) / kv->page_size; b <= (n_keep - 1) / kv->page_size; b++)
            if (t[b] < 0) return KILN_E_ROLLBACK_WINDOW;
    }
    release_from(kv, seq, (n_keep + kv->page_size - 1) / kv->page_size);
    kv->n_past[seq] = n_keep;
    return KILN_OK;
}

/* Blocks [b0, b1] of a sequence that are written: how many need a page of their own. */
static int pages_needed(const kiln_kv *kv, int gi, int seq, int b0, int b1) {
    const int32_t *t = kiln_pool_table(kv, gi, seq);
    int need = 0;
    for (int b = b0; b <= b1; b++) need += t[b] < 0 || kv->g[gi].refs[t[b]] > 1;
    return need;
}

/* Give blocks [b0, b1] of seq pages of its own: a new page where there is none, a copy where
 * the page is shared (copy on write). The caller has checked that the pool has enough. */
static void make_private(kiln_kv *kv, int gi, int seq, int b0, int b1) {
    kiln_kv_group *g = &kv->g[gi];
    int32_t *t = kiln_pool_table(kv, gi, seq);
    for (int b = b0; b <= b1; b++) {
        if (t[b] >= 0 && g->refs[t[b]] == 1) continue;
        const int p = kiln_kv_take_page(g);
        if (t[b] >= 0) {
            memcpy(g->pages + (size_t)p * g->page_bytes, g->pages + (size_t)t[b] * g->page_bytes, g->page_bytes);
            drop_page(g, t[b]);
        }
        t[b] = p;
    }
}

/* drop a sliding group's blocks that lie wholly before what the next query (at n_past) can read */
static void drop_behind_window(kiln_kv *kv, int gi, int seq) {
    kiln_kv_group *g = &kv->g[gi];
    int32_t *t = kiln_pool_table(kv, gi, seq);
    for (int b = 0; g->window && b < kiln_window_first(g->window, kv->n_past[seq]) / kv->page_size; b++)
        if (t[b] >= 0) drop_page(g, t[b]), t[b] = -1;
}

int kiln_kv_reserve(kiln_kv *kv, const int32_t *n_new) {
    for (int gi = 0; gi < kv->n_groups; gi++) {
        int need = 0;
        for (int s = 0; s < kv->n_seq; s++)
            if (n_new[s] > 0)
                need += pages_needed(kv, gi, s, kv->n_past[s] / kv->page_size,
                                     (kv->n_past[s] + n_new[s] - 1) / kv->page_size);
        if (need > kv->g[gi].n_free) return KILN_E_KV_FULL;
    }
    for (int gi = 0; gi < kv->n_groups; gi++)
        for (int s = 0; s < kv->n_seq; s++)
            if (n_new[s] > 0)
                make_private(kv, gi, s, kv->n_past[s] / kv->page_size, (kv->n_past[s] + n_new[s] - 1) / kv->page_size);
    return KILN_OK;
}

void kiln_kv_advance(kiln_kv *kv, const int32_t *n_new) {
    for (int s = 0; s < kv->n_seq; s++) {
        if (n_new[s] <= 0) continue;
        kv->n_past[s] += n_new[s];
        for (int gi = 0; gi < kv->n_groups; gi++) drop_behind_window(kv, gi, s);
    }
}

int kiln_kv_keep_begin(kiln_kv *kv, int seq, const int32_t *keep, int n, int *first_changed) {
    if (kiln_kv_check(kv, seq) != KILN_OK) return KILN_E_SEQ;
    if ((!keep && n > 0) || !first_changed || n < 0 || n > kv->n_past[seq]) return KILN_E_ARG;
    int changed = n;
    for (int r = 0; r < n; r++) {
        if (keep[r] < 0 || keep[r] >= kv->n_past[seq] || (r > 0 && keep[r] <= keep[r - 1])) return KILN_E_ARG;
        if (keep[r] != r && changed == n) changed = r;
    }
    for (int gi = 0; gi < kv->n_groups; gi++) { /* the rows the next query (at n) reads must have a source */
        const int32_t *t = kiln_pool_table(kv, gi, seq);
        const int lo = kiln_window_first(kv->g[gi].window, n);
        for (int r = lo; r < n; r++)
            if (t[keep[r] / kv->page_size] < 0) return KILN_E_SHIFT_WINDOW;
        const int w0 = changed > lo ? changed : lo; /* the first row written */
        if (w0 < n && pages_needed(kv, gi, seq, w0 / kv->page_size, (n - 1) / kv->page_size) > kv->g[gi].n_free)
            return KILN_E_KV_FULL;
    }
    for (int gi = 0; gi < kv->n_groups; gi++) {
        const int lo = kiln_window_first(kv->g[gi].window, n), w0 = changed > lo ? changed : lo;
        if (w0 < n) make_private(kv, gi, seq, w0 / kv->page_size, (n - 1) / kv->page_size);
    }
    *first_changed = changed;
    return KILN_OK;
}

void kiln_kv_keep_end(kiln_kv *kv, int seq, int n) {
    release_from(kv, seq, (n + kv->page_size - 1) / kv->page_size);
    kv->n_past[seq] = n;
    for (int gi = 0; gi < kv->n_groups; gi++) drop_behind_window(kv, gi, seq);
}

int kiln_kv_pages_used(const kiln_kv *kv, int group) {
    return group >= 0 && group < kv->n_groups ? kv->g[group].n_pages - kv->g[group].n_free : KILN_E_ARG;
}

int kiln_kv_can_append(const kiln_kv *kv, int seq, int n) {
    for (int gi = 0; gi < kv->n_groups; gi++) /* sliding pools are sized so that they never run out */
        if (!kv->g[gi].window &&
            pages_needed(kv, gi, seq, kv->n_past[seq] / kv->page_size, (kv->n_past[seq] + n - 1) / kv->page_size) >
                kv->g[gi].n_free)
            return 0;
    return 1;
}

/* A page id the caller may hold: -1, or a page in use. */
static int held_or_none(const kiln_kv_group *g, int32_t p) { return p == -1 || (p >= 0 && p < g->n_pages && g->refs[p] > 0); }

int kiln_kv_share(kiln_kv *kv, int seq, int first, int n, int32_t *pages) {
    if (kiln_kv_check(kv, seq) != KILN_OK) return KILN_E_SEQ;
    if (!pages || first < 0 || n < 0 || (first + n) * kv->page_size > kv->n_past[seq]) return KILN_E_ARG;
    for (int b = 0; b < n; b++)
        for (int gi = 0; gi < kv->n_groups; gi++) {
            const int32_t p = kiln_pool_table(kv, gi, seq)[first + b];
            if (p >= 0) kv->g[gi].refs[p]++;
            pages[b * kv->n_groups + gi] = p;
        }
    return KILN_OK;
}

int kiln_kv_release(kiln_kv *kv, const int32_t *pages, int n) {
    if (!pages || n < 0) return KILN_E_ARG;
    for (int gi = 0; gi < kv->n_groups; gi++)
        for (int b = 0; b < n; b++) {
            const int32_t p = pages[b * kv->n_groups + gi];
            if (!held_or_none(&kv->g[gi], p)) return KILN_E_ARG;
            for (int c = 0; c < b && p >= 0; c++)
                if (pages[c * kv->n_groups + gi] == p) return KILN_E_ARG;
        }
    for (int b = 0; b < n; b++)
        for (int gi = 0; gi < kv->n_groups; gi++)
            if (pages[b * kv->n_groups + gi] >= 0) drop_page(&kv->g[gi], pages[b * kv->n_groups + gi]);
    return KILN_OK;
}

int kiln_kv_attach(kiln_kv *kv, int seq, const int32_t *pages, int n) {
    if (kiln_kv_check(kv, seq) != KILN_OK) return KILN_E_SEQ;
    if (kv->n_past[seq] != 0) return KILN_E_SEQ;
    if (!pages || n < 0 || n > kv->max_blocks || n * kv->page_size > kv->n_ctx) return KILN_E_ARG;
    const int n_pos = n * kv->page_size;
    for (int gi = 0; gi < kv->n_groups; gi++) {
        const int first_read = n > 0 ? kiln_window_first(kv->g[gi].window, n_pos) / kv->page_size : n;
        for (int b = 0; b < n; b++) {
            const int32_t p = pages[b * kv->n_groups + gi];
            if (!held_or_none(&kv->g[gi], p)) return KILN_E_ARG;
            if (p < 0 && b >= first_read) return KILN_E_ROLLBACK_WINDOW;
        }
    }
    for (int b = 0; b < n; b++)
        for (int gi = 0; gi < kv->n_groups; gi++) {
            const int32_t p = pages[b * kv->n_groups + gi];
            if (p >= 0) kv->g[gi].refs[p]++;
            kiln_pool_table(kv, gi, seq)[b] = p;
        }
    kv->n_past[seq] = n_pos;
    return KILN_OK;
}
