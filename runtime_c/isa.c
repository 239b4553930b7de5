/* isa.c: the kernel paths this library holds (isa.h), as its own objects say, compiled with the
 * flags every other file of the runtime was: kiln's other report (build/targets.py kernel_set)
 * preprocesses isa.h with the flags a target should have, which cannot notice a library built
 * with others. */
#include "isa.h"

const char *kiln_kernel_paths(void) {
    return ""
#ifdef KILN_HAVE_AVX2
           " KILN_HAVE_AVX2"
#endif
#ifdef KILN_HAVE_AVX512
           " KILN_HAVE_AVX512"
#endif
#ifdef KILN_HAVE_X8_AVX2
           " KILN_HAVE_X8_AVX2"
#endif
#ifdef KILN_HAVE_VNNI
           " KILN_HAVE_VNNI"
#endif
#ifdef KILN_HAVE_AMX
           " KILN_HAVE_AMX"
#endif
#ifdef KILN_HAVE_VBMI
           " KILN_HAVE_VBMI"
#endif
#ifdef KILN_HAVE_NEON
           " KILN_HAVE_NEON"
#endif
#ifdef KILN_HAVE_DOTPROD
           " KILN_HAVE_DOTPROD"
#endif
#ifdef KILN_HAVE_I8MM
           " KILN_HAVE_I8MM"
#endif
        ;
}
