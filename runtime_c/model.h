/* model.h: the C API of a kiln-compiled model.
 *
 * A model's library (its generated model.c linked with this runtime) defines kiln_open; every
 * other function is the runtime's own (instance.c), the same for every model. One instance holds
 * up to kiln_n_seq() sequences over a pool of KV pages. A step runs a batch of rows, each a
 * (token, sequence, logits wanted) as in llama.cpp's llama_batch: decode tokens of some sequences
 * beside prefill chunks of others, every weight read once for all rows. A row's logits are
 * bit-identical however it was batched. Every call checks its arguments first and fails with a
 * negative status (status.h) without changing anything.
 */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct kiln_model kiln_model;

typedef struct {
    int n;                /* rows, 1 .. kiln_batch_tokens(m) */
    const int32_t *token; /* [n] */
    const int32_t *seq;   /* [n] each row's sequence; a sequence's rows take its next positions in order */
    const int32_t *pos;   /* [n] rope positions, or NULL: the positions the rows take in the cache */
    const int8_t *logits; /* [n] nonzero: this row's logits are wanted; NULL: the last row's only */
} kiln_batch;

/* packed_path: the packed weights file kiln wrote for this library, or NULL to read every
   weight from the GGUF (slower where the build has the x8 kernels); threads: this instance's pool */
int kiln_open(kiln_model **out, const char *gguf_path, const char *packed_path, int n_threads);
void kiln_close(kiln_model *m);
/* whether this library has the kernels that read the packed file (its CPU target has AVX-512 VNNI);
   without them it reads the GGUF rows, with the same results */
int kiln_x8_kernels(void);

/* one step; logits gets the wanted rows' [kiln_n_out] each (logits, or an embedding model's hidden
   states), in row order. A bidirectional model's row sees every row its sequence has after the step. */
int kiln_step(kiln_model *m, const kiln_batch *b, float *logits);
/* append n_tokens to one sequence in steps of the prefill chunk; logits gets the last token's
   [kiln_n_out], or every token's [n_tokens][kiln_n_out] when logits_all is set */
int kiln_eval(kiln_model *m, int seq, const int32_t *tokens, int n_tokens, float *logits, int logits_all);

int kiln_seq_open(kiln_model *m);                        /* a free sequence's id, or KILN_E_NO_SEQ */
int kiln_seq_close(kiln_model *m, int seq);              /* release its pages */
int kiln_seq_fork(kiln_model *m, int seq);               /* a new sequence sharing seq's pages; its id */
int kiln_seq_reset(kiln_model *m, int seq);
int kiln_seq_rollback(kiln_model *m, int seq, int n_keep); /* keep the first n_keep positions */
int kiln_seq_n_past(const kiln_model *m, int seq);      /* positions the sequence holds */
/* A hybrid's recurrent state (0 bytes in other models) holds every position at once, so a rollback
   into it is refused. Speculation keeps it instead: save the slot before a step, and rewind to the
   positions it held then (n_keep, the sequence's n_past at the save) with the saved bytes. */
size_t kiln_state_slot_bytes(const kiln_model *m);
int kiln_seq_recurrent_save(const kiln_model *m, int seq, uint8_t *buf); /* [kiln_state_slot_bytes] */
int kiln_seq_rewind(kiln_model *m, int seq, int n_keep, const uint8_t *buf);
/* Keep n of seq's positions, keep[0] < keep[1] < ... < n_past: row r takes position keep[r]'s
   K and V, the keys rotated to their new position (a context shift keeps the sinks and the most
   recent rows). KILN_E_SHIFT_WINDOW: a sliding-window layer would read a position whose page it
   no longer holds; KILN_E_KV_FULL: too few free pages for the rows shared pages make it copy. */
int kiln_seq_keep(kiln_model *m, int seq, const int32_t *keep, int n);
/* Heavy-hitter bookkeeping (H2O): while on, every step adds to each position the attention it
   receives (softmax weights summed over heads and layers); a keep carries it along. Off by
   default: it costs a second pass over the keys. */
int kiln_track_attention(kiln_model *m, int on);
int kiln_seq_attention(const kiln_model *m, int seq, float *out, int n); /* n = n_past values */

/* Pages a prefix cache holds outside the sequences: pages is [n_blocks][kiln_n_groups(m)] page
 * ids, -1 where a sliding layer group no longer keeps a block. */
/* seq's full blocks [first, first + n_blocks) into pages, with a reference taken on each */
int kiln_seq_share(kiln_model *m, int seq, int first, int n_blocks, int32_t *pages);
/* an empty sequence takes held pages as its first n_blocks blocks */
int kiln_seq_attach(kiln_model *m, int seq, const int32_t *pages, int n_blocks);
int kiln_pages_release(kiln_model *m, const int32_t *pages, int n_blocks); /* drop shared references */

/* A sequence's KV state as bytes (kv_pool.h has the layout), for a file; load takes it into an
   empty sequence, checking every field against this library's pool. */
size_t kiln_seq_state_size(const kiln_model *m, int seq);
int kiln_seq_state_save(const kiln_model *m, int seq, uint8_t *buf, size_t size);
int kiln_seq_state_load(kiln_model *m, int seq, const uint8_t *buf, size_t size);

int kiln_pages_used(const kiln_model *m, int group); /* pages in use in a layer group's pool */
int kiln_pages_total(const kiln_model *m, int group);
int kiln_n_groups(const kiln_model *m);
int kiln_n_seq(const kiln_model *m);
int kiln_page_size(const kiln_model *m);
int kiln_batch_tokens(const kiln_model *m);
int kiln_n_threads(const kiln_model *m);
int kiln_n_ctx(const kiln_model *m);
int kiln_n_vocab(const kiln_model *m);
/* floats a wanted row gets from a step: n_vocab logits, or an embedding model's n_embd hidden state */
int kiln_n_out(const kiln_model *m);

/* A profiling build (kiln bench --profile) sums each op's wall time over the steps it runs, the
   body's ops over every layer: seconds gets the first n ops', which are then reset. KILN_E_ARG in
   any other build. */
int kiln_profile(kiln_model *m, double *seconds, int n);

#endif
