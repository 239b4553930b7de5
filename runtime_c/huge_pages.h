/* huge_pages.h: memory in 2 MB pages where the kernel gives them (transparent huge pages, asked
 * for with madvise; where THP is off, or set to "never", 4 KB pages as before).
 *
 * What kiln streams through every step lives in them: the packed weights a decode step reads
 * once each (instance.c), and the KV pool, whose spans attention reads a page apart (kv_pool.c).
 * In 4 KB pages each page touched costs a page walk, two-dimensional under a hypervisor, and the
 * hardware's stream prefetch stops at every page's end. */
#ifndef KILN_HUGE_PAGES_H
#define KILN_HUGE_PAGES_H

#include <stdlib.h>
#include <sys/mman.h>

#define KILN_HUGE_PAGE ((size_t)2 << 20)

/* [bytes] rounded up to whole huge pages, 2 MB aligned, for free(); NULL when out of memory */
static inline void *kiln_huge_pages(size_t bytes) {
    const size_t size = (bytes + KILN_HUGE_PAGE - 1) / KILN_HUGE_PAGE * KILN_HUGE_PAGE;
    void *p = aligned_alloc(KILN_HUGE_PAGE, size ? size : KILN_HUGE_PAGE);
#ifdef MADV_HUGEPAGE
    if (p) (void)madvise(p, size, MADV_HUGEPAGE); /* advice only */
#endif
    return p;
}

#endif
