/* rows_sb_avx2.c: matmuls on the unpacked super-block types (Q2_K, Q3_K, IQ4_XS, the IQ2/IQ3/IQ1
 * types, TQ1_0, TQ2_0) with AVX2, 8 weight rows a tile, each row's value in one lane.
 *
 * A tile's blocks are unpacked once (sb_unpack.c: signed bytes q and 16 scales a super-block) and
 * dotted against every activation row, so a prefill step decodes its grids once, not once a row.
 * The integer sums are exact; then each block's floats are the reference's (ref_sblock.c), lane by
 * lane: acc = fma(isum, d * y.d, acc), mins = fma(msum, dmin * y.d, mins), the value acc - mins.
 * Where the CPU has VNNI the build's byte products are the same instructions as rows_avx2.c's.
 */
#include <stdlib.h>
#include <string.h>

#include "quant_impl.h"

#ifdef KILN_HAVE_AVX2
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))
#define BUFFER_A 3 /* activation rows from which a tile's blocks are unpacked once for all of them */

/* lane r = the sum of v[r]'s 8 lanes */
INLINE __m256i reduce8(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
/* With VNNI, vpdpbusd takes the byte products, q + 128 (unsigned) times y, 4 to an int32; the
   128 y this adds is taken off a sub-block at a time as 128 bsums[j]. The 8 sums of a sub-block
   pair of each 32 bytes (2k low, 2k + 1 high) are added by vphaddd into the order
   [0 2 4 6 | 1 3 5 7] of a half of the block; scales and bsums are read into that order. */
INLINE __m256i dpbusd(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#endif
}

/* 8 int16 [0..8) -> int32 in the order [0 2 4 6 | 1 3 5 7] */
INLINE __m256i half_order(const int16_t *v) {
    const __m128i pick = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    return _mm256_cvtepi16_epi32(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)v), pick));
}

/* an activation block as the rows' sums read it: its bytes, and 128 bsums in half_order */
typedef struct {
    __m256i y[QK_K / 32], b128[2];
} sb_act;

INLINE void sb_act_of(const block_q8_K *y, sb_act *a) {
    for (int k = 0; k < QK_K / 32; k++) a->y[k] = _mm256_loadu_si256((const __m256i *)(y->qs + 32 * k));
    for (int h = 0; h < 2; h++) a->b128[h] = _mm256_slli_epi32(half_order(y->bsums + 8 * h), 7);
}

/* 8 int32 whose sum is the block's isum: sum over sub-blocks j of sc[j] x sum(q y) */
INLINE __m256i sb_isum(const kiln_sb *u, const sb_act *a) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256i p[QK_K / 32];
    for (int k = 0; k < QK_K / 32; k++)
        p[k] = dpbusd(_mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(u->q + 32 * k)), flip), a->y[k]);
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i *q = p + 4 * h;
        const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(q[0], q[1]), _mm256_hadd_epi32(q[2], q[3]));
        isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(_mm256_sub_epi32(s, a->b128[h]), half_order(u->sc + 8 * h)));
    }
    return isum;
}
#else
typedef struct {
    const block_q8_K *y;
} sb_act;
INLINE void sb_act_of(const block_q8_K *y, sb_act *a) { a->y = y; }

/* 8 int32 whose sum is the block's isum: sum over sub-blocks j of sc[j] x sum(q y). Byte products
   pair into int16 (|q|, |y| <= 127: at most 32258), then scale and pair into int32. */
INLINE __m256i sb_isum(const kiln_sb *u, const sb_act *a) {
    const block_q8_K *y = a->y;
    /* sub-block 2k's scale in the low 128 bits, 2k + 1's in the high: a byte shuffle of the 8
       scales of its half of the block, in both lanes */
    const __m256i half[2] = {_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)u->sc)),
                             _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(u->sc + 8)))};
    __m256i isum = _mm256_setzero_si256();
    for (int k = 0; k < QK_K / 32; k++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(u->q + 32 * k));
        const __m256i yk = _mm256_loadu_si256((const __m256i *)(y->qs + 32 * k));
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(yk, q));
        const char lo = (char)(4 * (k % 4)), hi = (char)(4 * (k % 4) + 2);
        const __m256i pick = _mm256_setr_epi8(lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1,
                                              lo, lo + 1, lo, lo + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1,
                                              hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1);
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(pairs, _mm256_shuffle_epi8(half[k / 4], pick)));
    }
    return isum;
}
#endif

/* a row's msum: sum over sub-blocks of m[j] x bsums[j] (Q2_K) */
INLINE int32_t sb_msum(const kiln_sb *u, const block_q8_K *y) {
    const __m256i p = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)u->m),
                                        _mm256_loadu_si256((const __m256i *)y->bsums));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(t);
}

/* one super-block of 8 unpacked rows (u[r], r < 8) into one activation row's accumulators */
INLINE void sb_block(const int has_min, const kiln_sb *const u[8], const block_q8_K *y, __m256 *acc, __m256 *mins) {
    __m256i p[8];
    float d[8], dmin[8];
    int32_t msum[8];
    sb_act a;
    sb_act_of(y, &a);
    for (int r = 0; r < 8; r++) {
        p[r] = sb_isum(u[r], &a);
        d[r] = u[r]->d;
        if (has_min) dmin[r] = u[r]->dmin, msum[r] = sb_msum(u[r], y);
    }
    const __m256 yd = _mm256_set1_ps(y->d);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(p)), _mm256_mul_ps(_mm256_loadu_ps(d), yd), *acc);
    if (has_min)
        *mins = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)msum)),
                                _mm256_mul_ps(_mm256_loadu_ps(dmin), yd), *mins);
}

INLINE void store8(__m256 acc, __m256 mins, int nw, float *y) {
    float v[8];
    _mm256_storeu_ps(v, _mm256_sub_ps(acc, mins));
    memcpy(y, v, (size_t)nw * sizeof(float));
}

/* unpack block b of the tile's rows (past nw, the last row's again) into u[0..8) */
INLINE void unpack_tile(kiln_unpack_fn unpack, const uint8_t *w, size_t w_row, int nw, size_t bb, int b, kiln_sb *u) {
    for (int r = 0; r < nw; r++) {
        u[r].dmin = 0.0f;
        memset(u[r].m, 0, sizeof u[r].m);
        unpack(w + (size_t)r * w_row + (size_t)b * bb, &u[r]);
    }
    for (int r = nw; r < 8; r++) u[r] = u[nw - 1];
}

static void rows_sb(const int type, int n, const uint8_t *w, size_t w_row, int n_w, const uint8_t *act, size_t a_row,
                    int n_a, float *y, size_t y_row) {
    const kiln_unpack_fn unpack = kiln_unpack_fast(type);
    const size_t bb = kiln_row_bytes(type, QK_K);
    const int nb = n / QK_K, has_min = type == KILN_Q2_K;
    /* the whole tile unpacked, for steps of several rows; one block at a time for a decode row */
    kiln_sb *tile = n_a >= BUFFER_A ? malloc(sizeof(kiln_sb) * 8 * (size_t)nb) : NULL;
    kiln_sb one[8];
    for (int r0 = 0; r0 < n_w; r0 += 8) {
        const int nw = n_w - r0 < 8 ? n_w - r0 : 8;
        const uint8_t *wr = w + (size_t)r0 * w_row;
        if (tile) {
            for (int b = 0; b < nb; b++) unpack_tile(unpack, wr, w_row, nw, bb, b, tile + 8 * b);
            for (int c = 0; c < n_a; c++) {
                const block_q8_K *yc = (const block_q8_K *)(act + (size_t)c * a_row);
                __m256 acc = _mm256_setzero_ps(), mins = _mm256_setzero_ps();
                for (int b = 0; b < nb; b++) {
                    const kiln_sb *u[8];
                    for (int r = 0; r < 8; r++) u[r] = tile + 8 * b + r;
                    sb_block(has_min, u, yc + b, &acc, &mins);
                }
                store8(acc, mins, nw, y + (size_t)c * y_row + r0);
            }
            continue;
        }
        for (int c0 = 0; c0 < n_a; c0 += BUFFER_A) { /* no buffer (a decode row, or no memory for one) */
            const int A = n_a - c0 < BUFFER_A ? n_a - c0 : BUFFER_A;
            __m256 acc[BUFFER_A], mins[BUFFER_A];
            for (int c = 0; c < A; c++) acc[c] = mins[c] = _mm256_setzero_ps();
            for (int b = 0; b < nb; b++) {
                unpack_tile(unpack, wr, w_row, nw, bb, b, one);
                const kiln_sb *u[8];
                for (int r = 0; r < 8; r++) u[r] = one + r;
                for (int c = 0; c < A; c++)
                    sb_block(has_min, u, (const block_q8_K *)(act + (size_t)(c0 + c) * a_row) + b, &acc[c], &mins[c]);
            }
            for (int c = 0; c < A; c++) store8(acc[c], mins[c], nw, y + (size_t)(c0 + c) * y_row + r0);
        }
    }
    free(tile);
}

#define ROWS_SB(name, type)                                                                                      \
    void kiln_rows_##name##_avx2(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row,    \
                                 int n_a, float *y, size_t y_row) {                                             \
        rows_sb(type, n, w, w_row, n_w, act, a_row, n_a, y, y_row);                                              \
    }
KILN_SB_TYPES(ROWS_SB)
#endif
