/* gemm_vnni.c: register-tiled products of weight rows in the GGUF layout with activation rows,
 * on AVX-512 VNNI at 256-bit width (32 registers). Matmuls whose weights are packed read the
 * x8 layout instead (pack_x8.c); these tiles serve the K-quants, matrices whose rows are not
 * whole groups of 8, and builds run without a packed file.
 *
 * A tile is R weight rows x C activation rows: each weight block is widened once to 32
 * unsigned bytes u and reused for C activation rows, each activation block is loaded once
 * and reused for R weight rows. A weight is w = d * (u - o) (Q4_0 o = 8, Q5_0 o = 16, Q8_0
 * stored as u = q ^ 0x80, o = 128) or w = d * u + m (Q4_1, Q5_1). One vpdpbusd per block pair
 * computes sum(u * y); the offset term -o * sum(y) is computed once per activation block
 * and seeds the accumulator. The integer block sums are therefore exactly those of the
 * scalar twins in quant.c; only the float accumulation order differs.
 *
 * One activation row (decode) is the C = 1 case: four weight rows stream side by side.
 *
 * The K-quants (Q4_K, Q6_K; 256-weight super-blocks against q8_K) tile the same way with
 * int16 arithmetic: vpmaddubsw pairs 32 weights with 32 activations, vpdpwssd multiplies
 * the pair sums by their sub-block's scale and accumulates; the min (Q4_K) or offset (Q6_K)
 * term comes from q8_K's per-16 sums with one vpmaddwd.
 */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#include <immintrin.h>
#include <string.h>

#include "fp16.h"
#include "kernels.h"
#include "quant_impl.h"
#include "simd_f32.h"

#define INLINE static inline __attribute__((always_inline))
#define TILE_R 4
#define TILE_C 4

typedef struct {
    __m256i u; /* 32 unsigned bytes */
    float d, m;
} wblock;

typedef struct {
    __m256i q; /* 32 signed bytes */
    float d, s; /* s = d * sum(q) for q8_1 */
} ablock;

/* 16 bytes of packed nibbles -> weights 0..15 from the low nibbles, 16..31 from the high */
INLINE __m256i nibbles(const uint8_t *qs) {
    const __m128i p = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), _mm256_set1_epi8(0x0F));
}

/* bit j of qh -> 0x10 in byte j */
INLINE __m256i fifth_bits(const uint8_t qh[4]) {
    uint32_t bits;
    memcpy(&bits, qh, sizeof bits);
    return _mm256_maskz_mov_epi8(bits, _mm256_set1_epi8(0x10));
}

INLINE kiln_b32 b32(const int type) {
    kiln_b32 f = {0};
    kiln_b32_of(type, &f);
    return f;
}

INLINE wblock load_w(const int type, const uint8_t *row, int b) {
    const kiln_b32 f = b32(type);
    const uint8_t *blk = row + (size_t)b * f.block_bytes;
    kiln_half h[2];
    memcpy(h, blk, sizeof h); /* d, then m (or the first bytes that follow d: unused) */
    __m256i u;
    if (f.bits == 8)
        u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + f.qs_at)), _mm256_set1_epi8((char)0x80));
    else
        u = f.qh_at ? _mm256_or_si256(nibbles(blk + f.qs_at), fifth_bits(blk + f.qh_at)) : nibbles(blk + f.qs_at);
    return (wblock){u, kiln_fp16_to_fp32(h[0]), f.has_min ? kiln_fp16_to_fp32(h[1]) : 0.0f};
}

INLINE ablock load_a(const int type, const uint8_t *row, int b) {
    if (b32(type).has_min) {
        const block_q8_1 *y = (const block_q8_1 *)row + b;
        return (ablock){_mm256_loadu_si256((const __m256i *)y->qs), kiln_fp16_to_fp32(y->d),
                        kiln_fp16_to_fp32(y->s)};
    }
    const block_q8_0 *y = (const block_q8_0 *)row + b;
    return (ablock){_mm256_loadu_si256((const __m256i *)y->qs), kiln_fp16_to_fp32(y->d), 0.0f};
}

/* y[c * y_row + r] = W[r] . act[c] for r < R, c < C; R and C are constants after inlining.
 * When streaming (C = 1, decode) the R rows are adjacent in memory but read side by side,
 * which the hardware prefetcher follows poorly: each block step prefetches its share of the
 * next tile's bytes (doubles decode speed). Wider tiles reuse weights already in cache. */
INLINE void tile(const int type, const int R, const int C, int nb, const uint8_t *w, size_t w_row,
                 const uint8_t *a, size_t a_row, float *y, size_t y_row) {
    const uint8_t *next = w + R * w_row;
    const size_t step = R * b32(type).block_bytes;
    __m256 acc[TILE_R][TILE_C];
    float mins[TILE_R][TILE_C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps(), mins[r][c] = 0.0f;
    const __m256i offset = _mm256_set1_epi8((char)b32(type).offset);
    for (int b = 0; b < nb; b++) {
        if (C == 1)
            for (size_t off = 0; off < step; off += 64) _mm_prefetch((const char *)next + b * step + off, _MM_HINT_T0);
        wblock wb[TILE_R];
        for (int r = 0; r < R; r++) wb[r] = load_w(type, w + r * w_row, b);
        for (int c = 0; c < C; c++) {
            const ablock ab = load_a(type, a + c * a_row, b);
            const __m256i seed = b32(type).offset
                ? _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), offset, ab.q))
                : _mm256_setzero_si256();
            for (int r = 0; r < R; r++) {
                const __m256 sum = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(seed, wb[r].u, ab.q));
                acc[r][c] = _mm256_fmadd_ps(sum, _mm256_set1_ps(wb[r].d * ab.d), acc[r][c]);
                if (b32(type).has_min) mins[r][c] += wb[r].m * ab.s;
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[c * y_row + r] = kiln_hsum8(acc[r][c]) + mins[r][c];
}

/* ---- K-quants ------------------------------------------------------------------------------ */

typedef struct {
    float d, dc;          /* the scale of the integer sum, and of the bsums term */
    __m256i coef;         /* 16 x int16: the bsums term is sum(coef[i] * bsums[i]) */
    uint8_t sc[8];        /* Q4_K: scale of each sub-block of 32 */
    const int8_t *sc16;   /* Q6_K: scale of each sub-block of 16 */
} khead;

INLINE khead load_khead(const int type, const uint8_t *row, int b) {
    khead h;
    if (type == KILN_Q4_K) {
        /* 12 bytes of 6-bit scales and mins -> 8 scale bytes and 8 min bytes, as ggml unpacks them */
        const block_q4_K *x = (const block_q4_K *)row + b;
        uint32_t u[4];
        memcpy(u, x->scales, K_SCALE_SIZE);
        u[3] = ((u[2] >> 4) & 0x0F0F0F0Fu) | (((u[1] >> 6) & 0x03030303u) << 4);
        const uint32_t mins_lo = u[1] & 0x3F3F3F3Fu;
        u[1] = (u[2] & 0x0F0F0F0Fu) | (((u[0] >> 6) & 0x03030303u) << 4);
        u[0] &= 0x3F3F3F3Fu;
        u[2] = mins_lo;
        memcpy(h.sc, u, 8);
        const __m128i mins = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)&u[2]),
                                              _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
        h.coef = _mm256_cvtepu8_epi16(mins); /* each min serves two sums of 16 */
        h.d = kiln_fp16_to_fp32(x->d), h.dc = kiln_fp16_to_fp32(x->dmin);
    } else { /* KILN_Q6_K: q is stored + 32, so the bsums term is 32 * scale */
        const block_q6_K *x = (const block_q6_K *)row + b;
        h.sc16 = x->scales;
        h.coef = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales)), 5);
        h.d = h.dc = kiln_fp16_to_fp32(x->d);
    }
    return h;
}

/* weights 32k .. 32k+31 of a super-block as unsigned bytes */
INLINE __m256i load_kgroup(const int type, const uint8_t *row, int b, int k) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (type == KILN_Q4_K) {
        const block_q4_K *x = (const block_q4_K *)row + b;
        const __m256i packed = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * (k / 2)));
        return _mm256_and_si256(k % 2 ? _mm256_srli_epi16(packed, 4) : packed, m4);
    }
    const block_q6_K *x = (const block_q6_K *)row + b;
    const int half = k / 4, quarter = k % 4;
    const __m256i lo = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * half + 32 * (quarter % 2)));
    const __m256i hi = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * half));
    const __m256i low = _mm256_and_si256(quarter < 2 ? lo : _mm256_srli_epi16(lo, 4), m4);
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hi, 2 * quarter), _mm256_set1_epi8(3));
    return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
}

/* the int16 scales of group k's two halves of 16 */
INLINE __m256i kscales(const int type, const khead *h, int k) {
    if (type == KILN_Q4_K) return _mm256_set1_epi16(h->sc[k]);
    return _mm256_set_m128i(_mm_set1_epi16(h->sc16[2 * k + 1]), _mm_set1_epi16(h->sc16[2 * k]));
}

INLINE void tile_k(const int type, const int R, const int C, int nb, const uint8_t *w, size_t w_row,
                   const uint8_t *a, size_t a_row, float *y, size_t y_row) {
    const uint8_t *next = w + R * w_row;
    const size_t step = R * (type == KILN_Q4_K ? sizeof(block_q4_K) : sizeof(block_q6_K));
    __m256 acc[TILE_R][TILE_C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        if (C == 1)
            for (size_t off = 0; off < step; off += 64) _mm_prefetch((const char *)next + b * step + off, _MM_HINT_T0);
        khead h[TILE_R];
        for (int r = 0; r < R; r++) h[r] = load_khead(type, w + r * w_row, b);
        __m256i isum[TILE_R][TILE_C];
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) isum[r][c] = _mm256_setzero_si256();
        for (int k = 0; k < QK_K / 32; k++) {
            __m256i q[TILE_R], sc[TILE_R];
            for (int r = 0; r < R; r++) q[r] = load_kgroup(type, w + r * w_row, b, k), sc[r] = kscales(type, &h[r], k);
            for (int c = 0; c < C; c++) {
                const block_q8_K *yb = (const block_q8_K *)(a + c * a_row) + b;
                const __m256i yk = _mm256_loadu_si256((const __m256i *)(yb->qs + 32 * k));
                for (int r = 0; r < R; r++)
                    isum[r][c] = _mm256_dpwssd_epi32(isum[r][c], _mm256_maddubs_epi16(q[r], yk), sc[r]);
            }
        }
        for (int c = 0; c < C; c++) {
            const block_q8_K *yb = (const block_q8_K *)(a + c * a_row) + b;
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)yb->bsums);
            for (int r = 0; r < R; r++) {
                const __m256 term = _mm256_cvtepi32_ps(_mm256_madd_epi16(h[r].coef, bsums));
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][c]), _mm256_set1_ps(h[r].d * yb->d), acc[r][c]);
                acc[r][c] = _mm256_fnmadd_ps(term, _mm256_set1_ps(h[r].dc * yb->d), acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[c * y_row + r] = kiln_hsum8(acc[r][c]);
}

/* Weight rows outer, activation rows inner: a tile's weights stay in L1 while the activation
 * rows (the whole prefill chunk, quantized) stream from L2. */
INLINE void any_tile(const int type, const int R, const int C, int nb, const uint8_t *w, size_t w_row,
                     const uint8_t *a, size_t a_row, float *y, size_t y_row) {
    if (type == KILN_Q4_K || type == KILN_Q6_K) tile_k(type, R, C, nb, w, w_row, a, a_row, y, y_row);
    else tile(type, R, C, nb, w, w_row, a, a_row, y, y_row);
}

INLINE void gemm(const int type, int n, const void *w_, size_t w_row, int n_w, const void *a_, size_t a_row,
                 int n_a, float *y, size_t y_row) {
    const uint8_t *w = w_, *a = a_;
    const int nb = n / (type == KILN_Q4_K || type == KILN_Q6_K ? QK_K : 32);
    int r = 0;
    for (; r + TILE_R <= n_w; r += TILE_R) {
        int c = 0;
        for (; c + TILE_C <= n_a; c += TILE_C)
            any_tile(type, TILE_R, TILE_C, nb, w + r * w_row, w_row, a + c * a_row, a_row, y + c * y_row + r, y_row);
        for (; c < n_a; c++) any_tile(type, TILE_R, 1, nb, w + r * w_row, w_row, a + c * a_row, a_row, y + c * y_row + r, y_row);
    }
    for (; r < n_w; r++) {
        int c = 0;
        for (; c + TILE_C <= n_a; c += TILE_C)
            any_tile(type, 1, TILE_C, nb, w + r * w_row, w_row, a + c * a_row, a_row, y + c * y_row + r, y_row);
        for (; c < n_a; c++) any_tile(type, 1, 1, nb, w + r * w_row, w_row, a + c * a_row, a_row, y + c * y_row + r, y_row);
    }
}

#define GEMM_FOR(name, type)                                                                                     \
    void kiln_gemm_##name##_vnni(int n, const void *w, size_t w_row, int n_w, const void *a, size_t a_row,      \
                                 int n_a, float *y, size_t y_row) {                                             \
        gemm(type, n, w, w_row, n_w, a, a_row, n_a, y, y_row);                                                   \
    }
GEMM_FOR(q4_0, KILN_Q4_0)
GEMM_FOR(q4_1, KILN_Q4_1)
GEMM_FOR(q5_0, KILN_Q5_0)
GEMM_FOR(q5_1, KILN_Q5_1)
GEMM_FOR(q8_0, KILN_Q8_0)
GEMM_FOR(q4_K, KILN_Q4_K)
GEMM_FOR(q6_K, KILN_Q6_K)
#endif
