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
 * The K-quants go the same way a 256-weight super-block at a time (kx8 blocks): the 8 rows'
 * scales first, unpacked to one byte each and arranged [sub-block][row] so that a sub-block's 8
 * scales are one 8-byte load; then each 32-weight chunk in the 32-weight layout above:
 *   Q4_K, Q5_K: d[8], dmin[8] f16; sc[8][8], m[8][8] u8; 8 x ([Q5_K: qh[8] u32] qs[128])
 *               (32 bytes a group more than GGUF's: the 6-bit scales as bytes)
 *   Q6_K:       d[8] f16; sc[16][8] i8; 8 x (qh4[8] u32, qh5[8] u32, qs[128]), u = q + 32 in
 *               0..63, its fifth and sixth bits as two planes (exactly GGUF's bytes)
 * Their integer sums are the references' (kquants.c): sum over sub-blocks of scale x sum(u * y),
 * Q4_K's minimum from q8_K's sums, Q6_K's -32 offset seeding each sub-block's sum.
 *
 * Integer sums are those of the scalar references in quant.c (tests compare against them);
 * only the float accumulation order differs. In prefill, where the CPU and the OS allow AMX,
 * the 32-weight types take those sums from tile multiplies instead (amx_rows): the same
 * integers, then the same float steps, so the same bits.
 */
#include <string.h>

#include "fp16.h"
#include "kernels.h"
#include "kernels_mt.h"
#include "quant_impl.h"

#define X8_MAX_BLOCKS 1024 /* n_in up to 32768 */

static int is_k(int type) { return type == KILN_Q4_K || type == KILN_Q5_K || type == KILN_Q6_K; }

/* bytes of one kx8 block: a super-block of 8 rows */
static size_t kx8_bytes(int type) {
    switch (type) {
    case KILN_Q4_K: return 32 + 128 + 8 * 128;
    case KILN_Q5_K: return 32 + 128 + 8 * (32 + 128);
    case KILN_Q6_K: return 16 + 128 + 8 * (64 + 128);
    default: return 0;
    }
}

size_t kiln_x8_bytes(int type, int n_out, int n_in) {
    if (is_k(type)) return (size_t)(n_out / 8) * (size_t)(n_in / QK_K) * kx8_bytes(type);
    return (size_t)n_out * kiln_row_bytes(type, n_in);
}

int kiln_x8_supported(int type, int n_out, int n_in) {
#ifdef KILN_HAVE_VNNI
    kiln_b32 f;
    if (is_k(type)) return n_out % 8 == 0 && n_in % QK_K == 0 && n_in / 32 <= X8_MAX_BLOCKS;
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

/* One 32-weight chunk of 8 rows in the 32-weight x8 layout: u[r][j] as nibbles in qs, bit 4
 * (and bit 5) as planes qh4 (qh5); NULL planes are not written. */
static void put_chunk(const uint8_t u[8][32], uint32_t *qh4, uint32_t *qh5, uint8_t *qs) {
    for (int r = 0; r < 8; r++)
        for (int j = 0; j < 32; j++) {
            const int v = j / 8, hi = (j / 4) % 2;
            qs[32 * v + 4 * r + j % 4] |= (uint8_t)((u[r][j] & 0x0F) << (hi ? 4 : 0));
            if (qh4 && (u[r][j] & 0x10)) qh4[j / 4] |= 1u << (4 * r + j % 4);
            if (qh5 && (u[r][j] & 0x20)) qh5[j / 4] |= 1u << (4 * r + j % 4);
        }
}

static void pack_kx8(int type, const uint8_t *src, uint8_t *dst, int n_out, int n_in) {
    const int nb = n_in / QK_K;
    const size_t block = type == KILN_Q4_K ? sizeof(block_q4_K) : type == KILN_Q5_K ? sizeof(block_q5_K)
                                                                                      : sizeof(block_q6_K);
    const size_t row_bytes = (size_t)nb * block, out_bytes = kx8_bytes(type);
    for (int g = 0; g < n_out / 8; g++)
        for (int b = 0; b < nb; b++) {
            uint8_t *out = dst + ((size_t)g * nb + b) * out_bytes, u[8][32];
            memset(out, 0, out_bytes);
            const uint8_t *blk[8];
            for (int r = 0; r < 8; r++) blk[r] = src + (size_t)(8 * g + r) * row_bytes + (size_t)b * block;
            if (type == KILN_Q6_K) {
                uint8_t *sc = out + 16, *chunk = out + 16 + 128;
                for (int r = 0; r < 8; r++) {
                    const block_q6_K *x = (const block_q6_K *)blk[r];
                    memcpy(out + 2 * r, &x->d, 2);
                    for (int j = 0; j < 16; j++) sc[8 * j + r] = (uint8_t)x->scales[j];
                }
                for (int c = 0; c < 8; c++, chunk += 192) {
                    for (int r = 0; r < 8; r++)
                        for (int j = 0; j < 32; j++) u[r][j] = (uint8_t)(kiln_q6k_value(blk[r], 32 * c + j) + 32);
                    put_chunk(u, (uint32_t *)chunk, (uint32_t *)(chunk + 32), chunk + 64);
                }
                continue;
            }
            uint8_t *sc = out + 32, *m = out + 96, *chunk = out + 160;
            for (int r = 0; r < 8; r++) {
                memcpy(out + 2 * r, blk[r], 2);       /* d */
                memcpy(out + 16 + 2 * r, blk[r] + 2, 2); /* dmin */
                int scales[8], mins[8]; /* the 6-bit scales and mins after d and dmin */
                kiln_k4_scales(blk[r] + 4, scales, mins);
                for (int j = 0; j < 8; j++) sc[8 * j + r] = (uint8_t)scales[j], m[8 * j + r] = (uint8_t)mins[j];
            }
            for (int c = 0; c < 8; c++) {
                for (int r = 0; r < 8; r++)
                    for (int j = 0; j < 32; j++)
                        u[r][j] = (uint8_t)(type == KILN_Q4_K ? kiln_q4k_value(blk[r], 32 * c + j)
                                                              : kiln_q5k_value(blk[r], 32 * c + j));
                if (type == KILN_Q5_K) {
                    put_chunk(u, (uint32_t *)chunk, NULL, chunk + 32);
                    chunk += 160;
                } else {
                    put_chunk(u, NULL, NULL, chunk);
                    chunk += 128;
                }
            }
        }
}

void kiln_pack_x8(int type, const void *src_, void *dst_, int n_out, int n_in) {
    kiln_b32 f;
    if (is_k(type) && n_out % 8 == 0 && n_in % QK_K == 0) {
        pack_kx8(type, src_, dst_, n_out, n_in);
        return;
    }
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
#define X8_TOKENS 8 /* activation rows that share each unpacked weight block */

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

/* seed + sum(u * y) over a 32-weight chunk for 16 row lanes: u[k] holds weights 4k..4k+3 of
 * each row, y4 the activation's 32 bytes, 4 of them broadcast a vpdpbusd, in two chains */
INLINE __m512i chunk_dot(const __m512i u[8], const uint8_t *y4, __m512i seed) {
    __m512i s0 = seed, s1 = _mm512_setzero_si512();
    for (int k = 0; k < 8; k += 2) {
        int32_t v0, v1;
        memcpy(&v0, y4 + 4 * k, 4), memcpy(&v1, y4 + 4 * k + 4, 4);
        s0 = _mm512_dpbusd_epi32(s0, u[k], _mm512_set1_epi32(v0));
        s1 = _mm512_dpbusd_epi32(s1, u[k + 1], _mm512_set1_epi32(v1));
    }
    return _mm512_add_epi32(s0, s1);
}

/* For activation rows c < rows of q8_0 / q8_1 blocks (a_row apart), block b: the scale yd, the
 * sum term ys (q8_1), and the integer sum's seed, -offset * sum(y), since weights are stored
 * + offset; each array holds (c, b) at c * c_step + b * b_step. */
INLINE void act_scales(const int type, const uint8_t *act, size_t a_row, int rows, int nb, float *yd, float *ys,
                       int32_t *seed, int c_step, int b_step) {
    kiln_b32 f = {0};
    kiln_b32_of(type, &f);
    const size_t a_bytes = f.has_min ? sizeof(block_q8_1) : sizeof(block_q8_0), q_at = f.has_min ? 4 : 2;
    for (int c = 0; c < rows; c++)
        for (int b = 0; b < nb; b++) {
            const uint8_t *ab = act + c * a_row + (size_t)b * a_bytes;
            kiln_half h[2];
            memcpy(h, ab, q_at);
            const size_t at = (size_t)c * c_step + (size_t)b * b_step;
            yd[at] = kiln_fp16_to_fp32(h[0]), ys[at] = f.has_min ? kiln_fp16_to_fp32(h[1]) : 0.0f;
            int sum = 0;
            for (int j = 0; j < 32 && f.offset; j++) sum += (int8_t)ab[q_at + j];
            seed[at] = -f.offset * sum;
        }
}

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
    int32_t seed[X8_TOKENS][X8_MAX_BLOCKS];
    act_scales(type, act, a_row, C, nb, yd[0], ys[0], seed[0], X8_MAX_BLOCKS, 1);
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
                const __m512i sum = chunk_dot(u, y4, _mm512_set1_epi32(seed[c][b]));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
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

/* AMX (Sapphire Rapids on): tile multiplies take the integer sums of an x8 block pair for
 * AMX_M activation rows at once, where the VNNI path spends 8 vpdpbusd a row. A group pair's
 * blocks are unpacked to bytes once, into the weight tiles' layout, for every activation row of
 * the step; the sums are exact, and every float step after them is x8_rows', in the same order,
 * so the results are the same bits with AMX on or off. Linux hands out the tile registers only
 * on request (ARCH_REQ_XCOMP_PERM). */
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define KILN_HAVE_AMX 1
#define AMX_MAX_BLOCKS 128 /* a group pair's unpacked blocks, 512 bytes each, on the stack: n_in <= 4096 */
#define AMX_M 16           /* activation rows a tile multiply */
#define AMX_MAX_ROWS 256   /* activation rows a pass over the weights takes at most */
#define AMX_ROW_BLOCK (32 + 3 * 4) /* an activation row's block as tiles take it: values, yd, ys, seed */
#define AMX_ACT_BYTES (AMX_MAX_BLOCKS * 64 * AMX_ROW_BLOCK) /* on the stack: 64 rows of the longest, more of shorter */
#include <sys/syscall.h>
#include <unistd.h>

static int amx_state; /* 0: not asked yet; 1: in use; -1: the kernel refused; -2: turned off */

static int amx_on(void) {
    int st = __atomic_load_n(&amx_state, __ATOMIC_RELAXED);
    if (st == 0) { /* racing threads both ask; the answer is the same */
        st = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0 ? 1 : -1;
        __atomic_store_n(&amx_state, st, __ATOMIC_RELAXED);
    }
    return st == 1;
}

/* Tiles: 0-3 the sums [row][16 lanes] of successive blocks; 4-5 the activations [row][32 bytes];
 * 6-7 the weights [4-byte group k][16 lanes x 4 bytes], which is what x16_unpack's u[k] holds. */
static void amx_begin(void) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg = {.palette = 1};
    for (int t = 0; t < 4; t++) cfg.rows[t] = AMX_M, cfg.colsb[t] = 64;
    for (int t = 4; t < 6; t++) cfg.rows[t] = AMX_M, cfg.colsb[t] = 32;
    for (int t = 6; t < 8; t++) cfg.rows[t] = 8, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
}

/* GCC's tile load names no memory it reads (nothing orders the unpack's stores before it), and
 * its tile store clobbers all memory (which kept every accumulator on the stack); these name
 * exactly the bytes they read or write. */
#define TILE_LOAD(t, p, stride, bytes)                                                     \
    __asm__ volatile("tileloadd (%1,%2,1), %%tmm" #t ::"m"(*(const uint8_t(*)[bytes])(p)), \
                     "r"((const void *)(p)), "r"((long)(stride)))
#define TILE_STORE(t, p)                                                                        \
    __asm__ volatile("tilestored %%tmm" #t ", (%1,%2,1)" : "=m"(*(int32_t(*)[AMX_M * 16])(p)) \
                     : "r"((void *)(p)), "r"(64L))

/* Step k of four of a pipeline three blocks deep: block b + k (if any) is multiplied into tile k,
 * the tile of the block before it (kp) is stored to sums, and the sums of the block three before
 * go into the rows' chains. A tile's store waits for its multiply; coming a step later, it
 * leaves the next multiply free to start. */
#define AMX_STEP(k, kp, ta, tw)                                                                                      \
    do {                                                                                                             \
        const int bm = b + (k), e = bm - 3;                                                                          \
        if (bm < nb) {                                                                                               \
            TILE_LOAD(ta, at[bm][c0], 32, AMX_M * 32);                                                               \
            TILE_LOAD(tw, wt[bm], 64, 512);                                                                          \
            _tile_zero(k);                                                                                           \
            _tile_dpbsud(k, ta, tw);                                                                                 \
        }                                                                                                            \
        if (bm >= 1 && bm <= nb) TILE_STORE(kp, sums[kp]);                                                           \
        if (e >= 0 && e < nb) {                                                                                      \
            const __m512 d = _mm512_load_ps(wd[e]);                                                                  \
            const float *yde = yd[e] + c0;                                                                           \
            for (int c = 0; c < AMX_M; c++) {                                                                        \
                __m512i sum = _mm512_load_si512(sums[((k) + 1) & 3][c]);                                             \
                if (f.offset) sum = _mm512_add_epi32(sum, _mm512_set1_epi32(seed[e][c0 + c]));                       \
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_set1_ps(yde[c])), acc[c]); \
            }                                                                                                        \
        }                                                                                                            \
    } while (0)

/* x8_rows for the activation rows [0, n_a - n_a % AMX_M) with AMX, as many at a time as
 * AMX_ACT_BYTES holds (all 256 of a chunk for n_in <= 576, 64 for n_in 4096): their scales
 * block-major (a block's 16 rows adjacent) and their int8 values copied block by block, so a
 * tile's 16 rows are 512 contiguous bytes; then each group pair's blocks are read and unpacked
 * once for all of them. The minimums' sums are chains of their own, as in x8_rows, run a block
 * at a time for all 16 rows before the rest. */
INLINE void amx_rows(const int type, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act, size_t a_row,
                     int n_a, float *y, size_t y_row) {
    kiln_b32 f = {0};
    kiln_b32_of(type, &f);
    const size_t x8_bytes = 8 * f.block_bytes, a_bytes = f.has_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t q_at = f.has_min ? 4 : 2;
    _Alignas(64) uint8_t wt[AMX_MAX_BLOCKS][8][64]; /* the pair's blocks as weight tiles */
    _Alignas(64) float wd[AMX_MAX_BLOCKS][16], wm[AMX_MAX_BLOCKS][16], mins[AMX_M][16];
    _Alignas(64) int32_t sums[4][AMX_M][16];
    _Alignas(64) uint8_t act_tiles[AMX_ACT_BYTES];
    int rows = AMX_ACT_BYTES / (nb * AMX_ROW_BLOCK) / AMX_M * AMX_M;
    if (rows > AMX_MAX_ROWS) rows = AMX_MAX_ROWS;
    uint8_t(*at)[rows][32] = (void *)act_tiles; /* [block][row][32]: the rows' values as activation tiles */
    float(*yd)[rows] = (void *)(act_tiles + (size_t)nb * rows * 32), (*ys)[rows] = (void *)&yd[nb][0];
    int32_t(*seed)[rows] = (void *)&ys[nb][0];
    amx_begin();
    for (int r0 = 0; r0 + AMX_M <= n_a; r0 += rows) {
        const int nr = (n_a - r0 < rows ? n_a - r0 : rows) / AMX_M * AMX_M;
        act_scales(type, act + (size_t)r0 * a_row, a_row, nr, nb, yd[0], ys[0], seed[0], 1, rows);
        for (int c = 0; c < nr; c++)
            for (int b = 0; b < nb; b++) memcpy(at[b][c], act + (size_t)(r0 + c) * a_row + b * a_bytes + q_at, 32);
        for (int g = g0; g < g1; g += 2) {
            const int pair = g + 1 < g1;
            const size_t apart = pair ? (size_t)nb * x8_bytes : 0;
            const uint8_t *blk = w + (size_t)g * nb * x8_bytes;
            for (int b = 0; b < nb; b++, blk += x8_bytes) {
                const uint8_t *p = blk + (f.has_min ? 32 : 16);
                __m512i u[8];
                x16_unpack(type, p + (f.qh_at ? 32 : 0), (const uint32_t *)p, apart, u);
                for (int k = 0; k < 8; k++) _mm512_store_si512(wt[b][k], u[k]);
                _mm512_store_ps(wd[b], x16_half(blk, apart));
                if (f.has_min) _mm512_store_ps(wm[b], x16_half(blk + 16, apart));
            }
            for (int c0 = 0; c0 < nr; c0 += AMX_M) {
                __m512 acc[AMX_M];
                if (f.has_min) {
                    for (int c = 0; c < AMX_M; c++) acc[c] = _mm512_setzero_ps();
                    for (int e = 0; e < nb; e++) {
                        const __m512 m = _mm512_load_ps(wm[e]);
                        for (int c = 0; c < AMX_M; c++) acc[c] = _mm512_fmadd_ps(m, _mm512_set1_ps(ys[e][c0 + c]), acc[c]);
                    }
                    for (int c = 0; c < AMX_M; c++) _mm512_store_ps(mins[c], acc[c]);
                }
                for (int c = 0; c < AMX_M; c++) acc[c] = _mm512_setzero_ps();
                for (int b = 0; b < nb + 3; b += 4) { /* tiles 0-3 the sums, 4-5 activations, 6-7 weights */
                    AMX_STEP(0, 3, 4, 6);
                    AMX_STEP(1, 0, 5, 7);
                    AMX_STEP(2, 1, 4, 6);
                    AMX_STEP(3, 2, 5, 7);
                }
                for (int c = 0; c < AMX_M; c++) {
                    const __m512 out = f.has_min ? _mm512_add_ps(acc[c], _mm512_load_ps(mins[c])) : acc[c];
                    float *yc = y + (size_t)(r0 + c0 + c) * y_row + 8 * g;
                    if (pair) _mm512_storeu_ps(yc, out);
                    else _mm256_storeu_ps(yc, _mm512_castps512_ps256(out));
                }
            }
        }
    }
    _tile_release();
}
#endif

int kiln_amx(int enable) {
#ifdef KILN_HAVE_AMX
    if (enable == 0) __atomic_store_n(&amx_state, -2, __ATOMIC_RELAXED);
    if (enable == 1 && __atomic_load_n(&amx_state, __ATOMIC_RELAXED) == -2) __atomic_store_n(&amx_state, 0, __ATOMIC_RELAXED);
    return amx_on();
#else
    (void)enable;
    return 0;
#endif
}

/* 8 bytes of each of two groups (a, a + apart) widened to 16 int32 lanes, signed or not */
INLINE __m512i x16_bytes32(const uint8_t *a, size_t apart, int is_signed) {
    const __m128i b = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)(a + apart)));
    return is_signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
}

/* The kx8 twin of x8_rows: C activation rows of q8_K super-blocks against groups [g0, g1).
 * Per super-block and row lane: isum = sum_j sc_j * sum(u * y) over its sub-blocks (Q6_K's
 * sums seeded with -32 * sum(y)), and for Q4_K/Q5_K msum = sum_j m_j * (y's sum over sub-block
 * j) by vpdpwssd on (m_2p, m_2p+1) pairs; then acc += isum * (d * y.d), mins += msum * (dmin * y.d). */
INLINE void kx8_rows(const int type, const int C, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act,
                     size_t a_row, float *y, size_t y_row) {
    const size_t kb = kx8_bytes(type);
    const int q6 = type == KILN_Q6_K, q5 = type == KILN_Q5_K;
    const size_t chunk_bytes = q6 ? 192 : q5 ? 160 : 128, head = q6 ? 16 + 128 : 32 + 128;
    int32_t mpair[X8_TOKENS][X8_MAX_BLOCKS / 8][4]; /* (sum of y's sub-block 2p) | (of 2p + 1) << 16 */
    for (int c = 0; c < C; c++)
        for (int b = 0; b < nb; b++) {
            const block_q8_K *yb = (const block_q8_K *)(act + c * a_row) + b;
            for (int p = 0; p < 4; p++) {
                const int lo = yb->bsums[4 * p] + yb->bsums[4 * p + 1], hi = yb->bsums[4 * p + 2] + yb->bsums[4 * p + 3];
                mpair[c][b][p] = (int32_t)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16);
            }
        }
    for (int g = g0; g < g1; g += 2) {
        const int pair = g + 1 < g1;
        const size_t apart = pair ? (size_t)nb * kb : 0;
        const uint8_t *blk = w + (size_t)g * nb * kb;
        __m512 acc[X8_TOKENS], mins[X8_TOKENS];
        for (int c = 0; c < C; c++) acc[c] = mins[c] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++, blk += kb) {
            __m512i isum[X8_TOKENS];
            for (int c = 0; c < C; c++) isum[c] = _mm512_setzero_si512();
            const uint8_t *chunk = blk + head;
            for (int j = 0; j < 8; j++, chunk += chunk_bytes) {
                __m512i u[8];
                const uint8_t *qs = chunk + (q6 ? 64 : q5 ? 32 : 0);
                x16_unpack(KILN_Q4_0, qs, (const uint32_t *)qs, apart, u); /* the nibbles (Q4_0 reads no qh) */
                if (q5 || q6) {
                    const uint32_t *h4 = (const uint32_t *)chunk, *h4b = (const uint32_t *)(chunk + apart);
                    const __m512i five = _mm512_set1_epi8(0x10), six = _mm512_set1_epi8(0x20);
                    for (int k = 0; k < 8; k++) {
                        u[k] = _mm512_or_si512(u[k], _mm512_maskz_mov_epi8(h4[k] | (uint64_t)h4b[k] << 32, five));
                        if (q6)
                            u[k] = _mm512_or_si512(u[k], _mm512_maskz_mov_epi8(h4[8 + k] | (uint64_t)h4b[8 + k] << 32, six));
                    }
                }
                if (q6) { /* two sub-blocks of 16, each with its own scale */
                    const __m512i sa = x16_bytes32(blk + 16 + 8 * (2 * j), apart, 1);
                    const __m512i sb = x16_bytes32(blk + 16 + 8 * (2 * j + 1), apart, 1);
                    for (int c = 0; c < C; c++) {
                        const block_q8_K *yb = (const block_q8_K *)(act + c * a_row) + b;
                        const uint8_t *y4 = (const uint8_t *)yb->qs + 32 * j;
                        __m512i s0 = _mm512_set1_epi32(-32 * yb->bsums[2 * j]);
                        __m512i s1 = _mm512_set1_epi32(-32 * yb->bsums[2 * j + 1]);
                        for (int k = 0; k < 4; k++) {
                            int32_t v0, v1;
                            memcpy(&v0, y4 + 4 * k, 4), memcpy(&v1, y4 + 16 + 4 * k, 4);
                            s0 = _mm512_dpbusd_epi32(s0, u[k], _mm512_set1_epi32(v0));
                            s1 = _mm512_dpbusd_epi32(s1, u[4 + k], _mm512_set1_epi32(v1));
                        }
                        isum[c] = _mm512_add_epi32(isum[c], _mm512_add_epi32(_mm512_mullo_epi32(s0, sa),
                                                                             _mm512_mullo_epi32(s1, sb)));
                    }
                } else {
                    const __m512i sc = x16_bytes32(blk + 32 + 8 * j, apart, 0);
                    for (int c = 0; c < C; c++) {
                        const uint8_t *y4 = (const uint8_t *)((const block_q8_K *)(act + c * a_row) + b)->qs + 32 * j;
                        isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(chunk_dot(u, y4, _mm512_setzero_si512()), sc));
                    }
                }
            }
            const __m512 d = x16_half(blk, apart);
            __m512i mp[4];
            if (!q6) /* (m_2p, m_2p+1) of each row lane as two int16 */
                for (int p = 0; p < 4; p++) {
                    const uint8_t *m = blk + 96 + 16 * p;
                    const __m128i a = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)m),
                                                        _mm_loadl_epi64((const __m128i *)(m + 8)));
                    const __m128i bb = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(m + apart)),
                                                         _mm_loadl_epi64((const __m128i *)(m + 8 + apart)));
                    mp[p] = _mm512_cvtepu8_epi16(_mm256_set_m128i(bb, a));
                }
            for (int c = 0; c < C; c++) {
                const float yd = ((const block_q8_K *)(act + c * a_row) + b)->d;
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, _mm512_set1_ps(yd)), acc[c]);
                if (!q6) {
                    __m512i msum = _mm512_setzero_si512();
                    for (int p = 0; p < 4; p++) msum = _mm512_dpwssd_epi32(msum, mp[p], _mm512_set1_epi32(mpair[c][b][p]));
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

/* every activation row, X8_TOKENS at a time */
INLINE void x8_gemm(const int type, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act, size_t a_row,
                    int n_a, float *y, size_t y_row) {
    int c = 0;
    if (is_k(type)) {
        for (; c + X8_TOKENS <= n_a; c += X8_TOKENS)
            kx8_rows(type, X8_TOKENS, w, g0, g1, nb / 8, act + c * a_row, a_row, y + c * y_row, y_row);
        for (; c < n_a; c++) kx8_rows(type, 1, w, g0, g1, nb / 8, act + c * a_row, a_row, y + c * y_row, y_row);
        return;
    }
#ifdef KILN_HAVE_AMX
    if (n_a >= AMX_M && nb <= AMX_MAX_BLOCKS && amx_on()) {
        amx_rows(type, w, g0, g1, nb, act, a_row, n_a, y, y_row);
        c = n_a - n_a % AMX_M;
    }
#endif
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
X8_FOR(q4_K, KILN_Q4_K)
X8_FOR(q5_K, KILN_Q5_K)
X8_FOR(q6_K, KILN_Q6_K)

typedef void (*x8_fn)(const uint8_t *w, int g0, int g1, int nb, const uint8_t *act, size_t a_row, int n_a, float *y,
                      size_t y_row);
static const x8_fn X8[KILN_TYPE_COUNT] = {
    [KILN_Q4_0] = x8_gemm_q4_0, [KILN_Q4_1] = x8_gemm_q4_1, [KILN_Q5_0] = x8_gemm_q5_0,
    [KILN_Q5_1] = x8_gemm_q5_1, [KILN_Q8_0] = x8_gemm_q8_0, [KILN_Q4_K] = x8_gemm_q4_K,
    [KILN_Q5_K] = x8_gemm_q5_K, [KILN_Q6_K] = x8_gemm_q6_K,
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

