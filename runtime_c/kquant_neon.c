/* kquant_neon.c: matmuls on the K-quant types (Q4_K, Q5_K, Q6_K) in the GGUF layout with NEON, 4
 * weight rows a tile, each row's value in one lane. A super-block's integer sums are exact whatever
 * computes them (sub-block sums times their scales, the minimums' sums); then, lane by lane and in
 * super-block order, the reference's float steps (ref_kquant.c):
 *     acc = fma((float)isum, d * y.d, acc),  mins = fma((float)msum, dmin * y.d, mins),  acc - mins.
 *
 * A super-block is read as 8 chunks of 32 weights, each two sub-blocks of 16 with a scale apiece
 * (Q4_K and Q5_K give both halves of a chunk the scale of their sub-block of 32). With i8mm, a
 * tile of two activation rows takes smmla, 2 weight rows x 2 activation rows at a time.
 */
#include <stddef.h>
#include <string.h>

#include "neon.h"
#include "quant_impl.h"

#ifdef KILN_HAVE_NEON
#define INLINE KILN_NEON_INLINE
#define TILE_W 4
#define TILE_A 2

/* v >> s for a shift known once the chunk loop is unrolled */
INLINE uint8x16_t shr(uint8x16_t v, int s) { return vshlq_u8(v, vdupq_n_s8((int8_t)-s)); }

/* chunk k (weights 32k .. 32k+31) of a super-block as signed bytes: the first 16 in w[0] */
INLINE void chunk_weights(const int type, const uint8_t *x, int k, int8x16_t w[2]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    if (type == KILN_Q6_K) { /* halves of 128: 64 bytes of ql (low nibbles, then high), 32 of qh */
        const int half = k / 4, quarter = k % 4;
        const uint8_t *ql = x + offsetof(block_q6_K, ql) + 64 * half + 32 * (quarter % 2);
        const uint8_t *qh = x + offsetof(block_q6_K, qh) + 32 * half;
        for (int i = 0; i < 2; i++) {
            const uint8x16_t l = vld1q_u8(ql + 16 * i), h = vld1q_u8(qh + 16 * i);
            const uint8x16_t low = quarter < 2 ? vandq_u8(l, m4) : vshrq_n_u8(l, 4);
            const uint8x16_t high = vandq_u8(shr(h, 2 * quarter), vdupq_n_u8(3));
            w[i] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, vshlq_n_u8(high, 4))), vdupq_n_s8(32));
        }
        return;
    }
    /* Q4_K, Q5_K: groups of 64 share 32 bytes of qs, low nibbles first; Q5_K's fifth bit of
     * weight l is bit l / 32 of qh[l % 32] */
    const size_t qs_at = type == KILN_Q5_K ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    for (int i = 0; i < 2; i++) {
        const uint8x16_t p = vld1q_u8(x + qs_at + 32 * (k / 2) + 16 * i);
        uint8x16_t u = k % 2 ? vshrq_n_u8(p, 4) : vandq_u8(p, m4);
        if (type == KILN_Q5_K) {
            const uint8x16_t h = vld1q_u8(x + offsetof(block_q5_K, qh) + 16 * i);
            u = vorrq_u8(u, vshlq_n_u8(vandq_u8(shr(h, k), vdupq_n_u8(1)), 4));
        }
        w[i] = vreinterpretq_s8_u8(u);
    }
}

/* one weight row's super-block head: d, dmin, the scale of each sub-block of 16, and (Q4_K, Q5_K)
 * the minimums of its 8 sub-blocks of 32 */
typedef struct {
    float d, dmin;
    int32_t sc[16], mn[8];
} k_head;

INLINE void read_head(const int type, const uint8_t *x, k_head *h) {
    if (type == KILN_Q6_K) {
        const block_q6_K *q = (const block_q6_K *)x;
        h->d = kiln_fp16_to_fp32(q->d), h->dmin = 0.0f;
        for (int j = 0; j < 16; j++) h->sc[j] = q->scales[j];
        return;
    }
    int sc[8];
    kiln_k4_scales(x + 4, sc, h->mn);
    for (int j = 0; j < 8; j++) h->sc[2 * j] = h->sc[2 * j + 1] = sc[j];
    h->d = kiln_half_at(x), h->dmin = kiln_half_at(x + 2);
}

/* 4 int32 whose sum is a row's super-block isum: sum over sub-blocks of scale x sum(q y) */
INLINE int32x4_t kdot(const int type, const uint8_t *x, const k_head *h, const block_q8_K *yb) {
    int32x4_t isum = vdupq_n_s32(0);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        int8x16_t w[2];
        chunk_weights(type, x, k, w);
        for (int i = 0; i < 2; i++)
            isum = vmlaq_n_s32(isum, kiln_dot16(vdupq_n_s32(0), w[i], vld1q_s8(yb->qs + 32 * k + 16 * i)),
                               h->sc[2 * k + i]);
    }
    return isum;
}

#ifdef KILN_HAVE_I8MM
/* [r0c0, r0c1, r1c0, r1c1]: the super-block isums of weight rows x0, x1 with activation rows y0, y1 */
INLINE int32x4_t kdot2x2(const int type, const uint8_t *x0, const uint8_t *x1, const k_head *h0, const k_head *h1,
                         const block_q8_K *y0, const block_q8_K *y1) {
    int32x4_t isum = vdupq_n_s32(0);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        int8x16_t a[2], b[2];
        chunk_weights(type, x0, k, a);
        chunk_weights(type, x1, k, b);
        for (int i = 0; i < 2; i++) {
            const int j = 2 * k + i;
            const int8x16_t c0 = vld1q_s8(y0->qs + 16 * j), c1 = vld1q_s8(y1->qs + 16 * j);
            const int32x4_t p = kiln_mmla16(vdupq_n_s32(0), a[i], b[i], c0, c1);
            const int32_t s[4] = {h0->sc[j], h0->sc[j], h1->sc[j], h1->sc[j]};
            isum = vmlaq_s32(isum, p, vld1q_s32(s));
        }
    }
    return isum;
}
#endif

/* a row's super-block msum: sum over sub-blocks of min x sum(y) */
INLINE int32_t kmins(const k_head *h, const block_q8_K *yb) {
    int32_t s = 0;
    for (int j = 0; j < 8; j++) s += h->mn[j] * (yb->bsums[2 * j] + yb->bsums[2 * j + 1]);
    return s;
}

INLINE float32x4_t lanes(const float v[TILE_W]) { return vld1q_f32(v); }

/* y[c * y_row + r] for the tile's rows r < nw (of 4; the rest repeat the last row and are not
 * stored) and activation rows c < A */
INLINE void tile_k(const int type, const int A, int nb, const uint8_t *w, size_t w_row, int nw, const uint8_t *act,
                   size_t a_row, float *y, size_t y_row) {
    const size_t bb = type == KILN_Q4_K ? sizeof(block_q4_K) : type == KILN_Q5_K ? sizeof(block_q5_K)
                                                                               : sizeof(block_q6_K);
    float32x4_t acc[TILE_A], mins[TILE_A];
    for (int c = 0; c < A; c++) acc[c] = mins[c] = vdupq_n_f32(0.0f);
    for (int b = 0; b < nb; b++) {
        const uint8_t *x[TILE_W];
        k_head h[TILE_W];
        float d[TILE_W], dmin[TILE_W];
        for (int r = 0; r < TILE_W; r++) {
            x[r] = w + (size_t)(r < nw ? r : nw - 1) * w_row + (size_t)b * bb;
            read_head(type, x[r], &h[r]);
            d[r] = h[r].d, dmin[r] = h[r].dmin;
        }
        const block_q8_K *yb[TILE_A];
        for (int c = 0; c < A; c++) yb[c] = (const block_q8_K *)(act + c * a_row) + b;
        int32x4_t isum[TILE_A];
#ifdef KILN_HAVE_I8MM
        if (A == 2) {
            const int32x4_t p01 = kdot2x2(type, x[0], x[1], &h[0], &h[1], yb[0], yb[1]);
            const int32x4_t p23 = kdot2x2(type, x[2], x[3], &h[2], &h[3], yb[0], yb[1]);
            isum[0] = vuzp1q_s32(p01, p23), isum[1] = vuzp2q_s32(p01, p23);
        } else
#endif
        {
            for (int c = 0; c < A; c++)
                isum[c] = kiln_reduce4(kdot(type, x[0], &h[0], yb[c]), kdot(type, x[1], &h[1], yb[c]),
                                       kdot(type, x[2], &h[2], yb[c]), kdot(type, x[3], &h[3], yb[c]));
        }
        for (int c = 0; c < A; c++) {
            const float32x4_t yd = vdupq_n_f32(yb[c]->d);
            acc[c] = vfmaq_f32(acc[c], vcvtq_f32_s32(isum[c]), vmulq_f32(lanes(d), yd));
            if (type != KILN_Q6_K) {
                const int32_t ms[TILE_W] = {kmins(&h[0], yb[c]), kmins(&h[1], yb[c]), kmins(&h[2], yb[c]),
                                            kmins(&h[3], yb[c])};
                mins[c] = vfmaq_f32(mins[c], vcvtq_f32_s32(vld1q_s32(ms)), vmulq_f32(lanes(dmin), yd));
            }
        }
    }
    for (int c = 0; c < A; c++)
        kiln_store_rows(type == KILN_Q6_K ? acc[c] : vsubq_f32(acc[c], mins[c]), nw, y + c * y_row);
}

/* every (weight row, activation row) pair: tiles of 4 weight rows and, with i8mm, 2 activation
 * rows (without it, a tile's second activation row would only reread the weights' registers) */
INLINE void rows(const int type, int n, const uint8_t *w, size_t w_row, int n_w, const uint8_t *act, size_t a_row,
                 int n_a, float *y, size_t y_row) {
#ifdef KILN_HAVE_I8MM
    const int pair = TILE_A;
#else
    const int pair = 1;
#endif
    for (int r = 0; r < n_w; r += TILE_W) {
        const int nw = n_w - r < TILE_W ? n_w - r : TILE_W;
        const uint8_t *wr = w + r * w_row;
        int c = 0;
        for (; pair == 2 && c + 2 <= n_a; c += 2)
            tile_k(type, 2, n / QK_K, wr, w_row, nw, act + c * a_row, a_row, y + c * y_row + r, y_row);
        for (; c < n_a; c++) tile_k(type, 1, n / QK_K, wr, w_row, nw, act + c * a_row, a_row, y + c * y_row + r, y_row);
    }
}

#define ROWS_FOR(name, type)                                                                                     \
    void kiln_rows_##name##_neon(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row,    \
                                 int n_a, float *y, size_t y_row) {                                             \
        rows(type, n, w, w_row, n_w, act, a_row, n_a, y, y_row);                                                 \
    }
ROWS_FOR(q4_K, KILN_Q4_K)
ROWS_FOR(q5_K, KILN_Q5_K)
ROWS_FOR(q6_K, KILN_Q6_K)
#endif
