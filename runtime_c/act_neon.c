/* act_neon.c: NEON twins of the activation quantizers (q8_0, q8_1: ref_quant.c; q8_K: ref_kquant.c)
 * and of the dequantizers of the f16 and q8_0 KV caches: the scalar references' exact bytes and
 * values. NEON has the roundings the references name: roundf's (ties away from zero, fcvtas) and
 * lrintf's (ties to even, fcvtns); fmaxf's treatment of NaN is fmaxnm's. */
#include <string.h>

#include "neon.h"
#include "quant_impl.h"

#ifdef KILN_HAVE_NEON

/* 8 vectors of int32 (each in -127..127) -> 32 bytes */
static inline void narrow32(const int32x4_t q[8], int8_t *qs) {
    for (int h = 0; h < 2; h++) {
        const int16x8_t a = vcombine_s16(vmovn_s32(q[4 * h]), vmovn_s32(q[4 * h + 1]));
        const int16x8_t b = vcombine_s16(vmovn_s32(q[4 * h + 2]), vmovn_s32(q[4 * h + 3]));
        vst1q_s8(qs + 16 * h, vcombine_s8(vmovn_s16(a), vmovn_s16(b)));
    }
}

/* one block of 32: q = roundf(x / d) as bytes with d = max|x| / 127 (returned); *sum = sum(q) */
static inline float quantize_block(const float *x, int8_t *qs, int *sum) {
    float32x4_t v[8], amax = vdupq_n_f32(0.0f);
    for (int k = 0; k < 8; k++) {
        v[k] = vld1q_f32(x + 4 * k);
        amax = vmaxnmq_f32(amax, vabsq_f32(v[k]));
    }
    const float d = vmaxnmvq_f32(amax) / 127.0f, id = d ? 1.0f / d : 0.0f;
    int32x4_t q[8], s = vdupq_n_s32(0);
    for (int k = 0; k < 8; k++) {
        q[k] = vcvtaq_s32_f32(vmulq_f32(v[k], vdupq_n_f32(id)));
        s = vaddq_s32(s, q[k]);
    }
    narrow32(q, qs);
    *sum = vaddvq_s32(s);
    return d;
}

void kiln_quantize_q8_0_neon(const float *x, void *dst, int n) {
    block_q8_0 *y = dst;
    int sum;
    for (int b = 0; b < n / QK8_0; b++) y[b].d = kiln_fp32_to_fp16(quantize_block(x + b * QK8_0, y[b].qs, &sum));
}

void kiln_quantize_q8_1_neon(const float *x, void *dst, int n) {
    block_q8_1 *y = dst;
    for (int b = 0; b < n / QK8_1; b++) {
        int sum;
        const float d = quantize_block(x + b * QK8_1, y[b].qs, &sum);
        y[b].d = kiln_fp32_to_fp16(d);
        y[b].s = kiln_fp32_to_fp16(d * (float)sum);
    }
}

/* q8_K: d = max|x| / 127 with the sign of the first value that reaches it, q = lrintf(x / d)
 * (at most 127), bsums the sums of each 16 q */
void kiln_quantize_q8_K_neon(const float *x, void *dst, int n) {
    block_q8_K *y = dst;
    for (int b = 0; b < n / QK_K; b++, x += QK_K) {
        float32x4_t m4 = vdupq_n_f32(0.0f);
        for (int j = 0; j < QK_K; j += 4) m4 = vmaxnmq_f32(m4, vabsq_f32(vld1q_f32(x + j)));
        const float amax = vmaxnmvq_f32(m4);
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = kiln_q8_K_iscale(x, amax);
        const float32x4_t vs = vdupq_n_f32(iscale);
        for (int j = 0; j < QK_K; j += 32) {
            int32x4_t q[8];
            for (int k = 0; k < 8; k++)
                q[k] = vminq_s32(vcvtnq_s32_f32(vmulq_f32(vs, vld1q_f32(x + j + 4 * k))), vdupq_n_s32(127));
            for (int k = 0; k < 8; k += 4)
                y[b].bsums[(j + 4 * k) / 16] = (int16_t)vaddvq_s32(vaddq_s32(vaddq_s32(q[k], q[k + 1]),
                                                                             vaddq_s32(q[k + 2], q[k + 3])));
            narrow32(q, y[b].qs + j);
        }
        y[b].d = 1.0f / iscale;
    }
}

/* ==== dequantizers of the KV cache types: the scalar ones' exact values ========================= */

void kiln_dequant_f16_neon(const void *src, float *dst, int n) {
    const kiln_half *s = src;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(s + i));
        vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
    }
    for (; i < n; i++) dst[i] = kiln_fp16_to_fp32(s[i]);
}

/* f32 -> f16 rows (the KV cache's), rounded to nearest even as the reference's conversion */
void kiln_quantize_f16_neon(const float *x, void *dst, int n) {
    kiln_half *h = dst;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        vst1q_u16(h + i, vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(vld1q_f32(x + i)), vld1q_f32(x + i + 4))));
    for (; i < n; i++) h[i] = kiln_fp32_to_fp16(x[i]);
}

void kiln_dequant_q8_0_neon(const void *src, float *dst, int n) {
    const block_q8_0 *x = src;
    for (int b = 0; b < n / QK8_0; b++, dst += QK8_0) {
        const float32x4_t d = vdupq_n_f32(kiln_fp16_to_fp32(x[b].d));
        for (int k = 0; k < QK8_0; k += 16) {
            const int8x16_t q = vld1q_s8(x[b].qs + k);
            const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
            const int32x4_t v[4] = {vmovl_s16(vget_low_s16(lo)), vmovl_high_s16(lo), vmovl_s16(vget_low_s16(hi)),
                                    vmovl_high_s16(hi)};
            for (int i = 0; i < 4; i++) vst1q_f32(dst + k + 4 * i, vmulq_f32(d, vcvtq_f32_s32(v[i])));
        }
    }
}
#endif
