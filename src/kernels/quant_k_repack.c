// quant_k_repack.c - the repacked K-quant layouts (Q4_K_R, Q5_K_R, Q6_K_R):
// rows rewritten at load, the activations prepared the same way, and the
// scalar reference of the tile kernels of quant_k_x86.c (AVX-512) and
// quant_k_avx2.c (AVX2) (their float operations in their order). Plain C.
//
// Why a repacked layout: in the file layout a super-block's quants must be
// unpacked, its 6-bit scales decoded and everything transposed before it can
// meet the activations in vpdpbusd, and for one token that work (not the
// memory traffic) was the bottleneck. At load each row is rewritten once
// (same bytes per row) so that the kernel only splits nibbles:
//
//  Q4_K_R / Q5_K_R: the row is a sequence of units of two super-blocks A, B
//  ("pairs"; an odd last super-block forms a half unit). In registers a unit
//  is 8 vectors w[k] (k = 0..7) of 64 unsigned quant bytes: int32 lane L
//  (L < 8: block A, sub-block j = L; L >= 8: block B, j = L - 8) of w[k]
//  holds elements 32j + 4k .. 32j + 4k + 3. So after 8 vpdpbusd, lane L of
//  the accumulator is the integer dot of one 32-element sub-block, and the
//  sub-block scales apply once per lane in float. Pair bytes:
//    [0, 256)    Q[i], i < 4: 64 bytes each; low nibble of byte n = byte n
//                of w[2i], high nibble = byte n of w[2i+1]
//    Q5 only:    [256, 320) H: bit k of byte n = bit 4 of byte n of w[k]
//    header (32 bytes): byte L (L < 16) = sc[L] | (m[L] >> 4) << 6;
//                then a 64-bit word whose nibble (L >> 1) + 8 (L & 1) is
//                m[L] & 15; then fp16 d(A), d(B), dmin(A), dmin(B).
//  A half unit (block A only) has 32-byte Q[i] (and H), then a 16-byte
//  header: bytes 0-7 as above, a 32-bit word with the nibbles of L < 8
//  (nibble n at bit 4n for n < 4, at bit 4(n - 8) + 16 for n >= 8), d, dmin.
//  Pair: 288 / 352 bytes = 2 blocks; half: 144 / 176 = 1 block.
//
//  Q6_K_R: per super-block (210 bytes) 4 vectors w[k] of unsigned quants
//  (q + 32, 0..63); int32 lane g of w[k] holds elements 16g + 4k .. +3 (lane
//  = the group of 16 sharing an int8 scale). Bytes: [0, 64) L0, [64, 128)
//  L1: low nibble of L0 = w[0], high = w[1], low of L1 = w[2], high = w[3];
//  [128, 192) H: bits 2k, 2k+1 of byte n = bits 4, 5 of byte n of w[k];
//  [192, 208) the 16 int8 scales; [208, 210) fp16 d.
//
// The activations (Q8_K rows) are rearranged the same way once per call
// ("prepared": kx_xp45 per pair, kx_xp6 per block) by plain C code
// (kx_prep45_pair, kx_prep6_block in quant_k_impl.h).
#include "kernels/quant_k_impl.h"

#include <math.h>
#include <string.h>

static inline float kx_h2f(uint16_t h) { return sd_fp16_to_fp32(h); }

// The 6-bit scales and mins of a Q4_K / Q5_K super-block (scales[12]).
static void kx_scales_decode(const uint8_t *s, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 0xF) | ((s[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
}

// Nibble index of lane L's min in the header word.
static inline int kx_mnib(int L) { return (L >> 1) + 8 * (L & 1); }

// Writes one unit (blocks b[0], b[1]; b[1] NULL: a half unit) of a
// Q4_K_R / Q5_K_R row. Word operations: the 4-byte run of w[k] in lane L
// is 4 consecutive elements of one sub-block, and a sub-block's 32 quants
// are 32 consecutive low (or high) nibbles of qs.
static void kx_repack_q45_unit(const uint8_t *const b[2], int has_qh, uint8_t *dst) {
    const int half = b[1] == NULL, vw = half ? 32 : 64;
    uint8_t *Q = dst, *H = dst + 4 * vw, *hdr = dst + kx_hdr_off(has_qh, half);
    uint64_t mlo = 0;
    for (int h = 0; h < (half ? 1 : 2); h++) {
        const uint8_t *blk = b[h];
        const uint8_t *qh = has_qh ? blk + 16 : NULL, *qs = blk + (has_qh ? 48 : 16);
        uint8_t sc[8], m[8];
        kx_scales_decode(blk + 4, sc, m);
        for (int j = 0; j < 8; j++) {
            const int L = 8 * h + j, c = j / 2, shift = 4 * (j & 1);
            for (int i = 0; i < 4; i++) {
                // elements 32j + 8i .. 32j + 8i + 7 of the sub-block's nibbles
                const uint64_t n = (sd_ld64(qs + 32 * c + 8 * i) >> shift) & 0x0F0F0F0F0F0F0F0Full;
                const uint32_t v = (uint32_t)n | (uint32_t)(n >> 32) << 4;
                memcpy(Q + vw * i + 4 * L, &v, 4);
            }
            if (has_qh) {
                // bit k of H byte 4L + bb = bit 4 of element 32j + 4k + bb = bit j of qh[4k + bb]
                uint32_t v = 0;
                for (int k = 0; k < 8; k++) {
                    const uint32_t q4 = (sd_ld32(qh + 4 * k) >> j) & 0x01010101u;
                    v |= q4 << k;
                }
                memcpy(H + 4 * L, &v, 4);
            }
            hdr[L] = (uint8_t)(sc[j] | (m[j] >> 4) << 6);
            mlo |= (uint64_t)(m[j] & 15) << (4 * kx_mnib(L));
        }
    }
    if (half) {
        const uint32_t w = (uint32_t)(mlo & 0xFFFF) | (uint32_t)((mlo >> 32) & 0xFFFF) << 16;
        memcpy(hdr + 8, &w, 4);
        memcpy(hdr + 12, b[0], 2);     // d
        memcpy(hdr + 14, b[0] + 2, 2); // dmin
    } else {
        memcpy(hdr + 16, &mlo, 8);
        memcpy(hdr + 24, b[0], 2);
        memcpy(hdr + 26, b[1], 2);
        memcpy(hdr + 28, b[0] + 2, 2);
        memcpy(hdr + 30, b[1] + 2, 2);
    }
}

static void kx_repack_q6_block(const uint8_t *blk, uint8_t *dst) {
    const sd_block_q6_K *b = (const sd_block_q6_K *)blk;
    uint8_t q[SD_QK_K]; // unsigned quants (q + 32) in element order
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t lo0 = b->ql[64 * h + l], lo1 = b->ql[64 * h + 32 + l], hb = b->qh[32 * h + l];
            q[128 * h + l] = (uint8_t)((lo0 & 0xF) | ((hb & 3) << 4));
            q[128 * h + 32 + l] = (uint8_t)((lo1 & 0xF) | (((hb >> 2) & 3) << 4));
            q[128 * h + 64 + l] = (uint8_t)((lo0 >> 4) | (((hb >> 4) & 3) << 4));
            q[128 * h + 96 + l] = (uint8_t)((lo1 >> 4) | (((hb >> 6) & 3) << 4));
        }
    uint8_t out[210];
    for (int g = 0; g < 16; g++) {
        // w[k] word g = elements 16g + 4k .. 16g + 4k + 3
        uint32_t w[4];
        for (int k = 0; k < 4; k++) w[k] = sd_ld32(q + 16 * g + 4 * k);
        const uint32_t l0 = (w[0] & 0x0F0F0F0Fu) | (w[1] & 0x0F0F0F0Fu) << 4;
        const uint32_t l1 = (w[2] & 0x0F0F0F0Fu) | (w[3] & 0x0F0F0F0Fu) << 4;
        const uint32_t hh = ((w[0] >> 4) & 0x03030303u) | ((w[1] >> 4) & 0x03030303u) << 2 |
                            ((w[2] >> 4) & 0x03030303u) << 4 | ((w[3] >> 4) & 0x03030303u) << 6;
        memcpy(out + 4 * g, &l0, 4);
        memcpy(out + 64 + 4 * g, &l1, 4);
        memcpy(out + 128 + 4 * g, &hh, 4);
    }
    memcpy(out + 192, b->scales, 16);
    memcpy(out + 208, &b->d, 2);
    memcpy(dst, out, 210);
}

int sd_quant_k_repack(int base_type, const void *src, void *dst, int64_t n_in, int64_t n_rows) {
    if (n_in <= 0 || n_in % SD_QK_K || n_rows < 0) return -1;
    const int64_t nb = n_in / SD_QK_K;
    if (base_type == SD_TYPE_Q6_K) {
        for (int64_t i = 0; i < nb * n_rows; i++)
            kx_repack_q6_block((const uint8_t *)src + i * 210, (uint8_t *)dst + i * 210);
        return 0;
    }
    if (base_type != SD_TYPE_Q4_K && base_type != SD_TYPE_Q5_K) return -1;
    const int has_qh = base_type == SD_TYPE_Q5_K;
    const size_t bs = has_qh ? 176 : 144, rb = bs * (size_t)nb;
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *s = (const uint8_t *)src + r * rb;
        uint8_t *d = (uint8_t *)dst + r * rb;
        for (int64_t p = 0; 2 * p < nb; p++) {
            const uint8_t *b[2] = {s + 2 * p * bs, 2 * p + 1 < nb ? s + (2 * p + 1) * bs : NULL};
            kx_repack_q45_unit(b, has_qh, d + 2 * p * bs);
        }
    }
    return 0;
}

// The fixed summation tree of the 16 lanes (the same pairing as the kernel).
static float kx_hsum_ref(const float f[16]) {
    float a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) a[i] = f[i + 8] + f[i];
    for (int i = 0; i < 4; i++) b[i] = a[i + 4] + a[i];
    for (int i = 0; i < 2; i++) c[i] = b[i] + b[i + 2];
    return c[0] + c[1];
}

float sd_quant_k_r_dot_ref(int base_type, int64_t n, const void *wv, const void *xv) {
    const uint8_t *w = wv;
    const sd_block_q8_K *x = xv;
    const int64_t nb = n / SD_QK_K;
    float facc[16] = {0};
    if (base_type == SD_TYPE_Q6_K) {
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *u = w + b * 210;
            kx_xp6 xp;
            kx_prep6_block(&x[b], &xp);
            const float d = kx_h2f(sd_ld16(u + 208));
            for (int g = 0; g < 16; g++) {
                int32_t acc = xp.acc0[g];
                for (int k = 0; k < 4; k++)
                    for (int bb = 0; bb < 4; bb++) {
                        const int nn = 4 * g + bb;
                        const int q = ((u[64 * (k >> 1) + nn] >> (4 * (k & 1))) & 15) | ((u[128 + nn] >> (2 * k)) & 3) << 4;
                        acc += q * xp.x[k][nn];
                    }
                const float dsc = (float)(int8_t)u[192 + g] * d;
                const float t = (float)acc * dsc;
                facc[g] = fmaf(t, xp.dx[g], facc[g]);
            }
        }
        return kx_hsum_ref(facc);
    }
    const int has_qh = base_type == SD_TYPE_Q5_K;
    const int64_t np = nb / 2;
    for (int64_t p = 0; p < (nb + 1) / 2; p++) {
        const int half = p == np, vw = half ? 32 : 64;
        const uint8_t *u = w + p * kx_pair_bytes(has_qh);
        uint8_t hdr[32];
        kx_pair_header(u, has_qh, half, hdr);
        kx_xp45 xp;
        kx_prep45_pair(x, nb, p, &xp);
        const uint64_t mlo = sd_ld64(hdr + 16);
        for (int L = 0; L < 16; L++) {
            int32_t acc = 0;
            if (L < vw / 4)
                for (int k = 0; k < 8; k++)
                    for (int bb = 0; bb < 4; bb++) {
                        const int nn = 4 * L + bb;
                        int q = (u[vw * (k >> 1) + nn] >> (4 * (k & 1))) & 15;
                        if (has_qh) q |= ((u[4 * vw + nn] >> k) & 1) << 4;
                        acc += q * xp.x[k][nn];
                    }
            const int sc = hdr[L] & 63, m = (hdr[L] >> 6) << 4 | (int)((mlo >> (4 * kx_mnib(L))) & 15);
            const float dsc = (float)sc * kx_h2f(sd_ld16(hdr + 24 + 2 * (L >> 3)));
            const float dcm = (float)m * kx_h2f(sd_ld16(hdr + 28 + 2 * (L >> 3)));
            const float t = (float)acc * dsc;
            facc[L] = fmaf(t, xp.dx[L], facc[L]);
            facc[L] = fmaf(-dcm, xp.bxs[L], facc[L]);
        }
    }
    return kx_hsum_ref(facc);
}
