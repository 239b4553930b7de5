/* instance.h: what a generated model.c gives the runtime, and what the runtime gives its step.
 *
 * model.c describes one model in a kiln_model_desc: the numbers the planner fixed (sizes, the KV
 * pool's shape, each layer's place in it), where each weight lies, and the step function, which
 * runs the head, the layer body once per layer, and the tail. Everything else an instance does,
 * the whole C API of model.h, is the runtime's (instance.c) and the same for every model.
 */
#ifndef KILN_INSTANCE_H
#define KILN_INSTANCE_H

#include <stdint.h>
#include <time.h>

#include "kernels_mt.h"
#include "kv_pool.h"
#include "model.h"

/* Where a weight lies: its type, its offset in the GGUF file, and the offset of its x8 copy in the
 * packed region, or KILN_NOT_PACKED. */
#define KILN_NOT_PACKED (-1LL)
typedef struct {
    int type;
    long long at, packed_at;
} kiln_weight_at;

static inline kiln_weight kiln_weight_of(kiln_weight_at w, const uint8_t *gguf, const uint8_t *packed) {
    return (kiln_weight){w.type, gguf + w.at, packed && w.packed_at != KILN_NOT_PACKED ? packed + w.packed_at : NULL};
}

/* A layer's place in the KV pool, and how its cached keys were rotated (a context shift rotates
 * them again): rope base 0, not by position. */
typedef struct {
    int group;           /* the layer group whose pool holds it (-1: a recurrent layer, which has no KV) */
    size_t k_off, v_off; /* its K and V within a page of that group */
    float rope_base;
    int recurrent;               /* a recurrent layer: its state lies in each sequence's slot, */
    size_t conv_off, delta_off;  /* its conv window and delta-rule matrices at these bytes of a slot */
    int body;                    /* the body it runs, where the step has several */
    /* where layer kinds differ (Gemma 4; 0: the model's): its KV heads, head width, rotated dims; */
    int n_head_kv, head_dim, n_rot;
    int no_factors;              /* its rope reads no frequency factors (they are the global layers') */
    int shared;                  /* it reads another layer's KV rows (a shift moves them once, there) */
    int symmetric_window;        /* a bidirectional sliding layer: a query at p sees p +- window / 2 (its
                                    group holds the whole input; llama.cpp's LLAMA_SWA_TYPE_SYMMETRIC) */
    int rope_table;              /* its ropes' rotation in the step's rope table (ROPE_TABLES); -1: none */
} kiln_layer_desc;

/* One step's rows, and what the step function reads and writes. */
typedef struct {
    const void *weights;          /* the model's weights struct, bound at open */
    uint8_t *arena;               /* the activations */
    const kiln_kv_view *kv_view;  /* each layer's view of its pool */
    const int32_t *tokens, *pos, *seq, *row, *out; /* [n]; out: [n_logits] rows whose logits are wanted */
    const int32_t *seen;          /* [n] the last cache row each row sees: its own, or (bidirectional) its sequence's last */
    uint8_t *state;               /* the recurrent state pool: slot s (sequence s) at s * slot_floats floats */
    size_t slot_floats;
    int n, n_logits;
    float *logits;                /* [n_logits x n_out], the caller's */
    double *op_seconds;           /* a profiling build's: each op's wall time, summed */
    struct timespec *op_clock;
} kiln_step_args;

typedef struct {
    int n_vocab, n_ctx, n_layer, n_head_kv, head_dim;
    int n_out;                       /* floats of a wanted row's output: n_vocab logits, or n_embd (hidden states) */
    int causal;                      /* 0: a row sees its whole sequence as far as the step takes it (an encoder) */
    int prefill_chunk, batch_tokens; /* tokens of one sequence a kiln_eval step takes; rows any step takes */
    long long gguf_bytes;            /* the GGUF file this library was compiled for: its size, */
    size_t gguf_header_bytes;        /* and the CRC-32 of its header */
    uint32_t gguf_header_crc32;
    unsigned long long packed_bytes; /* the packed region; 0: nothing is packed */
    size_t arena_bytes;
    size_t state_slot_bytes;         /* one sequence's recurrent state (0: no recurrent layer) */
    kiln_kv_shape kv;
    int k_type, v_type;              /* the cache's K and V element types */
    int rope_neox, k_hadamard;       /* how the cached keys were made, for a context shift */
    const kiln_rope_scaling *rope_scaling; /* and the ropes' scaling (NULL: none), */
    long long rope_factors_at;       /* their frequency factors' offset in the GGUF file (0: none) */
    const kiln_layer_desc *layers;   /* [n_layer] */
    size_t weights_bytes;            /* the weights struct, filled by bind */
    void (*bind)(void *weights, const uint8_t *gguf, const uint8_t *packed);
    kiln_region_fn step;             /* every thread of the pool runs it with a kiln_step_args */
    int n_ops;                       /* the step's ops, the body once */
    int profiled;                    /* model.c was built to time its ops */
} kiln_model_desc;

/* kiln_open for the model `d` describes */
int kiln_model_open(const kiln_model_desc *d, kiln_model **out, const char *gguf_path, const char *packed_path,
                    int n_threads);

/* A profiling build's bookkeeping: the time since the last op's end is charged to op i. */
void kiln_ops_start(const kiln_thread *t, const kiln_step_args *s);
void kiln_op_timed(const kiln_thread *t, const kiln_step_args *s, int i);

#endif
