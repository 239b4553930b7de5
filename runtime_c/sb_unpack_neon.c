/* sb_unpack_neon.c: the fast unpackers of the super-block types with NEON (sb_unpack.c says which
 * build takes which). Each writes its reference's kiln_sb (ref_sblock.c) bit for bit: the same
 * integers, and d and dmin by the same float expressions.
 *
 * 16 weights at a time: two groups of 8 of the i-quants, whose grid rows are loaded by index and
 * whose sign bytes become byte masks m by vtst (0xFF where minus), q = (g ^ m) - m; TQ1_0's trits
 * take NEON's byte multiply. Scales that come one a sub-block of 32 are written as scalars.
 */
#include <string.h>

#include "fp16.h"
#include "neon.h"
#include "quant_impl.h"
#include "sb_unpack.h"

#ifdef KILN_HAVE_NEON
#define INLINE KILN_NEON_INLINE

INLINE uint32_t u32_at(const void *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE void store_u8(int8_t *q, uint8x16_t v) { vst1q_s8(q, vreinterpretq_s8_u8(v)); }

/* 16 bytes of 2 groups' magnitudes with their two sign bytes (bit k negates byte k of a group) */
INLINE uint8x16_t signed16(uint8x16_t g, uint8_t s0, uint8_t s1) {
    const uint8x16_t bits = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ULL));
    const uint8x16_t m = vtstq_u8(vcombine_u8(vdup_n_u8(s0), vdup_n_u8(s1)), bits);
    return vsubq_u8(veorq_u8(g, m), m);
}

/* rows i0 and i1 of a table of 8-byte rows, and of 4-byte rows two each */
INLINE uint8x16_t rows8(const uint8_t (*t)[8], unsigned i0, unsigned i1) {
    return vcombine_u8(vld1_u8(t[i0]), vld1_u8(t[i1]));
}
INLINE uint8x16_t rows4x4(const uint8_t (*t)[4], unsigned i0, unsigned i1, unsigned i2, unsigned i3) {
    uint32_t r[4];
    memcpy(&r[0], t[i0], 4), memcpy(&r[1], t[i1], 4), memcpy(&r[2], t[i2], 4), memcpy(&r[3], t[i3], 4);
    return vreinterpretq_u8_u32(vld1q_u32(r));
}

/* 16 unsigned bytes -> 16 int16 scales, 2 v + 1 */
INLINE void odd_scales(int16_t *sc, uint8x16_t v) {
    const uint16x8_t one = vdupq_n_u16(1);
    vst1q_s16(sc, vreinterpretq_s16_u16(vmlal_u8(one, vget_low_u8(v), vdup_n_u8(2))));
    vst1q_s16(sc + 8, vreinterpretq_s16_u16(vmlal_high_u8(one, v, vdupq_n_u8(2))));
}

/* 8 bytes of nibbles -> 16, low nibble first */
INLINE uint8x16_t nibbles8(uint8x8_t v) {
    const uint8x8_t lo = vand_u8(v, vdup_n_u8(15)), hi = vshr_n_u8(v, 4);
    return vcombine_u8(vzip1_u8(lo, hi), vzip2_u8(lo, hi));
}

/* weights of 2-bit fields: halves of 128 weights in 32 bytes of qs, 2 bits a quarter, less offset */
INLINE void two_bits(const uint8_t *qs, int8_t *q, uint8_t offset) {
    const uint8x16_t three = vdupq_n_u8(3), off = vdupq_n_u8(offset);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 2; i++) {
            const uint8x16_t v = vld1q_u8(qs + 32 * h + 16 * i);
            int8_t *o = q + 128 * h + 16 * i;
            store_u8(o, vsubq_u8(vandq_u8(v, three), off));
            store_u8(o + 32, vsubq_u8(vandq_u8(vshrq_n_u8(v, 2), three), off));
            store_u8(o + 64, vsubq_u8(vandq_u8(vshrq_n_u8(v, 4), three), off));
            store_u8(o + 96, vsubq_u8(vshrq_n_u8(v, 6), off));
        }
}

static void unpack_q2_K(const void *block, kiln_sb *u) {
    const block_q2_K *x = block;
    two_bits(x->qs, u->q, 0);
    const uint8x16_t s = vld1q_u8(x->scales), lo = vandq_u8(s, vdupq_n_u8(15)), hi = vshrq_n_u8(s, 4);
    vst1q_s16(u->sc, vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(lo))));
    vst1q_s16(u->sc + 8, vreinterpretq_s16_u16(vmovl_high_u8(lo)));
    vst1q_s16(u->m, vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(hi))));
    vst1q_s16(u->m + 8, vreinterpretq_s16_u16(vmovl_high_u8(hi)));
    u->d = kiln_fp16_to_fp32(x->d), u->dmin = kiln_fp16_to_fp32(x->dmin);
}

static void unpack_tq2_0(const void *block, kiln_sb *u) {
    const block_tq2_0 *x = block;
    two_bits(x->qs, u->q, 1);
    vst1q_s16(u->sc, vdupq_n_s16(1)), vst1q_s16(u->sc + 8, vdupq_n_s16(1));
    u->d = kiln_fp16_to_fp32(x->d);
}

static void unpack_q3_K(const void *block, kiln_sb *u) {
    const block_q3_K *x = block;
    const uint8x16_t three = vdupq_n_u8(3), four = vdupq_n_u8(4);
    const uint8x16_t hm[2] = {vld1q_u8(x->hmask), vld1q_u8(x->hmask + 16)};
    for (int k = 0; k < 8; k++) /* chunk k of 32: 2 bits from qs, and 4 where hmask's bit k is set, less 4 */
        for (int i = 0; i < 2; i++) {
            const uint8x16_t v = vld1q_u8(x->qs + 32 * (k / 4) + 16 * i);
            const uint8x16_t low = vandq_u8(vshlq_u8(v, vdupq_n_s8((int8_t)(-2 * (k % 4)))), three);
            const uint8x16_t high = vandq_u8(vshlq_u8(hm[i], vdupq_n_s8((int8_t)(2 - k))), four);
            store_u8(u->q + 32 * k + 16 * i, vsubq_u8(vorrq_u8(low, high), four));
        }
    uint32_t a[3]; /* 6-bit scales: low 4 bits from bytes 0..7, high 2 from 8..11 (ggml's shuffle) */
    memcpy(a, x->scales, sizeof a);
    const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const uint32_t s[4] = {(a[0] & m4) | ((a[2] & m2) << 4), (a[1] & m4) | (((a[2] >> 2) & m2) << 4),
                           ((a[0] >> 4) & m4) | (((a[2] >> 4) & m2) << 4),
                           ((a[1] >> 4) & m4) | (((a[2] >> 6) & m2) << 4)};
    const uint8x16_t sc = vreinterpretq_u8_u32(vld1q_u32(s));
    const int16x8_t off = vdupq_n_s16(32);
    vst1q_s16(u->sc, vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(sc))), off));
    vst1q_s16(u->sc + 8, vsubq_s16(vreinterpretq_s16_u16(vmovl_high_u8(sc)), off));
    u->d = kiln_fp16_to_fp32(x->d), u->dmin = 0.0f;
}

static void unpack_iq4_xs(const void *block, kiln_sb *u) {
    const block_iq4_xs *x = block;
    const int8x16_t lut = vld1q_s8(kiln_kvalues_iq4nl);
    for (int ib = 0; ib < 8; ib++) {
        const uint8x16_t v = vld1q_u8(x->qs + 16 * ib);
        vst1q_s8(u->q + 32 * ib, vqtbl1q_s8(lut, vandq_u8(v, vdupq_n_u8(15))));
        vst1q_s8(u->q + 32 * ib + 16, vqtbl1q_s8(lut, vshrq_n_u8(v, 4)));
        const int ls = ((x->scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | (((x->scales_h >> (2 * ib)) & 3) << 4);
        u->sc[2 * ib] = u->sc[2 * ib + 1] = (int16_t)(ls - 32);
    }
    u->d = kiln_fp16_to_fp32(x->d), u->dmin = 0.0f;
}

static void unpack_iq2_xxs(const void *block, kiln_sb *u) {
    const block_iq2_xxs *x = block;
    const uint8_t *qs = (const uint8_t *)x->qs;
    for (int ib = 0; ib < 8; ib++) { /* a uint32 of 4 grid indexes, then one of 4 sign indexes and the scale */
        const uint8_t *i = qs + 8 * ib;
        const uint32_t aux = u32_at(qs + 8 * ib + 4);
        for (int l = 0; l < 4; l += 2)
            store_u8(u->q + 32 * ib + 8 * l,
                     signed16(rows8(kiln_iq2xxs_grid, i[l], i[l + 1]), kiln_ksigns_iq2xs[(aux >> (7 * l)) & 127],
                              kiln_ksigns_iq2xs[(aux >> (7 * l + 7)) & 127]));
        u->sc[2 * ib] = u->sc[2 * ib + 1] = (int16_t)(2 * (aux >> 28) + 1);
    }
    u->d = kiln_fp16_to_fp32(x->d) * 0.125f;
}

static void unpack_iq2_xs(const void *block, kiln_sb *u) {
    const block_iq2_xs *x = block;
    for (int g = 0; g < QK_K / 8; g += 2) /* a 9-bit grid index, then a 7-bit sign index */
        store_u8(u->q + 8 * g, signed16(rows8(kiln_iq2xs_grid, x->qs[g] & 511, x->qs[g + 1] & 511),
                                        kiln_ksigns_iq2xs[x->qs[g] >> 9], kiln_ksigns_iq2xs[x->qs[g + 1] >> 9]));
    odd_scales(u->sc, nibbles8(vld1_u8(x->scales)));
    u->d = kiln_fp16_to_fp32(x->d) * 0.125f;
}

static void unpack_iq2_s(const void *block, kiln_sb *u) {
    const block_iq2_s *x = block;
    const uint8_t *signs = x->qs + QK_K / 8;
    for (int ib = 0; ib < 8; ib++) { /* a group's index: 8 bits in qs, 2 in qh (a pair of bits a group) */
        const uint8_t *i = x->qs + 4 * ib;
        const unsigned h = x->qh[ib];
        store_u8(u->q + 32 * ib, signed16(rows8(kiln_iq2s_grid, i[0] | (h << 8 & 0x300), i[1] | (h << 6 & 0x300)),
                                          signs[4 * ib], signs[4 * ib + 1]));
        store_u8(u->q + 32 * ib + 16, signed16(rows8(kiln_iq2s_grid, i[2] | (h << 4 & 0x300), i[3] | (h << 2 & 0x300)),
                                               signs[4 * ib + 2], signs[4 * ib + 3]));
    }
    odd_scales(u->sc, nibbles8(vld1_u8(x->scales)));
    u->d = kiln_fp16_to_fp32(x->d) * 0.125f;
}

static void unpack_iq3_xxs(const void *block, kiln_sb *u) {
    const block_iq3_xxs *x = block;
    const uint8_t *scales_and_signs = x->qs + QK_K / 4;
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *i = x->qs + 8 * ib;
        const uint32_t aux = u32_at(scales_and_signs + 4 * ib);
        for (int l = 0; l < 4; l += 2) /* groups l, l + 1: grid rows of 4 from indexes 2l .. 2l + 3 */
            store_u8(u->q + 32 * ib + 8 * l,
                     signed16(rows4x4(kiln_iq3xxs_grid, i[2 * l], i[2 * l + 1], i[2 * l + 2], i[2 * l + 3]),
                              kiln_ksigns_iq2xs[(aux >> (7 * l)) & 127],
                              kiln_ksigns_iq2xs[(aux >> (7 * l + 7)) & 127]));
        u->sc[2 * ib] = u->sc[2 * ib + 1] = (int16_t)(2 * (aux >> 28) + 1);
    }
    u->d = kiln_fp16_to_fp32(x->d) * 0.25f;
}

static void unpack_iq3_s(const void *block, kiln_sb *u) {
    const block_iq3_s *x = block;
    for (int ib = 0; ib < 8; ib++) { /* 8 grid rows of 4: 8 bits in qs, the ninth bit k of qh[ib] */
        const uint8_t *i = x->qs + 8 * ib;
        const unsigned h = x->qh[ib];
        for (int k = 0; k < 8; k += 4)
            store_u8(u->q + 32 * ib + 4 * k,
                     signed16(rows4x4(kiln_iq3s_grid, i[k] | (h << (8 - k) & 256), i[k + 1] | (h << (7 - k) & 256),
                                      i[k + 2] | (h << (6 - k) & 256), i[k + 3] | (h << (5 - k) & 256)),
                              x->signs[4 * ib + k / 2], x->signs[4 * ib + k / 2 + 1]));
    }
    for (int j = 0; j < QK_K / 16; j++) u->sc[j] = (int16_t)(2 * ((x->scales[j / 4] >> (4 * ((j / 2) % 2))) & 15) + 1);
    u->d = kiln_fp16_to_fp32(x->d);
}

/* IQ1: two groups of 8, q = 8 grid + delta (delta0 for the first, delta1 for the second) */
INLINE void iq1_pair(int8_t *q, unsigned i0, unsigned i1, int8_t delta0, int8_t delta1) {
    const int8x16_t g = vcombine_s8(vld1_s8(kiln_iq1s_grid[i0]), vld1_s8(kiln_iq1s_grid[i1]));
    vst1q_s8(q, vaddq_s8(vshlq_n_s8(g, 3), vcombine_s8(vdup_n_s8(delta0), vdup_n_s8(delta1))));
}

static void unpack_iq1_s(const void *block, kiln_sb *u) {
    const block_iq1_s *x = block;
    for (int ib = 0; ib < 8; ib++) {
        const unsigned qh = x->qh[ib];
        const uint8_t *i = x->qs + 4 * ib;
        const int8_t delta = qh & 0x8000 ? -1 : 1;
        iq1_pair(u->q + 32 * ib, i[0] | (qh & 7) << 8, i[1] | (qh >> 3 & 7) << 8, delta, delta);
        iq1_pair(u->q + 32 * ib + 16, i[2] | (qh >> 6 & 7) << 8, i[3] | (qh >> 9 & 7) << 8, delta, delta);
        u->sc[2 * ib] = u->sc[2 * ib + 1] = (int16_t)(2 * ((qh >> 12) & 7) + 1);
    }
    u->d = kiln_fp16_to_fp32(x->d) * 0.125f;
}

static void unpack_iq1_m(const void *block, kiln_sb *u) {
    const block_iq1_m *x = block;
    uint16_t sc[4];
    memcpy(sc, x->scales, sizeof sc);
    const kiln_half d = (kiln_half)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    for (int g = 0; g < QK_K / 8; g += 2) { /* a byte of qh a pair of groups: a nibble each, index bits 8..10
                                               and the delta's sign */
        const unsigned h = x->qh[g / 2];
        iq1_pair(u->q + 8 * g, x->qs[g] | (h & 7) << 8, x->qs[g + 1] | (h >> 4 & 7) << 8, h & 8 ? -1 : 1,
                 h & 0x80 ? -1 : 1);
    }
    for (int j = 0; j < QK_K / 16; j++) u->sc[j] = (int16_t)(2 * ((sc[j / 4] >> (3 * (j % 4))) & 7) + 1);
    u->d = kiln_fp16_to_fp32(d) * 0.125f;
}

/* TQ1_0: byte b's trit n is t = (m * 3) >> 8 for m = b 3^n mod 256: 0 below 86, 2 from 171. As a
   signed byte m - 128, q = t - 1 is -1 below -42, 1 above 42 (compares give -1 for true) */
INLINE void trits(int8_t *q, uint8x16_t m) {
    const int8x16_t s = vreinterpretq_s8_u8(veorq_u8(m, vdupq_n_u8(0x80)));
    vst1q_s8(q, vsubq_s8(vreinterpretq_s8_u8(vcltq_s8(s, vdupq_n_s8(-42))),
                         vreinterpretq_s8_u8(vcgtq_s8(s, vdupq_n_s8(42)))));
}

static void unpack_tq1_0(const void *block, kiln_sb *u) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    const block_tq1_0 *x = block;
    const uint8x16_t a0 = vld1q_u8(x->qs), a1 = vld1q_u8(x->qs + 16), b = vld1q_u8(x->qs + 32);
    for (int n = 0; n < 5; n++) { /* weights 32 n + j of the first 32 bytes, 160 + 16 n + j of the next 16 */
        const uint8x16_t p = vdupq_n_u8(pow3[n]);
        trits(u->q + 32 * n, vmulq_u8(a0, p)), trits(u->q + 32 * n + 16, vmulq_u8(a1, p));
        trits(u->q + 160 + 16 * n, vmulq_u8(b, p));
    }
    /* qh's 4 bytes of 4 trits: weights 240 + 4 n + j, qh in each of four words, word n times 3^n */
    const uint8x16_t h = vreinterpretq_u8_u32(vdupq_n_u32(u32_at(x->qh)));
    const uint8x16_t p = {1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27};
    trits(u->q + 240, vmulq_u8(h, p));
    vst1q_s16(u->sc, vdupq_n_s16(1)), vst1q_s16(u->sc + 8, vdupq_n_s16(1));
    u->d = kiln_fp16_to_fp32(x->d);
}

kiln_unpack_fn kiln_unpack_neon(int type) {
#define SB_CASE(name, t) case t: return unpack_##name;
    switch (type) { KILN_SB_TYPES(SB_CASE) default: return NULL; }
#undef SB_CASE
}
#endif
