/* kv_quant.c: the row quantizers of the KV cache types (q4_0, q4_1, q5_0, and f16), entered
 * through the type table (types.c). Q8_0 rows are written by the activation quantizer. */
#include <math.h>
#include <string.h>

#include "fp16.h"
#include "quant_impl.h"

/* ggml's reference rounding, so that kiln's and llama.cpp's caches hold the same bits: x / d is
 * rounded to float before the offset is added (the runtime is built with -ffp-contract=off, so
 * no multiply-add is fused and moves a value across a rounding boundary). */

/* the element of largest magnitude, with its sign (q4_0 and q5_0 scale by it) */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
    return max;
}

/* q4_0: d = max / -8, q = min(15, trunc(x / d + 8.5)) */
void kiln_ref_quantize_q4_0(const float *x, void *dst, int n) {
    block_q4_0 *y = dst;
    for (int b = 0; b < n / QK4_0; b++, x += QK4_0) {
        const float d = signed_absmax(x, QK4_0) / -8.0f, id = d ? 1.0f / d : 0.0f;
        y[b].d = kiln_fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const float x0 = x[j] * id, x1 = x[j + QK4_0 / 2] * id;
            const int lo = (int8_t)(x0 + 8.5f), hi = (int8_t)(x1 + 8.5f);
            y[b].qs[j] = (uint8_t)((lo < 15 ? lo : 15) | (hi < 15 ? hi : 15) << 4);
        }
    }
}

/* q4_1: d = (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5)) */
void kiln_ref_quantize_q4_1(const float *x, void *dst, int n) {
    block_q4_1 *y = dst;
    for (int b = 0; b < n / QK4_1; b++, x += QK4_1) {
        float min = INFINITY, max = -INFINITY;
        for (int j = 0; j < QK4_1; j++) min = fminf(min, x[j]), max = fmaxf(max, x[j]);
        const float d = (max - min) / 15.0f, id = d ? 1.0f / d : 0.0f;
        y[b].d = kiln_fp32_to_fp16(d), y[b].m = kiln_fp32_to_fp16(min);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const float x0 = (x[j] - min) * id, x1 = (x[j + QK4_1 / 2] - min) * id;
            const int lo = (int8_t)(x0 + 0.5f), hi = (int8_t)(x1 + 0.5f);
            y[b].qs[j] = (uint8_t)((lo < 15 ? lo : 15) | (hi < 15 ? hi : 15) << 4);
        }
    }
}

/* q5_0: d = max / -16, q = min(31, trunc(x / d + 16.5)), the fifth bits in qh */
void kiln_ref_quantize_q5_0(const float *x, void *dst, int n) {
    block_q5_0 *y = dst;
    for (int b = 0; b < n / QK5_0; b++, x += QK5_0) {
        const float d = signed_absmax(x, QK5_0) / -16.0f, id = d ? 1.0f / d : 0.0f;
        y[b].d = kiln_fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const float x0 = x[j] * id, x1 = x[j + QK5_0 / 2] * id;
            int lo = (int8_t)(x0 + 16.5f), hi = (int8_t)(x1 + 16.5f);
            lo = lo < 31 ? lo : 31, hi = hi < 31 ? hi : 31;
            y[b].qs[j] = (uint8_t)((lo & 0x0F) | (hi & 0x0F) << 4);
            qh |= (uint32_t)(lo >> 4) << j | (uint32_t)(hi >> 4) << (j + QK5_0 / 2);
        }
        memcpy(y[b].qh, &qh, sizeof qh);
    }
}

void kiln_ref_quantize_f16(const float *x, void *dst, int n) {
    kiln_half *d = dst;
    for (int i = 0; i < n; i++) d[i] = kiln_fp32_to_fp16(x[i]);
}

