/* ops.c: the f32 elementwise and normalisation ops, one order of operations on every path (vec_f32.h). */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "fp16.h"
#include "kernels.h"
#include "kernels_mt.h"
#include "vec_f32.h"

void kiln_rms_norm(float *y, const float *x, const float *w, float w_offset, float eps, int n, int rows) {
    for (int r = 0; r < rows; r++, x += n, y += n) {
        const float scale = 1.0f / sqrtf((float)(kiln_sum8_double(x, n, 1, 0.0) / n) + eps);
        if (w) for (int i = 0; i < n; i++) y[i] = x[i] * scale * (w[i] + w_offset);
        else for (int i = 0; i < n; i++) y[i] = x[i] * scale; /* a norm without a weight (Gemma 4's V) */
    }
}

/* YaRN's ramp and correction dimensions, as ggml computes them (ggml-cpu/ops.cpp, ggml.c) */
static float yarn_ramp(float low, float high, int i0) {
    const float y = (i0 / 2 - low) / (high - low > 0.001f ? high - low : 0.001f);
    return 1 - (y < 0 ? 0 : y > 1 ? 1 : y);
}

static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

/* The arithmetic is ggml's as gcc builds it with FMA on x86 (the llama.cpp kiln is measured
 * against: the Makefile's AVX-512 build; other builds may fuse otherwise). -ffp-contract=fast fuses a
 * multiply into the add that takes it, so YaRN's mix is one fma, and a rotated pair (x0, x1)
 * becomes (fma(x0, c, -(x1 s)), fma(x0, s, x1 c)): each output's first product exact, its second
 * rounded. Where gcc vectorizes the pairwise layout, four pairs at a time, the last n_pairs % 4
 * are left to SSE's addsub, which fuses nothing. kiln builds with -ffp-contract=off and spells
 * each fma out (fmaf is exact on every target), so every target computes these bits. */
static inline void rotate_fused(float *y0, float *y1, float x0, float x1, float c, float s) {
    *y0 = fmaf(x0, c, -(x1 * s));
    *y1 = fmaf(x0, s, x1 * c);
}

static inline void rotate_plain(float *y0, float *y1, float x0, float x1, float c, float s) {
    *y0 = x0 * c - x1 * s;
    *y1 = x1 * c + x0 * s;
}

/* unscaled: every factor 1 leaves each angle and product exact, so these are the plain rope's bits */
static const kiln_rope_scaling ROPE_PLAIN = KILN_ROPE_UNSCALED;

void kiln_rope_angles(float *cs, size_t ld, const int32_t *pos, int rows, int n_rot, float base,
                      const kiln_rope_scaling *sc, const float *factors) {
    sc = sc ? sc : &ROPE_PLAIN;
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    const int half = n_rot / 2;
    float lo = 0.0f, hi = 0.0f;
    if (sc->ext_factor != 0.0f) {
        const float start = floorf(yarn_corr_dim(n_rot, sc->n_ctx_orig, sc->beta_fast, base));
        const float end = ceilf(yarn_corr_dim(n_rot, sc->n_ctx_orig, sc->beta_slow, base));
        lo = start > 0 ? start : 0, hi = end < n_rot - 1 ? end : n_rot - 1;
    }
    for (int r = 0; r < rows; r++, cs += ld) {
        float theta = (float)pos[r]; /* theta_i = pos * base^(-2i/d), by repeated products like ggml */
        for (int i = 0; i < half; i++, theta *= theta_scale) {
            const float extrap = factors ? theta / factors[i] : theta, interp = sc->freq_scale * extrap;
            float angle = interp;
            if (sc->ext_factor != 0.0f) {
                const float mix = yarn_ramp(lo, hi, 2 * i) * sc->ext_factor;
                angle = fmaf(interp, 1 - mix, extrap * mix);
            }
            cs[i] = cosf(angle) * sc->mscale, cs[half + i] = sinf(angle) * sc->mscale;
        }
    }
}

void kiln_rope_rotate(float *y, const float *x, const float *cs, size_t ld, int rows, int n_head, int head_dim,
                      int n_rot, int neox) {
    if (!cs) {
        if (y != x) memcpy(y, x, (size_t)rows * n_head * head_dim * sizeof(float));
        return;
    }
    const int half = n_rot / 2, fused = neox ? half : half - half % 4;
    for (int r = 0; r < rows; r++, cs += ld) { /* one row's rotation serves all its heads */
        const float *sn = cs + half;
        int vec = 0; /* pairs the vector loop rotates */
#if defined(__AVX512F__)
        /* pairwise (2i, 2i + 1), eight pairs a vector: y = fma(x0 both, (c, s), (-(x1 s), x1 c)), rotate_fused's
           operations lane by lane; the pairs' (c, s) and (s, c) interleaved once for the row's heads */
        float cs2[KILN_MAX_HEAD_DIM], sc2[KILN_MAX_HEAD_DIM];
        if (!neox && fused % 8 == 0) {
            vec = fused;
            for (int i = 0; i < fused; i++) cs2[2 * i] = sc2[2 * i + 1] = cs[i], cs2[2 * i + 1] = sc2[2 * i] = sn[i];
        }
        const __m512 even = _mm512_castsi512_ps(_mm512_set1_epi64(0x80000000LL)); /* the sign of lanes 2i */
        for (int h = 0; h < n_head && vec; h++) {
            const float *xh = x + ((size_t)r * n_head + h) * head_dim;
            float *yh = y + ((size_t)r * n_head + h) * head_dim;
            for (int d = 0; d < 2 * vec; d += 16) {
                const __m512 v = _mm512_loadu_ps(xh + d);
                const __m512 t = _mm512_xor_ps(_mm512_mul_ps(_mm512_movehdup_ps(v), _mm512_loadu_ps(sc2 + d)), even);
                _mm512_storeu_ps(yh + d, _mm512_fmadd_ps(_mm512_moveldup_ps(v), _mm512_loadu_ps(cs2 + d), t));
            }
        }
#endif
        for (int h = 0; h < n_head; h++) {
            const float *xh = x + ((size_t)r * n_head + h) * head_dim;
            float *yh = y + ((size_t)r * n_head + h) * head_dim;
            for (int i = vec; i < half; i++) {
                const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                if (i < fused) rotate_fused(yh + i0, yh + i1, xh[i0], xh[i1], cs[i], sn[i]);
                else rotate_plain(yh + i0, yh + i1, xh[i0], xh[i1], cs[i], sn[i]);
            }
            if (yh != xh) memcpy(yh + n_rot, xh + n_rot, (size_t)(head_dim - n_rot) * sizeof(float));
        }
    }
}

void kiln_rope_ext(float *y, const float *x, const int32_t *pos, int rows, int n_head, int head_dim, int n_rot,
                   float base, int neox, const kiln_rope_scaling *sc, const float *factors) {
    /* the first n_rot dims of a head rotate, as ggml's n_dims; the rest are copied. Base 0 marks
       a layer without rope (NoPE), as it marks a cache whose K a shift leaves alone (kv_rows.c) */
    float cs[KILN_MAX_HEAD_DIM];
    for (int r = 0; r < rows; r++) {
        const size_t at = (size_t)r * n_head * head_dim;
        if (base != 0.0f) kiln_rope_angles(cs, 0, pos + r, 1, n_rot, base, sc, factors);
        kiln_rope_rotate(y + at, x + at, base != 0.0f ? cs : NULL, 0, 1, n_head, head_dim, n_rot, neox);
    }
}

void kiln_rope(float *y, const float *x, const int32_t *pos, int rows, int n_head, int head_dim,
               float base, int neox) {
    kiln_rope_ext(y, x, pos, rows, n_head, head_dim, head_dim, base, neox, &ROPE_PLAIN, NULL);
}

void kiln_hadamard(float *y, const float *x, int n) {
    for (int b = 0; b < n; b += KILN_HADAMARD_BLOCK) {
        float v[KILN_HADAMARD_BLOCK];
        memcpy(v, x + b, sizeof v);
        for (int h = 1; h < KILN_HADAMARD_BLOCK; h *= 2) /* butterflies: Sylvester's ordering */
            for (int i = 0; i < KILN_HADAMARD_BLOCK; i += 2 * h)
                for (int j = i; j < i + h; j++) {
                    const float a = v[j], c = v[j + h];
                    v[j] = a + c, v[j + h] = a - c;
                }
        for (int j = 0; j < KILN_HADAMARD_BLOCK; j++) y[b + j] = v[j] * 0.125f; /* 1/sqrt(64): exact */
    }
}

void kiln_add(float *y, const float *a, const float *b, int n) {
    for (int i = 0; i < n; i++) y[i] = a[i] + b[i];
}

void kiln_scale(float *y, const float *x, int n, float s) {
    for (int i = 0; i < n; i++) y[i] = x[i] * s;
}

void kiln_softcap(float *y, const float *x, int n, float cap) {
    if (y != x) memcpy(y, x, (size_t)n * sizeof(float));
    kiln_vsoftcap(y, n, cap);
}

/* the reference, through libm's expf */
void kiln_swiglu_ref(float *y, const float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) y[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* silu(g) * u = g / (1 + e^-g) * u with kiln_expf (its AVX2 spelling eight at a time, the rest
 * one by one: the same bits, so a value does not depend on where a thread's share begins) */
void kiln_swiglu(float *y, const float *gate, const float *up, int n) {
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        const __m512 g = _mm512_loadu_ps(gate + i), e = kiln_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)),
                                              _mm512_loadu_ps(up + i)));
    }
#endif
#ifdef KILN_AVX2
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = kiln_exp8(_mm256_sub_ps(zero, g));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
#elif defined(KILN_NEON)
    for (; i + 4 <= n; i += 4) {
        const float32x4_t g = vld1q_f32(gate + i), e = kiln_exp4(vsubq_f32(vdupq_n_f32(0.0f), g));
        vst1q_f32(y + i, vmulq_f32(vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), e)), vld1q_f32(up + i)));
    }
#endif
    for (; i < n; i++) y[i] = gate[i] / (1.0f + kiln_expf(0.0f - gate[i])) * up[i];
}

/* gpt-oss's clamped SwiGLU, as ggml's swiglu_oai with llama.cpp's alpha 1.702 and limit 7:
 * g = min(gate, 7), g / (1 + e^(1.702 (-g))) (clamp(up, -7, 7) + 1), exp through kiln_expf */
void kiln_swiglu_oai(float *y, const float *gate, const float *up, int n) {
    const float alpha = 1.702f, limit = 7.0f;
    for (int i = 0; i < n; i++) {
        const float g = gate[i] < limit ? gate[i] : limit;
        const float u = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        y[i] = g / (1.0f + kiln_expf(alpha * (0.0f - g))) * (u + 1.0f);
    }
}

/* GELU is evaluated as llama.cpp's CPU backend does: at the input rounded to f16, with the
 * result rounded to f16 (its lookup-table path), and cut off outside [-10, 10]. Exact tanh-GELU
 * drifts Gemma's logits measurably away from the reference. */
static inline kiln_half gelu_at_f16(kiln_half bits) {
    const float sqrt_2_over_pi = 0.79788456080286535588f, coef_a = 0.044715f;
    const float h = kiln_fp16_to_fp32(bits);
    return kiln_fp32_to_fp16(0.5f * h * (1.0f + tanhf(sqrt_2_over_pi * h * (1.0f + coef_a * h * h))));
}

static inline float gelu_f16_rounded(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return kiln_fp16_to_fp32(gelu_at_f16(kiln_fp32_to_fp16(x)));
}

/* Inside the cut-offs that is a function of x's f16 bits, so a table of all 65536 gives the
 * same values without a tanhf per element (as ggml's table does). One entry more than the bits
 * take: a vector gather reads each entry as the low half of 32 bits. */
static kiln_half gelu_table[(1 << 16) + 1];
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

static void gelu_table_init(void) {
    for (int i = 0; i < 1 << 16; i++) gelu_table[i] = gelu_at_f16((kiln_half)i);
}

void kiln_geglu(float *y, const float *gate, const float *up, int n) {
    pthread_once(&gelu_once, gelu_table_init);
    int i = 0;
#if defined(__AVX512F__)
    /* the same steps sixteen at a time: x to f16 (to nearest even, as the cast), its entry gathered,
       widened exactly, then the cut-offs */
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(gate + i);
        const __m512i bits = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m512i entry = _mm512_i32gather_epi32(bits, (const void *)gelu_table, 2);
        __m512 g = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(entry));
        g = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-10.0f), _CMP_LE_OQ), g, _mm512_setzero_ps());
        g = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(10.0f), _CMP_GE_OQ), g, x);
        _mm512_storeu_ps(y + i, _mm512_mul_ps(g, _mm512_loadu_ps(up + i)));
    }
#endif
#ifdef KILN_AVX2
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(gate + i);
        const __m256i bits = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m256i entry = _mm256_and_si256(_mm256_i32gather_epi32((const int *)gelu_table, bits, 2),
                                               _mm256_set1_epi32(0xFFFF));
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(entry, entry), 0x08);
        __m256 g = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
        g = _mm256_blendv_ps(g, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-10.0f), _CMP_LE_OQ));
        g = _mm256_blendv_ps(g, x, _mm256_cmp_ps(x, _mm256_set1_ps(10.0f), _CMP_GE_OQ));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(g, _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < n; i++) {
        const float x = gate[i];
        const float g = x <= -10.0f ? 0.0f : x >= 10.0f ? x : kiln_fp16_to_fp32(gelu_table[kiln_fp32_to_fp16(x)]);
        y[i] = g * up[i];
    }
}

void kiln_geglu_ref(float *y, const float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) y[i] = gelu_f16_rounded(gate[i]) * up[i];
}

/* ==== threaded twins: each thread takes a contiguous share of the rows (or elements) ========== */

void kiln_rms_norm_mt(const kiln_thread *t, float *y, const float *x, const float *w, float w_offset, float eps,
                      int n, int rows) {
    int r0, r1;
    kiln_share(t, rows, 1, &r0, &r1);
    if (r1 > r0) kiln_rms_norm(y + (size_t)r0 * n, x + (size_t)r0 * n, w, w_offset, eps, n, r1 - r0);
}

void kiln_rope_table_mt(const kiln_thread *t, float *table, size_t ld, const int32_t *pos, int rows,
                        const kiln_rope_table_desc *d, int n, const kiln_rope_scaling *sc, const float *factors) {
    int r0, r1;
    kiln_share(t, rows, 1, &r0, &r1);
    for (int k = 0; k < n && r1 > r0; k++)
        kiln_rope_angles(table + (size_t)r0 * ld + d[k].at, ld, pos + r0, r1 - r0, d[k].n_rot, d[k].base, sc,
                         d[k].factors ? factors : NULL);
}

/* shared by (row, head): a decode step's one row is both threads' */
void kiln_rope_rotate_mt(const kiln_thread *t, float *y, const float *x, const float *cs, size_t ld, int rows,
                         int n_head, int head_dim, int n_rot, int neox) {
    int i0, i1;
    kiln_share(t, rows * n_head, 1, &i0, &i1);
    for (int i = i0; i < i1;) { /* a row's heads from i to the end of the share, or of the row */
        const int r = i / n_head, h = i % n_head, heads = (i1 - i < n_head - h ? i1 - i : n_head - h);
        const size_t at = ((size_t)r * n_head + h) * head_dim;
        kiln_rope_rotate(y + at, x + at, cs ? cs + (size_t)r * ld : NULL, ld, 1, heads, head_dim, n_rot, neox);
        i += heads;
    }
}

void kiln_hadamard_mt(const kiln_thread *t, float *y, const float *x, int n) {
    int b0, b1;
    kiln_share(t, n / KILN_HADAMARD_BLOCK, 1, &b0, &b1);
    if (b1 > b0) kiln_hadamard(y + b0 * KILN_HADAMARD_BLOCK, x + b0 * KILN_HADAMARD_BLOCK, (b1 - b0) * KILN_HADAMARD_BLOCK);
}

#define ELEMENTWISE_MT(name)                                                                   \
    void name##_mt(const kiln_thread *t, float *y, const float *a, const float *b, int n) {     \
        int i0, i1;                                                                            \
        kiln_share(t, n, 16, &i0, &i1);                                                        \
        if (i1 > i0) name(y + i0, a + i0, b + i0, i1 - i0);                                    \
    }
ELEMENTWISE_MT(kiln_add)

#define SCALAR_MT(name)                                                                        \
    void name##_mt(const kiln_thread *t, float *y, const float *x, int n, float s) {           \
        int i0, i1;                                                                            \
        kiln_share(t, n, 16, &i0, &i1);                                                        \
        if (i1 > i0) name(y + i0, x + i0, i1 - i0, s);                                         \
    }
SCALAR_MT(kiln_scale)
SCALAR_MT(kiln_softcap)
ELEMENTWISE_MT(kiln_swiglu)
ELEMENTWISE_MT(kiln_geglu)
ELEMENTWISE_MT(kiln_geglu_erf) /* encoder.c's */

/* y[r][i] = x[r][i] OP w[i], a row of weights against every row: * each column by its weight (ggml_mul
   by a row; Gemma 4's router input), + a row added to every row (BERT's token-type embedding) */
#define ROW_MT(name, OP)                                                                          \
    void name(const kiln_thread *t, float *y, const float *x, int n, int width, const float *w) { \
        int r0, r1;                                                                                \
        kiln_share(t, n, 1, &r0, &r1);                                                             \
        for (int r = r0; r < r1; r++)                                                              \
            for (int i = 0; i < width; i++) y[(size_t)r * width + i] = x[(size_t)r * width + i] OP w[i]; \
    }
ROW_MT(kiln_scale_row_mt, *)
ROW_MT(kiln_add_row_mt, +)

/* y[r] = layer l's part of row r of x [n][n_layer][width] (Gemma 4's per-layer embeddings) */
void kiln_layer_slice_mt(const kiln_thread *t, float *y, const float *x, int n, int width, int n_layer, int l) {
    int r0, r1;
    kiln_share(t, n, 1, &r0, &r1);
    for (int r = r0; r < r1; r++)
        memcpy(y + (size_t)r * width, x + ((size_t)r * n_layer + l) * width, (size_t)width * sizeof(float));
}

void kiln_select_rows_mt(const kiln_thread *t, float *y, const float *x, const int32_t *rows, int n, int n_embd) {
    int r0, r1;
    kiln_share(t, n, 1, &r0, &r1);
    for (int r = r0; r < r1; r++) memcpy(y + (size_t)r * n_embd, x + (size_t)rows[r] * n_embd, (size_t)n_embd * sizeof(float));
}
