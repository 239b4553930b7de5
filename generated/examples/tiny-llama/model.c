/* model.c: tiny-llama.gguf (llama), compiled by kiln 0.1.0. Generated; do not edit.
 *
 * ctx 64, KV cache f32 (K/V) in pages of 64 positions, 1 sequence(s),
 * steps of up to 16 rows, prefill chunks of 16.
 * Every offset below was fixed by kiln's memory planner; `kiln layout` prints the same map.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels_mt.h"
#include "kv_pool.h"
#include "model.h"

/* ==== configuration ======================================================================== */
#define N_VOCAB 259
#define N_CTX 64
#define N_LAYER 2
#define PREFILL_CHUNK 16 /* tokens of one sequence per step in kiln_eval */
#define N_OPS_MAX 36 /* ops of the longer step graph */

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

/* ==== KV pool: pages of PAGE_SIZE positions, one pool per layer group (kv_plan.py) ============= */
/* a page of group g: for each of its layers, K then V, each [kv_head][PAGE_SIZE][head_dim] */
#define KV_K_TYPE KILN_F32
#define KV_V_TYPE KILN_F32
#define N_SEQ 1
#define PAGE_SIZE 64
#define N_GROUPS 1
#define BATCH_TOKENS 16 /* rows one step takes */
static const kiln_kv_shape KV_SHAPE = {
    N_SEQ, N_CTX, PAGE_SIZE, N_GROUPS,
    { 0 },     /* window of each group; 0: whole context */
    { 1 },     /* pages in each group's pool */
    { 32768 },  /* bytes of one page */
};
static const int KV_GROUP[N_LAYER] = { 0, 0 };
static const size_t KV_K_OFF[N_LAYER] = { 0x0, 0x4000 }; /* within a page of the layer's group */
static const size_t KV_V_OFF[N_LAYER] = { 0x2000, 0x6000 };
/* how each layer's keys were made (rope base 0: not rotated by position; hadamard: held in Hadamard
 * blocks); a context shift rotates them again */
static const struct { float base; int neox, hadamard; } K_ROPE[N_LAYER] = { {10000.0f, 0, 0}, {10000.0f, 0, 0} };
#define N_HEAD_KV 2
#define HEAD_DIM 16

/* ==== activations: one arena, shared by the decode and batch steps ============================== */
#define ARENA_BYTES 28928 /* decode 2048, batch 28928 */

struct kiln_model {
    const uint8_t *weights; /* [GGUF_BYTES] */
    const uint8_t *packed;  /* [PACKED_BYTES] in the packed file's mapping, or NULL: x8 calls read W */
    const uint8_t *packed_map;
    kiln_kv kv;             /* the pages, their counts, the sequences' block tables and cursors */
    kiln_kv_view kv_view[N_LAYER]; /* each layer's view of its group's pool */
    uint8_t *arena;         /* [ARENA_BYTES] */
    kiln_pool *pool;        /* this instance's threads */
    int32_t n_new[N_SEQ];   /* a step's rows per sequence */
    float *mass;            /* [N_SEQ][N_CTX], or NULL: attention each position has received, while tracked (H2O) */
#ifdef KILN_PROFILE
    double op_seconds[2][N_OPS_MAX]; /* per step kind and op: wall time summed over steps (kiln bench --profile) */
    struct timespec op_clock;        /* when the last op ended */
#endif
};

/* one step's rows, laid out as the graph's inputs */
typedef struct {
    kiln_model *m;
    const int32_t *tokens, *pos, *seq, *row, *out; /* [n]; out: [n_logits] rows whose logits are wanted */
    int n, n_logits;
    float *logits; /* [n_logits x N_VOCAB], the caller's */
} step_args;

#define W(off) ((const void *)(m->weights + (off)))
#define P(off) ((const void *)(m->packed ? m->packed + (off) : NULL))
#define A(off) ((void *)(m->arena + (off)))

/* An op ends when every thread has passed the barrier after it. A profiling build (-DKILN_PROFILE)
   also charges the wall time since the previous op's end to this op. */
enum { STEP_DECODE, STEP_PREFILL };
#ifdef KILN_PROFILE
static double seconds_since(struct timespec *last) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const double dt = (double)(now.tv_sec - last->tv_sec) + 1e-9 * (double)(now.tv_nsec - last->tv_nsec);
    *last = now;
    return dt;
}
#define OPS_START() do { if (t->ith == 0) seconds_since(&m->op_clock); } while (0)
#define OP_DONE(step, i) do { kiln_barrier(t); if (t->ith == 0) m->op_seconds[step][i] += seconds_since(&m->op_clock); } while (0)
#else
#define OPS_START() ((void)0)
#define OP_DONE(step, i) kiln_barrier(t)
#endif

/* ==== decode step: up to 1 row(s), 36 ops ===================================== */
/* every thread of the pool runs this; kernels split their work by t->ith / t->nth */
static void decode_step(void *arg, const kiln_thread *t) {
    const step_args *s = arg;
    kiln_model *m = s->m;
    const int n = s->n, n_logits = s->n_logits;
    int32_t *inp_tokens = (int32_t *)A(0x0); /* [n] */
    int32_t *inp_pos = (int32_t *)A(0x740); /* [n] */
    int32_t *inp_seq = (int32_t *)A(0x7c0); /* [n] */
    int32_t *inp_row = (int32_t *)A(0x780); /* [n] */
    int32_t *inp_out = (int32_t *)A(0x700); /* [n] */
    if (t->ith == 0) {
        memcpy(inp_tokens, s->tokens, (size_t)n * sizeof(int32_t));
        memcpy(inp_pos, s->pos, (size_t)n * sizeof(int32_t));
        memcpy(inp_seq, s->seq, (size_t)n * sizeof(int32_t));
        memcpy(inp_row, s->row, (size_t)n * sizeof(int32_t));
        memcpy(inp_out, s->out, (size_t)n_logits * sizeof(int32_t));
    }
    kiln_barrier(t);
    OPS_START();
    float *result_output = s->logits; /* [n_logits x N_VOCAB], the caller's */
    /* inp_embd: embed_q8_0 */
    float *inp_embd = (float *)A(0x140); /* [n x 64] */
    kiln_embed_mt(t, KILN_Q8_0, inp_embd, W(0x1560), inp_tokens, n, 64, 1.0f);
    OP_DONE(STEP_DECODE, 0);

    /* ---- layer 0 ---- */
    /* attn_norm-0: rms_norm_f32 */
    float *attn_norm_0 = (float *)A(0x0); /* [n x 64] */
    kiln_rms_norm_mt(t, attn_norm_0, inp_embd, (const float *)W(0x5b40), 0.0f, 9.99999997e-07f, 64, n);
    OP_DONE(STEP_DECODE, 1);
    /* q-0: matmul_x8_q8_0 */
    float *q_0 = (float *)A(0x240); /* [n x 4 x 16] */
    void *q_0_act = A(0x340); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x0), W(0x5c40), NULL, 64, 64, attn_norm_0, n, q_0, q_0_act);
    OP_DONE(STEP_DECODE, 2);
    /* k-0: matmul_x8_q8_0 */
    float *k_0 = (float *)A(0x440); /* [n x 2 x 16] */
    void *k_0_act = A(0x340); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x1100), W(0x6d40), NULL, 32, 64, attn_norm_0, n, k_0, k_0_act);
    OP_DONE(STEP_DECODE, 3);
    /* v-0: matmul_x8_q8_0 */
    float *v_0 = (float *)A(0x4c0); /* [n x 2 x 16] */
    void *v_0_act = A(0x340); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x1980), W(0x75c0), NULL, 32, 64, attn_norm_0, n, v_0, v_0_act);
    OP_DONE(STEP_DECODE, 4);
    /* q_rope-0: rope_pairwise_f32 */
    float *q_rope_0 = (float *)A(0x340); /* [n x 4 x 16] */
    kiln_rope_mt(t, q_rope_0, q_0, inp_pos, n, 4, 16, 10000.0f, 0);
    OP_DONE(STEP_DECODE, 5);
    /* k_rope-0: rope_pairwise_f32 */
    float *k_rope_0 = (float *)A(0x0); /* [n x 2 x 16] */
    kiln_rope_mt(t, k_rope_0, k_0, inp_pos, n, 2, 16, 10000.0f, 0);
    OP_DONE(STEP_DECODE, 6);
    /* kv_store-0: kv_store_f32 */
    kiln_kv_store_mt(t, &m->kv_view[0], k_rope_0, v_0, inp_seq, inp_row, n, 2, 16);
    OP_DONE(STEP_DECODE, 7);
    /* attn-0: attention_decode_f32 */
    float *attn_0 = (float *)A(0x240); /* [n x 64] */
    void *attn_0_spans = A(0x0); /* [288 bytes] */
    kiln_attention_mt(t, attn_0, q_rope_0, inp_seq, inp_row, n, &m->kv_view[0], 4, 2, 16, 0.25f, attn_0_spans, 1);
    OP_DONE(STEP_DECODE, 8);
    /* attn_out-0: matmul_x8_q8_0 */
    float *attn_out_0 = (float *)A(0x0); /* [n x 64] */
    void *attn_out_0_act = A(0x340); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x2200), W(0x7e40), NULL, 64, 64, attn_0, n, attn_out_0, attn_out_0_act);
    OP_DONE(STEP_DECODE, 9);
    /* ffn_inp-0: add_f32 */
    float *ffn_inp_0 = (float *)A(0x600); /* [n x 64] */
    kiln_add_mt(t, ffn_inp_0, attn_out_0, inp_embd, n * 64);
    OP_DONE(STEP_DECODE, 10);
    /* ffn_norm-0: rms_norm_f32 */
    float *ffn_norm_0 = (float *)A(0x400); /* [n x 64] */
    kiln_rms_norm_mt(t, ffn_norm_0, ffn_inp_0, (const float *)W(0x8f40), 0.0f, 9.99999997e-07f, 64, n);
    OP_DONE(STEP_DECODE, 11);
    /* ffn_gate-0: matmul_x8_q8_0 */
    float *ffn_gate_0 = (float *)A(0x0); /* [n x 128] */
    void *ffn_gate_0_act = A(0x200); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x3300), W(0x9040), NULL, 128, 64, ffn_norm_0, n, ffn_gate_0, ffn_gate_0_act);
    OP_DONE(STEP_DECODE, 12);
    /* ffn_up-0: matmul_x8_q8_0 */
    float *ffn_up_0 = (float *)A(0x200); /* [n x 128] */
    void *ffn_up_0_act = A(0x500); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x5500), W(0xb240), NULL, 128, 64, ffn_norm_0, n, ffn_up_0, ffn_up_0_act);
    OP_DONE(STEP_DECODE, 13);
    /* ffn_glu-0: swiglu_f32 */
    float *ffn_glu_0 = (float *)A(0x400); /* [n x 128] */
    kiln_swiglu_mt(t, ffn_glu_0, ffn_gate_0, ffn_up_0, n * 128);
    OP_DONE(STEP_DECODE, 14);
    /* ffn_out-0: matmul_x8_q8_0 */
    float *ffn_out_0 = (float *)A(0x0); /* [n x 64] */
    void *ffn_out_0_act = A(0x100); /* [136 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x7700), W(0xd440), NULL, 64, 128, ffn_glu_0, n, ffn_out_0, ffn_out_0_act);
    OP_DONE(STEP_DECODE, 15);
    /* l_out-0: add_f32 */
    float *l_out_0 = (float *)A(0x140); /* [n x 64] */
    kiln_add_mt(t, l_out_0, ffn_out_0, ffn_inp_0, n * 64);
    OP_DONE(STEP_DECODE, 16);

    /* ---- layer 1 ---- */
    /* attn_norm-1: rms_norm_f32 */
    float *attn_norm_1 = (float *)A(0x0); /* [n x 64] */
    kiln_rms_norm_mt(t, attn_norm_1, l_out_0, (const float *)W(0xf640), 0.0f, 9.99999997e-07f, 64, n);
    OP_DONE(STEP_DECODE, 17);
    /* q-1: matmul_x8_q8_0 */
    float *q_1 = (float *)A(0x240); /* [n x 4 x 16] */
    void *q_1_act = A(0x340); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x9900), W(0xf740), NULL, 64, 64, attn_norm_1, n, q_1, q_1_act);
    OP_DONE(STEP_DECODE, 18);
    /* k-1: matmul_x8_q8_0 */
    float *k_1 = (float *)A(0x440); /* [n x 2 x 16] */
    void *k_1_act = A(0x340); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xaa00), W(0x10840), NULL, 32, 64, attn_norm_1, n, k_1, k_1_act);
    OP_DONE(STEP_DECODE, 19);
    /* v-1: matmul_x8_q8_0 */
    float *v_1 = (float *)A(0x4c0); /* [n x 2 x 16] */
    void *v_1_act = A(0x340); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xb280), W(0x110c0), NULL, 32, 64, attn_norm_1, n, v_1, v_1_act);
    OP_DONE(STEP_DECODE, 20);
    /* q_rope-1: rope_pairwise_f32 */
    float *q_rope_1 = (float *)A(0x340); /* [n x 4 x 16] */
    kiln_rope_mt(t, q_rope_1, q_1, inp_pos, n, 4, 16, 10000.0f, 0);
    OP_DONE(STEP_DECODE, 21);
    /* k_rope-1: rope_pairwise_f32 */
    float *k_rope_1 = (float *)A(0x0); /* [n x 2 x 16] */
    kiln_rope_mt(t, k_rope_1, k_1, inp_pos, n, 2, 16, 10000.0f, 0);
    OP_DONE(STEP_DECODE, 22);
    /* kv_store-1: kv_store_f32 */
    kiln_kv_store_mt(t, &m->kv_view[1], k_rope_1, v_1, inp_seq, inp_row, n, 2, 16);
    OP_DONE(STEP_DECODE, 23);
    /* attn-1: attention_decode_f32 */
    float *attn_1 = (float *)A(0x240); /* [n x 64] */
    void *attn_1_spans = A(0x0); /* [288 bytes] */
    kiln_attention_mt(t, attn_1, q_rope_1, inp_seq, inp_row, n, &m->kv_view[1], 4, 2, 16, 0.25f, attn_1_spans, 1);
    OP_DONE(STEP_DECODE, 24);
    /* attn_out-1: matmul_x8_q8_0 */
    float *attn_out_1 = (float *)A(0x0); /* [n x 64] */
    void *attn_out_1_act = A(0x340); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xbb00), W(0x11940), NULL, 64, 64, attn_1, n, attn_out_1, attn_out_1_act);
    OP_DONE(STEP_DECODE, 25);
    /* ffn_inp-1: add_f32 */
    float *ffn_inp_1 = (float *)A(0x600); /* [n x 64] */
    kiln_add_mt(t, ffn_inp_1, attn_out_1, l_out_0, n * 64);
    OP_DONE(STEP_DECODE, 26);
    /* ffn_norm-1: rms_norm_f32 */
    float *ffn_norm_1 = (float *)A(0x400); /* [n x 64] */
    kiln_rms_norm_mt(t, ffn_norm_1, ffn_inp_1, (const float *)W(0x12a40), 0.0f, 9.99999997e-07f, 64, n);
    OP_DONE(STEP_DECODE, 27);
    /* ffn_gate-1: matmul_x8_q8_0 */
    float *ffn_gate_1 = (float *)A(0x0); /* [n x 128] */
    void *ffn_gate_1_act = A(0x200); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xcc00), W(0x12b40), NULL, 128, 64, ffn_norm_1, n, ffn_gate_1, ffn_gate_1_act);
    OP_DONE(STEP_DECODE, 28);
    /* ffn_up-1: matmul_x8_q8_0 */
    float *ffn_up_1 = (float *)A(0x200); /* [n x 128] */
    void *ffn_up_1_act = A(0x500); /* [68 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xee00), W(0x14d40), NULL, 128, 64, ffn_norm_1, n, ffn_up_1, ffn_up_1_act);
    OP_DONE(STEP_DECODE, 29);
    /* ffn_glu-1: swiglu_f32 */
    float *ffn_glu_1 = (float *)A(0x400); /* [n x 128] */
    kiln_swiglu_mt(t, ffn_glu_1, ffn_gate_1, ffn_up_1, n * 128);
    OP_DONE(STEP_DECODE, 30);
    /* ffn_out-1: matmul_x8_q8_0 */
    float *ffn_out_1 = (float *)A(0x0); /* [n x 64] */
    void *ffn_out_1_act = A(0x100); /* [136 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x11000), W(0x16f40), NULL, 64, 128, ffn_glu_1, n, ffn_out_1, ffn_out_1_act);
    OP_DONE(STEP_DECODE, 31);
    /* l_out-1: add_f32 */
    float *l_out_1 = (float *)A(0x100); /* [n x 64] */
    kiln_add_mt(t, l_out_1, ffn_out_1, ffn_inp_1, n * 64);
    OP_DONE(STEP_DECODE, 32);

    /* ---- output ---- */
    /* result_norm: rms_norm_f32 */
    float *result_norm = (float *)A(0x0); /* [n x 64] */
    kiln_rms_norm_mt(t, result_norm, l_out_1, (const float *)W(0x5a40), 0.0f, 9.99999997e-07f, 64, n);
    OP_DONE(STEP_DECODE, 33);
    /* result_rows: select_rows_f32 */
    float *result_rows = (float *)A(0x100); /* [n x 64] */
    kiln_select_rows_mt(t, result_rows, result_norm, inp_out, n_logits, 64);
    OP_DONE(STEP_DECODE, 34);
    /* result_output: logits_q8_0 */
    void *result_output_act = A(0x0); /* [68 bytes] */
    kiln_matmul_mt(t, KILN_Q8_0, W(0x1560), NULL, 259, 64, result_rows, n_logits, result_output, result_output_act);
    OP_DONE(STEP_DECODE, 35);
}

/* ==== prefill step: up to 16 row(s), 36 ops ===================================== */
/* every thread of the pool runs this; kernels split their work by t->ith / t->nth */
static void prefill_step(void *arg, const kiln_thread *t) {
    const step_args *s = arg;
    kiln_model *m = s->m;
    const int n = s->n, n_logits = s->n_logits;
    int32_t *inp_tokens = (int32_t *)A(0x1000); /* [n] */
    int32_t *inp_pos = (int32_t *)A(0x7040); /* [n] */
    int32_t *inp_seq = (int32_t *)A(0x70c0); /* [n] */
    int32_t *inp_row = (int32_t *)A(0x7080); /* [n] */
    int32_t *inp_out = (int32_t *)A(0x7000); /* [n] */
    if (t->ith == 0) {
        memcpy(inp_tokens, s->tokens, (size_t)n * sizeof(int32_t));
        memcpy(inp_pos, s->pos, (size_t)n * sizeof(int32_t));
        memcpy(inp_seq, s->seq, (size_t)n * sizeof(int32_t));
        memcpy(inp_row, s->row, (size_t)n * sizeof(int32_t));
        memcpy(inp_out, s->out, (size_t)n_logits * sizeof(int32_t));
    }
    kiln_barrier(t);
    OPS_START();
    float *result_output = s->logits; /* [n_logits x N_VOCAB], the caller's */
    /* inp_embd: embed_q8_0 */
    float *inp_embd = (float *)A(0x0); /* [n x 64] */
    kiln_embed_mt(t, KILN_Q8_0, inp_embd, W(0x1560), inp_tokens, n, 64, 1.0f);
    OP_DONE(STEP_PREFILL, 0);

    /* ---- layer 0 ---- */
    /* attn_norm-0: rms_norm_f32 */
    float *attn_norm_0 = (float *)A(0x1000); /* [n x 64] */
    kiln_rms_norm_mt(t, attn_norm_0, inp_embd, (const float *)W(0x5b40), 0.0f, 9.99999997e-07f, 64, n);
    OP_DONE(STEP_PREFILL, 1);
    /* q-0: matmul_x8_q8_0 */
    float *q_0 = (float *)A(0x2000); /* [n x 4 x 16] */
    void *q_0_act = A(0x3000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x0), W(0x5c40), NULL, 64, 64, attn_norm_0, n, q_0, q_0_act);
    OP_DONE(STEP_PREFILL, 2);
    /* k-0: matmul_x8_q8_0 */
    float *k_0 = (float *)A(0x3000); /* [n x 2 x 16] */
    void *k_0_act = A(0x3800); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x1100), W(0x6d40), NULL, 32, 64, attn_norm_0, n, k_0, k_0_act);
    OP_DONE(STEP_PREFILL, 3);
    /* v-0: matmul_x8_q8_0 */
    float *v_0 = (float *)A(0x3800); /* [n x 2 x 16] */
    void *v_0_act = A(0x4000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x1980), W(0x75c0), NULL, 32, 64, attn_norm_0, n, v_0, v_0_act);
    OP_DONE(STEP_PREFILL, 4);
    /* q_rope-0: rope_pairwise_f32 */
    float *q_rope_0 = (float *)A(0x1000); /* [n x 4 x 16] */
    kiln_rope_mt(t, q_rope_0, q_0, inp_pos, n, 4, 16, 10000.0f, 0);
    OP_DONE(STEP_PREFILL, 5);
    /* k_rope-0: rope_pairwise_f32 */
    float *k_rope_0 = (float *)A(0x2000); /* [n x 2 x 16] */
    kiln_rope_mt(t, k_rope_0, k_0, inp_pos, n, 2, 16, 10000.0f, 0);
    OP_DONE(STEP_PREFILL, 6);
    /* kv_copy-0: kv_batch_copy_f32 */
    kiln_kv_store_mt(t, &m->kv_view[0], k_rope_0, v_0, inp_seq, inp_row, n, 2, 16);
    OP_DONE(STEP_PREFILL, 7);
    /* attn-0: attention_prefill_f32 */
    float *attn_0 = (float *)A(0x2000); /* [n x 64] */
    void *attn_0_spans = A(0x3000); /* [288 bytes] */
    kiln_attention_mt(t, attn_0, q_rope_0, inp_seq, inp_row, n, &m->kv_view[0], 4, 2, 16, 0.25f, attn_0_spans, 1);
    OP_DONE(STEP_PREFILL, 8);
    /* attn_out-0: matmul_x8_q8_0 */
    float *attn_out_0 = (float *)A(0x1000); /* [n x 64] */
    void *attn_out_0_act = A(0x3000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x2200), W(0x7e40), NULL, 64, 64, attn_0, n, attn_out_0, attn_out_0_act);
    OP_DONE(STEP_PREFILL, 9);
    /* ffn_inp-0: add_f32 */
    float *ffn_inp_0 = (float *)A(0x6000); /* [n x 64] */
    kiln_add_mt(t, ffn_inp_0, attn_out_0, inp_embd, n * 64);
    OP_DONE(STEP_PREFILL, 10);
    /* ffn_norm-0: rms_norm_f32 */
    float *ffn_norm_0 = (float *)A(0x4000); /* [n x 64] */
    kiln_rms_norm_mt(t, ffn_norm_0, ffn_inp_0, (const float *)W(0x8f40), 0.0f, 9.99999997e-07f, 64, n);
    OP_DONE(STEP_PREFILL, 11);
    /* ffn_gate-0: matmul_x8_q8_0 */
    float *ffn_gate_0 = (float *)A(0x0); /* [n x 128] */
    void *ffn_gate_0_act = A(0x2000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x3300), W(0x9040), NULL, 128, 64, ffn_norm_0, n, ffn_gate_0, ffn_gate_0_act);
    OP_DONE(STEP_PREFILL, 12);
    /* ffn_up-0: matmul_x8_q8_0 */
    float *ffn_up_0 = (float *)A(0x2000); /* [n x 128] */
    void *ffn_up_0_act = A(0x5000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x5500), W(0xb240), NULL, 128, 64, ffn_norm_0, n, ffn_up_0, ffn_up_0_act);
    OP_DONE(STEP_PREFILL, 13);
    /* ffn_glu-0: swiglu_f32 */
    float *ffn_glu_0 = (float *)A(0x4000); /* [n x 128] */
    kiln_swiglu_mt(t, ffn_glu_0, ffn_gate_0, ffn_up_0, n * 128);
    OP_DONE(STEP_PREFILL, 14);
    /* ffn_out-0: matmul_x8_q8_0 */
    float *ffn_out_0 = (float *)A(0x0); /* [n x 64] */
    void *ffn_out_0_act = A(0x1000); /* [2176 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x7700), W(0xd440), NULL, 64, 128, ffn_glu_0, n, ffn_out_0, ffn_out_0_act);
    OP_DONE(STEP_PREFILL, 15);
    /* l_out-0: add_f32 */
    float *l_out_0 = (float *)A(0x1000); /* [n x 64] */
    kiln_add_mt(t, l_out_0, ffn_out_0, ffn_inp_0, n * 64);
    OP_DONE(STEP_PREFILL, 16);

    /* ---- layer 1 ---- */
    /* attn_norm-1: rms_norm_f32 */
    float *attn_norm_1 = (float *)A(0x0); /* [n x 64] */
    kiln_rms_norm_mt(t, attn_norm_1, l_out_0, (const float *)W(0xf640), 0.0f, 9.99999997e-07f, 64, n);
    OP_DONE(STEP_PREFILL, 17);
    /* q-1: matmul_x8_q8_0 */
    float *q_1 = (float *)A(0x2000); /* [n x 4 x 16] */
    void *q_1_act = A(0x3000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x9900), W(0xf740), NULL, 64, 64, attn_norm_1, n, q_1, q_1_act);
    OP_DONE(STEP_PREFILL, 18);
    /* k-1: matmul_x8_q8_0 */
    float *k_1 = (float *)A(0x3000); /* [n x 2 x 16] */
    void *k_1_act = A(0x3800); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xaa00), W(0x10840), NULL, 32, 64, attn_norm_1, n, k_1, k_1_act);
    OP_DONE(STEP_PREFILL, 19);
    /* v-1: matmul_x8_q8_0 */
    float *v_1 = (float *)A(0x3800); /* [n x 2 x 16] */
    void *v_1_act = A(0x4000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xb280), W(0x110c0), NULL, 32, 64, attn_norm_1, n, v_1, v_1_act);
    OP_DONE(STEP_PREFILL, 20);
    /* q_rope-1: rope_pairwise_f32 */
    float *q_rope_1 = (float *)A(0x0); /* [n x 4 x 16] */
    kiln_rope_mt(t, q_rope_1, q_1, inp_pos, n, 4, 16, 10000.0f, 0);
    OP_DONE(STEP_PREFILL, 21);
    /* k_rope-1: rope_pairwise_f32 */
    float *k_rope_1 = (float *)A(0x2000); /* [n x 2 x 16] */
    kiln_rope_mt(t, k_rope_1, k_1, inp_pos, n, 2, 16, 10000.0f, 0);
    OP_DONE(STEP_PREFILL, 22);
    /* kv_copy-1: kv_batch_copy_f32 */
    kiln_kv_store_mt(t, &m->kv_view[1], k_rope_1, v_1, inp_seq, inp_row, n, 2, 16);
    OP_DONE(STEP_PREFILL, 23);
    /* attn-1: attention_prefill_f32 */
    float *attn_1 = (float *)A(0x2000); /* [n x 64] */
    void *attn_1_spans = A(0x3000); /* [288 bytes] */
    kiln_attention_mt(t, attn_1, q_rope_1, inp_seq, inp_row, n, &m->kv_view[1], 4, 2, 16, 0.25f, attn_1_spans, 1);
    OP_DONE(STEP_PREFILL, 24);
    /* attn_out-1: matmul_x8_q8_0 */
    float *attn_out_1 = (float *)A(0x0); /* [n x 64] */
    void *attn_out_1_act = A(0x3000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xbb00), W(0x11940), NULL, 64, 64, attn_1, n, attn_out_1, attn_out_1_act);
    OP_DONE(STEP_PREFILL, 25);
    /* ffn_inp-1: add_f32 */
    float *ffn_inp_1 = (float *)A(0x6000); /* [n x 64] */
    kiln_add_mt(t, ffn_inp_1, attn_out_1, l_out_0, n * 64);
    OP_DONE(STEP_PREFILL, 26);
    /* ffn_norm-1: rms_norm_f32 */
    float *ffn_norm_1 = (float *)A(0x4000); /* [n x 64] */
    kiln_rms_norm_mt(t, ffn_norm_1, ffn_inp_1, (const float *)W(0x12a40), 0.0f, 9.99999997e-07f, 64, n);
    OP_DONE(STEP_PREFILL, 27);
    /* ffn_gate-1: matmul_x8_q8_0 */
    float *ffn_gate_1 = (float *)A(0x0); /* [n x 128] */
    void *ffn_gate_1_act = A(0x2000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xcc00), W(0x12b40), NULL, 128, 64, ffn_norm_1, n, ffn_gate_1, ffn_gate_1_act);
    OP_DONE(STEP_PREFILL, 28);
    /* ffn_up-1: matmul_x8_q8_0 */
    float *ffn_up_1 = (float *)A(0x2000); /* [n x 128] */
    void *ffn_up_1_act = A(0x5000); /* [1088 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0xee00), W(0x14d40), NULL, 128, 64, ffn_norm_1, n, ffn_up_1, ffn_up_1_act);
    OP_DONE(STEP_PREFILL, 29);
    /* ffn_glu-1: swiglu_f32 */
    float *ffn_glu_1 = (float *)A(0x4000); /* [n x 128] */
    kiln_swiglu_mt(t, ffn_glu_1, ffn_gate_1, ffn_up_1, n * 128);
    OP_DONE(STEP_PREFILL, 30);
    /* ffn_out-1: matmul_x8_q8_0 */
    float *ffn_out_1 = (float *)A(0x0); /* [n x 64] */
    void *ffn_out_1_act = A(0x1000); /* [2176 bytes] */
    kiln_matmul_x8_mt(t, KILN_Q8_0, P(0x11000), W(0x16f40), NULL, 64, 128, ffn_glu_1, n, ffn_out_1, ffn_out_1_act);
    OP_DONE(STEP_PREFILL, 31);
    /* l_out-1: add_f32 */
    float *l_out_1 = (float *)A(0x1000); /* [n x 64] */
    kiln_add_mt(t, l_out_1, ffn_out_1, ffn_inp_1, n * 64);
    OP_DONE(STEP_PREFILL, 32);

    /* ---- output ---- */
    /* result_norm: rms_norm_f32 */
    float *result_norm = (float *)A(0x0); /* [n x 64] */
    kiln_rms_norm_mt(t, result_norm, l_out_1, (const float *)W(0x5a40), 0.0f, 9.99999997e-07f, 64, n);
    OP_DONE(STEP_PREFILL, 33);
    /* result_rows: select_rows_f32 */
    float *result_rows = (float *)A(0x1000); /* [n x 64] */
    kiln_select_rows_mt(t, result_rows, result_norm, inp_out, n_logits, 64);
    OP_DONE(STEP_PREFILL, 34);
    /* result_output: logits_q8_0 */
    void *result_output_act = A(0x0); /* [1088 bytes] */
    kiln_matmul_mt(t, KILN_Q8_0, W(0x1560), NULL, 259, 64, result_rows, n_logits, result_output, result_output_act);
    OP_DONE(STEP_PREFILL, 35);
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

int kiln_reads_packed(void) { return N_PACK > 0 && kiln_x8_supported(PACK[0].type, PACK[0].n_out, PACK[0].n_in); }

/* Map the packed file, or NULL: absent (no path), written for other weights, or not needed. */
static int map_packed(const char *path, const uint8_t **map) {
    *map = NULL;
    if (!path || !kiln_reads_packed()) return KILN_OK;
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
    uint8_t *arena = aligned_alloc(64, ARENA_BYTES);
    kiln_pool *pool = kiln_pool_create(n_threads);
    if (!m || !arena || !pool || kiln_kv_init(&m->kv, &KV_SHAPE) != 0) {
        if (m) kiln_kv_free(&m->kv);
        free(m), free(arena), kiln_pool_destroy(pool);
        munmap(w, (size_t)GGUF_BYTES);
        if (packed_map) munmap((void *)packed_map, PACKED_HEADER_BYTES + (size_t)PACKED_BYTES);
        return KILN_E_NOMEM;
    }
    for (int l = 0; l < N_LAYER; l++) {
        const kiln_kv_group *g = &m->kv.g[KV_GROUP[l]];
        m->kv_view[l] = (kiln_kv_view){g->pages, g->page_bytes, KV_K_OFF[l], KV_V_OFF[l], KV_K_TYPE, KV_V_TYPE,
                                       g->tables, m->kv.max_blocks, PAGE_SIZE, g->window};
    }
    m->weights = w, m->arena = arena, m->pool = pool;
    m->packed_map = packed_map, m->packed = packed_map ? packed_map + PACKED_HEADER_BYTES : NULL;
    *out = m;
    return KILN_OK;
}

void kiln_close(kiln_model *m) {
    if (!m) return;
    kiln_pool_destroy(m->pool);
    munmap((void *)m->weights, (size_t)GGUF_BYTES);
    if (m->packed_map) munmap((void *)m->packed_map, PACKED_HEADER_BYTES + (size_t)PACKED_BYTES);
    kiln_kv_free(&m->kv);
    free(m->arena);
    free(m->mass);
    free(m);
}

/* Check a batch and count its rows per sequence into m->n_new; nothing changes on failure. */
static int check_batch(kiln_model *m, const kiln_batch *b) {
    if (!b || !b->token || !b->seq) return KILN_E_ARG;
    if (b->n < 1 || b->n > BATCH_TOKENS) return KILN_E_BATCH;
    memset(m->n_new, 0, sizeof m->n_new);
    for (int i = 0; i < b->n; i++) {
        if (kiln_kv_check(&m->kv, b->seq[i]) != KILN_OK) return KILN_E_SEQ;
        if (b->token[i] < 0 || b->token[i] >= N_VOCAB) return KILN_E_TOKEN;
        if (b->pos && b->pos[i] < 0) return KILN_E_ARG;
        if (++m->n_new[b->seq[i]] > N_CTX - m->kv.n_past[b->seq[i]]) return KILN_E_CTX_FULL;
    }
    return KILN_OK;
}

int kiln_step(kiln_model *m, const kiln_batch *b, float *logits) {
    if (!m || !logits) return KILN_E_ARG;
    int status = check_batch(m, b);
    if (status == KILN_OK) status = kiln_kv_reserve(&m->kv, m->n_new);
    if (status != KILN_OK) return status;
    int32_t pos[BATCH_TOKENS], row[BATCH_TOKENS], out[BATCH_TOKENS], seen[N_SEQ] = {0};
    int n_logits = 0;
    for (int i = 0; i < b->n; i++) {
        row[i] = m->kv.n_past[b->seq[i]] + seen[b->seq[i]]++;
        pos[i] = b->pos ? b->pos[i] : row[i];
        if (b->logits ? b->logits[i] != 0 : i == b->n - 1) out[n_logits++] = i;
    }
    if (m->kv_view[0].mass)
        for (int i = 0; i < b->n; i++) m->mass[(size_t)b->seq[i] * N_CTX + row[i]] = 0.0f; /* new positions start at 0 */
    step_args args = {m, b->token, pos, b->seq, row, out, b->n, n_logits, logits};
    kiln_pool_run(m->pool, b->n == 1 ? decode_step : prefill_step, &args);
    kiln_kv_advance(&m->kv, m->n_new);
    return KILN_OK;
}

int kiln_eval(kiln_model *m, int seq, const int32_t *tokens, int n_tokens, float *logits, int logits_all) {
    if (!m || !tokens || !logits || n_tokens < 1) return KILN_E_ARG;
    if (kiln_kv_check(&m->kv, seq) != KILN_OK) return KILN_E_SEQ;
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= N_VOCAB) return KILN_E_TOKEN;
    if (n_tokens > N_CTX - m->kv.n_past[seq]) return KILN_E_CTX_FULL;
    if (!kiln_kv_can_append(&m->kv, seq, n_tokens)) return KILN_E_KV_FULL;
    int32_t seqs[PREFILL_CHUNK];
    int8_t want[PREFILL_CHUNK];
    for (int i = 0; i < PREFILL_CHUNK; i++) seqs[i] = seq, want[i] = (int8_t)logits_all;
    for (int done = 0; done < n_tokens;) {
        const int n = n_tokens - done < PREFILL_CHUNK ? n_tokens - done : PREFILL_CHUNK;
        want[n - 1] = 1; /* the last row's logits always; every row's when logits_all */
        const kiln_batch b = {n, tokens + done, seqs, NULL, want};
        const int status = kiln_step(m, &b, logits_all ? logits + (size_t)done * N_VOCAB : logits);
        want[n - 1] = (int8_t)logits_all;
        if (status != KILN_OK) return status; /* not reached: everything was checked above */
        done += n;
    }
    return KILN_OK;
}

int kiln_seq_open(kiln_model *m) { return m ? kiln_kv_open(&m->kv) : KILN_E_ARG; }

int kiln_seq_close(kiln_model *m, int seq) {
    if (!m) return KILN_E_ARG;
    if (kiln_kv_check(&m->kv, seq) != KILN_OK) return KILN_E_SEQ;
    kiln_kv_close(&m->kv, seq);
    return KILN_OK;
}

int kiln_seq_fork(kiln_model *m, int seq) { return m ? kiln_kv_fork(&m->kv, seq) : KILN_E_ARG; }
int kiln_seq_rollback(kiln_model *m, int seq, int n_keep) { return m ? kiln_kv_rollback(&m->kv, seq, n_keep) : KILN_E_ARG; }
int kiln_seq_reset(kiln_model *m, int seq) { return kiln_seq_rollback(m, seq, 0); }

int kiln_seq_n_past(const kiln_model *m, int seq) {
    if (!m) return KILN_E_ARG;
    return kiln_kv_check(&m->kv, seq) == KILN_OK ? m->kv.n_past[seq] : KILN_E_SEQ;
}

/* kiln_seq_keep: every thread moves the rows of its share of the layers */
typedef struct {
    kiln_model *m;
    int seq, first_changed, n;
    const int32_t *keep;
} keep_args;

static void move_rows(void *arg, const kiln_thread *t) {
    const keep_args *a = arg;
    for (int l = t->ith; l < N_LAYER; l += t->nth)
        kiln_kv_move_rows(&a->m->kv_view[l], a->seq, a->keep, a->first_changed, a->n, N_HEAD_KV, HEAD_DIM,
                          K_ROPE[l].base, K_ROPE[l].neox, K_ROPE[l].hadamard);
}

int kiln_seq_keep(kiln_model *m, int seq, const int32_t *keep, int n) {
    if (!m) return KILN_E_ARG;
    keep_args args = {m, seq, 0, n, keep};
    const int status = kiln_kv_keep_begin(&m->kv, seq, keep, n, &args.first_changed);
    if (status != KILN_OK) return status;
    if (args.first_changed < n) kiln_pool_run(m->pool, move_rows, &args);
    if (m->mass)
        for (int r = args.first_changed; r < n; r++) m->mass[(size_t)seq * N_CTX + r] = m->mass[(size_t)seq * N_CTX + keep[r]];
    kiln_kv_keep_end(&m->kv, seq, n);
    return KILN_OK;
}

int kiln_track_attention(kiln_model *m, int on) {
    if (!m) return KILN_E_ARG;
    if (on && !m->mass && !(m->mass = calloc((size_t)N_SEQ * N_CTX, sizeof(float)))) return KILN_E_NOMEM;
    for (int l = 0; l < N_LAYER; l++) m->kv_view[l].mass = on ? m->mass : NULL, m->kv_view[l].mass_stride = N_CTX;
    return KILN_OK;
}

int kiln_seq_attention(const kiln_model *m, int seq, float *out, int n) {
    if (!m || !out) return KILN_E_ARG;
    if (kiln_kv_check(&m->kv, seq) != KILN_OK) return KILN_E_SEQ;
    if (!m->kv_view[0].mass || n != m->kv.n_past[seq]) return KILN_E_ARG;
    memcpy(out, m->mass + (size_t)seq * N_CTX, (size_t)n * sizeof(float));
    return KILN_OK;
}

int kiln_seq_share(kiln_model *m, int seq, int first, int n_blocks, int32_t *pages) {
    return m ? kiln_kv_share(&m->kv, seq, first, n_blocks, pages) : KILN_E_ARG;
}
int kiln_seq_attach(kiln_model *m, int seq, const int32_t *pages, int n_blocks) {
    return m ? kiln_kv_attach(&m->kv, seq, pages, n_blocks) : KILN_E_ARG;
}
int kiln_pages_release(kiln_model *m, const int32_t *pages, int n_blocks) {
    return m ? kiln_kv_release(&m->kv, pages, n_blocks) : KILN_E_ARG;
}

size_t kiln_seq_state_size(const kiln_model *m, int seq) { return m ? kiln_kv_state_size(&m->kv, seq) : 0; }
int kiln_seq_state_save(const kiln_model *m, int seq, uint8_t *buf, size_t size) {
    return m ? kiln_kv_state_save(&m->kv, seq, buf, size) : KILN_E_ARG;
}
int kiln_seq_state_load(kiln_model *m, int seq, const uint8_t *buf, size_t size) {
    return m ? kiln_kv_state_load(&m->kv, seq, buf, size) : KILN_E_ARG;
}

int kiln_pages_used(const kiln_model *m, int group) { return m ? kiln_kv_pages_used(&m->kv, group) : KILN_E_ARG; }
int kiln_pages_total(int group) { return group >= 0 && group < N_GROUPS ? KV_SHAPE.n_pages[group] : KILN_E_ARG; }
int kiln_n_groups(void) { return N_GROUPS; }
int kiln_n_seq(void) { return N_SEQ; }
int kiln_page_size(void) { return PAGE_SIZE; }
int kiln_batch_tokens(void) { return BATCH_TOKENS; }
int kiln_n_threads(const kiln_model *m) { return m ? kiln_pool_size(m->pool) : KILN_E_ARG; }
int kiln_n_ctx(void) { return N_CTX; }
int kiln_n_vocab(void) { return N_VOCAB; }
long long kiln_weights_size(void) { return GGUF_BYTES; }

int kiln_profile(kiln_model *m, int step, double *seconds, int n) {
#ifdef KILN_PROFILE
    if (!m || (step != STEP_DECODE && step != STEP_PREFILL) || !seconds || n < 0 || n > N_OPS_MAX) return KILN_E_ARG;
    memcpy(seconds, m->op_seconds[step], (size_t)n * sizeof(double));
    memset(m->op_seconds[step], 0, sizeof m->op_seconds[step]);
    return KILN_OK;
#else
    (void)m, (void)step, (void)seconds, (void)n;
    return KILN_E_ARG; /* not a profiling build */
#endif
}
