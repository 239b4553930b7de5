/* sb_unpack_avx2.h: the fast unpackers of the super-block types with AVX2, inline, so that the
 * decode dots (rows_sb_avx2.c) take a block's weights from registers, not from a copy in memory;
 * sb_unpack_avx2.c hands them out by type (sb_unpack.c says which build takes which). Each writes
 * its reference's kiln_sb (ref_sblock.c) bit for bit: the same integers, and d and dmin by the same
 * float expressions.
 *
 * 32 weights a vector. The i-quants' grid rows are fetched by scalar loads where an index is a
 * field read as it is, by gathers where a sub-block's indexes are computed in one vector (each the
 * faster there, measured), and with AVX-512 VBMI a whole block's by byte permutes of the grid
 * (KILN_HAVE_VBMI: IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_S; grid_rows_all); their signs are made in bulk: the 7-bit sign indexes of IQ2_XXS/IQ2_XS/
 * IQ3_XXS take their eighth bit (the parity, as kiln_ksigns_iq2xs holds it) by shifts and xors, all
 * 32 at once; a group's sign byte then becomes byte masks m (0xFF where minus) and q = (g ^ m) - m.
 * Scales are made in vectors too: a vector load of bytes just written one at a time would wait on
 * the stores (no store forwarding), which cost more than the unpacking itself.
 */
#ifndef KILN_SB_UNPACK_AVX2_H
#define KILN_SB_UNPACK_AVX2_H

#include <string.h>

#include "fp16.h"
#include "quant_impl.h"

#ifdef KILN_HAVE_AVX2
#include <immintrin.h>

#ifndef INLINE
#define INLINE static inline __attribute__((always_inline))
#endif

INLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
INLINE void store32(void *p, __m256i v) { _mm256_storeu_si256((__m256i *)p, v); }
INLINE uint32_t u32_at(const void *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* 4 sign bytes (one per group of 8 weights) -> 32 byte masks, 0xFF where the weight is negated */
INLINE __m256i sign_masks(uint32_t signs) {
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)signs),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

/* rows i0..i3 of a table of 8-byte rows: each broadcast straight from memory (a load, nothing
   more) and the four blended, where building the vector from scalars (vmovq, vpinsrq, vinserti128)
   spent three shuffle-port instructions of the decode's scarcest port */
INLINE __m256i rows4(const void *table, unsigned i0, unsigned i1, unsigned i2, unsigned i3) {
    const long long *t = table;
#if defined(__AVX512VL__) /* the blends ride on the loads: merge-masked broadcasts */
    __m256i v = _mm256_set1_epi64x(t[i0]);
    v = _mm256_mask_broadcastq_epi64(v, 0x2, _mm_loadl_epi64((const __m128i *)(t + i1)));
    v = _mm256_mask_broadcastq_epi64(v, 0x4, _mm_loadl_epi64((const __m128i *)(t + i2)));
    return _mm256_mask_broadcastq_epi64(v, 0x8, _mm_loadl_epi64((const __m128i *)(t + i3)));
#endif
    const __m256i a = _mm256_blend_epi32(_mm256_set1_epi64x(t[i0]), _mm256_set1_epi64x(t[i1]), 0x0C);
    const __m256i b = _mm256_blend_epi32(_mm256_set1_epi64x(t[i2]), _mm256_set1_epi64x(t[i3]), 0xC0);
    return _mm256_blend_epi32(a, b, 0xF0);
}

/* the same, from indexes in a vector */
INLINE __m256i gather4(const void *table, __m128i idx) {
    return _mm256_i32gather_epi64((const long long *)table, idx, 8);
}

INLINE __m256i apply_signs(__m256i g, __m256i m) { return _mm256_sub_epi8(_mm256_xor_si256(g, m), m); }

/* each byte's parity in its top bit (the byte's bit 7 clear): kiln_ksigns_iq2xs of every byte */
INLINE __m256i with_parity(__m256i s) {
#if defined(__AVX512BITALG__) && defined(__AVX512VL__)
    return _mm256_or_si256(s, _mm256_slli_epi16(_mm256_and_si256(_mm256_popcnt_epi8(s), _mm256_set1_epi8(1)), 7));
#endif
    __m256i t = _mm256_xor_si256(s, _mm256_srli_epi32(s, 4));
    t = _mm256_xor_si256(t, _mm256_srli_epi32(t, 2));
    t = _mm256_xor_si256(t, _mm256_srli_epi32(t, 1));
    return _mm256_or_si256(s, _mm256_slli_epi32(_mm256_and_si256(t, _mm256_set1_epi8(1)), 7));
}

/* 8 uint32 of four 7-bit fields each (bits 0..27) -> their four sign bytes, parity included */
INLINE __m256i signs_of_7bit_fields(__m256i a) {
#if defined(__AVX512VBMI__) && defined(__AVX512VL__)
    /* vpmultishiftqb: byte j of a qword from its bits 7 (j % 4) + 32 (j / 4) on */
    const __m256i at = _mm256_set1_epi64x(0x352E2720150E0700LL);
    return with_parity(_mm256_and_si256(_mm256_multishift_epi64_epi8(at, a), _mm256_set1_epi8(0x7F)));
#endif
    const __m256i s = _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0x7F)),
                        _mm256_and_si256(_mm256_slli_epi32(a, 1), _mm256_set1_epi32(0x7F00))),
        _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(a, 2), _mm256_set1_epi32(0x7F0000)),
                        _mm256_and_si256(_mm256_slli_epi32(a, 3), _mm256_set1_epi32(0x7F000000))));
    return with_parity(s);
}

/* 16 int8 -> kiln_sb's 16 int16 scales, 2 v + 1 */
INLINE void odd_scales(int16_t *sc, __m128i v) {
    const __m256i w = _mm256_cvtepu8_epi16(v);
    store32(sc, _mm256_add_epi16(_mm256_add_epi16(w, w), _mm256_set1_epi16(1)));
}

/* bytes of nibbles -> twice as many bytes, low nibble first */
INLINE __m128i nibbles(__m128i v) {
    const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(15)), hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15));
    return _mm_unpacklo_epi8(lo, hi);
}

/* weights of 2-bit fields: 64 bytes of qs, halves of 128 weights in 32 bytes, 2 bits a quarter */
INLINE void two_bits(const uint8_t *qs, int8_t *q, __m256i offset) {
    const __m256i three = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        const __m256i v = load32(qs + 32 * h);
        store32(q + 128 * h, _mm256_sub_epi8(_mm256_and_si256(v, three), offset));
        store32(q + 128 * h + 32, _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v, 2), three), offset));
        store32(q + 128 * h + 64, _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v, 4), three), offset));
        store32(q + 128 * h + 96, _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v, 6), three), offset));
    }
}

INLINE void sb_unpack_q2_K(const void *block, kiln_sb *u) {
    const block_q2_K *x = block;
    two_bits(x->qs, u->q, _mm256_setzero_si256());
    const __m128i s = _mm_loadu_si128((const __m128i *)x->scales);
    store32(u->sc, _mm256_cvtepu8_epi16(_mm_and_si128(s, _mm_set1_epi8(15))));
    store32(u->m, _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(15))));
    u->d = kiln_fp16_to_fp32(x->d), u->dmin = kiln_fp16_to_fp32(x->dmin);
}

INLINE void sb_unpack_tq2_0(const void *block, kiln_sb *u) {
    const block_tq2_0 *x = block;
    two_bits(x->qs, u->q, _mm256_set1_epi8(1));
    store32(u->sc, _mm256_set1_epi16(1));
    u->d = kiln_fp16_to_fp32(x->d);
}

INLINE void sb_unpack_q3_K(const void *block, kiln_sb *u) {
    const block_q3_K *x = block;
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4), hm = load32(x->hmask);
    for (int k = 0; k < 8; k++) { /* chunk k of 32: 2 bits from qs, and 4 where hmask's bit k is set, less 4 */
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(load32(x->qs + 32 * (k / 4)), 2 * (k % 4)), three);
        const __m256i bit_k = k < 2 ? _mm256_slli_epi16(hm, 2 - k) : _mm256_srli_epi16(hm, k - 2); /* to bit 2 */
        const __m256i high = _mm256_and_si256(bit_k, four);
        store32(u->q + 32 * k, _mm256_sub_epi8(_mm256_or_si256(low, high), four));
    }
    /* 6-bit scales: the low 4 bits from nibbles of bytes 0..7, the high 2 from bit pairs of 8..11 */
    const __m128i s = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)x->scales), (int)u32_at(x->scales + 8), 2);
    const __m128i low = _mm_and_si128(_mm_unpacklo_epi64(s, _mm_srli_epi16(s, 4)), _mm_set1_epi8(15));
    const __m128i high = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(s, 0xAA), _mm_setr_epi32(0, 2, 4, 6)),
                                       _mm_set1_epi8(3));
    const __m256i sc = _mm256_cvtepu8_epi16(_mm_or_si128(low, _mm_slli_epi16(high, 4)));
    store32(u->sc, _mm256_sub_epi16(sc, _mm256_set1_epi16(32)));
    u->d = kiln_fp16_to_fp32(x->d), u->dmin = 0.0f;
}

INLINE void sb_unpack_iq4_xs(const void *block, kiln_sb *u) {
    const block_iq4_xs *x = block;
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kiln_kvalues_iq4nl));
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int k = 0; k < 4; k++) { /* two sub-blocks of 32: 16 bytes each, low nibbles first */
        const __m256i v = load32(x->qs + 32 * k);
        const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
        const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
        store32(u->q + 64 * k, _mm256_permute2x128_si256(lo, hi, 0x20));
        store32(u->q + 64 * k + 32, _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    /* 6-bit scales, one a sub-block of 32: 4 bits from scales_l's nibbles, 2 from scales_h, whose
       bit pair ib the multiply moves to the top of int16 lane ib */
    const __m128i low = _mm_cvtepu8_epi16(nibbles(_mm_cvtsi32_si128((int)u32_at(x->scales_l))));
    const __m128i high = _mm_srli_epi16(_mm_mullo_epi16(_mm_set1_epi16((short)x->scales_h),
                                                        _mm_setr_epi16(1 << 14, 1 << 12, 1 << 10, 1 << 8, 1 << 6,
                                                                       1 << 4, 1 << 2, 1)), 14);
    const __m128i l = _mm_sub_epi16(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi16(32));
    store32(u->sc, _mm256_set_m128i(_mm_unpackhi_epi16(l, l), _mm_unpacklo_epi16(l, l)));
    u->d = kiln_fp16_to_fp32(x->d), u->dmin = 0.0f;
}

/* -- the grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) -----------------------------------
   A sub-block of 32 weights is 32 unsigned grid bytes and 32 sign bits. sb_unpack applies the signs
   to the grid (q = (g ^ m) - m); the decode dot (rows_sb_avx2.c) applies them to the activations
   instead and takes the grid bytes as they are, as the unsigned side of the byte products. So each
   type is written once as two parts: grid_prep (a block's 8 sign words, its 16 scales and d) and
   grid_rows (sub-block k's grid bytes), which both build on. */
typedef struct {
    uint32_t sgn[8]; /* bit i of word k: weight 32 k + i is negated */
    int16_t sc[16];
    float d;
} grid_block;

/* IQ2_XXS and IQ3_XXS keep a sub-block's four sign indexes and scale in one uint32: the 32 sign
   bytes to sgn, the 16 scales (2 ls + 1, each twice) to sc */
INLINE void xxs_signs_scales(__m256i aux, grid_block *b) {
    store32(b->sgn, signs_of_7bit_fields(aux));
    const __m256i ls = _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(aux, 28), 1), _mm256_set1_epi32(1));
    store32(b->sc, _mm256_or_si256(ls, _mm256_slli_epi32(ls, 16)));
}

INLINE void grid_prep_iq2_xxs(const block_iq2_xxs *x, grid_block *b) {
    const uint8_t *qs = (const uint8_t *)x->qs;
    /* the sub-blocks' uint32 pairs: grid indexes, then signs and scale */
    const __m256 lo = _mm256_castsi256_ps(load32(qs)), hi = _mm256_castsi256_ps(load32(qs + 32));
    xxs_signs_scales(_mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1))),
                                              _MM_SHUFFLE(3, 1, 2, 0)), b);
    b->d = kiln_fp16_to_fp32(x->d) * 0.125f;
}
INLINE __m256i grid_rows_iq2_xxs(const block_iq2_xxs *x, int k) {
    const uint8_t *i = (const uint8_t *)x->qs + 8 * k;
    return rows4(kiln_iq2xxs_grid, i[0], i[1], i[2], i[3]);
}

INLINE void grid_prep_iq2_xs(const block_iq2_xs *x, grid_block *b) {
    /* each uint16: a 9-bit grid index, then a 7-bit sign index */
    const __m256i v0 = load32(x->qs), v1 = load32(x->qs + 16);
    const __m256i s = _mm256_packus_epi16(_mm256_srli_epi16(v0, 9), _mm256_srli_epi16(v1, 9));
    store32(b->sgn, with_parity(_mm256_permute4x64_epi64(s, _MM_SHUFFLE(3, 1, 2, 0))));
    odd_scales(b->sc, nibbles(_mm_loadl_epi64((const __m128i *)x->scales)));
    b->d = kiln_fp16_to_fp32(x->d) * 0.125f;
}
INLINE __m256i grid_rows_iq2_xs(const block_iq2_xs *x, int k) {
    const uint16_t *i = x->qs + 4 * k;
    return rows4(kiln_iq2xs_grid, i[0] & 511, i[1] & 511, i[2] & 511, i[3] & 511);
}

INLINE void grid_prep_iq2_s(const block_iq2_s *x, grid_block *b) {
    memcpy(b->sgn, x->qs + QK_K / 8, sizeof b->sgn);
    odd_scales(b->sc, nibbles(_mm_loadl_epi64((const __m128i *)x->scales)));
    b->d = kiln_fp16_to_fp32(x->d) * 0.125f;
}
INLINE __m256i grid_rows_iq2_s(const block_iq2_s *x, int k) {
    /* a group's index: 8 bits in qs, 2 in qh (a pair of bits a group) */
    const __m128i high = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(x->qh[k]), _mm_setr_epi32(0, 2, 4, 6)),
                                       _mm_set1_epi32(3));
    const __m128i idx = _mm_or_si128(_mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)u32_at(x->qs + 4 * k))),
                                     _mm_slli_epi32(high, 8));
    return gather4(kiln_iq2s_grid, idx);
}

INLINE void grid_prep_iq3_xxs(const block_iq3_xxs *x, grid_block *b) {
    xxs_signs_scales(load32(x->qs + QK_K / 4), b);
    b->d = kiln_fp16_to_fp32(x->d) * 0.25f;
}
INLINE __m256i grid_rows_iq3_xxs(const block_iq3_xxs *x, int k) { /* 8 grid rows of 4 */
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(x->qs + 8 * k)));
    return _mm256_i32gather_epi32((const int *)kiln_iq3xxs_grid, idx, 4);
}

INLINE void grid_prep_iq3_s(const block_iq3_s *x, grid_block *b) {
    memcpy(b->sgn, x->signs, sizeof b->sgn);
    const __m128i n = nibbles(_mm_cvtsi32_si128((int)u32_at(x->scales))); /* 8 nibbles, each for 32 weights: doubled */
    odd_scales(b->sc, _mm_unpacklo_epi8(n, n));
    b->d = kiln_fp16_to_fp32(x->d);
}
INLINE __m256i grid_rows_iq3_s(const block_iq3_s *x, int k) { /* 8 grid rows of 4: 8 bits in qs, the ninth bit j of qh[k] */
    const __m256i low = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(x->qs + 8 * k)));
#if defined(__AVX512VL__)
    const __m256i idx = _mm256_mask_or_epi32(low, (__mmask8)x->qh[k], low, _mm256_set1_epi32(256)); /* qh[k] a mask as it is */
#else
    const __m256i high = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(x->qh[k]), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                                          _mm256_set1_epi32(1));
    const __m256i idx = _mm256_or_si256(low, _mm256_slli_epi32(high, 8));
#endif
    return _mm256_i32gather_epi32((const int *)kiln_iq3s_grid, idx, 4);
}

#define KILN_GRID_TYPES(X) X(iq2_xxs, KILN_IQ2_XXS) X(iq2_xs, KILN_IQ2_XS) X(iq2_s, KILN_IQ2_S) \
    X(iq3_xxs, KILN_IQ3_XXS) X(iq3_s, KILN_IQ3_S)

INLINE int is_grid(const int type) {
#define GRID_IS(name, t) || type == t
    return 0 KILN_GRID_TYPES(GRID_IS);
#undef GRID_IS
}
/* a type known where these are inlined */
INLINE void grid_prep(const int type, const void *block, grid_block *b) {
#define GRID_CASE(name, t) case t: grid_prep_##name(block, b); break;
    switch (type) { KILN_GRID_TYPES(GRID_CASE) default: break; }
#undef GRID_CASE
}
INLINE __m256i grid_rows(const int type, const void *block, int k) {
#define GRID_CASE(name, t) case t: return grid_rows_##name(block, k);
    switch (type) { KILN_GRID_TYPES(GRID_CASE) default: return _mm256_setzero_si256(); }
#undef GRID_CASE
}

#if defined(__AVX512BW__) && defined(__AVX512VL__)
/* sub-blocks k and k + 1's grid rows in one vector: the gathering types by one gather of all 16
   (or 8) rows, which took fewer uops than two on Sapphire Rapids; the others as two halves. (Zen 4
   takes its grids by byte permutes instead, grid_rows_all: its gathers are slow.) */
INLINE __m512i grid_rows2(const int type, const void *block, int k) {
    if (type == KILN_IQ2_S) {
        const block_iq2_s *x = block;
        const __m256i high = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(x->qh[k] | x->qh[k + 1] << 8),
                                                                _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                              _mm256_set1_epi32(3));
        const __m256i idx = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(x->qs + 4 * k))),
                                            _mm256_slli_epi32(high, 8));
        return _mm512_i32gather_epi64(idx, (const long long *)kiln_iq2s_grid, 8);
    }
    if (type == KILN_IQ3_XXS) {
        const block_iq3_xxs *x = block;
        const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(x->qs + 8 * k)));
        return _mm512_i32gather_epi32(idx, (const int *)kiln_iq3xxs_grid, 4);
    }
    if (type == KILN_IQ3_S) {
        const block_iq3_s *x = block;
        const __m512i low = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(x->qs + 8 * k)));
        const __m512i idx = _mm512_mask_or_epi32(low, (__mmask16)(x->qh[k] | x->qh[k + 1] << 8), low,
                                                 _mm512_set1_epi32(256));
        return _mm512_i32gather_epi32(idx, (const int *)kiln_iq3s_grid, 4);
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(grid_rows(type, block, k)), grid_rows(type, block, k + 1), 1);
}
#endif

#ifdef KILN_HAVE_VBMI
/* The IQ3 types' 64 grid rows of a block at once, without a gather: each of the 4 bytes of a row
 * is looked up for all 64 indexes by byte permutes of the grid's columns (kiln_iq3*_grid_cols): a
 * vpermi2b takes 128 entries by the index's low 7 bits, and the index's bit 7 (in qs) and, for
 * IQ3_S's 512 rows, bit 8 (qh, whose 64 bits are a mask as they stand) pick among them. The four
 * columns are then interleaved back into rows: out[j] is grid_rows2(k = 2j), bit for bit. On Zen
 * 4, one core's 8192 x 2048 IQ3_S matrix decoded in 1.00 ms against 1.94 by its gathers. */
INLINE __m512i grid_column(const uint8_t *col, int n, __m512i q, __mmask64 bit7, __mmask64 bit8, __mmask64 bit9) {
    const __m512i *t = (const __m512i *)col;
    __m512i r[8];
    for (int i = 0; i < n / 128; i++) r[i] = _mm512_permutex2var_epi8(_mm512_load_si512(t + 2 * i), q, _mm512_load_si512(t + 2 * i + 1));
    for (int i = 0; i < n / 256; i++) r[i] = _mm512_mask_blend_epi8(bit7, r[2 * i], r[2 * i + 1]);
    for (int i = 0; i < n / 512; i++) r[i] = _mm512_mask_blend_epi8(bit8, r[2 * i], r[2 * i + 1]);
    return n == 1024 ? _mm512_mask_blend_epi8(bit9, r[0], r[1]) : r[0];
}
INLINE void grid_rows_all_iq3(const int type, const void *block, __m512i out[4]) {
    const int n = type == KILN_IQ3_S ? 512 : 256;
    const uint8_t *qs = type == KILN_IQ3_S ? ((const block_iq3_s *)block)->qs : ((const block_iq3_xxs *)block)->qs;
    const __m512i q = _mm512_loadu_si512(qs);
    const __mmask64 bit7 = _mm512_movepi8_mask(q);
    __mmask64 bit8 = 0;
    if (type == KILN_IQ3_S) memcpy(&bit8, ((const block_iq3_s *)block)->qh, sizeof bit8);
    __m512i col[4];
    for (int j = 0; j < 4; j++)
        col[j] = grid_column(n == 512 ? kiln_iq3s_grid_cols[j] : kiln_iq3xxs_grid_cols[j], n, q, bit7, bit8, 0);
    /* bytes (col0[i], col1[i]) as word i of p01 (rows 0-31 in lo, 32-63 in hi), then words (p01[i], p23[i]) */
    const __m512i pair_lo = _mm512_set_epi8(95, 31, 94, 30, 93, 29, 92, 28, 91, 27, 90, 26, 89, 25, 88, 24, 87, 23, 86,
                                            22, 85, 21, 84, 20, 83, 19, 82, 18, 81, 17, 80, 16, 79, 15, 78, 14, 77, 13,
                                            76, 12, 75, 11, 74, 10, 73, 9, 72, 8, 71, 7, 70, 6, 69, 5, 68, 4, 67, 3, 66,
                                            2, 65, 1, 64, 0);
    const __m512i pair_hi = _mm512_add_epi8(pair_lo, _mm512_set1_epi8(32));
    const __m512i word_lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                             37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i word_hi = _mm512_add_epi16(word_lo, _mm512_set1_epi16(16));
    const __m512i p01l = _mm512_permutex2var_epi8(col[0], pair_lo, col[1]), p01h = _mm512_permutex2var_epi8(col[0], pair_hi, col[1]);
    const __m512i p23l = _mm512_permutex2var_epi8(col[2], pair_lo, col[3]), p23h = _mm512_permutex2var_epi8(col[2], pair_hi, col[3]);
    out[0] = _mm512_permutex2var_epi16(p01l, word_lo, p23l);
    out[1] = _mm512_permutex2var_epi16(p01l, word_hi, p23l);
    out[2] = _mm512_permutex2var_epi16(p01h, word_lo, p23h);
    out[3] = _mm512_permutex2var_epi16(p01h, word_hi, p23h);
}

/* IQ2_XXS's and IQ2_S's 32 grid rows of a block at once: the grid's rows as 16-bit codes (2 bits a
 * byte, kiln_iq2*_grid_codes), looked up by byte permutes as the IQ3 types' columns are, by the
 * index's low 8 bits (IQ2_S's bits 8 and 9 as masks, from qh by pext); each row's code is moved
 * into a qword, its 8 fields cut out by one vpmultishiftqb and made magnitudes by one vpermb (a
 * field's value repeated in every 4 of 64 entries, so the bits above it do not matter). One core's
 * 8192 x 2048 decode on Zen 4: IQ2_XXS 0.88 -> 0.81 ms, IQ2_S 1.37 -> 1.05; IQ2_XS's 512 rows
 * took 0.94-0.99 against 0.91 by its broadcast loads, and so keep them. */
INLINE void grid_rows_all_iq2(const int type, const void *block, __m512i out[4]) {
    static const uint8_t pick_xxs[64] __attribute__((aligned(64))) = { /* IQ2_XXS row 4k + i's index: byte 8k + i */
        0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27,
        32, 33, 34, 35, 40, 41, 42, 43, 48, 49, 50, 51, 56, 57, 58, 59,
        0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27,
        32, 33, 34, 35, 40, 41, 42, 43, 48, 49, 50, 51, 56, 57, 58, 59,
    };
    static const uint8_t to_qwords[64] __attribute__((aligned(64))) = { /* row e's code into qword e */
        0, 64, 0, 0, 0, 0, 0, 0, 1, 65, 0, 0, 0, 0, 0, 0,
        2, 66, 0, 0, 0, 0, 0, 0, 3, 67, 0, 0, 0, 0, 0, 0,
        4, 68, 0, 0, 0, 0, 0, 0, 5, 69, 0, 0, 0, 0, 0, 0,
        6, 70, 0, 0, 0, 0, 0, 0, 7, 71, 0, 0, 0, 0, 0, 0,
    };
    __m512i q;
    __mmask64 bit8 = 0, bit9 = 0;
    const uint8_t *codes; /* the low bytes of the n codes, then the high */
    int n;
    if (type == KILN_IQ2_XXS) {
        q = _mm512_permutexvar_epi8(_mm512_load_si512(pick_xxs), _mm512_loadu_si512(((const block_iq2_xxs *)block)->qs));
        codes = kiln_iq2xxs_grid_codes[0], n = 256;
    } else { /* IQ2_S: 8 bits in qs, bits 8 and 9 of row e at bits 2e and 2e + 1 of qh */
        const block_iq2_s *x = block;
        uint64_t qh;
        memcpy(&qh, x->qh, sizeof qh);
        q = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)x->qs));
        bit8 = _pext_u64(qh, 0x5555555555555555ULL), bit9 = _pext_u64(qh, 0xAAAAAAAAAAAAAAAAULL);
        codes = kiln_iq2s_grid_codes[0], n = 1024;
    }
    const __mmask64 bit7 = _mm512_movepi8_mask(q);
    const __m512i lo = grid_column(codes, n, q, bit7, bit8, bit9), hi = grid_column(codes + n, n, q, bit7, bit8, bit9);
    const __m512i fields = _mm512_set1_epi64(0x0E0C0A0806040200), sel = _mm512_load_si512(to_qwords);
    const __m512i magnitudes = _mm512_set1_epi32((int)u32_at(kiln_iq2_grid_values));
    for (int m = 0; m < 4; m++) {
        const __m512i c = _mm512_permutex2var_epi8(lo, _mm512_add_epi8(sel, _mm512_set1_epi8((char)(8 * m))), hi);
        out[m] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(fields, c), magnitudes);
    }
}
#define GRID_ROWS_ALL(t) ((t) == KILN_IQ3_S || (t) == KILN_IQ3_XXS || (t) == KILN_IQ2_XXS || (t) == KILN_IQ2_S)
#else
#define GRID_ROWS_ALL(t) 0
#endif
#if defined(__AVX512BW__) && defined(__AVX512VL__)
/* a block's rows as grid_rows2 gives them, pair j of sub-blocks in out[j], where a type has them
   all at once (GRID_ROWS_ALL) */
INLINE void grid_rows_all(const int type, const void *block, __m512i out[4]) {
#ifdef KILN_HAVE_VBMI
    if (type == KILN_IQ3_S || type == KILN_IQ3_XXS) grid_rows_all_iq3(type, block, out);
    if (type == KILN_IQ2_XXS || type == KILN_IQ2_S) grid_rows_all_iq2(type, block, out);
#endif
    (void)type, (void)block, (void)out;
}
#endif

/* the unpacked block of a grid type: the signs applied to the grid (with AVX-512, two sub-blocks
   a vector, negated under their 64 sign bits) */
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define GRID_SIGNED_ROWS(name, t)                                                                        \
    __m512i all[4];                                                                                       \
    if (GRID_ROWS_ALL(t)) grid_rows_all(t, block, all);                                                   \
    _Pragma("GCC unroll 4") for (int k = 0; k < 8; k += 2) {                                              \
        const __m512i g = GRID_ROWS_ALL(t) ? all[k / 2] : grid_rows2(t, block, k);                        \
        const __mmask64 m = (__mmask64)b.sgn[k] | (__mmask64)b.sgn[k + 1] << 32;                          \
        _mm512_storeu_si512(u->q + 32 * k, _mm512_mask_sub_epi8(g, m, _mm512_setzero_si512(), g));        \
    }
#else
#define GRID_SIGNED_ROWS(name, t)                                                                        \
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)                                                   \
        store32(u->q + 32 * k, apply_signs(grid_rows_##name(block, k), sign_masks(b.sgn[k])));
#endif
#define GRID_UNPACK(name, t)                                                              \
    INLINE void sb_unpack_##name(const void *block, kiln_sb *u) {                         \
        grid_block b;                                                                     \
        grid_prep_##name(block, &b);                                                      \
        GRID_SIGNED_ROWS(name, t)                                                         \
        memcpy(u->sc, b.sc, sizeof b.sc);                                                 \
        u->d = b.d;                                                                       \
    }
KILN_GRID_TYPES(GRID_UNPACK)
#undef GRID_UNPACK
#undef GRID_SIGNED_ROWS

/* IQ1: 4 groups of 8 from 4 11-bit indexes (8 bits in qs, 3 bits of h at each of the 4 shifts),
   q = 8 grid + delta (delta +-1 a group) */
INLINE __m256i iq1_groups(const uint8_t *qs, unsigned h, __m128i shifts, __m256i delta) {
    const __m128i high = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)h), shifts), _mm_set1_epi32(7));
    const __m128i idx = _mm_or_si128(_mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)u32_at(qs))), _mm_slli_epi32(high, 8));
    const __m256i g = gather4(kiln_iq1s_grid, idx);
    const __m256i g8 = _mm256_and_si256(_mm256_slli_epi16(g, 3), _mm256_set1_epi8((char)0xF8));
    return _mm256_add_epi8(g8, delta);
}

INLINE void sb_unpack_iq1_s(const void *block, kiln_sb *u) {
    const block_iq1_s *x = block;
    const __m128i shifts = _mm_setr_epi32(0, 3, 6, 9);
    for (int ib = 0; ib < 8; ib++) {
        const unsigned qh = x->qh[ib];
        store32(u->q + 32 * ib, iq1_groups(x->qs + 4 * ib, qh, shifts, _mm256_set1_epi8(qh & 0x8000 ? -1 : 1)));
    }
    const __m128i ls = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)x->qh), 12), _mm_set1_epi16(7));
    const __m128i l = _mm_add_epi16(_mm_add_epi16(ls, ls), _mm_set1_epi16(1));
    store32(u->sc, _mm256_set_m128i(_mm_unpackhi_epi16(l, l), _mm_unpacklo_epi16(l, l)));
    u->d = kiln_fp16_to_fp32(x->d) * 0.125f;
}

INLINE void sb_unpack_iq1_m(const void *block, kiln_sb *u) {
    const block_iq1_m *x = block;
    uint16_t sc[4];
    memcpy(sc, x->scales, sizeof sc);
    const kiln_half d = (kiln_half)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    const __m128i shifts = _mm_setr_epi32(0, 4, 8, 12), eight = _mm_set1_epi32(8);
    for (int ib = 0; ib < 8; ib++) { /* a nibble of qh a group: index bits 8..10, then the delta's sign */
        const unsigned qh = x->qh[2 * ib] | x->qh[2 * ib + 1] << 8;
        /* delta: 1, or -1 where bit 3 is set, spread from each group's dword to its 8 bytes */
        const __m128i h = _mm_srlv_epi32(_mm_set1_epi32((int)qh), shifts);
        const __m256i minus = _mm256_cvtepi32_epi64(_mm_cmpeq_epi32(_mm_and_si128(h, eight), eight));
        store32(u->q + 32 * ib, iq1_groups(x->qs + 4 * ib, qh, shifts, _mm256_or_si256(minus, _mm256_set1_epi8(1))));
    }
    /* 3-bit scales, four a uint16: each uint16 in 4 lanes, whose multipliers move field j % 4 to bits 9..11 */
    const __m256i w = _mm256_shuffle_epi8(
        _mm256_broadcastsi128_si256(_mm_loadl_epi64((const __m128i *)x->scales)),
        _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7));
    const __m256i by = _mm256_setr_epi16(512, 64, 8, 1, 512, 64, 8, 1, 512, 64, 8, 1, 512, 64, 8, 1);
    const __m256i ls = _mm256_srli_epi16(_mm256_and_si256(_mm256_mullo_epi16(w, by), _mm256_set1_epi16(7 << 9)), 9);
    store32(u->sc, _mm256_add_epi16(_mm256_add_epi16(ls, ls), _mm256_set1_epi16(1)));
    u->d = kiln_fp16_to_fp32(d) * 0.125f;
}

/* TQ1_0: byte b's trit n is t = (m * 3) >> 8 for m = b 3^n mod 256: 0 below 86, 2 from 171. As a
   signed byte m - 128, q = t - 1 is -1 below -42, 1 above 42 (compares give -1 for true) */
INLINE __m256i trits(__m256i m) {
    const __m256i s = _mm256_xor_si256(m, _mm256_set1_epi8((char)0x80));
    return _mm256_sub_epi8(_mm256_cmpgt_epi8(_mm256_set1_epi8(-42), s), _mm256_cmpgt_epi8(s, _mm256_set1_epi8(42)));
}
INLINE __m256i times3(__m256i m) { return _mm256_add_epi8(_mm256_add_epi8(m, m), m); }
INLINE __m128i times3x(__m128i m) { return _mm_add_epi8(_mm_add_epi8(m, m), m); }

INLINE void sb_unpack_tq1_0(const void *block, kiln_sb *u) {
    const block_tq1_0 *x = block;
    __m256i m = load32(x->qs); /* 32 bytes of 5 trits: weights 32 n + j */
    for (int n = 0; n < 5; n++, m = times3(m)) store32(u->q + 32 * n, trits(m));
    /* 16 bytes of 5 trits (weights 160 + 16 n + j), two n a store; the third store pairs n = 4 with
       qh's 4 bytes of 4 trits (240 + 4 n + j): qh in four dwords, dword n times 3^n */
    const __m128i b0 = _mm_loadu_si128((const __m128i *)(x->qs + 32)), b1 = times3x(b0), b2 = times3x(b1);
    const __m128i b3 = times3x(b2), b4 = times3x(b3);
    const __m128i h = _mm_set1_epi32((int)u32_at(x->qh)), h3 = times3x(h), h9 = times3x(h3), h27 = times3x(h9);
    const __m128i hn = _mm_blend_epi32(_mm_blend_epi32(h, h3, 2), _mm_blend_epi32(h9, h27, 8), 12);
    store32(u->q + 160, trits(_mm256_set_m128i(b1, b0)));
    store32(u->q + 192, trits(_mm256_set_m128i(b3, b2)));
    store32(u->q + 224, trits(_mm256_set_m128i(hn, b4)));
    store32(u->sc, _mm256_set1_epi16(1));
    u->d = kiln_fp16_to_fp32(x->d);
}

/* the unpacker of a type known where this is inlined */
INLINE void sb_unpack(const int type, const void *block, kiln_sb *u) {
#define SB_CASE(name, t) case t: sb_unpack_##name(block, u); break;
    switch (type) { KILN_SB_TYPES(SB_CASE) default: break; }
#undef SB_CASE
}
#endif
#endif
