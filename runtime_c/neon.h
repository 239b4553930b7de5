/* neon.h: what the NEON kernels (rows_neon.c, kquant_neon.c, act_neon.c) share: products of signed
 * bytes in the spelling the target has (sdot with dotprod, smmla with i8mm, else widening
 * multiplies), and the moves of lanes around them.
 *
 * Every integer sum here is exact, so how a spelling groups its lanes never changes a value: what
 * a kernel does after them, in floats, is the scalar reference's arithmetic lane by lane.
 */
#ifndef KILN_NEON_H
#define KILN_NEON_H

#include "isa.h"

#ifdef KILN_HAVE_NEON
#include <arm_neon.h>
#include <string.h>

#include "fp16.h"

#define KILN_NEON_INLINE static inline __attribute__((always_inline))

/* acc plus 4 int32 whose sum is a . b over 16 signed bytes. Without sdot: byte products into
 * int16 (|a b| <= 2^14), then pairs of them into acc's int32 lanes. */
KILN_NEON_INLINE int32x4_t kiln_dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#ifdef KILN_HAVE_DOTPROD
    return vdotq_s32(acc, a, b);
#else
    return vpadalq_s16(vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b))), vmull_high_s8(a, b));
#endif
}

/* lane r = the sum of the lanes of the r-th argument */
KILN_NEON_INLINE int32x4_t kiln_reduce4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
    return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
}

#ifdef KILN_HAVE_I8MM
/* acc + [a0.b0, a0.b1, a1.b0, a1.b1], each a dot over 16 signed bytes: two rows of a (weights)
 * against two rows of b (activations), smmla taking 8 bytes of each row at a time */
KILN_NEON_INLINE int32x4_t kiln_mmla16(int32x4_t acc, int8x16_t a0, int8x16_t a1, int8x16_t b0, int8x16_t b1) {
    const int64x2_t x0 = vreinterpretq_s64_s8(a0), x1 = vreinterpretq_s64_s8(a1);
    const int64x2_t y0 = vreinterpretq_s64_s8(b0), y1 = vreinterpretq_s64_s8(b1);
    acc = vmmlaq_s32(acc, vreinterpretq_s8_s64(vzip1q_s64(x0, x1)), vreinterpretq_s8_s64(vzip1q_s64(y0, y1)));
    return vmmlaq_s32(acc, vreinterpretq_s8_s64(vzip2q_s64(x0, x1)), vreinterpretq_s8_s64(vzip2q_s64(y0, y1)));
}
#endif

KILN_NEON_INLINE float kiln_half_at(const uint8_t *p) {
    kiln_half h;
    memcpy(&h, p, sizeof h);
    return kiln_fp16_to_fp32(h);
}

/* the f16 at byte `at` of each of 4 rows, as 4 floats (the conversion is exact) */
KILN_NEON_INLINE float32x4_t kiln_halves4(const uint8_t *const x[4], size_t at) {
    uint16_t h[4];
    for (int r = 0; r < 4; r++) memcpy(&h[r], x[r] + at, sizeof h[r]);
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* y[r] = v[r] for r < nw */
KILN_NEON_INLINE void kiln_store_rows(float32x4_t v, int nw, float *y) {
    float t[4];
    vst1q_f32(t, v);
    memcpy(y, t, (size_t)nw * sizeof(float));
}
#endif

#endif
