/* threads.h: one persistent pool of threads per model instance.
 *
 * A step runs as one parallel region: every thread executes the whole step function,
 * kernels split their work by (ith, nth), and kiln_barrier() separates dependent ops.
 */
#ifndef KILN_THREADS_H
#define KILN_THREADS_H

typedef struct kiln_pool kiln_pool;

typedef struct {
    int ith, nth;    /* this thread's index, and how many run the region */
    kiln_pool *pool; /* NULL when running alone */
    int *claimed;    /* the claim lists this thread has begun in the region (kiln_claims_begin) */
} kiln_thread;

typedef void (*kiln_region_fn)(void *arg, const kiln_thread *t);

kiln_pool *kiln_pool_create(int n_threads); /* NULL on failure; n_threads - 1 workers are started */
void kiln_pool_destroy(kiln_pool *p);
int kiln_pool_size(const kiln_pool *p);
void kiln_pool_run(kiln_pool *p, kiln_region_fn fn, void *arg); /* the caller is thread 0 */
void kiln_barrier(const kiln_thread *t);

/* this thread's contiguous share [*lo, *hi) of n items, cut at multiples of `align` */
static inline void kiln_share(const kiln_thread *t, int n, int align, int *lo, int *hi) {
    const int per = ((n + t->nth - 1) / t->nth + align - 1) / align * align;
    *lo = t->ith * per < n ? t->ith * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}

/* Work claimed a chunk at a time instead of shared out in advance. A static share waits for the
 * slowest thread, and threads do not run at one speed: two vCPUs that share a host core, or a
 * core whose sibling is busy, ran 1.3-1.4x apart here. Each item is still one thread's whole work,
 * so who computes it never changes its bits. Every thread of the region must begin the same lists
 * in the same order (every thread runs the whole step, so they do). */
typedef struct {
    void *next;     /* the list's shared counter of chunks handed out, or NULL: [lo, hi) is this thread's */
    int n, chunk, lo, hi;
} kiln_claims;
kiln_claims kiln_claims_begin(const kiln_thread *t, int n_items, int chunk);
/* the next piece [*lo, *hi) of the list, or 0 when it is used up: the n items are cut into
   ceil(n / chunk) pieces whose sizes differ by one item at most */
int kiln_claim(kiln_claims *c, int *lo, int *hi);

#endif
