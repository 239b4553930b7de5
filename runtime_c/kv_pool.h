/* kv_pool.h: the paged KV cache's bookkeeping: pools of pages with reference counts, and the
 * sequences that map their positions to pages through block tables.
 *
 * The planner fixes every size (kv_plan.py); the generated model.c fills a kiln_kv_shape and
 * calls these. Nothing here touches a page's contents except to copy one on write. Every
 * function that can fail checks everything first and changes nothing when it fails.
 */
#ifndef KILN_KV_POOL_H
#define KILN_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "window.h"

#define KILN_KV_MAX_GROUPS 4

/* One layer group's pool: full context (window 0) or a sliding window. */
typedef struct {
    int window;          /* 0: the group holds the whole context */
    int n_pages;
    size_t page_bytes;
    uint8_t *pages;      /* [n_pages][page_bytes] */
    int32_t *refs;       /* [n_pages]: block-table entries (and outside holders) that point at the page */
    int32_t *free_list;  /* [n_pages]: a stack of the free pages' ids */
    int n_free;
    int32_t *tables;     /* [n_seq][max_blocks]: block b -> page, or -1 */
} kiln_kv_group;

typedef struct {
    int n_seq, n_ctx, page_size, max_blocks, n_groups;
    kiln_kv_group g[KILN_KV_MAX_GROUPS];
    int32_t *n_past;     /* [n_seq]: positions held; -1 for a free slot */
} kiln_kv;

/* The shape the planner fixed: what kiln_kv_init needs. */
typedef struct {
    int n_seq, n_ctx, page_size, n_groups;
    int window[KILN_KV_MAX_GROUPS], n_pages[KILN_KV_MAX_GROUPS];
    size_t page_bytes[KILN_KV_MAX_GROUPS];
} kiln_kv_shape;

int kiln_kv_init(kiln_kv *kv, const kiln_kv_shape *shape);  /* 0, or -1 when out of memory */
void kiln_kv_free(kiln_kv *kv);

/* the status codes below are model.h's */
int kiln_kv_open(kiln_kv *kv);                  /* a free slot's id, or KILN_E_NO_SEQ */
int kiln_kv_check(const kiln_kv *kv, int seq);  /* KILN_OK for an open sequence */
void kiln_kv_close(kiln_kv *kv, int seq);       /* releases its pages; seq must be open */
int kiln_kv_fork(kiln_kv *kv, int src);         /* a new sequence sharing src's pages, or an error */
int kiln_kv_rollback(kiln_kv *kv, int seq, int n_keep);

/* A step appends n_new[s] positions to each sequence s (0 for most). Reserve gives every
 * block those positions fall in a page of the sequence's own: new pages where there were
 * none, a copy where the page is shared (copy on write). It fails with KILN_E_KV_FULL,
 * changing nothing, when a pool has too few free pages. */
int kiln_kv_reserve(kiln_kv *kv, const int32_t *n_new);
/* after the step: advance the cursors, and return the sliding pages no window can read again */
void kiln_kv_advance(kiln_kv *kv, const int32_t *n_new);

/* Keeping some positions (a context shift, an eviction policy): row r of seq will hold what
 * position keep[r] holds, for r < n, keep strictly increasing. keep_begin checks everything
 * (KILN_E_SHIFT_WINDOW when a sliding group lacks a page of a row the next query reads) and
 * gives every block that will be written a page of the sequence's own (KILN_E_KV_FULL, changing
 * nothing, when a pool is short); *first_changed is the first r with keep[r] != r. The caller
 * then moves the rows (kiln_kv_move_rows), and keep_end drops the pages no row needs. */
int kiln_kv_keep_begin(kiln_kv *kv, int seq, const int32_t *keep, int n, int *first_changed);
void kiln_kv_keep_end(kiln_kv *kv, int seq, int n);

/* whether the full-context pools can take n more positions of seq, in steps (kiln_eval); a sliding
 * pool holds every sequence's bound, so it never runs out */
int kiln_kv_can_append(const kiln_kv *kv, int seq, int n);
int kiln_kv_pages_used(const kiln_kv *kv, int group);

/* Pages held outside the sequences, by a prefix cache. A page array is [n_blocks][n_groups]
 * page ids, -1 where a block has no page in a group (a sliding window left it behind). */
/* blocks [first, first + n) of seq, all full, into pages; a reference is taken on each for the caller */
int kiln_kv_share(kiln_kv *kv, int seq, int first, int n, int32_t *pages);
/* drop the caller's references (taken by share); the array must name each page at most once per group */
int kiln_kv_release(kiln_kv *kv, const int32_t *pages, int n);
/* An empty open sequence takes pages (held by the caller) as its first n blocks, so that it
 * holds n * page_size positions. KILN_E_ROLLBACK_WINDOW when a group lacks a page the next
 * query must read. */
int kiln_kv_attach(kiln_kv *kv, int seq, const int32_t *pages, int n);

/* for kv_pool.c and kv_state.c: a sequence's block table in a group; a free page, its count 1
   (the caller checked n_free) */
static inline int32_t *kiln_pool_table(const kiln_kv *kv, int group, int seq) {
    return kv->g[group].tables + (size_t)seq * kv->max_blocks;
}
int kiln_kv_take_page(kiln_kv_group *g);

/* A sequence's state as bytes, for a file: n_past (int32); then for each group, one int8 per
 * block b < ceil(n_past / page_size), 1 where the sequence holds a page; then those pages'
 * bytes, group by group, in block order. */
/* (kv_state.c) */
size_t kiln_kv_state_size(const kiln_kv *kv, int seq); /* 0 for a sequence that is not open */
int kiln_kv_state_save(const kiln_kv *kv, int seq, uint8_t *buf, size_t size);
/* An empty open sequence takes a saved state: every field is checked against this pool (the
 * size to the byte, n_past against the context, the pages the next query reads present),
 * and KILN_E_KV_FULL when the pools lack pages; nothing changes on failure. */
int kiln_kv_state_load(kiln_kv *kv, int seq, const uint8_t *buf, size_t size);

#endif
