/* rows_sb_avx2.c: matmuls on the unpacked super-block types (Q2_K, Q3_K, IQ4_XS, the IQ2/IQ3/IQ1
 * types, TQ1_0, TQ2_0) with AVX2, each weight row's value in one lane.
 *
 * Prefill and batched steps (BUFFER_A activation rows and up): a tile of T weight rows (16 a zmm
 * with AVX-512 VNNI, else 8) is unpacked once (sb_unpack.c) into an interleaved copy, 4 weights
 * of each row in turn, so that one byte-product instruction against 4 activation bytes
 * broadcast gives all T rows' partial sums, and each weight vector serves A_MAX activation rows
 * from registers (iqk's register tiling). With VNNI that is vpdpbusd on the weights as q + 128
 * (unsigned), each partial sum starting from -128 times its activations' sum (the bsums) to take
 * off the 128 y that adds, then a vpmulld by the rows' scales (Q2_K and Q3_K fold theirs in);
 * without VNNI, vpmaddubsw on |q| and y with q's sign, whose int16 pairs vpmaddwd scales.
 * Decode (1 or 2 rows) dots 8 rows one at a time, not interleaved (that would cost more than a
 * lone activation row gains): each row's block is unpacked inline (sb_unpack_avx2.h) and dotted
 * from registers, never stored, and the 8 rows' blocks PF ahead are prefetched.
 * The integer sums are exact; then each block's floats are the reference's (ref_sblock.c), lane by
 * lane: acc = fma(isum, d * y.d, acc), mins = fma(msum, dmin * y.d, mins), the value acc - mins.
 * The tile's layout and its gemms (VNNI, AMX) are sb_tile_avx2.h's; the tiles of a packed matrix
 * are built in rows_sb_kx8_avx2.c.
 */
#include <string.h>

#include "quant_impl.h"
#include "sb_tile_avx2.h"
#include "sb_unpack_avx2.h"

#ifdef KILN_HAVE_AVX2

/* -- decode: 8 rows, each dotted alone and the 8 sums reduced across lanes ------------------- */

/* lane r = the sum of v[r]'s 8 lanes */
INLINE __m256i reduce8(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* sub-block k's two scales of 16 as vpmaddwd's int16 multipliers: sc[2k] across the low 128 bits,
   sc[2k + 1] across the high, a byte shuffle of the 8 scales of k's half of the block (half, in
   both lanes) */
INLINE __m256i scale_pair_shuffle(int k) {
    const char lo = (char)(4 * (k % 4)), hi = (char)(4 * (k % 4) + 2);
    return _mm256_setr_epi8(lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo,
                            lo + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1,
                            hi, hi + 1);
}
INLINE __m256i scale_pairs(__m256i half, int k) { return _mm256_shuffle_epi8(half, scale_pair_shuffle(k)); }
#ifdef __AVX512BW__
/* sub-blocks k and k + 1's, in the low and high 256 bits, from half in all four lanes */
INLINE __m512i scale_pairs2(__m512i half, int k) {
    return _mm512_shuffle_epi8(half, _mm512_inserti64x4(_mm512_castsi256_si512(scale_pair_shuffle(k)),
                                                        scale_pair_shuffle(k + 1), 1));
}
#endif

#ifdef TILE_VNNI
/* vpdpbusd takes the byte products, q + 128 (unsigned) times y, 4 to an int32; the 128 y this
   adds is taken off a sub-block at a time as 128 bsums[j]. The 8 sums of a sub-block pair of
   each 32 bytes (2k low, 2k + 1 high) are added by vphaddd into the order [0 2 4 6 | 1 3 5 7] of
   a half of the block; scales and bsums are read into that order. */
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
    const __m256i half[2] = {_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)u->sc)),
                             _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(u->sc + 8)))};
    __m256i isum = _mm256_setzero_si256();
    for (int k = 0; k < QK_K / 32; k++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(u->q + 32 * k));
        const __m256i yk = _mm256_loadu_si256((const __m256i *)(y->qs + 32 * k));
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(yk, q));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(pairs, scale_pairs(half[k / 4], k)));
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

/* the grid types' signs go onto the activations: y negated where the weight is */
INLINE __m256i signed_y(const int type, __m256i y, const uint32_t *sgn) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    /* The types whose grid rows are 4 broadcasts (rows4) are short of vector ports, the gathering
       ones of load ports: the former take the mask by kmovd from memory, a load (GCC's own way moved
       the word through a vector register and a GPR, 3 uops: IQ2_XS 2.6% slower), the latter so
       (IQ3_XXS 5.5% faster than by the load). */
    __mmask32 m = (__mmask32)u32_at(sgn);
    if (type == KILN_IQ2_XXS || type == KILN_IQ2_XS) __asm__("kmovd %1, %0" : "=k"(m) : "m"(*sgn));
    return _mm256_mask_sub_epi8(y, m, _mm256_setzero_si256(), y);
#else
    return _mm256_sign_epi8(y, _mm256_or_si256(sign_masks(u32_at(sgn)), _mm256_set1_epi8(1)));
#endif
}

/* a grid type's isums against A activation blocks, each as 8 int32 whose sum it is: the unsigned
   grid bytes (fetched once for all A) times the signed y (|y| <= 127, so negating never wraps) in
   int16 pairs (at most 2 x 62 x 127), which vpmaddwd scales by the sub-block's two scales of 16.
   Sums of the same integers as sb_isum's, so the same bits, in fewer instructions a weight. */
INLINE void grid_isums(const int type, const void *block, const grid_block *g, const block_q8_K *const *y, int A,
                       __m256i *isum, int stride) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    /* two sub-blocks a vector: their grid rows side by side, 64 activations and 64 sign bits */
    __m512i acc[BUFFER_A], all[4];
    for (int c = 0; c < BUFFER_A; c++) acc[c] = _mm512_setzero_si512();
    if (GRID_ROWS_ALL(type)) grid_rows_all(type, block, all);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i s = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(g->sc + 8 * h)));
#pragma GCC unroll 2
        for (int k = 4 * h; k < 4 * h + 4; k += 2) {
            const __m512i rows = GRID_ROWS_ALL(type) ? all[k / 2] : grid_rows2(type, block, k);
            const __m512i sc = scale_pairs2(s, k);
            /* the mask by kmovq from memory for the rows4 types, as signed_y's, and for IQ2_S (not
               measured against registers since its rows became one gather); IQ3_XXS was 8% slower
               by the load */
            __mmask64 m = (__mmask64)g->sgn[k] | (__mmask64)g->sgn[k + 1] << 32;
            if (type == KILN_IQ2_XXS || type == KILN_IQ2_XS || type == KILN_IQ2_S)
                __asm__("kmovq %1, %0" : "=k"(m) : "m"(*(const uint64_t *)(g->sgn + k)));
#pragma GCC unroll 4
            for (int c = 0; c < BUFFER_A; c++) {
                if (c >= A) break;
                const __m512i yv = _mm512_loadu_si512(y[c]->qs + 32 * k);
                const __m512i p = _mm512_maddubs_epi16(rows, _mm512_mask_sub_epi8(yv, m, _mm512_setzero_si512(), yv));
                acc[c] = _mm512_add_epi32(acc[c], _mm512_madd_epi16(p, sc));
            }
        }
    }
    for (int c = 0; c < A; c++)
        isum[c * stride] = _mm256_add_epi32(_mm512_castsi512_si256(acc[c]), _mm512_extracti64x4_epi64(acc[c], 1));
#else
    __m256i acc[BUFFER_A]; /* in registers: through memory, each add waited on the last one's store */
    for (int c = 0; c < BUFFER_A; c++) acc[c] = _mm256_setzero_si256();
#pragma GCC unroll 2 /* each pick a constant, not built for each k */
    for (int h = 0; h < 2; h++) {
        const __m256i s = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(g->sc + 8 * h)));
#pragma GCC unroll 4
        for (int k = 4 * h; k < 4 * h + 4; k++) {
            const __m256i rows = grid_rows(type, block, k), sc = scale_pairs(s, k);
#pragma GCC unroll 4
            for (int c = 0; c < BUFFER_A; c++) {
                if (c >= A) break;
                const __m256i p = _mm256_maddubs_epi16(rows, signed_y(type, load32(y[c]->qs + 32 * k), g->sgn + k));
                acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(p, sc));
            }
        }
    }
    for (int c = 0; c < A; c++) isum[c * stride] = acc[c];
#endif
}

/* Blocks ahead that decode prefetches in each of its 8 rows. The 8 streams, each advancing a block
   at a time, are more than the hardware prefetcher follows: without it a core read a 230 MB
   Q3_K matrix at 4.5 GB/s, with it at 6.4 (2 ahead 6.0, 4 ahead 6.2, 8 ahead 4.6; into L2 only,
   6 or 12 ahead, 5.8 and 4.8). */
#define PF 3

/* rows [0, n_w) against activation rows [0, n_a), BUFFER_A at a time: 8 rows a pass (past the last,
   the last row again), each row's block unpacked inline and dotted at once, from registers */
INLINE void rows_decode(const int type, int nb, const uint8_t *w, size_t w_row, int n_w, const uint8_t *act,
                        size_t a_row, int n_a, float *y, size_t y_row) {
    const size_t bb = kiln_row_bytes(type, QK_K);
    const int has_min = type == KILN_Q2_K;
    for (int r0 = 0; r0 < n_w; r0 += 8) {
        const int nw = n_w - r0 < 8 ? n_w - r0 : 8;
        const uint8_t *wr = w + (size_t)r0 * w_row;
        for (int c0 = 0; c0 < n_a; c0 += BUFFER_A) {
            const int A = n_a - c0 < BUFFER_A ? n_a - c0 : BUFFER_A;
            __m256 acc[BUFFER_A], mins[BUFFER_A];
            for (int c = 0; c < A; c++) acc[c] = mins[c] = _mm256_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const block_q8_K *yb[BUFFER_A];
                sb_act a[BUFFER_A];
                for (int c = 0; c < A; c++) {
                    yb[c] = (const block_q8_K *)(act + (size_t)(c0 + c) * a_row) + b;
                    sb_act_of(yb[c], &a[c]);
                }
                __m256i p[BUFFER_A][8];
                float d[8], dmin[8];
                int32_t msum[BUFFER_A][8];
                for (int r = 0; r < 8; r++) {
                    const uint8_t *wb = wr + (size_t)(r < nw ? r : nw - 1) * w_row + (size_t)b * bb;
                    for (size_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)wb + PF * bb + o, _MM_HINT_T0);
                    if (is_grid(type)) {
                        grid_block g;
                        grid_prep(type, wb, &g);
                        d[r] = g.d;
                        grid_isums(type, wb, &g, yb, A, &p[0][r], 8);
                        continue;
                    }
                    kiln_sb u;
                    sb_unpack(type, wb, &u);
                    d[r] = u.d;
                    if (has_min) dmin[r] = u.dmin;
                    for (int c = 0; c < A; c++) {
                        p[c][r] = sb_isum(&u, &a[c]);
                        if (has_min) msum[c][r] = sb_msum(&u, yb[c]);
                    }
                }
                for (int c = 0; c < A; c++) {
                    const __m256 yd = _mm256_set1_ps(yb[c]->d);
                    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(p[c])), _mm256_mul_ps(_mm256_loadu_ps(d), yd), acc[c]);
                    if (has_min)
                        mins[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)msum[c])),
                                                  _mm256_mul_ps(_mm256_loadu_ps(dmin), yd), mins[c]);
                }
            }
            for (int c = 0; c < A; c++) {
                float v[8];
                _mm256_storeu_ps(v, _mm256_sub_ps(acc[c], mins[c]));
                memcpy(y + (size_t)(c0 + c) * y_row + r0, v, (size_t)nw * sizeof(float));
            }
        }
    }
}

/* -- prefill: the tile from the GGUF rows ---------------------------------------------------- */

/* one block of rows [0, nw) (w, w_row apart; past nw the last row again) into t */
INLINE void build_tile(const int type, kiln_unpack_fn unpack, const uint8_t *w, size_t w_row, int nw, uint8_t flip_byte,
                       sb_tile *t) {
    const int has_min = type == KILN_Q2_K;
    kiln_sb u[T];
    const kiln_sb *p[T];
    for (int r = 0; r < T; r++) {
        if (r < nw) unpack(w + (size_t)r * w_row, &u[r]);
        if (r < nw && premultiplied(type))
            for (int k = 0; k < QK_K / 32; k++) { /* sub-blocks 2k and 2k + 1 */
                const int16_t sign = type == KILN_Q3_K ? -1 : 1;
                int8_t *q = u[r].q + 32 * k;
                const __m256i a = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)q)),
                                                     _mm256_set1_epi16((int16_t)(sign * u[r].sc[2 * k])));
                const __m256i b = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16))),
                                                     _mm256_set1_epi16((int16_t)(sign * u[r].sc[2 * k + 1])));
                _mm256_storeu_si256((__m256i *)q, _mm256_permute4x64_epi64(_mm256_packs_epi16(a, b), 0xD8));
            }
        p[r] = &u[r < nw ? r : nw - 1];
    }
    const __m256i flip = _mm256_set1_epi8((char)flip_byte);
    for (int h = 0; h < T / 8; h++) {
        const kiln_sb *const *ph = p + 8 * h;
        __m256i v[8];
        for (int k = 0; k < QK_K / 32; k++) {
            for (int i = 0; i < 8; i++) v[i] = _mm256_loadu_si256((const __m256i *)(ph[i]->q + 32 * k));
            transpose8(v);
            for (int i = 0; i < 8; i++) _mm256_storeu_si256((__m256i *)(t->q[8 * k + i] + 32 * h), _mm256_xor_si256(v[i], flip));
        }
        for (int j0 = 0; j0 < QK_K / 16; j0 += 8) {
            for (int i = 0; i < 8; i++) v[i] = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(ph[i]->sc + j0)));
            transpose8(v);
            for (int j = 0; j < 8; j++) {
#ifndef TILE_VNNI
                v[j] = _mm256_or_si256(_mm256_and_si256(v[j], _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v[j], 16));
#endif
                _mm256_storeu_si256((__m256i *)(t->sc[j0 + j] + 8 * h), v[j]);
            }
        }
        if (has_min) {
            for (int i = 0; i < 8; i++) v[i] = _mm256_loadu_si256((const __m256i *)ph[i]->m);
            transpose8(v);
            for (int j = 0; j < 8; j++) _mm256_storeu_si256((__m256i *)(t->mp[j] + 8 * h), v[j]);
        }
    }
    for (int r = 0; r < T; r++) t->d[r] = p[r]->d, t->dmin[r] = has_min ? p[r]->dmin : 0.0f;
}

/* inlined into each type's entry point, so that every per-type choice above is a constant */
INLINE void rows_sb(const int type, int n, const uint8_t *w, size_t w_row, int n_w, const uint8_t *act, size_t a_row,
                    int n_a, float *y, size_t y_row) {
    const int nb = n / QK_K;
    sb_prefill p;
    if (n_a < BUFFER_A || !sb_prefill_begin(type, nb, act, a_row, n_a, &p)) { /* decode, or no memory for a tile */
        rows_decode(type, nb, w, w_row, n_w, act, a_row, n_a, y, y_row);
        return;
    }
    const kiln_unpack_fn unpack = kiln_unpack_fast(type);
    const size_t bb = kiln_row_bytes(type, QK_K);
    const uint8_t flip = sb_tile_flip(type, &p);
    for (int r0 = 0; r0 < n_w; r0 += T) {
        const int nw = n_w - r0 < T ? n_w - r0 : T;
        for (int b = 0; b < nb; b++)
            build_tile(type, unpack, w + (size_t)r0 * w_row + (size_t)b * bb, w_row, nw, flip, p.tile + b);
        sb_tile_rows(type, &p, nb, act, a_row, n_a, y + r0, y_row, nw);
    }
    sb_prefill_end(&p);
}

#define ROWS_SB(name, type)                                                                                      \
    void kiln_rows_##name##_avx2(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row,    \
                                 int n_a, float *y, size_t y_row) {                                             \
        rows_sb(type, n, w, w_row, n_w, act, a_row, n_a, y, y_row);                                              \
    }
KILN_SB_TYPES(ROWS_SB)
#endif
