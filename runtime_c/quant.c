/* quant.c: scalar reference kernels for quantized rows, dispatched through one type table.
 *
 * Every weight type has: a dequantizer (embedding rows, tests), the activation format its
 * dot product wants, and a dot product against that format. SIMD versions, when they come,
 * are twins of these and are tested against them.
 */
#include <math.h>
#include <string.h>

#include "fp16.h"
#include "kernels.h"
#include "kernels_mt.h"
#include "quant_impl.h"
#include "simd_f32.h"

typedef void (*dequant_fn)(const void *src, float *dst, int n);
typedef float (*dot_fn)(int n, const void *w, const void *act);
typedef void (*quant_fn)(const float *x, void *dst, int n);
typedef void (*gemm_fn)(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row, int n_a,
                        float *y, size_t y_row);

typedef struct {
    int block;          /* elements per block */
    size_t block_bytes; /* bytes per block */
    int act_type;       /* format the activations are quantized to for the dot */
    dequant_fn dequant;
    dot_fn dot;          /* the scalar reference */
    quant_fn from_float; /* types a KV cache can hold: f32 rows -> this type */
} type_traits;

/* The dot a matmul runs: a SIMD twin where this build has one, else the reference. */
static dot_fn fast_dot(int type);

/* ==== activation quantizers ================================================================= */

/* q8_0: d = max|x| / 127, q = round(x / d) */
static void quantize_q8_0(const float *x, void *dst, int n) {
    block_q8_0 *y = dst;
    for (int b = 0; b < n / QK8_0; b++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        y[b].d = kiln_fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++) y[b].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* q8_1: q8_0 plus s = d * sum(q), which lets q4_1/q5_1 fold their per-block minimum into one product */
static void quantize_q8_1(const float *x, void *dst, int n) {
    block_q8_1 *y = dst;
    for (int b = 0; b < n / QK8_1; b++, x += QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            y[b].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[b].qs[j];
        }
        y[b].d = kiln_fp32_to_fp16(d);
        y[b].s = kiln_fp32_to_fp16(d * (float)sum);
    }
}

static void copy_f32(const float *x, void *dst, int n) { memcpy(dst, x, (size_t)n * sizeof(float)); }

/* ==== KV-cache quantizers: ggml's reference rounding, so that kiln's and llama.cpp's caches hold the same bits ==== */

/* x / d is rounded to float before the offset is added, as in ggml: a fused multiply-add would
 * round once and move some values across a rounding boundary. GCC contracts across statements,
 * so it is told not to; clang contracts only within one expression. */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define NO_CONTRACT
#endif

/* the element of largest magnitude, with its sign (q4_0 and q5_0 scale by it) */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
    return max;
}

/* q4_0: d = max / -8, q = min(15, trunc(x / d + 8.5)) */
NO_CONTRACT static void quantize_q4_0(const float *x, void *dst, int n) {
    block_q4_0 *y = dst;
    for (int b = 0; b < n / QK4_0; b++, x += QK4_0) {
        const float d = signed_absmax(x, QK4_0) / -8.0f, id = d ? 1.0f / d : 0.0f;
        y[b].d = kiln_fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const float x0 = x[j] * id, x1 = x[j + QK4_0 / 2] * id;
            const int lo = (int8_t)(x0 + 8.5f), hi = (int8_t)(x1 + 8.5f);
            y[b].qs[j] = (uint8_t)((lo < 15 ? lo : 15) | (hi < 15 ? hi : 15) << 4);
        }
    }
}

/* q4_1: d = (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5)) */
NO_CONTRACT static void quantize_q4_1(const float *x, void *dst, int n) {
    block_q4_1 *y = dst;
    for (int b = 0; b < n / QK4_1; b++, x += QK4_1) {
        float min = INFINITY, max = -INFINITY;
        for (int j = 0; j < QK4_1; j++) min = fminf(min, x[j]), max = fmaxf(max, x[j]);
        const float d = (max - min) / 15.0f, id = d ? 1.0f / d : 0.0f;
        y[b].d = kiln_fp32_to_fp16(d), y[b].m = kiln_fp32_to_fp16(min);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const float x0 = (x[j] - min) * id, x1 = (x[j + QK4_1 / 2] - min) * id;
            const int lo = (int8_t)(x0 + 0.5f), hi = (int8_t)(x1 + 0.5f);
            y[b].qs[j] = (uint8_t)((lo < 15 ? lo : 15) | (hi < 15 ? hi : 15) << 4);
        }
    }
}

/* q5_0: d = max / -16, q = min(31, trunc(x / d + 16.5)), the fifth bits in qh */
NO_CONTRACT static void quantize_q5_0(const float *x, void *dst, int n) {
    block_q5_0 *y = dst;
    for (int b = 0; b < n / QK5_0; b++, x += QK5_0) {
        const float d = signed_absmax(x, QK5_0) / -16.0f, id = d ? 1.0f / d : 0.0f;
        y[b].d = kiln_fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const float x0 = x[j] * id, x1 = x[j + QK5_0 / 2] * id;
            int lo = (int8_t)(x0 + 16.5f), hi = (int8_t)(x1 + 16.5f);
            lo = lo < 31 ? lo : 31, hi = hi < 31 ? hi : 31;
            y[b].qs[j] = (uint8_t)((lo & 0x0F) | (hi & 0x0F) << 4);
            qh |= (uint32_t)(lo >> 4) << j | (uint32_t)(hi >> 4) << (j + QK5_0 / 2);
        }
        memcpy(y[b].qh, &qh, sizeof qh);
    }
}

/* ==== float weights ========================================================================= */

static void dequant_f32(const void *src, float *dst, int n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

static void to_f16(const float *x, void *dst, int n) {
    kiln_half *d = dst;
    for (int i = 0; i < n; i++) d[i] = kiln_fp32_to_fp16(x[i]);
}

static void dequant_f16(const void *src, float *dst, int n) {
    const kiln_half *s = src;
    for (int i = 0; i < n; i++) dst[i] = kiln_fp16_to_fp32(s[i]);
}

static void dequant_bf16(const void *src, float *dst, int n) {
    const kiln_bf16 *s = src;
    for (int i = 0; i < n; i++) dst[i] = kiln_bf16_to_fp32(s[i]);
}

static float dot_f32(int n, const void *w, const void *act) {
    const float *a = w, *b = act;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static float dot_f16(int n, const void *w, const void *act) {
    const kiln_half *a = w;
    const float *b = act;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += kiln_fp16_to_fp32(a[i]) * b[i];
    return sum;
}

static float dot_bf16(int n, const void *w, const void *act) {
    const kiln_bf16 *a = w;
    const float *b = act;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += kiln_bf16_to_fp32(a[i]) * b[i];
    return sum;
}

/* ==== 32-element block weights ============================================================== */

/* The 4-bit types store weight j in the low nibble of qs[j] and weight j+16 in the high one;
 * the 5-bit types take bit j of qh as the fifth bit of weight j. */
static inline int nib_lo(const uint8_t *qs, int j) { return qs[j] & 0x0F; }
static inline int nib_hi(const uint8_t *qs, int j) { return qs[j] >> 4; }
static inline uint32_t load_qh(const uint8_t qh[4]) {
    uint32_t v;
    memcpy(&v, qh, sizeof v);
    return v;
}
static inline int five_lo(const uint8_t *qs, uint32_t qh, int j) { return nib_lo(qs, j) | (int)((qh >> j) & 1) << 4; }
static inline int five_hi(const uint8_t *qs, uint32_t qh, int j) { return nib_hi(qs, j) | (int)((qh >> (j + 16)) & 1) << 4; }

static void dequant_q4_0(const void *src, float *dst, int n) {
    const block_q4_0 *x = src;
    for (int b = 0; b < n / QK4_0; b++, dst += QK4_0) {
        const float d = kiln_fp16_to_fp32(x[b].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            dst[j] = d * (float)(nib_lo(x[b].qs, j) - 8);
            dst[j + QK4_0 / 2] = d * (float)(nib_hi(x[b].qs, j) - 8);
        }
    }
}

static float dot_q4_0(int n, const void *w, const void *act) {
    const block_q4_0 *x = w;
    const block_q8_0 *y = act;
    float sum = 0.0f;
    for (int b = 0; b < n / QK4_0; b++) {
        int s = 0;
        for (int j = 0; j < QK4_0 / 2; j++)
            s += (nib_lo(x[b].qs, j) - 8) * y[b].qs[j] + (nib_hi(x[b].qs, j) - 8) * y[b].qs[j + QK4_0 / 2];
        sum += (float)s * kiln_fp16_to_fp32(x[b].d) * kiln_fp16_to_fp32(y[b].d);
    }
    return sum;
}

static void dequant_q4_1(const void *src, float *dst, int n) {
    const block_q4_1 *x = src;
    for (int b = 0; b < n / QK4_1; b++, dst += QK4_1) {
        const float d = kiln_fp16_to_fp32(x[b].d), m = kiln_fp16_to_fp32(x[b].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            dst[j] = d * (float)nib_lo(x[b].qs, j) + m;
            dst[j + QK4_1 / 2] = d * (float)nib_hi(x[b].qs, j) + m;
        }
    }
}

static float dot_q4_1(int n, const void *w, const void *act) {
    const block_q4_1 *x = w;
    const block_q8_1 *y = act;
    float sum = 0.0f;
    for (int b = 0; b < n / QK4_1; b++) {
        int s = 0;
        for (int j = 0; j < QK4_1 / 2; j++)
            s += nib_lo(x[b].qs, j) * y[b].qs[j] + nib_hi(x[b].qs, j) * y[b].qs[j + QK4_1 / 2];
        sum += (float)s * kiln_fp16_to_fp32(x[b].d) * kiln_fp16_to_fp32(y[b].d)
             + kiln_fp16_to_fp32(x[b].m) * kiln_fp16_to_fp32(y[b].s);
    }
    return sum;
}

static void dequant_q5_0(const void *src, float *dst, int n) {
    const block_q5_0 *x = src;
    for (int b = 0; b < n / QK5_0; b++, dst += QK5_0) {
        const float d = kiln_fp16_to_fp32(x[b].d);
        const uint32_t qh = load_qh(x[b].qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            dst[j] = d * (float)(five_lo(x[b].qs, qh, j) - 16);
            dst[j + QK5_0 / 2] = d * (float)(five_hi(x[b].qs, qh, j) - 16);
        }
    }
}

static float dot_q5_0(int n, const void *w, const void *act) {
    const block_q5_0 *x = w;
    const block_q8_0 *y = act;
    float sum = 0.0f;
    for (int b = 0; b < n / QK5_0; b++) {
        const uint32_t qh = load_qh(x[b].qh);
        int s = 0;
        for (int j = 0; j < QK5_0 / 2; j++)
            s += (five_lo(x[b].qs, qh, j) - 16) * y[b].qs[j] + (five_hi(x[b].qs, qh, j) - 16) * y[b].qs[j + QK5_0 / 2];
        sum += (float)s * kiln_fp16_to_fp32(x[b].d) * kiln_fp16_to_fp32(y[b].d);
    }
    return sum;
}

static void dequant_q5_1(const void *src, float *dst, int n) {
    const block_q5_1 *x = src;
    for (int b = 0; b < n / QK5_1; b++, dst += QK5_1) {
        const float d = kiln_fp16_to_fp32(x[b].d), m = kiln_fp16_to_fp32(x[b].m);
        const uint32_t qh = load_qh(x[b].qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            dst[j] = d * (float)five_lo(x[b].qs, qh, j) + m;
            dst[j + QK5_1 / 2] = d * (float)five_hi(x[b].qs, qh, j) + m;
        }
    }
}

static float dot_q5_1(int n, const void *w, const void *act) {
    const block_q5_1 *x = w;
    const block_q8_1 *y = act;
    float sum = 0.0f;
    for (int b = 0; b < n / QK5_1; b++) {
        const uint32_t qh = load_qh(x[b].qh);
        int s = 0;
        for (int j = 0; j < QK5_1 / 2; j++)
            s += five_lo(x[b].qs, qh, j) * y[b].qs[j] + five_hi(x[b].qs, qh, j) * y[b].qs[j + QK5_1 / 2];
        sum += (float)s * kiln_fp16_to_fp32(x[b].d) * kiln_fp16_to_fp32(y[b].d)
             + kiln_fp16_to_fp32(x[b].m) * kiln_fp16_to_fp32(y[b].s);
    }
    return sum;
}

static void dequant_q8_0(const void *src, float *dst, int n) {
    const block_q8_0 *x = src;
    for (int b = 0; b < n / QK8_0; b++, dst += QK8_0) {
        const float d = kiln_fp16_to_fp32(x[b].d);
        for (int j = 0; j < QK8_0; j++) dst[j] = d * (float)x[b].qs[j];
    }
}

static float dot_q8_0(int n, const void *w, const void *act) {
    const block_q8_0 *x = w, *y = act;
    float sum = 0.0f;
    for (int b = 0; b < n / QK8_0; b++) {
        int s = 0;
        for (int j = 0; j < QK8_0; j++) s += x[b].qs[j] * y[b].qs[j];
        sum += (float)s * kiln_fp16_to_fp32(x[b].d) * kiln_fp16_to_fp32(y[b].d);
    }
    return sum;
}

/* ==== the type table ======================================================================== */

static const type_traits TYPES[KILN_TYPE_COUNT] = {
    [KILN_F32] = {1, 4, KILN_F32, dequant_f32, dot_f32, copy_f32},
    [KILN_F16] = {1, 2, KILN_F32, dequant_f16, dot_f16, to_f16},
    [KILN_BF16] = {1, 2, KILN_F32, dequant_bf16, dot_bf16},
    [KILN_Q4_0] = {QK4_0, sizeof(block_q4_0), KILN_Q8_0, dequant_q4_0, dot_q4_0, quantize_q4_0},
    [KILN_Q4_1] = {QK4_1, sizeof(block_q4_1), KILN_Q8_1, dequant_q4_1, dot_q4_1, quantize_q4_1},
    [KILN_Q5_0] = {QK5_0, sizeof(block_q5_0), KILN_Q8_0, dequant_q5_0, dot_q5_0, quantize_q5_0},
    [KILN_Q5_1] = {QK5_1, sizeof(block_q5_1), KILN_Q8_1, dequant_q5_1, dot_q5_1},
    [KILN_Q8_0] = {QK8_0, sizeof(block_q8_0), KILN_Q8_0, dequant_q8_0, dot_q8_0, quantize_q8_0},
    [KILN_Q4_K] = {QK_K, sizeof(block_q4_K), KILN_Q8_K, kiln_dequant_q4_K, kiln_dot_q4_K},
    [KILN_Q5_K] = {QK_K, sizeof(block_q5_K), KILN_Q8_K, kiln_dequant_q5_K, kiln_dot_q5_K},
    [KILN_Q6_K] = {QK_K, sizeof(block_q6_K), KILN_Q8_K, kiln_dequant_q6_K, kiln_dot_q6_K},
};

/* Activation formats: how a row of f32 activations is stored for a dot. */
static const struct { int block; size_t block_bytes; quant_fn quantize; } ACT[KILN_TYPE_COUNT] = {
    [KILN_F32] = {1, 4, copy_f32},
    [KILN_Q8_0] = {QK8_0, sizeof(block_q8_0), quantize_q8_0},
    [KILN_Q8_1] = {QK8_1, sizeof(block_q8_1), quantize_q8_1},
    [KILN_Q8_K] = {QK_K, sizeof(block_q8_K), kiln_quantize_q8_K},
};

/* The kernels a matmul runs where this build has SIMD versions; NULL entries fall back to the
 * scalar references above (dots) or to a loop of dots (gemms). */
static const struct {
    dot_fn dot;
    gemm_fn gemm;
    dequant_fn dequant; /* the KV cache types: attention dequantizes a row per cache position */
} SIMD[KILN_TYPE_COUNT] = {
#ifdef KILN_HAVE_AVX2
    [KILN_Q8_0].dot = kiln_dot_q8_0_avx2,
    [KILN_Q4_0].dot = kiln_dot_q4_0_avx2,
    [KILN_Q4_1].dot = kiln_dot_q4_1_avx2,
    [KILN_Q5_0].dot = kiln_dot_q5_0_avx2,
    [KILN_Q4_K].dot = kiln_dot_q4_K_avx2,
    [KILN_Q6_K].dot = kiln_dot_q6_K_avx2,
    [KILN_F16].dequant = kiln_dequant_f16_avx2,
    [KILN_Q8_0].dequant = kiln_dequant_q8_0_avx2,
#endif
#ifdef KILN_HAVE_VNNI
    [KILN_Q8_0].gemm = kiln_gemm_q8_0_vnni,
    [KILN_Q4_0].gemm = kiln_gemm_q4_0_vnni,
    [KILN_Q4_1].gemm = kiln_gemm_q4_1_vnni,
    [KILN_Q5_0].gemm = kiln_gemm_q5_0_vnni,
    [KILN_Q5_1].gemm = kiln_gemm_q5_1_vnni,
    [KILN_Q4_K].gemm = kiln_gemm_q4_K_vnni,
    [KILN_Q6_K].gemm = kiln_gemm_q6_K_vnni,
#endif
};

/* Activation formats (indexed by format) with their SIMD quantizers, same bits as the scalar ones */
static quant_fn fast_quantize_act(int act_type) {
#ifdef KILN_HAVE_AVX2
    if (act_type == KILN_Q8_0) return kiln_quantize_q8_0_avx2;
    if (act_type == KILN_Q8_1) return kiln_quantize_q8_1_avx2;
#endif
    return ACT[act_type].quantize;
}

static float dot_f32_simd(int n, const void *w, const void *act) { return kiln_vdot(w, act, n); }

static dot_fn fast_dot(int type) {
    if (type == KILN_F32) return dot_f32_simd;
    return SIMD[type].dot ? SIMD[type].dot : TYPES[type].dot;
}

int kiln_simd_kernels(int type) {
    if (type < 0 || type >= KILN_TYPE_COUNT || !TYPES[type].dot) return 0;
    return (fast_dot(type) != TYPES[type].dot ? KILN_SIMD_DOT : 0) |
           (SIMD[type].dequant ? KILN_SIMD_DEQUANT : 0) |
           (fast_quantize_act(TYPES[type].act_type) != ACT[TYPES[type].act_type].quantize ? KILN_SIMD_ACT : 0) |
           (SIMD[type].gemm ? KILN_SIMD_GEMM : 0);
}

int kiln_type_supported(int type) {
    return type >= 0 && type < KILN_TYPE_COUNT && TYPES[type].dot != NULL;
}

size_t kiln_row_bytes(int type, int n) { return (size_t)(n / TYPES[type].block) * TYPES[type].block_bytes; }

size_t kiln_act_row_bytes(int type, int n) {
    const int a = TYPES[type].act_type;
    return (size_t)(n / ACT[a].block) * ACT[a].block_bytes;
}

void kiln_quantize_act(int type, const float *x, void *dst, int n) { fast_quantize_act(TYPES[type].act_type)(x, dst, n); }

void kiln_quantize_act_ref(int type, const float *x, void *dst, int n) { ACT[TYPES[type].act_type].quantize(x, dst, n); }

void kiln_dequantize_row(int type, const void *src, float *dst, int n) {
    (SIMD[type].dequant ? SIMD[type].dequant : TYPES[type].dequant)(src, dst, n);
}

void kiln_dequantize_row_ref(int type, const void *src, float *dst, int n) { TYPES[type].dequant(src, dst, n); }

void kiln_quantize_row(int type, const float *x, void *dst, int n) { TYPES[type].from_float(x, dst, n); }

float kiln_vec_dot(int type, int n, const void *w, const void *act) { return fast_dot(type)(n, w, act); }

float kiln_vec_dot_ref(int type, int n, const void *w, const void *act) { return TYPES[type].dot(n, w, act); }

/* y[r][o0..o1) for every activation row r: the SIMD gemm where there is one, else a loop of dots */
static void matmul_rows(int type, const uint8_t *w, size_t w_row, int o0, int o1, int n_in, const uint8_t *act,
                        size_t a_row, int n_rows, float *y, int n_out) {
    if (SIMD[type].gemm) {
        SIMD[type].gemm(n_in, w + (size_t)o0 * w_row, w_row, o1 - o0, act, a_row, n_rows, y + o0, (size_t)n_out);
        return;
    }
    const dot_fn dot = fast_dot(type);
    for (int r = 0; r < n_rows; r++)
        for (int o = o0; o < o1; o++) y[(size_t)r * n_out + o] = dot(n_in, w + (size_t)o * w_row, act + r * a_row);
}

const uint8_t *kiln_quantize_rows_mt(const kiln_thread *t, int type, const float *x, int n_rows, int n_in,
                                     void *scratch, uint8_t local[KILN_LOCAL_ACT_BYTES]) {
    const size_t a_row = kiln_act_row_bytes(type, n_in);
    if (n_rows == 1 && a_row <= KILN_LOCAL_ACT_BYTES) {
        kiln_quantize_act(type, x, local, n_in);
        return local;
    }
    for (int r = t->ith; r < n_rows; r += t->nth)
        kiln_quantize_act(type, x + (size_t)r * n_in, (uint8_t *)scratch + r * a_row, n_in);
    kiln_barrier(t);
    return scratch;
}

void kiln_matmul_mt(const kiln_thread *t, int type, const void *w, const float *bias, int n_out, int n_in,
                    const float *x, int n_rows, float *y, void *scratch) {
    const size_t w_row = kiln_row_bytes(type, n_in), a_row = kiln_act_row_bytes(type, n_in);
    _Alignas(64) uint8_t local[KILN_LOCAL_ACT_BYTES];
    const uint8_t *act = kiln_quantize_rows_mt(t, type, x, n_rows, n_in, scratch, local);
    int o0, o1; /* a multiple of 4 output rows, so gemm tiles stay whole */
    kiln_share(t, n_out, 4, &o0, &o1);
    if (o0 == o1) return;
    matmul_rows(type, w, w_row, o0, o1, n_in, act, a_row, n_rows, y, n_out);
    kiln_add_bias(y, bias, n_rows, n_out, o0, o1);
}

void kiln_matmul(int type, const void *w, const float *bias, int n_out, int n_in,
                 const float *x, int n_rows, float *y, void *scratch) {
    const kiln_thread alone = {0, 1, NULL};
    kiln_matmul_mt(&alone, type, w, bias, n_out, n_in, x, n_rows, y, scratch);
}

void kiln_embed_mt(const kiln_thread *t, int type, float *y, const void *table, const int32_t *ids, int rows,
                   int n_embd, float scale) {
    int r0, r1;
    kiln_share(t, rows, 1, &r0, &r1);
    if (r1 > r0) kiln_embed(type, y + (size_t)r0 * n_embd, table, ids + r0, r1 - r0, n_embd, scale);
}

void kiln_embed(int type, float *y, const void *table, const int32_t *ids, int rows, int n_embd, float scale) {
    const size_t row = kiln_row_bytes(type, n_embd);
    for (int r = 0; r < rows; r++) {
        float *yr = y + (size_t)r * n_embd;
        TYPES[type].dequant((const uint8_t *)table + (size_t)ids[r] * row, yr, n_embd);
        if (scale != 1.0f)
            for (int i = 0; i < n_embd; i++) yr[i] *= scale;
    }
}
