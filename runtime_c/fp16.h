/* fp16.h: IEEE half and bfloat16 conversions (round to nearest even). */
#ifndef KILN_FP16_H
#define KILN_FP16_H

#include <stdint.h>
#include <string.h>

#include "quants.h"

/* _Float16 lets the compiler pick F16C/NEON instructions when the target has them. */
static inline float kiln_fp16_to_fp32(kiln_half bits) {
    _Float16 h;
    memcpy(&h, &bits, sizeof h);
    return (float)h;
}

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
