/* moe_route.c: a mixture of experts' router, row by row: the softmax of the router's logits, the
 * top k experts by it, and their weights, as llama.cpp's build_moe_ffn computes them with softmax
 * gating (ggml_soft_max, ggml_argsort_top_k, ggml_get_rows, and for norm_w ggml_sum_rows,
 * ggml_clamp, ggml_div); or with softmax_weight gating (gpt-oss), the top k by the logits and the
 * softmax of those k.
 *
 * The choice of experts must be llama.cpp's even where probabilities tie, as they do exactly when
 * two experts' router rows are equal: ggml's CPU argsort is std::sort with `a > b`, which does not
 * keep the order of equal elements but leaves them in an order its algorithm fixes. kiln_argsort_desc
 * is libstdc++'s std::sort step for step (introsort: median-of-three partitions down to runs of 16,
 * a heap sort past 2 log2 n levels, then one insertion sort), so it leaves ties as llama.cpp's
 * build (gcc, libstdc++) does; a test compares it with std::sort itself.
 *
 * The probabilities are ggml_soft_max's bits as llama.cpp's AVX-512 build computes them
 * (ggml_vec_soft_max_f32): each block of 16 through ggml_v_expf, summed across its lanes in the
 * order _mm512_reduce_add_ps takes, then into a double; the last n % 16 through libm's expf, each
 * into the double. ggml_v_expf is spelled here one lane at a time, fma for fma (kiln builds with
 * -ffp-contract=off, and fmaf is exact on every target), so every target computes the same bits
 * and a row's experts and weights depend on neither the batch nor the CPU.
 */
#include <math.h>

#include "kernels_mt.h"

/* -- libstdc++'s std::sort on indices, compared by `v[a] > v[b]` ------------------------------ */
#define SORT_THRESHOLD 16 /* libstdc++'s _S_threshold */
#define GREATER(a, b) (v[a] > v[b])

static void swap_idx(int32_t *a, int32_t *b) {
    const int32_t t = *a;
    *a = *b, *b = t;
}

/* __push_heap: the value moves up from hole towards top while its parent compares below it */
static void push_heap(const float *v, int32_t *first, int hole, int top, int32_t value) {
    int parent = (hole - 1) / 2;
    while (hole > top && GREATER(first[parent], value)) {
        first[hole] = first[parent];
        hole = parent, parent = (hole - 1) / 2;
    }
    first[hole] = value;
}

/* __adjust_heap */
static void adjust_heap(const float *v, int32_t *first, int hole, int len, int32_t value) {
    const int top = hole;
    int child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (GREATER(first[child], first[child - 1])) child--;
        first[hole] = first[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        first[hole] = first[child - 1];
        hole = child - 1;
    }
    push_heap(v, first, hole, top, value);
}

/* __partial_sort(first, last, last): __make_heap, then __sort_heap */
static void heap_sort(const float *v, int32_t *first, int len) {
    if (len < 2) return;
    for (int parent = (len - 2) / 2;; parent--) {
        adjust_heap(v, first, parent, len, first[parent]);
        if (parent == 0) break;
    }
    for (int last = len - 1; last > 0; last--) { /* __pop_heap(first, last, last) */
        const int32_t value = first[last];
        first[last] = first[0];
        adjust_heap(v, first, 0, last, value);
    }
}

/* __move_median_to_first(result, a, b, c) */
static void median_to_first(const float *v, int32_t *result, int32_t *a, int32_t *b, int32_t *c) {
    if (GREATER(*a, *b)) {
        if (GREATER(*b, *c)) swap_idx(result, b);
        else if (GREATER(*a, *c)) swap_idx(result, c);
        else swap_idx(result, a);
    } else if (GREATER(*a, *c)) swap_idx(result, a);
    else if (GREATER(*b, *c)) swap_idx(result, c);
    else swap_idx(result, b);
}

/* __unguarded_partition_pivot: the pivot, median of (first + 1, mid, last - 1), moved to *first */
static int32_t *partition_pivot(const float *v, int32_t *first, int32_t *last) {
    median_to_first(v, first, first + 1, first + (last - first) / 2, last - 1);
    int32_t *lo = first + 1, *hi = last;
    for (;;) {
        while (GREATER(*lo, *first)) lo++;
        hi--;
        while (GREATER(*first, *hi)) hi--;
        if (!(lo < hi)) return lo;
        swap_idx(lo, hi);
        lo++;
    }
}

static void introsort_loop(const float *v, int32_t *first, int32_t *last, int depth) {
    while (last - first > SORT_THRESHOLD) {
        if (depth == 0) {
            heap_sort(v, first, (int)(last - first));
            return;
        }
        depth--;
        int32_t *cut = partition_pivot(v, first, last);
        introsort_loop(v, cut, last, depth);
        last = cut;
    }
}

/* __unguarded_linear_insert */
static void linear_insert(const float *v, int32_t *at) {
    const int32_t value = *at;
    int32_t *next = at - 1;
    while (GREATER(value, *next)) {
        *at = *next;
        at = next--;
    }
    *at = value;
}

/* __insertion_sort */
static void insertion_sort(const float *v, int32_t *first, int32_t *last) {
    if (first == last) return;
    for (int32_t *i = first + 1; i != last; i++) {
        if (GREATER(*i, *first)) {
            const int32_t value = *i;
            for (int32_t *p = i; p != first; p--) *p = p[-1];
            *first = value;
        } else {
            linear_insert(v, i);
        }
    }
}

void kiln_argsort_desc(const float *v, int32_t *idx, int n) {
    for (int i = 0; i < n; i++) idx[i] = i;
    if (n < 2) return;
    int lg = 0; /* std::__lg */
    while ((2 << lg) <= n) lg++;
    introsort_loop(v, idx, idx + n, 2 * lg);
    if (n > SORT_THRESHOLD) { /* __final_insertion_sort */
        insertion_sort(v, idx, idx + SORT_THRESHOLD);
        for (int32_t *i = idx + SORT_THRESHOLD; i != idx + n; i++) linear_insert(v, i);
    } else {
        insertion_sort(v, idx, idx + n);
    }
}
#undef GREATER

/* -- the router --------------------------------------------------------------------------------- */
/* ggml's least weight sum (the smallest normal f16), below which the sum is clamped */
#define WEIGHT_SUM_MIN 6.103515625e-5f

/* ggml_v_expf (ggml-cpu/vec.h, the AVX-512 spelling: its 2^n by vscalefps, ldexpf's exact
 * scaling), for the x <= 0 a softmax takes */
static float ggml_v_expf_lane(float x) {
    const float r = 0x1.8p23f, z = fmaf(x, 0x1.715476p+0f, r), n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x)), u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, fmaf(0x1.ffffecp-1f, b, 1.0f));
    if (fabsf(n) > 192) return n <= 0 ? 0.0f : INFINITY;
    return ldexpf(j, (int)n);
}

/* ggml_vec_soft_max_f32: y = e^(x - max) and their sum in double, as described above */
static double soft_max_exp(float *y, const float *x, float max, int n) {
    double sum = 0.0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        float v[8], w[4];
        for (int k = 0; k < 16; k++) y[i + k] = ggml_v_expf_lane(x[i + k] - max);
        for (int k = 0; k < 8; k++) v[k] = y[i + 8 + k] + y[i + k]; /* the high 256 bits onto the low */
        for (int k = 0; k < 4; k++) w[k] = v[4 + k] + v[k];         /* then 128 */
        sum += (double)((w[0] + w[2]) + (w[1] + w[3]));
    }
    for (; i < n; i++) sum += (double)(y[i] = expf(x[i] - max));
    return sum;
}

/* softmax_weight gating (gpt-oss): the top n_used by the logits, then the softmax of those */
static void route_row_by_logits(int32_t *ids, float *weights, const float *logits, int n_expert, int n_used) {
    int32_t order[KILN_MOE_MAX_EXPERTS];
    float top[KILN_MOE_MAX_EXPERTS], max = -INFINITY;
    kiln_argsort_desc(logits, order, n_expert);
    for (int j = 0; j < n_used; j++) {
        ids[j] = order[j], top[j] = logits[order[j]];
        max = top[j] > max ? top[j] : max;
    }
    const float inv = (float)(1.0 / soft_max_exp(weights, top, max, n_used));
    for (int j = 0; j < n_used; j++) weights[j] *= inv;
}

static void route_row(int32_t *ids, float *weights, const float *logits, int n_expert, int n_used, int normalize) {
    float p[KILN_MOE_MAX_EXPERTS];
    int32_t order[KILN_MOE_MAX_EXPERTS];
    float max = -INFINITY;
    for (int e = 0; e < n_expert; e++) max = logits[e] > max ? logits[e] : max;
    const float inv = (float)(1.0 / soft_max_exp(p, logits, max, n_expert));
    for (int e = 0; e < n_expert; e++) p[e] *= inv;
    kiln_argsort_desc(p, order, n_expert);
    double total = 0.0; /* ggml_sum_rows: in double, in order */
    for (int j = 0; j < n_used; j++) {
        ids[j] = order[j], weights[j] = p[order[j]];
        total += weights[j];
    }
    if (!normalize) return;
    float s = (float)total;
    s = s > WEIGHT_SUM_MIN ? s : WEIGHT_SUM_MIN;
    for (int j = 0; j < n_used; j++) weights[j] /= s;
}

void kiln_moe_route(int32_t *ids, float *weights, const float *logits, int n_rows, int n_expert, int n_used,
                    int normalize, int softmax_weight) {
    for (int r = 0; r < n_rows; r++) {
        int32_t *ir = ids + (size_t)r * n_used;
        float *wr = weights + (size_t)r * n_used;
        if (softmax_weight) route_row_by_logits(ir, wr, logits + (size_t)r * n_expert, n_expert, n_used);
        else route_row(ir, wr, logits + (size_t)r * n_expert, n_expert, n_used, normalize);
    }
}

void kiln_moe_route_mt(const kiln_thread *t, int32_t *ids, float *weights, const float *logits, int n_rows,
                       int n_expert, int n_used, int normalize, int softmax_weight) {
    int r0, r1;
    kiln_share(t, n_rows, 1, &r0, &r1);
    if (r1 > r0)
        kiln_moe_route(ids + (size_t)r0 * n_used, weights + (size_t)r0 * n_used, logits + (size_t)r0 * n_expert,
                       r1 - r0, n_expert, n_used, normalize, softmax_weight);
}
