/* vnni_peak.c: the int8 multiply-add peak of this machine's cores, measured.
 *
 * Each thread runs 16 independent chains of vpdpbusd (u8 x s8, four products summed into each
 * i32 lane), enough to cover the instruction's latency on every core kiln targets, so the loop
 * is bound by the units' throughput alone. Inputs are opaque to the compiler (loaded from
 * volatile memory) and the accumulators are stored at the end, so nothing is folded away.
 * MACs = iterations x 16 chains x the vector's int8 lanes. kiln bench --profile divides the
 * prefill's matmul MACs by this.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "vnni_peak.h"

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#define ISA "avx512_vnni (zmm vpdpbusd)"
#define LANES 64
typedef __m512i vec;
#define VLOAD(p) _mm512_loadu_si512((const void *)(p))
#define DP(acc, a, b) _mm512_dpbusd_epi32(acc, a, b)
#define VSTORE(p, v) _mm512_storeu_si512((void *)(p), v)
#elif defined(__AVXVNNI__)
#define ISA "avx_vnni (ymm vpdpbusd)"
#define LANES 32
typedef __m256i vec;
#define VLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define DP(acc, a, b) _mm256_dpbusd_avx_epi32(acc, a, b)
#define VSTORE(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#elif defined(__AVX2__)
#define ISA "avx2 (vpmaddubsw + vpmaddwd + vpaddd)"
#define LANES 32
typedef __m256i vec;
#define VLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define DP(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)))
#define VSTORE(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#endif

#define CHAINS 16

typedef struct {
    long iters;
    int32_t sink[CHAINS * 16];
} job;

static volatile uint8_t SEED[64] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3};

static void *run(void *arg) {
#ifdef ISA
    job *j = arg;
    uint8_t bytes[64];
    for (int i = 0; i < 64; i++) bytes[i] = SEED[i];
    const vec a = VLOAD(bytes), b = VLOAD(bytes + (64 - LANES) / 2);
    vec acc[CHAINS];
    for (int c = 0; c < CHAINS; c++) acc[c] = VLOAD(bytes);
    for (long it = 0; it < j->iters; it++)
        for (int c = 0; c < CHAINS; c++) acc[c] = DP(acc[c], a, b);
    for (int c = 0; c < CHAINS; c++) VSTORE(j->sink + c * 16, acc[c]);
#else
    (void)arg;
#endif
    return NULL;
}

const char *kiln_int8_isa(void) {
#ifdef ISA
    return ISA;
#else
    return "none";
#endif
}

double kiln_int8_peak(int n_threads, long iters) {
#ifdef ISA
    if (n_threads < 1 || n_threads > 256 || iters < 1) return -1.0;
    pthread_t tid[256];
    job jobs[256];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n_threads; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].iters = iters;
        if (i > 0 && pthread_create(&tid[i], NULL, run, &jobs[i]) != 0) return -1.0;
    }
    run(&jobs[0]);
    for (int i = 1; i < n_threads; i++) pthread_join(tid[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return (double)n_threads * (double)iters * CHAINS * LANES / s;
#else
    (void)n_threads, (void)iters;
    return -1.0;
#endif
}
