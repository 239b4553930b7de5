/* quant_avx2.c: AVX2 twins of the hot dot kernels in quant.c and kquants.c.
 *
 * Each computes exactly the integer block sums its scalar twin computes; only the order
 * of the float accumulation across blocks differs. quant.c's type table points at these
 * when the compiler targets AVX2 (-march=native on such a host), else at the scalar ones.
 */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <string.h>

#include "fp16.h"
#include "quant_impl.h"
#include "simd_f32.h"

/* 8 int32 = sums of adjacent products of unsigned bytes u and signed bytes s (|products| < 2^15) */
static inline __m256i dot_u8_s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* the same for two signed byte vectors: move x's sign onto y */
static inline __m256i dot_s8_s8(__m256i x, __m256i y) {
    return dot_u8_s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

static inline int hsum8_i32(__m256i v) {
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(x);
}

/* 16 bytes of packed nibbles -> 32 bytes: low nibbles in lanes 0..15, high nibbles in 16..31 */
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* bit j of a 32-bit mask -> 0x10 in byte j, else 0 */
static inline __m256i fifth_bits(const uint8_t qh[4]) {
    uint32_t bits;
    memcpy(&bits, qh, sizeof bits);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

float kiln_dot_q8_0_avx2(int n, const void *w, const void *act) {
    const block_q8_0 *x = w, *y = act;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / QK8_0; b++) {
        const __m256i xs = _mm256_loadu_si256((const __m256i *)x[b].qs);
        const __m256i ys = _mm256_loadu_si256((const __m256i *)y[b].qs);
        const __m256 d = _mm256_set1_ps(kiln_fp16_to_fp32(x[b].d) * kiln_fp16_to_fp32(y[b].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_s8_s8(xs, ys)), acc);
    }
    return kiln_hsum8(acc);
}

float kiln_dot_q4_0_avx2(int n, const void *w, const void *act) {
    const block_q4_0 *x = w;
    const block_q8_0 *y = act;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / QK4_0; b++) {
        const __m256i xs = _mm256_sub_epi8(unpack_nibbles(x[b].qs), _mm256_set1_epi8(8));
        const __m256i ys = _mm256_loadu_si256((const __m256i *)y[b].qs);
        const __m256 d = _mm256_set1_ps(kiln_fp16_to_fp32(x[b].d) * kiln_fp16_to_fp32(y[b].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_s8_s8(xs, ys)), acc);
    }
    return kiln_hsum8(acc);
}

float kiln_dot_q4_1_avx2(int n, const void *w, const void *act) {
    const block_q4_1 *x = w;
    const block_q8_1 *y = act;
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int b = 0; b < n / QK4_1; b++) {
        const __m256i ys = _mm256_loadu_si256((const __m256i *)y[b].qs);
        const __m256 d = _mm256_set1_ps(kiln_fp16_to_fp32(x[b].d) * kiln_fp16_to_fp32(y[b].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8_s8(unpack_nibbles(x[b].qs), ys)), acc);
        mins += kiln_fp16_to_fp32(x[b].m) * kiln_fp16_to_fp32(y[b].s);
    }
    return kiln_hsum8(acc) + mins;
}

float kiln_dot_q5_0_avx2(int n, const void *w, const void *act) {
    const block_q5_0 *x = w;
    const block_q8_0 *y = act;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / QK5_0; b++) {
        const __m256i q = _mm256_or_si256(unpack_nibbles(x[b].qs), fifth_bits(x[b].qh));
        const __m256i xs = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
        const __m256i ys = _mm256_loadu_si256((const __m256i *)y[b].qs);
        const __m256 d = _mm256_set1_ps(kiln_fp16_to_fp32(x[b].d) * kiln_fp16_to_fp32(y[b].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_s8_s8(xs, ys)), acc);
    }
    return kiln_hsum8(acc);
}

float kiln_dot_q4_K_avx2(int n, const void *w, const void *act) {
    const block_q4_K *x = w;
    const block_q8_K *y = act;
    float sum = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        int sc[8], m[8], summ = 0;
        kiln_k4_scales(x[b].scales, sc, m);
        for (int j = 0; j < 8; j++) summ += m[j] * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) { /* 32 bytes of qs: sub-block 2j in the low nibbles, 2j+1 in the high */
            const __m256i packed = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * j));
            const __m256i lo = _mm256_and_si256(packed, _mm256_set1_epi8(0x0F));
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), _mm256_set1_epi8(0x0F));
            const __m256i y0 = _mm256_loadu_si256((const __m256i *)(y[b].qs + 64 * j));
            const __m256i y1 = _mm256_loadu_si256((const __m256i *)(y[b].qs + 64 * j + 32));
            sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(dot_u8_s8(lo, y0), _mm256_set1_epi32(sc[2 * j])));
            sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(dot_u8_s8(hi, y1), _mm256_set1_epi32(sc[2 * j + 1])));
        }
        sum += kiln_fp16_to_fp32(x[b].d) * y[b].d * (float)hsum8_i32(sumi)
             - kiln_fp16_to_fp32(x[b].dmin) * y[b].d * (float)summ;
    }
    return sum;
}

float kiln_dot_q6_K_avx2(int n, const void *w, const void *act) {
    const block_q6_K *x = w;
    const block_q8_K *y = act;
    float sum = 0.0f;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
    for (int b = 0; b < n / QK_K; b++) {
        __m256i sumi = _mm256_setzero_si256();
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = x[b].ql + 64 * half, *qh = x[b].qh + 32 * half;
            const int8_t *sc = x[b].scales + 8 * half, *ys = y[b].qs + 128 * half;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4)),
            };
            for (int k = 0; k < 4; k++) { /* 32 weights = two sub-blocks of 16 with their own scales */
                const __m256i yk = _mm256_loadu_si256((const __m256i *)(ys + 32 * k));
                const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(_mm256_sub_epi8(q[k], off),
                                                                            _mm256_sub_epi8(q[k], off)),
                                                           _mm256_sign_epi8(yk, _mm256_sub_epi8(q[k], off)));
                const __m256i scales = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, scales));
            }
        }
        sum += kiln_fp16_to_fp32(x[b].d) * y[b].d * (float)hsum8_i32(sumi);
    }
    return sum;
}

/* ==== activation quantizers: the scalar ones' exact bits ========================================= */

/* roundf(v) for 8 floats: half-way cases away from zero (the rounding modes of the ISA are
 * half-to-even), as the scalar quantizers do */
static inline __m256i round_away(__m256 v) {
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
    const __m256 frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(v, t)); /* exact: |v| < 2^23 */
    const __m256 step = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ),
                                      _mm256_or_ps(sign, _mm256_set1_ps(1.0f)));
    return _mm256_cvttps_epi32(_mm256_add_ps(t, step));
}

/* one block of 32: q = round(x / d) as bytes with d = max|x| / 127 (returned); *sum = sum(q) */
static inline float quantize_block(const float *x, int8_t *qs, int *sum) {
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f, id = d ? 1.0f / d : 0.0f;
    __m256i q[4];
    for (int k = 0; k < 4; k++) q[k] = round_away(_mm256_mul_ps(v[k], _mm256_set1_ps(id)));
    /* pack 4 x 8 int32 -> 32 int8; the packs interleave 128-bit lanes, the permute undoes it */
    const __m256i q16 = _mm256_packs_epi32(q[0], q[1]), q16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16, q16b),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)qs, q8);
    *sum = hsum8_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    return d;
}

void kiln_quantize_q8_0_avx2(const float *x, void *dst, int n) {
    block_q8_0 *y = dst;
    int sum;
    for (int b = 0; b < n / QK8_0; b++) y[b].d = kiln_fp32_to_fp16(quantize_block(x + b * QK8_0, y[b].qs, &sum));
}

void kiln_quantize_q8_1_avx2(const float *x, void *dst, int n) {
    block_q8_1 *y = dst;
    for (int b = 0; b < n / QK8_1; b++) {
        int sum;
        const float d = quantize_block(x + b * QK8_1, y[b].qs, &sum);
        y[b].d = kiln_fp32_to_fp16(d);
        y[b].s = kiln_fp32_to_fp16(d * (float)sum);
    }
}
/* ==== dequantizers of the KV cache types: the scalar ones' exact values ========================= */

void kiln_dequant_f16_avx2(const void *src, float *dst, int n) {
    const kiln_half *s = src;
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) dst[i] = kiln_fp16_to_fp32(s[i]);
}

void kiln_dequant_q8_0_avx2(const void *src, float *dst, int n) {
    const block_q8_0 *x = src;
    for (int b = 0; b < n / QK8_0; b++, dst += QK8_0) {
        const __m256 d = _mm256_set1_ps(kiln_fp16_to_fp32(x[b].d));
        for (int k = 0; k < QK8_0; k += 8) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(x[b].qs + k)));
            _mm256_storeu_ps(dst + k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
        }
    }
}
#endif
