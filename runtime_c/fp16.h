/* fp16.h: IEEE half and bfloat16 conversions (round to nearest even). */
#ifndef KILN_FP16_H
#define KILN_FP16_H

#include <stdint.h>
#include <string.h>

#include "quants.h"

#if defined(__x86_64__) && !defined(__F16C__)
/* An x86 without F16C (the x86-64 and -v2 targets): GCC would widen each _Float16 through a libgcc
 * call, a tenth of the scalar build's time in a model's dots. The widening is exact, so fields put
 * into place give the same float: a normal number rebiases its exponent (15 -> 127), a subnormal
 * is its 10-bit mantissa times 2^-24 (exact in a float), and a NaN comes back quiet, as F16C's
 * vcvtph2ps returns it. */
static inline float kiln_fp16_to_fp32(kiln_half bits) {
    const uint32_t sign = (uint32_t)(bits & 0x8000) << 16, exp = (bits >> 10) & 0x1F, man = bits & 0x3FF;
    uint32_t u;
    if (exp == 0x1F)
        u = sign | 0x7F800000u | (man << 13) | (man ? 0x00400000u : 0);
    else if (exp)
        u = sign | ((exp + 112) << 23) | (man << 13);
    else {
        const float sub = (float)man * 0x1p-24f;
        memcpy(&u, &sub, sizeof u);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#else
/* _Float16 lets the compiler pick F16C/NEON instructions when the target has them. */
static inline float kiln_fp16_to_fp32(kiln_half bits) {
    _Float16 h;
    memcpy(&h, &bits, sizeof h);
    return (float)h;
}
#endif

static inline kiln_half kiln_fp32_to_fp16(float f) {
    _Float16 h = (_Float16)f;
    kiln_half bits;
    memcpy(&bits, &h, sizeof bits);
    return bits;
}

static inline float kiln_bf16_to_fp32(kiln_bf16 bits) {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
