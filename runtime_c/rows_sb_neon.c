/* rows_sb_neon.c: matmuls on the unpacked super-block types with NEON, 4 weight rows a tile, each
 * row's value in one float lane: rows_sb_avx2.c's scheme (one unpack of a tile's blocks for every
 * activation row of a step), with sdot where the target has it (neon.h). The integer sums are
 * exact; the float steps are the reference's (ref_sblock.c), lane by lane. */
#include <stdlib.h>

#include "neon.h"
#include "quant_impl.h"

#ifdef KILN_HAVE_NEON
#define INLINE KILN_NEON_INLINE
#define BUFFER_A 3 /* activation rows from which a tile's blocks are unpacked once for all of them */

/* 4 int32 whose sum is the block's isum: sum over sub-blocks j of sc[j] x sum(q y) */
INLINE int32x4_t sb_isum(const kiln_sb *u, const block_q8_K *y) {
    int32x4_t isum = vdupq_n_s32(0);
    for (int j = 0; j < QK_K / 16; j++) {
        const int32x4_t p = kiln_dot16(vdupq_n_s32(0), vld1q_s8(u->q + 16 * j), vld1q_s8(y->qs + 16 * j));
        isum = vmlaq_n_s32(isum, p, u->sc[j]);
    }
    return isum;
}

INLINE int32_t sb_msum(const kiln_sb *u, const block_q8_K *y) {
    const int16x8_t m0 = vld1q_s16(u->m), m1 = vld1q_s16(u->m + 8);
    const int16x8_t b0 = vld1q_s16(y->bsums), b1 = vld1q_s16(y->bsums + 8);
    int32x4_t s = vmull_s16(vget_low_s16(m0), vget_low_s16(b0));
    s = vmlal_high_s16(s, m0, b0);
    s = vmlal_s16(s, vget_low_s16(m1), vget_low_s16(b1));
    s = vmlal_high_s16(s, m1, b1);
    return vaddvq_s32(s);
}

INLINE void sb_block(const int has_min, const kiln_sb *const u[4], const block_q8_K *y, float32x4_t *acc,
                     float32x4_t *mins) {
    int32x4_t p[4];
    for (int r = 0; r < 4; r++) p[r] = sb_isum(u[r], y);
    const float d[4] = {u[0]->d, u[1]->d, u[2]->d, u[3]->d};
    const float32x4_t yd = vdupq_n_f32(y->d);
    *acc = vfmaq_f32(*acc, vcvtq_f32_s32(kiln_reduce4(p[0], p[1], p[2], p[3])), vmulq_f32(vld1q_f32(d), yd));
    if (has_min) {
        const int32_t msum[4] = {sb_msum(u[0], y), sb_msum(u[1], y), sb_msum(u[2], y), sb_msum(u[3], y)};
        const float dmin[4] = {u[0]->dmin, u[1]->dmin, u[2]->dmin, u[3]->dmin};
        *mins = vfmaq_f32(*mins, vcvtq_f32_s32(vld1q_s32(msum)), vmulq_f32(vld1q_f32(dmin), yd));
    }
}

INLINE void unpack_tile(kiln_unpack_fn unpack, const uint8_t *w, size_t w_row, int nw, size_t bb, int b, kiln_sb *u) {
    for (int r = 0; r < nw; r++) {
        u[r].dmin = 0.0f;
        memset(u[r].m, 0, sizeof u[r].m);
        unpack(w + (size_t)r * w_row + (size_t)b * bb, &u[r]);
    }
    for (int r = nw; r < 4; r++) u[r] = u[nw - 1];
}

static void rows_sb(const int type, int n, const uint8_t *w, size_t w_row, int n_w, const uint8_t *act, size_t a_row,
                    int n_a, float *y, size_t y_row) {
    const kiln_unpack_fn unpack = kiln_unpack_fast(type);
    const size_t bb = kiln_row_bytes(type, QK_K);
    const int nb = n / QK_K, has_min = type == KILN_Q2_K;
    kiln_sb *tile = n_a >= BUFFER_A ? malloc(sizeof(kiln_sb) * 4 * (size_t)nb) : NULL;
    kiln_sb one[4];
    for (int r0 = 0; r0 < n_w; r0 += 4) {
        const int nw = n_w - r0 < 4 ? n_w - r0 : 4;
        const uint8_t *wr = w + (size_t)r0 * w_row;
        if (tile) {
            for (int b = 0; b < nb; b++) unpack_tile(unpack, wr, w_row, nw, bb, b, tile + 4 * b);
            for (int c = 0; c < n_a; c++) {
                const block_q8_K *yc = (const block_q8_K *)(act + (size_t)c * a_row);
                float32x4_t acc = vdupq_n_f32(0.0f), mins = vdupq_n_f32(0.0f);
                for (int b = 0; b < nb; b++) {
                    const kiln_sb *u[4] = {tile + 4 * b, tile + 4 * b + 1, tile + 4 * b + 2, tile + 4 * b + 3};
                    sb_block(has_min, u, yc + b, &acc, &mins);
                }
                kiln_store_rows(vsubq_f32(acc, mins), nw, y + (size_t)c * y_row + r0);
            }
            continue;
        }
        for (int c0 = 0; c0 < n_a; c0 += BUFFER_A) { /* no buffer (a decode row, or no memory for one) */
            const int A = n_a - c0 < BUFFER_A ? n_a - c0 : BUFFER_A;
            float32x4_t acc[BUFFER_A], mins[BUFFER_A];
            for (int c = 0; c < A; c++) acc[c] = mins[c] = vdupq_n_f32(0.0f);
            for (int b = 0; b < nb; b++) {
                unpack_tile(unpack, wr, w_row, nw, bb, b, one);
                const kiln_sb *u[4];
                for (int r = 0; r < 4; r++) u[r] = one + r;
                for (int c = 0; c < A; c++)
                    sb_block(has_min, u, (const block_q8_K *)(act + (size_t)(c0 + c) * a_row) + b, &acc[c], &mins[c]);
            }
            for (int c = 0; c < A; c++) kiln_store_rows(vsubq_f32(acc[c], mins[c]), nw, y + (size_t)(c0 + c) * y_row + r0);
        }
    }
    free(tile);
}

#define ROWS_SB(name, type)                                                                                      \
    void kiln_rows_##name##_neon(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row,    \
                                 int n_a, float *y, size_t y_row) {                                             \
        rows_sb(type, n, w, w_row, n_w, act, a_row, n_a, y, y_row);                                              \
    }
KILN_SB_TYPES(ROWS_SB)
#endif
