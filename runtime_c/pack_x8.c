/* pack_x8.c: matmuls over weights repacked at load so that eight rows share each vector.
 *
 * A matmul against few activation rows (decode above all) spends most of its instructions on
 * per-block bookkeeping when it reads the GGUF layout: converting scales, broadcasting them,
 * reducing each block's lanes. Interleaving eight rows removes it: in the x8 layout one 32-byte
 * vector holds 4 weights of each of 8 rows, so vpdpbusd against 4 activation bytes broadcast
 * to every lane yields 8 row sums at once, and the 8 rows' scales are one 16-byte load. The
 * kernels put two such blocks (two groups of rows) in each 512-bit vector, and in prefill and
 * batched steps each unpacked weight block serves 8 activation rows.
 *
 * Layout of a matrix of n_out rows (n_out % 8 == 0): groups of 8 rows, each a run of x8
 * blocks, one per 32-weight block of the row. An x8 block holds, in order:
 *   d[8]          f16, the rows' scales
 *   m[8]          f16, the rows' minimums (Q4_1, Q5_1)
 *   qh[8]         u32, 5-bit types: bit 4r+j of qh[c] is the fifth bit of weight 4c+j of row r
 *   qs            4-bit types: 4 vectors of 32 bytes; byte 4r+j of vector v has weight 8v+j of
 *                 row r in its low nibble and weight 8v+4+j in its high nibble
 *                 Q8_0: 8 vectors of 32 bytes; byte 4r+j of vector c is weight 4c+j of row r,
 *                 stored as q ^ 0x80 (unsigned, offset 128)
 * which is exactly as many bytes as the eight GGUF blocks it replaces. The compiler packs with
 * kiln_pack_x8 into a file (compiler/packing.py) that the model library maps.
 *
 * Integer sums are those of the scalar references in quant.c (tests compare against them);
 * only the float accumulation order differs.
 */
#include <string.h>

#include "fp16.h"
#include "kernels.h"
#include "kernels_mt.h"
#include "quant_impl.h"

#define X8_MAX_BLOCKS 1024 /* n_in up to 32768 */

int kiln_x8_supported(int type, int n_out, int n_in) {
#ifdef KILN_HAVE_VNNI
    kiln_b32 f;
    return kiln_b32_of(type, &f) && n_out % 8 == 0 && n_in % 32 == 0 && n_in / 32 <= X8_MAX_BLOCKS;
#else
    (void)type, (void)n_out, (void)n_in;
    return 0; /* no x8 kernel in this build: matmuls read the GGUF layout */
#endif
}

/* Weight j (0..31) of a GGUF block as the unsigned byte u the x8 layout stores. */
static int block_weight(const kiln_b32 *f, const uint8_t *blk, int j) {
    if (f->bits == 8) return blk[f->qs_at + j] ^ 0x80;
    int u = (blk[f->qs_at + j % 16] >> (j < 16 ? 0 : 4)) & 0x0F;
    if (f->qh_at) u |= ((blk[f->qh_at + j / 8] >> (j % 8)) & 1) << 4;
    return u;
}

void kiln_pack_x8(int type, const void *src_, void *dst_, int n_out, int n_in) {
    kiln_b32 f;
    if (!kiln_b32_of(type, &f) || n_out % 8 != 0) return;
    const uint8_t *src = src_;
    uint8_t *dst = dst_;
    const int nb = n_in / 32;
    const size_t row_bytes = (size_t)nb * f.block_bytes, x8_bytes = 8 * f.block_bytes;
    for (int g = 0; g < n_out / 8; g++)
        for (int b = 0; b < nb; b++) {
            uint8_t *out = dst + ((size_t)g * nb + b) * x8_bytes;
            memset(out, 0, x8_bytes);
            kiln_half *d = (kiln_half *)out, *m = d + 8;
            uint8_t *p = out + (f.has_min ? 32 : 16);
            uint32_t *qh = (uint32_t *)p;
            uint8_t *qs = p + (f.qh_at ? 32 : 0);
            for (int r = 0; r < 8; r++) {
                const uint8_t *blk = src + (size_t)(8 * g + r) * row_bytes + (size_t)b * f.block_bytes;
                memcpy(&d[r], blk, sizeof(kiln_half)); /* every block type begins with d, the _1 types then m */
                if (f.has_min) memcpy(&m[r], blk + sizeof(kiln_half), sizeof(kiln_half));
                for (int j = 0; j < 32; j++) {
                    const int q = block_weight(&f, blk, j);
                    if (f.bits == 8) {
                        qs[32 * (j / 4) + 4 * r + j % 4] = (uint8_t)q;
                        continue;
                    }
                    const int v = j / 8, hi = (j / 4) % 2, byte = 32 * v + 4 * r + j % 4;
                    qs[byte] |= (uint8_t)((q & 0x0F) << (hi ? 4 : 0));
                    if (f.qh_at && (q & 0x10)) qh[j / 4] |= 1u << (4 * r + j % 4);
                }
            }
        }
}


#ifdef KILN_HAVE_VNNI
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

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

/* The 8 weight vectors of two x8 blocks as unsigned bytes: u[k] holds weights 4k..4k+3 of each row */
INLINE void x16_unpack(const int type, const uint8_t *qs, const uint32_t *qh, size_t apart, __m512i u[8]) {
    if (type == KILN_Q8_0) {
        for (int k = 0; k < 8; k++) u[k] = x16_join(qs + 32 * k, apart);
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F), five = _mm512_set1_epi8(0x10);
    const uint32_t *qh2 = (const uint32_t *)((const uint8_t *)qh + apart);
    for (int v = 0; v < 4; v++) {
        const __m512i raw = x16_join(qs + 32 * v, apart);
        u[2 * v] = _mm512_and_si512(raw, m4), u[2 * v + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
        if (type == KILN_Q5_0 || type == KILN_Q5_1)
            for (int k = 2 * v; k < 2 * v + 2; k++)
                u[k] = _mm512_or_si512(u[k], _mm512_maskz_mov_epi8(qh[k] | (uint64_t)qh2[k] << 32, five));
    }
}

#define X8_TOKENS 8        /* activation rows that share each unpacked weight block */

/* y[c * y_row + 8g + r] for groups [g0, g1) and C activation rows (q8_0 or q8_1 blocks) from
 * act. The activation rows' scales, and for offset types -offset * sum(y) per block, are
 * unpacked once per call; each weight block is unpacked once for the C rows. Groups go two at
 * a time; a last odd group is computed in both halves and stored once. */
INLINE void x8_rows(const int type, const int C, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act,
                    size_t a_row, float *y, size_t y_row) {
    kiln_b32 f = {0};
    kiln_b32_of(type, &f);
    const size_t x8_bytes = 8 * f.block_bytes, a_bytes = f.has_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t q_at = f.has_min ? 4 : 2; /* the activation block's int8 values follow d (and s) */
    float yd[X8_TOKENS][X8_MAX_BLOCKS], ys[X8_TOKENS][X8_MAX_BLOCKS];
    int32_t seed[X8_TOKENS][X8_MAX_BLOCKS]; /* weights are stored + offset: start from -offset * sum(y) */
    for (int c = 0; c < C; c++)
        for (int b = 0; b < nb; b++) {
            const uint8_t *ab = act + c * a_row + (size_t)b * a_bytes;
            kiln_half h[2];
            memcpy(h, ab, q_at);
            yd[c][b] = kiln_fp16_to_fp32(h[0]), ys[c][b] = f.has_min ? kiln_fp16_to_fp32(h[1]) : 0.0f;
            int sum = 0;
            for (int j = 0; j < 32; j++) sum += (int8_t)ab[q_at + j];
            seed[c][b] = -f.offset * sum;
        }
    for (int g = g0; g < g1; g += 2) {
        const int pair = g + 1 < g1;
        const size_t apart = pair ? (size_t)nb * x8_bytes : 0;
        const uint8_t *blk = w + (size_t)g * nb * x8_bytes;
        __m512 acc[X8_TOKENS], mins[X8_TOKENS];
        for (int c = 0; c < C; c++) acc[c] = mins[c] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++, blk += x8_bytes) {
            const uint8_t *p = blk + (f.has_min ? 32 : 16);
            __m512i u[8];
            x16_unpack(type, p + (f.qh_at ? 32 : 0), (const uint32_t *)p, apart, u);
            const __m512 d = x16_half(blk, apart), m = f.has_min ? x16_half(blk + 16, apart) : d;
            for (int c = 0; c < C; c++) {
                /* 4 activation bytes a lane, broadcast from memory against 16 rows' 4 weights */
                const uint8_t *y4 = act + c * a_row + (size_t)b * a_bytes + q_at;
                __m512i s0 = _mm512_set1_epi32(seed[c][b]), s1 = _mm512_setzero_si512();
                for (int k = 0; k < 8; k += 2) {
                    int32_t v0, v1;
                    memcpy(&v0, y4 + 4 * k, 4), memcpy(&v1, y4 + 4 * k + 4, 4);
                    s0 = _mm512_dpbusd_epi32(s0, u[k], _mm512_set1_epi32(v0));
                    s1 = _mm512_dpbusd_epi32(s1, u[k + 1], _mm512_set1_epi32(v1));
                }
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                                         _mm512_mul_ps(d, _mm512_set1_ps(yd[c][b])), acc[c]);
                if (f.has_min) mins[c] = _mm512_fmadd_ps(m, _mm512_set1_ps(ys[c][b]), mins[c]);
            }
        }
        for (int c = 0; c < C; c++) {
            const __m512 out = _mm512_add_ps(acc[c], mins[c]);
            if (pair) _mm512_storeu_ps(y + c * y_row + 8 * g, out);
            else _mm256_storeu_ps(y + c * y_row + 8 * g, _mm512_castps512_ps256(out));
        }
    }
}

/* every activation row, X8_TOKENS at a time */
INLINE void x8_gemm(const int type, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act, size_t a_row,
                    int n_a, float *y, size_t y_row) {
    int c = 0;
    for (; c + X8_TOKENS <= n_a; c += X8_TOKENS)
        x8_rows(type, X8_TOKENS, w, g0, g1, nb, act + c * a_row, a_row, y + c * y_row, y_row);
    for (; c < n_a; c++) x8_rows(type, 1, w, g0, g1, nb, act + c * a_row, a_row, y + c * y_row, y_row);
}

#define X8_FOR(name, type)                                                                                        \
    static void x8_gemm_##name(const uint8_t *w, int g0, int g1, int nb, const uint8_t *act, size_t a_row, int n_a, \
                               float *y, size_t y_row) {                                                          \
        x8_gemm(type, w, g0, g1, nb, act, a_row, n_a, y, y_row);                                                  \
    }
X8_FOR(q4_0, KILN_Q4_0)
X8_FOR(q4_1, KILN_Q4_1)
X8_FOR(q5_0, KILN_Q5_0)
X8_FOR(q5_1, KILN_Q5_1)
X8_FOR(q8_0, KILN_Q8_0)

typedef void (*x8_fn)(const uint8_t *w, int g0, int g1, int nb, const uint8_t *act, size_t a_row, int n_a, float *y,
                      size_t y_row);
static const x8_fn X8[KILN_TYPE_COUNT] = {
    [KILN_Q4_0] = x8_gemm_q4_0, [KILN_Q4_1] = x8_gemm_q4_1, [KILN_Q5_0] = x8_gemm_q5_0,
    [KILN_Q5_1] = x8_gemm_q5_1, [KILN_Q8_0] = x8_gemm_q8_0,
};
#endif

void kiln_matmul_x8_mt(const kiln_thread *t, int type, const void *packed, const void *w, const float *bias, int n_out,
                       int n_in, const float *x, int n_rows, float *y, void *scratch) {
#ifdef KILN_HAVE_VNNI
    if (packed && kiln_x8_supported(type, n_out, n_in)) {
        _Alignas(64) uint8_t local[KILN_LOCAL_ACT_BYTES];
        const uint8_t *act = kiln_quantize_rows_mt(t, type, x, n_rows, n_in, scratch, local);
        int g0, g1;
        kiln_share(t, n_out / 8, 2, &g0, &g1); /* pairs of groups share vectors */
        if (g1 == g0) return;
        X8[type](packed, g0, g1, n_in / 32, act, kiln_act_row_bytes(type, n_in), n_rows, y, (size_t)n_out);
        kiln_add_bias(y, bias, n_rows, n_out, 8 * g0, 8 * g1);
        return;
    }
#endif
    (void)packed;
    kiln_matmul_mt(t, type, w, bias, n_out, n_in, x, n_rows, y, scratch);
}

void kiln_matmul_x8(int type, const void *packed, const void *w, const float *bias, int n_out, int n_in,
                    const float *x, int n_rows, float *y, void *scratch) {
    const kiln_thread alone = {0, 1, NULL};
    kiln_matmul_x8_mt(&alone, type, packed, w, bias, n_out, n_in, x, n_rows, y, scratch);
}

