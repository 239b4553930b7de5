/* tile_avx2.h: what the interleaved-tile matmuls share (rows_sb_avx2.c, rows_lut_avx2.c): the
 * tile's width T (16 rows a zmm with AVX-512 VNNI, else 8), its vector ops by width, the
 * activation rows a pass keeps in registers, and the 8 x 8 transpose that interleaves 8 rows. */
#ifndef KILN_TILE_AVX2_H
#define KILN_TILE_AVX2_H

#include <stdlib.h>
#include <string.h>

#include "isa.h"

#ifdef KILN_HAVE_AVX2
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define TILE_VNNI 1 /* vpdpbusd, at 512 or 256 bits */
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define T 16
#define V(op) _mm512_##op
typedef __m512i vi;
typedef __m512 vf;
#define vload(p) _mm512_loadu_si512(p)
#define vzero() _mm512_setzero_si512()
#else
#define T 8
#define V(op) _mm256_##op
typedef __m256i vi;
typedef __m256 vf;
#define vload(p) _mm256_loadu_si256((const __m256i *)(p))
#define vzero() _mm256_setzero_si256()
#endif
#if T == 8 && !defined(__AVX512VL__)
#define vdpbusd _mm256_dpbusd_avx_epi32
#define vdpwssd _mm256_dpwssd_avx_epi32
#else
#define vdpbusd V(dpbusd_epi32)
#define vdpwssd V(dpwssd_epi32)
#endif
#ifdef __AVX512F__
#define A_MAX 8 /* activation rows a pass: their sums, partial sums and accumulators fill 32 registers */
#else
#define A_MAX 4
#endif

/* Activation rows [c, n_a) in passes of A_MAX, then by 4, 2 and 1, so that no pass computes rows
   it does not store: PASS(A) takes A rows from row c and moves c on. */
#if A_MAX > 4
#define TILE_PASSES(n_a, c, PASS)                                                                             \
    do {                                                                                                      \
        for (; c + A_MAX <= (n_a);) PASS(A_MAX);                                                         \
        if ((n_a) - c >= 4) PASS(4);                                                                          \
        if ((n_a) - c >= 2) PASS(2);                                                                          \
        if ((n_a) - c >= 1) PASS(1);                                                                          \
    } while (0)
#else
#define TILE_PASSES(n_a, c, PASS)                                                                             \
    do {                                                                                                      \
        for (; c + A_MAX <= (n_a);) PASS(A_MAX);                                                         \
        if ((n_a) - c >= 2) PASS(2);                                                                          \
        if ((n_a) - c >= 1) PASS(1);                                                                          \
    } while (0)
#endif

/* a thread's buffer of tiles (64-byte multiples), kept and grown across its matmuls so that a call
   allocates nothing; each file that includes this has its own */
static void *tile_buffer(size_t bytes) {
    static _Thread_local struct { void *p; size_t n; } buffer;
    if (bytes > buffer.n) {
        free(buffer.p);
        buffer.p = aligned_alloc(64, bytes);
        buffer.n = buffer.p ? bytes : 0;
    }
    return buffer.p;
}

/* a tile's nw outputs of one activation row: a whole tile's straight from the register (through a
   buffer and a memcpy of variable length, the stores were 9% of a super-block type's prefill) */
INLINE void store_outputs(float *y, vf v, int nw) {
    if (nw == T) {
        V(storeu_ps)(y, v);
        return;
    }
    float t[T];
    V(storeu_ps)(t, v);
    memcpy(y, t, (size_t)nw * sizeof(float));
}

INLINE int32_t ld32(const void *p) { /* 4 activation bytes, for a broadcast */
    int32_t v;
    return memcpy(&v, p, sizeof v), v;
}

/* v[e] = the 8 int32 of v[0..8)'s lane e (an 8 x 8 transpose) */
INLINE void transpose8(__m256i v[8]) {
    __m256i t[8], s[8];
    for (int i = 0; i < 8; i += 2)
        t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]), t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
    for (int i = 0; i < 8; i += 4) {
        s[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]), s[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        s[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]), s[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++)
        v[i] = _mm256_permute2x128_si256(s[i], s[i + 4], 0x20), v[i + 4] = _mm256_permute2x128_si256(s[i], s[i + 4], 0x31);
}

#endif
#endif
