/* x8_amx.c: AMX tile multiplies for the x8 matmuls of the 32-weight types (Sapphire Rapids on).
 *
 * Tile multiplies take the integer sums of an x8 block pair for AMX_M activation rows at once,
 * where the VNNI path spends 8 vpdpbusd a row. A group pair's blocks are unpacked to bytes once,
 * into the weight tiles' layout, for every activation row of the step; the sums are exact, and
 * every float step after them is x8_rows' (x8_vnni.c), in the same order, so the results are the
 * same bits with AMX on or off. Linux hands out the tile registers only on request
 * (ARCH_REQ_XCOMP_PERM); where it refuses, or the build has no AMX, the VNNI path runs.
 */
#include "x8.h"

#ifdef KILN_HAVE_AMX
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
static void amx_begin(void) { kiln_amx_config(32, 8); }

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
    kiln_x8_b32_of(type, &f);
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
                const uint8_t *p = blk + kiln_x8_scale_bytes(&f);
                __m512i u[8];
                x16_unpack(type, p + (f.qh_at ? 32 : 0), p, apart, u);
                for (int k = 0; k < 8; k++) _mm512_store_si512(wt[b][k], u[k]);
                _mm512_store_ps(wd[b], x16_scales(&f, blk, apart));
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
                    const __m512 out = _mm512_add_ps(acc[c], f.has_min ? _mm512_load_ps(mins[c]) : _mm512_setzero_ps());
                    float *yc = y + (size_t)(r0 + c0 + c) * y_row + 8 * g;
                    if (pair) _mm512_storeu_ps(yc, out);
                    else _mm256_storeu_ps(yc, _mm512_castps512_ps256(out));
                }
            }
        }
    }
    _tile_release();
}

#define AMX_CASE(type) \
    case type: amx_rows(type, w, g0, g1, nb, act, a_row, n_a, y, y_row); break;
int kiln_amx_rows(int type, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act, size_t a_row, int n_a,
                  float *y, size_t y_row) {
    if (n_a < AMX_M || nb > AMX_MAX_BLOCKS || kiln_is_kx8(type) || !amx_on()) return 0;
    switch (type) { /* each type its own copy of the kernel, the type a constant in it */
        AMX_CASE(KILN_Q4_0) AMX_CASE(KILN_Q4_1) AMX_CASE(KILN_Q5_0) AMX_CASE(KILN_Q5_1) AMX_CASE(KILN_Q8_0)
        AMX_CASE(KILN_IQ4_NL) AMX_CASE(KILN_MXFP4)
    default: return 0;
    }
    return n_a - n_a % AMX_M;
}
#elif defined(KILN_HAVE_VNNI)
int kiln_amx_rows(int type, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act, size_t a_row, int n_a,
                  float *y, size_t y_row) {
    (void)type, (void)w, (void)g0, (void)g1, (void)nb, (void)act, (void)a_row, (void)n_a, (void)y, (void)y_row;
    return 0;
}
#endif

/* Defined on every build, so that every library answers: 0 where AMX is not built or allowed. */
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
