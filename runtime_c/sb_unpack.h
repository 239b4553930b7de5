/* sb_unpack.h: the fast unpackers each instruction set has (sb_unpack_avx2.c, sb_unpack_neon.c),
 * which sb_unpack.c's kiln_unpack_fast chooses from: NULL for a type one does not have. */
#ifndef KILN_SB_UNPACK_H
#define KILN_SB_UNPACK_H

#include "quant_impl.h"

#ifdef KILN_HAVE_AVX2
kiln_unpack_fn kiln_unpack_avx2(int type);
#endif
#ifdef KILN_HAVE_NEON
kiln_unpack_fn kiln_unpack_neon(int type);
#endif

#endif
