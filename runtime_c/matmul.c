/* matmul.c: y = x W^T (+ bias) across a step's threads, on the weights' GGUF rows or on their
 * copy interleaved by eight rows (x8_pack.c), whichever this build has the kernels for.
 *
 * A matmul quantizes its activation rows once into the format its weight type's dot wants, then
 * each thread takes a range of output rows. Every path gives each output the bits of the type's
 * reference dot (ref_quant.c), so neither the range a thread takes nor the kernel that runs it
 * changes a value.
 */
#include "kernels_mt.h"
#include "quant_impl.h"

/* whether the rows are quantized on each thread's stack (one row, no barrier) or into scratch */
static int act_on_stack(int type, int n_rows, int n_in) {
    return n_rows == 1 && kiln_act_row_bytes(type, n_in) <= KILN_LOCAL_ACT_BYTES;
}

/* where a matmul's quantized rows' x8 scales begin in its scratch (kiln_act_scales_bytes), and tile t's */
static inline uint8_t *x8_scales_of(const void *scratch, int n_rows, size_t a_row) {
    return (uint8_t *)scratch + ((size_t)n_rows * a_row + 63) / 64 * 64;
}
static inline const uint8_t *x8_tile_scales(const uint8_t *scales, int type, int tile, int n_in) {
    return scales ? scales + (size_t)tile * kiln_act_scales_bytes(type, KILN_X8_TILE, n_in) : NULL;
}

const uint8_t *kiln_quantize_rows_mt(const kiln_thread *t, int type, const float *x, int n_rows, int n_in,
                                     void *scratch, uint8_t local[KILN_LOCAL_ACT_BYTES]) {
    const size_t a_row = kiln_act_row_bytes(type, n_in);
    if (act_on_stack(type, n_rows, n_in)) {
        kiln_quantize_act(type, x, local, n_in);
        return local;
    }
    int r0, r1; /* the rows this thread's norm or GLU just wrote: read from its own cache */
    kiln_share(t, n_rows, 1, &r0, &r1);
#ifdef KILN_HAVE_VNNI
    /* and each row's scales as the x8 kernels take them (x8_scales_of), from the quantizer's own vectors:
       made once here, where each claim of a matmul's weight rows had unpacked them again for every tile */
    uint8_t *scales = kiln_act_scales_bytes(type, n_rows, n_in) ? (uint8_t *)x8_scales_of(scratch, n_rows, a_row) : NULL;
    const size_t tile = kiln_act_scales_bytes(type, KILN_X8_TILE, n_in);
#endif
    for (int r = r0; r < r1; r++) {
        uint8_t *row = (uint8_t *)scratch + r * a_row;
#ifdef KILN_HAVE_VNNI
        if (scales) {
            kiln_quantize_q8_tile_avx2(kiln_act_type(type) == KILN_Q8_1, x + (size_t)r * n_in, row, n_in,
                                       scales + r / KILN_X8_TILE * tile, r % KILN_X8_TILE);
            continue;
        }
#endif
        kiln_quantize_act(type, x + (size_t)r * n_in, row, n_in);
    }
    kiln_barrier(t);
    return scratch;
}

/* x's rows in the type's activation format: quantized now, or (quantized) as the matmul before
 * left them in scratch; the float types' f32 rows are x's own, read where they are (every op ends
 * with a barrier, and a run of matmuls without one between them reads one x) */
static const uint8_t *act_rows(const kiln_thread *t, int type, const float *x, int n_rows, int n_in, void *scratch,
                               uint8_t local[KILN_LOCAL_ACT_BYTES], int quantized) {
    if (kiln_act_type(type) == KILN_F32) return (const uint8_t *)x;
    if (quantized && !act_on_stack(type, n_rows, n_in)) return scratch;
    return kiln_quantize_rows_mt(t, type, x, n_rows, n_in, scratch, local);
}

/* A matmul's units (tiles of 8 or 16 rows) are claimed up to CLAIMS_PER_THREAD chunks a thread:
 * enough that a thread slowed 1.4x by its host still finishes with the others, few enough that a
 * chunk keeps its kernel's prefetch streams and tile buffers long (each call of a kernel restarts
 * them), and no chunk smaller than CLAIM_MACS multiply-adds but one a thread: SmolLM2's decode,
 * whose matrices are 0.1-0.9 M weights, was 15-20% slower cut into six chunks a thread. */
#define CLAIMS_PER_THREAD 6
#define CLAIM_MACS (1 << 20)
static int chunk_of(const kiln_thread *t, int units, int n_out, int n_in, int n_rows) {
    const double macs = (double)n_out * n_in * n_rows;
    int chunks = macs / CLAIM_MACS < CLAIMS_PER_THREAD * t->nth ? (int)(macs / CLAIM_MACS) : CLAIMS_PER_THREAD * t->nth;
    if (chunks < t->nth) chunks = t->nth;
    return (units + chunks - 1) / chunks;
}

/* activation rows a chunk takes at a time where it adds a bias: that pass then finds its outputs
 * in cache (a prefill's whole column of them, 2048 rows of a chunk's 128 outputs, is 1 MB) */
#define BIAS_ROWS 64

/* the GGUF rows: tiles of 8 rows, claimed in chunks by the threads */
static void matmul_rows_mt(const kiln_thread *t, int type, const void *w, const float *bias, int n_out, int n_in,
                           const float *x, int n_rows, float *y, void *scratch, int quantized) {
    const size_t w_row = kiln_row_bytes(type, n_in), a_row = kiln_act_row_bytes(type, n_in);
    _Alignas(64) uint8_t local[KILN_LOCAL_ACT_BYTES];
    const uint8_t *act = act_rows(t, type, x, n_rows, n_in, scratch, local, quantized);
    const int step = bias ? BIAS_ROWS : n_rows;
    kiln_claims c = kiln_claims_begin(t, (n_out + 7) / 8, chunk_of(t, (n_out + 7) / 8, n_out, n_in, n_rows));
    for (int c0, c1; kiln_claim(&c, &c0, &c1);) {
        const int o0 = 8 * c0, o1 = 8 * c1 < n_out ? 8 * c1 : n_out;
        for (int r0 = 0; r0 < n_rows; r0 += step) {
            const int rows = n_rows - r0 < step ? n_rows - r0 : step;
            float *yr = y + (size_t)r0 * n_out;
            kiln_rows(type, n_in, (const uint8_t *)w + (size_t)o0 * w_row, w_row, o1 - o0, act + r0 * a_row, a_row,
                      rows, yr + o0, (size_t)n_out);
            kiln_add_bias(yr, bias, rows, n_out, o0, o1);
        }
    }
}

/* A prefill's matmul whose weights are at most this many bytes is shared among the threads by
 * its activation rows, 8 at a time, each thread taking every weight (from its L2). Shared by weight
 * rows, each claim's kernel unpacks its 8 activation rows' scales again (x8_rows' act_scales):
 * SmolLM2's k and v, 192 rows, had a pair of groups a claim, and the unpacking was as much work as
 * their dot products. Prefill in one process, 2 threads, Cascade Lake, same bits: SmolLM2 1.06x,
 * Gemma 3 270M 1.07-1.08x (0.5 MB: 1.04x), llama-1b Q4_0 1.15x (its k and v); at 2.5 MB, llama-1b's
 * q and o too, read from L3 for every 8 rows, 1.01x. Larger weights keep the split by weight rows,
 * each claim's weights in L2 for all the activation rows. Claimed a tile at a time: every tile
 * reads the whole matrix anyway, so a finer claim costs an atomic alone, and the thread that
 * takes the last one keeps the other waiting at most one tile (in chunks of chunk_of's six tiles,
 * three on average: SmolLM2 prefill 1.014x, Gemma 3 1.017x, in one process on a Zen 4). */
#define X8_SHARE_BY_ROWS_BYTES (1024 << 10)
#ifdef KILN_HAVE_VNNI
#define X8_ROW_TILE KILN_X8_TILE
#else /* the AVX2 kernel takes 6 rows a pass (x8_avx2.c's X8_ROWS): a claim of 8 had made a pass of 6 and one of 2,
         unpacking every weight twice; 24 rows are 4 whole passes (no tile scales without VNNI) */
#define X8_ROW_TILE (3 * KILN_X8_TILE)
#endif

/* A run of matmuls on one x (q, k and v; gate and up) has no barrier inside it, and its packed
 * weights lie one after another. Where each matmul would be cut into one static share a thread,
 * the run is cut so instead, as one matrix: a thread reads one stream rather than a short one in
 * each matrix (SmolLM2's k and v, 35 KB a thread, had read at 60-70% of the bandwidth). Whether a
 * share is static depends on the run alone, so every thread of the region decides alike. Returns
 * 0 where the run is cut as its matmuls are. */
static int run_share(const kiln_thread *t, int n_out, int n_in, int n_rows, int run_at, int run_rows, int *g0, int *g1) {
    const int pairs = (run_rows / 8 + 1) / 2; /* pairs of the run's groups */
    if (run_rows <= n_out || run_at % 8 || run_rows % 8 || chunk_of(t, pairs, run_rows, n_in, n_rows) * t->nth < pairs)
        return 0; /* not a static share: kiln_claims_begin's own test */
    int p0, p1;
    kiln_share(t, pairs, 1, &p0, &p1);
    const int a = 2 * p0 > run_at / 8 ? 2 * p0 : run_at / 8, b = run_at / 8 + n_out / 8;
    *g0 = a - run_at / 8, *g1 = (2 * p1 < b ? 2 * p1 : b) - run_at / 8;
    if (*g1 < *g0) *g1 = *g0;
    return 1;
}

static void matmul_mt(const kiln_thread *t, const kiln_weight *w, const float *bias, int n_out, int n_in,
                      const float *x, int n_rows, float *y, void *scratch, int quantized, int run_at, int run_rows) {
#ifdef KILN_HAVE_X8
    if (w->packed && kiln_x8_supported(w->type, n_out, n_in)) {
        _Alignas(64) uint8_t local[KILN_LOCAL_ACT_BYTES];
        const uint8_t *act = act_rows(t, w->type, x, n_rows, n_in, scratch, local, quantized);
        const size_t a_row = kiln_act_row_bytes(w->type, n_in);
        /* the rows' scales where the quantizer laid them out (kiln_act_scales_bytes; NULL: the kernel makes them) */
        const uint8_t *scales = act == scratch && kiln_act_scales_bytes(w->type, n_rows, n_in) ? x8_scales_of(scratch, n_rows, a_row) : NULL;
        if (n_rows >= 2 * X8_ROW_TILE * t->nth && kiln_x8_bytes(w->type, n_out, n_in) <= X8_SHARE_BY_ROWS_BYTES) {
            const int tiles = (n_rows + X8_ROW_TILE - 1) / X8_ROW_TILE;
            kiln_claims c = kiln_claims_begin(t, tiles, 1);
            for (int t0, t1; kiln_claim(&c, &t0, &t1);) {
                const int r0 = X8_ROW_TILE * t0, r1 = X8_ROW_TILE * t1 < n_rows ? X8_ROW_TILE * t1 : n_rows;
                float *yr = y + (size_t)r0 * n_out;
                kiln_x8_gemm_tiles(w->type, w->packed, 0, n_out / 8, n_in, act + r0 * a_row, a_row, r1 - r0,
                                   x8_tile_scales(scales, w->type, t0, n_in), yr, (size_t)n_out);
                kiln_add_bias(yr, bias, r1 - r0, n_out, 0, n_out);
            }
            return;
        }
        int g0, g1;
        if (run_share(t, n_out, n_in, n_rows, run_at, run_rows, &g0, &g1)) {
            if (g0 < g1) {
                kiln_x8_gemm_tiles(w->type, w->packed, g0, g1, n_in, act, a_row, n_rows, scales, y, (size_t)n_out);
                kiln_add_bias(y, bias, n_rows, n_out, 8 * g0, 8 * g1);
            }
            return;
        }
        const int pairs = (n_out / 8 + 1) / 2; /* pairs of groups share vectors */
        kiln_claims c = kiln_claims_begin(t, pairs, chunk_of(t, pairs, n_out, n_in, n_rows));
        for (int p0, p1; kiln_claim(&c, &p0, &p1);) {
            const int g0 = 2 * p0, g1 = 2 * p1 < n_out / 8 ? 2 * p1 : n_out / 8;
            kiln_x8_gemm_tiles(w->type, w->packed, g0, g1, n_in, act, a_row, n_rows, scales, y, (size_t)n_out);
            kiln_add_bias(y, bias, n_rows, n_out, 8 * g0, 8 * g1);
        }
        return;
    }
#endif
    matmul_rows_mt(t, w->type, w->data, bias, n_out, n_in, x, n_rows, y, scratch, quantized);
}

void kiln_matmul_mt(const kiln_thread *t, const kiln_weight *w, const float *bias, int n_out, int n_in,
                    const float *x, int n_rows, float *y, void *scratch, int run_at, int run_rows) {
    matmul_mt(t, w, bias, n_out, n_in, x, n_rows, y, scratch, 0, run_at, run_rows);
}

void kiln_matmul_quantized_mt(const kiln_thread *t, const kiln_weight *w, const float *bias, int n_out, int n_in,
                              const float *x, int n_rows, float *y, void *scratch, int run_at, int run_rows) {
    matmul_mt(t, w, bias, n_out, n_in, x, n_rows, y, scratch, 1, run_at, run_rows);
}

void kiln_matmul(int type, const void *w, const float *bias, int n_out, int n_in, const float *x, int n_rows,
                 float *y, void *scratch) {
    const kiln_thread alone = {0, 1, NULL};
    matmul_rows_mt(&alone, type, w, bias, n_out, n_in, x, n_rows, y, scratch, 0);
}

void kiln_matmul_x8(int type, const void *packed, const void *w, const float *bias, int n_out, int n_in,
                    const float *x, int n_rows, float *y, void *scratch) {
    const kiln_thread alone = {0, 1, NULL};
    const kiln_weight weight = {type, w, packed};
    kiln_matmul_mt(&alone, &weight, bias, n_out, n_in, x, n_rows, y, scratch, 0, n_out);
}
