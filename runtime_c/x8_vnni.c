/* x8_vnni.c: matmuls on the x8 layout (x8_pack.c) with AVX-512 VNNI.
 *
 * Each lane of a vector is one weight row, so vpdpbusd against 4 activation bytes broadcast to
 * every lane yields 16 rows' sums at once (two groups of 8 in one 512-bit vector), and the rows'
 * scales are one load. Per row the arithmetic is the reference dot's (ref_quant.c): the exact
 * integer block sum, then acc = fma(isum, d * y.d, acc) block by block, so a row's value is the
 * same bits as on every other path. In prefill and batched steps each unpacked weight block
 * serves X8_TOKENS activation rows; where AMX is allowed, tiles take the 32-weight types' integer
 * sums for 16 rows at a time first (x8_amx.c), with the same float steps after them.
 */
#include "x8.h"

#ifdef KILN_HAVE_VNNI
/* a tile's scales (act_avx2.c's kiln_quantize_q8_tile_avx2): yd[nb][X8_TOKENS], ys[nb][X8_TOKENS], block sums[nb][X8_TOKENS] */
#define X8_TILE_BYTES(nb) (KILN_X8_TILE_SCALES * 4 * X8_TOKENS * (nb))
#define X8_TOKENS KILN_X8_TILE /* activation rows that share each unpacked weight block */
/* A matmul of fewer activation rows (decode's one) takes the 256-bit kernel (x8_avx2.c, with
   vpdpbusd on ymm): on Zen 4, which runs a 512-bit op as two 256-bit halves, one group's rows a
   vector from one stream decoded SmolLM2 about 20% faster than two groups' from two (kiln bench,
   tg128, alternated runs); from 4 rows up the 512-bit kernel was faster. Not measured on an
   AVX-512 Intel part. */
#define X8_WIDE_ROWS 2
#define X8_AHEAD 4096 /* bytes of each group's stream prefetched ahead: prefill reads its weights from L2 (into L2
                          and 8 KB ahead, as decode's x8_avx2.c, made no difference: 1.000x, llama-1b Q4_0) */

/* y[c * y_row + 8g + r] for groups [g0, g1) and C activation rows (q8_0 or q8_1 blocks) from
 * act. The activation rows' scales, and for offset types -offset * sum(y) per block, are
 * unpacked once per call; each weight block is unpacked once for the C rows. Groups go two at
 * a time; a last odd group is computed in both halves and stored once. */
INLINE void x8_rows(const int type, const int C, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act,
                    size_t a_row, const uint8_t *tile, float *y, size_t y_row) {
    kiln_b32 f = {0};
    kiln_x8_b32_of(type, &f);
    const size_t x8_bytes = 8 * f.block_bytes, a_bytes = f.has_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t q_at = f.has_min ? 4 : 2; /* the activation block's int8 values follow d (and s) */
    /* block-major: a block's values for the C rows share a cache line (row-major, 4 KB apart, they
       all fell in one L1 set, and Q4_1's three arrays' 24 lines overflowed its 8 ways) */
    float yd_own[tile ? 1 : X8_MAX_BLOCKS][X8_TOKENS], ys_own[tile ? 1 : X8_MAX_BLOCKS][X8_TOKENS];
    int32_t seed[X8_MAX_BLOCKS][X8_TOKENS];
    if (!tile) act_scales(type, act, a_row, C, nb, yd_own[0], ys_own[0], seed[0], 1, X8_TOKENS);
    const float (*yd)[X8_TOKENS] = tile ? (const float (*)[X8_TOKENS])tile : (const float (*)[X8_TOKENS])yd_own;
    const float (*ys)[X8_TOKENS] = tile ? yd + nb : (const float (*)[X8_TOKENS])ys_own;
    if (tile) { /* the seeds of this weight type's offset, from the tile's block sums (a run's types differ in it) */
        const int32_t (*sums)[X8_TOKENS] = (const int32_t (*)[X8_TOKENS])(yd + 2 * nb);
        for (int b = 0; b < nb; b++)
            _mm256_storeu_si256((__m256i *)seed[b], _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)sums[b]),
                                                                       _mm256_set1_epi32(-f.offset)));
    }
    for (int g = g0; g < g1; g += 2) {
        const int pair = g + 1 < g1;
        const size_t apart = pair ? (size_t)nb * x8_bytes : 0;
        const uint8_t *blk = w + (size_t)g * nb * x8_bytes;
        __m512 acc[X8_TOKENS], mins[X8_TOKENS];
        for (int c = 0; c < C; c++) acc[c] = mins[c] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++, blk += x8_bytes) {
            for (size_t at = 0; at < x8_bytes; at += 64)
                __builtin_prefetch(blk + X8_AHEAD + at), __builtin_prefetch(blk + apart + X8_AHEAD + at);
            const uint8_t *p = blk + kiln_x8_scale_bytes(&f);
            __m512i u[8];
            x16_unpack(type, p + (f.qh_at ? 32 : 0), p, apart, u);
            const __m512 d = x16_scales(&f, blk, apart), m = f.has_min ? x16_half(blk + 16, apart) : d;
            /* 4 activation bytes a lane, broadcast from memory against 16 rows' 4 weights */
            __m512i sum[X8_TOKENS];
            chunk_dots(u, 8, act + (size_t)b * a_bytes + q_at, a_row, C, seed[b], sum);
            for (int c = 0; c < C; c++) {
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[c]),
                                         _mm512_mul_ps(d, _mm512_set1_ps(yd[b][c])), acc[c]);
                if (f.has_min) mins[c] = _mm512_fmadd_ps(m, _mm512_set1_ps(ys[b][c]), mins[c]);
            }
        }
        for (int c = 0; c < C; c++) {
            const __m512 out = _mm512_add_ps(acc[c], mins[c]);
            if (pair) _mm512_storeu_ps(y + c * y_row + 8 * g, out);
            else _mm256_storeu_ps(y + c * y_row + 8 * g, _mm512_castps512_ps256(out));
        }
    }
}

/* 8 bytes of each of two groups (a, a + apart) widened to 16 int32 lanes, signed or not */
INLINE __m512i x16_bytes32(const uint8_t *a, size_t apart, int is_signed) {
    const __m128i b = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)(a + apart)));
    return is_signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
}

/* The kx8 twin of x8_rows: C activation rows of q8_K super-blocks against groups [g0, g1).
 * Per super-block and row lane: isum = sum_j sc_j * sum(u * y) over its sub-blocks (Q6_K's
 * sums seeded with -32 * sum(y), Q3_K's with -4 * sum(y), IQ4_XS's with -128 * sum(y)), and for Q4_K/Q5_K msum = sum_j m_j * (y's sum over sub-block
 * j) by vpdpwssd on (m_2p, m_2p+1) pairs; then acc += isum * (d * y.d), mins += msum * (dmin * y.d). */
INLINE void kx8_rows(const int type, const int C, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act,
                     size_t a_row, float *y, size_t y_row) {
    const size_t kb = kiln_kx8_bytes(type);
    const int q6 = type == KILN_Q6_K, q5 = type == KILN_Q5_K, q3 = type == KILN_Q3_K, q2 = type == KILN_Q2_K;
    const int xs = type == KILN_IQ4_XS, has_min = type == KILN_Q4_K || q5 || q2, by16 = q6 || q3 || q2; /* a scale a 16 */
    const int offset = q6 ? 32 : q3 ? 4 : 0, n_pairs = q2 ? 8 : 4; /* minimums a pair of sub-blocks */
    const size_t chunk_bytes = kiln_kx8_chunk(type), head = kiln_kx8_head(type), sc_at = kiln_kx8_sc_at(type);
    /* IQ4_XS: value + 128 for each nibble, its sub-block's sum seeded with -128 sum(y) */
    const __m512i table = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)kiln_kvalues_iq4nl)),
                                           _mm512_set1_epi8((char)0x80));
    int32_t mpair[X8_MAX_BLOCKS / 8][X8_TOKENS][8]; /* (sum of y's sub-block 2p) | (of 2p + 1) << 16, block-major */
    /* The C rows' activations as one tile, their super-blocks' values side by side, with the seeds of
       each sub-block's sums and the scales: a row's values then lie a constant distance from one
       pointer. Read from C pointers, a Q6_K block's loop kept them on the stack, reloading one for
       nearly every vpdpbusd (65 stack loads and stores each sub-block under GCC 12, Intel or Zen tuning).
       Q4_K's and Q5_K's loops, which hold no seeds, kept their pointers in registers and run 5% slower
       for the copy, so they read the rows where they are. */
    const int tiled = by16 || xs;
    int8_t qt[X8_MAX_BLOCKS / 8][X8_TOKENS][QK_K];
    int32_t ks[X8_MAX_BLOCKS / 8][8][2][X8_TOKENS]; /* sub-block j's seeds: its two halves' (by16), or its own in [0] */
    float ykd[X8_MAX_BLOCKS / 8][X8_TOKENS];
    for (int c = 0; c < C; c++)
        for (int b = 0; b < nb; b++) {
            const block_q8_K *yb = (const block_q8_K *)(act + c * a_row) + b;
            ykd[b][c] = yb->d;
            if (tiled) memcpy(qt[b][c], yb->qs, QK_K);
            for (int j = 0; j < 8 && tiled; j++) {
                ks[b][j][0][c] = xs ? -128 * (yb->bsums[2 * j] + yb->bsums[2 * j + 1]) : -offset * yb->bsums[2 * j];
                ks[b][j][1][c] = -offset * yb->bsums[2 * j + 1];
            }
            for (int p = 0; p < n_pairs && has_min; p++) { /* sub-blocks of 32 (of 16 for Q2_K) */
                const int lo = q2 ? yb->bsums[2 * p] : yb->bsums[4 * p] + yb->bsums[4 * p + 1];
                const int hi = q2 ? yb->bsums[2 * p + 1] : yb->bsums[4 * p + 2] + yb->bsums[4 * p + 3];
                mpair[b][c][p] = (int32_t)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16);
            }
        }
    for (int g = g0; g < g1; g += 2) {
        const int pair = g + 1 < g1;
        const size_t apart = pair ? (size_t)nb * kb : 0;
        const uint8_t *blk = w + (size_t)g * nb * kb;
        __m512 acc[X8_TOKENS], mins[X8_TOKENS];
        for (int c = 0; c < C; c++) acc[c] = mins[c] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++, blk += kb) {
            for (size_t at = 0; at < kb; at += 64)
                __builtin_prefetch(blk + X8_AHEAD + at), __builtin_prefetch(blk + apart + X8_AHEAD + at);
            __m512i isum[X8_TOKENS];
            for (int c = 0; c < C; c++) isum[c] = _mm512_setzero_si512();
            const uint8_t *chunk = blk + head;
            for (int j = 0; j < 8; j++, chunk += chunk_bytes) {
                __m512i u[8];
                const uint8_t *qs = chunk + (q6 ? 64 : q5 || q3 ? 32 : 0);
                if (q3 || q2) /* two bits a weight: u[4v + s] at bits 2s of vector v */
                    for (int v = 0; v < 2; v++) {
                        const __m512i raw = x16_join(qs + 32 * v, apart), three = _mm512_set1_epi8(3);
                        for (int s = 0; s < 4; s++) u[4 * v + s] = _mm512_and_si512(_mm512_srli_epi16(raw, 2 * s), three);
                    }
                else x16_unpack(KILN_Q4_0, qs, qs, apart, u); /* the nibbles (Q4_0 reads no qh) */
                if (xs)
                    for (int k = 0; k < 8; k++) u[k] = _mm512_shuffle_epi8(table, u[k]);
                if (q5) x16_fifth(chunk, apart, u);
                if (q3) { /* the plane of Q3_K's third bits */
                    const uint32_t *h4 = (const uint32_t *)chunk, *h4b = (const uint32_t *)(chunk + apart);
                    for (int k = 0; k < 8; k++)
                        u[k] = _mm512_or_si512(u[k], _mm512_maskz_mov_epi8(h4[k] | (uint64_t)h4b[k] << 32, _mm512_set1_epi8(0x04)));
                }
                if (q6) /* the top two bits, u[4v + s]'s at bits 2s of vector v, moved to bits 4-5 */
                    for (int v = 0; v < 2; v++) {
                        const __m512i top = x16_join(chunk + 32 * v, apart), bits45 = _mm512_set1_epi8(0x30);
                        for (int s = 0; s < 4; s++) {
                            const __m512i t = s == 2 ? top : s < 2 ? _mm512_slli_epi16(top, 4 - 2 * s) : _mm512_srli_epi16(top, 2);
                            u[4 * v + s] = _mm512_ternarylogic_epi32(u[4 * v + s], t, bits45, 0xF8); /* u | (t & 0x30) */
                        }
                    }
                if (by16) { /* two sub-blocks of 16, each with its own scale */
                    __m512i sa = x16_bytes32(blk + (q2 ? 32 : 16) + 8 * (2 * j), apart, !q2);
                    __m512i sb = x16_bytes32(blk + (q2 ? 32 : 16) + 8 * (2 * j + 1), apart, !q2);
                    if (q2) /* its GGUF bytes' low nibbles */
                        sa = _mm512_and_si512(sa, _mm512_set1_epi32(15)), sb = _mm512_and_si512(sb, _mm512_set1_epi32(15));
                    __m512i sum[X8_TOKENS];
                    const uint8_t *y4 = (const uint8_t *)qt[b][0] + 32 * j;
                    chunk_dots(u, 4, y4, QK_K, C, ks[b][j][0], sum);
                    for (int c = 0; c < C; c++) isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(sum[c], sa));
                    chunk_dots(u + 4, 4, y4 + 16, QK_K, C, ks[b][j][1], sum);
                    for (int c = 0; c < C; c++) isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(sum[c], sb));
                } else {
                    const __m512i sc = x16_bytes32(blk + sc_at + 8 * j, apart, xs);
                    static const int32_t no_seeds[X8_TOKENS];
                    __m512i sum[X8_TOKENS];
                    if (tiled) chunk_dots(u, 8, (const uint8_t *)qt[b][0] + 32 * j, QK_K, C, ks[b][j][0], sum);
                    else chunk_dots(u, 8, ((const block_q8_K *)act + b)->qs + 32 * j, a_row, C, no_seeds, sum);
                    for (int c = 0; c < C; c++) isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(sum[c], sc));
                }
            }
            const __m512 d = x16_half(blk, apart);
            __m512i mp[8];
            if (has_min) /* (m_2p, m_2p+1) of each row lane as two int16 (Q2_K: its bytes' high nibbles) */
                for (int p = 0; p < n_pairs; p++) {
                    const uint8_t *m = blk + (q2 ? 32 : 96) + 16 * p;
                    const __m128i a = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)m),
                                                        _mm_loadl_epi64((const __m128i *)(m + 8)));
                    const __m128i bb = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(m + apart)),
                                                         _mm_loadl_epi64((const __m128i *)(m + 8 + apart)));
                    mp[p] = _mm512_cvtepu8_epi16(_mm256_set_m128i(bb, a));
                    if (q2) mp[p] = _mm512_srli_epi16(mp[p], 4);
                }
            for (int c = 0; c < C; c++) {
                const float yd = ykd[b][c];
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, _mm512_set1_ps(yd)), acc[c]);
                if (has_min) {
                    __m512i msum = _mm512_setzero_si512();
                    for (int p = 0; p < n_pairs; p++) msum = _mm512_dpwssd_epi32(msum, mp[p], _mm512_set1_epi32(mpair[b][c][p]));
                    mins[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum),
                                              _mm512_mul_ps(x16_half(blk + 16, apart), _mm512_set1_ps(yd)), mins[c]);
                }
            }
        }
        for (int c = 0; c < C; c++) {
            const __m512 out = _mm512_sub_ps(acc[c], mins[c]);
            if (pair) _mm512_storeu_ps(y + c * y_row + 8 * g, out);
            else _mm256_storeu_ps(y + c * y_row + 8 * g, _mm512_castps512_ps256(out));
        }
    }
}

/* every activation row, X8_TOKENS at a time (their scales from `scales`, tile by tile, where the quantizer made them) */
INLINE void x8_gemm(const int type, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act, size_t a_row,
                    int n_a, const uint8_t *scales, float *y, size_t y_row) {
    int c = 0;
    if (kiln_kx8_tiles(type) && kiln_rows_sb_kx8(type, w, g0, g1, nb * 32, act, a_row, n_a, y, y_row)) return;
    if (kiln_is_kx8(type)) {
        for (; c + X8_TOKENS <= n_a; c += X8_TOKENS)
            kx8_rows(type, X8_TOKENS, w, g0, g1, nb / 8, act + c * a_row, a_row, y + c * y_row, y_row);
        for (; c < n_a; c++) kx8_rows(type, 1, w, g0, g1, nb / 8, act + c * a_row, a_row, y + c * y_row, y_row);
        return;
    }
    c = kiln_amx_rows(type, w, g0, g1, nb, act, a_row, n_a, y, y_row);
    const size_t tile = (size_t)X8_TILE_BYTES(nb);
    for (; c + X8_TOKENS <= n_a; c += X8_TOKENS)
        x8_rows(type, X8_TOKENS, w, g0, g1, nb, act + c * a_row, a_row, scales ? scales + c / X8_TOKENS * tile : NULL,
                y + c * y_row, y_row);
    for (; c < n_a; c++) x8_rows(type, 1, w, g0, g1, nb, act + c * a_row, a_row, NULL, y + c * y_row, y_row);
}

X8_GEMM_PER_TYPE(x8_gemm)

void kiln_x8_gemm_tiles(int type, const uint8_t *w, int g0, int g1, int n_in, const uint8_t *act, size_t a_row,
                        int n_a, const uint8_t *scales, float *y, size_t y_row) {
    if (n_a < X8_WIDE_ROWS) {
        kiln_x8_gemm_avx2(type, w, g0, g1, n_in, act, a_row, n_a, y, y_row);
        return;
    }
    X8_EACH_GEMM(type, x8_gemm, w, g0, g1, n_in / 32, act, a_row, n_a, scales, y, y_row)
}

void kiln_x8_gemm(int type, const uint8_t *w, int g0, int g1, int n_in, const uint8_t *act, size_t a_row, int n_a,
                  float *y, size_t y_row) {
    kiln_x8_gemm_tiles(type, w, g0, g1, n_in, act, a_row, n_a, NULL, y, y_row);
}
#endif
