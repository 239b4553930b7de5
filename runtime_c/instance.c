/* instance.c: a model instance and the C API of model.h, for any model a kiln_model_desc
 * describes (instance.h): the mapped weights, the KV pool, the arena, the threads, and every call
 * on them. Each call checks its arguments first and changes nothing when it fails. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "huge_pages.h"
#include "instance.h"

struct kiln_model {
    const kiln_model_desc *d;
    const uint8_t *gguf;       /* [gguf_bytes], mapped read-only */
    uint8_t *packed;           /* the packed file's weights, read into huge pages, or NULL */
    void *weights;             /* the model's weights struct */
    kiln_kv kv;                /* the pages, their counts, the sequences' block tables and cursors */
    kiln_kv_view *kv_view;     /* [n_layer]: each layer's view of its group's pool */
    uint8_t *arena;            /* [arena_bytes] */
    uint8_t *state;            /* [n_seq][state_slot_bytes]: the recurrent layers' state, a slot a sequence */
    kiln_pool *pool;           /* this instance's threads */
    int32_t *n_new;            /* [n_seq]: a step's rows per sequence */
    int32_t *rows;             /* [5 x batch_tokens]: a step's positions, rows, wanted rows; eval's seqs and flags */
    float *mass;               /* [n_seq][n_ctx], or NULL: attention each position has received, while tracked (H2O) */
    double *op_seconds;        /* [n_ops]: a profiling build's op times */
    struct timespec op_clock;
};

static uint32_t crc32(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

/* Read the packed file into memory in huge pages (huge_pages.h), or NULL: absent (no path), not
 * read by this build, or nothing packed. Read, not mapped: a mapping of the file takes whatever
 * pages the page cache holds (in one run 229 of llama-1b's 654 MB were in 2 MB pages, the rest in
 * 4 KB), so decode's speed had depended on how the file was last read; in huge pages it read its
 * weights 1.03-1.08x faster (llama-1b Q4_0, Q4_K and Q8_0, SmolLM2; Zen 4 VM, alternated in one process,
 * same bits). The copy is the process's own, as llama.cpp's --no-mmap and ik_llama.cpp's -rtr. */
static int read_packed(const kiln_model_desc *d, const char *path, uint8_t **packed) {
    *packed = NULL;
    if (!path || !d->packed_bytes || !kiln_x8_kernels()) return KILN_OK;
    const int fd = open(path, O_RDONLY);
    if (fd < 0) return KILN_E_PACKED;
    const size_t bytes = (size_t)d->packed_bytes;
    struct stat st;
    uint8_t header[KILN_PACKED_HEADER_BYTES];
    int status = KILN_E_PACKED;
    if (fstat(fd, &st) == 0 && st.st_size == KILN_PACKED_HEADER_BYTES + (long long)bytes &&
        pread(fd, header, sizeof header, 0) == (ssize_t)sizeof header &&
        kiln_packed_header_matches(header, (uint64_t)d->gguf_bytes, d->gguf_header_crc32, d->packed_bytes))
        status = (*packed = kiln_huge_pages(bytes)) ? KILN_OK : KILN_E_NOMEM;
    for (size_t at = 0; status == KILN_OK && at < bytes;) {
        const ssize_t got = pread(fd, *packed + at, bytes - at, KILN_PACKED_HEADER_BYTES + (off_t)at);
        if (got > 0) at += (size_t)got;
        else status = KILN_E_PACKED; /* the file shrank since its size was checked */
    }
    close(fd);
    if (status != KILN_OK) free(*packed), *packed = NULL;
    return status;
}

static int map_gguf(const kiln_model_desc *d, const char *path, const uint8_t **map) {
    const int fd = open(path, O_RDONLY);
    if (fd < 0) return KILN_E_OPEN;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size != d->gguf_bytes) {
        close(fd);
        return KILN_E_WEIGHTS;
    }
    void *w = mmap(NULL, (size_t)d->gguf_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (w == MAP_FAILED) return KILN_E_OPEN;
    if (crc32(w, d->gguf_header_bytes) != d->gguf_header_crc32) {
        munmap(w, (size_t)d->gguf_bytes);
        return KILN_E_WEIGHTS;
    }
    *map = w;
    return KILN_OK;
}

void kiln_close(kiln_model *m) {
    if (!m) return;
    kiln_pool_destroy(m->pool);
    if (m->gguf) munmap((void *)m->gguf, (size_t)m->d->gguf_bytes);
    free(m->packed);
    kiln_kv_free(&m->kv);
    free(m->kv_view), free(m->weights), free(m->arena), free(m->state), free(m->n_new), free(m->rows), free(m->mass);
    free(m->op_seconds);
    free(m);
}

int kiln_model_open(const kiln_model_desc *d, kiln_model **out, const char *gguf_path, const char *packed_path,
                    int n_threads) {
    if (!out || !gguf_path || n_threads < 1 || n_threads > 256) return KILN_E_ARG;
    *out = NULL;
    kiln_model *m = calloc(1, sizeof *m);
    if (!m) return KILN_E_NOMEM;
    m->d = d;
    int status = map_gguf(d, gguf_path, &m->gguf);
    if (status == KILN_OK) status = read_packed(d, packed_path, &m->packed);
    if (status != KILN_OK) {
        kiln_close(m);
        return status;
    }
    /* With the packed copy the GGUF serves embedding rows and small vectors between the matmul
       rows: without readahead, touching them does not pull the rows around them into memory. */
    if (m->packed) madvise((void *)m->gguf, (size_t)d->gguf_bytes, MADV_RANDOM);
    m->weights = malloc(d->weights_bytes);
    m->kv_view = calloc((size_t)d->n_layer, sizeof *m->kv_view);
    m->arena = aligned_alloc(64, (d->arena_bytes + 63) / 64 * 64);
    if (d->state_slot_bytes) m->state = aligned_alloc(64, (size_t)d->kv.n_seq * d->state_slot_bytes);
    m->n_new = calloc((size_t)d->kv.n_seq, sizeof *m->n_new);
    m->rows = malloc(6 * sizeof *m->rows * (size_t)d->batch_tokens);
    m->op_seconds = calloc((size_t)d->n_ops, sizeof *m->op_seconds);
    m->pool = kiln_pool_create(n_threads);
    if (!m->weights || !m->kv_view || !m->arena || (d->state_slot_bytes && !m->state) || !m->n_new || !m->rows || !m->op_seconds || !m->pool ||
        kiln_kv_init(&m->kv, &d->kv) != 0) {
        kiln_close(m);
        return KILN_E_NOMEM;
    }
    d->bind(m->weights, m->gguf, m->packed);
    for (int l = 0; l < d->n_layer; l++) {
        if (d->layers[l].recurrent) continue;
        const kiln_kv_group *g = &m->kv.g[d->layers[l].group];
        m->kv_view[l] = (kiln_kv_view){g->pages, g->page_bytes, d->layers[l].k_off, d->layers[l].v_off, d->k_type,
                                       d->v_type, g->tables, m->kv.max_blocks, d->kv.page_size, g->window,
                                       .half_window = d->layers[l].symmetric_window / 2};
    }
    *out = m;
    return KILN_OK;
}

/* -- steps ----------------------------------------------------------------------------------- */

/* Check a batch and count its rows per sequence into m->n_new; nothing changes on failure. */
static int check_batch(kiln_model *m, const kiln_batch *b) {
    if (!b || !b->token || !b->seq) return KILN_E_ARG;
    if (b->n < 1 || b->n > m->d->batch_tokens) return KILN_E_BATCH;
    memset(m->n_new, 0, sizeof *m->n_new * (size_t)m->d->kv.n_seq);
    for (int i = 0; i < b->n; i++) {
        if (kiln_kv_check(&m->kv, b->seq[i]) != KILN_OK) return KILN_E_SEQ;
        if (b->token[i] < 0 || b->token[i] >= m->d->n_vocab) return KILN_E_TOKEN;
        if (b->pos && b->pos[i] < 0) return KILN_E_ARG;
        if (++m->n_new[b->seq[i]] > m->d->n_ctx - m->kv.n_past[b->seq[i]]) return KILN_E_CTX_FULL;
    }
    return KILN_OK;
}

int kiln_step(kiln_model *m, const kiln_batch *b, float *logits) {
    if (!m || !logits) return KILN_E_ARG;
    int status = check_batch(m, b);
    if (status == KILN_OK) status = kiln_kv_reserve(&m->kv, m->n_new);
    if (status != KILN_OK) return status;
    const int bt = m->d->batch_tokens;
    int32_t *pos = m->rows, *row = m->rows + bt, *out = m->rows + 2 * bt, *seen = m->rows + 3 * bt;
    int n_logits = 0;
    memset(m->n_new, 0, sizeof *m->n_new * (size_t)m->d->kv.n_seq); /* now: the rows seen so far per sequence */
    for (int i = 0; i < b->n; i++) {
        row[i] = m->kv.n_past[b->seq[i]] + m->n_new[b->seq[i]]++;
        pos[i] = b->pos ? b->pos[i] : row[i];
        if (b->logits ? b->logits[i] != 0 : i == b->n - 1) out[n_logits++] = i;
    }
    if (!m->d->causal) /* n_new now holds each sequence's rows in the step */
        for (int i = 0; i < b->n; i++) seen[i] = m->kv.n_past[b->seq[i]] + m->n_new[b->seq[i]] - 1;
    if (m->mass)
        for (int i = 0; i < b->n; i++) m->mass[(size_t)b->seq[i] * m->d->n_ctx + row[i]] = 0.0f; /* new positions start at 0 */
    kiln_step_args args = {m->weights, m->arena, m->kv_view, b->token, pos, b->seq, row, out,
                           m->d->causal ? row : seen, m->state,
                           m->d->state_slot_bytes / sizeof(float), b->n, n_logits, logits, m->op_seconds,
                           &m->op_clock};
    kiln_pool_run(m->pool, m->d->step, &args);
    kiln_kv_advance(&m->kv, m->n_new);
    return KILN_OK;
}

int kiln_eval(kiln_model *m, int seq, const int32_t *tokens, int n_tokens, float *logits, int logits_all) {
    if (!m || !tokens || !logits || n_tokens < 1) return KILN_E_ARG;
    const kiln_model_desc *d = m->d;
    if (kiln_kv_check(&m->kv, seq) != KILN_OK) return KILN_E_SEQ;
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= d->n_vocab) return KILN_E_TOKEN;
    if (n_tokens > d->n_ctx - m->kv.n_past[seq]) return KILN_E_CTX_FULL;
    if (!kiln_kv_can_append(&m->kv, seq, n_tokens)) return KILN_E_KV_FULL;
    int32_t *seqs = m->rows + 4 * d->batch_tokens; /* kiln_step uses the first four slices */
    int8_t *want = (int8_t *)(m->rows + 5 * d->batch_tokens);
    for (int i = 0; i < d->prefill_chunk; i++) seqs[i] = seq, want[i] = (int8_t)logits_all;
    for (int done = 0; done < n_tokens;) {
        const int n = n_tokens - done < d->prefill_chunk ? n_tokens - done : d->prefill_chunk;
        /* every row's logits when logits_all, else only the last token's: an earlier chunk's
           last row would cost a pass over the output matrix for logits nobody reads */
        want[n - 1] = (int8_t)(logits_all || done + n == n_tokens);
        const kiln_batch b = {n, tokens + done, seqs, NULL, want};
        const int status = kiln_step(m, &b, logits_all ? logits + (size_t)done * d->n_out : logits);
        want[n - 1] = (int8_t)logits_all;
        if (status != KILN_OK) return status; /* not reached: everything was checked above */
        done += n;
    }
    return KILN_OK;
}

void kiln_ops_start(const kiln_thread *t, const kiln_step_args *s) {
    if (t->ith == 0) clock_gettime(CLOCK_MONOTONIC, s->op_clock);
}

void kiln_op_timed(const kiln_thread *t, const kiln_step_args *s, int i) {
    kiln_barrier(t);
    if (t->ith != 0) return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    s->op_seconds[i] += (double)(now.tv_sec - s->op_clock->tv_sec) + 1e-9 * (double)(now.tv_nsec - s->op_clock->tv_nsec);
    *s->op_clock = now;
}

int kiln_profile(kiln_model *m, double *seconds, int n) {
    if (!m || !m->d->profiled || !seconds || n < 0 || n > m->d->n_ops) return KILN_E_ARG;
    memcpy(seconds, m->op_seconds, (size_t)n * sizeof(double));
    memset(m->op_seconds, 0, (size_t)m->d->n_ops * sizeof(double));
    return KILN_OK;
}

/* -- sequences ------------------------------------------------------------------------------ */

int kiln_seq_open(kiln_model *m) { return m ? kiln_kv_open(&m->kv) : KILN_E_ARG; }
int kiln_seq_close(kiln_model *m, int seq) {
    if (!m) return KILN_E_ARG;
    if (kiln_kv_check(&m->kv, seq) != KILN_OK) return KILN_E_SEQ;
    kiln_kv_close(&m->kv, seq);
    return KILN_OK;
}
/* a sequence's recurrent state slot */
static uint8_t *slot(const kiln_model *m, int seq) { return m->state + (size_t)seq * m->d->state_slot_bytes; }

int kiln_seq_fork(kiln_model *m, int seq) {
    if (!m) return KILN_E_ARG;
    const int child = kiln_kv_fork(&m->kv, seq);
    if (child >= 0 && m->state) memcpy(slot(m, child), slot(m, seq), m->d->state_slot_bytes);
    return child;
}
/* A recurrent state holds every position at once: it can be kept whole or started again (n_keep 0,
   where cache row 0 starts from zeros), never cut back. */
int kiln_seq_rollback(kiln_model *m, int seq, int n_keep) {
    if (!m) return KILN_E_ARG;
    if (m->state && kiln_kv_check(&m->kv, seq) == KILN_OK && n_keep > 0 && n_keep < m->kv.n_past[seq])
        return KILN_E_RECURRENT;
    return kiln_kv_rollback(&m->kv, seq, n_keep);
}
int kiln_seq_reset(kiln_model *m, int seq) { return kiln_seq_rollback(m, seq, 0); }
size_t kiln_state_slot_bytes(const kiln_model *m) { return m ? m->d->state_slot_bytes : 0; }
int kiln_seq_recurrent_save(const kiln_model *m, int seq, uint8_t *buf) {
    if (!m || !buf) return KILN_E_ARG;
    if (kiln_kv_check(&m->kv, seq) != KILN_OK) return KILN_E_SEQ;
    if (m->state) memcpy(buf, slot(m, seq), m->d->state_slot_bytes);
    return KILN_OK;
}
int kiln_seq_rewind(kiln_model *m, int seq, int n_keep, const uint8_t *buf) {
    if (!m || !buf) return KILN_E_ARG;
    const int status = kiln_kv_rollback(&m->kv, seq, n_keep); /* checks seq and n_keep first */
    if (status == KILN_OK && m->state) memcpy(slot(m, seq), buf, m->d->state_slot_bytes);
    return status;
}
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
    const kiln_model_desc *d = a->m->d;
    const float *factors = d->rope_factors_at ? (const float *)(a->m->gguf + d->rope_factors_at) : NULL;
    for (int l = t->ith; l < d->n_layer; l += t->nth) {
        const kiln_layer_desc *L = &d->layers[l];
        if (L->shared) continue; /* its rows are another layer's, which moves them */
        const int n_kv = L->n_head_kv ? L->n_head_kv : d->n_head_kv, hd = L->head_dim ? L->head_dim : d->head_dim;
        kiln_kv_move_rows(&a->m->kv_view[l], a->seq, a->keep, a->first_changed, a->n, n_kv, hd, L->n_rot ? L->n_rot : hd,
                          L->rope_base, d->rope_neox, d->rope_scaling, L->no_factors ? NULL : factors, d->k_hadamard);
    }
}

int kiln_seq_keep(kiln_model *m, int seq, const int32_t *keep, int n) {
    if (!m) return KILN_E_ARG;
    if (m->state) return KILN_E_RECURRENT;
    keep_args args = {m, seq, 0, n, keep};
    const int status = kiln_kv_keep_begin(&m->kv, seq, keep, n, &args.first_changed);
    if (status != KILN_OK) return status;
    if (args.first_changed < n) kiln_pool_run(m->pool, move_rows, &args);
    float *mass = m->mass ? m->mass + (size_t)seq * m->d->n_ctx : NULL;
    for (int r = args.first_changed; mass && r < n; r++) mass[r] = mass[keep[r]];
    kiln_kv_keep_end(&m->kv, seq, n);
    return KILN_OK;
}

int kiln_track_attention(kiln_model *m, int on) {
    if (!m) return KILN_E_ARG;
    if (on && !m->mass && !(m->mass = calloc((size_t)m->d->kv.n_seq * m->d->n_ctx, sizeof(float)))) return KILN_E_NOMEM;
    for (int l = 0; l < m->d->n_layer; l++) m->kv_view[l].mass = on ? m->mass : NULL, m->kv_view[l].mass_stride = m->d->n_ctx;
    return KILN_OK;
}

int kiln_seq_attention(const kiln_model *m, int seq, float *out, int n) {
    if (!m || !out) return KILN_E_ARG;
    if (kiln_kv_check(&m->kv, seq) != KILN_OK) return KILN_E_SEQ;
    if (!m->kv_view[0].mass || n != m->kv.n_past[seq]) return KILN_E_ARG;
    memcpy(out, m->mass + (size_t)seq * m->d->n_ctx, (size_t)n * sizeof(float));
    return KILN_OK;
}

int kiln_seq_share(kiln_model *m, int seq, int first, int n_blocks, int32_t *pages) {
    return m ? kiln_kv_share(&m->kv, seq, first, n_blocks, pages) : KILN_E_ARG;
}
int kiln_seq_attach(kiln_model *m, int seq, const int32_t *pages, int n_blocks) {
    if (m && m->state) return KILN_E_RECURRENT; /* the pages' positions would have no state behind them */
    return m ? kiln_kv_attach(&m->kv, seq, pages, n_blocks) : KILN_E_ARG;
}
int kiln_pages_release(kiln_model *m, const int32_t *pages, int n_blocks) {
    return m ? kiln_kv_release(&m->kv, pages, n_blocks) : KILN_E_ARG;
}
/* A sequence's state as bytes: its KV state (kv_state.c), then its recurrent slot where the model
   has one. */
size_t kiln_seq_state_size(const kiln_model *m, int seq) {
    if (!m) return 0;
    const size_t kv = kiln_kv_state_size(&m->kv, seq);
    return kv ? kv + m->d->state_slot_bytes : 0;
}
int kiln_seq_state_save(const kiln_model *m, int seq, uint8_t *buf, size_t size) {
    if (!m) return KILN_E_ARG;
    const size_t own = m->d->state_slot_bytes;
    if (kiln_kv_check(&m->kv, seq) != KILN_OK) return KILN_E_SEQ;
    if (!buf || size != kiln_seq_state_size(m, seq)) return KILN_E_ARG;
    const int status = kiln_kv_state_save(&m->kv, seq, buf, size - own);
    if (status == KILN_OK && own) memcpy(buf + size - own, slot(m, seq), own);
    return status;
}
int kiln_seq_state_load(kiln_model *m, int seq, const uint8_t *buf, size_t size) {
    if (!m) return KILN_E_ARG;
    const size_t own = m->d->state_slot_bytes;
    if (!buf || size < own) return KILN_E_ARG;
    const int status = kiln_kv_state_load(&m->kv, seq, buf, size - own);
    if (status == KILN_OK && own) memcpy(slot(m, seq), buf + size - own, own);
    return status;
}

/* -- what the instance is ------------------------------------------------------------------ */

int kiln_pages_used(const kiln_model *m, int group) { return m ? kiln_kv_pages_used(&m->kv, group) : KILN_E_ARG; }
int kiln_pages_total(const kiln_model *m, int group) {
    return m && group >= 0 && group < m->d->kv.n_groups ? m->d->kv.n_pages[group] : KILN_E_ARG;
}
int kiln_n_groups(const kiln_model *m) { return m ? m->d->kv.n_groups : KILN_E_ARG; }
int kiln_n_seq(const kiln_model *m) { return m ? m->d->kv.n_seq : KILN_E_ARG; }
int kiln_page_size(const kiln_model *m) { return m ? m->d->kv.page_size : KILN_E_ARG; }
int kiln_batch_tokens(const kiln_model *m) { return m ? m->d->batch_tokens : KILN_E_ARG; }
int kiln_n_threads(const kiln_model *m) { return m ? kiln_pool_size(m->pool) : KILN_E_ARG; }
int kiln_n_ctx(const kiln_model *m) { return m ? m->d->n_ctx : KILN_E_ARG; }
int kiln_n_vocab(const kiln_model *m) { return m ? m->d->n_vocab : KILN_E_ARG; }
int kiln_n_out(const kiln_model *m) { return m ? m->d->n_out : KILN_E_ARG; }
