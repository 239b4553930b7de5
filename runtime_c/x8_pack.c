/* x8_pack.c: weights repacked at compile time so that eight rows share each vector (x8).
 *
 * A matmul against few activation rows (decode above all) spends most of its instructions on
 * per-block bookkeeping when it reads the GGUF layout: converting scales, broadcasting them,
 * reducing each block's lanes. Interleaving eight rows removes it: in the x8 layout one 32-byte
 * vector holds 4 weights of each of 8 rows, so vpdpbusd against 4 activation bytes broadcast
 * to every lane yields 8 row sums at once, and the 8 rows' scales are one 16-byte load. The
 * AVX-512 kernels (x8_vnni.c) put two such blocks (two groups of rows) in each 512-bit vector,
 * and in prefill and batched steps each unpacked weight block serves 8 activation rows.
 *
 * Layout of a matrix of n_out rows (n_out % 8 == 0): groups of 8 rows, each a run of x8
 * blocks, one per 32-weight block of the row. An x8 block holds, in order:
 *   d[8]          f16, the rows' scales (MXFP4: e[8], its E8M0 bytes)
 *   m[8]          f16, the rows' minimums (Q4_1, Q5_1)
 *   qh[32]        5-bit types: bit c of byte 4r+j is the fifth bit of weight 4c+j of row r (a
 *                 kernel moves it to u[c]'s bit 4 with one shift and a mask)
 *   qs            4-bit types: 4 vectors of 32 bytes; byte 4r+j of vector v has weight 8v+j of
 *                 row r in its low nibble and weight 8v+4+j in its high nibble (IQ4_NL and
 *                 MXFP4: the GGUF's nibbles, the indexes into their tables)
 *                 Q8_0: 8 vectors of 32 bytes; byte 4r+j of vector c is weight 4c+j of row r,
 *                 stored as q ^ 0x80 (unsigned, offset 128)
 * which is exactly as many bytes as the eight GGUF blocks it replaces. The compiler packs with
 * kiln_pack_x8 into a file that the model library maps.
 *
 * The K-quants go the same way a 256-weight super-block at a time (kx8 blocks): the 8 rows'
 * scales first, unpacked to one byte each and arranged [sub-block][row] so that a sub-block's 8
 * scales are one 8-byte load; then each 32-weight chunk in the 32-weight layout above:
 *   Q4_K, Q5_K: d[8], dmin[8] f16; sc[8][8], m[8][8] u8; 8 x ([Q5_K: qh[32] as above] qs[128])
 *               (32 bytes a group more than GGUF's: the 6-bit scales as bytes)
 *   Q6_K:       d[8] f16; sc[16][8] i8; 8 x (hi[64], qs[128]), u = q + 32 in 0..63, its low nibble
 *               in qs and its top two bits (u >> 4) as 2-bit fields in hi (exactly GGUF's bytes)
 *   IQ4_XS:     d[8] f16; sc[8][8] i8 (ls - 32); 8 x qs[128], the GGUF's nibbles, indexes into
 *               kvalues_iq4nl (16 bytes a group more than GGUF's: the 6-bit scales as bytes)
 *   Q3_K:       d[8] f16; sc[16][8] i8 (sc - 32); 8 x (qh4[8] u32, qs[64]), u = q + 4 in 0..7 as
 *               2-bit fields and its third bit as a plane (32 bytes a group more than GGUF's)
 *   Q2_K:       d[8], dmin[8] f16; scales[16][8] u8 (GGUF's bytes, m << 4 | sc); 8 x qs[64], u = q
 *               in 0..3 as 2-bit fields (exactly GGUF's bytes)
 * Their integer sums are the references' (ref_kquant.c): sum over sub-blocks of scale x sum(u * y),
 * Q4_K's minimum from q8_K's sums, Q6_K's -32 offset seeding each sub-block's sum.
 *
 * The kernels on this layout compute each row's integer sums exactly as the scalar references
 * do (ref_quant.c, ref_kquant.c) and then their float steps, in their order: a row's value is
 * the reference dot's, bit for bit.
 */
#include <string.h>

#include "x8.h"

size_t kiln_x8_bytes(int type, int n_out, int n_in) {
    if (kiln_is_kx8(type)) return (size_t)(n_out / 8) * (size_t)(n_in / QK_K) * kiln_kx8_bytes(type);
    return (size_t)n_out * kiln_row_bytes(type, n_in);
}

int kiln_x8_packs(int type, int n_out, int n_in) {
    kiln_b32 f;
    if (n_out % 8 != 0 || n_in > KILN_X8_MAX_IN) return 0;
    return kiln_is_kx8(type) ? n_in % QK_K == 0 : kiln_x8_b32_of(type, &f) && n_in % 32 == 0;
}

int kiln_x8_kernels(void) {
#ifdef KILN_HAVE_X8
    return 1;
#else
    return 0; /* matmuls read the GGUF layout */
#endif
}

int kiln_amx_prefill(int type) {
    kiln_b32 f;
    return kiln_x8_b32_of(type, &f) || (kiln_is_sb(type) && type != KILN_Q2_K);
}

int kiln_x8_supported(int type, int n_out, int n_in) { return kiln_x8_kernels() && kiln_x8_packs(type, n_out, n_in); }

/* The packed file: this header, then the packed region. It names the GGUF the region was packed
   from (its size and the CRC-32 of its header), so that a library never maps another's. */
typedef struct {
    char magic[8];
    uint64_t gguf_bytes;
    uint32_t gguf_crc, zero;
    uint64_t packed_bytes;
} packed_header;
_Static_assert(sizeof(packed_header) <= KILN_PACKED_HEADER_BYTES, "the packed header fits its bytes");
static const char PACKED_MAGIC[8] = {'K', 'I', 'L', 'N', 'X', '8', 0, 1};

void kiln_packed_header(uint8_t out[KILN_PACKED_HEADER_BYTES], uint64_t gguf_bytes, uint32_t gguf_crc,
                        uint64_t packed_bytes) {
    packed_header h = {{0}, gguf_bytes, gguf_crc, 0, packed_bytes};
    memcpy(h.magic, PACKED_MAGIC, sizeof h.magic);
    memset(out, 0, KILN_PACKED_HEADER_BYTES);
    memcpy(out, &h, sizeof h);
}

int kiln_packed_header_matches(const uint8_t *in, uint64_t gguf_bytes, uint32_t gguf_crc, uint64_t packed_bytes) {
    packed_header h;
    memcpy(&h, in, sizeof h);
    return memcmp(h.magic, PACKED_MAGIC, sizeof h.magic) == 0 && h.gguf_bytes == gguf_bytes &&
           h.gguf_crc == gguf_crc && h.packed_bytes == packed_bytes;
}

/* The 32 weights of one row's GGUF block as the unsigned bytes u the x8 layout stores. */
static void b32_values(const kiln_b32 *f, const uint8_t *blk, uint8_t u[32]) {
    const uint8_t *qs = blk + f->qs_at;
    if (f->bits == 8) {
        for (int j = 0; j < 32; j++) u[j] = qs[j] ^ 0x80;
        return;
    }
    for (int j = 0; j < 16; j++) u[j] = qs[j] & 0x0F, u[j + 16] = qs[j] >> 4;
    if (f->qh_at) {
        uint32_t qh;
        memcpy(&qh, blk + f->qh_at, sizeof qh); /* bit j: weight j's fifth bit */
        for (int j = 0; j < 32; j++) u[j] |= (uint8_t)(((qh >> j) & 1) << 4);
    }
}

/* One 32-weight chunk of 8 rows in the x8 layout, row r's 32 values u[r]: 8-bit values as
 * bytes (byte 4r+k of vector c: weight 4c+k); nibbles in qs (byte 4r+k of vector v: weight
 * 8v+k low, 8v+4+k high) and, where hi is not NULL, the fifth bits in its 32 bytes (byte 4r+k,
 * bit c: weight 4c+k's); or 2-bit fields (byte 4r+k of vector v holds weight 16v+4s+k at bits
 * 2s) and, where hi is not NULL (Q3_K), bit 2 as a plane (bit 4r+k of word c: weight 4c+k's).
 * The caller zeroed hi. Each output byte is made once, from whole rows, so packing runs near the
 * speed of a copy. */
static void put_chunk(const uint8_t *const u[8], int bits, uint8_t *hi, uint8_t *qs) {
    for (int r = 0; r < 8; r++) {
        const uint8_t *x = u[r];
        if (bits == 8) {
            for (int c = 0; c < 8; c++) memcpy(qs + 32 * c + 4 * r, x + 4 * c, 4);
            continue;
        }
        if (bits == 2)
            for (int v = 0; v < 2; v++)
                for (int k = 0; k < 4; k++) {
                    uint8_t byte = 0;
                    for (int s = 0; s < 4; s++) byte |= (uint8_t)((x[16 * v + 4 * s + k] & 3) << (2 * s));
                    qs[32 * v + 4 * r + k] = byte;
                }
        else
            for (int v = 0; v < 4; v++)
                for (int k = 0; k < 4; k++)
                    qs[32 * v + 4 * r + k] = (uint8_t)((x[8 * v + k] & 0x0F) | (x[8 * v + 4 + k] & 0x0F) << 4);
        if (!hi) continue;
        if (bits == 4) { /* a kernel moves bit c of each byte to bit 4 of u[c] with one shift */
            for (int k = 0; k < 4; k++)
                for (int c = 0; c < 8; c++) hi[4 * r + k] |= (uint8_t)(((x[4 * c + k] >> 4) & 1) << c);
            continue;
        }
        uint32_t b2 = 0, plane[8]; /* bit j: weight j's bit 2 */
        for (int j = 0; j < 32; j++) b2 |= (uint32_t)((x[j] >> 2) & 1) << j;
        memcpy(plane, hi, sizeof plane);
        for (int c = 0; c < 8; c++) plane[c] |= ((b2 >> (4 * c)) & 0x0F) << (4 * r);
        memcpy(hi, plane, sizeof plane);
    }
}

static void pack_kx8(int type, const uint8_t *src, uint8_t *dst, int n_out, int n_in) {
    const int nb = n_in / QK_K;
    const size_t block = kiln_row_bytes(type, QK_K);
    const size_t row_bytes = (size_t)nb * block, out_bytes = kiln_kx8_bytes(type);
    for (int g = 0; g < n_out / 8; g++)
        for (int b = 0; b < nb; b++) {
            uint8_t *out = dst + ((size_t)g * nb + b) * out_bytes, u[8][QK_K];
            memset(out, 0, out_bytes);
            const uint8_t *blk[8];
            for (int r = 0; r < 8; r++) blk[r] = src + (size_t)(8 * g + r) * row_bytes + (size_t)b * block;
            const uint8_t *row[8];
            if (type == KILN_IQ4_XS) { /* the nibbles as they are, the scales ls - 32 as signed bytes */
                kiln_sb v;
                for (int r = 0; r < 8; r++) {
                    const block_iq4_xs *x = (const block_iq4_xs *)blk[r];
                    memcpy(out + 2 * r, &x->d, 2);
                    kiln_unpack_iq4_xs(x, &v);
                    for (int j = 0; j < 8; j++) out[16 + 8 * j + r] = (uint8_t)(int8_t)v.sc[2 * j];
                    for (int i = 0; i < QK_K; i++) {
                        const uint8_t byte = x->qs[16 * (i / 32) + i % 16];
                        u[r][i] = (i % 32) < 16 ? byte & 15 : byte >> 4;
                    }
                }
                uint8_t *chunk = out + kiln_kx8_head(type);
                for (int c = 0; c < 8; c++, chunk += 128) {
                    for (int r = 0; r < 8; r++) row[r] = u[r] + 32 * c;
                    put_chunk(row, 4, NULL, chunk);
                }
                continue;
            }
            if (type == KILN_Q2_K) { /* u = q in 0..3; each row's 16 GGUF scale bytes (m << 4 | sc) as they are */
                kiln_sb v;
                for (int r = 0; r < 8; r++) {
                    const block_q2_K *x = (const block_q2_K *)blk[r];
                    memcpy(out + 2 * r, &x->d, 2);
                    memcpy(out + 16 + 2 * r, &x->dmin, 2);
                    for (int j = 0; j < 16; j++) out[32 + 8 * j + r] = x->scales[j];
                    kiln_unpack_q2_K(x, &v);
                    for (int i = 0; i < QK_K; i++) u[r][i] = (uint8_t)v.q[i];
                }
                uint8_t *chunk = out + kiln_kx8_head(type);
                for (int c = 0; c < 8; c++, chunk += kiln_kx8_chunk(type)) {
                    for (int r = 0; r < 8; r++) row[r] = u[r] + 32 * c;
                    put_chunk(row, 2, NULL, chunk);
                }
                continue;
            }
            if (type == KILN_Q3_K) { /* u = q + 4 in 0..7, the 16 scales sc - 32 as signed bytes */
                kiln_sb v;
                for (int r = 0; r < 8; r++) {
                    memcpy(out + 2 * r, &((const block_q3_K *)blk[r])->d, 2);
                    kiln_unpack_q3_K(blk[r], &v);
                    for (int j = 0; j < 16; j++) out[16 + 8 * j + r] = (uint8_t)(int8_t)v.sc[j];
                    for (int i = 0; i < QK_K; i++) u[r][i] = (uint8_t)(v.q[i] + 4);
                }
                uint8_t *chunk = out + kiln_kx8_head(type);
                for (int c = 0; c < 8; c++, chunk += kiln_kx8_chunk(type)) {
                    for (int r = 0; r < 8; r++) row[r] = u[r] + 32 * c;
                    put_chunk(row, 2, chunk, chunk + 32);
                }
                continue;
            }
            for (int r = 0; r < 8; r++) kiln_kquant_values(type, blk[r], u[r]);
            if (type == KILN_Q6_K) {
                uint8_t *sc = out + 16, *chunk = out + 16 + 128;
                for (int r = 0; r < 8; r++) {
                    const block_q6_K *x = (const block_q6_K *)blk[r];
                    memcpy(out + 2 * r, &x->d, 2);
                    for (int j = 0; j < 16; j++) sc[8 * j + r] = (uint8_t)x->scales[j];
                }
                uint8_t top[8][32]; /* u >> 4, which a kernel puts back with a shift, a mask and an or a vector:
                                       as two bit planes it took two mask moves and two ors (and AVX2 five
                                       instructions a plane), and Q6_K's prefill ran at half Q4_K's rate */
                const uint8_t *tops[8];
                for (int c = 0; c < 8; c++, chunk += 192) {
                    for (int r = 0; r < 8; r++) {
                        row[r] = u[r] + 32 * c, tops[r] = top[r];
                        for (int i = 0; i < 32; i++) top[r][i] = row[r][i] >> 4;
                    }
                    put_chunk(tops, 2, NULL, chunk);
                    put_chunk(row, 4, NULL, chunk + 64);
                }
                continue;
            }
            uint8_t *sc = out + 32, *m = out + 96, *chunk = out + 160;
            for (int r = 0; r < 8; r++) {
                memcpy(out + 2 * r, blk[r], 2);       /* d */
                memcpy(out + 16 + 2 * r, blk[r] + 2, 2); /* dmin */
                int scales[8], mins[8]; /* the 6-bit scales and mins after d and dmin */
                kiln_k4_scales(blk[r] + 4, scales, mins);
                for (int j = 0; j < 8; j++) sc[8 * j + r] = (uint8_t)scales[j], m[8 * j + r] = (uint8_t)mins[j];
            }
            for (int c = 0; c < 8; c++) {
                for (int r = 0; r < 8; r++) row[r] = u[r] + 32 * c;
                if (type == KILN_Q5_K) {
                    put_chunk(row, 4, chunk, chunk + 32);
                    chunk += 160;
                } else {
                    put_chunk(row, 4, NULL, chunk);
                    chunk += 128;
                }
            }
        }
}

void kiln_pack_x8(int type, const void *src_, void *dst_, int n_out, int n_in) {
    kiln_b32 f;
    if (kiln_is_kx8(type) && n_out % 8 == 0 && n_in % QK_K == 0) {
        pack_kx8(type, src_, dst_, n_out, n_in);
        return;
    }
    if (!kiln_x8_b32_of(type, &f) || n_out % 8 != 0) return;
    const uint8_t *src = src_;
    uint8_t *dst = dst_;
    const int nb = n_in / 32;
    const size_t row_bytes = (size_t)nb * f.block_bytes, x8_bytes = 8 * f.block_bytes;
    for (int g = 0; g < n_out / 8; g++)
        for (int b = 0; b < nb; b++) {
            uint8_t *out = dst + ((size_t)g * nb + b) * x8_bytes, u[8][32];
            const uint8_t *row[8];
            memset(out, 0, x8_bytes);
            const size_t d_bytes = f.e8m0 ? 1 : sizeof(kiln_half);
            uint8_t *p = out + kiln_x8_scale_bytes(&f);
            for (int r = 0; r < 8; r++) {
                const uint8_t *blk = src + (size_t)(8 * g + r) * row_bytes + (size_t)b * f.block_bytes;
                memcpy(out + d_bytes * r, blk, d_bytes); /* every block type begins with d, the _1 types then m */
                if (f.has_min) memcpy(out + 16 + 2 * r, blk + sizeof(kiln_half), sizeof(kiln_half));
                b32_values(&f, blk, u[r]);
                row[r] = u[r];
            }
            put_chunk(row, f.bits, f.qh_at ? p : NULL, p + (f.qh_at ? 32 : 0));
        }
}
