/* kernels_mt.h: kernels that split their work across a step's threads (see threads.h).
 * Called by every thread of the region with the same arguments; each does its share. */
#ifndef KILN_KERNELS_MT_H
#define KILN_KERNELS_MT_H

#include "kernels.h"
#include "threads.h"

/* kiln_matmul: activation rows are quantized round-robin, then output rows split in ranges */
void kiln_matmul_mt(const kiln_thread *t, int type, const void *w, const float *bias, int n_out, int n_in,
                    const float *x, int n_rows, float *y, void *scratch);
/* kiln_attention: (token, head) pairs are dealt round-robin */
void kiln_attention_mt(const kiln_thread *t, int type, float *out, const float *q, const int32_t *pos, int n_tokens,
                       const void *k_cache, const void *v_cache, int capacity, int window, int n_head,
                       int n_head_kv, int head_dim, float scale);

#endif
