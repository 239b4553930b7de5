/* constants.h: the runtime's numbers the compiler plans with. compiler/core/cconst.py reads them
 * through cffi's C parser, so each is written once, here. */
#ifndef KILN_CONSTANTS_H
#define KILN_CONSTANTS_H

enum kiln_constants {
    KILN_MAX_HEAD_DIM = 512,      /* attention's and rope's per-head stack buffers */
    KILN_HADAMARD_BLOCK = 64,     /* a quantized K or V is held in Hadamard blocks of this many values */
    KILN_ATTN_SPAN = 64,          /* attention cuts every history at multiples of this many positions */
    KILN_ATTN_SPAN_STATE = 2,     /* a span's softmax state: its max and denominator, then head_dim sums */
    KILN_K_TRANSPOSED_TYPES = 3,  /* bit t set: a K cache of kiln_type t (f32 0, f16 1) is held transposed (kv_view.h) */
    KILN_LOCAL_ACT_BYTES = 20480, /* a decode matmul quantizes its one row on the stack: n_in up to 16384 */
    KILN_X8_MAX_IN = 32768,       /* the longest row the x8 layout's kernels take */
    KILN_X8_TILE = 8,             /* activation rows an AVX-512 x8 kernel takes at once, whose scales a matmul's */
    KILN_X8_TILE_SCALES = 3,      /* quantizer lays out for it: each block's d, d * sum (q8_1), sum */
    KILN_MOE_MAX_EXPERTS = 512,   /* experts a layer may have: the router's per-row stack arrays */
    KILN_MAX_STATE_DIM = 256,     /* a DeltaNet head's width (ssm.state_size): its per-head stack buffers */
    KILN_MAX_CONV_TAPS = 8,       /* a DeltaNet conv's taps (ssm.conv_kernel) */
    KILN_PACKED_HEADER_BYTES = 64 /* the packed weights file's header (x8_pack.c writes and checks it) */
};

#endif
