/* threads.c: the per-model pool. Workers sleep on a condition variable between steps (one
 * wake-up per step) and meet at a spinning, sense-counting barrier inside a step (cheap, and
 * only where data depends). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#include "threads.h"

/* A worker's stack: the kernels keep per-thread buffers there (the x8 matmuls up to 450 KB), so
 * the size is set rather than left to the platform's default (128 KB on musl). */
#if defined(__SANITIZE_ADDRESS__)
#define KILN_WORKER_STACK_BYTES (16u << 20) /* redzones, and no stack slot shared, grow frames several-fold */
#else
#define KILN_WORKER_STACK_BYTES (4u << 20)
#endif
#define KILN_CLAIM_LISTS 2048 /* claim lists a region may begin; past them, static shares */
#define KILN_WAKE_SPINS (1u << 13) /* pauses a worker waits for the next region before it sleeps: ~0.1-0.3 ms */

struct kiln_pool {
    int n;         /* threads of a region, the caller included; fixed before any worker starts */
    int n_started; /* workers running, for the join: only the creating thread touches it */
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    atomic_uint generation; /* bumped once per region, under mu */
    atomic_int running;     /* workers still inside the current region, changed under mu */
    int stop;
    kiln_region_fn fn;
    void *arg;
    atomic_int arrived; /* threads at the barrier */
    atomic_uint phase;  /* bumped each time the barrier opens */
    atomic_int claim_next[KILN_CLAIM_LISTS]; /* each list's chunks handed out; zero between regions */
};

typedef struct {
    kiln_pool *pool;
    int ith, nth;
} worker_arg;

static void *worker_main(void *p_) {
    worker_arg *wa = p_;
    kiln_pool *p = wa->pool;
    int claimed = 0;
    const kiln_thread t = {wa->ith, wa->nth, p, &claimed};
    free(wa);
    unsigned seen = 0;
    for (;;) {
        /* Steps follow each other within microseconds (a decode loop's Python between them): watch
           for the next one a while before sleeping, since a futex wake-up costs tens of them. */
        for (unsigned spins = 0; spins < KILN_WAKE_SPINS; spins++) {
            if (atomic_load_explicit(&p->generation, memory_order_acquire) != seen) break;
            cpu_relax();
        }
        pthread_mutex_lock(&p->mu);
        while (p->generation == seen && !p->stop) pthread_cond_wait(&p->start, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->generation;
        const kiln_region_fn fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        claimed = 0;
        fn(arg, &t);
        pthread_mutex_lock(&p->mu);
        if (--p->running == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

kiln_pool *kiln_pool_create(int n_threads) {
    if (n_threads < 1) return NULL;
    kiln_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->arrived, 0);
    atomic_init(&p->phase, 0);
    pthread_attr_t attr;
    if (!p->workers || pthread_attr_init(&attr) != 0) {
        kiln_pool_destroy(p);
        return NULL;
    }
    int ok = pthread_attr_setstacksize(&attr, KILN_WORKER_STACK_BYTES) == 0;
    for (int i = 1; i < n_threads && ok; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (worker_arg){p, i, n_threads};
        ok = wa && pthread_create(&p->workers[i], &attr, worker_main, wa) == 0;
        if (ok) p->n_started = i;
        else free(wa);
    }
    pthread_attr_destroy(&attr);
    if (!ok) { /* the workers that started are stopped and joined */
        kiln_pool_destroy(p);
        return NULL;
    }
    return p;
}

void kiln_pool_destroy(kiln_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i <= p->n_started; i++) pthread_join(p->workers[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    free(p->workers);
    free(p);
}

int kiln_pool_size(const kiln_pool *p) { return p ? p->n : 1; }

void kiln_pool_run(kiln_pool *p, kiln_region_fn fn, void *arg) {
    if (!p || p->n == 1) {
        const kiln_thread alone = {0, 1, NULL, NULL};
        fn(arg, &alone);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->running = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    int claimed = 0;
    const kiln_thread t0 = {0, p->n, p, &claimed};
    fn(arg, &t0);
    for (unsigned spins = 0; spins < KILN_WAKE_SPINS && atomic_load_explicit(&p->running, memory_order_acquire) > 0; spins++)
        cpu_relax();
    pthread_mutex_lock(&p->mu);
    while (p->running > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    /* every thread began the lists thread 0 did; no worker is inside a region now, and the next
       generation's release publishes the zeros */
    for (int i = 0; i < claimed && i < KILN_CLAIM_LISTS; i++)
        atomic_store_explicit(&p->claim_next[i], 0, memory_order_relaxed);
}

void kiln_barrier(const kiln_thread *t) {
    if (t->nth == 1) return;
    kiln_pool *p = t->pool;
    const unsigned phase = atomic_load_explicit(&p->phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&p->arrived, 1, memory_order_acq_rel) == t->nth - 1) {
        atomic_store_explicit(&p->arrived, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->phase, 1, memory_order_release);
        return;
    }
    /* A step's ops are microseconds apart: spin on pause rather than a sched_yield syscall per
       check (12% of decode samples, though decode speed did not measurably change without it),
       and yield the core only when a thread is late, e.g. with more threads than cores. */
    for (unsigned spins = 0; atomic_load_explicit(&p->phase, memory_order_acquire) == phase; spins++) {
        if (spins < 1u << 14) cpu_relax();
        else sched_yield();
    }
}

kiln_claims kiln_claims_begin(const kiln_thread *t, int n_items, int chunk) {
    kiln_claims c = {NULL, n_items, chunk > 0 ? chunk : 1, 0, n_items};
    if (t->nth == 1 || !t->claimed) return c;
    const int list = (*t->claimed)++;
    /* a chunk a thread or fewer: the static share, which needs no shared counter */
    if (list < KILN_CLAIM_LISTS && (long)c.chunk * t->nth < n_items) c.next = &t->pool->claim_next[list];
    else kiln_share(t, n_items, c.chunk, &c.lo, &c.hi);
    return c;
}

int kiln_claim(kiln_claims *c, int *lo, int *hi) {
    if (!c->next) {
        *lo = c->lo, *hi = c->hi;
        c->lo = c->hi;
        return *lo < *hi;
    }
    /* piece k of n_pieces, their sizes apart by one item at most: cut at multiples of `chunk`, 128 units in
       pieces of 11 had left one thread 4 units short at the end of llama-1b's q, o and down */
    const long k = atomic_fetch_add_explicit((atomic_int *)c->next, 1, memory_order_relaxed);
    const long pieces = (c->n + c->chunk - 1) / c->chunk;
    if (k >= pieces) return 0;
    *lo = (int)(k * c->n / pieces);
    *hi = (int)((k + 1) * c->n / pieces);
    return 1;
}
