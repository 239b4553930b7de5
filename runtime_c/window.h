/* window.h: what a sliding window lets a query see, for the pool's bookkeeping (kv_pool.c) and
 * the kernels that read and write the cache (kv_view.h): the one definition. */
#ifndef KILN_WINDOW_H
#define KILN_WINDOW_H

/* The first position a query at `pos` sees: 0 without a window (window 0), else the start of its
   window, which holds `window` positions ending at pos. */
static inline int kiln_window_first(int window, int pos) {
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

#endif
