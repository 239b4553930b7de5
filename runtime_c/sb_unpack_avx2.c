/* sb_unpack_avx2.c: the AVX2 unpackers of sb_unpack_avx2.h, by type, for the callers that take
 * them through a pointer (the prefill's tile builder, the kernel tests). */
#include "sb_unpack.h"
#include "sb_unpack_avx2.h"

#ifdef KILN_HAVE_AVX2
#define SB_WRAP(name, t) static void unpack_##name(const void *block, kiln_sb *u) { sb_unpack_##name(block, u); }
KILN_SB_TYPES(SB_WRAP)
#undef SB_WRAP

kiln_unpack_fn kiln_unpack_avx2(int type) {
#define SB_CASE(name, t) case t: return unpack_##name;
    switch (type) { KILN_SB_TYPES(SB_CASE) default: return NULL; }
#undef SB_CASE
}
#endif
