/* quant_impl.h: per-type kernels shared between quant.c (which owns the type table) and kquants.c. */
#ifndef KILN_QUANT_IMPL_H
#define KILN_QUANT_IMPL_H

#include "quants.h"

void kiln_quantize_q8_K(const float *x, void *dst, int n);
void kiln_dequant_q4_K(const void *src, float *dst, int n);
void kiln_dequant_q5_K(const void *src, float *dst, int n);
void kiln_dequant_q6_K(const void *src, float *dst, int n);
float kiln_dot_q4_K(int n, const void *w, const void *act);
float kiln_dot_q5_K(int n, const void *w, const void *act);
float kiln_dot_q6_K(int n, const void *w, const void *act);


/* AVX2 twins (quant_avx2.c), present when the compiler targets AVX2 and FMA */
#if defined(__AVX2__) && defined(__FMA__)
#define KILN_HAVE_AVX2 1
float kiln_dot_q8_0_avx2(int n, const void *w, const void *act);
float kiln_dot_q4_0_avx2(int n, const void *w, const void *act);
float kiln_dot_q4_1_avx2(int n, const void *w, const void *act);
float kiln_dot_q5_0_avx2(int n, const void *w, const void *act);
float kiln_dot_q4_K_avx2(int n, const void *w, const void *act);
float kiln_dot_q6_K_avx2(int n, const void *w, const void *act);
float kiln_dot_f32_avx2(int n, const float *a, const float *b);
#endif

/* a . b over n floats, with the best kernel this build has */
float kiln_dot_f32(int n, const float *a, const float *b);

#endif
