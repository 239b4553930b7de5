/* ref_quant.c: the scalar references of the float and 32-weight block types: the activation
 * quantizers their dots want, dequantizers, and dots. The type table (types.c) points at these;
 * every SIMD kernel is a twin of one of them and is tested against it, bit for bit.
 *
 * The dot of a weight row with its quantized activations is defined here, and every path (the
 * AVX2 rows, the x8 kernels with VNNI or AMX) computes exactly this: per block b, in order,
 *     acc = fma((float)isum_b, d_b * y.d_b, acc),     isum_b the exact integer sum;
 * for the types with a minimum (Q4_1, Q5_1) also mins = fma(m_b, y.s_b, mins); the dot is
 * acc + mins (mins = 0 for the others). Float rows dot as vec_f32.h's kiln_vdot does.
 */
#include <math.h>
#include <string.h>

#include "fp16.h"
#include "quant_impl.h"
#include "vec_f32.h"

/* ==== activation quantizers ================================================================= */

/* q8_0: d = max|x| / 127, q = round(x / d) */
void kiln_ref_quantize_q8_0(const float *x, void *dst, int n) {
    block_q8_0 *y = dst;
    for (int b = 0; b < n / QK8_0; b++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        y[b].d = kiln_fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++) y[b].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* q8_1: q8_0 plus s = d * sum(q), which lets q4_1/q5_1 fold their per-block minimum into one product */
void kiln_ref_quantize_q8_1(const float *x, void *dst, int n) {
    block_q8_1 *y = dst;
    for (int b = 0; b < n / QK8_1; b++, x += QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            y[b].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[b].qs[j];
        }
        y[b].d = kiln_fp32_to_fp16(d);
        y[b].s = kiln_fp32_to_fp16(d * (float)sum);
    }
}

void kiln_ref_copy_f32(const float *x, void *dst, int n) { memcpy(dst, x, (size_t)n * sizeof(float)); }

/* ==== float weights ========================================================================= */

void kiln_ref_dequant_f32(const void *src, float *dst, int n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

void kiln_ref_dequant_f16(const void *src, float *dst, int n) {
    const kiln_half *s = src;
    for (int i = 0; i < n; i++) dst[i] = kiln_fp16_to_fp32(s[i]);
}

void kiln_ref_dequant_bf16(const void *src, float *dst, int n) {
    const kiln_bf16 *s = src;
    for (int i = 0; i < n; i++) dst[i] = kiln_bf16_to_fp32(s[i]);
}

KILN_DOT16_REF(dot16_f16, kiln_half, kiln_fp16_to_fp32)
KILN_DOT16_REF(dot16_bf16, kiln_bf16, kiln_bf16_to_fp32)

float kiln_ref_dot_f32(int n, const void *w, const void *act) { return kiln_vdot_ref(w, act, n); }
float kiln_ref_dot_f16(int n, const void *w, const void *act) { return dot16_f16(w, act, n); }
float kiln_ref_dot_bf16(int n, const void *w, const void *act) { return dot16_bf16(w, act, n); }

/* ==== 32-weight block weights =============================================================== */

/* A block's 32 weights as integers q = u - offset: w = d * q, or d * q + m. The 4-bit types keep
 * weight j in the low nibble of qs[j % 16] (j < 16) or the high one; the 5-bit types take bit j of
 * qh as the fifth bit; Q8_0 stores q itself, copied as signed bytes (GCC 12
 * vectorizes a dot of (int8_t)-converted uint8_t loads into vpdpbusd, which takes them as unsigned,
 * wherever the target has VNNI). Whole-block passes, which the compiler vectorizes even for plain
 * x86-64, where this is the kernel. */
static inline __attribute__((always_inline)) void block_q(const kiln_b32 *f, const uint8_t *blk, int8_t q[32]) {
    if (f->bits == 8) {
        memcpy(q, blk + f->qs_at, 32);
        return;
    }
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(blk[f->qs_at + j] & 0x0F);
        q[j + 16] = (int8_t)(blk[f->qs_at + j] >> 4);
    }
    /* eight fifth bits at a time: the qh byte copied into every byte of a word, byte i keeping bit
     * i, which adding 0x7F carries into that byte's top bit, shifted down to 0x10 */
    for (int k = 0; f->qh_at && k < 4; k++) {
        const uint64_t spread = (uint64_t)blk[f->qh_at + k] * 0x0101010101010101ull;
        const uint64_t fifth = (((spread & 0x8040201008040201ull) + 0x7F7F7F7F7F7F7F7Full) & 0x8080808080808080ull) >> 3;
        uint64_t word;
        memcpy(&word, q + 8 * k, sizeof word);
        word |= fifth;
        memcpy(q + 8 * k, &word, sizeof word);
    }
    for (int j = 0; j < 32; j++) q[j] = (int8_t)(q[j] - f->offset);
}

static inline float block_d(const uint8_t *blk) {
    kiln_half h;
    memcpy(&h, blk, sizeof h); /* every block type begins with d, the _1 types then m */
    return kiln_fp16_to_fp32(h);
}

static inline float block_m(const uint8_t *blk) { return block_d(blk + sizeof(kiln_half)); }

static inline __attribute__((always_inline)) void dequant_b32(const int type, const void *src, float *dst, int n) {
    kiln_b32 f = {0};
    kiln_b32_of(type, &f);
    const uint8_t *blk = src;
    for (int b = 0; b < n / 32; b++, blk += f.block_bytes, dst += 32) {
        const float d = block_d(blk), m = f.has_min ? block_m(blk) : 0.0f;
        int8_t q[32];
        block_q(&f, blk, q);
        for (int j = 0; j < 32; j++) {
            const float v = d * (float)q[j];
            dst[j] = f.has_min ? v + m : v;
        }
    }
}

/* the definition above, over q8_0 or (types with a minimum) q8_1 activation blocks */
static inline __attribute__((always_inline)) float dot_b32(const int type, int n, const void *w, const void *act) {
    kiln_b32 f = {0};
    kiln_b32_of(type, &f);
    const uint8_t *blk = w, *a = act;
    const size_t a_bytes = f.has_min ? sizeof(block_q8_1) : sizeof(block_q8_0), q_at = f.has_min ? 4 : 2;
    float acc = 0.0f, mins = 0.0f;
    for (int b = 0; b < n / 32; b++, blk += f.block_bytes, a += a_bytes) {
        const int8_t *y = (const int8_t *)(a + q_at);
        int8_t q[32];
        block_q(&f, blk, q);
        int isum = 0; /* an integer sum: its order cannot change it */
        for (int j = 0; j < 32; j++) isum += q[j] * y[j];
        acc = fmaf((float)isum, block_d(blk) * block_d(a), acc);
        if (f.has_min) mins = fmaf(block_m(blk), block_m(a), mins);
    }
    return acc + mins;
}

#define B32_FOR(name, type)                                                                                   \
    void kiln_ref_dequant_##name(const void *src, float *dst, int n) { dequant_b32(type, src, dst, n); }      \
    float kiln_ref_dot_##name(int n, const void *w, const void *act) { return dot_b32(type, n, w, act); }
B32_FOR(q4_0, KILN_Q4_0)
B32_FOR(q4_1, KILN_Q4_1)
B32_FOR(q5_0, KILN_Q5_0)
B32_FOR(q5_1, KILN_Q5_1)
B32_FOR(q8_0, KILN_Q8_0)
