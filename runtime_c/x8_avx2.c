/* x8_avx2.c: matmuls on the x8 layout (x8_pack.c) 256 bits wide: with AVX2 alone on the CPUs
 * without AVX-512 VNNI (x86-64-v3: every laptop since Haswell, Zen 1 to 3), and with vpdpbusd on
 * ymm for the single-row matmuls of the VNNI builds (x8_vnni.c says why).
 *
 * The layout puts 4 weights of each of 8 rows in one 32-byte vector, so each lane is one row:
 * vpmaddubsw against 4 activation bytes broadcast to every lane, then vpmaddwd by ones, gives 8
 * rows' sums of 4 products at once, with no reduction across lanes. Each unpacked weight block
 * serves X8_ROWS activation rows. The 16-bit pair sums are added as 16-bit numbers only as far as
 * they cannot overflow: with |y| <= 127 a pair is at most 2 * 127 * u_max, so 8 of them for 4-bit
 * weights (u <= 15), 4 for 5-bit (u <= 31), 2 for Q6_K (u <= 63), and Q8_0 and the table types
 * (IQ4_NL, MXFP4) take |q| and y's sign one product pair at a time; with VNNI every u goes to
 * vpdpbusd as it is (q + 128 for those three, the seed taking off 128 sum(y)). The integer block sums are exact; the float steps are
 * the reference dot's (ref_quant.c, ref_kquant.c) in its order, as in x8_vnni.c: a row's value is
 * the same bits on every path.
 */
#include <string.h>

#include "x8.h"

#if defined(KILN_HAVE_X8) && defined(KILN_HAVE_AVX2)
#include <immintrin.h>

#define X8_ROWS 6 /* activation rows that share each unpacked weight block (32-weight types) */
#define KX8_ROWS 4 /* the same for the K-quants, whose integer sums stay in registers */
/* Bytes of a weight stream asked for ahead, into L2 (prefetcht1): a decode step streams every weight
 * once, and the lines in flight are what bounds it. Into L1, 4 KB ahead, the requests had queued on
 * L1's few miss buffers; into L2 at 8 KB, decode ran 1.04-1.11x faster (llama-1b Q4_0, and SmolLM2
 * at depth 0 and 1024; Zen 4, alternated in one process, same bits); 16 KB gained nothing more. */
#define X8_AHEAD 8192
/* Blocks whose integer sums are taken before their float steps: apart, the unpacked weights keep
 * their registers, where the float sums had been spilled and carried from block to block through
 * memory (sixteen ymm registers hold 8 weight vectors, X8_ROWS sums and the temporaries only so). */
#define X8_RUN 16

INLINE __m256i bcast4(const uint8_t *y) { /* 4 activation bytes in every lane */
    int32_t v;
    memcpy(&v, y, 4);
    return _mm256_set1_epi32(v);
}

INLINE __m256i sum_pairs(__m256i s16) { /* 16 x int16 -> 8 x int32: each lane's two pairs */
    return _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
}

/* bit j of a 32-bit mask -> `bit` in byte j, else 0: one masked move where AVX-512 has them (the
   VNNI builds' decode), five instructions on AVX2 */
INLINE __m256i mask_bytes(uint32_t bits, char bit) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_maskz_mov_epi8(bits, _mm256_set1_epi8(bit));
#endif
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i sel = _mm256_set1_epi64x(0x8040201008040201LL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel), _mm256_set1_epi8(bit));
}

/* Whether a 32-weight type's values are dotted signed, |q| against y with q's sign: without VNNI,
   where a vpmaddubsw pair of u = q + 128 (Q8_0, the table types) could reach 2 * 255 * 127 and
   overflow its int16. vpdpbusd takes every u as it is, the offset's seed taking off 128 sum(y). */
#ifdef KILN_HAVE_VNNI
#define X8_SIGNED(f) 0
#else
#define X8_SIGNED(f) ((f).bits == 8 || (f).lut)
#endif

/* Whether a chunk's high nibbles are dotted as they lie, 16 times over (raw & 0xF0), their chain's
   sum shifted right by 4 after it: exact, as every product is a multiple of 16, and one vector op
   fewer for each 32 bytes of weights. Decode's kernel is bound by its vector ops where memory runs
   fast (one thread streamed Q4_0 at 33 GB/s against 41 from L2, Zen 4). Only with VNNI, whose
   vpdpbusd takes 240 x 127 four at a time into 32 bits, where vpmaddubsw's 16-bit pairs would
   saturate; and only plain nibbles: a fifth bit (Q5_*) or a table index (IQ4_*) needs the nibble. */
#ifdef KILN_HAVE_VNNI
#define X8_HI16(plain_nibbles) (plain_nibbles)
#else
#define X8_HI16(plain_nibbles) 0
#endif

/* The 8 weight vectors of one x8 chunk of 32 weights (u[k]: weights 4k..4k+3 of each row), as
 * unsigned bytes (hi16: the odd k's 16 times over); Q8_0's as signed q (stored q ^ 0x80) where
 * they are dotted signed */
INLINE void unpack8(const int type, const uint8_t *qs, const uint8_t *qh, const int hi16, __m256i u[8]) {
    if (type == KILN_Q8_0) {
        const __m256i flip = _mm256_set1_epi8(X8_SIGNED((kiln_b32){.bits = 8}) ? (char)0x80 : 0);
        for (int k = 0; k < 8; k++) u[k] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qs + 32 * k)), flip);
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int v = 0; v < 4; v++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * v));
        u[2 * v] = _mm256_and_si256(raw, m4);
        u[2 * v + 1] = hi16 ? _mm256_andnot_si256(m4, raw) : _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    }
    if (qh) { /* the fifth bits, bit k of each byte, moved to bit 4 of u[k] (x8_pack.c) */
        const __m256i raw = _mm256_loadu_si256((const __m256i *)qh), bit4 = _mm256_set1_epi8(0x10);
        for (int k = 0; k < 8; k++) {
            const __m256i t = k < 4 ? _mm256_slli_epi16(raw, 4 - k) : k == 4 ? raw : _mm256_srli_epi16(raw, k - 4);
            u[k] = _mm256_or_si256(u[k], _mm256_and_si256(t, bit4));
        }
    }
}

/* sum over k in [k0, k0 + n) of u[k] . y[4k..4k+3] for each row lane: 16-bit pair sums added in
 * runs of `run` (no run can overflow), each run widened to 32 bits; with VNNI (256 bits wide),
 * vpdpbusd's 32-bit sums directly, in two chains (n is even): a decode row's block was one chain of
 * 8 (40 cycles of latency), and the kernel runs 3-45% faster in cache split (by type, a Cascade Lake). The
 * integer sums are exact, so any grouping gives the same value. */
INLINE __m256i dot_run(const __m256i u[8], const uint8_t *y, int k0, int n, int run, int hi16) {
    __m256i s32 = _mm256_setzero_si256();
#ifdef KILN_HAVE_VNNI
    (void)run;
    __m256i s1 = _mm256_setzero_si256(); /* the odd k's: the high nibbles, 16 times over where hi16 */
    for (int k = k0; k < k0 + n; k += 2) {
        s32 = dpbusd8_bcast(s32, u[k], y + 4 * k);
        s1 = dpbusd8_bcast(s1, u[k + 1], y + 4 * k + 4);
    }
    return _mm256_add_epi32(s32, hi16 ? _mm256_srai_epi32(s1, 4) : s1);
#endif
    (void)hi16;
    for (int k = k0; k < k0 + n; k += run) {
        __m256i s16 = _mm256_maddubs_epi16(u[k], bcast4(y + 4 * k));
        for (int j = 1; j < run; j++) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(u[k + j], bcast4(y + 4 * (k + j))));
        s32 = _mm256_add_epi32(s32, sum_pairs(s16));
    }
    return s32;
}

/* Q8_0's signed weights: |q| against y with q's sign, a pair at a time */
INLINE __m256i dot_signed(const __m256i u[8], const uint8_t *y) {
    __m256i s32 = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++)
        s32 = _mm256_add_epi32(s32, sum_pairs(_mm256_maddubs_epi16(_mm256_sign_epi8(u[k], u[k]),
                                                                   _mm256_sign_epi8(bcast4(y + 4 * k), u[k]))));
    return s32;
}

/* -- the 32-weight types: acc = fma(isum, d * y.d, acc); mins = fma(m, y.s, mins); acc + mins -- */
INLINE void x8_rows(const int type, const int C, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act,
                    size_t a_row, float *y, size_t y_row) {
    kiln_b32 f = {0};
    kiln_x8_b32_of(type, &f);
    const size_t x8_bytes = 8 * f.block_bytes, a_bytes = f.has_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t q_at = f.has_min ? 4 : 2;
    const int run = f.bits == 8 ? 1 : f.qh_at ? 4 : 8;
    const int is_signed = X8_SIGNED(f), hi16 = X8_HI16(f.bits == 4 && !f.qh_at && !f.lut);
    const __m256i lut = f.lut ? _mm256_xor_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)f.lut)),
                                                 _mm256_set1_epi8(is_signed ? 0 : (char)0x80))
                              : _mm256_setzero_si256();
    float yd[X8_MAX_BLOCKS][X8_ROWS], ys[X8_MAX_BLOCKS][X8_ROWS]; /* block-major, as x8_vnni.c's */
    int32_t seed[X8_MAX_BLOCKS][X8_ROWS];
    act_scales(type, act, a_row, C, nb, yd[0], ys[0], seed[0], 1, X8_ROWS);
    for (int g = g0; g < g1; g++) {
        const uint8_t *blk = w + (size_t)g * nb * x8_bytes;
        __m256 acc[X8_ROWS], mins[X8_ROWS];
        for (int c = 0; c < C; c++) acc[c] = mins[c] = _mm256_setzero_ps();
        const int span = C > 1 ? X8_RUN : 1; /* one row (decode) keeps its sums in registers as they are */
        for (int b0 = 0; b0 < nb; b0 += span) {
            const int b1 = nb - b0 < span ? nb : b0 + span;
            __m256i isum[X8_RUN][X8_ROWS];
            for (int b = b0; b < b1; b++) { /* the integer sums, the unpacked weights in registers */
                const uint8_t *bb = blk + (size_t)b * x8_bytes, *p = bb + kiln_x8_scale_bytes(&f);
                for (size_t at = 0; at < x8_bytes; at += 64) __builtin_prefetch(bb + X8_AHEAD + at, 0, 2);
                __m256i u[8];
                unpack8(type, p + (f.qh_at ? 32 : 0), f.qh_at ? p : NULL, hi16, u);
                if (f.lut) /* the nibbles index the table: value + 128 for vpdpbusd, else the signed value */
                    for (int k = 0; k < 8; k++) u[k] = _mm256_shuffle_epi8(lut, u[k]);
                for (int c = 0; c < C; c++) {
                    const uint8_t *y4 = act + c * a_row + (size_t)b * a_bytes + q_at;
                    __m256i sum = is_signed ? dot_signed(u, y4) : dot_run(u, y4, 0, 8, run, hi16);
                    if (f.offset && !is_signed) sum = _mm256_add_epi32(sum, _mm256_set1_epi32(seed[b][c]));
                    isum[b - b0][c] = sum;
                }
            }
            for (int b = b0; b < b1; b++) { /* then each block's float step, in order */
                const __m256 d = x8_scales(&f, blk + (size_t)b * x8_bytes);
                for (int c = 0; c < C; c++)
                    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[b - b0][c]), _mm256_mul_ps(d, _mm256_set1_ps(yd[b][c])), acc[c]);
            }
        }
        if (f.has_min) { /* each row's minimums, block by block: a chain of its own, as the reference's */
            blk = w + (size_t)g * nb * x8_bytes;
            for (int b = 0; b < nb; b++, blk += x8_bytes) {
                const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)));
                for (int c = 0; c < C; c++) mins[c] = _mm256_fmadd_ps(m, _mm256_set1_ps(ys[b][c]), mins[c]);
            }
        }
        for (int c = 0; c < C; c++) _mm256_storeu_ps(y + c * y_row + 8 * g, _mm256_add_ps(acc[c], mins[c]));
    }
}

/* -- the K-quants: acc = fma(isum, d * y.d, acc); mins = fma(msum, dmin * y.d, mins); acc - mins -- */
INLINE __m256i bytes32(const uint8_t *a, int is_signed) { /* 8 bytes as 8 int32 */
    const __m128i b = _mm_loadl_epi64((const __m128i *)a);
    return is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
}

INLINE void kx8_rows(const int type, const int C, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act,
                     size_t a_row, float *y, size_t y_row) {
    const size_t kb = kiln_kx8_bytes(type);
    const int q6 = type == KILN_Q6_K, q5 = type == KILN_Q5_K, q3 = type == KILN_Q3_K, q2 = type == KILN_Q2_K;
    const int xs = type == KILN_IQ4_XS, has_min = type == KILN_Q4_K || q5 || q2, by16 = q6 || q3 || q2; /* a scale a 16 */
    const int offset = q6 ? 32 : q3 ? 4 : 0, hi16 = X8_HI16(type == KILN_Q4_K);
    const size_t chunk_bytes = kiln_kx8_chunk(type), head = kiln_kx8_head(type), sc_at = kiln_kx8_sc_at(type);
    /* IQ4_XS's nibbles index kvalues_iq4nl: value + 128 for vpdpbusd (its sub-block's sum seeded with
       -128 sum(y)), else the signed value, dotted signed */
    const int xs_signed = X8_SIGNED(((kiln_b32){.bits = 4, .lut = kiln_kvalues_iq4nl}));
    const __m256i table = _mm256_xor_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kiln_kvalues_iq4nl)),
                                           _mm256_set1_epi8(xs_signed ? 0 : (char)0x80));
    for (int g = g0; g < g1; g++) {
        const uint8_t *blk = w + (size_t)g * nb * kb;
        __m256 acc[KX8_ROWS], mins[KX8_ROWS];
        for (int c = 0; c < C; c++) acc[c] = mins[c] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++, blk += kb) {
            /* no prefetch: a super-block's 18 or more lines, asked for at once, had held the hardware's
               own stream back (llama-1b Q4_K decode 1.013x without, every one of 6 rounds; Zen 4) */
            __m256i isum[KX8_ROWS];
            for (int c = 0; c < C; c++) isum[c] = _mm256_setzero_si256();
            const uint8_t *chunk = blk + head;
            for (int j = 0; j < 8; j++, chunk += chunk_bytes) {
                __m256i u[8];
                const uint8_t *qs = chunk + (q6 ? 64 : q5 || q3 ? 32 : 0);
                if (q3 || q2) /* two bits a weight: u[4v + s] at bits 2s of vector v (Q3_K's third from its plane) */
                    for (int v = 0; v < 2; v++) {
                        const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * v));
                        for (int s = 0; s < 4; s++) {
                            u[4 * v + s] = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * s), _mm256_set1_epi8(3));
                            if (q3) u[4 * v + s] = _mm256_or_si256(u[4 * v + s], mask_bytes(((const uint32_t *)chunk)[4 * v + s], 0x04));
                        }
                    }
                else unpack8(KILN_Q4_0, qs, q5 ? chunk : NULL, hi16, u); /* nibbles, Q5_K's fifth bits */
                if (xs)
                    for (int k = 0; k < 8; k++) u[k] = _mm256_shuffle_epi8(table, u[k]);
                if (by16) {
                    for (int v = 0; v < 2 && q6; v++) { /* the top two bits, u[4v + s]'s at bits 2s of vector v */
                        const __m256i top = _mm256_loadu_si256((const __m256i *)(chunk + 32 * v)), bits45 = _mm256_set1_epi8(0x30);
                        for (int s = 0; s < 4; s++) {
                            const __m256i t = s == 2 ? top : s < 2 ? _mm256_slli_epi16(top, 4 - 2 * s) : _mm256_srli_epi16(top, 2);
                            u[4 * v + s] = _mm256_or_si256(u[4 * v + s], _mm256_and_si256(t, bits45));
                        }
                    }
                    /* two sub-blocks of 16, each with its own scale, their sums seeded with -offset sum(y);
                       Q6_K's u <= 63 adds its pairs 2 at a time, Q3_K's u <= 7 and Q2_K's <= 3 all 4;
                       Q2_K's scales are its GGUF bytes' low nibbles */
                    __m256i sa = bytes32(blk + (q2 ? 32 : 16) + 8 * (2 * j), !q2), sb = bytes32(blk + (q2 ? 32 : 16) + 8 * (2 * j + 1), !q2);
                    if (q2) sa = _mm256_and_si256(sa, _mm256_set1_epi32(15)), sb = _mm256_and_si256(sb, _mm256_set1_epi32(15));
                    for (int c = 0; c < C; c++) {
                        const block_q8_K *yb = (const block_q8_K *)(act + c * a_row) + b;
                        const uint8_t *y4 = (const uint8_t *)yb->qs + 32 * j;
                        const __m256i s0 = _mm256_add_epi32(_mm256_set1_epi32(-offset * yb->bsums[2 * j]),
                                                            dot_run(u, y4, 0, 4, q6 ? 2 : 4, 0));
                        const __m256i s1 = _mm256_add_epi32(_mm256_set1_epi32(-offset * yb->bsums[2 * j + 1]),
                                                            dot_run(u, y4, 4, 4, q6 ? 2 : 4, 0));
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_add_epi32(_mm256_mullo_epi32(s0, sa),
                                                                             _mm256_mullo_epi32(s1, sb)));
                    }
                } else {
                    const __m256i sc = bytes32(blk + sc_at + 8 * j, xs);
                    for (int c = 0; c < C; c++) {
                        const block_q8_K *yb = (const block_q8_K *)(act + c * a_row) + b;
                        const uint8_t *y4 = (const uint8_t *)yb->qs + 32 * j;
                        __m256i s;
                        if (xs && xs_signed) s = dot_signed(u, y4);
                        else if (xs) s = _mm256_add_epi32(dot_run(u, y4, 0, 8, 8, 0), _mm256_set1_epi32(
                                                              -128 * (yb->bsums[2 * j] + yb->bsums[2 * j + 1])));
                        else s = dot_run(u, y4, 0, 8, q5 ? 4 : 8, hi16);
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_mullo_epi32(s, sc));
                    }
                }
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
            for (int c = 0; c < C; c++) {
                const block_q8_K *yb = (const block_q8_K *)(act + c * a_row) + b;
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(d, _mm256_set1_ps(yb->d)), acc[c]);
                if (has_min) { /* sum over sub-blocks of m_j x (y's sum over sub-block j) */
                    __m256i msum = _mm256_setzero_si256();
                    for (int p = 0; p < (q2 ? 8 : 4); p++) { /* Q2_K: a minimum a 16, its GGUF bytes' high nibbles */
                        const uint8_t *m = blk + (q2 ? 32 : 96) + 16 * p;
                        __m128i mb = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)m), _mm_loadl_epi64((const __m128i *)(m + 8)));
                        if (q2) mb = _mm_and_si128(_mm_srli_epi16(mb, 4), _mm_set1_epi8(15));
                        const __m256i pairs = _mm256_cvtepu8_epi16(mb);
                        const int lo = q2 ? yb->bsums[2 * p] : yb->bsums[4 * p] + yb->bsums[4 * p + 1];
                        const int hi = q2 ? yb->bsums[2 * p + 1] : yb->bsums[4 * p + 2] + yb->bsums[4 * p + 3];
                        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(pairs, _mm256_set1_epi32(
                                                                           (int32_t)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16))));
                    }
                    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)));
                    mins[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, _mm256_set1_ps(yb->d)), mins[c]);
                }
            }
        }
        for (int c = 0; c < C; c++) _mm256_storeu_ps(y + c * y_row + 8 * g, _mm256_sub_ps(acc[c], mins[c]));
    }
}

/* every activation row, X8_ROWS at a time */
INLINE void x8_gemm(const int type, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act, size_t a_row,
                    int n_a, float *y, size_t y_row) {
    int c = 0;
    if (kiln_kx8_tiles(type) && kiln_rows_sb_kx8(type, w, g0, g1, nb * 32, act, a_row, n_a, y, y_row)) return;
    if (kiln_is_kx8(type)) {
        for (; c + KX8_ROWS <= n_a; c += KX8_ROWS)
            kx8_rows(type, KX8_ROWS, w, g0, g1, nb / 8, act + c * a_row, a_row, y + c * y_row, y_row);
        for (; c < n_a; c++) kx8_rows(type, 1, w, g0, g1, nb / 8, act + c * a_row, a_row, y + c * y_row, y_row);
        return;
    }
    for (; c + X8_ROWS <= n_a; c += X8_ROWS)
        x8_rows(type, X8_ROWS, w, g0, g1, nb, act + c * a_row, a_row, y + c * y_row, y_row);
    if (n_a - c >= X8_ROWS / 2) { /* a half tile, where the rest would take as many passes over w */
        x8_rows(type, X8_ROWS / 2, w, g0, g1, nb, act + c * a_row, a_row, y + c * y_row, y_row);
        c += X8_ROWS / 2;
    }
    for (; c < n_a; c++) x8_rows(type, 1, w, g0, g1, nb, act + c * a_row, a_row, y + c * y_row, y_row);
}

void kiln_x8_gemm_avx2(int type, const uint8_t *w, int g0, int g1, int n_in, const uint8_t *act, size_t a_row,
                       int n_a, float *y, size_t y_row) {
    X8_EACH_TYPE(type, x8_gemm, w, g0, g1, n_in / 32, act, a_row, n_a, y, y_row)
}

#ifdef KILN_HAVE_X8_AVX2
void kiln_x8_gemm(int type, const uint8_t *w, int g0, int g1, int n_in, const uint8_t *act, size_t a_row, int n_a,
                  float *y, size_t y_row) {
    kiln_x8_gemm_avx2(type, w, g0, g1, n_in, act, a_row, n_a, y, y_row);
}

void kiln_x8_gemm_tiles(int type, const uint8_t *w, int g0, int g1, int n_in, const uint8_t *act, size_t a_row,
                        int n_a, const uint8_t *scales, float *y, size_t y_row) {
    (void)scales; /* a tile here is X8_ROWS rows: its own scales, made as it goes */
    kiln_x8_gemm_avx2(type, w, g0, g1, n_in, act, a_row, n_a, y, y_row);
}
#endif
#endif
