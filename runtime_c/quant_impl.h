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

#endif
