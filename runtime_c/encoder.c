/* encoder.c: what a BERT-family encoder adds to the decoder's ops: LayerNorm with a bias, the exact
 * (erf) GELU of a plain FFN, and a row added to every row (the token-type embedding). One order of
 * operations per row on every path, as ops.c's. */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "kernels_mt.h"

/* Eight partial sums in double, element i into sum i % 8, added in order: the fixed order of
   kiln_rms_norm, which the compiler can run eight lanes wide. */
static double sum8(const float *x, int n) {
    double part[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) part[k] += (double)x[i + k];
    for (; i < n; i++) part[i % 8] += (double)x[i];
    double s = 0.0;
    for (int k = 0; k < 8; k++) s += part[k];
    return s;
}

void kiln_layer_norm(float *y, const float *x, const float *w, const float *b, float eps, int n, int rows) {
    for (int r = 0; r < rows; r++, x += n, y += n) {
        /* the mean and the variance about it in double, as ggml_norm sums in ggml_float; the
           variance is summed apart from the mean, never as E[x^2] - mean^2, which cancels */
        const double mean = sum8(x, n) / n;
        double part[8] = {0};
        int i = 0;
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++) part[k] += ((double)x[i + k] - mean) * ((double)x[i + k] - mean);
        for (; i < n; i++) part[i % 8] += ((double)x[i] - mean) * ((double)x[i] - mean);
        double var = 0.0;
        for (int k = 0; k < 8; k++) var += part[k];
        const float m = (float)mean, scale = 1.0f / sqrtf((float)(var / n) + eps);
        for (int j = 0; j < n; j++) {
            const float v = (x[j] - m) * scale;
            y[j] = (w ? v * w[j] : v) + (b ? b[j] : 0.0f);
        }
    }
}

/* 0.5 x (1 + erf(x / sqrt 2)) in double, rounded once: the GELU BERT was trained with (not ggml's
   tanh form), the same bits wherever libm's erf is correctly rounded to float */
void kiln_gelu(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = (float)(0.5 * (double)x[i] * (1.0 + erf((double)x[i] * M_SQRT1_2)));
}

void kiln_layer_norm_mt(const kiln_thread *t, float *y, const float *x, const float *w, const float *b, float eps,
                        int n, int rows) {
    int r0, r1;
    kiln_share(t, rows, 1, &r0, &r1);
    if (r1 > r0) kiln_layer_norm(y + (size_t)r0 * n, x + (size_t)r0 * n, w, b, eps, n, r1 - r0);
}

void kiln_gelu_mt(const kiln_thread *t, float *y, const float *x, int n) {
    int i0, i1;
    kiln_share(t, n, 16, &i0, &i1);
    if (i1 > i0) kiln_gelu(y + i0, x + i0, i1 - i0);
}

void kiln_add_row_mt(const kiln_thread *t, float *y, const float *x, int n, int width, const float *w) {
    int r0, r1;
    kiln_share(t, n, 1, &r0, &r1);
    for (int r = r0; r < r1; r++)
        for (int i = 0; i < width; i++) y[(size_t)r * width + i] = x[(size_t)r * width + i] + w[i];
}
