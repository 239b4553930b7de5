/* isa.h: which kernel paths a build has, from the instruction set its flags select. The one place
 * these conditions are written: the kernels test the KILN_HAVE_* macros, and kiln reads them
 * (build/targets.py kernel_set, by preprocessing this header with a target's flags) to say what a
 * build runs, even for a target it cannot load. A built library says it too (kiln_kernel_paths,
 * isa.c), so that a test can hold the library built for a target to that target. */
#ifndef KILN_ISA_H
#define KILN_ISA_H

/* AVX2 (rows_avx2.c, act_avx2.c): rows of the GGUF layout, 8 weight rows a tile */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KILN_HAVE_AVX2 1
#endif

/* AVX-512 VNNI (x8_vnni.c): matmuls on weights interleaved by eight rows (x8_pack.c) */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define KILN_HAVE_VNNI 1
#endif

/* AVX-512 in attention (attn_span.h, which tests __AVX512F__ itself): 16 keys a vector of scores */
#if defined(__AVX512F__)
#define KILN_HAVE_AVX512 1
#endif

/* AVX2 on the x8 layout (x8_avx2.c), where there is no AVX-512 VNNI: the same packed weights,
   8 rows a 256-bit vector */
#if defined(KILN_HAVE_AVX2) && !defined(KILN_HAVE_VNNI)
#define KILN_HAVE_X8_AVX2 1
#endif

/* some kernel reads the x8 layout: the compiler writes the packed file for this build */
#if defined(KILN_HAVE_VNNI) || defined(KILN_HAVE_X8_AVX2)
#define KILN_HAVE_X8 1
#endif

/* AMX tiles (x8_amx.c) for the x8 matmuls of prefill; Linux hands out the tiles on request */
#if defined(KILN_HAVE_VNNI) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define KILN_HAVE_AMX 1
#endif

/* AVX-512 VBMI (sb_unpack_avx2.h): the i-quants' grid rows of a block looked up by byte permutes
   of the grid's columns or codes, not gathered (IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_S) */
#if defined(__AVX512VBMI__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__BMI2__)
#define KILN_HAVE_VBMI 1
#endif

/* NEON (rows_neon.c, kquant_neon.c, act_neon.c): rows of the GGUF layout, 4 weight rows a tile */
#if defined(__aarch64__) && defined(__ARM_NEON)
#define KILN_HAVE_NEON 1
#endif

/* sdot for the byte products of the NEON kernels (else widening multiplies) */
#if defined(KILN_HAVE_NEON) && defined(__ARM_FEATURE_DOTPROD)
#define KILN_HAVE_DOTPROD 1
#endif

/* smmla: tiles of 2 weight rows x 2 activation rows in batch and prefill steps */
#if defined(KILN_HAVE_NEON) && defined(__ARM_FEATURE_MATMUL_INT8)
#define KILN_HAVE_I8MM 1
#endif

/* The KILN_HAVE_* names of the paths above that this library was compiled with, space-separated
   ("" for the scalar references alone); KILN_HAVE_X8, which only sums two, is left out. */
const char *kiln_kernel_paths(void);

#endif
