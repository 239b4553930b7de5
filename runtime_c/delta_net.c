/* delta_net.c: the ops of the Qwen3.5 / Qwen3-Next hybrids, as llama.cpp's qwen35 graph and ggml's
 * CPU kernels compute them: the Gated DeltaNet's conv and delta rule, with each sequence's recurrent
 * state in its slot of the state pool (compiler/planner/state_plan.py places every layer's part of a
 * slot), and the elementwise ops around them (regroup, the sigmoid gates).
 *
 * A recurrence runs token by token in one order of operations: row r of a step continues the
 * state its sequence's previous row left, and a row at cache row 0 starts from zeros. So a
 * token's values are the same bits however its sequence was cut into steps, and whichever rows of
 * other sequences share its step: those touch other slots. Threads split channels (the conv) or
 * value heads (the delta rule), never a sequence's tokens.
 */
#include <math.h>
#include <string.h>

#include "constants.h"
#include "kernels.h"
#include "kernels_mt.h"
#include "vec_f32.h"

/* ln x for softplus: x = m 2^e with m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh(s) for s = (m - 1) /
 * (m + 1), by its odd series to s^9 in Horner's order (each step an fma), and e ln2 added in its two parts. For finite
 * x >= 2^-126 (softplus's 1 + e^x); relative error < 3e-7. libm's logf differs between C libraries,
 * and a value may not depend on the machine that computed it. */
static inline float ln(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    int e = (int)((bits >> 23) & 0xffu) - 127;
    bits = (bits & 0x007fffffu) | 0x3f800000u;
    float m;
    memcpy(&m, &bits, sizeof m);
    if (m > 1.41421356f) m *= 0.5f, e += 1;
    const float s = (m - 1.0f) / (m + 1.0f), z = s * s;
    float p = 1.0f / 9;
    p = fmaf(p, z, 1.0f / 7);
    p = fmaf(p, z, 1.0f / 5);
    p = fmaf(p, z, 1.0f / 3);
    p = fmaf(p, z, 1.0f);
    return fmaf((float)e, KILN_EXP_LN2_HI, fmaf((float)e, KILN_EXP_LN2_LO, 2.0f * s * p));
}

/* silu(v) = v / (1 + e^-v), as kiln_swiglu's scalar spelling */
static inline float silu(float v) { return v / (1.0f + kiln_expf(0.0f - v)); }

static inline float sigmoid(float v) { return 1.0f / (1.0f + kiln_expf(0.0f - v)); }

/* ggml_compute_softplus_f32 */
static inline float softplus(float v) { return v > 20.0f ? v : ln(1.0f + kiln_expf(v)); }

/* y = silu(y) in place: kiln_swiglu's spelling with up = 1, eight at a time where the build has
   AVX2 (kiln_exp8 is kiln_expf lane by lane), the rest one by one: the same bits on every path */
static void silu_rows(float *y, int n) {
    int i = 0;
#ifdef KILN_AVX2
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(y + i);
        _mm256_storeu_ps(y + i, _mm256_div_ps(g, _mm256_add_ps(one, kiln_exp8(_mm256_sub_ps(zero, g)))));
    }
#elif defined(KILN_NEON)
    for (; i + 4 <= n; i += 4) {
        const float32x4_t g = vld1q_f32(y + i), e = kiln_exp4(vsubq_f32(vdupq_n_f32(0.0f), g));
        vst1q_f32(y + i, vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), e)));
    }
#endif
    for (; i < n; i++) y[i] = silu(y[i]);
}

enum { CONV_BLOCK = 256 }; /* channels whose taps are transposed onto the stack at once */

/* Blocks of channels, and in a block each row's channels tap by tap (loops along the channels, which
   vectorize, over taps laid out [tap][channel]): each channel's sum one fma a tap from the oldest
   input (ggml's ssm_conv order), rows in order; then the window moves on. */
void kiln_ssm_conv(float *y, const float *x, const float *w, const int32_t *seq, const int32_t *row, int n,
                   int channels, int taps, float *state, size_t slot_floats, int c0, int c1) {
    float wt[KILN_MAX_CONV_TAPS][CONV_BLOCK];
    for (int b0 = c0; b0 < c1; b0 += CONV_BLOCK) {
        const int nc = c1 - b0 < CONV_BLOCK ? c1 - b0 : CONV_BLOCK;
        const size_t width = (size_t)nc * sizeof(float);
        for (int c = 0; c < nc; c++)
            for (int k = 0; k < taps; k++) wt[k][c] = w[(size_t)(b0 + c) * taps + k];
        for (int r = 0; r < n; r++) {
            float *st = state + (size_t)seq[r] * slot_floats + b0; /* [taps - 1][channels]: oldest input first */
            const float *xr = x + (size_t)r * channels + b0;
            float *yr = y + (size_t)r * channels + b0;
            if (row[r] == 0)
                for (int k = 0; k < taps - 1; k++) memset(st + (size_t)k * channels, 0, width);
            for (int c = 0; c < nc; c++) yr[c] = 0.0f;
            for (int k = 0; k < taps - 1; k++) {
                const float *sk = st + (size_t)k * channels;
                for (int c = 0; c < nc; c++) yr[c] = fmaf(sk[c], wt[k][c], yr[c]);
            }
            for (int c = 0; c < nc; c++) yr[c] = fmaf(xr[c], wt[taps - 1][c], yr[c]);
            for (int k = 0; k + 1 < taps - 1; k++) memcpy(st + (size_t)k * channels, st + (size_t)(k + 1) * channels, width);
            if (taps > 1) memcpy(st + (size_t)(taps - 2) * channels, xr, width);
            silu_rows(yr, nc);
        }
    }
}

/* x / ||x|| as build_gdn_l2_norm spells it: rms_norm(x, eps / d) / sqrt(d), the squares summed in
 * double as kiln_rms_norm sums them (eight partials, element i into i % 8) */
static void l2_normed(float *y, const float *x, int d, float eps) {
    double part[8] = {0};
    for (int i = 0; i < d; i++) part[i % 8] += (double)x[i] * x[i];
    double ss = 0.0;
    for (int k = 0; k < 8; k++) ss += part[k];
    const float scale = 1.0f / sqrtf((float)(ss / d) + eps / (float)d), inv_sqrt_d = 1.0f / sqrtf((float)d);
    for (int i = 0; i < d; i++) y[i] = x[i] * scale * inv_sqrt_d;
}

/* A state row's two passes a token: decayed and dotted with k; then k times its delta added, and
   dotted with q. The reference spells each as a loop and a dot (vec_f32.h's order); the AVX2 spelling
   does each in one pass over the row, the same products and sums in the same lanes. */
static inline float decay_dot_ref(float *s, float decay, const float *k, int n) {
    for (int i = 0; i < n; i++) s[i] *= decay;
    return kiln_vdot_ref(s, k, n);
}

static inline float update_dot_ref(float *s, float delta, const float *k, const float *q, int n) {
    for (int i = 0; i < n; i++) s[i] = fmaf(delta, k[i], s[i]);
    return kiln_vdot_ref(s, q, n);
}

#ifdef KILN_AVX2
static inline float decay_dot(float *s, float decay, const float *k, int n) {
    const __m256 vd = _mm256_set1_ps(decay);
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(s + i), vd), a1 = _mm256_mul_ps(_mm256_loadu_ps(s + i + 8), vd);
        _mm256_storeu_ps(s + i, a0), _mm256_storeu_ps(s + i + 8, a1);
        s0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(k + i), s0);
        s1 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(k + i + 8), s1);
    }
    if (i + 8 <= n) {
        const __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(s + i), vd);
        _mm256_storeu_ps(s + i, a0);
        s0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(k + i), s0);
        i += 8;
    }
    float sum = kiln_hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s[i] *= decay, sum = fmaf(s[i], k[i], sum);
    return sum;
}

static inline float update_dot(float *s, float delta, const float *k, const float *q, int n) {
    const __m256 vd = _mm256_set1_ps(delta);
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 a0 = _mm256_fmadd_ps(vd, _mm256_loadu_ps(k + i), _mm256_loadu_ps(s + i));
        const __m256 a1 = _mm256_fmadd_ps(vd, _mm256_loadu_ps(k + i + 8), _mm256_loadu_ps(s + i + 8));
        _mm256_storeu_ps(s + i, a0), _mm256_storeu_ps(s + i + 8, a1);
        s0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(q + i), s0);
        s1 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(q + i + 8), s1);
    }
    if (i + 8 <= n) {
        const __m256 a0 = _mm256_fmadd_ps(vd, _mm256_loadu_ps(k + i), _mm256_loadu_ps(s + i));
        _mm256_storeu_ps(s + i, a0);
        s0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(q + i), s0);
        i += 8;
    }
    float sum = kiln_hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s[i] = fmaf(delta, k[i], s[i]), sum = fmaf(s[i], q[i], sum);
    return sum;
}
#else
static inline float decay_dot(float *s, float decay, const float *k, int n) {
    for (int i = 0; i < n; i++) s[i] *= decay;
    return kiln_vdot(s, k, n);
}

static inline float update_dot(float *s, float delta, const float *k, const float *q, int n) {
    kiln_vaxpy(s, delta, k, n);
    return kiln_vdot(s, q, n);
}
#endif

/* One row's value heads h0 .. h1 - 1. The state of a head is S[j][i] (value dim j, key dim i; row j
 * contiguous, as ggml holds it transposed), and each row j is done before the next: decayed, its
 * delta d_j = (v_j - S_j . k) beta taken, k d_j added, and read out by q, which is what ggml's
 * pass over all of S per step gives row by row. */
#define DELTA_NET(name, decay_dot, update_dot)                                                         \
    void name(float *out, const float *x, const float *alpha, const float *beta, const float *dt,     \
              const float *a, const int32_t *seq, const int32_t *row, int n, int n_k, int n_v,          \
              int interleaved, int d, float eps, float *state, size_t slot_floats, int h0, int h1) {    \
        const size_t width = (size_t)(2 * n_k + n_v) * d;                                              \
        const float scale = 1.0f / sqrtf((float)d);                                                    \
        float q[KILN_MAX_STATE_DIM], k[KILN_MAX_STATE_DIM];                                            \
        for (int h = h0; h < h1; h++) { /* a head's rows in order: its state stays in cache */         \
            for (int r = 0; r < n; r++) {                                                              \
                const float *xr = x + r * width;                                                       \
                const int kh = interleaved ? h / (n_v / n_k) : h % n_k; /* qwen3next's, or qwen35's */ \
                l2_normed(q, xr + (size_t)kh * d, d, eps);                                             \
                l2_normed(k, xr + (size_t)(n_k + kh) * d, d, eps);                                     \
                const float *v = xr + (size_t)(2 * n_k + h) * d;                                       \
                const float decay = kiln_expf(softplus(alpha[(size_t)r * n_v + h] + dt[h]) * a[h]);    \
                const float b = sigmoid(beta[(size_t)r * n_v + h]);                                    \
                float *S = state + (size_t)seq[r] * slot_floats + (size_t)h * d * d;                   \
                float *o = out + ((size_t)r * n_v + h) * d;                                            \
                if (row[r] == 0) memset(S, 0, (size_t)d * d * sizeof(float));                          \
                for (int j = 0; j < d; j++) {                                                          \
                    float *Sj = S + (size_t)j * d;                                                     \
                    const float delta = (v[j] - decay_dot(Sj, decay, k, d)) * b;                       \
                    o[j] = update_dot(Sj, delta, k, q, d) * scale;                                     \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }
DELTA_NET(kiln_delta_net, decay_dot, update_dot)
DELTA_NET(kiln_delta_net_ref, decay_dot_ref, update_dot_ref)

void kiln_regroup(float *y, int y_width, int y_at, const float *x, int rows, int groups, int group_width, int from,
                  int count) {
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < groups; g++)
            memcpy(y + (size_t)r * y_width + y_at + (size_t)g * count,
                   x + ((size_t)r * groups + g) * group_width + from, (size_t)count * sizeof(float));
}

void kiln_sigmoid_gate(float *y, const float *gate, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = x[i] * sigmoid(gate[i]);
}

/* ==== threaded twins ========================================================================= */

void kiln_ssm_conv_mt(const kiln_thread *t, float *y, const float *x, const float *w, const int32_t *seq,
                      const int32_t *row, int n, int channels, int taps, float *state, size_t slot_floats) {
    int c0, c1;
    kiln_share(t, channels, 16, &c0, &c1);
    if (c1 > c0) kiln_ssm_conv(y, x, w, seq, row, n, channels, taps, state, slot_floats, c0, c1);
}

void kiln_delta_net_mt(const kiln_thread *t, float *out, const float *x, const float *alpha, const float *beta,
                       const float *dt, const float *a, const int32_t *seq, const int32_t *row, int n, int n_k,
                       int n_v, int interleaved, int d, float eps, float *state, size_t slot_floats) {
    int h0, h1;
    kiln_share(t, n_v, 1, &h0, &h1);
    if (h1 > h0)
        kiln_delta_net(out, x, alpha, beta, dt, a, seq, row, n, n_k, n_v, interleaved, d, eps, state, slot_floats, h0,
                       h1);
}

void kiln_regroup_mt(const kiln_thread *t, float *y, int y_width, int y_at, const float *x, int rows, int groups,
                     int group_width, int from, int count) {
    int r0, r1;
    kiln_share(t, rows, 1, &r0, &r1);
    if (r1 > r0)
        kiln_regroup(y + (size_t)r0 * y_width, y_width, y_at, x + (size_t)r0 * groups * group_width, r1 - r0, groups,
                     group_width, from, count);
}

void kiln_sigmoid_gate_mt(const kiln_thread *t, float *y, const float *gate, const float *x, int n) {
    int i0, i1;
    kiln_share(t, n, 16, &i0, &i1);
    if (i1 > i0) kiln_sigmoid_gate(y + i0, gate + i0, x + i0, i1 - i0);
}

/* y[r][i] = x[r][i] * sigmoid(gate[r]): a shared expert's output times its row's gate */
void kiln_sigmoid_row_gate(float *y, const float *gate, const float *x, int rows, int width) {
    for (int r = 0; r < rows; r++) {
        const float s = sigmoid(gate[r]);
        for (int i = 0; i < width; i++) y[(size_t)r * width + i] = x[(size_t)r * width + i] * s;
    }
}

void kiln_sigmoid_row_gate_mt(const kiln_thread *t, float *y, const float *gate, const float *x, int rows, int width) {
    int r0, r1;
    kiln_share(t, rows, 1, &r0, &r1);
    if (r1 > r0) kiln_sigmoid_row_gate(y + (size_t)r0 * width, gate + r0, x + (size_t)r0 * width, r1 - r0, width);
}
