/* act_avx2.c: AVX2 twins of the q8 activation quantizers (q8_0, q8_1: ref_quant.c; q8_K:
 * ref_kquant.c) and of the dequantizers of the f16 and q8_0 KV caches: the scalar references'
 * exact bytes and values. */
#include <string.h>

#include "fp16.h"
#include "quant_impl.h"

#ifdef KILN_HAVE_AVX2
#include <immintrin.h>

static inline int hsum8_i32(__m256i v) {
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(x);
}

/* ==== activation quantizers: the scalar ones' exact bits ========================================= */

/* roundf(v) for 8 floats: half-way cases away from zero (the rounding modes of the ISA are
 * half-to-even), as the scalar quantizers do: v plus the float just below 1/2 with v's sign,
 * truncated. The sum rounds to the next integer exactly when v's fraction is 1/2 or more (a half
 * plus that float is one ulp short of the integer, and rounds to it); at 2^23 and up every float
 * is an integer and the sum rounds back to v. The same int32 as trunc, compare and add for every
 * one of the 2^32 floats, NaN and inf included (checked exhaustively), in four instructions for nine. */
static inline __m256i round_away(__m256 v) {
    const __m256 half = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(0x1.fffffep-2f));
    return _mm256_cvttps_epi32(_mm256_add_ps(v, half));
}

/* 4 x 8 int32 (each within int8) -> 32 int8 in order; the packs interleave 128-bit lanes, the
 * permute undoes it */
static inline void narrow32(const __m256i q[4], int8_t *dst) {
    const __m256i q16 = _mm256_packs_epi32(q[0], q[1]), q16b = _mm256_packs_epi32(q[2], q[3]);
    _mm256_storeu_si256((__m256i *)dst, _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16, q16b),
                                                                    _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* one block of 32: q = round(x / d) as bytes with d = max|x| / 127 (returned); *sum = sum(q) */
static inline float quantize_block(const float *x, int8_t *qs, int *sum) {
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f, id = d ? 1.0f / d : 0.0f;
    __m256i q[4];
    for (int k = 0; k < 4; k++) q[k] = round_away(_mm256_mul_ps(v[k], _mm256_set1_ps(id)));
    narrow32(q, qs);
    *sum = hsum8_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    return d;
}

/* Eight vectors reduced at once, vector k's max (or sum) into lane k: a transposing tree of 7 ops
   for 8 reductions. Each level pairs lanes (unpack), then halves (shuffle), then 128-bit lanes. */
static inline __m256 max8x8(const __m256 v[8]) {
    __m256 a[4], b[2];
    for (int k = 0; k < 4; k++) a[k] = _mm256_max_ps(_mm256_unpacklo_ps(v[2 * k], v[2 * k + 1]),
                                                     _mm256_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    for (int k = 0; k < 2; k++) b[k] = _mm256_max_ps(_mm256_shuffle_ps(a[2 * k], a[2 * k + 1], 0x44),
                                                     _mm256_shuffle_ps(a[2 * k], a[2 * k + 1], 0xEE));
    return _mm256_max_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20), _mm256_permute2f128_ps(b[0], b[1], 0x31));
}

static inline __m256i sum8x8(const __m256i v[8]) {
    __m256i a[4], b[2];
    for (int k = 0; k < 4; k++) a[k] = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2 * k], v[2 * k + 1]),
                                                        _mm256_unpackhi_epi32(v[2 * k], v[2 * k + 1]));
    for (int k = 0; k < 2; k++) {
        const __m256 lo = _mm256_castsi256_ps(a[2 * k]), hi = _mm256_castsi256_ps(a[2 * k + 1]);
        b[k] = _mm256_add_epi32(_mm256_castps_si256(_mm256_shuffle_ps(lo, hi, 0x44)),
                                _mm256_castps_si256(_mm256_shuffle_ps(lo, hi, 0xEE)));
    }
    return _mm256_add_epi32(_mm256_permute2x128_si256(b[0], b[1], 0x20), _mm256_permute2x128_si256(b[0], b[1], 0x31));
}

/* Eight blocks of 32 at once, so that the reductions, the divisions and the f16 conversions, each a
   long dependent chain for one block, are one vector op for eight: d[k] = max|x_k| / 127 and
   id[k] = 1 / d[k] (0 for an all-zero block) as the scalar quantizer makes them, q8 values into qs
   (block k at qs + k * stride), their sums into sum[k]. The same bits: max and the integer sums do
   not depend on order, vdivps rounds as divss, vcvtps2ph as the (_Float16) conversion. */
static inline void quantize_8_blocks(const float *x, uint8_t *qs, size_t stride, __m256 *d_out, __m256i *sum_out) {
    const __m256 abs_mask = _mm256_set1_ps(-0.0f);
    __m256 amax[8];
    for (int k = 0; k < 8; k++) {
        const float *xb = x + 32 * k;
        amax[k] = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(abs_mask, _mm256_loadu_ps(xb)),
                                              _mm256_andnot_ps(abs_mask, _mm256_loadu_ps(xb + 8))),
                                _mm256_max_ps(_mm256_andnot_ps(abs_mask, _mm256_loadu_ps(xb + 16)),
                                              _mm256_andnot_ps(abs_mask, _mm256_loadu_ps(xb + 24))));
    }
    const __m256 d = _mm256_div_ps(max8x8(amax), _mm256_set1_ps(127.0f));
    const __m256 nonzero = _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_OQ);
    const __m256 id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d), nonzero);
    float ids[8];
    _mm256_storeu_ps(ids, id);
    __m256i sums[8];
    for (int k = 0; k < 8; k++) {
        const __m256 s = _mm256_set1_ps(ids[k]);
        __m256i q[4];
        for (int j = 0; j < 4; j++) q[j] = round_away(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * k + 8 * j), s));
        narrow32(q, (int8_t *)(qs + k * stride));
        sums[k] = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    }
    *d_out = d, *sum_out = sum8x8(sums);
}

/* q8_0 (has_min 0) or q8_1 blocks of x[n]; where `tile` is given, also each block b's d and d * sum (q8_1)
   as floats and its sum of values at tile[b * 8 + lane] of three arrays of n / 32 * 8 (x8_vnni.c's tile
   of activation scales), from the vectors the quantization made them in */
static inline void quantize_q8(const int has_min, const float *x, void *dst, int n, uint8_t *tile, int lane) {
    const size_t bytes = has_min ? sizeof(block_q8_1) : sizeof(block_q8_0), nb = (size_t)n / 32;
    float *yd = tile ? (float *)tile + lane : NULL, *ys = tile ? yd + 8 * nb : NULL;
    int32_t *ysum = tile ? (int32_t *)(ys + 8 * nb) : NULL;
    const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    size_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m256 d;
        __m256i sums;
        uint8_t *blk = (uint8_t *)dst + b * bytes;
        quantize_8_blocks(x + b * 32, blk + (has_min ? 4 : 2), bytes, &d, &sums);
        kiln_half h[8], hs[8];
        const __m128i dh = _mm256_cvtps_ph(d, rnd);
        const __m128i sh = has_min ? _mm256_cvtps_ph(_mm256_mul_ps(d, _mm256_cvtepi32_ps(sums)), rnd) : _mm_setzero_si128();
        _mm_storeu_si128((__m128i *)h, dh), _mm_storeu_si128((__m128i *)hs, sh);
        for (int k = 0; k < 8; k++) {
            memcpy(blk + k * bytes, &h[k], 2);
            if (has_min) memcpy(blk + k * bytes + 2, &hs[k], 2);
        }
        if (tile) {
            float fd[8], fs[8];
            int32_t is[8];
            _mm256_storeu_ps(fd, _mm256_cvtph_ps(dh)), _mm256_storeu_ps(fs, _mm256_cvtph_ps(sh));
            _mm256_storeu_si256((__m256i *)is, sums);
            for (int k = 0; k < 8; k++) yd[(b + k) * 8] = fd[k], ys[(b + k) * 8] = fs[k], ysum[(b + k) * 8] = is[k];
        }
    }
    for (; b < nb; b++) {
        int sum;
        uint8_t *blk = (uint8_t *)dst + b * bytes;
        const float d = quantize_block(x + b * 32, (int8_t *)blk + (has_min ? 4 : 2), &sum);
        const kiln_half h = kiln_fp32_to_fp16(d), hs = has_min ? kiln_fp32_to_fp16(d * (float)sum) : 0;
        memcpy(blk, &h, 2);
        if (has_min) memcpy(blk + 2, &hs, 2);
        if (tile) yd[b * 8] = kiln_fp16_to_fp32(h), ys[b * 8] = has_min ? kiln_fp16_to_fp32(hs) : 0.0f, ysum[b * 8] = sum;
    }
}

void kiln_quantize_q8_0_avx2(const float *x, void *dst, int n) { quantize_q8(0, x, dst, n, NULL, 0); }

void kiln_quantize_q8_1_avx2(const float *x, void *dst, int n) { quantize_q8(1, x, dst, n, NULL, 0); }

void kiln_quantize_q8_tile_avx2(int has_min, const float *x, void *dst, int n, uint8_t *tile, int lane) {
    quantize_q8(has_min, x, dst, n, tile, lane);
}
/* the first j with |x[j]| == amax, eight at a time (kiln_q8_K_iscale's scan, one value at a time, had
   taken as long as the rest of the block's quantization); amax is one of the 256 values */
static inline int first_at(const float *x, float amax) {
    const __m256 abs_mask = _mm256_set1_ps(-0.0f), m = _mm256_set1_ps(amax);
    for (int j = 0;; j += 8) {
        const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(abs_mask, _mm256_loadu_ps(x + j)), m, _CMP_EQ_OQ));
        if (eq) return j + __builtin_ctz((unsigned)eq);
    }
}

/* q8_K: d = max|x| / 127 with the sign of the first value that reaches it, q = lrintf(x / d)
 * (at most 127; lrintf rounds half to even, as vcvtps2dq does), bsums the sums of each 16 q */
void kiln_quantize_q8_K_avx2(const float *x, void *dst, int n) {
    block_q8_K *y = dst;
    for (int b = 0; b < n / QK_K; b++, x += QK_K) {
        __m256 m4[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int j = 0; j < QK_K; j += 32) /* max_ps gives its second operand for a NaN: passed over, as by >; */
            for (int k = 0; k < 4; k++) /* four chains, as max is exact in any order */
                m4[k] = _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + j + 8 * k)), m4[k]);
        const __m256 m8 = _mm256_max_ps(_mm256_max_ps(m4[0], m4[1]), _mm256_max_ps(m4[2], m4[3]));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -127.0f / x[first_at(x, amax)];
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            for (int k = 0; k < 4; k++) {
                const __m256 v = _mm256_mul_ps(_mm256_set1_ps(iscale), _mm256_loadu_ps(x + j + 8 * k));
                q[k] = _mm256_min_epi32(_mm256_cvtps_epi32(v), _mm256_set1_epi32(127));
            }
            y[b].bsums[j / 16] = (int16_t)hsum8_i32(_mm256_add_epi32(q[0], q[1]));
            y[b].bsums[j / 16 + 1] = (int16_t)hsum8_i32(_mm256_add_epi32(q[2], q[3]));
            narrow32(q, y[b].qs + j);
        }
        y[b].d = 1.0f / iscale;
    }
}

/* ==== dequantizers of the KV cache types: the scalar ones' exact values ========================= */

void kiln_dequant_f16_avx2(const void *src, float *dst, int n) {
    const kiln_half *s = src;
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) dst[i] = kiln_fp16_to_fp32(s[i]);
}

/* f32 -> f16 rows (the KV cache's): vcvtps2ph rounds to nearest even, as the (_Float16) conversion
   of the reference, which GCC makes a libgcc call per value where the target has no AVX-512 FP16 */
void kiln_quantize_f16_avx2(const float *x, void *dst, int n) {
    kiln_half *h = dst;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) h[i] = kiln_fp32_to_fp16(x[i]);
}

void kiln_dequant_q8_0_avx2(const void *src, float *dst, int n) {
    const block_q8_0 *x = src;
    for (int b = 0; b < n / QK8_0; b++, dst += QK8_0) {
        const __m256 d = _mm256_set1_ps(kiln_fp16_to_fp32(x[b].d));
        for (int k = 0; k < QK8_0; k += 8) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(x[b].qs + k)));
            _mm256_storeu_ps(dst + k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
        }
    }
}
#endif
