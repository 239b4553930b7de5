/* quants.h: GGUF quant block layouts, byte-for-byte as ggml stores them.
 *
 * Each block holds a fixed number of weights (32, or QK_K = 256 for K-quants) with its
 * scales. The static asserts pin every size to the GGUF format; tests also compare them
 * with gguf-py's GGML_QUANT_SIZES.
 */
#ifndef KILN_QUANTS_H
#define KILN_QUANTS_H

#include <stdint.h>

typedef uint16_t kiln_half; /* IEEE fp16 bits */
typedef uint16_t kiln_bf16; /* bfloat16 bits */

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

/* w = d * (q - 8), q in 0..15; low nibbles are weights 0..15, high nibbles 16..31 */
typedef struct { kiln_half d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
/* w = d * q + m */
typedef struct { kiln_half d; kiln_half m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
/* w = d * (q - 16), q = nibble | (bit of qh) << 4 */
typedef struct { kiln_half d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
/* w = d * q + m, 5-bit q */
typedef struct { kiln_half d; kiln_half m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
/* w = d * q, q in -127..127 */
typedef struct { kiln_half d; int8_t qs[QK8_0]; } block_q8_0;
/* activations for q4_1/q5_1 dots: s = d * sum(q) folds the weights' min into one product */
typedef struct { kiln_half d; kiln_half s; int8_t qs[QK8_1]; } block_q8_1;

/* 8 sub-blocks of 32: w = d * sc * q - dmin * m, 6-bit sc/m packed in scales */
typedef struct { kiln_half d; kiln_half dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
/* as q4_K with a fifth bit per weight in qh */
typedef struct { kiln_half d; kiln_half dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
/* 16 sub-blocks of 16: w = d * scale * (q - 32), 6-bit q split into ql (4 bits) and qh (2 bits) */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; kiln_half d; } block_q6_K;
/* 16 sub-blocks of 16: w = d * (sc & 15) * q - dmin * (sc >> 4), q 2 bits in 0..3 */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; kiln_half d; kiln_half dmin; } block_q2_K;
/* 16 sub-blocks of 16: w = d * (sc - 32) * (q - 4 * !hbit), q 2 bits, sc 6 bits packed in 12 bytes */
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; kiln_half d; } block_q3_K;

/* the i-quants (their tables are in iq_tables.h) */
/* 32 weights: w = d * kvalues_iq4nl[nibble], low nibbles first */
typedef struct { kiln_half d; uint8_t qs[QK4_0 / 2]; } block_iq4_nl;
/* 8 sub-blocks of 32 as IQ4_NL's, each with a 6-bit scale ls (low 4 in scales_l, high 2 in scales_h):
   w = d * (ls - 32) * kvalues_iq4nl[nibble] */
typedef struct { kiln_half d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;
/* 8 sub-blocks of 32, each two uint32: four 8-bit grid indexes, then four 7-bit sign indexes and a
   4-bit scale ls: w = d * (0.5 + ls) / 4 * grid * sign */
typedef struct { kiln_half d; uint16_t qs[QK_K / 8]; } block_iq2_xxs;
/* 32 groups of 8: a 9-bit grid index and 7 sign bits each; 4-bit scales for each 16 weights */
typedef struct { kiln_half d; uint16_t qs[QK_K / 8]; uint8_t scales[QK_K / 32]; } block_iq2_xs;
/* 32 groups of 8: a 10-bit grid index (8 bits in qs, 2 in qh), 8 explicit sign bits each */
typedef struct { kiln_half d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t scales[QK_K / 32]; } block_iq2_s;
/* 64 groups of 4 by 8-bit grid index; per 32 weights a uint32 of four 7-bit sign indexes and a scale */
typedef struct { kiln_half d; uint8_t qs[3 * QK_K / 8]; } block_iq3_xxs;
/* 64 groups of 4 by 9-bit grid index (qs, and a bit of qh), explicit signs, 4-bit scales per 32:
   w = d * (1 + 2 * ls) * grid * sign */
typedef struct { kiln_half d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t signs[QK_K / 8];
                 uint8_t scales[QK_K / 64]; } block_iq3_s;
/* 32 groups of 8 by 11-bit grid index (values -1, 0, 1); per 32 weights a 3-bit scale and the
   sign of a delta of 1/8: w = d * (2 * ls + 1) * (grid +- 1/8) */
typedef struct { kiln_half d; uint8_t qs[QK_K / 8]; uint16_t qh[QK_K / 32]; } block_iq1_s;
/* as IQ1_S, with a 3-bit scale per 16, a delta sign per 8, and d (f16) spread over the scales' top nibbles */
typedef struct { uint8_t qs[QK_K / 8]; uint8_t qh[QK_K / 16]; uint8_t scales[QK_K / 32]; } block_iq1_m;

/* ternary: w = d * (t - 1), t in 0..2: TQ1_0 packs five in a byte (base 3, scaled to 0..242 by
   256/243), four more in each qh byte; TQ2_0 four in a byte, 2 bits each */
typedef struct { uint8_t qs[(QK_K - 4 * QK_K / 64) / 5]; uint8_t qh[QK_K / 64]; kiln_half d; } block_tq1_0;
typedef struct { uint8_t qs[QK_K / 4]; kiln_half d; } block_tq2_0;

/* MXFP4: 32 weights with an E8M0 scale: w = 2^(e - 128) * kvalues_mxfp4[nibble] */
#define QK_MXFP4 32
typedef struct { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; } block_mxfp4;

/* activations for K-quant dots: bsums[i] = sum of qs[16i .. 16i+15] */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 must match GGUF");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 must match GGUF");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 must match GGUF");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 must match GGUF");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 must match GGUF");
_Static_assert(sizeof(block_q8_1) == 36, "block_q8_1 must match ggml");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K must match GGUF");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K must match GGUF");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K must match GGUF");
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K must match ggml");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K must match GGUF");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K must match GGUF");
_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl must match GGUF");
_Static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs must match GGUF");
_Static_assert(sizeof(block_iq2_xxs) == 66, "block_iq2_xxs must match GGUF");
_Static_assert(sizeof(block_iq2_xs) == 74, "block_iq2_xs must match GGUF");
_Static_assert(sizeof(block_iq2_s) == 82, "block_iq2_s must match GGUF");
_Static_assert(sizeof(block_iq3_xxs) == 98, "block_iq3_xxs must match GGUF");
_Static_assert(sizeof(block_iq3_s) == 110, "block_iq3_s must match GGUF");
_Static_assert(sizeof(block_iq1_s) == 50, "block_iq1_s must match GGUF");
_Static_assert(sizeof(block_iq1_m) == 56, "block_iq1_m must match GGUF");
_Static_assert(sizeof(block_tq1_0) == 54, "block_tq1_0 must match GGUF");
_Static_assert(sizeof(block_tq2_0) == 66, "block_tq2_0 must match GGUF");
_Static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 must match GGUF");

#endif
