/* ref_sblock.c: scalar references of the types llama.cpp added after the K-quants: Q2_K and Q3_K,
 * the i-quants, the ternary TQ1_0/TQ2_0, and the 32-weight table types IQ4_NL and MXFP4.
 *
 * Each 256-weight type is written once, as its unpacker: a super-block into kiln_sb's integers and
 * scales, read weight by weight as ggml's dequantize_row_* reads it. Dequantization and the dot
 * with q8_K are the same two loops for all of them (quant_impl.h gives the arithmetic), so a
 * type's SIMD path has one thing to equal: this unpacker's output.
 */
#include <math.h>
#include <string.h>

#include "fp16.h"
#include "quant_impl.h"

/* -- unpackers: weight i of sub-block j = i / 16 ------------------------------------------------ */

void kiln_unpack_q2_K(const void *block, kiln_sb *u) {
    const block_q2_K *x = block;
    for (int i = 0; i < QK_K; i++) /* halves of 128 use 32 bytes of qs, 2 bits a weight a quarter */
        u->q[i] = (int8_t)((x->qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3);
    for (int j = 0; j < QK_K / 16; j++) u->sc[j] = x->scales[j] & 15, u->m[j] = x->scales[j] >> 4;
    u->d = kiln_fp16_to_fp32(x->d), u->dmin = kiln_fp16_to_fp32(x->dmin);
}

void kiln_unpack_q3_K(const void *block, kiln_sb *u) {
    const block_q3_K *x = block;
    for (int i = 0; i < QK_K; i++) {
        const int low = (x->qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
        const int high = (x->hmask[i % 32] >> (i / 32)) & 1;
        u->q[i] = (int8_t)(low - (high ? 0 : 4));
    }
    for (int j = 0; j < QK_K / 16; j++) { /* 6 bits: the low 4 from bytes 0..7, the high 2 from 8..11 */
        const int low = (x->scales[j % 8] >> (4 * (j / 8))) & 15;
        const int high = (x->scales[8 + j % 4] >> (2 * (j / 4))) & 3;
        u->sc[j] = (int16_t)((low | high << 4) - 32), u->m[j] = 0;
    }
    u->d = kiln_fp16_to_fp32(x->d), u->dmin = 0.0f;
}

void kiln_unpack_iq4_xs(const void *block, kiln_sb *u) {
    const block_iq4_xs *x = block;
    for (int i = 0; i < QK_K; i++) {
        const uint8_t byte = x->qs[16 * (i / 32) + i % 16];
        u->q[i] = kiln_kvalues_iq4nl[(i % 32) < 16 ? byte & 15 : byte >> 4];
    }
    for (int j = 0; j < QK_K / 16; j++) {
        const int ib = j / 2;
        const int ls = ((x->scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | (((x->scales_h >> (2 * ib)) & 3) << 4);
        u->sc[j] = (int16_t)(ls - 32), u->m[j] = 0;
    }
    u->d = kiln_fp16_to_fp32(x->d), u->dmin = 0.0f;
}

/* weight k of a group of 8 takes bit k of its sign byte */
static inline int8_t signed_by(int magnitude, uint8_t signs, int k) {
    return (int8_t)(signs >> k & 1 ? -magnitude : magnitude);
}

void kiln_unpack_iq2_xxs(const void *block, kiln_sb *u) {
    const block_iq2_xxs *x = block;
    for (int ib = 0; ib < 8; ib++) {
        uint32_t aux[2];
        memcpy(aux, x->qs + 4 * ib, sizeof aux);
        for (int l = 0; l < 4; l++) {
            const uint8_t *grid = kiln_iq2xxs_grid[(aux[0] >> (8 * l)) & 255];
            const uint8_t signs = kiln_ksigns_iq2xs[(aux[1] >> (7 * l)) & 127];
            for (int k = 0; k < 8; k++) u->q[32 * ib + 8 * l + k] = signed_by(grid[k], signs, k);
        }
        u->sc[2 * ib] = u->sc[2 * ib + 1] = (int16_t)(2 * (aux[1] >> 28) + 1);
    }
    u->d = kiln_fp16_to_fp32(x->d) * 0.125f;
}

void kiln_unpack_iq2_xs(const void *block, kiln_sb *u) {
    const block_iq2_xs *x = block;
    for (int g = 0; g < QK_K / 8; g++) {
        const uint8_t *grid = kiln_iq2xs_grid[x->qs[g] & 511];
        const uint8_t signs = kiln_ksigns_iq2xs[x->qs[g] >> 9];
        for (int k = 0; k < 8; k++) u->q[8 * g + k] = signed_by(grid[k], signs, k);
    }
    for (int j = 0; j < QK_K / 16; j++) u->sc[j] = (int16_t)(2 * ((x->scales[j / 2] >> (4 * (j % 2))) & 15) + 1);
    u->d = kiln_fp16_to_fp32(x->d) * 0.125f;
}

void kiln_unpack_iq2_s(const void *block, kiln_sb *u) {
    const block_iq2_s *x = block;
    const uint8_t *signs = x->qs + QK_K / 8;
    for (int g = 0; g < QK_K / 8; g++) {
        const int ib = g / 4, l = g % 4;
        const uint8_t *grid = kiln_iq2s_grid[x->qs[g] | ((x->qh[ib] << (8 - 2 * l)) & 0x300)];
        for (int k = 0; k < 8; k++) u->q[8 * g + k] = signed_by(grid[k], signs[g], k);
    }
    for (int j = 0; j < QK_K / 16; j++) u->sc[j] = (int16_t)(2 * ((x->scales[j / 2] >> (4 * (j % 2))) & 15) + 1);
    u->d = kiln_fp16_to_fp32(x->d) * 0.125f;
}

void kiln_unpack_iq3_xxs(const void *block, kiln_sb *u) {
    const block_iq3_xxs *x = block;
    const uint8_t *scales_and_signs = x->qs + QK_K / 4;
    for (int ib = 0; ib < 8; ib++) {
        uint32_t aux;
        memcpy(&aux, scales_and_signs + 4 * ib, sizeof aux);
        for (int l = 0; l < 4; l++) {
            const uint8_t signs = kiln_ksigns_iq2xs[(aux >> (7 * l)) & 127];
            const uint8_t *g1 = kiln_iq3xxs_grid[x->qs[8 * ib + 2 * l]], *g2 = kiln_iq3xxs_grid[x->qs[8 * ib + 2 * l + 1]];
            for (int k = 0; k < 4; k++) {
                u->q[32 * ib + 8 * l + k] = signed_by(g1[k], signs, k);
                u->q[32 * ib + 8 * l + 4 + k] = signed_by(g2[k], signs, 4 + k);
            }
        }
        u->sc[2 * ib] = u->sc[2 * ib + 1] = (int16_t)(2 * (aux >> 28) + 1);
    }
    u->d = kiln_fp16_to_fp32(x->d) * 0.25f;
}

void kiln_unpack_iq3_s(const void *block, kiln_sb *u) {
    const block_iq3_s *x = block;
    for (int g = 0; g < QK_K / 8; g++) { /* a group of 8: two grid rows of 4, the ninth index bits in qh */
        const int ib = g / 4, l = g % 4;
        const uint8_t *g1 = kiln_iq3s_grid[x->qs[2 * g] | ((x->qh[ib] << (8 - 2 * l)) & 256)];
        const uint8_t *g2 = kiln_iq3s_grid[x->qs[2 * g + 1] | ((x->qh[ib] << (7 - 2 * l)) & 256)];
        for (int k = 0; k < 4; k++) {
            u->q[8 * g + k] = signed_by(g1[k], x->signs[g], k);
            u->q[8 * g + 4 + k] = signed_by(g2[k], x->signs[g], 4 + k);
        }
    }
    for (int j = 0; j < QK_K / 16; j++) u->sc[j] = (int16_t)(2 * ((x->scales[j / 4] >> (4 * ((j / 2) % 2))) & 15) + 1);
    u->d = kiln_fp16_to_fp32(x->d);
}

/* an IQ1 group of 8: 8 grid + 1 (delta +1/8) or 8 grid - 1 (delta -1/8), the 1/8 in d */
static inline void iq1_group(int8_t *q, int index, int minus) {
    for (int k = 0; k < 8; k++) q[k] = (int8_t)(8 * kiln_iq1s_grid[index][k] + (minus ? -1 : 1));
}

void kiln_unpack_iq1_s(const void *block, kiln_sb *u) {
    const block_iq1_s *x = block;
    for (int ib = 0; ib < 8; ib++) {
        const unsigned qh = x->qh[ib];
        for (int l = 0; l < 4; l++) iq1_group(u->q + 32 * ib + 8 * l, x->qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8),
                                              qh & 0x8000);
        u->sc[2 * ib] = u->sc[2 * ib + 1] = (int16_t)(2 * ((qh >> 12) & 7) + 1);
    }
    u->d = kiln_fp16_to_fp32(x->d) * 0.125f;
}

void kiln_unpack_iq1_m(const void *block, kiln_sb *u) {
    const block_iq1_m *x = block;
    uint16_t sc[4];
    memcpy(sc, x->scales, sizeof sc);
    const kiln_half d = (kiln_half)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    for (int g = 0; g < QK_K / 8; g++) { /* two groups a byte of qh: index bits 8..10 and the delta's sign */
        const int ib = g / 4, l = g % 4;
        const unsigned h = x->qh[2 * ib + l / 2] >> (4 * (l % 2));
        iq1_group(u->q + 8 * g, x->qs[g] | ((h & 7) << 8), h & 8);
    }
    for (int j = 0; j < QK_K / 16; j++) u->sc[j] = (int16_t)(2 * ((sc[j / 4] >> (3 * (j % 4))) & 7) + 1);
    u->d = kiln_fp16_to_fp32(d) * 0.125f;
}

/* TQ1_0: five trits a byte, as the byte's fraction of 256 in base 3: t = (byte * 3^n mod 256) * 3 / 256 */
static inline int8_t trit(uint8_t byte, int n) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    return (int8_t)((((uint8_t)(byte * pow3[n])) * 3 >> 8) - 1);
}

void kiln_unpack_tq1_0(const void *block, kiln_sb *u) {
    const block_tq1_0 *x = block;
    for (int n = 0; n < 5; n++)
        for (int m = 0; m < 32; m++) u->q[32 * n + m] = trit(x->qs[m], n);
    for (int n = 0; n < 5; n++)
        for (int m = 0; m < 16; m++) u->q[160 + 16 * n + m] = trit(x->qs[32 + m], n);
    for (int n = 0; n < 4; n++)
        for (int m = 0; m < 4; m++) u->q[240 + 4 * n + m] = trit(x->qh[m], n);
    for (int j = 0; j < QK_K / 16; j++) u->sc[j] = 1;
    u->d = kiln_fp16_to_fp32(x->d);
}

void kiln_unpack_tq2_0(const void *block, kiln_sb *u) {
    const block_tq2_0 *x = block;
    for (int i = 0; i < QK_K; i++) u->q[i] = (int8_t)(((x->qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3) - 1);
    for (int j = 0; j < QK_K / 16; j++) u->sc[j] = 1;
    u->d = kiln_fp16_to_fp32(x->d);
}

/* -- the two loops every unpacked type shares --------------------------------------------------- */

static void unpack_clean(kiln_unpack_fn unpack, const void *block, kiln_sb *u) {
    memset(u->m, 0, sizeof u->m), u->dmin = 0.0f; /* the types without a minimum leave them */
    unpack(block, u);
}

static void dequant_sb(kiln_unpack_fn unpack, size_t block_bytes, const uint8_t *src, float *dst, int n) {
    kiln_sb u;
    for (int b = 0; b < n / QK_K; b++, src += block_bytes, dst += QK_K) {
        unpack_clean(unpack, src, &u);
        for (int i = 0; i < QK_K; i++) {
            const float w = u.d * u.sc[i / 16] * u.q[i];
            dst[i] = u.m[i / 16] ? w - u.dmin * u.m[i / 16] : w;
        }
    }
}

static float dot_sb(kiln_unpack_fn unpack, size_t block_bytes, const uint8_t *w, const block_q8_K *y, int n) {
    float acc = 0.0f, mins = 0.0f;
    kiln_sb u;
    for (int b = 0; b < n / QK_K; b++, w += block_bytes) {
        unpack_clean(unpack, w, &u);
        int isum = 0, msum = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += u.q[16 * j + i] * y[b].qs[16 * j + i];
            isum += u.sc[j] * s;
            msum += u.m[j] * y[b].bsums[j];
        }
        acc = fmaf((float)isum, u.d * y[b].d, acc);
        mins = fmaf((float)msum, u.dmin * y[b].d, mins);
    }
    return acc - mins;
}

#define SB_REFS(name, type)                                                                                        \
    void kiln_ref_dequant_##name(const void *src, float *dst, int n) {                                           \
        dequant_sb(kiln_unpack_##name, sizeof(block_##name), src, dst, n);                                         \
    }                                                                                                            \
    float kiln_ref_dot_##name(int n, const void *w, const void *act) {                                          \
        return dot_sb(kiln_unpack_##name, sizeof(block_##name), w, act, n);                                        \
    }
KILN_SB_TYPES(SB_REFS)

int kiln_is_sb(int type) { return kiln_unpack_ref(type) != NULL; }

kiln_unpack_fn kiln_unpack_ref(int type) {
#define SB_CASE(name, t) case t: return kiln_unpack_##name;
    switch (type) { KILN_SB_TYPES(SB_CASE) default: return NULL; }
#undef SB_CASE
}

/* -- IQ4_NL and MXFP4: Q4_0's dot with a table for the nibbles ---------------------------------- */

static inline float lut_scale(int type, const uint8_t *block) {
    kiln_half h;
    memcpy(&h, block, sizeof h);
    return type == KILN_MXFP4 ? kiln_e8m0_half(block[0]) : kiln_fp16_to_fp32(h);
}

static void dequant_lut(int type, const uint8_t *src, float *dst, int n) {
    const size_t bytes = type == KILN_MXFP4 ? sizeof(block_mxfp4) : sizeof(block_iq4_nl);
    const size_t qs_at = type == KILN_MXFP4 ? offsetof(block_mxfp4, qs) : offsetof(block_iq4_nl, qs);
    const int8_t *lut = kiln_lut_b32(type);
    for (int b = 0; b < n / 32; b++, src += bytes, dst += 32) {
        const float d = lut_scale(type, src);
        for (int i = 0; i < 16; i++) dst[i] = d * lut[src[qs_at + i] & 15], dst[i + 16] = d * lut[src[qs_at + i] >> 4];
    }
}

static float dot_lut(int type, const uint8_t *w, const block_q8_0 *y, int n) {
    const size_t bytes = type == KILN_MXFP4 ? sizeof(block_mxfp4) : sizeof(block_iq4_nl);
    const size_t qs_at = type == KILN_MXFP4 ? offsetof(block_mxfp4, qs) : offsetof(block_iq4_nl, qs);
    const int8_t *lut = kiln_lut_b32(type);
    float acc = 0.0f;
    for (int b = 0; b < n / 32; b++, w += bytes) {
        int isum = 0;
        for (int i = 0; i < 16; i++)
            isum += lut[w[qs_at + i] & 15] * y[b].qs[i] + lut[w[qs_at + i] >> 4] * y[b].qs[i + 16];
        acc = fmaf((float)isum, lut_scale(type, w) * kiln_fp16_to_fp32(y[b].d), acc);
    }
    return acc;
}

void kiln_ref_dequant_iq4_nl(const void *src, float *dst, int n) { dequant_lut(KILN_IQ4_NL, src, dst, n); }
void kiln_ref_dequant_mxfp4(const void *src, float *dst, int n) { dequant_lut(KILN_MXFP4, src, dst, n); }
float kiln_ref_dot_iq4_nl(int n, const void *w, const void *act) { return dot_lut(KILN_IQ4_NL, w, act, n); }
float kiln_ref_dot_mxfp4(int n, const void *w, const void *act) { return dot_lut(KILN_MXFP4, w, act, n); }
