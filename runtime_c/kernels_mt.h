/* kernels_mt.h: kernels that split their work across a step's threads (see threads.h).
 * Called by every thread of the region with the same arguments; each does its share. */
#ifndef KILN_KERNELS_MT_H
#define KILN_KERNELS_MT_H

#include "kernels.h"
#include "threads.h"

/* A matmul's activation rows, quantized: one row (decode) by every thread into its own `local`
 * copy, which spares a barrier; more rows round-robin into `scratch`, then a barrier. */
const uint8_t *kiln_quantize_rows_mt(const kiln_thread *t, int type, const float *x, int n_rows, int n_in,
                                     void *scratch, uint8_t local[KILN_LOCAL_ACT_BYTES]);
/* y[r][o] += bias[o] for every row r < n_rows and this thread's outputs o0 <= o < o1 */
static inline void kiln_add_bias(float *y, const float *bias, int n_rows, int n_out, int o0, int o1) {
    for (int r = 0; bias && r < n_rows; r++)
        for (int o = o0; o < o1; o++) y[(size_t)r * n_out + o] += bias[o];
}
/* kiln_matmul on w's packed copy where it has one (groups of 8 output rows split in ranges), else
 * on its GGUF rows (ranges of rows); activations quantized as above. Its output rows are
 * [run_at, run_at + n_out) of a run of run_rows (the matmuls on one x without a barrier between
 * them, which the threads may share out as one matrix); on its own, 0 and n_out. */
void kiln_matmul_mt(const kiln_thread *t, const kiln_weight *w, const float *bias, int n_out, int n_in,
                    const float *x, int n_rows, float *y, void *scratch, int run_at, int run_rows);
/* the same, on rows a kiln_matmul_mt before it (same x, same activation format) left quantized
 * in `scratch`; one row is quantized again on each thread's stack, where that one left it */
void kiln_matmul_quantized_mt(const kiln_thread *t, const kiln_weight *w, const float *bias, int n_out, int n_in,
                              const float *x, int n_rows, float *y, void *scratch, int run_at, int run_rows);
/* kiln_attention: (token block, query heads of one kv head) items claimed the costliest first, or
 * one token's (kv head, span) items, a run of them a thread */
void kiln_attention_mt(const kiln_thread *t, float *out, const float *q, const int32_t *seq,
                       const int32_t *row, const int32_t *seen, int n_tokens, const kiln_kv_view *kv, int n_head,
                       int n_head_kv, int head_dim, float scale, void *scratch, int max_spans);
/* the same with soft-capped scores (Gemma 2), sinks (gpt-oss) or ALiBi (jina-bert-v2), each 0 / NULL: none */
void kiln_attention_ext_mt(const kiln_thread *t, float *out, const float *q, const int32_t *seq,
                           const int32_t *row, const int32_t *seen, int n_tokens, const kiln_kv_view *kv, int n_head,
                           int n_head_kv, int head_dim, float scale, float softcap, const float *sinks, float alibi,
                           void *scratch, int max_spans);

/* a mixture of experts (kernels.h): the router by rows; the experts' FFN by granules of output rows */
void kiln_moe_route_mt(const kiln_thread *t, int32_t *ids, float *weights, const float *logits, int n_rows,
                       int n_expert, int n_used, int normalize, int softmax_weight);
void kiln_moe_ffn_mt(const kiln_thread *t, float *y, const float *x, const int32_t *ids, const float *weights,
                     const kiln_weight *gate, const kiln_weight *up, const kiln_weight *down,
                     const kiln_moe_extra *extra, int n_rows, int n_expert, int n_used, int n_ff, int n_embd,
                     void *scratch);

/* the light kernels: each thread takes a contiguous share of the rows (elements for add/glu) */
void kiln_embed_mt(const kiln_thread *t, float *y, const kiln_weight *table, const int32_t *ids, int rows,
                   int n_embd, float scale);
void kiln_rms_norm_mt(const kiln_thread *t, float *y, const float *x, const float *w, float w_offset, float eps,
                      int n, int rows);
/* the step's rope table: each row's rotations d[k] at table + r * ld + d[k].at (kiln_rope_angles) */
void kiln_rope_table_mt(const kiln_thread *t, float *table, size_t ld, const int32_t *pos, int rows,
                        const kiln_rope_table_desc *d, int n, const kiln_rope_scaling *sc, const float *factors);
void kiln_rope_rotate_mt(const kiln_thread *t, float *y, const float *x, const float *cs, size_t ld, int rows,
                         int n_head, int head_dim, int n_rot, int neox);
/* a layer's rotations in the step's rope table: rotation k of descs, or none (k < 0) */
static inline const float *kiln_rope_cs(const float *table, const kiln_rope_table_desc *descs, int k) {
    return k < 0 ? (const float *)0 : table + descs[k].at;
}
void kiln_kv_store_mt(const kiln_thread *t, const kiln_kv_view *kv, const float *k, const float *v,
                      const int32_t *seq, const int32_t *row, int n_tokens, int n_head_kv, int head_dim);
/* y[r][i] = x[r][i] * w[i], and + w[i]: a row of weights against every row */
void kiln_scale_row_mt(const kiln_thread *t, float *y, const float *x, int n, int width, const float *w);
void kiln_layer_norm_mt(const kiln_thread *t, float *y, const float *x, const float *w, const float *b, float eps,
                        int n, int rows);
void kiln_gelu_mt(const kiln_thread *t, float *y, const float *x, int n);
void kiln_geglu_erf_mt(const kiln_thread *t, float *y, const float *gate, const float *up, int n);
void kiln_add_row_mt(const kiln_thread *t, float *y, const float *x, int n, int width, const float *w);
void kiln_layer_slice_mt(const kiln_thread *t, float *y, const float *x, int n, int width, int n_layer, int l);
/* y[i] = x[rows[i]] for i < n: the rows whose logits were asked for */
void kiln_select_rows_mt(const kiln_thread *t, float *y, const float *x, const int32_t *rows, int n, int n_embd);
void kiln_add_mt(const kiln_thread *t, float *y, const float *a, const float *b, int n);
void kiln_scale_mt(const kiln_thread *t, float *y, const float *x, int n, float s);
void kiln_softcap_mt(const kiln_thread *t, float *y, const float *x, int n, float cap);
void kiln_hadamard_mt(const kiln_thread *t, float *y, const float *x, int n); /* blocks of 64 */
/* the DeltaNet's: the conv by channels, the delta rule by value heads (each thread takes every row) */
void kiln_ssm_conv_mt(const kiln_thread *t, float *y, const float *x, const float *w, const int32_t *seq,
                      const int32_t *row, int n, int channels, int taps, float *state, size_t slot_floats);
void kiln_delta_net_mt(const kiln_thread *t, float *out, const float *x, const float *alpha, const float *beta,
                       const float *dt, const float *a, const int32_t *seq, const int32_t *row, int n, int n_k,
                       int n_v, int interleaved, int d, float eps, float *state, size_t slot_floats);
void kiln_regroup_mt(const kiln_thread *t, float *y, int y_width, int y_at, const float *x, int rows, int groups,
                     int group_width, int from, int count);
void kiln_sigmoid_gate_mt(const kiln_thread *t, float *y, const float *gate, const float *x, int n);
void kiln_sigmoid_row_gate_mt(const kiln_thread *t, float *y, const float *gate, const float *x, int rows, int width);
void kiln_swiglu_mt(const kiln_thread *t, float *y, const float *a, const float *b, int n);
void kiln_geglu_mt(const kiln_thread *t, float *y, const float *a, const float *b, int n);

#endif
