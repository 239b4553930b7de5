/* x8.h: the x8 layout's facts, what its kernels share (the activations' scales, for x8_vnni.c and
 * x8_avx2.c), and the vector pieces of the AVX-512 ones (x8_vnni.c, the AMX tiles of x8_amx.c);
 * the layout itself is described in x8_pack.c. */
#ifndef KILN_X8_H
#define KILN_X8_H

#include <string.h>

#include "fp16.h"
#include "quant_impl.h"

#define X8_MAX_BLOCKS (KILN_X8_MAX_IN / 32)
#define INLINE static inline __attribute__((always_inline))

/* X(T, ...) for each x8 type T */
#define X8_TYPES(X, ...)                                                                          \
    X(KILN_Q4_0, __VA_ARGS__) X(KILN_Q4_1, __VA_ARGS__) X(KILN_Q5_0, __VA_ARGS__)                 \
    X(KILN_Q5_1, __VA_ARGS__) X(KILN_Q8_0, __VA_ARGS__) X(KILN_IQ4_NL, __VA_ARGS__)               \
    X(KILN_MXFP4, __VA_ARGS__) X(KILN_Q4_K, __VA_ARGS__) X(KILN_Q5_K, __VA_ARGS__)                \
    X(KILN_Q6_K, __VA_ARGS__) X(KILN_IQ4_XS, __VA_ARGS__) X(KILN_Q3_K, __VA_ARGS__)               \
    X(KILN_Q2_K, __VA_ARGS__)

/* gemm(T, ...) for the x8 type T that `type` names: each type its own copy of an inlined kernel,
   the type a constant in it */
#define X8_CASE(T, gemm, ...) case T: gemm(T, __VA_ARGS__); break;
#define X8_EACH_TYPE(type, gemm, ...) switch (type) { X8_TYPES(X8_CASE, gemm, __VA_ARGS__) }

/* X8_GEMM_PER_TYPE(gemm) defines gemm_T(...), a function of its own for each type T, holding the
   inlined gemm(T, ...); X8_EACH_GEMM calls the one `type` names. Thirteen types' kernels inlined
   into one switch made a function so large that GCC 12's register allocator kept the accumulators
   and the activation rows' pointers of most of them on the stack (30-45 loads and stores in each
   weight block's iteration); a kernel alone in its function holds them in registers. */
#define X8_GEMM_PARAMS const uint8_t *w, int g0, int g1, int nb, const uint8_t *act, size_t a_row, int n_a, \
                       const uint8_t *scales, float *y, size_t y_row
#define X8_GEMM_ONE(T, gemm)                                                                      \
    static __attribute__((noinline)) void gemm##_##T(X8_GEMM_PARAMS) {                            \
        gemm(T, w, g0, g1, nb, act, a_row, n_a, scales, y, y_row);                                \
    }
#define X8_GEMM_PER_TYPE(gemm) X8_TYPES(X8_GEMM_ONE, gemm)
#define X8_GEMM_CALL(T, gemm, ...) gemm##_##T(__VA_ARGS__)
#define X8_EACH_GEMM(type, gemm, ...) X8_EACH_TYPE(type, X8_GEMM_CALL, gemm, __VA_ARGS__)

/* A kx8 block (a K-quant, Q3_K or IQ4_XS super-block of 8 rows): its head (d, Q4_K/Q5_K's dmin,
   the scales and minimums as bytes), then 8 chunks of 32 weights (Q5_K's fifth bits and Q3_K's third
   as planes before the nibbles, Q6_K's top two bits as 2-bit fields before them, or Q3_K's and
   Q2_K's low 2-bit fields; IQ4_XS's nibbles index kvalues_iq4nl) */
static inline int kiln_is_kx8(int type) {
    return kiln_is_kquant(type) || type == KILN_IQ4_XS || type == KILN_Q3_K || type == KILN_Q2_K;
}
static inline size_t kiln_kx8_head(int type) {
    return type == KILN_Q6_K || type == KILN_Q3_K ? 16 + 128 : type == KILN_IQ4_XS ? 16 + 64 : 32 + 128;
}
static inline size_t kiln_kx8_sc_at(int type) { return type == KILN_IQ4_XS ? 16 : 32; } /* sc[8][8] (a scale a 32) */
static inline size_t kiln_kx8_chunk(int type) {
    return type == KILN_Q6_K ? 64 + 128 : type == KILN_Q5_K ? 32 + 128 : type == KILN_Q3_K ? 32 + 64
         : type == KILN_Q2_K ? 64 : 128;
}
static inline size_t kiln_kx8_bytes(int type) {
    return kiln_is_kx8(type) ? kiln_kx8_head(type) + 8 * kiln_kx8_chunk(type) : 0;
}

/* The kx8 types that are super-block types too (Q2_K, Q3_K, IQ4_XS): their prefill takes the interleaved
   tiles of rows_sb_avx2.c, built from the kx8 blocks once for every activation row of a step (the
   GGUF rows' tiles were: Q3_K's bytes hold q times its scale, which a kx8 kernel would make again
   for each X8_TOKENS rows; llama-1b's prefill ran at half the speed in the kx8 kernels) */
static inline int kiln_kx8_tiles(int type) { return type == KILN_Q3_K || type == KILN_IQ4_XS || type == KILN_Q2_K; }
/* rows_sb_avx2.c: y[c * y_row + 8g + r] for the kx8 groups [g0, g1) and activation rows c < n_a; 1 if
   it took the call, 0 where n_a is too few for a tile or there is no memory for one */
int kiln_rows_sb_kx8(int type, const uint8_t *w, int g0, int g1, int n_in, const uint8_t *act, size_t a_row,
                     int n_a, float *y, size_t y_row);

/* An x8 block of a 32-weight type begins with its 8 rows' scales: d[8] f16 (then m[8] f16), or
   MXFP4's e[8] E8M0 bytes; its fifth bits or values follow */
static inline size_t kiln_x8_scale_bytes(const kiln_b32 *f) { return f->e8m0 ? 8 : f->has_min ? 32 : 16; }

#ifdef KILN_HAVE_X8
#include <immintrin.h>

/* MXFP4's 8 E8M0 scales as kiln_e8m0_half's floats: 2^(e - 128), below 2^-126 (e < 2) denormal */
INLINE __m256i x8_e8m0_bits(__m128i e8) {
    const __m256i e = _mm256_cvtepu8_epi32(e8), one = _mm256_set1_epi32(1);
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, one), 23);
    const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_blendv_epi8(tiny, normal, _mm256_cmpgt_epi32(e, one));
}

INLINE __m256i x8_scales_bits(const uint8_t *blk) { return x8_e8m0_bits(_mm_loadl_epi64((const __m128i *)blk)); }

/* the 8 rows' scales d of an x8 block as floats */
INLINE __m256 x8_scales(const kiln_b32 *f, const uint8_t *blk) {
    if (f->e8m0) return _mm256_castsi256_ps(x8_scales_bits(blk));
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
}

/* the sum of 32 int8: their bytes + 128, summed 8 at a time by vpsadbw, less 32 * 128. The loop
   that GCC had made of it, widening them to 32 bits, was 5% of llama-1b Q4_0's prefill GEMM. */
INLINE int x8_sum32(const uint8_t *q) {
    const __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)q), _mm256_set1_epi8((char)0x80));
    const __m256i s4 = _mm256_sad_epu8(u, _mm256_setzero_si256());
    const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
    return _mm_cvtsi128_si32(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2))) - 32 * 128;
}

/* For activation rows c < rows of q8_0 / q8_1 blocks (a_row apart), block b: the scale yd, the
 * sum term ys (q8_1), and the integer sum's seed, -offset * sum(y), since weights are stored
 * + offset; each array holds (c, b) at c * c_step + b * b_step. */
INLINE void act_scales(const int type, const uint8_t *act, size_t a_row, int rows, int nb, float *yd, float *ys,
                       int32_t *seed, int c_step, int b_step) {
    kiln_b32 f = {0};
    kiln_x8_b32_of(type, &f);
    const size_t a_bytes = f.has_min ? sizeof(block_q8_1) : sizeof(block_q8_0), q_at = f.has_min ? 4 : 2;
    for (int c = 0; c < rows; c++)
        for (int b = 0; b < nb; b++) {
            const uint8_t *ab = act + c * a_row + (size_t)b * a_bytes;
            kiln_half h[2];
            memcpy(h, ab, q_at);
            const size_t at = (size_t)c * c_step + (size_t)b * b_step;
            yd[at] = kiln_fp16_to_fp32(h[0]), ys[at] = f.has_min ? kiln_fp16_to_fp32(h[1]) : 0.0f;
            seed[at] = f.offset ? -f.offset * x8_sum32(ab + q_at) : 0;
        }
}
#endif

#ifdef KILN_HAVE_VNNI
#include <immintrin.h>

/* Two x8 blocks side by side in one 512-bit vector: lanes 0..7 hold group g's rows, lanes
 * 8..15 those of the group at a + `apart` bytes. Every lane does exactly the arithmetic of a
 * 256-bit x8 kernel, twice as many rows per instruction. */
INLINE __m512i x16_join(const uint8_t *a, size_t apart) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)(a + apart)), 1);
}

INLINE __m512 x16_half(const uint8_t *a, size_t apart) { /* 8 f16 of each block, as 16 floats */
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                                   _mm_loadu_si128((const __m128i *)(a + apart)), 1));
}

INLINE __m512 x16_scales(const kiln_b32 *f, const uint8_t *a, size_t apart) { /* x8_scales of each block */
    if (f->e8m0)
        return _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(x8_scales_bits(a)), x8_scales_bits(a + apart), 1));
    return x16_half(a, apart);
}

/* The 8 weight vectors of two x8 blocks as unsigned bytes: u[k] holds weights 4k..4k+3 of each row;
   the table types' nibbles become value + 128 */
/* u[k] |= the fifth bits of two x8 blocks' weights (qh, qh + apart: bit k of each byte, x8_pack.c)
   moved to bit 4: one shift and one ternary-logic op a vector (each bit plane had taken a kmovq, a
   mask move and an or) */
INLINE void x16_fifth(const uint8_t *qh, size_t apart, __m512i u[8]) {
    const __m512i raw = x16_join(qh, apart), bit4 = _mm512_set1_epi8(0x10);
    for (int k = 0; k < 8; k++) {
        const __m512i t = k < 4 ? _mm512_slli_epi16(raw, 4 - k) : k == 4 ? raw : _mm512_srli_epi16(raw, k - 4);
        u[k] = _mm512_ternarylogic_epi32(u[k], t, bit4, 0xF8); /* u | (t & 0x10) */
    }
}

INLINE void x16_unpack(const int type, const uint8_t *qs, const uint8_t *qh, size_t apart, __m512i u[8]) {
    if (type == KILN_Q8_0) {
        for (int k = 0; k < 8; k++) u[k] = x16_join(qs + 32 * k, apart);
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4 /* u[] must stay in registers: GCC 12 kept Q5's loop rolled, u[] on the stack */
    for (int v = 0; v < 4; v++) {
        const __m512i raw = x16_join(qs + 32 * v, apart);
        u[2 * v] = _mm512_and_si512(raw, m4), u[2 * v + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
    }
    if (type == KILN_Q5_0 || type == KILN_Q5_1) x16_fifth(qh, apart, u);
    if (kiln_is_lut_b32(type)) {
        const __m512i table = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)kiln_lut_b32(type))),
                                               _mm512_set1_epi8((char)0x80));
        for (int k = 0; k < 8; k++) u[k] = _mm512_shuffle_epi8(table, u[k]);
    }
}

/* s + u . (the 4 bytes at p, in every lane): dpbusd_bcast for 16 lanes, dpbusd8_bcast for 8 (x8_avx2.c's
 * decode). GCC 12 broadcasts them into a register with an instruction of its own before each
 * vpdpbusd, where vpdpbusd can read them broadcast itself ({1to16}, {1to8}): one instruction fewer
 * per 64 multiply-adds took SmolLM2's prefill 10-20% faster on Zen 4. The sums are the same integers. */
typedef int32_t kiln_dword_alias __attribute__((may_alias));
#if defined(__GNUC__) && !defined(__clang__)
#define KILN_DPBUSD_BCAST(name, V, lanes, dpbusd, set1)                                               \
    INLINE V name(V s, V u, const uint8_t *p) {                                                        \
        __asm__("vpdpbusd %2%{1to" #lanes "%}, %1, %0" : "+v"(s) : "v"(u), "m"(*(const kiln_dword_alias *)p)); \
        return s;                                                                                      \
    }
#else
#define KILN_DPBUSD_BCAST(name, V, lanes, dpbusd, set1)                                               \
    INLINE V name(V s, V u, const uint8_t *p) {                                                        \
        int32_t v;                                                                                     \
        memcpy(&v, p, 4);                                                                              \
        return dpbusd(s, u, set1(v));                                                                  \
    }
#endif
KILN_DPBUSD_BCAST(dpbusd_bcast, __m512i, 16, _mm512_dpbusd_epi32, _mm512_set1_epi32)
KILN_DPBUSD_BCAST(dpbusd8_bcast, __m256i, 8, _mm256_dpbusd_epi32, _mm256_set1_epi32)

/* seed[c] + sum(u * y) for C activation rows and 16 row lanes: u[k] holds weights 4k..4k+3 of each
 * row, row c's 4 x steps activation bytes lie at y4 + c * a_row, 4 of them broadcast a vpdpbusd.
 * One chain a row, the rows' steps interleaved, so that C chains are in flight together. Written
 * row after row (two chains of four each), they went in program order and Cascade Lake's scheduler
 * waited on their latency (5 cycles a step): Q4_0's and Q4_1's prefill kernels ran 1.16x and 1.19x
 * faster interleaved (576 x 1536 weights, 512 rows, one thread, in cache, 25 alternations; two chains
 * a row interleaved gave 1.14x and 1.08x, their registers spilling with Q4_1's minimums), and the
 * K-quants' sub-blocks (Q6_K's halves of 16 as two calls of 4 steps) Q4_K 1.05x, Q5_K 1.10x, Q6_K
 * 1.07x (640 x 2048, 256 rows). The integers are the same. */
INLINE void chunk_dots(const __m512i u[], const int steps, const uint8_t *y4, size_t a_row, const int C,
                       const int32_t *seed, __m512i sum[]) {
    for (int c = 0; c < C; c++) sum[c] = _mm512_set1_epi32(seed[c]);
    for (int k = 0; k < steps; k++)
        for (int c = 0; c < C; c++) sum[c] = dpbusd_bcast(sum[c], u[k], y4 + c * a_row + 4 * k);
}

#ifdef KILN_HAVE_AMX
/* Palette 1 with tiles 0-3 of sums (16 rows of 64 bytes), 4-5 of activations (16 rows of a_bytes)
   and 6-7 of weights (w_rows rows of 64 bytes): the shape of both AMX kernels (x8_amx.c,
   rows_sb_avx2.c) */
static inline void kiln_amx_config(int a_bytes, int w_rows) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg = {.palette = 1};
    for (int t = 0; t < 4; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    for (int t = 4; t < 6; t++) cfg.rows[t] = 16, cfg.colsb[t] = (uint16_t)a_bytes;
    for (int t = 6; t < 8; t++) cfg.rows[t] = (uint8_t)w_rows, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
}
#endif

/* AMX (x8_amx.c): where the build, the CPU and the OS allow tiles, x8_rows' values for the
 * activation rows [0, n_a - n_a % 16) of a 32-weight type; returns how many rows it did (0 when
 * AMX is off or the rows are too few or too long). */
int kiln_amx_rows(int type, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act, size_t a_row, int n_a,
                  float *y, size_t y_row);
#endif

#endif
