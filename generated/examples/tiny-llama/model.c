/* model.c: tiny-llama.gguf (llama), compiled by kiln 0.1.0. Generated; do not edit.
 *
 * ctx 64, KV cache f32 (K/V) in pages of 64 positions, 1 sequence(s),
 * steps of up to 16 rows, prefill chunks of 16.
 * Every offset below was fixed by kiln's memory planner; `kiln layout` prints the same map.
 * The API (model.h) is the runtime's (instance.c): this file describes the model it runs.
 */
#include "instance.h"

#define N_LAYER 2

/* ==== the weights: views of the GGUF file, and of the packed file where a matrix has an x8 copy ==== */
/* one layer's, named after their tensors: blk.<layer>.<name>.weight (.bias: <name>_bias) */
typedef struct {
    kiln_weight attn_norm; /* [64] */
    kiln_weight attn_q; /* [64 x 64] */
    kiln_weight attn_k; /* [32 x 64] */
    kiln_weight attn_v; /* [32 x 64] */
    kiln_weight attn_output; /* [64 x 64] */
    kiln_weight ffn_norm; /* [64] */
    kiln_weight ffn_gate; /* [128 x 64] */
    kiln_weight ffn_up; /* [128 x 64] */
    kiln_weight ffn_down; /* [64 x 128] */
} layer_weights;

typedef struct {
    kiln_weight token_embd; /* [259 x 64] */
    kiln_weight output_norm; /* [64] */
    kiln_weight output; /* [259 x 64]: token_embd.weight's rows (tied) */
    layer_weights layer[N_LAYER];
} model_weights;

/* where each lies: its type, its offset in the GGUF file, its x8 copy's in the packed region */
static const struct {
    kiln_weight_at attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down;
} LAYER_AT[N_LAYER] = {
    { /* layer 0 */
        .attn_norm = {KILN_F32, 0x5b40, KILN_NOT_PACKED},
        .attn_q = {KILN_Q8_0, 0x5c40, 0x0},
        .attn_k = {KILN_Q8_0, 0x6d40, 0x1100},
        .attn_v = {KILN_Q8_0, 0x75c0, 0x1980},
        .attn_output = {KILN_Q8_0, 0x7e40, 0x2200},
        .ffn_norm = {KILN_F32, 0x8f40, KILN_NOT_PACKED},
        .ffn_gate = {KILN_Q8_0, 0x9040, 0x3300},
        .ffn_up = {KILN_Q8_0, 0xb240, 0x5500},
        .ffn_down = {KILN_Q8_0, 0xd440, 0x7700},
    },
    { /* layer 1 */
        .attn_norm = {KILN_F32, 0xf640, KILN_NOT_PACKED},
        .attn_q = {KILN_Q8_0, 0xf740, 0x9900},
        .attn_k = {KILN_Q8_0, 0x10840, 0xaa00},
        .attn_v = {KILN_Q8_0, 0x110c0, 0xb280},
        .attn_output = {KILN_Q8_0, 0x11940, 0xbb00},
        .ffn_norm = {KILN_F32, 0x12a40, KILN_NOT_PACKED},
        .ffn_gate = {KILN_Q8_0, 0x12b40, 0xcc00},
        .ffn_up = {KILN_Q8_0, 0x14d40, 0xee00},
        .ffn_down = {KILN_Q8_0, 0x16f40, 0x11000},
    },
};

static const struct {
    kiln_weight_at token_embd, output_norm, output;
} MODEL_AT = {
    .token_embd = {KILN_Q8_0, 0x1560, KILN_NOT_PACKED},
    .output_norm = {KILN_F32, 0x5a40, KILN_NOT_PACKED},
    .output = {KILN_Q8_0, 0x1560, KILN_NOT_PACKED},
};

static void bind(void *weights, const uint8_t *gguf, const uint8_t *packed) {
    model_weights *w = weights;
    w->token_embd = kiln_weight_of(MODEL_AT.token_embd, gguf, packed);
    w->output_norm = kiln_weight_of(MODEL_AT.output_norm, gguf, packed);
    w->output = kiln_weight_of(MODEL_AT.output, gguf, packed);
    for (int l = 0; l < N_LAYER; l++) {
        w->layer[l].attn_norm = kiln_weight_of(LAYER_AT[l].attn_norm, gguf, packed);
        w->layer[l].attn_q = kiln_weight_of(LAYER_AT[l].attn_q, gguf, packed);
        w->layer[l].attn_k = kiln_weight_of(LAYER_AT[l].attn_k, gguf, packed);
        w->layer[l].attn_v = kiln_weight_of(LAYER_AT[l].attn_v, gguf, packed);
        w->layer[l].attn_output = kiln_weight_of(LAYER_AT[l].attn_output, gguf, packed);
        w->layer[l].ffn_norm = kiln_weight_of(LAYER_AT[l].ffn_norm, gguf, packed);
        w->layer[l].ffn_gate = kiln_weight_of(LAYER_AT[l].ffn_gate, gguf, packed);
        w->layer[l].ffn_up = kiln_weight_of(LAYER_AT[l].ffn_up, gguf, packed);
        w->layer[l].ffn_down = kiln_weight_of(LAYER_AT[l].ffn_down, gguf, packed);
    }
}

/* ==== the layers: each one's K and V in a page of its group's KV pool, and its rope base ======== */
static const kiln_layer_desc LAYERS[N_LAYER] = {
    { 0, 0x0, 0x2000, 10000.0f }, /* layer 0: global */
    { 0, 0x4000, 0x6000, 10000.0f }, /* layer 1: global */
};

/* the rotations the layers' ropes take from the step's rope table: base, rotated dims, frequency factors, first value in a row */
static const kiln_rope_table_desc ROPE_TABLES[] = {
    { 10000.0f, 16, 0, 0 },
};

/* ==== the step: every thread of the pool runs it; kernels split their work by t->ith / t->nth ==== */
#define A(off) ((void *)(s->arena + (off)))
#ifdef KILN_PROFILE /* an op ends when every thread has passed the barrier after it */
#define OP_DONE(i) kiln_op_timed(t, s, i)
#define OP_NEXT(i) kiln_op_timed(t, s, i)
#else
#define OP_DONE(i) kiln_barrier(t)
/* no barrier: the next op is a matmul reading the quantized rows this one (or its run) read, and
   neither writes arena bytes the other touches (render.py checks it against the layout) */
#define OP_NEXT(i)
#endif

static void step(void *arg, const kiln_thread *t) {
    const kiln_step_args *s = arg;
    const model_weights *w = s->weights;
    const int n = s->n, n_logits = s->n_logits;
    const int32_t *inp_tokens = s->tokens, *inp_pos = s->pos, *inp_seq = s->seq, *inp_row = s->row, *inp_out = s->out;
    float *result_output = s->logits; /* [n_logits x 259], the caller's */
    float *x = (float *)A(0x6000); /* [n x 64]: the residual stream, which every layer adds into */
    float *rope_table = (float *)A(0x7000); /* [n x 16]: each row's rope rotations (cos, sin), which the head writes and each layer's ropes read */
#ifdef KILN_PROFILE
    kiln_ops_start(t, s);
#endif
    /* inp_embd: embed */
    kiln_embed_mt(t, x, &w->token_embd, inp_tokens, n, 64, 1.0f);
    OP_DONE(0);
    /* rope_table: rope_table */
    kiln_rope_table_mt(t, rope_table, 16, inp_pos, n, ROPE_TABLES, 1, NULL, NULL);
    OP_DONE(1);
    for (int l = 0; l < N_LAYER; l++) {
        const layer_weights *L = &w->layer[l];
        /* attn_norm: rms_norm */
        float *attn_norm = (float *)A(0x0); /* [n x 64] */
        kiln_rms_norm_mt(t, attn_norm, x, (const float *)L->attn_norm.data, 0.0f, 9.99999997e-07f, 64, n);
        OP_DONE(2);
        /* q: matmul */
        float *q = (float *)A(0x1000); /* [n x 4 x 16] */
        void *q_act = A(0x3000); /* [1472 bytes] */
        kiln_matmul_mt(t, &L->attn_q, NULL, 64, 64, attn_norm, n, q, q_act, 0, 128);
        OP_NEXT(3);
        /* k: matmul */
        float *k = (float *)A(0x2000); /* [n x 2 x 16] */
        kiln_matmul_quantized_mt(t, &L->attn_k, NULL, 32, 64, attn_norm, n, k, q_act, 64, 128);
        OP_NEXT(4);
        /* v: matmul */
        float *v = (float *)A(0x2800); /* [n x 2 x 16] */
        kiln_matmul_quantized_mt(t, &L->attn_v, NULL, 32, 64, attn_norm, n, v, q_act, 96, 128);
        OP_DONE(5);
        /* q_rope: rope */
        float *q_rope = (float *)A(0x0); /* [n x 4 x 16] */
        kiln_rope_rotate_mt(t, q_rope, q, kiln_rope_cs(rope_table, ROPE_TABLES, LAYERS[l].rope_table), 16, n, 4, 16, 16, 0);
        OP_DONE(6);
        /* k_rope: rope */
        float *k_rope = (float *)A(0x1000); /* [n x 2 x 16] */
        kiln_rope_rotate_mt(t, k_rope, k, kiln_rope_cs(rope_table, ROPE_TABLES, LAYERS[l].rope_table), 16, n, 2, 16, 16, 0);
        OP_DONE(7);
        /* kv_store: kv_cache_store */
        kiln_kv_store_mt(t, &s->kv_view[l], k_rope, v, inp_seq, inp_row, n, 2, 16);
        OP_DONE(8);
        /* attn: attention */
        float *attn = (float *)A(0x1000); /* [n x 64] */
        void *attn_spans = A(0x2000); /* [288 bytes] */
        kiln_attention_mt(t, attn, q_rope, inp_seq, inp_row, inp_row, n, &s->kv_view[l], 4, 2, 16, 0.25f, attn_spans, 1);
        OP_DONE(9);
        /* attn_out: matmul */
        float *attn_out = (float *)A(0x0); /* [n x 64] */
        void *attn_out_act = A(0x2000); /* [1472 bytes] */
        kiln_matmul_mt(t, &L->attn_output, NULL, 64, 64, attn, n, attn_out, attn_out_act, 0, 64);
        OP_DONE(10);
        /* ffn_inp: add */
        kiln_add_mt(t, x, attn_out, x, n * 64);
        OP_DONE(11);
        /* ffn_norm: rms_norm */
        float *ffn_norm = (float *)A(0x4000); /* [n x 64] */
        kiln_rms_norm_mt(t, ffn_norm, x, (const float *)L->ffn_norm.data, 0.0f, 9.99999997e-07f, 64, n);
        OP_DONE(12);
        /* ffn_gate: matmul */
        float *ffn_gate = (float *)A(0x0); /* [n x 128] */
        void *ffn_gate_act = A(0x5000); /* [1472 bytes] */
        kiln_matmul_mt(t, &L->ffn_gate, NULL, 128, 64, ffn_norm, n, ffn_gate, ffn_gate_act, 0, 256);
        OP_NEXT(13);
        /* ffn_up: matmul */
        float *ffn_up = (float *)A(0x2000); /* [n x 128] */
        kiln_matmul_quantized_mt(t, &L->ffn_up, NULL, 128, 64, ffn_norm, n, ffn_up, ffn_gate_act, 128, 256);
        OP_DONE(14);
        /* ffn_glu: glu */
        float *ffn_glu = (float *)A(0x4000); /* [n x 128] */
        kiln_swiglu_mt(t, ffn_glu, ffn_gate, ffn_up, n * 128);
        OP_DONE(15);
        /* ffn_out: matmul */
        float *ffn_out = (float *)A(0x0); /* [n x 64] */
        void *ffn_out_act = A(0x1000); /* [2944 bytes] */
        kiln_matmul_mt(t, &L->ffn_down, NULL, 64, 128, ffn_glu, n, ffn_out, ffn_out_act, 0, 64);
        OP_DONE(16);
        /* l_out: add */
        kiln_add_mt(t, x, ffn_out, x, n * 64);
        OP_DONE(17);
    }
    /* result_norm: rms_norm */
    float *result_norm = (float *)A(0x0); /* [n x 64] */
    kiln_rms_norm_mt(t, result_norm, x, (const float *)w->output_norm.data, 0.0f, 9.99999997e-07f, 64, n);
    OP_DONE(18);
    /* result_rows: select_rows */
    float *result_rows = (float *)A(0x1000); /* [n x 64] */
    kiln_select_rows_mt(t, result_rows, result_norm, inp_out, n_logits, 64);
    OP_DONE(19);
    /* result_output: logits */
    void *result_output_act = A(0x0); /* [1472 bytes] */
    kiln_matmul_mt(t, &w->output, NULL, 259, 64, result_rows, n_logits, result_output, result_output_act, 0, 259);
    OP_DONE(20);
}

/* ==== the model, as the runtime takes it ====================================================== */
static const kiln_model_desc MODEL = {
    .n_vocab = 259, .n_out = 259, .causal = 1, .n_ctx = 64, .n_layer = N_LAYER, .n_head_kv = 2, .head_dim = 16,
    .prefill_chunk = 16, .batch_tokens = 16,
    .gguf_bytes = 102720LL, .gguf_header_bytes = 5472, .gguf_header_crc32 = 3596502979u,
    .packed_bytes = 78336ULL,
    .arena_bytes = 29696,
    .kv = {
        .n_seq = 1, .n_ctx = 64, .page_size = 64, .n_groups = 1,
        .window = { 0 },     /* each layer group's window; 0: whole context */
        .n_pages = { 1 },   /* pages in its pool */
        .page_bytes = { 32768 }, /* bytes of one of its pages */
    },
    .k_type = KILN_F32, .v_type = KILN_F32, .rope_neox = 0, .k_hadamard = 0,
    .layers = LAYERS,
    .weights_bytes = sizeof(model_weights), .bind = bind,
    .step = step, .n_ops = 21,
#ifdef KILN_PROFILE
    .profiled = 1,
#endif
};

int kiln_open(kiln_model **out, const char *gguf_path, const char *packed_path, int n_threads) {
    return kiln_model_open(&MODEL, out, gguf_path, packed_path, n_threads);
}
