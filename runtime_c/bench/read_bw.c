/* read_bw.c: the machine's read bandwidth, measured as decode meets it.
 *
 * Decode reads every weight once a token, so the rate at which the cores can stream memory
 * they do not write is its bound. Each thread sums its own slice of one buffer (far larger than
 * the caches) with vector loads into eight independent accumulators, as STREAM's kernels do; the
 * threads start together at a barrier and a pass is the time until the last one is done. The
 * best of several passes is reported. Each thread first touches its own slice, so on a machine
 * with several memory nodes the pages sit near the core that reads them. The buffer is in huge
 * pages as the packed weights and the KV pool are (huge_pages.h): in 4 KB pages the same loop had read
 * 6-16% less (Zen 4 VM, alternated), so that decode was judged against a bound below its own.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../huge_pages.h"
#include "read_bw.h"

/* the compiler's widest loads, summed as integers (random bits as floats would meet NaNs and denormals) */
typedef uint32_t vec __attribute__((vector_size(64), aligned(64)));

typedef struct {
    const vec *p;
    size_t n; /* vectors */
    pthread_barrier_t *start, *done;
    int passes;
    uint32_t sink;
} slice;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void *reader(void *arg) {
    slice *s = arg;
    /* first touch: the pages are this thread's; every 8 bytes different, so that no two pages are
       alike (a hypervisor that merges identical pages would back the whole buffer with one, and
       its reads would never leave the cache) */
    uint64_t *q = (uint64_t *)s->p;
    for (size_t i = 0; i < s->n * sizeof(vec) / sizeof *q; i++) q[i] = (uint64_t)(uintptr_t)(q + i) * 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < s->passes; k++) {
        pthread_barrier_wait(s->start);
        vec a[8] = {{0}};
        for (size_t i = 0; i + 8 <= s->n; i += 8)
            for (int j = 0; j < 8; j++) a[j] += s->p[i + j];
        for (int j = 1; j < 8; j++) a[0] += a[j];
        for (int j = 0; j < 16; j++) s->sink += a[0][j];
        pthread_barrier_wait(s->done);
    }
    return NULL;
}

double kiln_read_bandwidth(int n_threads, size_t bytes, int passes) {
    if (n_threads < 1 || n_threads > 256 || passes < 1) return -1;
    const size_t per = bytes / n_threads / (8 * sizeof(vec)) * (8 * sizeof(vec));
    if (per == 0) return -1;
    uint8_t *buf = kiln_huge_pages(per * n_threads);
    slice *s = calloc(n_threads, sizeof *s);
    pthread_t *tid = calloc(n_threads, sizeof *tid);
    pthread_barrier_t start, done;
    if (!buf || !s || !tid) {
        free(buf), free(s), free(tid);
        return -1;
    }
    pthread_barrier_init(&start, NULL, n_threads + 1);
    pthread_barrier_init(&done, NULL, n_threads + 1);
    for (int t = 0; t < n_threads; t++) {
        s[t] = (slice){(const vec *)(buf + per * t), per / sizeof(vec), &start, &done, passes, 0};
        pthread_create(&tid[t], NULL, reader, &s[t]);
    }
    double best = 0;
    for (int k = 0; k < passes; k++) {
        pthread_barrier_wait(&start);
        const double t0 = now();
        pthread_barrier_wait(&done);
        const double rate = (double)(per * n_threads) / (now() - t0);
        if (rate > best) best = rate;
    }
    for (int t = 0; t < n_threads; t++) pthread_join(tid[t], NULL);
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&done);
    free(buf), free(s), free(tid);
    return best;
}
