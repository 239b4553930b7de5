/* quant_impl.h: per-type kernels shared between quant.c (which owns the type table) and kquants.c. */
#ifndef KILN_QUANT_IMPL_H
#define KILN_QUANT_IMPL_H

#include <stddef.h>

#include "kernels.h"
#include "quants.h"

/* The 32-weight block types as the SIMD kernels read them (gemm_vnni.c, pack_x8.c): each weight
 * as an unsigned byte u, w = d * (u - offset), or w = d * u + m for the types with a minimum.
 * Every block begins with d (then m); Q8_0's signed q is read as u = q ^ 0x80, offset 128. */
typedef struct {
    size_t block_bytes;
    int offset;    /* 8 (Q4_0), 16 (Q5_0), 128 (Q8_0), 0 (Q4_1, Q5_1) */
    int has_min;   /* m follows d; the activations are q8_1 (with s = d * sum(q)), else q8_0 */
    int bits;      /* bits of u stored in qs: 4 (nibbles, low then high), or 8 */
    size_t qh_at;  /* offset of the fifth bits (Q5_0, Q5_1), 0 when there are none */
    size_t qs_at;  /* offset of the nibbles, or of Q8_0's bytes */
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

void kiln_quantize_q8_K(const float *x, void *dst, int n);
void kiln_dequant_q4_K(const void *src, float *dst, int n);
void kiln_dequant_q5_K(const void *src, float *dst, int n);
void kiln_dequant_q6_K(const void *src, float *dst, int n);
float kiln_dot_q4_K(int n, const void *w, const void *act);
float kiln_dot_q5_K(int n, const void *w, const void *act);
float kiln_dot_q6_K(int n, const void *w, const void *act);
/* weight l of a super-block as its integer: Q4_K 0..15, Q5_K 0..31, Q6_K -32..31 (for the packer) */
int kiln_q4k_value(const void *block, int l);
int kiln_q5k_value(const void *block, int l);
int kiln_q6k_value(const void *block, int l);

/* the 6-bit scales and mins of a Q4_K/Q5_K super-block's eight sub-blocks, for the SIMD kernels */
static inline void kiln_k4_scales(const uint8_t q[12], int sc[8], int m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
        sc[j + 4] = (q[j + 8] & 0x0F) | ((q[j] >> 6) << 4);
        m[j + 4] = (q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4);
    }
}


/* AVX2 twins (quant_avx2.c), present when the compiler targets AVX2 and FMA */
#if defined(__AVX2__) && defined(__FMA__)
#define KILN_HAVE_AVX2 1
float kiln_dot_q8_0_avx2(int n, const void *w, const void *act);
float kiln_dot_q4_0_avx2(int n, const void *w, const void *act);
float kiln_dot_q4_1_avx2(int n, const void *w, const void *act);
float kiln_dot_q5_0_avx2(int n, const void *w, const void *act);
float kiln_dot_q4_K_avx2(int n, const void *w, const void *act);
float kiln_dot_q6_K_avx2(int n, const void *w, const void *act);
void kiln_quantize_q8_0_avx2(const float *x, void *dst, int n);
void kiln_quantize_q8_1_avx2(const float *x, void *dst, int n);
void kiln_dequant_f16_avx2(const void *src, float *dst, int n);
void kiln_dequant_q8_0_avx2(const void *src, float *dst, int n);
#endif

/* AVX-512 VNNI tiled gemms (gemm_vnni.c): y[c * y_row + r] = W[r] . act[c], r < n_w, c < n_a */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define KILN_HAVE_VNNI 1
#define KILN_GEMM_DECL(name) \
    void kiln_gemm_##name##_vnni(int n, const void *w, size_t w_row, int n_w, const void *act, size_t a_row, \
                                 int n_a, float *y, size_t y_row);
KILN_GEMM_DECL(q4_0)
KILN_GEMM_DECL(q4_1)
KILN_GEMM_DECL(q5_0)
KILN_GEMM_DECL(q5_1)
KILN_GEMM_DECL(q8_0)
KILN_GEMM_DECL(q4_K)
KILN_GEMM_DECL(q6_K)
#undef KILN_GEMM_DECL
#endif

#endif
