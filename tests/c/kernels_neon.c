/* kernels_neon.c: every NEON kernel against its scalar reference, bit for bit, on random blocks;
 * built with a target's runtime and flags and run under qemu by tests/test_target_aarch64.py.
 *
 *     ./kernels_neon
 *
 * Prints the kernel paths compiled in (isa.h's KILN_HAVE_*), one line per family checked, and
 * every mismatch; exits 1 if there was one. The references are the runtime's own (*_ref), and
 * for the float helpers of vec_f32.h and attn_span.h, their definitions spelled as scalar loops.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_span.h"
#include "fp16.h"
#include "kernels.h"
#include "quant_impl.h"
#include "vec_f32.h"

static int failures, checks;

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static uint64_t next_u64(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static float uniform(void) { return (float)(next_u64() >> 40) / (float)(1 << 24); } /* [0, 1) */
static float normalish(void) { return (uniform() + uniform() + uniform() - 1.5f) * 2.0f; }
static void random_bytes(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)next_u64();
}
static void put_half(uint8_t *p, float f) {
    const kiln_half h = kiln_fp32_to_fp16(f);
    memcpy(p, &h, sizeof h);
}

/* a and b hold the same bits */
static void same(const char *what, int index, const void *a, const void *b, size_t bytes) {
    checks++;
    if (memcmp(a, b, bytes) == 0) return;
    if (failures++ < 20) {
        if (bytes == sizeof(float)) {
            float x, y;
            memcpy(&x, a, 4), memcpy(&y, b, 4);
            fprintf(stderr, "MISMATCH %s [%d]: %.9g != %.9g\n", what, index, x, y);
        } else {
            fprintf(stderr, "MISMATCH %s [%d]: %zu bytes differ\n", what, index, bytes);
        }
    }
}

/* n weights of a row of type: random bytes, with every scale a sane half (a random one could be
 * a NaN or an infinity, whose products say nothing); the types after the K-quants are drawn
 * again, block by block, until the reference dequantizes them to finite weights of at most 1e6 */
/* weights a block of type holds: 32, or a super-block's 256 (kiln_row_bytes of 32 is then 0) */
static int block_weights_of(int type) { return kiln_row_bytes(type, 32) ? 32 : QK_K; }

static int sane_block(int type, const uint8_t *blk) {
    float w[QK_K];
    const int n = block_weights_of(type);
    kiln_dequantize_row_ref(type, blk, w, n);
    for (int i = 0; i < n; i++)
        if (!(w[i] == w[i]) || w[i] > 1e6f || w[i] < -1e6f) return 0;
    return 1;
}

static void random_row(int type, uint8_t *row, int n) {
    if (type == KILN_F32) {
        for (int i = 0; i < n; i++) ((float *)row)[i] = normalish();
        return;
    }
    if (type == KILN_F16 || type == KILN_BF16) { /* bf16: a float's top half */
        for (int i = 0; i < n; i++) {
            const float x = normalish();
            uint32_t bits;
            memcpy(&bits, &x, sizeof bits);
            const uint16_t h = type == KILN_F16 ? kiln_fp32_to_fp16(x) : (uint16_t)(bits >> 16);
            memcpy(row + 2 * i, &h, sizeof h);
        }
        return;
    }
    random_bytes(row, kiln_row_bytes(type, n));
    kiln_b32 f;
    if (kiln_b32_of(type, &f)) {
        for (int b = 0; b < n / 32; b++) {
            put_half(row + b * f.block_bytes, 0.01f + 0.1f * uniform());
            if (f.has_min) put_half(row + b * f.block_bytes + 2, -0.2f * uniform());
        }
        return;
    }
    const size_t bb = kiln_row_bytes(type, QK_K);
    if (!kiln_is_kquant(type)) { /* IQ4_NL and MXFP4 (32 weights a block), the i-quants, Q2_K, ... */
        const int weights = block_weights_of(type);
        const size_t block = kiln_row_bytes(type, weights);
        for (int b = 0; b < n / weights; b++)
            while (!sane_block(type, row + b * block)) random_bytes(row + b * block, block);
        return;
    }
    for (int b = 0; b < n / QK_K; b++) {
        uint8_t *blk = row + b * bb;
        if (type == KILN_Q6_K) put_half(blk + offsetof(block_q6_K, d), 0.001f + 0.01f * uniform());
        else put_half(blk, 0.001f + 0.01f * uniform()), put_half(blk + 2, 0.001f + 0.01f * uniform());
    }
}

/* kiln_rows (the type's NEON twin) against the reference dot of every (weight row, activation
 * row) pair: 13 weight rows (a partial tile), 1 to 5 activation rows (pairs and a lone one) */
static void check_rows(void) {
    enum { N_W = 13, N_A = 5, N_IN = 768 };
    for (int type = 0; type < KILN_TYPE_COUNT; type++) { /* every type of the one table (types.c) */
        if (!kiln_type_supported(type)) continue;
        const int n = block_weights_of(type) == 32 ? N_IN : 2 * QK_K;
        const size_t w_row = kiln_row_bytes(type, n), a_row = kiln_act_row_bytes(type, n);
        uint8_t *w = malloc(N_W * w_row), *act = malloc(N_A * a_row);
        float x[N_IN], y[N_A * N_W];
        for (int r = 0; r < N_W; r++) random_row(type, w + r * w_row, n);
        for (int c = 0; c < N_A; c++) {
            for (int i = 0; i < n; i++) x[i] = normalish() * (c + 1);
            kiln_quantize_act(type, x, act + c * a_row, n);
        }
        const int before = failures;
        for (int n_a = 1; n_a <= N_A; n_a++) {
            kiln_rows(type, n, w, w_row, N_W, act, a_row, n_a, y, N_W);
            for (int c = 0; c < n_a; c++)
                for (int r = 0; r < N_W; r++) {
                    const float want = kiln_vec_dot_ref(type, n, w + r * w_row, act + c * a_row);
                    same(kiln_type_name(type), c * N_W + r, &y[c * N_W + r], &want, sizeof want);
                }
        }
        printf("rows %s: %s\n", kiln_type_name(type), failures == before ? "equal" : "DIFFER");
        free(w), free(act);
    }
}

/* the activation quantizers (q8_0, q8_1, q8_K) against their references: random rows, rows with
 * half-way values (d = 1 exactly), all-zero blocks */
static void check_act(void) {
    enum { N = 1024 };
    const int types[] = {KILN_Q4_0, KILN_Q4_1, KILN_Q4_K};
    const char *names[] = {"q8_0", "q8_1", "q8_K"};
    static float x[8][N];
    for (int r = 0; r < 8; r++)
        for (int i = 0; i < N; i++) x[r][i] = normalish() * (r + 1);
    x[0][0] = 127.0f;
    for (int i = 1; i < 32; i++) x[0][i] = (float)(i - 16) + 0.5f; /* ties */
    for (int i = 0; i < 32; i++) x[1][i] = -x[0][i];
    for (int i = 0; i < 256; i++) x[2][i] = 0.0f;
    x[3][5] = 9.0f, x[3][9] = -9.0f; /* two values reach max|x|: the first one's sign */
    x[4][7] = -9.0f, x[4][9] = 9.0f;
    for (int k = 0; k < 3; k++) {
        const size_t bytes = kiln_act_row_bytes(types[k], N);
        uint8_t *fast = malloc(bytes), *ref = malloc(bytes);
        const int before = failures;
        for (int r = 0; r < 8; r++) {
            memset(fast, 0xA5, bytes), memset(ref, 0x5A, bytes);
            kiln_quantize_act(types[k], x[r], fast, N);
            kiln_quantize_act_ref(types[k], x[r], ref, N);
            same(names[k], r, fast, ref, bytes);
        }
        printf("quantize %s: %s (SIMD twin: %s)\n", names[k], failures == before ? "equal" : "DIFFER",
               kiln_simd_kernels(types[k]) & KILN_SIMD_ACT ? "yes" : "no");
        free(fast), free(ref);
    }
}

/* the dequantizers of the f16 and q8_0 caches against their references */
static void check_dequant(void) {
    enum { N = 1000 };
    uint16_t halves[N];
    uint8_t q8[N / 32 * sizeof(block_q8_0)];
    for (int i = 0; i < N; i++) halves[i] = kiln_fp32_to_fp16(normalish() * 100.0f);
    random_row(KILN_Q8_0, q8, N / 32 * 32);
    float fast[N], ref[N];
    const int before = failures;
    kiln_dequantize_row(KILN_F16, halves, fast, N);
    kiln_dequantize_row_ref(KILN_F16, halves, ref, N);
    same("dequant f16", 0, fast, ref, sizeof fast);
    kiln_dequantize_row(KILN_Q8_0, q8, fast, N / 32 * 32);
    kiln_dequantize_row_ref(KILN_Q8_0, q8, ref, N / 32 * 32);
    same("dequant q8_0", 0, fast, ref, N / 32 * 32 * sizeof(float));
    printf("dequantize f16, q8_0: %s\n", failures == before ? "equal" : "DIFFER");
}

/* vec_f32.h: each vector spelling against its definition, spelled as the scalar loop */
static void check_vec(void) {
    enum { N = 333 };
    float a[N], b[N], y[N], z[N];
    for (int i = 0; i < N; i++) a[i] = normalish(), b[i] = normalish();
    const int before = failures;
    for (int n = 0; n <= N; n += n < 40 ? 1 : 37) {
        const float fast = kiln_vdot(a, b, n), ref = kiln_vdot_ref(a, b, n);
        same("vdot", n, &fast, &ref, sizeof fast);
        memcpy(y, b, sizeof y), memcpy(z, b, sizeof z);
        kiln_vaxpy(y, 0.37f, a, n);
        for (int i = 0; i < n; i++) z[i] = fmaf(0.37f, a[i], z[i]);
        same("vaxpy", n, y, z, (size_t)n * sizeof(float));
        float m = -INFINITY;
        for (int i = 0; i < n; i++) m = a[i] > m ? a[i] : m;
        const float vm = kiln_vmax(a, n);
        same("vmax", n, &vm, &m, sizeof m);
        /* x[i] = e^(x[i] - m) and their sum: lane i % 8 for whole blocks of 8, then one by one */
        for (int i = 0; i < n; i++) y[i] = z[i] = a[i] * 30.0f;
        const float sum = kiln_vexp_sum(y, 1.5f, n);
        float lanes[8] = {0};
        int i = 0;
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++) lanes[k] += z[i + k] = kiln_expf(z[i + k] - 1.5f);
        float want = kiln_hsum8_ref(lanes);
        for (; i < n; i++) want += z[i] = kiln_expf(z[i] - 1.5f);
        same("vexp_sum", n, &sum, &want, sizeof sum);
        same("vexp_sum values", n, y, z, (size_t)n * sizeof(float));
    }
    /* e^x and tanh at the edges of their ranges and between */
    static const float edges[] = {-INFINITY, -1000.0f, -87.5f, -87.0f, -86.99f, -0.0f, 0.0f, 1e-30f, 0.3466f,
                                  87.9f, 88.0f, 88.5f, 1000.0f, INFINITY, 0.625f, -0.625f, 0.62499f, 9.5f};
    float x[4096], e[4096];
    int n = 0;
    for (size_t k = 0; k < sizeof edges / sizeof edges[0]; k++) x[n++] = edges[k];
    while (n < 4096) x[n] = normalish() * (n % 3 ? 4.0f : 60.0f), n++;
    memcpy(e, x, sizeof e);
    kiln_vsoftcap(e, n, 1.0f);
    for (int k = 0; k < n; k++) {
        const float want = kiln_tanhf(x[k] * (1.0f / 1.0f)) * 1.0f;
        same("tanh", k, &e[k], &want, sizeof want);
    }
    for (int k = 0; k + 8 <= n; k += 8) { /* e^(x - 0) through vexp_sum's vector body */
        float v[8], s = kiln_vexp_sum(memcpy(v, x + k, sizeof v), 0.0f, 8);
        (void)s;
        for (int j = 0; j < 8; j++) {
            const float want = kiln_expf(x[k + j] - 0.0f);
            same("exp", k + j, &v[j], &want, sizeof want);
        }
    }
    /* silu(g) * u = g / (1 + e^-g) * u (ops.c), a vector body and a scalar tail */
    for (int k = 0; k < N; k++) b[k] = normalish();
    kiln_swiglu(y, x, b, N);
    for (int k = 0; k < N; k++) {
        const float want = x[k] / (1.0f + kiln_expf(0.0f - x[k])) * b[k];
        same("swiglu", k, &y[k], &want, sizeof want);
    }
    printf("vec_f32 (vdot, vaxpy, vmax, vexp_sum, exp, tanh), swiglu: %s\n", failures == before ? "equal" : "DIFFER");
}

/* attn_span.h: scores of staged spans (keys transposed where the build does) and weighted rows,
 * against each score's fma chain over d and each column's over the rows, f32 and f16 rows */
static void check_spans(void) {
    enum { HD_MAX = 256 };
    static float k32[KILN_ATTN_SPAN][HD_MAX], v32[KILN_ATTN_SPAN][HD_MAX], q[KILN_SPAN_MAX_Q][HD_MAX];
    static uint16_t k16[KILN_ATTN_SPAN][HD_MAX], v16[KILN_ATTN_SPAN][HD_MAX];
    static uint16_t kt16[HD_MAX * KILN_ATTN_SPAN];
    static float kt[HD_MAX * KILN_ATTN_SPAN], s[KILN_SPAN_MAX_Q][KILN_ATTN_SPAN], w[KILN_SPAN_MAX_Q][KILN_ATTN_SPAN];
    static float acc[KILN_SPAN_MAX_Q][HD_MAX], want[HD_MAX];
    for (int j = 0; j < KILN_ATTN_SPAN; j++)
        for (int d = 0; d < HD_MAX; d++) {
            k16[j][d] = kiln_fp32_to_fp16(normalish()), v16[j][d] = kiln_fp32_to_fp16(normalish());
            k32[j][d] = normalish(), v32[j][d] = normalish();
        }
    for (int i = 0; i < KILN_SPAN_MAX_Q; i++)
        for (int d = 0; d < HD_MAX; d++) q[i][d] = normalish();
    const int before = failures;
    const int hds[] = {64, 80, 256, 6};
    for (int h = 0; h < 4; h++)
        for (int half = 0; half < 2; half++)
            for (int n = KILN_SPAN_KEYS; n <= KILN_ATTN_SPAN; n += KILN_SPAN_KEYS) {
                const int hd = hds[h], nq = 1 + n % KILN_SPAN_MAX_Q;
                if (half && hd % 8) continue; /* f16 rows are read in place only for whole vectors */
                const float *krows[KILN_ATTN_SPAN];
                const void *vrows[KILN_ATTN_SPAN];
                for (int j = 0; j < n; j++) krows[j] = k32[j], vrows[j] = half ? (const void *)v16[j] : (const void *)v32[j];
                float *so[KILN_SPAN_MAX_Q], *ao[KILN_SPAN_MAX_Q];
                const float *qo[KILN_SPAN_MAX_Q];
                for (int i = 0; i < nq; i++) {
                    so[i] = s[i], qo[i] = q[i], ao[i] = acc[i];
                    for (int j = 0; j < n; j++) w[i][j] = uniform();
                    for (int d = 0; d < hd; d++) acc[i][d] = normalish();
                }
#ifndef KILN_SPAN_F16_ROWS
                if (half) continue; /* the scalar path's values take f32 rows */
#endif
                /* f32 keys transposed from their rows (as dequantized K types are), f16 keys as the
                   cache holds them: transposed by hand, read in place */
                if (half)
                    for (int d = 0; d < hd; d++)
                        for (int j = 0; j < n; j++) kt16[d * KILN_ATTN_SPAN + j] = k16[j][d];
                else
                    kiln_span_transpose(kt, KILN_ATTN_SPAN, krows, n, hd);
                /* the f16 passes also ask for lines as decode does (kiln_trickle): the values stay the same */
                kiln_trickle next_k = kiln_trickle_of(k32, sizeof k32, 128), next_v = kiln_trickle_of(v32, sizeof v32, 128);
                kiln_span_scores(so, qo, nq, half ? (const void *)kt16 : (const void *)kt, KILN_ATTN_SPAN, half, n, hd,
                                 0.125f, half ? &next_k : NULL);
                for (int i = 0; i < nq; i++)
                    for (int j = 0; j < n; j++) {
                        float a = 0.0f;
                        for (int d = 0; d < hd; d++) a = fmaf(q[i][d], half ? kiln_fp16_to_fp32(k16[j][d]) : k32[j][d], a);
                        a *= 0.125f;
                        same("span scores", j, &s[i][j], &a, sizeof a);
                    }
                for (int i = 0; i < nq; i++) {
                    memcpy(want, acc[i], sizeof want);
                    for (int j = 0; j < n; j++)
                        for (int d = 0; d < hd; d++)
                            want[d] = fmaf(w[i][j], half ? kiln_fp16_to_fp32(v16[j][d]) : v32[j][d], want[d]);
                    kiln_span_values(ao + i, w[i], KILN_ATTN_SPAN, 1, vrows, n, hd, half, half ? &next_v : NULL);
                    same("span values", i, acc[i], want, (size_t)hd * sizeof(float));
                }
            }
    printf("attention spans: %s\n", failures == before ? "equal" : "DIFFER");
}

int main(void) {
    printf("paths:");
#ifdef KILN_HAVE_NEON
    printf(" NEON");
#endif
#ifdef KILN_HAVE_DOTPROD
    printf(" DOTPROD");
#endif
#ifdef KILN_HAVE_I8MM
    printf(" I8MM");
#endif
    printf("\nSIMD twins:");
    for (int type = 0; type < KILN_TYPE_COUNT; type++)
        if (kiln_type_supported(type) && kiln_simd_kernels(type) & KILN_SIMD_DOT) printf(" %s", kiln_type_name(type));
    printf("\n");
    check_rows();
    check_act();
    check_dequant();
    check_vec();
    check_spans();
    printf("%d checks, %d mismatches\n", checks, failures);
    return failures != 0;
}
