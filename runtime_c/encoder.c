/* encoder.c: what a BERT-family encoder adds to the decoder's ops: LayerNorm with a bias and the exact
 * (erf) GELU of a plain FFN (the token-type row's add is ops.c's kiln_add_row_mt). One order of
 * operations per row on every path, as ops.c's. */
#include <math.h>

#include "kernels.h"
#include "kernels_mt.h"
#include "vec_f32.h"

void kiln_layer_norm(float *y, const float *x, const float *w, const float *b, float eps, int n, int rows) {
    for (int r = 0; r < rows; r++, x += n, y += n) {
        const double mean = kiln_sum8_double(x, n, 0, 0.0) / n, var = kiln_sum8_double(x, n, 1, mean) / n;
        const float m = (float)mean, scale = 1.0f / sqrtf((float)var + eps);
        for (int j = 0; j < n; j++) {
            const float v = (x[j] - m) * scale;
            y[j] = (w ? v * w[j] : v) + (b ? b[j] : 0.0f);
        }
    }
}

/* erf(z) for |z| <= 4 (beyond, +-1 in float) as a ratio of odd and even polynomials in z: Eigen's
   and XLA's single-precision erf, within 4.2e-7 of erf. Only + * / in a fixed order, so the
   compiler may run it 16 lanes wide and every target gets the same bits. */
static inline float erf_rational(float a) {
    const float z = a > 4.0f ? 4.0f : a < -4.0f ? -4.0f : a, z2 = z * z;
    float p = z2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
    p = z2 * p + -2.10102402082508e-06f;
    p = z2 * p + -5.69250639462346e-05f;
    p = z2 * p + -7.34990630326855e-04f;
    p = z2 * p + -2.95459980854025e-03f;
    p = z2 * p + -1.60960333262415e-02f;
    float q = z2 * -1.45660718464996e-05f + -2.13374055278905e-04f;
    q = z2 * q + -1.68282697438203e-03f;
    q = z2 * q + -7.37332916720468e-03f;
    q = z2 * q + -1.42647390514189e-02f;
    return z * p / q;
}

/* x Phi(x) for x < -1/sqrt 2, where 1 + erf(x / sqrt 2) cancels: 0.5 x erfc(z), z = -x / sqrt 2, with
   erfc(z) = t e^(-z^2 + P(t)), t = 1 / (1 + z/2) (Numerical Recipes' erfcc, fractional error
   < 1.2e-7), -z^2 + P in one fma and kiln_expf: within 10 ulp on average of the exact value,
   whose magnitude there is under 0.17. */
static inline float gelu_negative(float x) {
    const float z = -x * 0.70710678f, t = 1.0f / (1.0f + 0.5f * z);
    float p = 0.17087277f;
    p = fmaf(p, t, -0.82215223f);
    p = fmaf(p, t, 1.48851587f);
    p = fmaf(p, t, -1.13520398f);
    p = fmaf(p, t, 0.27886807f);
    p = fmaf(p, t, -0.18628806f);
    p = fmaf(p, t, 0.09678418f);
    p = fmaf(p, t, 0.37409196f);
    p = fmaf(p, t, 1.00002368f);
    p = fmaf(p, t, -1.26551223f);
    return x * (0.5f * t * kiln_expf(fmaf(-z, z, p)));
}

/* x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)): the GELU BERT was trained with (not ggml's tanh form).
   From -1/sqrt 2 up the rational erf (within 3.2 ulp of the exact GELU, measured over a grid of
   1e-4 to |x| = 5.7); below it the erfc form. Both are computed and one kept, lane by lane, so
   the loop runs as wide as the target allows with the same bits. */
void kiln_gelu(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) {
        const float v = x[i];
        const float pos = 0.5f * v * (1.0f + erf_rational(v * 0.70710678f)), neg = gelu_negative(v);
        y[i] = v < -0.70710678f ? neg : pos;
    }
}

void kiln_geglu_erf(float *y, const float *gate, const float *up, int n) {
    kiln_gelu(y, gate, n);
    for (int i = 0; i < n; i++) y[i] *= up[i];
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
