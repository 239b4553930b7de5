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
 */
#include <string.h>

#include "quant_impl.h"
#include "sb_unpack_avx2.h"
#include "tile_avx2.h"
#include "x8.h"

#ifdef KILN_HAVE_AVX2
#define BUFFER_A 3 /* activation rows from which a tile is interleaved once for all of them */

/* -- decode: 8 rows, each dotted alone and the 8 sums reduced across lanes ------------------- */

/* lane r = the sum of v[r]'s 8 lanes */
INLINE __m256i reduce8(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

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

/* -- prefill: interleaved tiles, T rows a vector ---------------------------------------------- */


/* One super-block of a tile's T rows, interleaved: row r's weights 4k..4k+3 at q[k][4r..4r+4)
 * (with VNNI as unsigned bytes: q ^ 0x80 = q + 128, but Q2_K's), its scale of sub-block j at
 * sc[j][r] (without VNNI in both int16 halves, for vpmaddwd), and its m[2p], m[2p + 1] as an
 * int16 pair at mp[p][r], against an activation block's (bsums[2p], bsums[2p + 1]) (Q2_K). */
typedef struct {
    uint8_t q[QK_K / 4][4 * T];
    int32_t sc[QK_K / 16][T];
    int32_t mp[QK_K / 32][T];
    float d[T], dmin[T];
} sb_tile;
_Static_assert(sizeof(sb_tile) % 64 == 0, "tiles stay 64-byte aligned in their buffer");

/* With VNNI, Q2_K's and Q3_K's weights are stored times their scales, which fits a byte: q sc in
   0..45 (Q2_K), and -q sc in -128..124 (Q3_K, negated since q sc reaches +128), so their blocks
   take no vpmulld; the tile's sc are then 1, and Q3_K's sum is negated back. */
static inline int premultiplied(int type) {
#ifdef TILE_VNNI
    return type == KILN_Q2_K || type == KILN_Q3_K;
#endif
    return (void)type, 0;
}
static inline int unscaled(int type) { return premultiplied(type) || type == KILN_TQ1_0 || type == KILN_TQ2_0; }

/* sub-blocks whose byte products one partial sum takes before its scale (which is the same in every
   row: ref_sblock.c's sc[2p] = sc[2p + 1] for the types that scale 32 weights), or before it is
   added up where there are no scales */
static inline int scale_span(int type) {
    const int by_32 = type == KILN_IQ4_XS || type == KILN_IQ2_XXS || type == KILN_IQ3_XXS || type == KILN_IQ3_S ||
                      type == KILN_IQ1_S;
    return unscaled(type) ? 4 : by_32 ? 2 : 1;
}

/* one block of rows [0, nw) (w, w_row apart; past nw the last row again) into t */
INLINE void build_tile(const int type, kiln_unpack_fn unpack, const uint8_t *w, size_t w_row, int nw, sb_tile *t) {
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
#ifdef TILE_VNNI
    const __m256i flip = _mm256_set1_epi8(has_min ? 0 : (char)0x80);
#else
    const __m256i flip = _mm256_setzero_si256();
#endif
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

#ifdef TILE_VNNI
/* The partial sums' starting values: -128 times the activations' sum over each span of sub-blocks,
 * which takes off the 128 y that the weights' q + 128 adds. Stored, for broadcasts. seed_at(j) is
 * where the span that begins at sub-block j finds its own. */
INLINE void store_seeds(const int span, const int16_t *bsums, int32_t out[QK_K / 16]) {
    const __m256i b = _mm256_loadu_si256((const __m256i *)bsums);
    if (span == 1) { /* even sub-blocks, then odd */
        _mm256_storeu_si256((__m256i *)out, _mm256_madd_epi16(b, _mm256_set1_epi32(0xFF80)));
        _mm256_storeu_si256((__m256i *)(out + 8), _mm256_madd_epi16(b, _mm256_set1_epi32((int)0xFF800000u)));
        return;
    }
    __m256i p = _mm256_madd_epi16(b, _mm256_set1_epi16(-128)); /* pairs */
    if (span == 4) p = _mm256_permute4x64_epi64(_mm256_hadd_epi32(p, p), 0x08);
    _mm256_storeu_si256((__m256i *)out, p);
}
static inline int seed_at(int span, int j) { return span == 1 ? (j & 1) * 8 + j / 2 : j / span; }
#endif

/* activation rows [0, A) (a_row apart) against a tile's T rows over its nb blocks, into y */
INLINE void sb_gemm(const int type, const int A, const sb_tile *tile, int nb, const uint8_t *act, size_t a_row,
                    float *y, size_t y_row, int nw) {
    const int has_min = type == KILN_Q2_K, span = scale_span(type);
    vf acc[A_MAX], mins[A_MAX]; /* A_MAX, not A: a constant bound keeps them in registers */
    for (int c = 0; c < A; c++) acc[c] = mins[c] = V(setzero_ps)();
    for (int b = 0; b < nb; b++) {
        const sb_tile *t = tile + b;
        const block_q8_K *yb[A_MAX];
        vi isum[A_MAX];
        for (int c = 0; c < A; c++) yb[c] = (const block_q8_K *)(act + (size_t)c * a_row) + b, isum[c] = vzero();
#ifdef TILE_VNNI
        _Alignas(32) int32_t seed[A_MAX][QK_K / 16];
        if (!has_min)
            for (int c = 0; c < A; c++) store_seeds(span, yb[c]->bsums, seed[c]);
        for (int j = 0; j < QK_K / 16; j += span) {
            vi s[A_MAX];
            for (int c = 0; c < A; c++) s[c] = has_min ? vzero() : V(set1_epi32)(seed[c][seed_at(span, j)]);
#pragma GCC unroll 16
            for (int k = 4 * j; k < 4 * (j + span); k++) {
                const vi wk = vload(t->q[k]);
                for (int c = 0; c < A; c++) s[c] = vdpbusd(s[c], wk, V(set1_epi32)(ld32(yb[c]->qs + 4 * k)));
            }
            if (type == KILN_Q3_K && premultiplied(type)) /* -q sc */
                for (int c = 0; c < A; c++) isum[c] = V(sub_epi32)(isum[c], s[c]);
            else if (unscaled(type))
                for (int c = 0; c < A; c++) isum[c] = V(add_epi32)(isum[c], s[c]);
            else {
                const vi sc = vload(t->sc[j]);
                for (int c = 0; c < A; c++) isum[c] = V(add_epi32)(isum[c], V(mullo_epi32)(s[c], sc));
            }
        }
#else
        (void)span;
        for (int j = 0; j < QK_K / 16; j++) {
            const vi sc = vload(t->sc[j]);
            for (int k = 4 * j; k < 4 * j + 4; k++) {
                const vi wk = vload(t->q[k]), mag = _mm256_sign_epi8(wk, wk);
                for (int c = 0; c < A; c++) {
                    const vi yk = V(set1_epi32)(ld32(yb[c]->qs + 4 * k));
                    const vi pairs = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(yk, wk));
                    isum[c] = V(add_epi32)(isum[c], _mm256_madd_epi16(pairs, sc));
                }
            }
        }
#endif
        const vf d = V(loadu_ps)(t->d);
        for (int c = 0; c < A; c++)
            acc[c] = V(fmadd_ps)(V(cvtepi32_ps)(isum[c]), V(mul_ps)(d, V(set1_ps)(yb[c]->d)), acc[c]);
        if (has_min) {
            const vf dmin = V(loadu_ps)(t->dmin);
            for (int c = 0; c < A; c++) {
                vi msum = vzero();
                for (int p = 0; p < QK_K / 32; p++) {
                    const vi bs = V(set1_epi32)(ld32(yb[c]->bsums + 2 * p));
#ifdef TILE_VNNI
                    msum = vdpwssd(msum, vload(t->mp[p]), bs);
#else
                    msum = V(add_epi32)(msum, _mm256_madd_epi16(vload(t->mp[p]), bs));
#endif
                }
                mins[c] = V(fmadd_ps)(V(cvtepi32_ps)(msum), V(mul_ps)(dmin, V(set1_ps)(yb[c]->d)), mins[c]);
            }
        }
    }
    for (int c = 0; c < A; c++) {
        float v[T];
        V(storeu_ps)(v, V(sub_ps)(acc[c], mins[c]));
        memcpy(y + (size_t)c * y_row, v, (size_t)nw * sizeof(float));
    }
}

/* -- prefill with AMX: the tile's bytes are an AMX weight tile as they are ------------------------ */
#ifdef KILN_HAVE_AMX
#define SB_AMX_M 16 /* activation rows a tile multiply */
#define SB_AMX_LOAD(t, p, stride) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(p)), "r"((long)(stride)) : "memory")
#define SB_AMX_STORE(t, p) __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"((void *)(p)), "r"(64L) : "memory")

/* Tiles 0-3 the sums [activation row][16 weight rows] of successive spans, 4-5 the activations
 * [row][the span's bytes], 6-7 the weights [4-byte group][16 rows x 4 bytes]: the tile's q[k], k
 * over the span. */
static void sb_amx_config(int span) { kiln_amx_config(16 * span, 4 * span); }

/* Step k of four of a pipeline three spans deep over the (block, span) pairs: span e + 3 is
 * multiplied into tile k, the tile of the span before it is stored, and the sums of span e, stored
 * two steps ago, go into the rows' isum, seeded and scaled as sb_gemm's; after a block's last span,
 * its float step. A tile's store waits for its multiply; coming a step later, it leaves the next
 * multiply free to start, and the sums are read once the store has long been done. */
#define SB_AMX_STEP(k, kp, ta, tw)                                                                                \
    do {                                                                                                        \
        const int m = s + (k), e = m - 3;                                                                       \
        if (m < steps) {                                                                                        \
            const int j = (m % n_spans) * span;                                                                 \
            SB_AMX_LOAD(ta, ((const block_q8_K *)act + m / n_spans)->qs + 16 * j, a_row);                     \
            SB_AMX_LOAD(tw, tile[m / n_spans].q[4 * j], 64);                                                    \
            _tile_zero(k);                                                                                      \
            _tile_dpbsud(k, ta, tw);                                                                            \
        }                                                                                                       \
        if (m >= 1 && m <= steps) SB_AMX_STORE(kp, sums[kp]);                                                  \
        if (e >= 0 && e < steps) sb_amx_take(type, tile, act, a_row, e / n_spans, e % n_spans, sums[((k) + 1) & 3], \
                                             isum, seed, accm);                                                  \
    } while (0)

/* span i of block b's sums into isum; the block's seeds first, its float step last */
INLINE void sb_amx_take(const int type, const sb_tile *tile, const uint8_t *act, size_t a_row, int b, int i,
                        const int32_t (*sums)[16], vi isum[SB_AMX_M], int32_t (*seed)[QK_K / 16],
                        float (*accm)[T]) {
    const int span = scale_span(type), j = i * span;
    const sb_tile *t = tile + b;
    if (i == 0)
        for (int c = 0; c < SB_AMX_M; c++) {
            store_seeds(span, ((const block_q8_K *)(act + (size_t)c * a_row) + b)->bsums, seed[c]);
            isum[c] = vzero();
        }
    const vi sc = vload(t->sc[j]);
    for (int c = 0; c < SB_AMX_M; c++) {
        const vi v = V(add_epi32)(vload(sums[c]), V(set1_epi32)(seed[c][seed_at(span, j)]));
        if (type == KILN_Q3_K) isum[c] = V(sub_epi32)(isum[c], v); /* -q sc */
        else if (unscaled(type)) isum[c] = V(add_epi32)(isum[c], v);
        else isum[c] = V(add_epi32)(isum[c], V(mullo_epi32)(v, sc));
    }
    if (j + span < QK_K / 16) return;
    const vf d = V(loadu_ps)(t->d);
    for (int c = 0; c < SB_AMX_M; c++) {
        const float yd = ((const block_q8_K *)(act + (size_t)c * a_row) + b)->d;
        V(store_ps)(accm[c], V(fmadd_ps)(V(cvtepi32_ps)(isum[c]), V(mul_ps)(d, V(set1_ps)(yd)), V(load_ps)(accm[c])));
    }
}

/* sb_gemm for SB_AMX_M activation rows, the integer sums of each span of sub-blocks from one tile
 * multiply of the signed activations by the tile's unsigned bytes (q + 128, or Q3_K's -q sc + 128);
 * every step after the sums is sb_gemm's, so the bits are its bits. Q2_K (its minimums) stays
 * with sb_gemm. */
INLINE void sb_gemm_amx(const int type, const sb_tile *tile, int nb, const uint8_t *act, size_t a_row, float *y,
                        size_t y_row, int nw) {
    const int span = scale_span(type), n_spans = QK_K / 16 / span, steps = nb * n_spans;
    _Alignas(64) int32_t sums[4][SB_AMX_M][16], seed[SB_AMX_M][QK_K / 16];
    _Alignas(64) float accm[SB_AMX_M][T];
    vi isum[SB_AMX_M];
    for (int c = 0; c < SB_AMX_M; c++) V(store_ps)(accm[c], V(setzero_ps)()), isum[c] = vzero();
    for (int s = 0; s < steps + 3; s += 4) {
        SB_AMX_STEP(0, 3, 4, 6);
        SB_AMX_STEP(1, 0, 5, 7);
        SB_AMX_STEP(2, 1, 4, 6);
        SB_AMX_STEP(3, 2, 5, 7);
    }
    for (int c = 0; c < SB_AMX_M; c++) {
        float v[T];
        V(storeu_ps)(v, V(sub_ps)(V(load_ps)(accm[c]), V(setzero_ps)()));
        memcpy(y + (size_t)c * y_row, v, (size_t)nw * sizeof(float));
    }
}

/* activation rows [0, n_a - n_a % 16) by AMX where it is built, allowed and taken (not Q2_K);
   returns the first row it left */
INLINE int sb_amx_rows(const int type, const sb_tile *tile, int nb, const uint8_t *act, size_t a_row, int n_a,
                       float *y, size_t y_row, int nw) {
    if (type == KILN_Q2_K || n_a < SB_AMX_M || !kiln_amx(-1)) return 0;
    sb_amx_config(scale_span(type));
    int c = 0;
    for (; c + SB_AMX_M <= n_a; c += SB_AMX_M)
        sb_gemm_amx(type, tile, nb, act + (size_t)c * a_row, a_row, y + (size_t)c * y_row, y_row, nw);
    _tile_release();
    return c;
}
#else
#define sb_amx_rows(type, tile, nb, act, a_row, n_a, y, y_row, nw) 0
#endif

/* inlined into each type's entry point, so that every per-type choice above is a constant */
INLINE void rows_sb(const int type, int n, const uint8_t *w, size_t w_row, int n_w, const uint8_t *act, size_t a_row,
                    int n_a, float *y, size_t y_row) {
    const int nb = n / QK_K;
    sb_tile *tile = n_a >= BUFFER_A ? tile_buffer(sizeof(sb_tile) * (size_t)nb) : NULL;
    if (!tile) { /* decode, or no memory for a tile */
        rows_decode(type, nb, w, w_row, n_w, act, a_row, n_a, y, y_row);
        return;
    }
    const kiln_unpack_fn unpack = kiln_unpack_fast(type);
    const size_t bb = kiln_row_bytes(type, QK_K);
    for (int r0 = 0; r0 < n_w; r0 += T) {
        const int nw = n_w - r0 < T ? n_w - r0 : T;
        for (int b = 0; b < nb; b++)
            build_tile(type, unpack, w + (size_t)r0 * w_row + (size_t)b * bb, w_row, nw, tile + b);
        int c = sb_amx_rows(type, tile, nb, act, a_row, n_a, y + r0, y_row, nw);
#define PASS(A) sb_gemm(type, A, tile, nb, act + (size_t)c * a_row, a_row, y + (size_t)c * y_row + r0, y_row, nw), c += A
        TILE_PASSES(n_a, c, PASS);
#undef PASS
    }
}

/* -- the same tiles from a packed matrix (Q2_K, Q3_K and IQ4_XS, x8_pack.c's kx8 blocks) --------- */

/* a kx8 chunk of 32 weights of 8 rows as signed q: v[k] holds weights 4k..4k+3 of each row */
INLINE void kx8_chunk_q(const int type, const uint8_t *chunk, __m256i v[8]) {
    if (type == KILN_Q3_K || type == KILN_Q2_K) { /* 2-bit fields u[4h + s] at bits 2s of vector h; Q3_K's
                                                   third bit from its plane, less 4 */
        const int q3 = type == KILN_Q3_K;
        uint32_t plane[8];
        if (q3) memcpy(plane, chunk, sizeof plane);
        for (int h = 0; h < 2; h++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(chunk + (q3 ? 32 : 0) + 32 * h));
            for (int s = 0; s < 4; s++) {
                v[4 * h + s] = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * s), _mm256_set1_epi8(3));
                if (q3) {
                    const __m256i high = _mm256_and_si256(sign_masks(plane[4 * h + s]), _mm256_set1_epi8(4));
                    v[4 * h + s] = _mm256_sub_epi8(_mm256_or_si256(v[4 * h + s], high), _mm256_set1_epi8(4));
                }
            }
        }
        return;
    }
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kiln_kvalues_iq4nl));
    for (int h = 0; h < 4; h++) { /* nibbles: u[2h] low, u[2h + 1] high */
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(chunk + 32 * h)), m4 = _mm256_set1_epi8(15);
        v[2 * h] = _mm256_shuffle_epi8(lut, _mm256_and_si256(raw, m4));
        v[2 * h + 1] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
    }
}

/* a * b for signed bytes whose products fit a byte, by their 16-bit products' low bytes */
INLINE __m256i mul_bytes(__m256i a, __m256i b) {
    const __m256i even = _mm256_mullo_epi16(a, b);
    const __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
    return _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0xFF)), _mm256_slli_epi16(odd, 8));
}

/* A tile's super-block from the kx8 blocks of its T / 8 groups (w, group bytes apart; past the
 * last of n_groups, the last again): the bytes build_tile writes from the GGUF rows, the kx8
 * layout's 8 rows already interleaved as the tile's are, with no unpacking a row at a time. */
INLINE void build_tile_kx8(const int type, const uint8_t *w, size_t group, int n_groups, sb_tile *t) {
    const int q3 = type == KILN_Q3_K, q2 = type == KILN_Q2_K;
#ifdef TILE_VNNI /* unsigned for vpdpbusd: q + 128, -q sc + 128 (Q3_K), q sc (Q2_K, 0..45) */
    const __m256i flip = _mm256_set1_epi8(q2 ? 0 : (char)0x80);
#else
    const __m256i flip = _mm256_setzero_si256();
#endif
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5,
                                            6, 6, 6, 6, 7, 7, 7, 7);
    for (int h = 0; h < T / 8; h++) {
        const uint8_t *blk = w + (size_t)(h < n_groups ? h : n_groups - 1) * group, *sc = blk + (q2 ? 32 : 16);
        for (int r = 0; r < 8; r++) {
            kiln_half d[2];
            memcpy(d, blk + 2 * r, sizeof d[0]);
            memcpy(d + 1, blk + 16 + 2 * r, sizeof d[1]);
            t->d[8 * h + r] = kiln_fp16_to_fp32(d[0]), t->dmin[8 * h + r] = q2 ? kiln_fp16_to_fp32(d[1]) : 0.0f;
        }
        for (int p = 0; q2 && p < QK_K / 32; p++) { /* Q2_K's minimums of sub-blocks 2p and 2p + 1 as int16 pairs */
            const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * p)));
            const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * p + 8)));
            _mm256_storeu_si256((__m256i *)(t->mp[p] + 8 * h),
                                _mm256_or_si256(_mm256_srli_epi32(lo, 4), _mm256_slli_epi32(_mm256_srli_epi32(hi, 4), 16)));
        }
        for (int j = 0; j < QK_K / 16; j++) { /* the rows' scale of each 16 weights (Q2_K: its bytes' low nibbles) */
            const __m128i b = _mm_loadl_epi64((const __m128i *)(sc + 8 * (q3 || q2 ? j : j / 2)));
            const __m256i v = q2 ? _mm256_and_si256(_mm256_cvtepu8_epi32(b), _mm256_set1_epi32(15)) : _mm256_cvtepi8_epi32(b);
#ifdef TILE_VNNI
            _mm256_storeu_si256((__m256i *)(t->sc[j] + 8 * h), v);
#else
            _mm256_storeu_si256((__m256i *)(t->sc[j] + 8 * h),
                                _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16)));
#endif
        }
        const uint8_t *chunk = blk + kiln_kx8_head(type);
        for (int c = 0; c < 8; c++, chunk += kiln_kx8_chunk(type)) {
            __m256i v[8];
            kx8_chunk_q(type, chunk, v);
            for (int k = 0; k < 8; k++) {
                if (premultiplied(type)) { /* -q sc (Q3_K), q sc (Q2_K): sub-block 2c + k / 4's scale of row r in
                                             bytes 4r..4r+3 */
                    const __m256i s8 = _mm256_shuffle_epi8(
                        _mm256_broadcastsi128_si256(_mm_loadl_epi64((const __m128i *)(sc + 8 * (2 * c + k / 4)))), spread);
                    v[k] = mul_bytes(v[k], q2 ? _mm256_and_si256(s8, _mm256_set1_epi8(15))
                                              : _mm256_sub_epi8(_mm256_setzero_si256(), s8));
                }
                _mm256_storeu_si256((__m256i *)(t->q[8 * c + k] + 32 * h), _mm256_xor_si256(v[k], flip));
            }
        }
    }
}

/* groups [g0, g1) of 8 rows: a tile's T / 8 groups at a time */
INLINE void rows_sb_kx8(const int type, sb_tile *tile, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act,
                        size_t a_row, int n_a, float *y, size_t y_row) {
    const size_t kb = kiln_kx8_bytes(type), group = (size_t)nb * kb;
    for (int g = g0; g < g1; g += T / 8) {
        const int n_groups = g1 - g < T / 8 ? g1 - g : T / 8, r0 = 8 * g;
        for (int b = 0; b < nb; b++) build_tile_kx8(type, w + (size_t)g * group + (size_t)b * kb, group, n_groups, tile + b);
        int c = sb_amx_rows(type, tile, nb, act, a_row, n_a, y + r0, y_row, 8 * n_groups);
#define PASS(A) sb_gemm(type, A, tile, nb, act + (size_t)c * a_row, a_row, y + (size_t)c * y_row + r0, y_row, 8 * n_groups), c += A
        TILE_PASSES(n_a, c, PASS);
#undef PASS
    }
}

int kiln_rows_sb_kx8(int type, const uint8_t *w, int g0, int g1, int n_in, const uint8_t *act, size_t a_row, int n_a,
                     float *y, size_t y_row) {
    sb_tile *tile = n_a >= BUFFER_A ? tile_buffer(sizeof(sb_tile) * (size_t)(n_in / QK_K)) : NULL;
    if (!tile) return 0;
    switch (type) { /* each type its own copy, the type a constant in it */
    case KILN_Q3_K: rows_sb_kx8(KILN_Q3_K, tile, w, g0, g1, n_in / QK_K, act, a_row, n_a, y, y_row); return 1;
    case KILN_IQ4_XS: rows_sb_kx8(KILN_IQ4_XS, tile, w, g0, g1, n_in / QK_K, act, a_row, n_a, y, y_row); return 1;
    case KILN_Q2_K: rows_sb_kx8(KILN_Q2_K, tile, w, g0, g1, n_in / QK_K, act, a_row, n_a, y, y_row); return 1;
    default: return 0;
    }
}

#define ROWS_SB(name, type)                                                                                      \
    void kiln_rows_##name##_avx2(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row,    \
                                 int n_a, float *y, size_t y_row) {                                             \
        rows_sb(type, n, w, w_row, n_w, act, a_row, n_a, y, y_row);                                              \
    }
KILN_SB_TYPES(ROWS_SB)
#endif
