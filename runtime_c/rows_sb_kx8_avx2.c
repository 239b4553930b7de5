/* rows_sb_kx8_avx2.c: the prefill tiles of Q2_K, Q3_K and IQ4_XS built from a packed matrix's kx8
 * blocks (x8_pack.c), which hold 8 rows already interleaved as the tile's are: no unpacking a row
 * at a time. x8_vnni.c and x8_avx2.c hand these types' steps of BUFFER_A activation rows and more
 * here, where the kx8 kernels would unpack each block again for every 8 activation rows. The tile's
 * bytes are the ones rows_sb_avx2.c builds from the GGUF rows, so the gemms and their bits are the
 * same (sb_tile_avx2.h).
 */
#include <string.h>

#include "quant_impl.h"
#include "sb_tile_avx2.h"
#include "sb_unpack_avx2.h"

#ifdef KILN_HAVE_AVX2
/* a kx8 chunk of 32 weights of 8 rows as signed q: v[k] holds weights 4k..4k+3 of each row */
INLINE void kx8_chunk_q(const int type, const uint8_t *chunk, __m256i v[8]) {
    if (type == KILN_Q3_K || type == KILN_Q2_K) { /* 2-bit fields u[4h + s] at bits 2s of vector h; Q3_K's
                                                   third bit from its plane, less 4 */
        const int q3 = type == KILN_Q3_K;
        uint32_t plane[8];
        if (q3) memcpy(plane, chunk, sizeof plane);
        for (int h = 0; h < 2; h++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(chunk + (q3 ? 32 : 0) + 32 * h));
            for (int s = 0; s < 4; s++) {
                v[4 * h + s] = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * s), _mm256_set1_epi8(3));
                if (q3) {
                    const __m256i high = _mm256_and_si256(sign_masks(plane[4 * h + s]), _mm256_set1_epi8(4));
                    v[4 * h + s] = _mm256_sub_epi8(_mm256_or_si256(v[4 * h + s], high), _mm256_set1_epi8(4));
                }
            }
        }
        return;
    }
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kiln_kvalues_iq4nl));
    for (int h = 0; h < 4; h++) { /* nibbles: u[2h] low, u[2h + 1] high */
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(chunk + 32 * h)), m4 = _mm256_set1_epi8(15);
        v[2 * h] = _mm256_shuffle_epi8(lut, _mm256_and_si256(raw, m4));
        v[2 * h + 1] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
    }
}

/* a * b for signed bytes whose products fit a byte, by their 16-bit products' low bytes */
INLINE __m256i mul_bytes(__m256i a, __m256i b) {
    const __m256i even = _mm256_mullo_epi16(a, b);
    const __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
    return _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0xFF)), _mm256_slli_epi16(odd, 8));
}

/* A tile's super-block from the kx8 blocks of its T / 8 groups (w, group bytes apart; past the
 * last of n_groups, the last again): the bytes build_tile writes from the GGUF rows, the kx8
 * layout's 8 rows already interleaved as the tile's are, with no unpacking a row at a time. */
INLINE void build_tile_kx8(const int type, const uint8_t *w, size_t group, int n_groups, uint8_t flip_byte,
                           sb_tile *t) {
    const int q3 = type == KILN_Q3_K, q2 = type == KILN_Q2_K;
    const __m256i flip = _mm256_set1_epi8((char)flip_byte);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5,
                                            6, 6, 6, 6, 7, 7, 7, 7);
    for (int h = 0; h < T / 8; h++) {
        const uint8_t *blk = w + (size_t)(h < n_groups ? h : n_groups - 1) * group, *sc = blk + (q2 ? 32 : 16);
        for (int r = 0; r < 8; r++) {
            kiln_half d[2];
            memcpy(d, blk + 2 * r, sizeof d[0]);
            memcpy(d + 1, blk + 16 + 2 * r, sizeof d[1]);
            t->d[8 * h + r] = kiln_fp16_to_fp32(d[0]), t->dmin[8 * h + r] = q2 ? kiln_fp16_to_fp32(d[1]) : 0.0f;
        }
        for (int p = 0; q2 && p < QK_K / 32; p++) { /* Q2_K's minimums of sub-blocks 2p and 2p + 1 as int16 pairs */
            const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * p)));
            const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * p + 8)));
            _mm256_storeu_si256((__m256i *)(t->mp[p] + 8 * h),
                                _mm256_or_si256(_mm256_srli_epi32(lo, 4), _mm256_slli_epi32(_mm256_srli_epi32(hi, 4), 16)));
        }
        for (int j = 0; j < QK_K / 16; j++) { /* the rows' scale of each 16 weights (Q2_K: its bytes' low nibbles) */
            const __m128i b = _mm_loadl_epi64((const __m128i *)(sc + 8 * (q3 || q2 ? j : j / 2)));
            const __m256i v = q2 ? _mm256_and_si256(_mm256_cvtepu8_epi32(b), _mm256_set1_epi32(15)) : _mm256_cvtepi8_epi32(b);
#ifdef TILE_VNNI
            _mm256_storeu_si256((__m256i *)(t->sc[j] + 8 * h), v);
#else
            _mm256_storeu_si256((__m256i *)(t->sc[j] + 8 * h),
                                _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16)));
#endif
        }
        const uint8_t *chunk = blk + kiln_kx8_head(type);
        for (int c = 0; c < 8; c++, chunk += kiln_kx8_chunk(type)) {
            __m256i v[8];
            kx8_chunk_q(type, chunk, v);
            for (int k = 0; k < 8; k++) {
                if (premultiplied(type)) { /* -q sc (Q3_K), q sc (Q2_K): sub-block 2c + k / 4's scale of row r in
                                             bytes 4r..4r+3 */
                    const __m256i s8 = _mm256_shuffle_epi8(
                        _mm256_broadcastsi128_si256(_mm_loadl_epi64((const __m128i *)(sc + 8 * (2 * c + k / 4)))), spread);
                    v[k] = mul_bytes(v[k], q2 ? _mm256_and_si256(s8, _mm256_set1_epi8(15))
                                              : _mm256_sub_epi8(_mm256_setzero_si256(), s8));
                }
                _mm256_storeu_si256((__m256i *)(t->q[8 * c + k] + 32 * h), _mm256_xor_si256(v[k], flip));
            }
        }
    }
}

/* groups [g0, g1) of 8 rows: a tile's T / 8 groups at a time */
INLINE int rows_sb_kx8(const int type, const uint8_t *w, int g0, int g1, int nb, const uint8_t *act, size_t a_row,
                       int n_a, float *y, size_t y_row) {
    sb_prefill p;
    if (n_a < BUFFER_A || !sb_prefill_begin(type, nb, act, a_row, n_a, &p)) return 0;
    const size_t kb = kiln_kx8_bytes(type), group = (size_t)nb * kb;
    const uint8_t flip = sb_tile_flip(type, &p);
    for (int g = g0; g < g1; g += T / 8) {
        const int n_groups = g1 - g < T / 8 ? g1 - g : T / 8, r0 = 8 * g;
        for (int b = 0; b < nb; b++)
            build_tile_kx8(type, w + (size_t)g * group + (size_t)b * kb, group, n_groups, flip, p.tile + b);
        sb_tile_rows(type, &p, nb, act, a_row, n_a, y + r0, y_row, 8 * n_groups);
    }
    sb_prefill_end(&p);
    return 1;
}

int kiln_rows_sb_kx8(int type, const uint8_t *w, int g0, int g1, int n_in, const uint8_t *act, size_t a_row, int n_a,
                     float *y, size_t y_row) {
    switch (type) { /* each type its own copy, the type a constant in it */
    case KILN_Q3_K: return rows_sb_kx8(KILN_Q3_K, w, g0, g1, n_in / QK_K, act, a_row, n_a, y, y_row);
    case KILN_IQ4_XS: return rows_sb_kx8(KILN_IQ4_XS, w, g0, g1, n_in / QK_K, act, a_row, n_a, y, y_row);
    case KILN_Q2_K: return rows_sb_kx8(KILN_Q2_K, w, g0, g1, n_in / QK_K, act, a_row, n_a, y, y_row);
    default: return 0;
    }
}
#endif
