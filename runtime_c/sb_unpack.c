/* sb_unpack.c: the fast unpackers of the super-block types, which the SIMD matmuls call once per
 * block and tile. Each writes what its reference in ref_sblock.c writes, bit for bit
 * (tests/test_quant_types.py holds every pair on random and extreme blocks); where no fast one
 * is written, the reference serves. */
#include "quant_impl.h"

kiln_unpack_fn kiln_unpack_fast(int type) { return kiln_unpack_ref(type); }
