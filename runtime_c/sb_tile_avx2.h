/* sb_tile_avx2.h: the interleaved tile of the super-block types' prefill (rows_sb_avx2.c builds it
 * from the GGUF rows, rows_sb_kx8_avx2.c from a packed matrix's kx8 blocks) and the gemms that read
 * it: sb_gemm by vpdpbusd (or vpmaddubsw), up to A_MAX activation rows from registers, and
 * sb_gemm_amx, 16 activation rows a tile multiply, the tile being an AMX weight tile as it stands.
 * Both compute each block's integer sums exactly and then the reference's float steps, lane by
 * lane, so their bits are the scalar reference's.
 */
#ifndef KILN_SB_TILE_AVX2_H
#define KILN_SB_TILE_AVX2_H

#include <string.h>

#include "quant_impl.h"
#include "tile_avx2.h"
#include "x8.h"

#ifdef KILN_HAVE_AVX2
#define BUFFER_A 3 /* activation rows from which a tile is interleaved once for all of them */

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
    for (int c = 0; c < A; c++) store_outputs(y + (size_t)c * y_row, V(sub_ps)(acc[c], mins[c]), nw);
}

/* -- prefill with AMX: the tile's bytes are an AMX weight tile as they are ------------------------ */
#ifdef KILN_HAVE_AMX
#define SB_AMX_M 16 /* activation rows a tile multiply */
#define SB_AMX_LOAD(t, p, stride) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(p)), "r"((long)(stride)) : "memory")
#define SB_AMX_STORE(t, p) __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"((void *)(p)), "r"(64L) : "memory")

/* AMX takes every activation row of a matmul of 16 rows or more (not Q2_K, for its minimums) */
INLINE int sb_amx_takes(const int type, int n_a) { return type != KILN_Q2_K && n_a >= SB_AMX_M && kiln_amx(-1); }

/* Tiles 0-3 the sums [activation row][16 weight rows] of successive spans, 4-5 the activations
 * [row][the span's bytes], 6-7 the weights [4-byte group][16 rows x 4 bytes]: the tile's q[k], k
 * over the span. */
static void sb_amx_config(int span) { kiln_amx_config(16 * span, 4 * span); }

/* The activation rows as the tile multiplies take them, copied once a matmul (not once a tile of
 * weight rows): groups of 16 rows (the last padded with zero rows), and in each group, span after
 * span, the 16 rows' bytes of the span as one contiguous tile; beside them each block's d of the
 * 16 rows. The weight tiles are signed q then (no + 128), multiplied signed by signed, so a span's
 * sums are exact as they come and need no seed. */
static inline size_t sb_amx_act_bytes(int n_a, int nb) {
    return (size_t)(n_a + SB_AMX_M - 1) / SB_AMX_M * SB_AMX_M * (size_t)nb * (QK_K + sizeof(float));
}
INLINE void sb_amx_pack(const int span, const uint8_t *act, size_t a_row, int n_a, int nb, uint8_t *buf,
                        const float **ad) {
    const int groups = (n_a + SB_AMX_M - 1) / SB_AMX_M, n_spans = QK_K / 16 / span, w = 16 * span;
    float *d = (float *)(buf + (size_t)groups * nb * SB_AMX_M * QK_K);
    *ad = d;
    for (int g = 0; g < groups; g++)
        for (int r = 0; r < SB_AMX_M; r++) {
            const int row = SB_AMX_M * g + r;
            for (int b = 0; b < nb; b++) {
                const block_q8_K *yb = (const block_q8_K *)(act + (size_t)row * a_row) + b;
                uint8_t *q = buf + ((size_t)g * nb + b) * SB_AMX_M * QK_K + (size_t)r * w;
                for (int i = 0; i < n_spans; i++, q += SB_AMX_M * w) {
                    if (row < n_a) memcpy(q, yb->qs + w * i, (size_t)w);
                    else memset(q, 0, (size_t)w);
                }
                d[((size_t)g * nb + b) * SB_AMX_M + r] = row < n_a ? yb->d : 0.0f;
            }
        }
}

/* Step k of four of a pipeline three spans deep over the (block, span) pairs: span e + 3 is
 * multiplied into tile k, the tile of the span before it is stored, and the sums of span e, stored
 * two steps ago, go into the rows' isum, scaled as sb_gemm's; after a block's last span, its float
 * step. A tile's store waits for its multiply; coming a step later, it leaves the next multiply free
 * to start, and the sums are read once the store has long been done. */
#define SB_AMX_STEP(k, kp, ta, tw)                                                                                \
    do {                                                                                                        \
        const int m = s + (k), e = m - 3;                                                                       \
        if (m < steps) {                                                                                        \
            SB_AMX_LOAD(ta, aq + (size_t)m * SB_AMX_M * 16 * span, 16 * span);                                  \
            SB_AMX_LOAD(tw, tile[m / n_spans].q[4 * (m % n_spans) * span], 64);                                 \
            _tile_zero(k);                                                                                      \
            _tile_dpbssd(k, ta, tw);                                                                            \
        }                                                                                                       \
        if (m >= 1 && m <= steps) SB_AMX_STORE(kp, sums[kp]);                                                  \
        if (e >= 0 && e < steps) sb_amx_take(type, tile, ad, e / n_spans, e % n_spans, sums[((k) + 1) & 3], isum, accm); \
    } while (0)

/* span i of block b's sums into isum; the block's float step after its last */
INLINE void sb_amx_take(const int type, const sb_tile *tile, const float *ad, int b, int i, const int32_t (*sums)[16],
                        vi isum[SB_AMX_M], float (*accm)[T]) {
    const int span = scale_span(type), j = i * span;
    const sb_tile *t = tile + b;
    const vi sc = vload(t->sc[j]);
    for (int c = 0; c < SB_AMX_M; c++) {
        const vi v = vload(sums[c]);
        if (type == KILN_Q3_K) isum[c] = V(sub_epi32)(i ? isum[c] : vzero(), v); /* -q sc */
        else if (unscaled(type)) isum[c] = i ? V(add_epi32)(isum[c], v) : v;
        else isum[c] = i ? V(add_epi32)(isum[c], V(mullo_epi32)(v, sc)) : V(mullo_epi32)(v, sc);
    }
    if (j + span < QK_K / 16) return;
    const vf d = V(loadu_ps)(t->d);
    for (int c = 0; c < SB_AMX_M; c++)
        V(store_ps)(accm[c], V(fmadd_ps)(V(cvtepi32_ps)(isum[c]), V(mul_ps)(d, V(set1_ps)(ad[SB_AMX_M * b + c])),
                                         V(load_ps)(accm[c])));
}

/* sb_gemm for a group of SB_AMX_M packed activation rows (aq, ad), the integer sums of each span
 * of sub-blocks from one tile multiply of the signed activations by the tile's signed bytes (q, or
 * Q3_K's -q sc); every step after the sums is sb_gemm's, so the bits are its bits. The group's
 * first n_rows rows are stored. */
INLINE void sb_gemm_amx(const int type, const sb_tile *tile, int nb, const uint8_t *aq, const float *ad, float *y,
                        size_t y_row, int n_rows, int nw) {
    const int span = scale_span(type), n_spans = QK_K / 16 / span, steps = nb * n_spans;
    _Alignas(64) int32_t sums[4][SB_AMX_M][16];
    _Alignas(64) float accm[SB_AMX_M][T];
    vi isum[SB_AMX_M];
    for (int c = 0; c < SB_AMX_M; c++) V(store_ps)(accm[c], V(setzero_ps)()), isum[c] = vzero();
    for (int s = 0; s < steps + 3; s += 4) {
        SB_AMX_STEP(0, 3, 4, 6);
        SB_AMX_STEP(1, 0, 5, 7);
        SB_AMX_STEP(2, 1, 4, 6);
        SB_AMX_STEP(3, 2, 5, 7);
    }
    for (int c = 0; c < n_rows; c++)
        store_outputs(y + (size_t)c * y_row, V(sub_ps)(V(load_ps)(accm[c]), V(setzero_ps)()), nw);
}
#else
#define sb_amx_takes(type, n_a) 0
#define sb_amx_act_bytes(n_a, nb) 0
#endif

/* A matmul's prefill: its buffer of tiles and, where AMX takes the rows, of packed activations. */
typedef struct {
    sb_tile *tile;
    const uint8_t *aq; /* packed activations (AMX): [group][block][span][16 rows][bytes], or NULL */
    const float *ad;   /* and their blocks' d: [group][block][16 rows] */
    int amx;
} sb_prefill;

/* 0 where there is no memory for the buffers (the caller then decodes row by row) */
INLINE int sb_prefill_begin(const int type, int nb, const uint8_t *act, size_t a_row, int n_a, sb_prefill *p) {
    p->amx = sb_amx_takes(type, n_a);
    const size_t tiles = sizeof(sb_tile) * (size_t)nb;
    uint8_t *buf = tile_buffer(tiles + (p->amx ? sb_amx_act_bytes(n_a, nb) : 0));
    if (!buf) return 0;
    p->tile = (sb_tile *)buf, p->aq = NULL, p->ad = NULL;
#ifdef KILN_HAVE_AMX
    if (p->amx) {
        sb_amx_pack(scale_span(type), act, a_row, n_a, nb, buf + tiles, &p->ad);
        p->aq = buf + tiles;
        sb_amx_config(scale_span(type));
    }
#endif
    return 1;
}
INLINE void sb_prefill_end(const sb_prefill *p) {
#ifdef KILN_HAVE_AMX
    if (p->amx) _tile_release();
#endif
    (void)p;
}

/* the byte a tile's q are stored xor: 0x80 (q + 128) for vpdpbusd's unsigned operand, 0 for AMX's
   signed one, for Q2_K (its q sc already unsigned) and without VNNI */
INLINE uint8_t sb_tile_flip(const int type, const sb_prefill *p) {
#ifdef TILE_VNNI
    return type == KILN_Q2_K || p->amx ? 0 : 0x80;
#else
    return (void)type, (void)p, 0;
#endif
}

/* activation rows [0, n_a) against a built tile: by AMX where it takes them, else in TILE_PASSES */
INLINE void sb_tile_rows(const int type, const sb_prefill *p, int nb, const uint8_t *act, size_t a_row, int n_a,
                         float *y, size_t y_row, int nw) {
#ifdef KILN_HAVE_AMX
    if (p->amx) {
        for (int g = 0; g * SB_AMX_M < n_a; g++) {
            const int rows = n_a - SB_AMX_M * g < SB_AMX_M ? n_a - SB_AMX_M * g : SB_AMX_M;
            sb_gemm_amx(type, p->tile, nb, p->aq + (size_t)g * nb * SB_AMX_M * QK_K, p->ad + (size_t)g * nb * SB_AMX_M,
                        y + (size_t)g * SB_AMX_M * y_row, y_row, rows, nw);
        }
        return;
    }
#endif
    int c = 0;
#define PASS(A) sb_gemm(type, A, p->tile, nb, act + (size_t)c * a_row, a_row, y + (size_t)c * y_row, y_row, nw), c += A
    TILE_PASSES(n_a, c, PASS);
#undef PASS
}
#endif
#endif
