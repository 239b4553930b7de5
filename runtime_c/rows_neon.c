/* rows_neon.c: matmuls on weights in the GGUF layout with NEON, for the 32-weight block types and
 * f32 (the K-quants are in kquant_neon.c): 4 weight rows a tile, each row's value in one lane, so
 * that every value comes out of the reference's arithmetic (ref_quant.c). A block's integer sums
 * are exact whatever computes them; then, lane by lane and in block order,
 *     acc = fma((float)isum, d * y.d, acc),  mins = fma(m, y.s, mins),  y = acc + mins,
 * as the scalar dot does one row.
 *
 * The byte products: sdot where the CPU has dotprod, else widening multiplies (neon.h); with
 * i8mm, a tile of two activation rows takes smmla, 2 weight rows x 2 activation rows at a time.
 * The weights are unpacked to signed bytes q = u - offset, so no product needs a correction.
 */
#include <string.h>

#include "neon.h"
#include "quant_impl.h"
#include "vec_f32.h"

#ifdef KILN_HAVE_NEON
#define INLINE KILN_NEON_INLINE
#define TILE_W 4 /* weight rows a tile: one float lane each */
#define TILE_A 2 /* activation rows a tile takes with them */

/* bit j of a 16-bit mask -> 0x10 in byte j, else 0 */
INLINE uint8x16_t fifth_bits(uint32_t bits) {
    const uint8x8_t b = vcreate_u8(bits);
    const uint8x16_t spread = vcombine_u8(vdup_lane_u8(b, 0), vdup_lane_u8(b, 1));
    const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ULL));
    return vandq_u8(vtstq_u8(spread, bit), vdupq_n_u8(0x10));
}

/* MXFP4's E8M0 scale at byte 0 of each of 4 rows, as 4 floats */
INLINE float32x4_t e8m0_4(const uint8_t *const x[4]) {
    const float d[4] = {kiln_e8m0_half(x[0][0]), kiln_e8m0_half(x[1][0]), kiln_e8m0_half(x[2][0]), kiln_e8m0_half(x[3][0])};
    return vld1q_f32(d);
}

/* a block's 32 weights as signed bytes q: weights 0..15 in lo, 16..31 in hi */
INLINE void block_weights(const kiln_b32 *f, const int8_t *lut, const uint8_t *x, int8x16_t *lo, int8x16_t *hi) {
    if (f->bits == 8) { /* Q8_0 stores q itself */
        *lo = vld1q_s8((const int8_t *)(x + f->qs_at));
        *hi = vld1q_s8((const int8_t *)(x + f->qs_at + 16));
        return;
    }
    const uint8x16_t p = vld1q_u8(x + f->qs_at);
    uint8x16_t l = vandq_u8(p, vdupq_n_u8(0x0F)), h = vshrq_n_u8(p, 4);
    if (lut) { /* IQ4_NL, MXFP4: the nibbles index signed values */
        const int8x16_t table = vld1q_s8(lut);
        *lo = vqtbl1q_s8(table, l);
        *hi = vqtbl1q_s8(table, h);
        return;
    }
    if (f->qh_at) {
        uint32_t bits;
        memcpy(&bits, x + f->qh_at, sizeof bits);
        l = vorrq_u8(l, fifth_bits(bits & 0xFFFF));
        h = vorrq_u8(h, fifth_bits(bits >> 16));
    }
    const int8x16_t off = vdupq_n_s8((int8_t)f->offset);
    *lo = vsubq_s8(vreinterpretq_s8_u8(l), off);
    *hi = vsubq_s8(vreinterpretq_s8_u8(h), off);
}

/* y[c * y_row + r] for the tile's rows r < nw (of 4: the rest repeat the last row and are not
 * stored) and activation rows c < A */
INLINE void tile_b32(const int type, const int A, int nb, const uint8_t *w, size_t w_row, int nw,
                     const uint8_t *act, size_t a_row, float *y, size_t y_row) {
    kiln_b32 f = {0};
    const int8_t *lut = kiln_lut_b32(type);
    if (lut) kiln_lut_b32_of(type, &f);
    else kiln_b32_of(type, &f);
    const size_t a_bytes = f.has_min ? sizeof(block_q8_1) : sizeof(block_q8_0), q_at = f.has_min ? 4 : 2;
    const int32x4_t zero = vdupq_n_s32(0);
    const uint8_t *x[TILE_W];
    for (int r = 0; r < TILE_W; r++) x[r] = w + (size_t)(r < nw ? r : nw - 1) * w_row;
    float32x4_t acc[TILE_A], mins[TILE_A];
    for (int c = 0; c < A; c++) acc[c] = mins[c] = vdupq_n_f32(0.0f);
    for (int b = 0; b < nb; b++) {
        const uint8_t *xb[TILE_W];
        int8x16_t lo[TILE_W], hi[TILE_W];
        for (int r = 0; r < TILE_W; r++) {
            xb[r] = x[r] + (size_t)b * f.block_bytes;
            block_weights(&f, lut, xb[r], &lo[r], &hi[r]);
        }
        const float32x4_t d = type == KILN_MXFP4 ? e8m0_4(xb) : kiln_halves4(xb, 0);
        const float32x4_t m = f.has_min ? kiln_halves4(xb, 2) : d;
        const uint8_t *ab[TILE_A];
        int8x16_t ylo[TILE_A], yhi[TILE_A];
        for (int c = 0; c < A; c++) {
            ab[c] = act + c * a_row + (size_t)b * a_bytes;
            ylo[c] = vld1q_s8((const int8_t *)(ab[c] + q_at));
            yhi[c] = vld1q_s8((const int8_t *)(ab[c] + q_at + 16));
        }
        int32x4_t isum[TILE_A];
#ifdef KILN_HAVE_I8MM
        if (A == 2) { /* [r0c0, r0c1, r1c0, r1c1] and the same of rows 2, 3; then one vector per c */
            int32x4_t p01 = kiln_mmla16(zero, lo[0], lo[1], ylo[0], ylo[1]);
            int32x4_t p23 = kiln_mmla16(zero, lo[2], lo[3], ylo[0], ylo[1]);
            p01 = kiln_mmla16(p01, hi[0], hi[1], yhi[0], yhi[1]), p23 = kiln_mmla16(p23, hi[2], hi[3], yhi[0], yhi[1]);
            isum[0] = vuzp1q_s32(p01, p23), isum[1] = vuzp2q_s32(p01, p23);
        } else
#endif
        {
            for (int c = 0; c < A; c++) {
                int32x4_t p[TILE_W];
                for (int r = 0; r < TILE_W; r++) p[r] = kiln_dot16(kiln_dot16(zero, lo[r], ylo[c]), hi[r], yhi[c]);
                isum[c] = kiln_reduce4(p[0], p[1], p[2], p[3]);
            }
        }
        for (int c = 0; c < A; c++) {
            acc[c] = vfmaq_f32(acc[c], vcvtq_f32_s32(isum[c]), vmulq_f32(d, vdupq_n_f32(kiln_half_at(ab[c]))));
            if (f.has_min) mins[c] = vfmaq_f32(mins[c], m, vdupq_n_f32(kiln_half_at(ab[c] + 2)));
        }
    }
    for (int c = 0; c < A; c++) kiln_store_rows(vaddq_f32(acc[c], mins[c]), nw, y + c * y_row);
}

/* every (weight row, activation row) pair: tiles of 4 weight rows and TILE_A activation rows */
INLINE void rows(const int type, int n, const uint8_t *w, size_t w_row, int n_w, const uint8_t *act, size_t a_row,
                 int n_a, float *y, size_t y_row) {
    for (int r = 0; r < n_w; r += TILE_W) {
        const int nw = n_w - r < TILE_W ? n_w - r : TILE_W;
        const uint8_t *wr = w + r * w_row;
        int c = 0;
        for (; c + TILE_A <= n_a; c += TILE_A)
            tile_b32(type, TILE_A, n / 32, wr, w_row, nw, act + c * a_row, a_row, y + c * y_row + r, y_row);
        for (; c < n_a; c++) tile_b32(type, 1, n / 32, wr, w_row, nw, act + c * a_row, a_row, y + c * y_row + r, y_row);
    }
}

#define ROWS_FOR(name, type)                                                                                     \
    void kiln_rows_##name##_neon(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row,    \
                                 int n_a, float *y, size_t y_row) {                                             \
        rows(type, n, w, w_row, n_w, act, a_row, n_a, y, y_row);                                                 \
    }
ROWS_FOR(q4_0, KILN_Q4_0)
ROWS_FOR(q4_1, KILN_Q4_1)
ROWS_FOR(q5_0, KILN_Q5_0)
ROWS_FOR(q5_1, KILN_Q5_1)
ROWS_FOR(q8_0, KILN_Q8_0)
ROWS_FOR(iq4_nl, KILN_IQ4_NL)
ROWS_FOR(mxfp4, KILN_MXFP4)

void kiln_rows_f32_neon(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row, int n_a,
                        float *y, size_t y_row) {
    for (int c = 0; c < n_a; c++)
        for (int r = 0; r < n_w; r++)
            y[c * y_row + r] = kiln_vdot((const float *)((const uint8_t *)w + r * w_row),
                                         (const float *)((const uint8_t *)act + c * a_row), n);
}
/* f16 and bf16 rows: KILN_DOT16_REF's order, 8 (or 4) converted at a time */
void kiln_rows_f16_neon(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row, int n_a,
                        float *y, size_t y_row) {
    for (int c = 0; c < n_a; c++)
        for (int r = 0; r < n_w; r++)
            y[c * y_row + r] = kiln_vdot_f16((const uint16_t *)((const uint8_t *)w + r * w_row),
                                             (const float *)((const uint8_t *)act + c * a_row), n);
}

void kiln_rows_bf16_neon(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row, int n_a,
                         float *y, size_t y_row) {
    for (int c = 0; c < n_a; c++)
        for (int r = 0; r < n_w; r++)
            y[c * y_row + r] = kiln_vdot_bf16((const uint16_t *)((const uint8_t *)w + r * w_row),
                                              (const float *)((const uint8_t *)act + c * a_row), n);
}
#endif
