/* ref_kquant.c: scalar references for the 256-element super-block types Q4_K, Q5_K, Q6_K and
 * the q8_K activation blocks their dots use, entered through the type table (types.c).
 *
 * Their dot, as every path computes it: per super-block b, in order,
 *     acc = fma((float)isum_b, d_b * y.d_b, acc),  mins = fma((float)msum_b, dmin_b * y.d_b, mins),
 * isum_b the sub-blocks' exact sum of scale x sum(q * y), msum_b that of min x sum(y) (Q4_K and
 * Q5_K; 0 for Q6_K); the dot is acc - mins. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "fp16.h"
#include "quant_impl.h"

/* q8_K: d = max|x| / 127 with the sign of the extreme value, q = round(x / d); bsums are
 * the sums of each 16 q, which the K-quant dots use to apply their per-sub-block minimum. */
void kiln_ref_quantize_q8_K(const float *x, void *dst, int n) {
    block_q8_K *y = dst;
    for (int b = 0; b < n / QK_K; b++, x += QK_K) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            const long v = lrintf(iscale * x[j]);
            y[b].qs[j] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += y[b].qs[16 * j + i];
            y[b].bsums[j] = (int16_t)sum;
        }
        y[b].d = 1.0f / iscale;
    }
}

/* The 6-bit scale and min of sub-block j (of 8), packed into 12 bytes. */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Weight l of a Q4_K/Q5_K super-block as an unsigned integer: sub-blocks of 32 pair up
 * in groups of 64 sharing 32 bytes of qs (low nibbles first), Q5_K adds bit (l/32) of qh[l%32]. */
static inline int q4k_value(const block_q4_K *x, int l) {
    const uint8_t byte = x->qs[(l / 64) * 32 + l % 32];
    return (l / 32) % 2 ? byte >> 4 : byte & 0x0F;
}

static inline int q5k_value(const block_q5_K *x, int l) {
    const uint8_t byte = x->qs[(l / 64) * 32 + l % 32];
    const int low = (l / 32) % 2 ? byte >> 4 : byte & 0x0F;
    return low | (((x->qh[l % 32] >> (l / 32)) & 1) << 4);
}

/* Weight l of a Q6_K super-block, in -32..31: halves of 128 each use 64 bytes of ql and 32 of qh. */
static inline int q6k_value(const block_q6_K *x, int l) {
    const int half = l / 128, r = l % 128, quarter = r / 32, i = r % 32;
    const uint8_t lo = x->ql[half * 64 + (quarter % 2) * 32 + i];
    const int low = quarter < 2 ? lo & 0x0F : lo >> 4;
    const int high = (x->qh[half * 32 + i] >> (2 * quarter)) & 3;
    return (low | high << 4) - 32;
}

/* Q4_K and Q5_K share their head (d, dmin, 12 bytes of scales) and their arithmetic;
 * only the way a weight's integer is read differs. */
typedef struct {
    kiln_half d, dmin;
    uint8_t scales[K_SCALE_SIZE];
} k4_head;
_Static_assert(offsetof(block_q4_K, qs) == sizeof(k4_head) && offsetof(block_q5_K, qh) == sizeof(k4_head),
               "Q4_K and Q5_K begin with the same head");

typedef int (*k4_value_fn)(const void *block, int l);

static int q4k_at(const void *block, int l) { return q4k_value(block, l); }
static int q5k_at(const void *block, int l) { return q5k_value(block, l); }

static void dequant_k4(const uint8_t *src, size_t block_bytes, k4_value_fn value, float *dst, int n) {
    for (int b = 0; b < n / QK_K; b++, src += block_bytes, dst += QK_K) {
        const k4_head *h = (const k4_head *)src;
        const float d = kiln_fp16_to_fp32(h->d), dmin = kiln_fp16_to_fp32(h->dmin);
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m;
            scale_min_k4(j, h->scales, &sc, &m);
            for (int i = 0; i < 32; i++) dst[32 * j + i] = d * sc * value(src, 32 * j + i) - dmin * m;
        }
    }
}

static float dot_k4(const uint8_t *w, size_t block_bytes, k4_value_fn value, const block_q8_K *y, int n) {
    float acc = 0.0f, mins = 0.0f;
    for (int b = 0; b < n / QK_K; b++, w += block_bytes) {
        const k4_head *h = (const k4_head *)w;
        int sumi = 0, summ = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m, s = 0;
            scale_min_k4(j, h->scales, &sc, &m);
            for (int i = 0; i < 32; i++) s += value(w, 32 * j + i) * y[b].qs[32 * j + i];
            sumi += sc * s;
            summ += m * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
        }
        acc = fmaf((float)sumi, kiln_fp16_to_fp32(h->d) * y[b].d, acc);
        mins = fmaf((float)summ, kiln_fp16_to_fp32(h->dmin) * y[b].d, mins);
    }
    return acc - mins;
}

/* every weight of a super-block at once, as the unsigned u the x8 layout stores (Q6_K: q + 32):
   one call a row's super-block, where the packer once made 256 */
void kiln_kquant_values(int type, const void *block, uint8_t u[QK_K]) {
    switch (type) {
    case KILN_Q4_K: for (int l = 0; l < QK_K; l++) u[l] = (uint8_t)q4k_value(block, l); break;
    case KILN_Q5_K: for (int l = 0; l < QK_K; l++) u[l] = (uint8_t)q5k_value(block, l); break;
    default: for (int l = 0; l < QK_K; l++) u[l] = (uint8_t)(q6k_value(block, l) + 32); break;
    }
}

void kiln_ref_dequant_q4_K(const void *src, float *dst, int n) { dequant_k4(src, sizeof(block_q4_K), q4k_at, dst, n); }
void kiln_ref_dequant_q5_K(const void *src, float *dst, int n) { dequant_k4(src, sizeof(block_q5_K), q5k_at, dst, n); }
float kiln_ref_dot_q4_K(int n, const void *w, const void *act) { return dot_k4(w, sizeof(block_q4_K), q4k_at, act, n); }
float kiln_ref_dot_q5_K(int n, const void *w, const void *act) { return dot_k4(w, sizeof(block_q5_K), q5k_at, act, n); }

void kiln_ref_dequant_q6_K(const void *src, float *dst, int n) {
    const block_q6_K *x = src;
    for (int b = 0; b < n / QK_K; b++, dst += QK_K) {
        const float d = kiln_fp16_to_fp32(x[b].d);
        for (int l = 0; l < QK_K; l++) dst[l] = d * x[b].scales[l / 16] * q6k_value(&x[b], l);
    }
}

float kiln_ref_dot_q6_K(int n, const void *w, const void *act) {
    const block_q6_K *x = w;
    const block_q8_K *y = act;
    float acc = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        int sumi = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += q6k_value(&x[b], 16 * j + i) * y[b].qs[16 * j + i];
            sumi += x[b].scales[j] * s;
        }
        acc = fmaf((float)sumi, kiln_fp16_to_fp32(x[b].d) * y[b].d, acc);
    }
    return acc; /* - mins, which Q6_K has none of */
}
