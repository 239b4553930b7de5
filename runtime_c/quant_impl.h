/* quant_impl.h: what the quantized-matmul files share inside the runtime: the kernel signatures
 * of the type table (types.c), the scalar references it points at, the SIMD twins each build
 * has, and the layout of the 32-weight block types as the SIMD kernels read them. */
#ifndef KILN_QUANT_IMPL_H
#define KILN_QUANT_IMPL_H

#include <stddef.h>

#include "iq_tables.h"
#include "isa.h"
#include "kernels.h"
#include "quants.h"

typedef void (*kiln_dequant_fn)(const void *src, float *dst, int n);
typedef float (*kiln_dot_fn)(int n, const void *w, const void *act);
typedef void (*kiln_quant_fn)(const float *x, void *dst, int n);
/* y[c * y_row + r] = W[r] . act[c] for weight rows r < n_w (w_row bytes apart) and activation
 * rows c < n_a (a_row apart): each value the type's reference dot, bit for bit */
typedef void (*kiln_rows_fn)(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row, int n_a,
                             float *y, size_t y_row);

/* the format a type's dot takes its activations in: KILN_F32, KILN_Q8_0, KILN_Q8_1 or KILN_Q8_K */
int kiln_act_type(int type);

/* the reference's values for every pair, through the type's SIMD rows kernel where there is one */
void kiln_rows(int type, int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row, int n_a,
               float *y, size_t y_row);

/* The 32-weight block types as the SIMD kernels read them: each weight as an unsigned byte u,
 * w = d * (u - offset), or w = d * u + m for the types with a minimum. Every block begins with d
 * (then m); Q8_0's signed q is read as u = q + 128 (q ^ 0x80), offset 128. The table types fill
 * the same struct (kiln_lut_b32_of, kiln_x8_b32_of). */
typedef struct {
    size_t block_bytes;
    int offset;    /* 8 (Q4_0), 16 (Q5_0), 128 (Q8_0), 0 (Q4_1, Q5_1) */
    int has_min;   /* m follows d; the activations are q8_1 (with s = d * sum(q)), else q8_0 */
    int bits;      /* bits of u stored in qs: 4 (nibbles, low then high), or 8 */
    size_t qh_at;  /* offset of the fifth bits (Q5_0, Q5_1), 0 when there are none */
    size_t qs_at;  /* offset of the nibbles, or of Q8_0's bytes */
    const int8_t *lut; /* the table types (IQ4_NL, MXFP4): the signed value each nibble indexes */
    int e8m0;      /* MXFP4: the scale is one E8M0 byte (kiln_e8m0_half), not an f16 */
} kiln_b32;

/* 0 for a type that is not one of them; constant-folds for a constant type */
static inline __attribute__((always_inline)) int kiln_b32_of(int type, kiln_b32 *f) {
    switch (type) {
    case KILN_Q4_0: *f = (kiln_b32){sizeof(block_q4_0), 8, 0, 4, 0, offsetof(block_q4_0, qs)}; return 1;
    case KILN_Q4_1: *f = (kiln_b32){sizeof(block_q4_1), 0, 1, 4, 0, offsetof(block_q4_1, qs)}; return 1;
    case KILN_Q5_0:
        *f = (kiln_b32){sizeof(block_q5_0), 16, 0, 4, offsetof(block_q5_0, qh), offsetof(block_q5_0, qs)};
        return 1;
    case KILN_Q5_1:
        *f = (kiln_b32){sizeof(block_q5_1), 0, 1, 4, offsetof(block_q5_1, qh), offsetof(block_q5_1, qs)};
        return 1;
    case KILN_Q8_0: *f = (kiln_b32){sizeof(block_q8_0), 128, 0, 8, 0, offsetof(block_q8_0, qs)}; return 1;
    default: return 0;
    }
}

static inline int kiln_is_kquant(int type) { return type == KILN_Q4_K || type == KILN_Q5_K || type == KILN_Q6_K; }

/* IQ4_NL and MXFP4: 32 weights of 4-bit indexes into a table of 16 signed values (iq_tables.h),
   with an f16 scale (IQ4_NL) or an E8M0 one (MXFP4, at byte 0); their dots are Q8_0's */
static inline const int8_t *kiln_lut_b32(int type) {
    return type == KILN_IQ4_NL ? kiln_kvalues_iq4nl : type == KILN_MXFP4 ? kiln_kvalues_mxfp4 : 0;
}
static inline int kiln_is_lut_b32(int type) { return type == KILN_IQ4_NL || type == KILN_MXFP4; }
/* their prefill in interleaved tiles (rows_lut_avx2.c): 1 if it took the call, 0 where the build
   has no VNNI or no memory for a tile */
int kiln_rows_lut_tiles(int type, int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row, int n_a,
                        float *y, size_t y_row);
/* their geometry in kiln_b32's terms (signed values, no offset, no minimum, 4 bits), for the rows
   kernels */
static inline void kiln_lut_b32_of(int type, kiln_b32 *f) {
    *f = type == KILN_MXFP4 ? (kiln_b32){sizeof(block_mxfp4), 0, 0, 4, 0, offsetof(block_mxfp4, qs), kiln_kvalues_mxfp4, 1}
                            : (kiln_b32){sizeof(block_iq4_nl), 0, 0, 4, 0, offsetof(block_iq4_nl, qs), kiln_kvalues_iq4nl, 0};
}
/* The 32-weight types the x8 layout holds (x8_pack.c), as its kernels read them: kiln_b32_of's, and
   the table types, whose nibbles the unsigned kernels map to u = value + 128 (offset 128) */
static inline __attribute__((always_inline)) int kiln_x8_b32_of(int type, kiln_b32 *f) {
    if (kiln_b32_of(type, f)) return 1;
    if (!kiln_is_lut_b32(type)) return 0;
    kiln_lut_b32_of(type, f);
    f->offset = 128;
    return 1;
}
/* MXFP4's scale: 2^(e - 128), the half that matches its doubled values (gguf-py's e8m0_to_fp32_half) */
static inline float kiln_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    __builtin_memcpy(&f, &bits, sizeof f);
    return f;
}

/* -- the super-block types read through their unpacked form ---------------------------------- */
/* A 256-weight super-block of Q2_K, Q3_K, IQ4_XS, IQ2_*, IQ3_*, IQ1_*, TQ1_0 or TQ2_0, as every path
 * reads it: w_i = d * sc[i / 16] * q_i - dmin * m[i / 16] (m and dmin are 0 but for Q2_K). All but d
 * and dmin are integers, so a dot's isum = sum_j sc[j] * sum_i q_i y_i is exact on any path, and
 * its float steps are the K-quants': per super-block, acc = fma(isum, d * y.d, acc), mins =
 * fma(msum, dmin * y.d, mins), msum = sum_j m[j] * y.bsums[j]; the dot is acc - mins. A type's
 * factors are written so that d * sc is ggml's own scale product, bit for bit (IQ2's d / 8 times
 * 2 ls + 1 is ggml's d (0.5 + ls) / 4; IQ1's delta of 1/8 is q = 8 grid +- 1 with d / 8). */
typedef struct {
    int8_t q[QK_K];
    int16_t sc[QK_K / 16];
    int16_t m[QK_K / 16];
    float d, dmin;
} kiln_sb;
typedef void (*kiln_unpack_fn)(const void *block, kiln_sb *u);

/* the unpacked types, and each one's reference unpacker (ref_sblock.c) and fast one (sb_unpack.c:
   the same bits, tested so, by SIMD or word tricks where they pay) */
int kiln_is_sb(int type);
kiln_unpack_fn kiln_unpack_ref(int type);
kiln_unpack_fn kiln_unpack_fast(int type);
#define KILN_SB_TYPES(X) X(q2_K, KILN_Q2_K) X(q3_K, KILN_Q3_K) X(iq4_xs, KILN_IQ4_XS) X(iq2_xxs, KILN_IQ2_XXS) \
    X(iq2_xs, KILN_IQ2_XS) X(iq2_s, KILN_IQ2_S) X(iq3_xxs, KILN_IQ3_XXS) X(iq3_s, KILN_IQ3_S) X(iq1_s, KILN_IQ1_S) \
    X(iq1_m, KILN_IQ1_M) X(tq1_0, KILN_TQ1_0) X(tq2_0, KILN_TQ2_0)
#define KILN_UNPACK_DECL(name, type) void kiln_unpack_##name(const void *block, kiln_sb *u);
KILN_SB_TYPES(KILN_UNPACK_DECL)
#undef KILN_UNPACK_DECL

/* -- scalar references (ref_quant.c, ref_kquant.c, kv_quant.c) ------------------------------ */
#define KILN_REF_WEIGHT(name)                                                   \
    void kiln_ref_dequant_##name(const void *src, float *dst, int n);           \
    float kiln_ref_dot_##name(int n, const void *w, const void *act);
KILN_REF_WEIGHT(f32)
KILN_REF_WEIGHT(f16)
KILN_REF_WEIGHT(bf16)
KILN_REF_WEIGHT(q4_0)
KILN_REF_WEIGHT(q4_1)
KILN_REF_WEIGHT(q5_0)
KILN_REF_WEIGHT(q5_1)
KILN_REF_WEIGHT(q8_0)
KILN_REF_WEIGHT(q4_K)
KILN_REF_WEIGHT(q5_K)
KILN_REF_WEIGHT(q6_K)
KILN_REF_WEIGHT(iq4_nl)
KILN_REF_WEIGHT(mxfp4)
#define KILN_REF_SB(name, type) KILN_REF_WEIGHT(name)
KILN_SB_TYPES(KILN_REF_SB)
#undef KILN_REF_SB
#undef KILN_REF_WEIGHT
void kiln_ref_copy_f32(const float *x, void *dst, int n);
void kiln_ref_quantize_q8_0(const float *x, void *dst, int n);
void kiln_ref_quantize_q8_1(const float *x, void *dst, int n);
void kiln_ref_quantize_q8_K(const float *x, void *dst, int n);
/* q8_K's inverse scale for a block whose largest magnitude is amax > 0: -127 over the first value
 * of that magnitude, so that its sign is the reference's (the SIMD twins find amax, then this) */
static inline float kiln_q8_K_iscale(const float *x, float amax) {
    int first = 0;
    while (!(__builtin_fabsf(x[first]) == amax)) first++;
    return -127.0f / x[first];
}
void kiln_ref_quantize_f16(const float *x, void *dst, int n);
void kiln_ref_quantize_q4_0(const float *x, void *dst, int n);
void kiln_ref_quantize_q4_1(const float *x, void *dst, int n);
void kiln_ref_quantize_q5_0(const float *x, void *dst, int n);

/* every weight of a Q4_K / Q5_K / Q6_K super-block as the x8 layout's unsigned u: Q4_K 0..15,
   Q5_K 0..31, Q6_K q + 32 in 0..63 (for the packer) */
void kiln_kquant_values(int type, const void *block, uint8_t u[QK_K]);

/* the 6-bit scales and mins of a Q4_K/Q5_K super-block's eight sub-blocks */
static inline void kiln_k4_scales(const uint8_t q[12], int sc[8], int m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
        sc[j + 4] = (q[j + 8] & 0x0F) | ((q[j] >> 6) << 4);
        m[j + 4] = (q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4);
    }
}

/* -- SIMD twins ------------------------------------------------------------------------------ */
/* AVX2 (rows_avx2.c, act_avx2.c): rows of the GGUF layout, 8 weight rows a tile; the q8
 * activation quantizers; the dequantizers of the f16 and q8_0 KV caches */
#ifdef KILN_HAVE_AVX2
#define KILN_ROWS_AVX2(name)                                                                                \
    void kiln_rows_##name##_avx2(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row,   \
                                 int n_a, float *y, size_t y_row);
KILN_ROWS_AVX2(f32)
KILN_ROWS_AVX2(f16)
KILN_ROWS_AVX2(bf16)
KILN_ROWS_AVX2(q4_0)
KILN_ROWS_AVX2(q4_1)
KILN_ROWS_AVX2(q5_0)
KILN_ROWS_AVX2(q5_1)
KILN_ROWS_AVX2(q8_0)
KILN_ROWS_AVX2(q4_K)
KILN_ROWS_AVX2(q5_K)
KILN_ROWS_AVX2(q6_K)
KILN_ROWS_AVX2(iq4_nl)
KILN_ROWS_AVX2(mxfp4)
#define KILN_ROWS_SB(name, type) KILN_ROWS_AVX2(name)
KILN_SB_TYPES(KILN_ROWS_SB)
#undef KILN_ROWS_SB
#undef KILN_ROWS_AVX2
void kiln_quantize_q8_0_avx2(const float *x, void *dst, int n);
void kiln_quantize_q8_1_avx2(const float *x, void *dst, int n);
/* the same (has_min: q8_1), and row `lane` of a tile of the x8 kernels' activation scales (kiln_x8_gemm_tiles):
   each 32-block's d, d * sum (q8_1) as floats, and its sum of values */
void kiln_quantize_q8_tile_avx2(int has_min, const float *x, void *dst, int n, uint8_t *tile, int lane);
void kiln_quantize_q8_K_avx2(const float *x, void *dst, int n);
void kiln_dequant_f16_avx2(const void *src, float *dst, int n);
void kiln_quantize_f16_avx2(const float *x, void *dst, int n);
void kiln_dequant_q8_0_avx2(const void *src, float *dst, int n);
#endif

/* NEON (rows_neon.c, kquant_neon.c, act_neon.c): the same twins as AVX2's, 4 weight rows a tile */
#ifdef KILN_HAVE_NEON
#define KILN_ROWS_NEON(name)                                                                                \
    void kiln_rows_##name##_neon(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row,   \
                                 int n_a, float *y, size_t y_row);
KILN_ROWS_NEON(f32)
KILN_ROWS_NEON(f16)
KILN_ROWS_NEON(bf16)
KILN_ROWS_NEON(q4_0)
KILN_ROWS_NEON(q4_1)
KILN_ROWS_NEON(q5_0)
KILN_ROWS_NEON(q5_1)
KILN_ROWS_NEON(q8_0)
KILN_ROWS_NEON(q4_K)
KILN_ROWS_NEON(q5_K)
KILN_ROWS_NEON(q6_K)
KILN_ROWS_NEON(iq4_nl)
KILN_ROWS_NEON(mxfp4)
#define KILN_ROWS_SB(name, type) KILN_ROWS_NEON(name)
KILN_SB_TYPES(KILN_ROWS_SB)
#undef KILN_ROWS_SB
#undef KILN_ROWS_NEON
void kiln_quantize_q8_0_neon(const float *x, void *dst, int n);
void kiln_quantize_q8_1_neon(const float *x, void *dst, int n);
void kiln_quantize_q8_K_neon(const float *x, void *dst, int n);
void kiln_dequant_f16_neon(const void *src, float *dst, int n);
void kiln_quantize_f16_neon(const float *x, void *dst, int n);
void kiln_dequant_q8_0_neon(const void *src, float *dst, int n);
#endif

/* matmuls on weights interleaved by eight rows (x8_pack.c): AVX-512 VNNI (x8_vnni.c, and x8_amx.c
 * where AMX is built), or AVX2 (x8_avx2.c) */
#ifdef KILN_HAVE_X8
/* y[c * y_row + 8g + r] for the x8 groups [g0, g1) of a packed matrix and activation rows c < n_a */
void kiln_x8_gemm(int type, const uint8_t *w, int g0, int g1, int n_in, const uint8_t *act, size_t a_row, int n_a,
                  float *y, size_t y_row);
/* the same, the rows' scales read from `scales` as the quantizer laid them out for tiles of KILN_X8_TILE rows
   from act's first (kiln_quantize_q8_tile_avx2; NULL: made by the kernel). The AVX2 kernels make their own. */
void kiln_x8_gemm_tiles(int type, const uint8_t *w, int g0, int g1, int n_in, const uint8_t *act, size_t a_row,
                        int n_a, const uint8_t *scales, float *y, size_t y_row);
void kiln_x8_gemm_avx2(int type, const uint8_t *w, int g0, int g1, int n_in, const uint8_t *act, size_t a_row,
                       int n_a, float *y, size_t y_row);
#endif

#endif
