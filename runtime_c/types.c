/* types.c: the one table of element types: each type's block geometry, the activation format
 * its dot wants, its scalar reference kernels, and the SIMD twins this build has of them.
 *
 * Every entry point that depends on a type goes through this table, so a type is added in one
 * place; Python reads the same facts through these functions (compiler/core/dtypes.py checks its
 * own table against them when the runtime is loaded).
 */
#include <string.h>

#include "kernels_mt.h"
#include "quant_impl.h"

typedef struct {
    const char *name;   /* GGML's */
    int block;          /* elements per block */
    size_t block_bytes; /* bytes per block */
    int act_type;       /* the format its activations are quantized to for the dot */
    kiln_dequant_fn dequant;   /* scalar references */
    kiln_dot_fn dot;
    kiln_quant_fn from_float;  /* the KV cache types: f32 rows -> this type */
    kiln_rows_fn rows;         /* SIMD twins this build has, or NULL: the reference runs */
    kiln_dequant_fn dequant_simd;
    kiln_quant_fn from_float_simd;
} type_traits;

/* kernel f's SIMD twin in this build: f_avx2 or f_neon, or none (NULL) */
#if defined(KILN_HAVE_AVX2)
#define SIMD(f) f##_avx2
#elif defined(KILN_HAVE_NEON)
#define SIMD(f) f##_neon
#else
#define SIMD(f) NULL
#endif

static const type_traits TYPES[KILN_TYPE_COUNT] = {
    [KILN_F32] = {"F32", 1, 4, KILN_F32, kiln_ref_dequant_f32, kiln_ref_dot_f32, kiln_ref_copy_f32, SIMD(kiln_rows_f32)},
    [KILN_F16] = {"F16", 1, 2, KILN_F32, kiln_ref_dequant_f16, kiln_ref_dot_f16, kiln_ref_quantize_f16, SIMD(kiln_rows_f16),
                  SIMD(kiln_dequant_f16), SIMD(kiln_quantize_f16)},
    [KILN_BF16] = {"BF16", 1, 2, KILN_F32, kiln_ref_dequant_bf16, kiln_ref_dot_bf16, NULL, SIMD(kiln_rows_bf16)},
    [KILN_Q4_0] = {"Q4_0", QK4_0, sizeof(block_q4_0), KILN_Q8_0, kiln_ref_dequant_q4_0, kiln_ref_dot_q4_0,
                   kiln_ref_quantize_q4_0, SIMD(kiln_rows_q4_0)},
    [KILN_Q4_1] = {"Q4_1", QK4_1, sizeof(block_q4_1), KILN_Q8_1, kiln_ref_dequant_q4_1, kiln_ref_dot_q4_1,
                   kiln_ref_quantize_q4_1, SIMD(kiln_rows_q4_1)},
    [KILN_Q5_0] = {"Q5_0", QK5_0, sizeof(block_q5_0), KILN_Q8_0, kiln_ref_dequant_q5_0, kiln_ref_dot_q5_0,
                   kiln_ref_quantize_q5_0, SIMD(kiln_rows_q5_0)},
    [KILN_Q5_1] = {"Q5_1", QK5_1, sizeof(block_q5_1), KILN_Q8_1, kiln_ref_dequant_q5_1, kiln_ref_dot_q5_1, NULL,
                   SIMD(kiln_rows_q5_1)},
    [KILN_Q8_0] = {"Q8_0", QK8_0, sizeof(block_q8_0), KILN_Q8_0, kiln_ref_dequant_q8_0, kiln_ref_dot_q8_0,
                   kiln_ref_quantize_q8_0, SIMD(kiln_rows_q8_0), SIMD(kiln_dequant_q8_0), SIMD(kiln_quantize_q8_0)},
    [KILN_Q4_K] = {"Q4_K", QK_K, sizeof(block_q4_K), KILN_Q8_K, kiln_ref_dequant_q4_K, kiln_ref_dot_q4_K, NULL,
                   SIMD(kiln_rows_q4_K)},
    [KILN_Q5_K] = {"Q5_K", QK_K, sizeof(block_q5_K), KILN_Q8_K, kiln_ref_dequant_q5_K, kiln_ref_dot_q5_K, NULL,
                   SIMD(kiln_rows_q5_K)},
    [KILN_Q6_K] = {"Q6_K", QK_K, sizeof(block_q6_K), KILN_Q8_K, kiln_ref_dequant_q6_K, kiln_ref_dot_q6_K, NULL,
                   SIMD(kiln_rows_q6_K)},
    [KILN_IQ4_NL] = {"IQ4_NL", 32, sizeof(block_iq4_nl), KILN_Q8_0, kiln_ref_dequant_iq4_nl, kiln_ref_dot_iq4_nl, NULL,
                     SIMD(kiln_rows_iq4_nl)},
    [KILN_MXFP4] = {"MXFP4", QK_MXFP4, sizeof(block_mxfp4), KILN_Q8_0, kiln_ref_dequant_mxfp4, kiln_ref_dot_mxfp4, NULL,
                    SIMD(kiln_rows_mxfp4)},
#define SB_ENTRY(name, type) \
    [type] = {#type + 5, QK_K, sizeof(block_##name), KILN_Q8_K, kiln_ref_dequant_##name, kiln_ref_dot_##name, NULL, SIMD(kiln_rows_##name)},
    KILN_SB_TYPES(SB_ENTRY)
#undef SB_ENTRY
};

/* Activation formats: how a row of f32 activations is stored for a dot. */
static const struct {
    int block;
    size_t block_bytes;
    kiln_quant_fn quantize, quantize_simd;
} ACT[KILN_TYPE_COUNT] = {
    [KILN_F32] = {1, 4, kiln_ref_copy_f32},
    [KILN_Q8_0] = {QK8_0, sizeof(block_q8_0), kiln_ref_quantize_q8_0, SIMD(kiln_quantize_q8_0)},
    [KILN_Q8_1] = {QK8_1, sizeof(block_q8_1), kiln_ref_quantize_q8_1, SIMD(kiln_quantize_q8_1)},
    [KILN_Q8_K] = {QK_K, sizeof(block_q8_K), kiln_ref_quantize_q8_K, SIMD(kiln_quantize_q8_K)},
};

static kiln_quant_fn act_quantizer(int type) {
    const int a = TYPES[type].act_type;
    return ACT[a].quantize_simd ? ACT[a].quantize_simd : ACT[a].quantize;
}

int kiln_type_supported(int type) { return type >= 0 && type < KILN_TYPE_COUNT && TYPES[type].dot != NULL; }

const char *kiln_type_name(int type) { return kiln_type_supported(type) ? TYPES[type].name : NULL; }

int kiln_simd_kernels(int type) {
    if (!kiln_type_supported(type)) return 0;
    return (TYPES[type].rows ? KILN_SIMD_DOT : 0) | (TYPES[type].dequant_simd ? KILN_SIMD_DEQUANT : 0) |
           (ACT[TYPES[type].act_type].quantize_simd ? KILN_SIMD_ACT : 0) |
           (TYPES[type].from_float_simd ? KILN_SIMD_STORE : 0);
}

int kiln_act_type(int type) { return TYPES[type].act_type; }

size_t kiln_row_bytes(int type, int n) { return (size_t)(n / TYPES[type].block) * TYPES[type].block_bytes; }

size_t kiln_act_row_bytes(int type, int n) {
    const int a = TYPES[type].act_type;
    return (size_t)(n / ACT[a].block) * ACT[a].block_bytes;
}

size_t kiln_act_scales_bytes(int type, int n_rows, int n_in) {
    const int a = TYPES[type].act_type;
    if (ACT[a].block != 32 || n_rows < 2) return 0;
    return (size_t)(n_rows + KILN_X8_TILE - 1) / KILN_X8_TILE * KILN_X8_TILE_SCALES * sizeof(float) * KILN_X8_TILE *
           (size_t)(n_in / 32);
}

size_t kiln_matmul_scratch_bytes(int type, int n_rows, int n_in) {
    return ((size_t)n_rows * kiln_act_row_bytes(type, n_in) + 63) / 64 * 64 + kiln_act_scales_bytes(type, n_rows, n_in);
}

void kiln_quantize_act(int type, const float *x, void *dst, int n) { act_quantizer(type)(x, dst, n); }

void kiln_quantize_act_ref(int type, const float *x, void *dst, int n) { ACT[TYPES[type].act_type].quantize(x, dst, n); }

void kiln_dequantize_row(int type, const void *src, float *dst, int n) {
    (TYPES[type].dequant_simd ? TYPES[type].dequant_simd : TYPES[type].dequant)(src, dst, n);
}

void kiln_dequantize_row_ref(int type, const void *src, float *dst, int n) { TYPES[type].dequant(src, dst, n); }

void kiln_quantize_row(int type, const float *x, void *dst, int n) {
    (TYPES[type].from_float_simd ? TYPES[type].from_float_simd : TYPES[type].from_float)(x, dst, n);
}

void kiln_quantize_row_ref(int type, const float *x, void *dst, int n) { TYPES[type].from_float(x, dst, n); }

int kiln_kv_type_supported(int type) {
    return type >= 0 && type < KILN_TYPE_COUNT && TYPES[type].from_float != NULL;
}

float kiln_vec_dot_ref(int type, int n, const void *w, const void *act) { return TYPES[type].dot(n, w, act); }

float kiln_vec_dot(int type, int n, const void *w, const void *act) {
    if (!TYPES[type].rows) return TYPES[type].dot(n, w, act);
    float y;
    TYPES[type].rows(n, w, kiln_row_bytes(type, n), 1, act, kiln_act_row_bytes(type, n), 1, &y, 1);
    return y;
}

void kiln_rows(int type, int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row, int n_a,
               float *y, size_t y_row) {
    if (TYPES[type].rows) {
        TYPES[type].rows(n, w, w_row, n_w, act, a_row, n_a, y, y_row);
        return;
    }
    const kiln_dot_fn dot = TYPES[type].dot;
    for (int c = 0; c < n_a; c++)
        for (int r = 0; r < n_w; r++)
            y[c * y_row + r] = dot(n, (const uint8_t *)w + r * w_row, (const uint8_t *)act + c * a_row);
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

void kiln_embed_mt(const kiln_thread *t, float *y, const kiln_weight *table, const int32_t *ids, int rows,
                   int n_embd, float scale) {
    int r0, r1;
    kiln_share(t, rows, 1, &r0, &r1);
    if (r1 > r0) kiln_embed(table->type, y + (size_t)r0 * n_embd, table->data, ids + r0, r1 - r0, n_embd, scale);
}
