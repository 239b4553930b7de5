/* sb_unpack.c: the fast unpackers of the super-block types, which the SIMD matmuls call once per
 * block and tile: AVX2's (sb_unpack_avx2.c) or NEON's (sb_unpack_neon.c). Each writes what its
 * reference in ref_sblock.c writes, bit for bit; tests/test_kernels.py and tests/c/kernels_neon.c
 * hold the matmuls that use them to the reference dots on random and extreme blocks. A build with
 * neither runs the scalar dots, which unpack with the references themselves. */
#include "quant_impl.h"
#include "sb_unpack.h"

kiln_unpack_fn kiln_unpack_fast(int type) {
    kiln_unpack_fn f = NULL;
#if defined(KILN_HAVE_AVX2)
    f = kiln_unpack_avx2(type);
#elif defined(KILN_HAVE_NEON)
    f = kiln_unpack_neon(type);
#endif
    return f ? f : kiln_unpack_ref(type);
}
