/* quant_impl.h: per-type kernels shared between quant.c (which owns the type table) and kquants.c. */
#ifndef KILN_QUANT_IMPL_H
#define KILN_QUANT_IMPL_H

#include <stddef.h>

#include "quants.h"

void kiln_quantize_q8_K(const float *x, void *dst, int n);
void kiln_dequant_q4_K(const void *src, float *dst, int n);
void kiln_dequant_q5_K(const void *src, float *dst, int n);
void kiln_dequant_q6_K(const void *src, float *dst, int n);
float kiln_dot_q4_K(int n, const void *w, const void *act);
float kiln_dot_q5_K(int n, const void *w, const void *act);
float kiln_dot_q6_K(int n, const void *w, const void *act);

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
