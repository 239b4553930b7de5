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

#endif
