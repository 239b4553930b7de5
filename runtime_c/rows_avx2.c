/* rows_avx2.c: matmuls on weights in the GGUF layout with AVX2, 8 weight rows a tile, each row's
 * value in one lane, so that every value comes out of the reference's arithmetic (ref_quant.c):
 * a block's 8 rows' integer sums are reduced across their lanes (exact), turned into floats and
 * fused into the rows' accumulators in block order, exactly as the scalar dot does one row.
 *
 * These serve the CPUs without AVX-512 VNNI (whose matmuls read the x8 copy, x8_vnni.c), and on
 * those, the matrices that are not packed (rows not a multiple of 8) and the builds run without
 * a packed file. Where the CPU has VNNI (AVX-VNNI, or AVX-512 VNNI at 256 bits), vpdpbusd takes
 * the byte products; else vpmaddubsw and vpmaddwd, whose 16-bit pair sums cannot overflow here
 * (|u| <= 31, or Q8_0's |q| <= 128, times |y| <= 127, twice).
 */
#include <string.h>

#include "fp16.h"
#include "quant_impl.h"
#include "vec_f32.h"

#ifdef KILN_HAVE_AVX2
#define INLINE static inline __attribute__((always_inline))
#define TILE_A 2 /* activation rows a tile takes with its 8 weight rows */
#define LUT_TILES_A 3 /* activation rows from which the table types' prefill interleaves its tiles */

/* 8 int32: each the sum of 4 adjacent products of unsigned bytes u and signed bytes s */
INLINE __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* lane r = the sum of v[r]'s 8 lanes */
INLINE __m256i reduce8_i32(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* 16 bytes of packed nibbles -> weights 0..15 from the low nibbles, 16..31 from the high */
INLINE __m256i nibbles(const uint8_t *qs) {
    const __m128i p = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), _mm256_set1_epi8(0x0F));
}

/* bit j of a 32-bit mask -> 0x10 in byte j, else 0 */
INLINE __m256i fifth_bits(const uint8_t *qh) {
    uint32_t bits;
    memcpy(&bits, qh, sizeof bits);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

/* the f16 at byte `at` of the tile's 8 rows (past nw, the last row's again), as 8 floats */
INLINE __m256 row_halves(const uint8_t *blk, size_t w_row, int nw, size_t at) {
    uint16_t h[8];
    for (int r = 0; r < 8; r++) memcpy(&h[r], blk + (r < nw ? r : nw - 1) * w_row + at, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* MXFP4's E8M0 scale at byte 0 of the tile's 8 rows, as 8 floats */
INLINE __m256 row_e8m0(const uint8_t *blk, size_t w_row, int nw) {
    float d[8];
    for (int r = 0; r < 8; r++) d[r] = kiln_e8m0_half(blk[(r < nw ? r : nw - 1) * w_row]);
    return _mm256_loadu_ps(d);
}

INLINE float half_at(const uint8_t *p) {
    kiln_half h;
    memcpy(&h, p, sizeof h);
    return kiln_fp16_to_fp32(h);
}

/* y[c * y_row + r] for the tile's rows r < nw (of 8: the rest repeat the last row and are not
 * stored) and activation rows c < A */
INLINE void store_tile(const int A, const __m256 out[], int nw, float *y, size_t y_row) {
    for (int c = 0; c < A; c++) {
        float v[8];
        _mm256_storeu_ps(v, out[c]);
        memcpy(y + c * y_row, v, (size_t)nw * sizeof(float));
    }
}

/* -- the 32-weight types: acc = fma(isum, d * y.d, acc); mins = fma(m, y.s, mins); acc + mins -- */
INLINE void tile_b32(const int type, const int A, int nb, const uint8_t *w, size_t w_row, int nw, const uint8_t *act,
                     size_t a_row, float *y, size_t y_row) {
    kiln_b32 f = {0};
    const int8_t *lut = kiln_lut_b32(type); /* IQ4_NL, MXFP4: nibbles index signed values */
    if (lut) kiln_lut_b32_of(type, &f);
    else kiln_b32_of(type, &f);
    const __m256i table = lut ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lut)) : _mm256_setzero_si256();
    const int is_signed = f.bits == 8 || lut;
    const size_t a_bytes = f.has_min ? sizeof(block_q8_1) : sizeof(block_q8_0), q_at = f.has_min ? 4 : 2;
    __m256 acc[TILE_A], mins[TILE_A];
    for (int c = 0; c < A; c++) acc[c] = mins[c] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * f.block_bytes;
        __m256i u[8];
        for (int r = 0; r < 8; r++) {
            const uint8_t *x = blk + (r < nw ? r : nw - 1) * w_row;
            if (f.bits == 8) u[r] = _mm256_loadu_si256((const __m256i *)(x + f.qs_at)); /* q, signed */
            else if (f.qh_at) u[r] = _mm256_or_si256(nibbles(x + f.qs_at), fifth_bits(x + f.qh_at));
            else if (lut) u[r] = _mm256_shuffle_epi8(table, nibbles(x + f.qs_at));
            else u[r] = nibbles(x + f.qs_at);
        }
        const __m256 d = type == KILN_MXFP4 ? row_e8m0(blk, w_row, nw) : row_halves(blk, w_row, nw, 0);
        const __m256 m = f.has_min ? row_halves(blk, w_row, nw, 2) : d;
        for (int c = 0; c < A; c++) {
            const uint8_t *ab = act + c * a_row + (size_t)b * a_bytes;
            const __m256i ys = _mm256_loadu_si256((const __m256i *)(ab + q_at));
            __m256i p[8];
            for (int r = 0; r < 8; r++)
                p[r] = is_signed ? dot_u8s8(_mm256_sign_epi8(u[r], u[r]), _mm256_sign_epi8(ys, u[r]))
                                   : dot_u8s8(u[r], ys);
            __m256i isum = reduce8_i32(p);
            if (f.offset && f.bits != 8) { /* sum((u - offset) y) = sum(u y) - offset sum(y) */
                const __m256i s = dot_u8s8(_mm256_set1_epi8(1), ys);
                __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
                t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
                t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
                isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(f.offset * _mm_cvtsi128_si32(t)));
            }
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(half_at(ab))), acc[c]);
            if (f.has_min) mins[c] = _mm256_fmadd_ps(m, _mm256_set1_ps(half_at(ab + 2)), mins[c]);
        }
    }
    __m256 out[TILE_A];
    for (int c = 0; c < A; c++) out[c] = _mm256_add_ps(acc[c], mins[c]);
    store_tile(A, out, nw, y, y_row);
}

/* -- the K-quants: acc = fma(isum, d * y.d, acc); mins = fma(msum, dmin * y.d, mins); acc - mins -- */

/* 8 int32 whose sum is a row's super-block isum: sum over sub-blocks of scale x sum(q y) */
INLINE __m256i kdot(const int type, const uint8_t *x, const block_q8_K *yb) {
    __m256i isum = _mm256_setzero_si256();
    if (type == KILN_Q6_K) {
        const block_q6_K *q = (const block_q6_K *)x;
        const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = q->ql + 64 * half, *qh = q->qh + 32 * half;
            const int8_t *sc = q->scales + 8 * half, *ys = yb->qs + 128 * half;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            for (int k = 0; k < 4; k++) { /* 32 weights: two sub-blocks of 16, each its own scale */
                const __m256i lo = _mm256_and_si256(k < 2 ? (k ? l1 : l0) : _mm256_srli_epi16(k == 2 ? l0 : l1, 4), m4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(h, 2 * k), m2);
                const __m256i s = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), off); /* q - 32 */
                const __m256i yk = _mm256_loadu_si256((const __m256i *)(ys + 32 * k));
                const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(s, s), _mm256_sign_epi8(yk, s));
                const __m256i scales = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(pairs, scales));
            }
        }
        return isum;
    }
    const size_t qs_at = type == KILN_Q5_K ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    int sc[8], mn[8];
    kiln_k4_scales(x + 4, sc, mn);
    const __m256i h = type == KILN_Q5_K ? _mm256_loadu_si256((const __m256i *)(x + offsetof(block_q5_K, qh)))
                                        : _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) { /* 32 bytes of qs: sub-block 2j in the low nibbles, 2j+1 in the high */
        const __m256i packed = _mm256_loadu_si256((const __m256i *)(x + qs_at + 32 * j));
        __m256i lo = _mm256_and_si256(packed, _mm256_set1_epi8(0x0F));
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), _mm256_set1_epi8(0x0F));
        if (type == KILN_Q5_K) { /* bit l / 32 of qh[l % 32] is weight l's fifth */
            const __m256i one = _mm256_set1_epi8(1);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * j), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * j + 1), one), 4));
        }
        const __m256i y0 = _mm256_loadu_si256((const __m256i *)(yb->qs + 64 * j));
        const __m256i y1 = _mm256_loadu_si256((const __m256i *)(yb->qs + 64 * j + 32));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), _mm256_set1_epi16((short)sc[2 * j])));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), _mm256_set1_epi16((short)sc[2 * j + 1])));
    }
    return isum;
}

/* a row's super-block msum: sum over sub-blocks of min x sum(y) */
INLINE int32_t kmins(const uint8_t *x, const block_q8_K *yb) {
    int sc[8], mn[8], s = 0;
    kiln_k4_scales(x + 4, sc, mn);
    for (int j = 0; j < 8; j++) s += mn[j] * (yb->bsums[2 * j] + yb->bsums[2 * j + 1]);
    return s;
}

INLINE void tile_k(const int type, int nb, const uint8_t *w, size_t w_row, int nw, const uint8_t *act, float *y) {
    const size_t bb = type == KILN_Q4_K ? sizeof(block_q4_K) : type == KILN_Q5_K ? sizeof(block_q5_K)
                                                                               : sizeof(block_q6_K);
    const size_t d_at = type == KILN_Q6_K ? offsetof(block_q6_K, d) : 0;
    __m256 acc = _mm256_setzero_ps(), mins = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const block_q8_K *yb = (const block_q8_K *)act + b;
        __m256i p[8];
        int32_t msum[8];
        float d[8], dmin[8];
        for (int r = 0; r < 8; r++) {
            const uint8_t *x = w + (r < nw ? r : nw - 1) * w_row + (size_t)b * bb;
            p[r] = kdot(type, x, yb);
            d[r] = half_at(x + d_at);
            if (type != KILN_Q6_K) msum[r] = kmins(x, yb), dmin[r] = half_at(x + 2);
        }
        const __m256 yd = _mm256_set1_ps(yb->d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8_i32(p)), _mm256_mul_ps(_mm256_loadu_ps(d), yd), acc);
        if (type != KILN_Q6_K)
            mins = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)msum)),
                                   _mm256_mul_ps(_mm256_loadu_ps(dmin), yd), mins);
    }
    const __m256 out = _mm256_sub_ps(acc, mins);
    store_tile(1, &out, nw, y, 0);
}

/* every (weight row, activation row) pair: tiles of 8 weight rows, TILE_A activation rows */
INLINE void rows(const int type, int n, const uint8_t *w, size_t w_row, int n_w, const uint8_t *act, size_t a_row,
                 int n_a, float *y, size_t y_row) {
    if (kiln_is_lut_b32(type) && n_a >= LUT_TILES_A && kiln_rows_lut_tiles(type, n, w, w_row, n_w, act, a_row, n_a, y, y_row))
        return;
    for (int r = 0; r < n_w; r += 8) {
        const int nw = n_w - r < 8 ? n_w - r : 8;
        const uint8_t *wr = w + r * w_row;
        if (kiln_is_kquant(type)) {
            for (int c = 0; c < n_a; c++) tile_k(type, n / QK_K, wr, w_row, nw, act + c * a_row, y + c * y_row + r);
            continue;
        }
        int c = 0;
        for (; c + TILE_A <= n_a; c += TILE_A)
            tile_b32(type, TILE_A, n / 32, wr, w_row, nw, act + c * a_row, a_row, y + c * y_row + r, y_row);
        for (; c < n_a; c++) tile_b32(type, 1, n / 32, wr, w_row, nw, act + c * a_row, a_row, y + c * y_row + r, y_row);
    }
}

#define ROWS_FOR(name, type)                                                                                     \
    void kiln_rows_##name##_avx2(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row,    \
                                 int n_a, float *y, size_t y_row) {                                             \
        rows(type, n, w, w_row, n_w, act, a_row, n_a, y, y_row);                                                 \
    }
ROWS_FOR(q4_0, KILN_Q4_0)
ROWS_FOR(q4_1, KILN_Q4_1)
ROWS_FOR(q5_0, KILN_Q5_0)
ROWS_FOR(q5_1, KILN_Q5_1)
ROWS_FOR(q8_0, KILN_Q8_0)
ROWS_FOR(q4_K, KILN_Q4_K)
ROWS_FOR(q5_K, KILN_Q5_K)
ROWS_FOR(q6_K, KILN_Q6_K)
ROWS_FOR(iq4_nl, KILN_IQ4_NL)
ROWS_FOR(mxfp4, KILN_MXFP4)

/* f32, f16 and bf16 rows: KILN_DOT16_REF's order (kiln_vdot*), four activation rows at a time
   sharing each weight row's loads (kiln_vdot*_x4: the same sums, bit for bit), and with AVX-512
   four weight rows at a time too (kiln_vdot*_4x4; rows past the last four, one at a time) */
#if defined(__AVX512F__)
#define ROWS_QUADS(T, dot44)                                                                        \
        for (; r + 4 <= n_w; r += 4) {                                                              \
            float out[4][4];                                                                        \
            dot44((const T *)((const uint8_t *)w + r * w_row), w_row / sizeof(T),                   \
                  (const float *)((const uint8_t *)act + c * a_row), a_row / sizeof(float), n, out); \
            for (int k = 0; k < 4; k++) memcpy(y + (c + k) * y_row + r, out[k], sizeof out[k]);    \
        }
#else
#define ROWS_QUADS(T, dot44)
#endif
#define ROWS_WIDE(suffix, T, dot, dot4, dot44)                                                     \
    void kiln_rows_##suffix##_avx2(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row, \
                                   int n_a, float *y, size_t y_row) {                               \
        int c = 0;                                                                                  \
        for (; c + 4 <= n_a; c += 4) {                                                              \
            int r = 0;                                                                              \
            ROWS_QUADS(T, dot44)                                                                    \
            for (; r < n_w; r++) {                                                                  \
                float out[4];                                                                       \
                dot4((const T *)((const uint8_t *)w + r * w_row), (const float *)((const uint8_t *)act + c * a_row), \
                     a_row / sizeof(float), n, out);                                                \
                for (int k = 0; k < 4; k++) y[(c + k) * y_row + r] = out[k];                        \
            }                                                                                       \
        }                                                                                           \
        for (; c < n_a; c++)                                                                        \
            for (int r = 0; r < n_w; r++)                                                           \
                y[c * y_row + r] = dot((const T *)((const uint8_t *)w + r * w_row),                 \
                                       (const float *)((const uint8_t *)act + c * a_row), n);        \
    }
ROWS_WIDE(f32, float, kiln_vdot, kiln_vdot_x4, kiln_vdot_4x4)
ROWS_WIDE(f16, uint16_t, kiln_vdot_f16, kiln_vdot_f16_x4, kiln_vdot_f16_4x4)
ROWS_WIDE(bf16, uint16_t, kiln_vdot_bf16, kiln_vdot_bf16_x4, kiln_vdot_bf16_4x4)
#endif
