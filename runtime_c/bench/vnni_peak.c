/* vnni_peak.c: the int8 multiply-add peak of this machine's cores, measured.
 *
 * Each thread runs independent chains of vpdpbusd (u8 x s8, four products summed into each i32
 * lane), 16 of them on AVX-512 (12 on AVX-VNNI's 16 registers, 8 on AVX2, whose carried step is a
 * vpaddd), enough to cover the instruction's latency on every core kiln targets, so the loop is
 * bound by the units' throughput alone. The loop must hold nothing else: tests/test_hot_loops.py
 * reads the compiled loop and counts its instructions. Inputs are opaque to the compiler (loaded from
 * volatile memory) and the accumulators are stored at the end, so nothing is folded away.
 * MACs = iterations x CHAINS x the vector's int8 lanes. kiln bench --profile divides the
 * prefill's matmul MACs by this.
 *
 * kiln_int8_exact_peak runs the same chains with the float steps that keep each output the
 * reference dot's bits beside them: for each 8 vpdpbusd (a 32-weight block's, for one activation
 * row and 16 weight rows), one multiply of the two scales and one fma into the row's sum
 * (acc = fma(isum, d * y.d, acc), ref_quant.c). No reordering removes them, and where the CPU
 * issues them to the ports vpdpbusd takes (Zen 4 does), they bound the quantized matmuls below
 * the int8 peak: kiln bench --profile reports that ceiling beside it.
 *
 * Where the CPU has AMX and Linux grants the tiles, kiln_amx_int8_peak measures the tile unit the
 * same way: four independent chains of tdpbssd on 16 x 64-byte tiles, 16 x 16 x 64 MACs each.
 * Prefill uses the tiles for the 32-weight types' integer sums; the profile reports that peak
 * beside the VNNI one, which stays the yardstick because the float steps around the sums run on
 * the vector units.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "vnni_peak.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define HAVE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#define ISA "avx512_vnni (zmm vpdpbusd)"
#define LANES 64
typedef __m512i vec;
typedef __m512 fvec;
#define FCAST(v) _mm512_castsi512_ps(v)
#define FMUL(a, b) _mm512_mul_ps(a, b)
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define FSTORE(p, v) _mm512_storeu_ps(p, v)
#define VLOAD(p) _mm512_loadu_si512((const void *)(p))
#define DP(acc, a, b) _mm512_dpbusd_epi32(acc, a, b)
#define VSTORE(p, v) _mm512_storeu_si512((void *)(p), v)
#define CHAINS 16
#elif defined(__AVXVNNI__)
#define ISA "avx_vnni (ymm vpdpbusd)"
#define LANES 32
typedef __m256i vec;
typedef __m256 fvec;
#define FCAST(v) _mm256_castsi256_ps(v)
#define FMUL(a, b) _mm256_mul_ps(a, b)
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define FSTORE(p, v) _mm256_storeu_ps(p, v)
#define VLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define DP(acc, a, b) _mm256_dpbusd_avx_epi32(acc, a, b)
#define VSTORE(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define CHAINS 12
#elif defined(__AVX2__)
#define ISA "avx2 (vpmaddubsw + vpmaddwd + vpaddd)"
#define LANES 32
typedef __m256i vec;
typedef __m256 fvec;
#define FCAST(v) _mm256_castsi256_ps(v)
#define FMUL(a, b) _mm256_mul_ps(a, b)
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define FSTORE(p, v) _mm256_storeu_ps(p, v)
#define VLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define DP(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)))
#define VSTORE(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define CHAINS 8
#else
#define CHAINS 1
#endif

/* X(c) for each chain c. The chains are named variables, each made opaque once: held in an array,
   GCC 12 kept one in memory and copied the rest every iteration, and on Cascade Lake those copies
   took the vector ports' slots, so the peak it measured was 40% of the machine's (118 of about 300
   G multiply-adds a second on one core); given the same value, the chains would fold into one. An
   empty asm makes `a` new to the compiler before each step (no instruction), so AVX2's products,
   which no chain carries, are neither hoisted out of the loop nor shared between chains. */
#define EACH8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#if CHAINS == 16
#define EACH(X) EACH8(X) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#elif CHAINS == 12
#define EACH(X) EACH8(X) X(8) X(9) X(10) X(11)
#else
#define EACH(X) EACH8(X)
#endif

typedef struct {
    long iters;
    int exact; /* with each block's float steps */
    int32_t sink[CHAINS * 16];
    float fsink[2 * 16]; /* the exact loop's float sums */
} job;

/* each 4 bytes 1.5f (0x3FC00000), as the exact loop reads them: its float steps meet normal numbers
   alone (a product that fell to a denormal would take a microcode assist on Intel's cores) */
#define ONE_AND_A_HALF 0x00, 0x00, 0xC0, 0x3F
#define FOUR(x) x, x, x, x
static volatile uint8_t SEED[64] = {FOUR(FOUR(ONE_AND_A_HALF))};

static void *run(void *arg) {
#ifdef ISA
    job *j = arg;
    uint8_t bytes[64];
    for (int i = 0; i < 64; i++) bytes[i] = SEED[i];
    vec a = VLOAD(bytes);
    const vec b = VLOAD(bytes + (64 - LANES) / 2);
#define CHAIN_INIT(c) vec acc##c = VLOAD(bytes); __asm__("" : "+v"(acc##c));
#define CHAIN_STEP(c) __asm__("" : "+v"(a)); acc##c = DP(acc##c, a, b);
#define CHAIN_SINK(c) VSTORE(j->sink + c * 16, acc##c);
    EACH(CHAIN_INIT)
    const long iters = j->iters;
    if (!j->exact)
        for (long it = 0; it < iters; it++) {
            EACH(CHAIN_STEP)
        }
    else {
        /* after each 8 steps, a block's: its two scales' product, then the row's fma of the converted integer
           sum by it. Their operand is the chains' own `a` read as floats: made new before each step, it
           cannot be hoisted, and it takes no register more (AVX-VNNI's 12 chains leave 2 of 16) */
        fvec row0 = FCAST(b), row1 = FCAST(b);
#define EXACT_STEP(c) CHAIN_STEP(c) \
        if ((c) % 8 == 7) { const fvec p = FMUL(FCAST(a), FCAST(a)); \
                            if ((c) < 8) row0 = FMA(FCAST(a), p, row0); else row1 = FMA(FCAST(a), p, row1); }
        for (long it = 0; it < iters; it++) {
            EACH(EXACT_STEP)
        }
        FSTORE(j->fsink, row0);
#if CHAINS == 16
        FSTORE(j->fsink + 16, row1); /* else row1 is dead, and takes no register */
#endif
    }
    EACH(CHAIN_SINK)
#else
    (void)arg;
#endif
    return NULL;
}

#ifdef HAVE_AMX
static void *run_amx(void *arg) {
    job *j = arg;
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg = {.palette = 1};
    for (int t = 0; t < 6; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
    uint8_t bytes[16 * 64];
    for (int i = 0; i < 16 * 64; i++) bytes[i] = SEED[i % 64];
    _tile_loadd(4, bytes, 64);
    _tile_loadd(5, bytes, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long it = 0; it < j->iters; it++) {
        _tile_dpbssd(0, 4, 5);
        _tile_dpbssd(1, 4, 5);
        _tile_dpbssd(2, 4, 5);
        _tile_dpbssd(3, 4, 5);
    }
    _tile_stored(0, j->sink, 64);
    _tile_release();
    return NULL;
}
#endif

/* `fn` on n_threads threads (the caller one of them), the wall seconds they took; -1 on failure */
static double timed(void *(*fn)(void *), int n_threads, long iters, int exact) {
    if (n_threads < 1 || n_threads > 256 || iters < 1) return -1.0;
    pthread_t tid[256];
    job jobs[256];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n_threads; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].iters = iters, jobs[i].exact = exact;
        if (i > 0 && pthread_create(&tid[i], NULL, fn, &jobs[i]) != 0) {
            for (int k = 1; k < i; k++) pthread_join(tid[k], NULL);
            return -1.0;
        }
    }
    fn(&jobs[0]);
    for (int i = 1; i < n_threads; i++) pthread_join(tid[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

double kiln_amx_int8_peak(int n_threads, long iters) {
#ifdef HAVE_AMX
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0) return -1.0;
    const double s = timed(run_amx, n_threads, iters, 0);
    return s > 0 ? (double)n_threads * (double)iters * 4 * 16 * 16 * 64 / s : -1.0;
#else
    (void)n_threads, (void)iters;
    return -1.0;
#endif
}

const char *kiln_int8_isa(void) {
#ifdef ISA
    return ISA;
#else
    return "none";
#endif
}

/* MACs a second of the chains, alone or beside each block's float steps */
static double chains_rate(int n_threads, long iters, int exact) {
#ifdef ISA
    const double s = timed(run, n_threads, iters, exact);
    return s > 0 ? (double)n_threads * (double)iters * CHAINS * LANES / s : -1.0;
#else
    (void)n_threads, (void)iters, (void)exact;
    return -1.0;
#endif
}

double kiln_int8_peak(int n_threads, long iters) { return chains_rate(n_threads, iters, 0); }

double kiln_int8_exact_peak(int n_threads, long iters) { return chains_rate(n_threads, iters, 1); }
