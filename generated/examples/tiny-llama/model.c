/* model.c: tiny-llama.gguf (llama), compiled by kiln 0.1.0. Generated; do not edit.
 *
 * ctx 64, KV cache f32, prefill chunk 16, 1 sequence slot(s).
 * Every offset below was fixed by kiln's memory planner; `kiln layout` prints the same map.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels_mt.h"
#include "model.h"

/* ==== configuration ======================================================================== */
#define N_VOCAB 259
#define N_CTX 64
#define N_LAYER 2
#define PREFILL_CHUNK 16
#define ROLLBACK_LIMIT -1 /* -1: any rollback; else how far back sliding rings always remember */

/* ==== the weights: the GGUF file, mmapped read-only ============================================ */
#define GGUF_BYTES 102720LL
#define GGUF_HEADER_BYTES 5472
#define GGUF_HEADER_CRC32 3596502979u /* the library refuses any other file */

/* ==== packed weights: matmul weights interleaved by 8 rows (pack_x8.c), in a file kiln wrote ==== */
#define PACKED_BYTES 78336ULL
#define PACKED_HEADER_BYTES 64 /* "KILNX8\0\1", GGUF bytes, GGUF header CRC32, 0, PACKED_BYTES */
#define N_PACK 14
/* where each packed matrix came from; kiln_open checks that the file was written for these */
static const struct {
    int type, n_out, n_in;
    size_t src, dst; /* offset in the GGUF file, in the packed region */
} PACK[N_PACK + 1] = {
    { KILN_Q8_0, 64, 64, 0x5c40, 0x0 }, /* blk.0.attn_q.weight */
    { KILN_Q8_0, 32, 64, 0x6d40, 0x1100 }, /* blk.0.attn_k.weight */
    { KILN_Q8_0, 32, 64, 0x75c0, 0x1980 }, /* blk.0.attn_v.weight */
    { KILN_Q8_0, 64, 64, 0x7e40, 0x2200 }, /* blk.0.attn_output.weight */
    { KILN_Q8_0, 128, 64, 0x9040, 0x3300 }, /* blk.0.ffn_gate.weight */
    { KILN_Q8_0, 128, 64, 0xb240, 0x5500 }, /* blk.0.ffn_up.weight */
    { KILN_Q8_0, 64, 128, 0xd440, 0x7700 }, /* blk.0.ffn_down.weight */
    { KILN_Q8_0, 64, 64, 0xf740, 0x9900 }, /* blk.1.attn_q.weight */
    { KILN_Q8_0, 32, 64, 0x10840, 0xaa00 }, /* blk.1.attn_k.weight */
    { KILN_Q8_0, 32, 64, 0x110c0, 0xb280 }, /* blk.1.attn_v.weight */
    { KILN_Q8_0, 64, 64, 0x11940, 0xbb00 }, /* blk.1.attn_output.weight */
    { KILN_Q8_0, 128, 64, 0x12b40, 0xcc00 }, /* blk.1.ffn_gate.weight */
    { KILN_Q8_0, 128, 64, 0x14d40, 0xee00 }, /* blk.1.ffn_up.weight */
    { KILN_Q8_0, 64, 128, 0x16f40, 0x11000 }, /* blk.1.ffn_down.weight */
    {0},
};

/* ==== KV cache: per slot [layer][K|V][kv_head][row][head_dim] f32; position p at row p % KV_CAP[layer] */
#define KV_BYTES 32768 /* 1 slot(s) of 32768 */
static const size_t KV_K_OFF[N_LAYER] = { 0x0, 0x4000 };
static const size_t KV_V_OFF[N_LAYER] = { 0x2000, 0x6000 };
static const int KV_CAP[N_LAYER] = { 64, 64 };
static const int KV_WINDOW[N_LAYER] = { 0, 0 }; /* 0: a global layer */

/* ==== activations: one arena, shared by the decode and prefill steps ============================ */
#define ARENA_BYTES 28736 /* decode 1984, prefill 28736 */

struct kiln_model {
    const uint8_t *weights; /* [GGUF_BYTES] */
    const uint8_t *packed;  /* [PACKED_BYTES] in the packed file's mapping, or NULL: x8 calls read W */
    const uint8_t *packed_map;
    uint8_t *kv;            /* [KV_BYTES] */
    uint8_t *arena;         /* [ARENA_BYTES] */
    int n_past;             /* positions held by sequence 0 */
    kiln_pool *pool;        /* this instance's threads */
};

typedef struct {
    kiln_model *m;
    const int32_t *tokens;
    int n, n_logits; /* tokens in this step; rows of logits wanted (the last n_logits) */
    float *logits;   /* [n_logits x N_VOCAB], the caller's */
} step_args;

#define W(off) ((const void *)(m->weights + (off)))
#define P(off) ((const void *)(m->packed ? m->packed + (off) : NULL))
#define A(off) ((void *)(m->arena + (off)))
#define KV_K(l) ((void *)(m->kv + KV_K_OFF[l]))
#define KV_V(l) ((void *)(m->kv + KV_V_OFF[l]))

/* ==== decode step: up to 1 token(s), 35 ops ===================================== */
/* every thread of the pool runs this; kernels split their work by t->ith / t->nth */
static void decode_step(void *arg, const kiln_thread *t) {
    const step_args *s = arg;
    kiln_model *m = s->m;
    const int n = s->n, n_logits = s->n_logits;
    int32_t *inp_tokens = (int32_t *)A(0x0); /* [n] */
    int32_t *inp_pos = (int32_t *)A(0x780);    /* [n] */
    if (t->ith == 0)
        for (int i = 0; i < n; i++) {
            inp_tokens[i] = s->tokens[i];
            inp_pos[i] = m->n_past + i;
        }
    kiln_barrier(t);
    float *result_output = s->logits; /* [n_logits x N_VOCAB], the caller's */
    /* inp_embd: embed_q8_0 */
    float *inp_embd = (float *)A(0x480); /* [n x 64] */
    kiln_embed_mt(t, KILN_Q8_0, inp_embd, W(0x1560), inp_tokens, n, 64, 1.0f);
    kiln_barrier(t);

    /* ---- layer 0 ---- */
    /* attn_norm-0: rms_norm_f32 */
    float *attn_norm_0 = (float *)A(0x0); /* [n x 64] */
    kiln_rms_norm_mt(t, attn_norm_0, inp_embd, (const float *)W(0x5b40), 0.0f, 9.99999997e-07f, 64, n);
    kiln_barrier(t);
    /* q-0: matmul_x8_q8_0 */
    float *q_0 = (float *)A(0x100); /* [n x 4 x 16] */
    void *q_0_act = A(0x200); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x0), W(0x5c40), NULL, 64, 64, attn_norm_0, n, q_0, q_0_act);
    kiln_barrier(t);
    /* k-0: matmul_x8_q8_0 */
    float *k_0 = (float *)A(0x200); /* [n x 2 x 16] */
    void *k_0_act = A(0x280); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x1100), W(0x6d40), NULL, 32, 64, attn_norm_0, n, k_0, k_0_act);
    kiln_barrier(t);
    /* v-0: matmul_x8_q8_0 */
    float *v_0 = (float *)A(0x280); /* [n x 2 x 16] */
    void *v_0_act = A(0x300); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x1980), W(0x75c0), NULL, 32, 64, attn_norm_0, n, v_0, v_0_act);
    kiln_barrier(t);
    /* q_rope-0: rope_pairwise_f32 */
    float *q_rope_0 = (float *)A(0x580); /* [n x 4 x 16] */
    kiln_rope_mt(t, q_rope_0, q_0, inp_pos, n, 4, 16, 10000.0f, 0);
    kiln_barrier(t);
    /* k_rope-0: rope_pairwise_f32 */
    float *k_rope_0 = (float *)A(0x0); /* [n x 2 x 16] */
    kiln_rope_mt(t, k_rope_0, k_0, inp_pos, n, 2, 16, 10000.0f, 0);
    kiln_barrier(t);
    /* kv_store-0: kv_store_f32 */
    kiln_kv_store_mt(t, KILN_F32, KV_K(0), KV_V(0), k_rope_0, v_0, inp_pos, n, KV_CAP[0], 2, 16);
    kiln_barrier(t);
    /* attn-0: attention_decode_f32 */
    float *attn_0 = (float *)A(0x680); /* [n x 64] */
    void *attn_0_parts = A(0x0); /* [1152 bytes] */
    kiln_attention_mt(t, KILN_F32, attn_0, q_rope_0, inp_pos, n, KV_K(0), KV_V(0), KV_CAP[0], KV_WINDOW[0], 4, 2, 16, 0.25f, 4, attn_0_parts);
    kiln_barrier(t);
    /* attn_out-0: matmul_x8_q8_0 */
    float *attn_out_0 = (float *)A(0x0); /* [n x 64] */
    void *attn_out_0_act = A(0x100); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x2200), W(0x7e40), NULL, 64, 64, attn_0, n, attn_out_0, attn_out_0_act);
    kiln_barrier(t);
    /* ffn_inp-0: add_f32 */
    float *ffn_inp_0 = (float *)A(0x600); /* [n x 64] */
    kiln_add_mt(t, ffn_inp_0, attn_out_0, inp_embd, n * 64);
    kiln_barrier(t);
    /* ffn_norm-0: rms_norm_f32 */
    float *ffn_norm_0 = (float *)A(0x400); /* [n x 64] */
    kiln_rms_norm_mt(t, ffn_norm_0, ffn_inp_0, (const float *)W(0x8f40), 0.0f, 9.99999997e-07f, 64, n);
    kiln_barrier(t);
    /* ffn_gate-0: matmul_x8_q8_0 */
    float *ffn_gate_0 = (float *)A(0x0); /* [n x 128] */
    void *ffn_gate_0_act = A(0x200); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x3300), W(0x9040), NULL, 128, 64, ffn_norm_0, n, ffn_gate_0, ffn_gate_0_act);
    kiln_barrier(t);
    /* ffn_up-0: matmul_x8_q8_0 */
    float *ffn_up_0 = (float *)A(0x200); /* [n x 128] */
    void *ffn_up_0_act = A(0x500); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x5500), W(0xb240), NULL, 128, 64, ffn_norm_0, n, ffn_up_0, ffn_up_0_act);
    kiln_barrier(t);
    /* ffn_glu-0: swiglu_f32 */
    float *ffn_glu_0 = (float *)A(0x400); /* [n x 128] */
    kiln_swiglu_mt(t, ffn_glu_0, ffn_gate_0, ffn_up_0, n * 128);
    kiln_barrier(t);
    /* ffn_out-0: matmul_x8_q8_0 */
    float *ffn_out_0 = (float *)A(0x0); /* [n x 64] */
    void *ffn_out_0_act = A(0x100); /* [136 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x7700), W(0xd440), NULL, 64, 128, ffn_glu_0, n, ffn_out_0, ffn_out_0_act);
    kiln_barrier(t);
    /* l_out-0: add_f32 */
    float *l_out_0 = (float *)A(0x480); /* [n x 64] */
    kiln_add_mt(t, l_out_0, ffn_out_0, ffn_inp_0, n * 64);
    kiln_barrier(t);

    /* ---- layer 1 ---- */
    /* attn_norm-1: rms_norm_f32 */
    float *attn_norm_1 = (float *)A(0x0); /* [n x 64] */
    kiln_rms_norm_mt(t, attn_norm_1, l_out_0, (const float *)W(0xf640), 0.0f, 9.99999997e-07f, 64, n);
    kiln_barrier(t);
    /* q-1: matmul_x8_q8_0 */
    float *q_1 = (float *)A(0x100); /* [n x 4 x 16] */
    void *q_1_act = A(0x200); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x9900), W(0xf740), NULL, 64, 64, attn_norm_1, n, q_1, q_1_act);
    kiln_barrier(t);
    /* k-1: matmul_x8_q8_0 */
    float *k_1 = (float *)A(0x200); /* [n x 2 x 16] */
    void *k_1_act = A(0x280); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xaa00), W(0x10840), NULL, 32, 64, attn_norm_1, n, k_1, k_1_act);
    kiln_barrier(t);
    /* v-1: matmul_x8_q8_0 */
    float *v_1 = (float *)A(0x280); /* [n x 2 x 16] */
    void *v_1_act = A(0x300); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xb280), W(0x110c0), NULL, 32, 64, attn_norm_1, n, v_1, v_1_act);
    kiln_barrier(t);
    /* q_rope-1: rope_pairwise_f32 */
    float *q_rope_1 = (float *)A(0x580); /* [n x 4 x 16] */
    kiln_rope_mt(t, q_rope_1, q_1, inp_pos, n, 4, 16, 10000.0f, 0);
    kiln_barrier(t);
    /* k_rope-1: rope_pairwise_f32 */
    float *k_rope_1 = (float *)A(0x0); /* [n x 2 x 16] */
    kiln_rope_mt(t, k_rope_1, k_1, inp_pos, n, 2, 16, 10000.0f, 0);
    kiln_barrier(t);
    /* kv_store-1: kv_store_f32 */
    kiln_kv_store_mt(t, KILN_F32, KV_K(1), KV_V(1), k_rope_1, v_1, inp_pos, n, KV_CAP[1], 2, 16);
    kiln_barrier(t);
    /* attn-1: attention_decode_f32 */
    float *attn_1 = (float *)A(0x680); /* [n x 64] */
    void *attn_1_parts = A(0x0); /* [1152 bytes] */
    kiln_attention_mt(t, KILN_F32, attn_1, q_rope_1, inp_pos, n, KV_K(1), KV_V(1), KV_CAP[1], KV_WINDOW[1], 4, 2, 16, 0.25f, 4, attn_1_parts);
    kiln_barrier(t);
    /* attn_out-1: matmul_x8_q8_0 */
    float *attn_out_1 = (float *)A(0x0); /* [n x 64] */
    void *attn_out_1_act = A(0x100); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xbb00), W(0x11940), NULL, 64, 64, attn_1, n, attn_out_1, attn_out_1_act);
    kiln_barrier(t);
    /* ffn_inp-1: add_f32 */
    float *ffn_inp_1 = (float *)A(0x600); /* [n x 64] */
    kiln_add_mt(t, ffn_inp_1, attn_out_1, l_out_0, n * 64);
    kiln_barrier(t);
    /* ffn_norm-1: rms_norm_f32 */
    float *ffn_norm_1 = (float *)A(0x400); /* [n x 64] */
    kiln_rms_norm_mt(t, ffn_norm_1, ffn_inp_1, (const float *)W(0x12a40), 0.0f, 9.99999997e-07f, 64, n);
    kiln_barrier(t);
    /* ffn_gate-1: matmul_x8_q8_0 */
    float *ffn_gate_1 = (float *)A(0x0); /* [n x 128] */
    void *ffn_gate_1_act = A(0x200); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xcc00), W(0x12b40), NULL, 128, 64, ffn_norm_1, n, ffn_gate_1, ffn_gate_1_act);
    kiln_barrier(t);
    /* ffn_up-1: matmul_x8_q8_0 */
    float *ffn_up_1 = (float *)A(0x200); /* [n x 128] */
    void *ffn_up_1_act = A(0x500); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xee00), W(0x14d40), NULL, 128, 64, ffn_norm_1, n, ffn_up_1, ffn_up_1_act);
    kiln_barrier(t);
    /* ffn_glu-1: swiglu_f32 */
    float *ffn_glu_1 = (float *)A(0x400); /* [n x 128] */
    kiln_swiglu_mt(t, ffn_glu_1, ffn_gate_1, ffn_up_1, n * 128);
    kiln_barrier(t);
    /* ffn_out-1: matmul_x8_q8_0 */
    float *ffn_out_1 = (float *)A(0x0); /* [n x 64] */
    void *ffn_out_1_act = A(0x100); /* [136 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x11000), W(0x16f40), NULL, 64, 128, ffn_glu_1, n, ffn_out_1, ffn_out_1_act);
    kiln_barrier(t);
    /* l_out-1: add_f32 */
    float *l_out_1 = (float *)A(0x100); /* [n x 64] */
    kiln_add_mt(t, l_out_1, ffn_out_1, ffn_inp_1, n * 64);
    kiln_barrier(t);

    /* ---- output ---- */
    /* result_norm: rms_norm_f32 */
    float *result_norm = (float *)A(0x0); /* [n x 64] */
    kiln_rms_norm_mt(t, result_norm, l_out_1, (const float *)W(0x5a40), 0.0f, 9.99999997e-07f, 64, n);
    kiln_barrier(t);
    /* result_output: logits_q8_0 */
    void *result_output_act = A(0x100); /* [68 bytes] */
    kiln_matmul_mt(t, KILN_Q8_0, W(0x1560), NULL, 259, 64, result_norm + (size_t)(n - n_logits) * 64, n_logits, result_output, result_output_act);
    kiln_barrier(t);
}

/* ==== prefill step: up to 16 token(s), 35 ops ===================================== */
/* every thread of the pool runs this; kernels split their work by t->ith / t->nth */
static void prefill_step(void *arg, const kiln_thread *t) {
    const step_args *s = arg;
    kiln_model *m = s->m;
    const int n = s->n, n_logits = s->n_logits;
    int32_t *inp_tokens = (int32_t *)A(0x1000); /* [n] */
    int32_t *inp_pos = (int32_t *)A(0x7000);    /* [n] */
    if (t->ith == 0)
        for (int i = 0; i < n; i++) {
            inp_tokens[i] = s->tokens[i];
            inp_pos[i] = m->n_past + i;
        }
    kiln_barrier(t);
    float *result_output = s->logits; /* [n_logits x N_VOCAB], the caller's */
    /* inp_embd: embed_q8_0 */
    float *inp_embd = (float *)A(0x0); /* [n x 64] */
    kiln_embed_mt(t, KILN_Q8_0, inp_embd, W(0x1560), inp_tokens, n, 64, 1.0f);
    kiln_barrier(t);

    /* ---- layer 0 ---- */
    /* attn_norm-0: rms_norm_f32 */
    float *attn_norm_0 = (float *)A(0x1000); /* [n x 64] */
    kiln_rms_norm_mt(t, attn_norm_0, inp_embd, (const float *)W(0x5b40), 0.0f, 9.99999997e-07f, 64, n);
    kiln_barrier(t);
    /* q-0: matmul_x8_q8_0 */
    float *q_0 = (float *)A(0x2000); /* [n x 4 x 16] */
    void *q_0_act = A(0x3000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x0), W(0x5c40), NULL, 64, 64, attn_norm_0, n, q_0, q_0_act);
    kiln_barrier(t);
    /* k-0: matmul_x8_q8_0 */
    float *k_0 = (float *)A(0x3000); /* [n x 2 x 16] */
    void *k_0_act = A(0x3800); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x1100), W(0x6d40), NULL, 32, 64, attn_norm_0, n, k_0, k_0_act);
    kiln_barrier(t);
    /* v-0: matmul_x8_q8_0 */
    float *v_0 = (float *)A(0x3800); /* [n x 2 x 16] */
    void *v_0_act = A(0x4000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x1980), W(0x75c0), NULL, 32, 64, attn_norm_0, n, v_0, v_0_act);
    kiln_barrier(t);
    /* q_rope-0: rope_pairwise_f32 */
    float *q_rope_0 = (float *)A(0x1000); /* [n x 4 x 16] */
    kiln_rope_mt(t, q_rope_0, q_0, inp_pos, n, 4, 16, 10000.0f, 0);
    kiln_barrier(t);
    /* k_rope-0: rope_pairwise_f32 */
    float *k_rope_0 = (float *)A(0x2000); /* [n x 2 x 16] */
    kiln_rope_mt(t, k_rope_0, k_0, inp_pos, n, 2, 16, 10000.0f, 0);
    kiln_barrier(t);
    /* kv_copy-0: kv_batch_copy_f32 */
    kiln_kv_store_mt(t, KILN_F32, KV_K(0), KV_V(0), k_rope_0, v_0, inp_pos, n, KV_CAP[0], 2, 16);
    kiln_barrier(t);
    /* attn-0: attention_prefill_f32 */
    float *attn_0 = (float *)A(0x2000); /* [n x 64] */
    kiln_attention_mt(t, KILN_F32, attn_0, q_rope_0, inp_pos, n, KV_K(0), KV_V(0), KV_CAP[0], KV_WINDOW[0], 4, 2, 16, 0.25f, 1, NULL);
    kiln_barrier(t);
    /* attn_out-0: matmul_x8_q8_0 */
    float *attn_out_0 = (float *)A(0x1000); /* [n x 64] */
    void *attn_out_0_act = A(0x3000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x2200), W(0x7e40), NULL, 64, 64, attn_0, n, attn_out_0, attn_out_0_act);
    kiln_barrier(t);
    /* ffn_inp-0: add_f32 */
    float *ffn_inp_0 = (float *)A(0x6000); /* [n x 64] */
    kiln_add_mt(t, ffn_inp_0, attn_out_0, inp_embd, n * 64);
    kiln_barrier(t);
    /* ffn_norm-0: rms_norm_f32 */
    float *ffn_norm_0 = (float *)A(0x4000); /* [n x 64] */
    kiln_rms_norm_mt(t, ffn_norm_0, ffn_inp_0, (const float *)W(0x8f40), 0.0f, 9.99999997e-07f, 64, n);
    kiln_barrier(t);
    /* ffn_gate-0: matmul_x8_q8_0 */
    float *ffn_gate_0 = (float *)A(0x0); /* [n x 128] */
    void *ffn_gate_0_act = A(0x2000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x3300), W(0x9040), NULL, 128, 64, ffn_norm_0, n, ffn_gate_0, ffn_gate_0_act);
    kiln_barrier(t);
    /* ffn_up-0: matmul_x8_q8_0 */
    float *ffn_up_0 = (float *)A(0x2000); /* [n x 128] */
    void *ffn_up_0_act = A(0x5000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x5500), W(0xb240), NULL, 128, 64, ffn_norm_0, n, ffn_up_0, ffn_up_0_act);
    kiln_barrier(t);
    /* ffn_glu-0: swiglu_f32 */
    float *ffn_glu_0 = (float *)A(0x4000); /* [n x 128] */
    kiln_swiglu_mt(t, ffn_glu_0, ffn_gate_0, ffn_up_0, n * 128);
    kiln_barrier(t);
    /* ffn_out-0: matmul_x8_q8_0 */
    float *ffn_out_0 = (float *)A(0x0); /* [n x 64] */
    void *ffn_out_0_act = A(0x1000); /* [2176 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x7700), W(0xd440), NULL, 64, 128, ffn_glu_0, n, ffn_out_0, ffn_out_0_act);
    kiln_barrier(t);
    /* l_out-0: add_f32 */
    float *l_out_0 = (float *)A(0x1000); /* [n x 64] */
    kiln_add_mt(t, l_out_0, ffn_out_0, ffn_inp_0, n * 64);
    kiln_barrier(t);

    /* ---- layer 1 ---- */
    /* attn_norm-1: rms_norm_f32 */
    float *attn_norm_1 = (float *)A(0x0); /* [n x 64] */
    kiln_rms_norm_mt(t, attn_norm_1, l_out_0, (const float *)W(0xf640), 0.0f, 9.99999997e-07f, 64, n);
    kiln_barrier(t);
    /* q-1: matmul_x8_q8_0 */
    float *q_1 = (float *)A(0x2000); /* [n x 4 x 16] */
    void *q_1_act = A(0x3000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x9900), W(0xf740), NULL, 64, 64, attn_norm_1, n, q_1, q_1_act);
    kiln_barrier(t);
    /* k-1: matmul_x8_q8_0 */
    float *k_1 = (float *)A(0x3000); /* [n x 2 x 16] */
    void *k_1_act = A(0x3800); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xaa00), W(0x10840), NULL, 32, 64, attn_norm_1, n, k_1, k_1_act);
    kiln_barrier(t);
    /* v-1: matmul_x8_q8_0 */
    float *v_1 = (float *)A(0x3800); /* [n x 2 x 16] */
    void *v_1_act = A(0x4000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xb280), W(0x110c0), NULL, 32, 64, attn_norm_1, n, v_1, v_1_act);
    kiln_barrier(t);
    /* q_rope-1: rope_pairwise_f32 */
    float *q_rope_1 = (float *)A(0x0); /* [n x 4 x 16] */
    kiln_rope_mt(t, q_rope_1, q_1, inp_pos, n, 4, 16, 10000.0f, 0);
    kiln_barrier(t);
    /* k_rope-1: rope_pairwise_f32 */
    float *k_rope_1 = (float *)A(0x2000); /* [n x 2 x 16] */
    kiln_rope_mt(t, k_rope_1, k_1, inp_pos, n, 2, 16, 10000.0f, 0);
    kiln_barrier(t);
    /* kv_copy-1: kv_batch_copy_f32 */
    kiln_kv_store_mt(t, KILN_F32, KV_K(1), KV_V(1), k_rope_1, v_1, inp_pos, n, KV_CAP[1], 2, 16);
    kiln_barrier(t);
    /* attn-1: attention_prefill_f32 */
    float *attn_1 = (float *)A(0x2000); /* [n x 64] */
    kiln_attention_mt(t, KILN_F32, attn_1, q_rope_1, inp_pos, n, KV_K(1), KV_V(1), KV_CAP[1], KV_WINDOW[1], 4, 2, 16, 0.25f, 1, NULL);
    kiln_barrier(t);
    /* attn_out-1: matmul_x8_q8_0 */
    float *attn_out_1 = (float *)A(0x0); /* [n x 64] */
    void *attn_out_1_act = A(0x3000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xbb00), W(0x11940), NULL, 64, 64, attn_1, n, attn_out_1, attn_out_1_act);
    kiln_barrier(t);
    /* ffn_inp-1: add_f32 */
    float *ffn_inp_1 = (float *)A(0x6000); /* [n x 64] */
    kiln_add_mt(t, ffn_inp_1, attn_out_1, l_out_0, n * 64);
    kiln_barrier(t);
    /* ffn_norm-1: rms_norm_f32 */
    float *ffn_norm_1 = (float *)A(0x4000); /* [n x 64] */
    kiln_rms_norm_mt(t, ffn_norm_1, ffn_inp_1, (const float *)W(0x12a40), 0.0f, 9.99999997e-07f, 64, n);
    kiln_barrier(t);
    /* ffn_gate-1: matmul_x8_q8_0 */
    float *ffn_gate_1 = (float *)A(0x0); /* [n x 128] */
    void *ffn_gate_1_act = A(0x2000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xcc00), W(0x12b40), NULL, 128, 64, ffn_norm_1, n, ffn_gate_1, ffn_gate_1_act);
    kiln_barrier(t);
    /* ffn_up-1: matmul_x8_q8_0 */
    float *ffn_up_1 = (float *)A(0x2000); /* [n x 128] */
    void *ffn_up_1_act = A(0x5000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xee00), W(0x14d40), NULL, 128, 64, ffn_norm_1, n, ffn_up_1, ffn_up_1_act);
    kiln_barrier(t);
    /* ffn_glu-1: swiglu_f32 */
    float *ffn_glu_1 = (float *)A(0x4000); /* [n x 128] */
    kiln_swiglu_mt(t, ffn_glu_1, ffn_gate_1, ffn_up_1, n * 128);
    kiln_barrier(t);
    /* ffn_out-1: matmul_x8_q8_0 */
    float *ffn_out_1 = (float *)A(0x0); /* [n x 64] */
    void *ffn_out_1_act = A(0x1000); /* [2176 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x11000), W(0x16f40), NULL, 64, 128, ffn_glu_1, n, ffn_out_1, ffn_out_1_act);
    kiln_barrier(t);
    /* l_out-1: add_f32 */
    float *l_out_1 = (float *)A(0x1000); /* [n x 64] */
    kiln_add_mt(t, l_out_1, ffn_out_1, ffn_inp_1, n * 64);
    kiln_barrier(t);

    /* ---- output ---- */
    /* result_norm: rms_norm_f32 */
    float *result_norm = (float *)A(0x0); /* [n x 64] */
    kiln_rms_norm_mt(t, result_norm, l_out_1, (const float *)W(0x5a40), 0.0f, 9.99999997e-07f, 64, n);
    kiln_barrier(t);
    /* result_output: logits_q8_0 */
    void *result_output_act = A(0x1000); /* [1088 bytes] */
    kiln_matmul_mt(t, KILN_Q8_0, W(0x1560), NULL, 259, 64, result_norm + (size_t)(n - n_logits) * 64, n_logits, result_output, result_output_act);
    kiln_barrier(t);
}

/* ==== the API ================================================================================= */
static uint32_t crc32(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

/* Map the packed file, or NULL: absent (no path), written for other weights, or not needed. */
static int map_packed(const char *path, const uint8_t **map) {
    *map = NULL;
    if (!path || N_PACK == 0 || !kiln_x8_supported(PACK[0].type, PACK[0].n_out, PACK[0].n_in)) return KILN_OK;
    const int fd = open(path, O_RDONLY);
    if (fd < 0) return KILN_E_PACKED;
    struct stat st;
    const long long want = PACKED_HEADER_BYTES + (long long)PACKED_BYTES;
    void *p = fstat(fd, &st) == 0 && st.st_size == want ? mmap(NULL, (size_t)want, PROT_READ, MAP_PRIVATE, fd, 0)
                                                         : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED) return KILN_E_PACKED;
    struct { char magic[8]; uint64_t gguf_bytes; uint32_t crc, zero; uint64_t packed_bytes; } h;
    memcpy(&h, p, sizeof h);
    if (memcmp(h.magic, "KILNX8\0\1", 8) != 0 || h.gguf_bytes != (uint64_t)GGUF_BYTES ||
        h.crc != GGUF_HEADER_CRC32 || h.packed_bytes != PACKED_BYTES) {
        munmap(p, (size_t)want);
        return KILN_E_PACKED;
    }
    *map = p;
    return KILN_OK;
}

int kiln_open(kiln_model **out, const char *gguf_path, const char *packed_path, int n_threads) {
    if (!out || !gguf_path || n_threads < 1 || n_threads > 256) return KILN_E_ARG;
    *out = NULL;
    const int fd = open(gguf_path, O_RDONLY);
    if (fd < 0) return KILN_E_OPEN;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size != GGUF_BYTES) {
        close(fd);
        return KILN_E_WEIGHTS;
    }
    void *w = mmap(NULL, (size_t)GGUF_BYTES, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (w == MAP_FAILED) return KILN_E_OPEN;
    if (crc32(w, GGUF_HEADER_BYTES) != GGUF_HEADER_CRC32) {
        munmap(w, (size_t)GGUF_BYTES);
        return KILN_E_WEIGHTS;
    }
    const uint8_t *packed_map;
    const int status = map_packed(packed_path, &packed_map);
    if (status != KILN_OK) {
        munmap(w, (size_t)GGUF_BYTES);
        return status;
    }
    kiln_model *m = calloc(1, sizeof *m);
    uint8_t *kv = aligned_alloc(64, KV_BYTES), *arena = aligned_alloc(64, ARENA_BYTES);
    kiln_pool *pool = kiln_pool_create(n_threads);
    if (!m || !kv || !arena || !pool) {
        free(m), free(kv), free(arena), kiln_pool_destroy(pool);
        munmap(w, (size_t)GGUF_BYTES);
        if (packed_map) munmap((void *)packed_map, PACKED_HEADER_BYTES + (size_t)PACKED_BYTES);
        return KILN_E_NOMEM;
    }
    memset(kv, 0, KV_BYTES);
    m->weights = w, m->kv = kv, m->arena = arena, m->pool = pool;
    m->packed_map = packed_map, m->packed = packed_map ? packed_map + PACKED_HEADER_BYTES : NULL;
    *out = m;
    return KILN_OK;
}

void kiln_close(kiln_model *m) {
    if (!m) return;
    kiln_pool_destroy(m->pool);
    munmap((void *)m->weights, (size_t)GGUF_BYTES);
    if (m->packed_map) munmap((void *)m->packed_map, PACKED_HEADER_BYTES + (size_t)PACKED_BYTES);
    free(m->kv);
    free(m->arena);
    free(m);
}

int kiln_eval(kiln_model *m, const int32_t *tokens, int n_tokens, float *logits, int logits_all) {
    if (!m || !tokens || !logits || n_tokens < 1) return KILN_E_ARG;
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= N_VOCAB) return KILN_E_TOKEN;
    if (n_tokens > N_CTX - m->n_past) return KILN_E_CTX_FULL;
    for (int done = 0; done < n_tokens;) {
        const int n = n_tokens - done < PREFILL_CHUNK ? n_tokens - done : PREFILL_CHUNK;
        const int n_logits = logits_all ? n : (done + n == n_tokens);
        step_args args = {m, tokens + done, n, n_logits, logits_all ? logits + (size_t)done * N_VOCAB : logits};
        kiln_pool_run(m->pool, n == 1 ? decode_step : prefill_step, &args);
        m->n_past += n;
        done += n;
    }
    return KILN_OK;
}

int kiln_reset(kiln_model *m) {
    if (!m) return KILN_E_ARG;
    m->n_past = 0;
    return KILN_OK;
}

int kiln_rollback(kiln_model *m, int n_keep) {
    if (!m || n_keep < 0) return KILN_E_ARG;
    if (n_keep > m->n_past) return KILN_E_ROLLBACK;
    for (int l = 0; l < N_LAYER && n_keep > 0; l++) {
        /* the next query (at n_keep) needs positions n_keep - window + 1 .. n_keep - 1;
           a ring only still holds the last KV_CAP positions written */
        const int first_needed = KV_WINDOW[l] && n_keep - KV_WINDOW[l] + 1 > 0 ? n_keep - KV_WINDOW[l] + 1 : 0;
        if (first_needed < m->n_past - KV_CAP[l]) return KILN_E_ROLLBACK_RING;
    }
    m->n_past = n_keep;
    return KILN_OK;
}

int kiln_n_past(const kiln_model *m) { return m ? m->n_past : KILN_E_ARG; }
int kiln_n_threads(const kiln_model *m) { return m ? kiln_pool_size(m->pool) : KILN_E_ARG; }
int kiln_n_ctx(void) { return N_CTX; }
int kiln_n_vocab(void) { return N_VOCAB; }
long long kiln_weights_size(void) { return GGUF_BYTES; }
int kiln_rollback_limit(void) { return ROLLBACK_LIMIT; }
