/* moe.c: a mixture of experts' FFN across a step's threads: each row's chosen experts (moe_route.c)
 * run their FFNs (GLU, or, without a gate, up, GELU and down), and their outputs, times the row's
 * weights, are summed in rank order.
 *
 * A step's rows are grouped by expert, so that each expert's weights are read once for all the
 * rows that chose it: a slot is a (row, rank) pair, and the slots are ordered by expert id, then
 * row, so that an expert's slots are consecutive and its activations one block of rows for the
 * matmul kernels (kiln_x8_gemm on the expert's slice of the packed copy, or kiln_rows on its slice
 * of the GGUF's 3-D tensor). Work is split by output rows, never by expert: a thread takes a range
 * of 16-row granules of every chosen expert's matrix, so each weight row is read by one thread
 * once, and a thread that holds a range of down's output rows holds every expert's value for them
 * and sums a row's experts itself, in rank order, as llama.cpp's ffn_moe_out does:
 * ((y_0 w_0 + y_1 w_1) + y_2 w_2) + ...
 *
 * Every value a slot gets is a per-row function (the reference dot, swiglu, the quantizers), so a
 * row's output does not depend on the other rows of the step, on the threads, or on the build.
 *
 *   1. x's rows quantized for gate's (and up's, where its format differs; without a gate, up's)
 *      dot; the slots' list; each slot's copy of its row's activations (one row, decode: each
 *      thread quantizes it on its stack, no list and no copy needed beyond its k slots)
 *   2. gate and up rows of every chosen expert (plus their biases), then act(gate, up) (without a
 *      gate, gelu(up)) in gate's place, by granules of n_ff
 *   3. those rows quantized for down's dot
 *   4. down rows of every chosen expert and the weighted sum, by granules of n_embd
 */
#include <string.h>

#include "kernels_mt.h"
#include "quant_impl.h"

#define GRANULE 16 /* output rows a work item takes: two x8 groups, what one 512-bit vector holds */
#define ALIGN64(n) (((n) + (size_t)63) & ~(size_t)63)

/* The scratch, in this order (each part 64-byte aligned; compiler/passes/scratch.py plans the same
 * bytes, and a test holds the two together). */
typedef struct {
    int32_t *first;    /* [n_expert + 1]: expert e's slots are first[e] .. first[e + 1] - 1 */
    int32_t *slot_row; /* [slots]: the row a slot serves */
    int32_t *slot_of;  /* [n_rows * n_used]: the slot of (row, rank) */
    uint8_t *rows_g, *slots_g; /* x quantized for gate's dot: [n_rows], [slots] */
    uint8_t *rows_u, *slots_u; /* for up's, where its activation format is another (else empty) */
    float *gu;         /* [slots][2 n_ff]: each slot's gate rows, then its up rows; gate then holds act */
    uint8_t *act_h;    /* [slots]: those quantized for down's dot */
    float *y;          /* [slots][n_embd]: down's rows */
} moe_scratch;

typedef struct {
    const kiln_weight *gate, *up, *down; /* gate NULL: no gate (KILN_ACT_GELU) */
    const kiln_weight *in;               /* the first matrix x meets: gate, else up */
    int n_rows, n_expert, n_used, n_ff, n_embd;
    size_t ag, au, ad; /* activation row bytes for gate (and up) over n_embd, for down over n_ff */
    int split_up;      /* up's activations are in another format than gate's */
    const kiln_moe_extra *extra; /* the experts' biases and activation; NULL: none, SwiGLU */
} moe_shape;

static moe_shape shape_of(const kiln_weight *gate, const kiln_weight *up, const kiln_weight *down, int n_rows,
                          int n_expert, int n_used, int n_ff, int n_embd, const kiln_moe_extra *extra) {
    const kiln_weight *in = gate ? gate : up;
    const int split = kiln_act_type(up->type) != kiln_act_type(in->type);
    return (moe_shape){gate, up, down, in, n_rows, n_expert, n_used, n_ff, n_embd,
                       kiln_act_row_bytes(in->type, n_embd), split ? kiln_act_row_bytes(up->type, n_embd) : 0,
                       kiln_act_row_bytes(down->type, n_ff), split, extra};
}

/* rows[i][o0 .. o1) += bias[o0 .. o1) for i < n: one add a value, as ggml_add_id */
static void add_bias(float *rows, size_t stride, int n, const float *bias, int o0, int o1) {
    if (!bias) return;
    for (int i = 0; i < n; i++)
        for (int o = o0; o < o1; o++) rows[(size_t)i * stride + o] += bias[o];
}

static size_t carve(const moe_shape *m, uint8_t *base, moe_scratch *s) {
    const size_t slots = (size_t)m->n_rows * m->n_used;
    const size_t parts[] = {4 * ((size_t)m->n_expert + 1), 4 * slots, 4 * slots, m->n_rows * m->ag, slots * m->ag,
                            m->n_rows * m->au, slots * m->au, 8 * slots * m->n_ff, slots * m->ad,
                            4 * slots * m->n_embd};
    void **at[] = {(void **)&s->first, (void **)&s->slot_row, (void **)&s->slot_of, (void **)&s->rows_g,
                   (void **)&s->slots_g, (void **)&s->rows_u, (void **)&s->slots_u, (void **)&s->gu,
                   (void **)&s->act_h, (void **)&s->y};
    size_t off = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (s) *at[i] = base + off;
        off += ALIGN64(parts[i]);
    }
    return off;
}

size_t kiln_moe_scratch_bytes(int gate_type, int up_type, int down_type, int n_rows, int n_expert, int n_used,
                              int n_ff, int n_embd) {
    const kiln_weight g = {gate_type, NULL, NULL}, u = {up_type, NULL, NULL}, d = {down_type, NULL, NULL};
    const moe_shape m = shape_of(&g, &u, &d, n_rows, n_expert, n_used, n_ff, n_embd, NULL);
    return carve(&m, NULL, NULL);
}

/* The slots: a counting sort of the (row, rank) pairs by expert, stable, so rows stay in order. */
static void list_slots(const moe_shape *m, const int32_t *ids, int32_t *first, int32_t *slot_row, int32_t *slot_of) {
    int32_t next[KILN_MOE_MAX_EXPERTS];
    const int pairs = m->n_rows * m->n_used;
    memset(first, 0, sizeof(int32_t) * (m->n_expert + 1));
    for (int i = 0; i < pairs; i++) first[ids[i] + 1]++;
    for (int e = 0; e < m->n_expert; e++) first[e + 1] += first[e], next[e] = first[e];
    for (int i = 0; i < pairs; i++) {
        const int s = next[ids[i]]++;
        slot_row[s] = i / m->n_used, slot_of[i] = s;
    }
}

/* Rows [o0, o1) of expert e's matrix (slice e of w, n_out x n_in) against n_a activation rows:
 * y[c * y_row + o]. The x8 copy's slice where the build reads it (and the rows begin an x8 group),
 * else the GGUF's. */
static void expert_rows(const kiln_weight *w, int e, int n_out, int n_in, int o0, int o1, const uint8_t *act,
                        size_t a_row, int n_a, float *y, size_t y_row, int32_t *reads) {
    if (reads) __atomic_fetch_add(reads, o1 - o0, __ATOMIC_RELAXED);
#ifdef KILN_HAVE_X8
    if (w->packed && o0 % 8 == 0 && kiln_x8_supported(w->type, n_out, n_in)) {
        const uint8_t *slice = (const uint8_t *)w->packed + (size_t)e * kiln_x8_bytes(w->type, n_out, n_in);
        kiln_x8_gemm(w->type, slice, o0 / 8, (o1 + 7) / 8, n_in, act, a_row, n_a, y, y_row);
        return;
    }
#endif
    const size_t w_row = kiln_row_bytes(w->type, n_in);
    kiln_rows(w->type, n_in, (const uint8_t *)w->data + ((size_t)e * n_out + o0) * w_row, w_row, o1 - o0, act, a_row,
              n_a, y + o0, y_row);
}

/* this thread's granules of n rows: [*o0, *o1) */
static void granules(const kiln_thread *t, int n, int *o0, int *o1) {
    int i0, i1;
    kiln_share(t, (n + GRANULE - 1) / GRANULE, 1, &i0, &i1);
    *o0 = i0 * GRANULE < n ? i0 * GRANULE : n;
    *o1 = i1 * GRANULE < n ? i1 * GRANULE : n;
}

static void moe_ffn(const kiln_thread *t, const moe_shape *m, float *out, const float *x, const int32_t *ids,
                    const float *weights, void *scratch, int32_t *reads) {
    moe_scratch s;
    carve(m, scratch, &s);
    const int n_used = m->n_used, n_ff = m->n_ff, n_embd = m->n_embd, slots = m->n_rows * n_used;
    _Alignas(64) uint8_t local[KILN_LOCAL_ACT_BYTES];
    /* 1. one row (decode): x quantized on each thread's stack, every slot reads it, the list on the
       stack too; else the rows into the scratch and thread 0's list, then each slot's copy */
    const int alone = m->n_rows == 1 && m->ag + m->au <= KILN_LOCAL_ACT_BYTES;
    int32_t first1[KILN_MOE_MAX_EXPERTS + 1], slot_row1[KILN_MOE_MAX_EXPERTS], slot_of1[KILN_MOE_MAX_EXPERTS];
    const int32_t *first = alone ? first1 : s.first, *slot_of = alone ? slot_of1 : s.slot_of;
    if (alone) {
        list_slots(m, ids, first1, slot_row1, slot_of1);
        kiln_quantize_act(m->in->type, x, local, n_embd);
        if (m->split_up) kiln_quantize_act(m->up->type, x, local + m->ag, n_embd);
    } else {
        for (int r = t->ith; r < m->n_rows; r += t->nth) {
            kiln_quantize_act(m->in->type, x + (size_t)r * n_embd, s.rows_g + r * m->ag, n_embd);
            if (m->split_up) kiln_quantize_act(m->up->type, x + (size_t)r * n_embd, s.rows_u + r * m->au, n_embd);
        }
        if (t->ith == 0) list_slots(m, ids, s.first, s.slot_row, s.slot_of);
        kiln_barrier(t);
        for (int i = t->ith; i < slots; i += t->nth) {
            memcpy(s.slots_g + i * m->ag, s.rows_g + s.slot_row[i] * m->ag, m->ag);
            if (m->split_up) memcpy(s.slots_u + i * m->au, s.rows_u + s.slot_row[i] * m->au, m->au);
        }
        kiln_barrier(t);
    }
    /* 2. gate and up, then act(gate) * up (without a gate: up, then gelu(up)), for this thread's
       granules of every chosen expert */
    int o0, o1;
    granules(t, n_ff, &o0, &o1);
    for (int e = 0; e < m->n_expert && o1 > o0; e++) {
        const int c = first[e + 1] - first[e];
        if (!c) continue;
        const uint8_t *ag = alone ? local : s.slots_g + first[e] * m->ag;
        const uint8_t *au = !m->split_up ? ag : alone ? local + m->ag : s.slots_u + first[e] * m->au;
        const kiln_moe_extra *x = m->extra;
        const int fused = x && x->fused_gate_up, rows = fused ? 2 * n_ff : n_ff;
        float *g = s.gu + (size_t)first[e] * 2 * n_ff, *u = g + n_ff; /* a slot's gate rows, then its up rows */
        if (m->gate)
            expert_rows(m->gate, e, rows, n_embd, o0, o1, ag, m->ag, c, g, 2 * n_ff, reads ? reads + 3 * e : NULL);
        /* up: rows n_ff + o of the fused slice (its place in gu), or rows o of its own */
        expert_rows(m->up, e, rows, n_embd, (fused ? n_ff : 0) + o0, (fused ? n_ff : 0) + o1, au,
                    m->split_up ? m->au : m->ag, c, fused ? g : u, 2 * n_ff, reads ? reads + 3 * e + 1 : NULL);
        if (x && x->gate_b) add_bias(g, 2 * n_ff, c, x->gate_b + (size_t)e * n_ff, o0, o1);
        if (x && x->up_b) add_bias(u, 2 * n_ff, c, x->up_b + (size_t)e * n_ff, o0, o1);
        for (int i = 0; i < c; i++) {
            float *gi = g + (size_t)i * 2 * n_ff + o0, *ui = u + (size_t)i * 2 * n_ff + o0;
            const int act = x ? x->act : KILN_ACT_SWIGLU;
            if (act == KILN_ACT_GELU) kiln_gelu(gi, ui, o1 - o0); /* no gate: gelu(up) in gate's place */
            else if (act == KILN_ACT_SWIGLU_OAI) kiln_swiglu_oai(gi, gi, ui, o1 - o0);
            else if (act == KILN_ACT_GEGLU) kiln_geglu(gi, gi, ui, o1 - o0);
            else kiln_swiglu(gi, gi, ui, o1 - o0);
        }
    }
    kiln_barrier(t);
    /* 3. the slots' rows quantized for down: on each thread's stack where they fit, as in decode */
    const int here = (size_t)slots * m->ad <= KILN_LOCAL_ACT_BYTES;
    uint8_t *act_h = here ? local : s.act_h;
    for (int i = here ? 0 : t->ith; i < slots; i += here ? 1 : t->nth)
        kiln_quantize_act(m->down->type, s.gu + (size_t)i * 2 * n_ff, act_h + i * m->ad, n_ff);
    if (!here) kiln_barrier(t);
    /* 4. down for this thread's granules of n_embd, then each row's experts summed in rank order */
    granules(t, n_embd, &o0, &o1);
    if (o1 == o0) return;
    for (int e = 0; e < m->n_expert; e++) {
        const int c = first[e + 1] - first[e];
        if (!c) continue;
        expert_rows(m->down, e, n_embd, n_ff, o0, o1, act_h + first[e] * m->ad, m->ad, c,
                    s.y + (size_t)first[e] * n_embd, n_embd, reads ? reads + 3 * e + 2 : NULL);
        float *ye = s.y + (size_t)first[e] * n_embd;
        if (m->extra && m->extra->down_scale) /* ggml_mul by the expert's scale, then its bias */
            for (int i = 0; i < c; i++)
                for (int o = o0; o < o1; o++) ye[(size_t)i * n_embd + o] *= m->extra->down_scale[e];
        if (m->extra && m->extra->down_b) add_bias(ye, n_embd, c, m->extra->down_b + (size_t)e * n_embd, o0, o1);
    }
    for (int r = 0; r < m->n_rows; r++) {
        float *yr = out + (size_t)r * n_embd;
        for (int j = 0; j < n_used; j++) {
            const float *ye = s.y + (size_t)slot_of[r * n_used + j] * n_embd, w = weights[r * n_used + j];
            if (j == 0)
                for (int o = o0; o < o1; o++) yr[o] = ye[o] * w;
            else
                for (int o = o0; o < o1; o++) yr[o] = yr[o] + ye[o] * w;
        }
    }
}

void kiln_moe_ffn_mt(const kiln_thread *t, float *y, const float *x, const int32_t *ids, const float *weights,
                     const kiln_weight *gate, const kiln_weight *up, const kiln_weight *down,
                     const kiln_moe_extra *extra, int n_rows, int n_expert, int n_used, int n_ff, int n_embd,
                     void *scratch) {
    const moe_shape m = shape_of(gate, up, down, n_rows, n_expert, n_used, n_ff, n_embd, extra);
    moe_ffn(t, &m, y, x, ids, weights, scratch, NULL);
}

/* the test entry: a pool of its own, and the rows each expert's matrices gave */
typedef struct {
    const moe_shape *m;
    float *y;
    const float *x, *weights;
    const int32_t *ids;
    void *scratch;
    int32_t *reads;
} moe_call;

static void moe_region(void *arg, const kiln_thread *t) {
    const moe_call *c = arg;
    moe_ffn(t, c->m, c->y, c->x, c->ids, c->weights, c->scratch, c->reads);
}

int kiln_moe_ffn(float *y, const float *x, const int32_t *ids, const float *weights, const kiln_weight *gate,
                 const kiln_weight *up, const kiln_weight *down, const kiln_moe_extra *extra, int n_rows, int n_expert,
                 int n_used, int n_ff, int n_embd, void *scratch, int n_threads, int32_t *reads) {
    const moe_shape m = shape_of(gate, up, down, n_rows, n_expert, n_used, n_ff, n_embd, extra);
    kiln_pool *pool = kiln_pool_create(n_threads);
    if (!pool) return -1;
    moe_call call = {&m, y, x, weights, ids, scratch, reads};
    kiln_pool_run(pool, moe_region, &call);
    kiln_pool_destroy(pool);
    return 0;
}
