// quant_k_avx2.c - the AVX2 tile kernel (gemm) of Q4_K, Q5_K, Q6_K and of
// their repacked forms Q4_K_R, Q5_K_R, Q6_K_R, for CPUs with AVX2 + FMA +
// F16C but no AVX-512 (installed by sd_quant_k_init, quant_k.c).
//
// Layout: the repacked layouts of quant_k_repack.c, shared with the AVX-512
// kernel (quant_k_x86.c): a Q4_K_R / Q5_K_R unit (two super-blocks A, B) is
// 8 vectors w[k] of 16 int32 lanes, lane L = sub-block L (A: 0..7, B: 8..15),
// whose 4 bytes are elements 32j + 4k .. +3 of it; a Q6_K_R block is 4 such
// vectors, lane g = group g of 16. Here each 512-bit vector is two 256-bit
// halves (A, B; Q6: groups 0-7, 8-15), so after the unpacking (nibble split,
// plus the fifth / the two high bits) a half is 8 ymm of unsigned quants
// whose int32 lane is one sub-block (group). The activations are prepared
// the same way once per call and token (kx_prep45_pair, kx_prep6_block in
// quant_k_impl.h). The integer dots: vpmaddubsw (u8 x s8 -> s16 pairs,
// |pair| <= 2 * 63 * 128), the s16 partial sums added while they cannot
// overflow (Q4: all 8 vectors, <= 30720; Q5: 4, <= 31744; Q6: 2, <= 32256),
// then one vpmaddwd with ones per partial sum: exact int32 per lane.
//
// Float work per (row, token) -- the AVX-512 kernel's, lane for lane, so
// both kernels and sd_quant_k_r_dot_ref give the same bits, and the same
// sequence in every tile shape and batch (batch invariance):
//   facc = 0 (16 float lanes: two ymm, A and B halves)
//   per pair (Q4/Q5): acc = integer dots of the 16 sub-blocks;
//       facc = fma(acc * dsc, dx, facc); facc = facc - dcm * bxs (fused)
//     dsc = d * sc (exact), dcm = dmin * m (exact), dx = the Q8_K scale of
//     the lane's block, bxs = dx * (sum of the sub-block's activations); a
//     half unit (odd last block) leaves lanes 8-15 as they are (the AVX-512
//     kernel adds exact zeros there: same bits, facc is never -0).
//   per block (Q6): acc = integer dots of the 16 groups minus 32 * bsums;
//       facc = fma(acc * dsc, dx, facc)
//   y = ((B + A) lanes l + l4, then l + l2, then l + l1) (kx_hsum's tree)
//
// Loops (k2_gemm): the activations of up to K2_TG (8) tokens are prepared
// into a stack buffer (K2_XBUF, 224 KiB at most), then each row of [r0, r1)
// is taken unit by unit: a half unit's (a block's) weights are
// unpacked once into registers and meet every token of the pass (memory
// operands), each (row, token) carrying its 16 float lanes in a small array.
// Rows in the file layout (Q4_K, ...) are unpacked straight into the same
// lanes (k2_unpack45_file, k2_unpack6_file: word transposes in registers),
// so file-layout and repacked gemm give the same bits; the model repacks its
// matrices at load (sd_quant_repack_type), so a forward streams repacked rows.
//
// Measured (the 2-vCPU AVX2 EPYC VM, shared with another job; one thread;
// 6 copies of the matrix cycled so it streams from memory; best of 20 calls,
// interleaved; old = one AVX2 vec_dot per (row, token), the previous path),
// ms for n_tok = 1 / 2 / 4 / 8 / 16:
//   Q4_K 8960 x 1536 (7.7 MB):  old       0.89 1.54 2.94 5.81 11.9
//                               file      0.80 1.07 1.32 1.98 3.84
//                               repacked  0.73 0.99 1.16 1.79 4.11
//   Q6_K 1536 x 8960 (11.3 MB): old       1.09 2.06 3.87 6.91 13.1
//                               file      1.07 1.45 1.99 3.03 6.36
//                               repacked  0.96 1.16 1.77 2.37 6.02
// Qwen2.5-Coder-1.5B Q4_K_M, bench-forward -t 2 --reps 11 (3 rounds each,
// old = main's build alternating with this one, another 2-thread job on the
// same 2 vCPUs throughout), ms for n = 1 / 2 / 4 / 8 / 16:
//   old 146-160 212-255 415-486 745-917 1468-1885
//   new 114-128 128-143 165-184 257-312  610-754
// Medians are 10-40% above the best (noise). Large batches are bound by the
// integer work per (row, token, block) (Q4: 8 vpmaddubsw, 7 adds, 1
// vpmaddwd, 4 float ops per half) and by reading the prepared activations
// from L2 for long rows (Q6_K 8960: 13 KiB per token).
// 2026-11-30 (Zen 3 EPYC, 2 vCPU): the weight stream is prefetched in
// software K2_PF bytes ahead (the hardware prefetcher alone left the core
// waiting on the weights at the start of every half, even at 8 tokens), and
// a pass computes the integer dots of all its tokens before their float
// steps (shorter dependency chains per token, so the core overlaps more of
// them). Qwen2.5-Coder-1.5B, bench-forward -t 2, 4 rounds alternated, ms for
// n = 1 / 2 / 4 / 8 / 16: before 77-83 94-102 119-130 229-274 448-508,
// after 61-73 79-90 104-110 162-175 322-344
// (docs/figures/2026-11-30-bench-forward-qwen-kquant-prefetch-amd-avx2.json).
// Prefetch distances 1, 2, 4, 8 and 16 KiB measured alike within the noise.
#include "kernels/quant_k_impl.h"

#include <string.h>

#if defined(K_HAVE_AVX2) && defined(__F16C__)

#define K2_INLINE static inline __attribute__((always_inline))

#ifndef K2_XBUF
#define K2_XBUF (224 * 1024) // bytes of prepared activations on the stack (16 tokens of rows of 8960)
#endif
// Most tokens per pass over the rows. Each row reads the prepared activations
// of every token of the pass (640 bytes per Q4_K pair and token); 8 tokens of
// rows of 1536 (15 KiB) stay in L1 from row to row, 64 (123 KiB) come from
// L2 for every row. Qwen2.5-Coder-1.5B, 256-token forward, 2 threads:
// 64 -> 5.8-7.0 s, 16 -> 4.4-5.1 s, 8 -> 3.7-4.9 s, 4-6 -> 3.5-4.4 s.
#ifndef K2_TG
#define K2_TG 8
#endif
#ifndef K2_PF
#define K2_PF 2048
#endif

// Software prefetch of the weight stream K2_PF bytes ahead of unit u (rows of
// a thread's range lie one after the other, so the stream runs on across row
// ends; a prefetch past the matrix does not fault).
K2_INLINE void k2_pf(const uint8_t *u, size_t len) {
    if (K2_PF > 0)
        for (size_t i = 0; i < len; i += 64) _mm_prefetch((const char *)u + K2_PF + i, _MM_HINT_T0);
}

// kx_hsum's tree over lanes A (0..7) and B (8..15).
K2_INLINE float k2_hsum(__m256 a, __m256 b) {
    const __m256 s = _mm256_add_ps(b, a);
    const __m128 c = _mm_add_ps(_mm256_extractf128_ps(s, 1), _mm256_castps256_ps128(s));
    const __m128 e = _mm_add_ps(c, _mm_movehl_ps(c, c));
    return _mm_cvtss_f32(_mm_add_ss(e, _mm_movehdup_ps(e)));
}

K2_INLINE __m256i k2_madd1(__m256i s16) { return _mm256_madd_epi16(s16, _mm256_set1_epi16(1)); }

// ---------------------------------------------------------------------------
// Q4_K_R / Q5_K_R

// dsc, dcm of half h (lanes 8h .. 8h + 7) of a 32-byte pair header.
K2_INLINE void k2_dec45(const uint8_t *hdr, int h, __m256 *dsc, __m256 *dcm) {
    const __m256i X = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(hdr + 8 * h)));
    const __m256i sc = _mm256_and_si256(X, _mm256_set1_epi32(63));
    // lane 2i: nibble i of the min word, lane 2i + 1: nibble i + 8 (i = 4h .. 4h + 3)
    const __m256i sh = h ? _mm256_setr_epi64x(16, 20, 24, 28) : _mm256_setr_epi64x(0, 4, 8, 12);
    const __m256i mlo = _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x((long long)sd_ld64(hdr + 16)), sh),
                                         _mm256_set1_epi32(15));
    const __m256i m = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(X, 2), _mm256_set1_epi32(0x30)), mlo);
    *dsc = _mm256_mul_ps(_mm256_cvtepi32_ps(sc), _mm256_set1_ps(_cvtsh_ss(sd_ld16(hdr + 24 + 2 * h))));
    *dcm = _mm256_mul_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(_cvtsh_ss(sd_ld16(hdr + 28 + 2 * h))));
}

// Bit 4 of w[k] from a Q5 H vector, at bit 4 of each byte.
K2_INLINE __m256i k2_q5_bit(__m256i H, int k) {
    const __m256i v = k < 4 ? _mm256_slli_epi16(H, 4 - k) : k > 4 ? _mm256_srli_epi16(H, k - 4) : H;
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

// w[0..7] of half h of unit u (vw: 64 for a pair, 32 for a half unit).
K2_INLINE void k2_unpack45(const uint8_t *u, int has_qh, int vw, int h, __m256i w[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < 4; i++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(u + vw * i + 32 * h));
        w[2 * i] = _mm256_and_si256(q, m4);
        w[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    }
    if (has_qh) {
        const __m256i H = _mm256_loadu_si256((const __m256i *)(u + 4 * vw + 32 * h));
        for (int k = 0; k < 8; k++) w[k] = _mm256_or_si256(w[k], k2_q5_bit(H, k));
    }
}

// The same vectors straight from a file-layout Q4_K / Q5_K block (A or B of
// the unit): byte run m of qs[32c..] holds elements 4m..4m+3 of sub-blocks 2c
// (low nibbles) and 2c + 1 (high); a 4x4 transpose of 32-bit words per
// 128-bit lane, the nibble split and an interleave put sub-block j in lane j.
K2_INLINE void k2_unpack45_file(const uint8_t *blk, int has_qh, __m256i w[8]) {
    const uint8_t *qs = blk + (has_qh ? 48 : 16);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i Q0 = _mm256_loadu_si256((const __m256i *)qs), Q1 = _mm256_loadu_si256((const __m256i *)(qs + 32));
    const __m256i Q2 = _mm256_loadu_si256((const __m256i *)(qs + 64)), Q3 = _mm256_loadu_si256((const __m256i *)(qs + 96));
    const __m256i t0 = _mm256_unpacklo_epi32(Q0, Q1), t1 = _mm256_unpackhi_epi32(Q0, Q1);
    const __m256i t2 = _mm256_unpacklo_epi32(Q2, Q3), t3 = _mm256_unpackhi_epi32(Q2, Q3);
    // R[m]: lane i = word m (low 128 bits) / m + 4 (high) of Q_i
    const __m256i R[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3),
                          _mm256_unpackhi_epi64(t1, t3)};
    for (int m = 0; m < 4; m++) {
        const __m256i L = _mm256_and_si256(R[m], m4), H = _mm256_and_si256(_mm256_srli_epi16(R[m], 4), m4);
        const __m256i lo = _mm256_unpacklo_epi32(L, H), hi = _mm256_unpackhi_epi32(L, H); // sub-blocks 0-3, 4-7
        w[m] = _mm256_permute2x128_si256(lo, hi, 0x20);
        w[m + 4] = _mm256_permute2x128_si256(lo, hi, 0x31);
    }
    if (has_qh) { // bit 4 of element l of sub-block j = bit j of qh[l]
        const __m256i bit = _mm256_setr_epi32(0x01010101, 0x02020202, 0x04040404, 0x08080808, 0x10101010, 0x20202020,
                                              0x40404040, (int)0x80808080u);
        const __m256i b4 = _mm256_set1_epi8(0x10);
        for (int k = 0; k < 8; k++) {
            const __m256i h = _mm256_and_si256(_mm256_set1_epi32((int)sd_ld32(blk + 16 + 4 * k)), bit);
            w[k] = _mm256_or_si256(w[k], _mm256_and_si256(_mm256_cmpeq_epi8(h, bit), b4));
        }
    }
}

// dsc, dcm of a file-layout Q4_K / Q5_K block (lane j = sub-block j).
K2_INLINE void k2_dec45_file(const uint8_t *blk, __m256 *dsc, __m256 *dcm) {
    uint32_t w0 = sd_ld32(blk + 4), w1 = sd_ld32(blk + 8), w2 = sd_ld32(blk + 12);
    const uint64_t sc = (uint64_t)(w0 & 0x3f3f3f3fu) |
                        (uint64_t)((w2 & 0x0f0f0f0fu) | (((w0 >> 6) & 0x03030303u) << 4)) << 32;
    const uint64_t m = (uint64_t)(w1 & 0x3f3f3f3fu) |
                       (uint64_t)(((w2 >> 4) & 0x0f0f0f0fu) | (((w1 >> 6) & 0x03030303u) << 4)) << 32;
    *dsc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc))),
                         _mm256_set1_ps(_cvtsh_ss(sd_ld16(blk))));
    *dcm = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m))),
                         _mm256_set1_ps(_cvtsh_ss(sd_ld16(blk + 2))));
}

// The integer dots of half h of a unit for one token: lane = sub-block.
K2_INLINE __m256i k2_dot45(const __m256i w[8], const kx_xp45 *xp, int h, int has_qh) {
    __m256i s[8];
    for (int k = 0; k < 8; k++)
        s[k] = _mm256_maddubs_epi16(w[k], _mm256_load_si256((const __m256i *)(xp->x[k] + 32 * h)));
    if (!has_qh) { // |sum of 8| <= 8 * 2 * 15 * 128 = 30720
        const __m256i a = _mm256_add_epi16(_mm256_add_epi16(s[0], s[1]), _mm256_add_epi16(s[2], s[3]));
        const __m256i b = _mm256_add_epi16(_mm256_add_epi16(s[4], s[5]), _mm256_add_epi16(s[6], s[7]));
        return k2_madd1(_mm256_add_epi16(a, b));
    }
    // |sum of 4| <= 4 * 2 * 31 * 128 = 31744
    const __m256i a = _mm256_add_epi16(_mm256_add_epi16(s[0], s[1]), _mm256_add_epi16(s[2], s[3]));
    const __m256i b = _mm256_add_epi16(_mm256_add_epi16(s[4], s[5]), _mm256_add_epi16(s[6], s[7]));
    return _mm256_add_epi32(k2_madd1(a), k2_madd1(b));
}

// The float step of a half for one (row, token): f = 8 lanes of its facc.
K2_INLINE void k2_fstep45(float *f, __m256i acc, __m256 dsc, __m256 dcm, const kx_xp45 *xp, int h) {
    __m256 facc = _mm256_load_ps(f);
    const __m256 tt = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), dsc);
    facc = _mm256_fmadd_ps(tt, _mm256_load_ps(xp->dx + 8 * h), facc);
    facc = _mm256_fnmadd_ps(dcm, _mm256_load_ps(xp->bxs + 8 * h), facc);
    _mm256_store_ps(f, facc);
}

// One Q4_K_R / Q5_K_R row (file = 0) or Q4_K / Q5_K row (file = 1) of nb
// blocks against nt tokens: xp + t * xps the token's prepared pairs, fst[t]
// its 16 float lanes.
K2_INLINE void k2_row45(const int has_qh, const int file, const uint8_t *row, int64_t nb, const uint8_t *xp,
                        size_t xps, int nt, float (*fst)[16]) {
    const int64_t np = nb / 2, nu = (nb + 1) / 2;
    const size_t ps = kx_pair_bytes(has_qh), bs = ps / 2;
    for (int t = 0; t < nt; t++) {
        _mm256_store_ps(fst[t], _mm256_setzero_ps());
        _mm256_store_ps(fst[t] + 8, _mm256_setzero_ps());
    }
    for (int64_t p = 0; p < nu; p++) {
        const uint8_t *u = row + (size_t)p * ps;
        const int half = p == np, vw = half ? 32 : 64;
        k2_pf(u, ps);
        _Alignas(16) uint8_t hbuf[32];
        const uint8_t *hdr = u + kx_hdr_off(has_qh, 0);
        if (half && !file) {
            kx_pair_header(u, has_qh, 1, hbuf);
            hdr = hbuf;
        }
        for (int h = 0; h < (half ? 1 : 2); h++) {
            __m256 dsc, dcm;
            __m256i w[8];
            if (file) {
                k2_dec45_file(u + h * bs, &dsc, &dcm);
                k2_unpack45_file(u + h * bs, has_qh, w);
            } else {
                k2_dec45(hdr, h, &dsc, &dcm);
                k2_unpack45(u, has_qh, vw, h, w);
            }
            // the integer dots of every token first, then their float steps:
            // short dependency chains that the core overlaps token by token
            __m256i acc[K2_TG]; // nt <= K2_TG (k2_gemm's passes)
            for (int t = 0; t < nt; t++)
                acc[t] = k2_dot45(w, (const kx_xp45 *)(xp + (size_t)t * xps) + p, h, has_qh);
            for (int t = 0; t < nt; t++)
                k2_fstep45(fst[t] + 8 * h, acc[t], dsc, dcm, (const kx_xp45 *)(xp + (size_t)t * xps) + p, h);
        }
    }
}

// ---------------------------------------------------------------------------
// Q6_K_R

// w[0..3] of half h (groups 8h .. 8h + 7) of a Q6_K_R block.
K2_INLINE void k2_unpack6(const uint8_t *u, int h, __m256i w[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m256i L0 = _mm256_loadu_si256((const __m256i *)(u + 32 * h));
    const __m256i L1 = _mm256_loadu_si256((const __m256i *)(u + 64 + 32 * h));
    const __m256i H = _mm256_loadu_si256((const __m256i *)(u + 128 + 32 * h));
    w[0] = _mm256_or_si256(_mm256_and_si256(L0, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
    w[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L0, 4), m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
    w[2] = _mm256_or_si256(_mm256_and_si256(L1, m4), _mm256_and_si256(H, m30));
    w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
}

// The same vectors straight from a file-layout Q6_K block: the natural
// decoding (elements 128h + 32k + l) with the 32-bit words of ql and qh
// first put in the order 0 4 1 5 2 6 3 7 (the decoding is byte-wise), so
// that 64-bit word q of vector k holds the words q, q + 4 of group pair k;
// a 4x4 transpose of 64-bit words gives lane i = group 8h + i.
K2_INLINE void k2_unpack6_file(const uint8_t *blk, int h, __m256i w[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i qa = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(blk + 64 * h)), perm);
    const __m256i qb = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32)), perm);
    const __m256i H = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)), perm);
    const __m256i P0 = _mm256_or_si256(_mm256_and_si256(qa, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
    const __m256i P1 = _mm256_or_si256(_mm256_and_si256(qb, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
    const __m256i P2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4), _mm256_and_si256(H, m30));
    const __m256i P3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4), _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
    const __m256i a = _mm256_unpacklo_epi64(P0, P1), b = _mm256_unpackhi_epi64(P0, P1);
    const __m256i c = _mm256_unpacklo_epi64(P2, P3), d = _mm256_unpackhi_epi64(P2, P3);
    w[0] = _mm256_permute2x128_si256(a, c, 0x20);
    w[1] = _mm256_permute2x128_si256(b, d, 0x20);
    w[2] = _mm256_permute2x128_si256(a, c, 0x31);
    w[3] = _mm256_permute2x128_si256(b, d, 0x31);
}

// dsc of half h: repacked (scales at 192, d at 208) or file layout (at 192, 208 too:
// ql 128 + qh 64 bytes, then scales[16], d).
K2_INLINE __m256 k2_dsc6(const uint8_t *u, int h) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(u + 192 + 8 * h)))),
                         _mm256_set1_ps(_cvtsh_ss(sd_ld16(u + 208))));
}

K2_INLINE void k2_row6(const int file, const uint8_t *row, int64_t nb, const uint8_t *xp, size_t xps, int nt,
                       float (*fst)[16]) {
    for (int t = 0; t < nt; t++) {
        _mm256_store_ps(fst[t], _mm256_setzero_ps());
        _mm256_store_ps(fst[t] + 8, _mm256_setzero_ps());
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *u = row + (size_t)b * 210;
        k2_pf(u, 210);
        for (int h = 0; h < 2; h++) {
            const __m256 dsc = k2_dsc6(u, h);
            __m256i w[4];
            if (file) k2_unpack6_file(u, h, w);
            else k2_unpack6(u, h, w);
            for (int t = 0; t < nt; t++) {
                const kx_xp6 *x = (const kx_xp6 *)(xp + (size_t)t * xps) + b;
                __m256i s[4];
                for (int k = 0; k < 4; k++)
                    s[k] = _mm256_maddubs_epi16(w[k], _mm256_load_si256((const __m256i *)(x->x[k] + 32 * h)));
                // |sum of 2| <= 2 * 2 * 63 * 128 = 32256
                __m256i acc = _mm256_load_si256((const __m256i *)(x->acc0 + 8 * h));
                acc = _mm256_add_epi32(acc, _mm256_add_epi32(k2_madd1(_mm256_add_epi16(s[0], s[1])),
                                                             k2_madd1(_mm256_add_epi16(s[2], s[3]))));
                float *f = fst[t] + 8 * h;
                const __m256 tt = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), dsc);
                _mm256_store_ps(f, _mm256_fmadd_ps(tt, _mm256_load_ps(x->dx + 8 * h), _mm256_load_ps(f)));
            }
        }
    }
}

// Out-of-line row kernels per type and layout: one token (the compiler sees
// nt = 1) and any number, with 2, 3 and 4 tokens (a verification's usual
// sizes) compiled each as a constant: the token loops unrolled, the integer
// sums in registers. Q4_K 8960 x 1536 streamed from memory, one thread, min
// of 6 interleaved rounds (2026-11-30, Zen 3): n = 2 0.84 -> 0.70 ms, n = 4
// 1.10 -> 1.09; Qwen2.5-Coder-1.5B's forward of 2 tokens went from
// 1.15-1.40x one token's to 1.11-1.20x, of 4 from 1.32-1.94x to 1.44-1.69x
// (8 rounds; docs/performance.md, "Forward-pass cost by tokens").
#define K2_CASE(n, call) \
    case n: {            \
        enum { NT = n }; \
        call;            \
    } break;
#define K2_ROWS(name, call)                                                                                   \
    static __attribute__((noinline)) void name##_1(const uint8_t *row, int64_t nb, const uint8_t *xp,         \
                                                   size_t xps, int nt, float (*fst)[16]) {                    \
        (void)nt;                                                                                             \
        enum { NT = 1 };                                                                                      \
        call;                                                                                                 \
    }                                                                                                         \
    static __attribute__((noinline)) void name##_n(const uint8_t *row, int64_t nb, const uint8_t *xp,         \
                                                   size_t xps, int nt, float (*fst)[16]) {                    \
        switch (nt) {                                                                                         \
            K2_CASE(2, call)                                                                                  \
            K2_CASE(3, call)                                                                                  \
            K2_CASE(4, call)                                                                                  \
        default: {                                                                                            \
            const int NT = nt;                                                                                \
            call;                                                                                             \
        } break;                                                                                              \
        }                                                                                                     \
    }
K2_ROWS(k2_row4r, k2_row45(0, 0, row, nb, xp, xps, NT, fst))
K2_ROWS(k2_row5r, k2_row45(1, 0, row, nb, xp, xps, NT, fst))
K2_ROWS(k2_row6r, k2_row6(0, row, nb, xp, xps, NT, fst))
K2_ROWS(k2_row4f, k2_row45(0, 1, row, nb, xp, xps, NT, fst))
K2_ROWS(k2_row5f, k2_row45(1, 1, row, nb, xp, xps, NT, fst))
K2_ROWS(k2_row6f, k2_row6(1, row, nb, xp, xps, NT, fst))
#undef K2_ROWS
#undef K2_CASE

typedef void (*k2_row_fn)(const uint8_t *row, int64_t nb, const uint8_t *xp, size_t xps, int nt, float (*fst)[16]);

// ---------------------------------------------------------------------------
// the gemm

// Prepared activation bytes per token for rows of nb super-blocks.
static size_t k2_xp_bytes(int type, int64_t nb) {
    return type == SD_TYPE_Q6_K ? (size_t)nb * sizeof(kx_xp6) : (size_t)((nb + 1) / 2) * sizeof(kx_xp45);
}

// The tile kernel of base type `type`, rows repacked (repacked = 1) or in
// the file layout (unpacked straight into the same lanes). Each (row, token)
// runs its float steps unit by unit, then k2_hsum, in whatever pass or token
// group it falls (see the file comment).
static void k2_gemm(int type, int repacked, int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1,
                    const void *xq, size_t xrb, int64_t n_tok, float *y, int64_t ldy) {
    const int q6 = type == SD_TYPE_Q6_K;
    const int64_t nb = n_in / SD_QK_K, nu = q6 ? nb : (nb + 1) / 2;
    if (r0 >= r1 || n_tok <= 0) return;
    const size_t xps = k2_xp_bytes(type, nb);
    if (xps > K2_XBUF) {
        // rows too long for the stack buffer: the reference, per (row, token)
        sd_vec_dot_fn dot = type == SD_TYPE_Q4_K ? sd_q4_K_dot_ref : type == SD_TYPE_Q5_K ? sd_q5_K_dot_ref
                                                                                        : sd_q6_K_dot_ref;
        SD_ASSERT(!repacked);
        for (int64_t r = r0; r < r1; r++)
            for (int64_t t = 0; t < n_tok; t++)
                y[t * ldy + r] = dot(n_in, (const uint8_t *)W + (size_t)r * wrb, (const uint8_t *)xq + (size_t)t * xrb);
        return;
    }
    _Alignas(64) uint8_t xbuf[K2_XBUF];
    _Alignas(64) float fst[K2_TG][16];
    const int64_t tg = SD_MIN((int64_t)(K2_XBUF / xps), (int64_t)K2_TG);
    const int has_qh = type == SD_TYPE_Q5_K;
    for (int64_t t0 = 0; t0 < n_tok; t0 += tg) {
        const int ntg = (int)SD_MIN(tg, n_tok - t0);
        for (int j = 0; j < ntg; j++) {
            const sd_block_q8_K *x = (const sd_block_q8_K *)((const uint8_t *)xq + (size_t)(t0 + j) * xrb);
            uint8_t *dst = xbuf + (size_t)j * xps;
            if (q6)
                for (int64_t b = 0; b < nb; b++) kx_prep6_block(&x[b], (kx_xp6 *)dst + b);
            else
                for (int64_t p = 0; p < nu; p++) kx_prep45_pair(x, nb, p, (kx_xp45 *)dst + p);
        }
        static const k2_row_fn fns[2][3][2] = {
            {{k2_row4f_1, k2_row4f_n}, {k2_row5f_1, k2_row5f_n}, {k2_row6f_1, k2_row6f_n}},
            {{k2_row4r_1, k2_row4r_n}, {k2_row5r_1, k2_row5r_n}, {k2_row6r_1, k2_row6r_n}}};
        const k2_row_fn fn = fns[repacked][q6 ? 2 : has_qh][ntg > 1];
        for (int64_t r = r0; r < r1; r++) {
            fn((const uint8_t *)W + (size_t)r * wrb, nb, xbuf, xps, ntg, fst);
            for (int j = 0; j < ntg; j++)
                y[(t0 + j) * ldy + r] = k2_hsum(_mm256_load_ps(fst[j]), _mm256_load_ps(fst[j] + 8));
        }
    }
}

#define K2_GEMM(name, type, rp)                                                                                  \
    static void name(int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1, const void *xq, size_t xrb, \
                     int64_t n_tok, float *y, int64_t ldy) {                                                     \
        k2_gemm(type, rp, n_in, W, wrb, r0, r1, xq, xrb, n_tok, y, ldy);                                         \
    }
K2_GEMM(k2_gemm_q4_K, SD_TYPE_Q4_K, 0)
K2_GEMM(k2_gemm_q5_K, SD_TYPE_Q5_K, 0)
K2_GEMM(k2_gemm_q6_K, SD_TYPE_Q6_K, 0)
K2_GEMM(k2_gemm_q4_K_r, SD_TYPE_Q4_K, 1)
K2_GEMM(k2_gemm_q5_K_r, SD_TYPE_Q5_K, 1)
K2_GEMM(k2_gemm_q6_K_r, SD_TYPE_Q6_K, 1)
#undef K2_GEMM

// traits repack: the layout rewrite, refused for rows the kernel cannot take.
#define K2_REPACK(name, type)                                                                       \
    static int name(const void *src, void *dst, int64_t n_in, int64_t n_rows) {                     \
        if (n_in <= 0 || n_in % SD_QK_K || k2_xp_bytes(type, n_in / SD_QK_K) > K2_XBUF) return -1; \
        return sd_quant_k_repack(type, src, dst, n_in, n_rows);                                      \
    }
K2_REPACK(k2_repack_q4_K, SD_TYPE_Q4_K)
K2_REPACK(k2_repack_q5_K, SD_TYPE_Q5_K)
K2_REPACK(k2_repack_q6_K, SD_TYPE_Q6_K)
#undef K2_REPACK

int sd_quant_k_avx2_init(sd_type_traits *traits) {
    traits[SD_TYPE_Q4_K].gemm = k2_gemm_q4_K;
    traits[SD_TYPE_Q5_K].gemm = k2_gemm_q5_K;
    traits[SD_TYPE_Q6_K].gemm = k2_gemm_q6_K;
    static const struct {
        int rt;
        sd_gemm_fn gemm;
        sd_repack_fn repack;
    } rp[3] = {{SD_TYPE_Q4_K_R, k2_gemm_q4_K_r, k2_repack_q4_K},
               {SD_TYPE_Q5_K_R, k2_gemm_q5_K_r, k2_repack_q5_K},
               {SD_TYPE_Q6_K_R, k2_gemm_q6_K_r, k2_repack_q6_K}};
    for (int i = 0; i < 3; i++) {
        traits[rp[i].rt].gemm = rp[i].gemm;
        traits[rp[i].rt].repack = rp[i].repack;
        traits[rp[i].rt].supported = 1;
    }
    return 1;
}

#else // no AVX2 build (or an AVX-512 one: quant_k_x86.c has the tile kernel)

int sd_quant_k_avx2_init(sd_type_traits *traits) {
    (void)traits;
    return 0;
}

#endif
