/* rows_lut_avx2.c: prefill of the 32-weight table types (IQ4_NL, MXFP4) where the CPU has VNNI,
 * in rows_sb_avx2.c's interleaved tiles. A tile of T weight rows is looked up once (the table's
 * signed values) into a copy that holds 4 weights of each row in turn, so that one vpdpbusd
 * against 4 activation bytes broadcast gives all T rows' partial sums. vpdpbusd takes the
 * activations as unsigned bytes, y + 128 (y ^ 0x80), against the signed weights, and each row's
 * sum starts from -128 times its block's weight sum, found once with the tile: an activation row
 * then costs 8 vpdpbusd a block, no sign trick and no reduction across lanes (rows_avx2.c's
 * tile_b32, which decode keeps). The integer sums are exact, and the floats are the reference's
 * (ref_sblock.c's dot_lut), lane by lane: acc = fma(isum, d * y.d, acc).
 */
#include <string.h>

#include "fp16.h"
#include "quant_impl.h"
#include "tile_avx2.h"

#if defined(KILN_HAVE_AVX2) && defined(TILE_VNNI)

/* one block of a tile's T rows: row r's weights 4k..4k+3 at q[k][4r..4r+4), signed */
typedef struct {
    int8_t q[QK4_0 / 4][4 * T];
    int32_t seed[T]; /* -128 x the row's weight sum */
    float d[T];
} lut_tile;
_Static_assert(sizeof(lut_tile) % 64 == 0, "tiles stay 64-byte aligned in their buffer");

INLINE float half_at(const uint8_t *p) {
    kiln_half h;
    memcpy(&h, p, sizeof h);
    return kiln_fp16_to_fp32(h);
}

/* one block of rows [0, nw) (w, w_row apart; past nw the last row again) into t */
INLINE void build_tile(const int type, const __m256i table, const uint8_t *w, size_t w_row, int nw, lut_tile *t) {
    const size_t qs_at = type == KILN_MXFP4 ? offsetof(block_mxfp4, qs) : offsetof(block_iq4_nl, qs);
    for (int h = 0; h < T / 8; h++) {
        __m256i v[8];
        for (int i = 0; i < 8; i++) {
            const int r = 8 * h + i;
            const uint8_t *x = w + (size_t)(r < nw ? r : nw - 1) * w_row;
            const __m128i p = _mm_loadu_si128((const __m128i *)(x + qs_at)); /* weights j, j + 16 */
            const __m256i nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), _mm256_set1_epi8(0x0F));
            v[i] = _mm256_shuffle_epi8(table, nibbles);
            const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v[i]), _mm256_set1_epi16(1));
            __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(1, 0, 3, 2)));
            sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(2, 3, 0, 1)));
            t->seed[r] = -128 * _mm_cvtsi128_si32(sum);
            t->d[r] = type == KILN_MXFP4 ? kiln_e8m0_half(x[0]) : half_at(x);
        }
        transpose8(v);
        for (int k = 0; k < QK4_0 / 4; k++) _mm256_storeu_si256((__m256i *)(t->q[k] + 32 * h), v[k]);
    }
}

/* activation rows [0, A) (a_row apart) against a tile's T rows over its nb blocks, into y */
INLINE void lut_gemm(const int A, const lut_tile *tile, int nb, const uint8_t *act, size_t a_row, float *y,
                     size_t y_row, int nw) {
    vf acc[A_MAX]; /* A_MAX, not A: a constant bound keeps them in registers */
    for (int c = 0; c < A; c++) acc[c] = V(setzero_ps)();
    for (int b = 0; b < nb; b++) {
        const lut_tile *t = tile + b;
        const block_q8_0 *yb[A_MAX];
        vi s[A_MAX];
        const vi seed = vload(t->seed);
        for (int c = 0; c < A; c++) yb[c] = (const block_q8_0 *)(act + (size_t)c * a_row) + b, s[c] = seed;
#pragma GCC unroll 8
        for (int k = 0; k < QK4_0 / 4; k++) {
            const vi wk = vload(t->q[k]);
            for (int c = 0; c < A; c++)
                s[c] = vdpbusd(s[c], V(set1_epi32)((int32_t)((uint32_t)ld32(yb[c]->qs + 4 * k) ^ 0x80808080u)), wk);
        }
        const vf d = V(loadu_ps)(t->d);
        for (int c = 0; c < A; c++)
            acc[c] = V(fmadd_ps)(V(cvtepi32_ps)(s[c]), V(mul_ps)(d, V(set1_ps)(half_at((const uint8_t *)&yb[c]->d))), acc[c]);
    }
    for (int c = 0; c < A; c++) store_outputs(y + (size_t)c * y_row, acc[c], nw);
}

int kiln_rows_lut_tiles(int type, int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row, int n_a,
                        float *y, size_t y_row) {
    const int nb = n / QK4_0;
    lut_tile *tile = kiln_is_lut_b32(type) ? tile_buffer(sizeof(lut_tile) * (size_t)nb) : NULL;
    if (!tile) return 0;
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kiln_lut_b32(type)));
    const size_t bb = type == KILN_MXFP4 ? sizeof(block_mxfp4) : sizeof(block_iq4_nl);
    const uint8_t *wb = w, *ab = act;
    for (int r0 = 0; r0 < n_w; r0 += T) {
        const int nw = n_w - r0 < T ? n_w - r0 : T;
        for (int b = 0; b < nb; b++) build_tile(type, table, wb + (size_t)r0 * w_row + (size_t)b * bb, w_row, nw, tile + b);
        int c = 0;
#define PASS(A) lut_gemm(A, tile, nb, ab + (size_t)c * a_row, a_row, y + (size_t)c * y_row + r0, y_row, nw), c += A
        TILE_PASSES(n_a, c, PASS);
#undef PASS
    }
    return 1;
}
#else
int kiln_rows_lut_tiles(int type, int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row, int n_a,
                        float *y, size_t y_row) {
    (void)type, (void)n, (void)w, (void)w_row, (void)n_w, (void)act, (void)a_row, (void)n_a, (void)y, (void)y_row;
    return 0;
}
#endif
