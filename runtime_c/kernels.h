/* kernels.h: the runtime's kernel API. Plain C declarations (also fed to cffi's cdef).
 *
 * Types are GGML type ids (kiln_type). A matmul quantizes its activations once per row
 * into the weight type's activation format, then dots every weight row against them,
 * as llama.cpp does: q4_0/q5_0/q8_0, iq4_nl and mxfp4 against q8_0, q4_1/q5_1 against q8_1,
 * the 256-weight super-block types (K-quants, i-quants, ternary) against q8_K, floats in f32.
 */
#ifndef KILN_KERNELS_H
#define KILN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "constants.h"

enum kiln_type {
    KILN_F32 = 0, KILN_F16 = 1, KILN_Q4_0 = 2, KILN_Q4_1 = 3, KILN_Q5_0 = 6, KILN_Q5_1 = 7,
    KILN_Q8_0 = 8, KILN_Q8_1 = 9, KILN_Q2_K = 10, KILN_Q3_K = 11, KILN_Q4_K = 12, KILN_Q5_K = 13, KILN_Q6_K = 14,
    KILN_Q8_K = 15, KILN_IQ2_XXS = 16, KILN_IQ2_XS = 17, KILN_IQ3_XXS = 18, KILN_IQ1_S = 19, KILN_IQ4_NL = 20,
    KILN_IQ3_S = 21, KILN_IQ2_S = 22, KILN_IQ4_XS = 23, KILN_IQ1_M = 29, KILN_BF16 = 30, KILN_TQ1_0 = 34,
    KILN_TQ2_0 = 35, KILN_MXFP4 = 39, KILN_TYPE_COUNT = 40
};

/* A weight matrix (or vector): its type, its rows in the GGUF mapping, and its copy interleaved by
 * eight rows in the packed file where it has one and the build reads it (else NULL). */
typedef struct {
    int type;
    const void *data;
    const void *packed;
} kiln_weight;

/* -- quantized weights and activations ----------------------------------------------------- */
int kiln_type_supported(int type);
const char *kiln_type_name(int type); /* GGML's name ("Q4_K"), or NULL for a type kiln does not run */
int kiln_kv_type_supported(int type); /* a KV cache may hold rows of this type */
/* which of a type's kernels this build has SIMD versions of (the others run the scalar reference,
 * which every SIMD version equals bit for bit) */
enum { KILN_SIMD_DOT = 1, KILN_SIMD_DEQUANT = 2, KILN_SIMD_ACT = 4, KILN_SIMD_STORE = 8 };
int kiln_simd_kernels(int type);
size_t kiln_row_bytes(int type, int n);             /* bytes of n elements of type */
size_t kiln_act_row_bytes(int type, int n);         /* bytes of n activations quantized for type */
/* bytes after a matmul's quantized rows (from a multiple of 64) for their scales as the x8 kernels take
   them, 8 rows a tile (x8_vnni.c): 0 but for the 32-weight activation formats and 2 rows or more */
size_t kiln_act_scales_bytes(int type, int n_rows, int n_in);
/* the scratch a matmul of n_rows rows takes: their quantized rows, then (from a multiple of 64) their scales */
size_t kiln_matmul_scratch_bytes(int type, int n_rows, int n_in);
void kiln_quantize_act(int type, const float *x, void *dst, int n);     /* x[n] -> type's act format */
void kiln_quantize_act_ref(int type, const float *x, void *dst, int n); /* the same, scalar reference */
void kiln_dequantize_row(int type, const void *src, float *dst, int n); /* n elements -> f32 */
void kiln_dequantize_row_ref(int type, const void *src, float *dst, int n); /* the same, scalar reference */
float kiln_vec_dot(int type, int n, const void *w, const void *act);    /* w row . quantized act row */
float kiln_vec_dot_ref(int type, int n, const void *w, const void *act); /* the same, scalar reference */
/* y[r][o] = W[o] . x[r] + (bias ? bias[o] : 0) for r < n_rows, o < n_out; scratch: kiln_matmul_scratch_bytes;
 * each W[o] . x[r] the reference dot's bits */
void kiln_matmul(int type, const void *w, const float *bias, int n_out, int n_in,
                 const float *x, int n_rows, float *y, void *scratch);
/* Weights interleaved by eight rows (x8_pack.c). kiln_x8_packs says whether the layout holds a
 * matrix (any build), kiln_x8_kernels whether this build has the kernels that read it, and
 * kiln_x8_supported both; where it says no, kiln_matmul_x8 reads w. */
int kiln_x8_packs(int type, int n_out, int n_in);
int kiln_x8_kernels(void);
int kiln_x8_supported(int type, int n_out, int n_in);
void kiln_pack_x8(int type, const void *src, void *dst, int n_out, int n_in); /* into kiln_x8_bytes */
size_t kiln_x8_bytes(int type, int n_out, int n_in); /* the packed matrix: src's size but for Q4_K/Q5_K */
/* the packed file's header, naming the GGUF it was packed from (its size, its header's CRC-32) */
void kiln_packed_header(uint8_t out[KILN_PACKED_HEADER_BYTES], uint64_t gguf_bytes, uint32_t gguf_crc,
                        uint64_t packed_bytes);
int kiln_packed_header_matches(const uint8_t *in, uint64_t gguf_bytes, uint32_t gguf_crc, uint64_t packed_bytes);
/* Whether the x8 matmuls take their integer sums from AMX tiles (steps of 16 or more rows), where
   the build (-march with AMX-INT8) and the OS allow it: enable -1 asks, 0 turns AMX off, 1 back on;
   0 on every build without AMX. The sums are exact either way, so the results are the same bits. */
int kiln_amx(int enable);
/* whether prefill takes AMX tile multiplies for a type where they are built and allowed (the
   32-weight x8 types', x8_amx.c; the super-block types' tiles but Q2_K's, rows_sb_avx2.c): any build */
int kiln_amx_prefill(int type);
/* kiln_matmul on the packed copy where the build supports it (packed != NULL), else on w */
void kiln_matmul_x8(int type, const void *packed, const void *w, const float *bias, int n_out, int n_in,
                    const float *x, int n_rows, float *y, void *scratch);

/* -- elementwise and normalisation --------------------------------------------------------- */
/* rows of n: y = x / sqrt(mean(x^2) + eps) * (w + w_offset) */
void kiln_rms_norm(float *y, const float *x, const float *w, float w_offset, float eps, int n, int rows);
/* rotate each head of x[rows][n_head][head_dim] by pos[row]; neox pairs (i, i+d/2), else (2i, 2i+1) */
void kiln_rope(float *y, const float *x, const int32_t *pos, int rows, int n_head, int head_dim,
               float base, int neox);
/* ggml_rope_ext's parameters beyond the base (compiler/ir/rope.py computes them as llama.cpp does) */
typedef struct {
    float freq_scale;           /* the angle times it (linear and YaRN scaling) */
    float ext_factor;           /* YaRN: how much of the unscaled angle the fast dimensions keep */
    float mscale;               /* cos and sin times it (the attention factor); a shift's rotation takes 1 */
    float beta_fast, beta_slow; /* YaRN's correction dimensions, with the original context */
    int n_ctx_orig;
} kiln_rope_scaling;
#define KILN_ROPE_UNSCALED {1.0f, 0.0f, 1.0f, 32.0f, 1.0f, 0} /* every factor 1: each angle and product exact */
/* kiln_rope as ggml_rope_ext computes it on the first n_rot dims of each head (the rest copied):
   angle i is theta_i / factors[i] (factors NULL: 1) for theta_i = pos * base^(-2i/n_rot),
   interpolated by freq_scale, YaRN's ramp mixing the two. It is kiln_rope_angles, then kiln_rope_rotate. */
void kiln_rope_ext(float *y, const float *x, const int32_t *pos, int rows, int n_head, int head_dim, int n_rot,
                   float base, int neox, const kiln_rope_scaling *sc, const float *factors);
/* Each row's rotation, as ggml_rope_cache_init makes it: for i < n_rot / 2, cs[r * ld + i] = cos(angle_i) and
   cs[r * ld + n_rot / 2 + i] = sin(angle_i), each times sc->mscale (sc NULL: unscaled); libm's cosf and sinf */
void kiln_rope_angles(float *cs, size_t ld, const int32_t *pos, int rows, int n_rot, float base,
                      const kiln_rope_scaling *sc, const float *factors);
/* x's heads rotated by their row's angles (cs[r * ld], as kiln_rope_angles lays them out), the first n_rot
   dims of each, the rest copied; cs NULL: copied whole (a layer without rope) */
void kiln_rope_rotate(float *y, const float *x, const float *cs, size_t ld, int rows, int n_head, int head_dim,
                      int n_rot, int neox);
/* One rotation the step's ropes share (compiler/passes/rope_table.py): its base, the dims it rotates,
   whether the frequency factors divide its angles, and where its values begin in a row of the table */
typedef struct {
    float base;
    int n_rot, factors, at;
} kiln_rope_table_desc;
/* Each block of 64 of x[n] times the orthonormal 64x64 Hadamard matrix (its own inverse), as
   llama.cpp rotates Q, K and V for a quantized cache: outliers spread over the block, so that a
   block's scale fits its values; dot products are unchanged. n is a multiple of 64. */
void kiln_hadamard(float *y, const float *x, int n);
void kiln_add(float *y, const float *a, const float *b, int n);
void kiln_scale(float *y, const float *x, int n, float s);      /* y = x * s */
void kiln_softcap(float *y, const float *x, int n, float cap);  /* y = cap * tanh(x / cap) (kiln_tanhf) */
void kiln_swiglu(float *y, const float *gate, const float *up, int n);  /* silu(gate) * up */
void kiln_swiglu_ref(float *y, const float *gate, const float *up, int n); /* the same through expf */
void kiln_swiglu_oai(float *y, const float *gate, const float *up, int n); /* gpt-oss's clamped SwiGLU (ops.c) */
void kiln_geglu(float *y, const float *gate, const float *up, int n);   /* gelu_tanh(gate) * up */
void kiln_geglu_ref(float *y, const float *gate, const float *up, int n); /* the same without the table */
/* -- an encoder's (encoder.c) ---------------------------------------------------------------- */
/* rows of n: y = (x - mean) / sqrt(var + eps) * w + b (w, b NULL: 1, 0) */
void kiln_layer_norm(float *y, const float *x, const float *w, const float *b, float eps, int n, int rows);
void kiln_gelu(float *y, const float *x, int n); /* x Phi(x), erf's GELU */
void kiln_geglu_erf(float *y, const float *gate, const float *up, int n); /* kiln_gelu(gate) * up (jina-bert-v2) */
/* -- Gated DeltaNet (delta_net.c) ----------------------------------------------------------- */
/* Channels c0 .. c1 - 1 of each row, rows in order: y = silu(sum over the taps of w[c][k] times the
   window: its sequence's last taps - 1 inputs (state + seq * slot_floats, [taps - 1][channels], zeros
   for a row at cache row 0) and x itself); the row then joins the window. */
void kiln_ssm_conv(float *y, const float *x, const float *w, const int32_t *seq, const int32_t *row, int n,
                   int channels, int taps, float *state, size_t slot_floats, int c0, int c1);
/* Value heads h0 .. h1 - 1 of each row, rows in order. x holds q (n_k heads of d), k (n_k) and v
   (n_v); value head h reads key head h % n_k (interleaved: h / (n_v / n_k)). q, k L2-normalized; decay = e^(softplus(alpha + dt) a),
   beta' = sigmoid(beta); S = its sequence's [d][d] state (zeros at cache row 0), S *= decay;
   S_j += k (v_j - S_j . k) beta'; out_j = S_j . q / sqrt(d). */
void kiln_delta_net(float *out, const float *x, const float *alpha, const float *beta, const float *dt,
                    const float *a, const int32_t *seq, const int32_t *row, int n, int n_k, int n_v, int interleaved, int d,
                    float eps, float *state, size_t slot_floats, int h0, int h1);
/* the same, its dot products and updates in scalar code (vec_f32.h's reference order) */
void kiln_delta_net_ref(float *out, const float *x, const float *alpha, const float *beta, const float *dt,
                        const float *a, const int32_t *seq, const int32_t *row, int n, int n_k, int n_v, int interleaved, int d,
                        float eps, float *state, size_t slot_floats, int h0, int h1);
/* y[r][y_at + g*count + i] = x[r][g][from + i] (x's rows: groups of group_width): one part of every
   group, into consecutive columns of y's rows of y_width */
void kiln_regroup(float *y, int y_width, int y_at, const float *x, int rows, int groups, int group_width, int from,
                  int count);
void kiln_sigmoid_gate(float *y, const float *gate, const float *x, int n); /* y = x * sigmoid(gate) */
/* y[r][i] = x[r][i] * sigmoid(gate[r]) */
void kiln_sigmoid_row_gate(float *y, const float *gate, const float *x, int rows, int width);

/* y[r] = scale * row ids[r] of the table, dequantized */
void kiln_embed(int type, float *y, const void *table, const int32_t *ids, int rows, int n_embd, float scale);

/* -- mixture of experts (moe_route.c, moe.c) ------------------------------------------------ */
/* idx = 0 .. n-1 ordered by v descending, ties where libstdc++'s std::sort with `v[a] > v[b]`
   leaves them: llama.cpp's CPU argsort (ggml_argsort_top_k), step for step */
void kiln_argsort_desc(const float *v, int32_t *idx, int n);
/* Each row's router: p = softmax(logits[r][0 .. n_expert)) (kiln_expf, the sum in double), the top
   n_used experts by p in argsort order into ids[r], their p into weights[r], divided by their sum
   (at least 6.103515625e-5) where normalize: llama.cpp's softmax gating, with and without norm_w.
   softmax_weight: the top n_used by the logits themselves, weighted by the softmax of those n_used
   logits (llama.cpp's softmax_weight gating, gpt-oss's); normalize is then not read. */
void kiln_moe_route(int32_t *ids, float *weights, const float *logits, int n_rows, int n_expert, int n_used,
                    int normalize, int softmax_weight);
/* An expert FFN's activation: silu(g) u (KILN_ACT_SWIGLU), gpt-oss's clamped one (kiln_swiglu_oai),
   gelu(g) u (KILN_ACT_GEGLU, Gemma 4's), or, an expert without a gate, kiln_gelu(u) (KILN_ACT_GELU,
   nomic-bert-moe's: the erf GELU of a plain FFN) */
enum kiln_activation { KILN_ACT_SWIGLU = 0, KILN_ACT_SWIGLU_OAI = 1, KILN_ACT_GEGLU = 2, KILN_ACT_GELU = 3 };
/* What an expert adds beyond its three matrices: each one's bias, [n_expert][its output width]
   (NULL: none), added to its matmul's rows as ggml_add_id does; down's output times down_scale[e]
   (NULL: none) before that; the activation; and whether gate and up are one tensor (each expert's
   slice its gate rows then its up rows: the same kiln_weight passed for both) */
typedef struct {
    const float *gate_b, *up_b, *down_b, *down_scale;
    int act;
    int fused_gate_up;
} kiln_moe_extra;
/* The scratch kiln_moe_ffn takes (its parts: moe.c; compiler/passes/scratch.py plans the same);
   without a gate, gate_type is up's. */
size_t kiln_moe_scratch_bytes(int gate_type, int up_type, int down_type, int n_rows, int n_expert, int n_used,
                              int n_ff, int n_embd);
/* y[r] = sum over j < n_used, in rank order, of weights[r][j] * FFN_e(x[r]) for e = ids[r][j]:
   FFN_e(x) = down_e act(gate_e x, up_e x), or with gate NULL (KILN_ACT_GELU) down_e gelu(up_e x),
   expert e the slice e of gate and up [n_expert][n_ff]
   [n_embd] and of down [n_expert][n_embd][n_ff] (their packed copies where given and the build reads
   them). Each expert's weights are read once for all the rows that chose it, each row's value is
   the same bits however the rows are batched. Runs on a pool of n_threads of its own; reads, where
   not NULL, gets [n_expert][3] += the rows of each expert's gate, up and down the kernel read. */
int kiln_moe_ffn(float *y, const float *x, const int32_t *ids, const float *weights, const kiln_weight *gate,
                 const kiln_weight *up, const kiln_weight *down, const kiln_moe_extra *extra, int n_rows, int n_expert,
                 int n_used, int n_ff, int n_embd, void *scratch, int n_threads, int32_t *reads);


/* -- KV cache and attention ---------------------------------------------------------------- */
/* f32 row x[n] -> dst in a cache type (f32, f16, q8_0, q5_0, q4_1, q4_0), rounded as ggml's reference does */
void kiln_quantize_row(int type, const float *x, void *dst, int n);
void kiln_quantize_row_ref(int type, const float *x, void *dst, int n); /* the same, scalar reference */

/* One layer's view of the paged KV pool (kv_plan.py): position p of sequence s lives in page
 * tables[s * max_blocks + p / page_size], at row p % page_size of each kv head, K at k_off and
 * V at v_off within the page: [n_head_kv][page_size][row], an f16 or f32 K transposed within its
 * head's rows (kv_view.h). K and V rows have their own types. */
typedef struct {
    uint8_t *pages;        /* the layer group's pool: [n_pages][page_bytes] */
    size_t page_bytes;
    size_t k_off, v_off;
    int k_type, v_type;    /* kiln_type of a K row, of a V row */
    const int32_t *tables; /* [n_seq][max_blocks] */
    int max_blocks, page_size;
    int window;            /* 0: a query at p sees positions 0..p; else p - window + 1 .. p */
    float *mass;           /* NULL, or [n_seq][mass_stride]: attention each position has received (H2O) */
    int mass_stride;
    int half_window;       /* > 0: a bidirectional sliding layer (EmbeddingGemma's): a query at p sees
                              p - half_window .. p + half_window of what its sequence has; window is 0 */
} kiln_kv_view;

/* write k,v[n_tokens][n_head_kv][head_dim] of token t at position row[t] of sequence seq[t] */
void kiln_kv_store(const kiln_kv_view *kv, const float *k, const float *v, const int32_t *seq,
                   const int32_t *row, int n_tokens, int n_head_kv, int head_dim);
/* After kiln_kv_keep_begin (kv_pool.h): row r of sequence seq takes the K and V rows of position
   keep[r], for the rows r >= first_changed the layer's next query reads, and K is rotated by
   r - keep[r] positions (rope_base 0: K is not rotated; its first n_rot dims): dequantized, rotated as kiln_rope_ext does
   with sc and factors (sc NULL: plain rope) but at magnitude 1, since the cached keys already carry
   theirs, quantized again, as llama.cpp shifts a cache. A K cache held in Hadamard blocks
   (hadamard) is taken out of them for the rotation and put back. */
void kiln_kv_move_rows(const kiln_kv_view *kv, int seq, const int32_t *keep, int first_changed, int n, int n_head_kv,
                       int head_dim, int n_rot, float rope_base, int neox, const kiln_rope_scaling *sc,
                       const float *factors, int hadamard);
/* out[t][h] = softmax(q[t][h] . K[h/group][j] * scale) V over the positions j that token t, at
   cache row row[t], sees in its sequence: up to seen[t] (its own row in a causal model, its
   sequence's last row of the step in a bidirectional one), within the view's window. softcap != 0
   caps each score first, s -> softcap tanh(s / softcap) (Gemma 2); sinks, where not NULL, adds a
   logit sinks[h] with no value row to each head's softmax (gpt-oss); alibi > 0 (jina-bert-v2's
   ALiBi, llama.cpp's max_alibi_bias) adds slope_h * -|row[t] - j| to each score, head h's slope as
   ggml's soft_max makes it (kiln_alibi_slopes). Every query's history is cut at multiples of
   KILN_ATTN_SPAN positions; each span's softmax is computed on its own and the spans are merged in
   order, so a token's result does not depend on the other rows of the step or on the threads. One
   token with scratch != NULL spreads its (kv head, span) items over the threads; scratch holds
   n_head * max_spans * (head_dim + 2) floats of partial softmax (a longer history takes the
   sequential path, with the same result). */
#define KILN_ATTN_SCRATCH_FLOATS(n_head, max_spans, head_dim) ((n_head) * (max_spans) * ((head_dim) + KILN_ATTN_SPAN_STATE))
void kiln_attention(float *out, const float *q, const int32_t *seq, const int32_t *row, const int32_t *seen,
                    int n_tokens, const kiln_kv_view *kv, int n_head, int n_head_kv, int head_dim, float scale,
                    float softcap, const float *sinks, float alibi, void *scratch, int max_spans);
/* ALiBi's slope of each of n_head heads for max_bias: m0^(h+1) for the first 2^floor(log2 n_head)
   heads, then m1^(2(h - that) + 1), as ggml's soft_max */
void kiln_alibi_slopes(float *slopes, int n_head, float max_bias);
/* mass[seq[t]][j] += softmax(q[t][h] . K[j] * scale)[j] summed over heads, for every position j token
   t sees: the attention each position receives, which heavy-hitter eviction (H2O) keeps the largest
   of. kiln_attention_mt calls it after its own work when kv->mass is set. */
void kiln_attention_mass(const float *q, const int32_t *seq, const int32_t *row, const int32_t *seen, int n_tokens,
                         const kiln_kv_view *kv, int n_head, int n_head_kv, int head_dim, float scale, float softcap,
                         const float *sinks, float alibi);
/* the same, one cache row at a time in scalar float: the reference the SIMD version is tested against */
void kiln_attention_ref(float *out, const float *q, const int32_t *seq, const int32_t *row, const int32_t *seen,
                        int n_tokens, const kiln_kv_view *kv, int n_head, int n_head_kv, int head_dim, float scale,
                        float softcap, const float *sinks, float alibi);

#endif
