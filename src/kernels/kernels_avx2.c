// kernels_avx2.c - AVX2 + FMA dot products of the legacy quants (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0) for CPUs without AVX-512 VNNI (most desktop x86 CPUs).
//
// Compiled into every x86-64 build (the functions carry target attributes,
// so the rest of the library needs no -mavx2) and installed by sd_quant_init
// at run time when the CPU has AVX2, FMA and F16C but the AVX-512 VNNI
// kernels of kernels_x86.c are not available. Also selectable on purpose
// (sd_quant_init_backend("avx2")) so that tests/kernels/test_quant_legacy.c checks them
// against the scalar references on any AVX2 machine.
//
// Per block of 32: the weight quants become unsigned bytes (0..15 or 0..31;
// Q8_0: |w| with the sign moved onto the activations), vpmaddubsw multiplies
// them with the signed activation bytes into 16-bit pairs (at most
// 2 * 31 * 127, no saturation), vpmaddwd sums pairs into 8 int32 lanes, and
// one FMA per block adds lanes * d_w * d_x to a float accumulator. Offsets
// (Q4_0: 8, Q5_0: 16) come off as offset * sum(x) per block; the minimum of
// Q4_1 / Q5_1 is m * s with s = d_x * sum(x) from the Q8_1 activation.
//
// Two paths: the plain-row tile (vec_dot, and gemm on plain Q8_0 / Q8_1
// activation rows) unpacks each block of a weight row once for up to 4 tokens
// and gives every token the operations of vec_dot in the same order; the
// panel path (gemm on the packed activations sd_matmul always makes, and the
// weights repacked at load) puts 8 rows side by side, see "panel path".
#include "kernels/quant.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/legacy_layout.h"

const char *sd_kernels_avx2_init(sd_type_traits *traits, sd_from_float_fn act[SD_TYPE_COUNT],
                                 sd_act_pack_fn pack[SD_TYPE_COUNT]);

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define TGT_AI static inline __attribute__((always_inline, target("avx2,fma,f16c")))

TGT_AI float h2f(uint16_t h) { return _cvtsh_ss(h); }

// The 32 quants of a 4-bit block as unsigned bytes, element order.
TGT_AI __m256i nib32(const uint8_t *qs) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

// Bit 4 of each of the 32 quants of a Q5 block (qh, little endian) as 0x10 bytes.
TGT_AI __m256i q5_hi(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    // byte i gets bit i of h: broadcast, pick the byte holding bit i, test it
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                          3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

// sum over 32 of u[i] * s[i] (u unsigned bytes <= 31, s signed) as 8 int32 lanes.
TGT_AI __m256i dot_us(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// sum of the 32 signed bytes s as 8 int32 lanes.
TGT_AI __m256i sum_s(__m256i s) { return dot_us(_mm256_set1_epi8(1), s); }

TGT_AI float hsum(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

// The unsigned weight bytes, d and m of block b of a row (Q8_0: |w|, the
// signs go onto the activations in tile_row).
TGT_AI __m256i w_block(int type, const void *wv, int64_t b, float *d, float *m) {
    switch (type) {
    case SD_TYPE_Q4_0: {
        const sd_block_q4_0 *w = (const sd_block_q4_0 *)wv + b;
        *d = h2f(w->d);
        return nib32(w->qs);
    }
    case SD_TYPE_Q5_0: {
        const sd_block_q5_0 *w = (const sd_block_q5_0 *)wv + b;
        *d = h2f(w->d);
        return _mm256_or_si256(nib32(w->qs), q5_hi(w->qh));
    }
    case SD_TYPE_Q4_1: {
        const sd_block_q4_1 *w = (const sd_block_q4_1 *)wv + b;
        *d = h2f(w->d), *m = h2f(w->m);
        return nib32(w->qs);
    }
    case SD_TYPE_Q5_1: {
        const sd_block_q5_1 *w = (const sd_block_q5_1 *)wv + b;
        *d = h2f(w->d), *m = h2f(w->m);
        return _mm256_or_si256(nib32(w->qs), q5_hi(w->qh));
    }
    default: {
        const sd_block_q8_0 *w = (const sd_block_q8_0 *)wv + b;
        *d = h2f(w->d);
        return _mm256_loadu_si256((const __m256i *)w->qs); // signed, see tile_row
    }
    }
}

// One weight row against T <= 4 activation rows: each block's weights are
// unpacked once for all T tokens, and every token gets the same operations
// in the same order whatever T is (vec_dot is the T = 1 case: same bits).
TGT_AI void tile_row(int type, int T, int64_t n, const void *w, const char *xq, size_t xrb, float *y, int64_t ldy) {
    __m256 acc[4];
    float ms[4] = {0, 0, 0, 0};
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    const int with_min = type == SD_TYPE_Q4_1 || type == SD_TYPE_Q5_1;
    const int off = type == SD_TYPE_Q4_0 ? 8 : type == SD_TYPE_Q5_0 ? 16 : 0;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        float d, m = 0;
        __m256i u = w_block(type, w, b, &d, &m);
        __m256i su = type == SD_TYPE_Q8_0 ? _mm256_sign_epi8(u, u) : u;
        for (int t = 0; t < T; t++) {
            const char *xt = xq + (size_t)t * xrb;
            if (with_min) {
                const sd_block_q8_1 *x = (const sd_block_q8_1 *)xt + b;
                __m256i xs = _mm256_loadu_si256((const __m256i *)x->qs);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_us(u, xs)), _mm256_set1_ps(d * x->d), acc[t]);
                ms[t] += m * x->s;
            } else {
                const sd_block_q8_0 *x = (const sd_block_q8_0 *)xt + b;
                __m256i xs = _mm256_loadu_si256((const __m256i *)x->qs), is;
                if (type == SD_TYPE_Q8_0) is = dot_us(su, _mm256_sign_epi8(xs, u));
                else is = _mm256_sub_epi32(dot_us(u, xs), _mm256_mullo_epi32(sum_s(xs), _mm256_set1_epi32(off)));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(d * h2f(x->d)), acc[t]);
            }
        }
    }
    for (int t = 0; t < T; t++) y[t * ldy] = with_min ? hsum(acc[t]) + ms[t] : hsum(acc[t]);
}


// ---- panel path (sd_matmul, every batch size) ---------------------------------
//
// The AVX-512 panel path of kernels_x86.c, in 256-bit vectors: the weights
// are taken 8 rows at a time (a panel), one 32-bit lane per row. For block b
// of the panel, vector c (c < 8) holds elements 4c..4c+3 of block b of each
// of the 8 rows, and a token's 4 activation bytes of the same elements are
// broadcast to all lanes, so one vpmaddubsw multiplies 32 weights and the
// 8 rows' sums come out side by side: per block and token one int->float
// conversion, one scale product and one FMA serve 8 rows, and a token's 8
// results leave as one vector (no horizontal sums), where the plain-row dot
// above spends them on one row.
//
// Integer sums (exact, so their order is free): Q4 quants (0..15) times
// activation bytes (|q| <= 127) give 16-bit pairs of at most 3810, so the 8
// vectors of a block add up in 16 bits (30480) before one vpmaddwd widens
// them; Q5 (0..31, pairs up to 7874) widens after every 4; Q8_0 keeps |w|
// and moves the weight's sign onto the broadcast activation (vpsignb), pairs
// up to 32258, and widens every vector. Offsets (Q4_0: 8, Q5_0: 16) enter as
// a0 = -offset * sum(x) per block, the min of Q4_1 / Q5_1 as one FMA m * s.
//
// Every (row, token) lane gets, block after block, isum (exact integers),
// acc = fma(float(isum), dw * dx, acc), then for types with a min
// acc = fma(m, s, acc): the same whatever the number of tokens, the token's
// place in the batch, the thread's rows or the weight layout (file rows are
// rearranged into a panel first), so every path of sd_matmul gives the same
// bits (batch invariance). vec_dot and gemm on plain Q8_0 / Q8_1 rows (the
// code above) are invariant in themselves but do not give these bits;
// sd_matmul always packs the activations of these types (SD_MM_PACK_MIN_TOK).
//
// Activations (pack_act): per block of 32, a 40-byte xblock: float d (for
// the Q8_0-activation types rounded through fp16, as the reference quantizer
// stores it), float s = d * sum(qs) (types with a min) or int32
// a0 = -offset * sum(qs), the 32 signed quant bytes (the reference
// quantizer's bytes). The batch is cut into tiles of PV_T tokens (the last
// one shorter); tile g starts at byte PV_T g * x_row_bytes and holds block b
// of its token t at xblock index b * T + t, so with T a compile-time
// constant every activation load is one pointer plus a fixed offset. gemm_*
// recognize packed activations by x_row_bytes == pack_bytes(type, n_in).
//
// Repacked matrices (SD_TYPE_*_R, rewritten once at load): panel p = rows
// 8p..8p+7, in the same 8 * row bytes, block after block, each block in
// 8 x the block size:
//   quants  Q4/Q5: 4 vectors, lane i of vector p = bytes 4p..4p+3 of the qs
//           of row i (low nibbles: c = p, high nibbles: c = p + 4); Q5 then
//           8 x 32-bit masks (mask c, bit 4i + k = qh bit 4c + k of row i);
//           Q8_0: the 8 vectors, signed
//   d       8 fp16, row order
//   m       8 fp16, row order (Q4_1, Q5_1)
// 8 x the block size for every type. Rows past the last full panel
// (n_rows % 8) stay in the file's layout after the panels.

#define PV_ROWS 8 // rows per panel
#ifndef PV_T
#define PV_T 4    // tokens per pass over a panel (a tile of the activation layout)
#endif
#define PV_PF 2   // panels of software prefetch ahead

// (w_tsize, w_has_min, w_qoff, w_hoff and xblock: kernels/legacy_layout.h)
TGT_AI int w_is_q5(int type) { return type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1; }
TGT_AI int w_offset(int type) { return type == SD_TYPE_Q4_0 ? 8 : type == SD_TYPE_Q5_0 ? 16 : 0; }
TGT_AI size_t pv_qb(int type) { return type == SD_TYPE_Q8_0 ? 256 : w_is_q5(type) ? 160 : 128; }

TGT_AI size_t pack_bytes(int64_t n_in) { return ((size_t)(n_in / SD_QK) * sizeof(xblock) + 63) & ~(size_t)63; }

// One block of 32 floats: the reference quantizer's bytes (amax / 127, the
// reciprocal, products rounded to nearest even); returns d, the sum in *sum.
TGT_AI float quant_block(const float *x, int8_t *qs, int *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], mx;
    for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 8 * i);
    mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                       _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float d = _mm_cvtss_f32(h) / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    __m256i q[4];
    for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
    *sum = _mm_cvtsi128_si32(s4);
    // |q| <= 127: the saturating packs are exact; the lane permute restores element order
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)qs, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    return d;
}

static TGT void q8_0_quantize(const float *src, void *dst, int64_t n) {
    sd_block_q8_0 *y = dst;
    int sum;
    for (int64_t b = 0; b < n / SD_QK; b++) y[b].d = sd_fp32_to_fp16(quant_block(src + b * SD_QK, y[b].qs, &sum));
}

static TGT void q8_1_quantize(const float *src, void *dst, int64_t n) {
    sd_block_q8_1 *y = dst;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        int sum;
        const float d = quant_block(src + b * SD_QK, y[b].qs, &sum);
        y[b].d = d;
        y[b].s = d * (float)sum;
    }
}

// Blocks [b0, b1) of token t of an n_tok-token batch (x: the token's whole
// row) into xblocks at their place in the batch buffer dst. A block's bytes
// do not depend on b0, b1 or the batch.
TGT_AI size_t pack_act(int type, const float *x, void *dst, int64_t n, int64_t t, int64_t n_tok, int64_t b0,
                       int64_t b1) {
    const size_t xrb = pack_bytes(n);
    if (!dst) return xrb;
    const int64_t t0 = t / PV_T * PV_T, T = SD_MIN((int64_t)PV_T, n_tok - t0);
    xblock *o = (xblock *)((uint8_t *)dst + (size_t)t0 * xrb) + (t - t0) + b0 * T;
    for (int64_t b = b0; b < b1; b++, o += T) {
        int sum;
        const float d = quant_block(x + b * SD_QK, o->qs, &sum);
        if (w_has_min(type)) {
            o->d = d;
            o->u.s = d * (float)sum;
        } else {
            o->d = sd_fp16_to_fp32(sd_fp32_to_fp16(d));
            o->u.a0 = -w_offset(type) * sum;
        }
    }
    return xrb;
}

// Block b of a panel (8 x block size bytes at o) from block b of 8 file rows.
static void pv_build_block(int type, const uint8_t *const rows[PV_ROWS], int64_t b, uint8_t *o) {
    const size_t qo = w_qoff(type), wts = w_tsize(type), qb = pv_qb(type);
    for (int i = 0; i < PV_ROWS; i++) {
        const uint8_t *blk = rows[i] + (size_t)b * wts;
        memcpy(o + qb + 2 * i, blk, 2);
        if (w_has_min(type)) memcpy(o + qb + 16 + 2 * i, blk + 2, 2);
        const int nv = type == SD_TYPE_Q8_0 ? 8 : 4;
        for (int p = 0; p < nv; p++) memcpy(o + 32 * p + 4 * i, blk + qo + 4 * p, 4);
    }
    if (w_is_q5(type))
        for (int c = 0; c < 8; c++) {
            uint32_t k = 0;
            for (int i = 0; i < PV_ROWS; i++)
                k |= ((sd_ld32(rows[i] + (size_t)b * wts + w_hoff(type)) >> (4 * c)) & 15u) << (4 * i);
            memcpy(o + 128 + 4 * c, &k, 4);
        }
}

// An empty asm that the compiler must assume changes v: integer sums are
// exact, so GCC reassociates a token's chain of adds into products first and
// a sum tree after, which keeps all 32 products of a block live and spills
// them (measured: 30% slower on Zen 5); this keeps each token's running sum
// one register updated in place.
TGT_AI void keep_chain(__m256i *v) { __asm__("" : "+x"(*v)); }

TGT_AI __m256i bcast4(const int8_t *p) { return _mm256_set1_epi32((int)sd_ld32((const uint8_t *)p)); }

// One panel (nb blocks at P, 8 x block size each) against the T <= PV_T
// tokens of one activation tile (xi: block b of token t at xi[b * T + t]):
// y[t * ldy + i] for rows i < nrows (8 unless the last, partial panel).
// pf: a later panel to prefetch block by block along the way, or NULL.
TGT_AI void pv_tile(int type, int T, int64_t nb, const uint8_t *P, const xblock *xi, float *y, int64_t ldy,
                    int nrows, const uint8_t *pf) {
    const size_t bb = PV_ROWS * w_tsize(type), qb = pv_qb(type);
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[PV_T];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, xi += T) {
        const uint8_t *q = P + (size_t)b * bb;
        if (pf)
            for (size_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)pf + (size_t)b * bb + o, _MM_HINT_T0);
        __m256i is[PV_T];
        for (int t = 0; t < T; t++) is[t] = w_offset(type) ? _mm256_set1_epi32(xi[t].u.a0) : _mm256_setzero_si256();
        if (type == SD_TYPE_Q8_0) {
            for (int c = 0; c < 8; c++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(q + 32 * c)), a = _mm256_sign_epi8(w, w);
                for (int t = 0; t < T; t++) {
                    const __m256i s = _mm256_sign_epi8(bcast4(xi[t].qs + 4 * c), w);
                    is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(_mm256_maddubs_epi16(a, s), ones));
                    keep_chain(&is[t]);
                }
            }
        } else {
            // Q4: all 8 vectors in 16 bits; Q5: two halves of 4 (p = 0, 1 then p = 2, 3)
            const int half = w_is_q5(type) ? 2 : 4;
            for (int p0 = 0; p0 < 4; p0 += half) {
                __m256i h[PV_T];
                for (int t = 0; t < T; t++) h[t] = _mm256_setzero_si256();
                for (int p = p0; p < p0 + half; p++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * p));
                    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if (w_is_q5(type)) {
                        lo = _mm256_or_si256(lo, q5_hi(q + 128 + 4 * p));
                        hi = _mm256_or_si256(hi, q5_hi(q + 128 + 4 * (p + 4)));
                    }
                    for (int t = 0; t < T; t++) {
                        h[t] = _mm256_add_epi16(h[t], _mm256_maddubs_epi16(lo, bcast4(xi[t].qs + 4 * p)));
                        h[t] = _mm256_add_epi16(h[t], _mm256_maddubs_epi16(hi, bcast4(xi[t].qs + 4 * (p + 4))));
                        keep_chain(&h[t]);
                    }
                }
                for (int t = 0; t < T; t++) is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(h[t], ones));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(q + qb)));
        const __m256 mv = w_has_min(type) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(q + qb + 16))) : dw;
        for (int t = 0; t < T; t++) {
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_mul_ps(dw, _mm256_set1_ps(xi[t].d)), acc[t]);
            if (w_has_min(type)) acc[t] = _mm256_fmadd_ps(mv, _mm256_set1_ps(xi[t].u.s), acc[t]);
        }
    }
    if (nrows == PV_ROWS) {
        for (int t = 0; t < T; t++) _mm256_storeu_ps(y + t * ldy, acc[t]);
    } else {
        for (int t = 0; t < T; t++) {
            float tmp[PV_ROWS];
            _mm256_storeu_ps(tmp, acc[t]);
            memcpy(y + t * ldy, tmp, sizeof(float) * (size_t)nrows);
        }
    }
}

// A panel against all tokens, one activation tile at a time (the first tile
// prefetches pf).
TGT_AI void pv_all_tokens(int type, int64_t nb, const uint8_t *P, const uint8_t *x, size_t xrb, int64_t n_tok,
                          float *y, int64_t ldy, int nrows, const uint8_t *pf) {
    for (int64_t t = 0; t < n_tok; t += PV_T, pf = NULL) {
        const xblock *xi = (const xblock *)(x + t * xrb);
        float *yt = y + t * ldy;
        switch (SD_MIN((int64_t)PV_T, n_tok - t)) { // a constant T per case: fixed offsets, all in registers
#if PV_T > 4
        case 6: pv_tile(type, 6, nb, P, xi, yt, ldy, nrows, pf); break;
        case 5: pv_tile(type, 5, nb, P, xi, yt, ldy, nrows, pf); break;
#endif
        case 4: pv_tile(type, 4, nb, P, xi, yt, ldy, nrows, pf); break;
        case 3: pv_tile(type, 3, nb, P, xi, yt, ldy, nrows, pf); break;
        case 2: pv_tile(type, 2, nb, P, xi, yt, ldy, nrows, pf); break;
        default: pv_tile(type, 1, nb, P, xi, yt, ldy, nrows, pf); break;
        }
    }
}

// Rows [r0, r1) of file-layout rows, 8 at a time rearranged into a panel
// first (a partial panel repeats its last row and stores only its own).
TGT_AI void gemm_file_rows(int type, int64_t nb, const uint8_t *w, size_t wrb, int64_t r0, int64_t r1, const void *xq,
                           size_t xrb, int64_t n_tok, float *y, int64_t ldy) {
    // (not on the hot path: models are repacked at load)
    uint8_t *P = malloc((size_t)nb * PV_ROWS * w_tsize(type) + 64);
    SD_ASSERT(P != NULL);
    for (int64_t r = r0; r < r1; r += PV_ROWS) {
        const int nrows = (int)SD_MIN((int64_t)PV_ROWS, r1 - r);
        const uint8_t *rows[PV_ROWS];
        for (int i = 0; i < PV_ROWS; i++) rows[i] = w + (size_t)(r + SD_MIN(i, nrows - 1)) * wrb;
        for (int64_t b = 0; b < nb; b++) pv_build_block(type, rows, b, P + (size_t)b * PV_ROWS * w_tsize(type));
        pv_all_tokens(type, nb, P, xq, xrb, n_tok, y + r, ldy, nrows, NULL);
    }
    free(P);
}

// Rows [r0, r1) of a repacked matrix: r0 is a multiple of 8 (sd_matmul hands
// out rows in chunks of 16), so whole panels up to the last multiple of 8 and
// the file-layout rows after the panels (the matrix's last n_rows % 8).
TGT_AI void gemm_repacked(int type, int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1, const void *xq,
                          size_t xrb, int64_t n_tok, float *y, int64_t ldy) {
    const int64_t nb = n_in / SD_QK;
    const uint8_t *w = W;
    // the activations are always packed for a repacked type (sd_matmul uses its packer)
    SD_ASSERT(xrb == pack_bytes(n_in) && ((uintptr_t)xq & 31) == 0 && r0 % PV_ROWS == 0);
    const int64_t rp_end = r0 + (r1 - r0) / PV_ROWS * PV_ROWS;
    for (int64_t r = r0; r < rp_end; r += PV_ROWS) {
        const uint8_t *pf = r + PV_ROWS * PV_PF < rp_end ? w + (r + PV_ROWS * PV_PF) * wrb : NULL;
        pv_all_tokens(type, nb, w + r * wrb, xq, xrb, n_tok, y + r, ldy, PV_ROWS, pf);
    }
    if (rp_end < r1) gemm_file_rows(type, nb, w, wrb, rp_end, r1, xq, xrb, n_tok, y, ldy);
}

static int repack_legacy(int type, const void *src, void *dst, int64_t n_in, int64_t n_rows) {
    const int64_t nb = n_in / SD_QK, np = n_rows / PV_ROWS;
    if (n_in % SD_QK) return -1;
    const size_t wrb = (size_t)nb * w_tsize(type), bb = PV_ROWS * w_tsize(type);
    for (int64_t p = 0; p < np; p++) {
        const uint8_t *rows[PV_ROWS];
        for (int i = 0; i < PV_ROWS; i++) rows[i] = (const uint8_t *)src + (size_t)(p * PV_ROWS + i) * wrb;
        uint8_t *o = (uint8_t *)dst + (size_t)p * PV_ROWS * wrb;
        for (int64_t b = 0; b < nb; b++) pv_build_block(type, rows, b, o + (size_t)b * bb);
    }
    memcpy((uint8_t *)dst + (size_t)np * PV_ROWS * wrb, (const uint8_t *)src + (size_t)np * PV_ROWS * wrb,
           (size_t)(n_rows - np * PV_ROWS) * wrb);
    return 0;
}

// Per type: gemm on file-layout rows (packed activations: the panel path;
// plain Q8_0 / Q8_1 rows: tile_row), vec_dot, the packer, and the repacked
// type's gemm and repack.
#define DEFINE_TYPE(name, TYPE)                                                                                  \
    static TGT void gemm_##name(int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1, const void *xq, \
                                size_t xrb, int64_t n_tok, float *y, int64_t ldy) {                            \
        if (xrb == pack_bytes(n_in) && ((uintptr_t)xq & 31) == 0) {                                            \
            gemm_file_rows(TYPE, n_in / SD_QK, W, wrb, r0, r1, xq, xrb, n_tok, y, ldy);                        \
            return;                                                                                            \
        }                                                                                                      \
        for (int64_t r = r0; r < r1; r++) {                                                                    \
            const char *w = (const char *)W + (size_t)r * wrb, *x = xq;                                       \
            int64_t t = 0;                                                                                     \
            for (; t + 4 <= n_tok; t += 4) tile_row(TYPE, 4, n_in, w, x + t * xrb, xrb, y + t * ldy + r, ldy); \
            switch (n_tok - t) {                                                                               \
            case 3: tile_row(TYPE, 3, n_in, w, x + t * xrb, xrb, y + t * ldy + r, ldy); break;                 \
            case 2: tile_row(TYPE, 2, n_in, w, x + t * xrb, xrb, y + t * ldy + r, ldy); break;                 \
            case 1: tile_row(TYPE, 1, n_in, w, x + t * xrb, xrb, y + t * ldy + r, ldy); break;                 \
            default: break;                                                                                    \
            }                                                                                                  \
        }                                                                                                      \
    }                                                                                                          \
    static TGT float dot_##name(int64_t n, const void *w, const void *x) {                                     \
        float y;                                                                                               \
        tile_row(TYPE, 1, n, w, (const char *)x, 0, &y, 1);                                                    \
        return y;                                                                                              \
    }                                                                                                          \
    static TGT size_t pack_##name(const float *x, void *dst, int64_t n, int64_t t, int64_t n_tok, int64_t b0,  \
                                  int64_t b1) {                                                                \
        return pack_act(TYPE, x, dst, n, t, n_tok, b0, b1);                                                    \
    }                                                                                                          \
    static TGT void gemm_rp_##name(int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1,            \
                                   const void *xq, size_t xrb, int64_t n_tok, float *y, int64_t ldy) {         \
        gemm_repacked(TYPE, n_in, W, wrb, r0, r1, xq, xrb, n_tok, y, ldy);                                     \
    }                                                                                                          \
    static int repack_##name(const void *src, void *dst, int64_t n_in, int64_t n_rows) {                      \
        return repack_legacy(TYPE, src, dst, n_in, n_rows);                                                    \
    }
DEFINE_TYPE(q4_0, SD_TYPE_Q4_0)
DEFINE_TYPE(q4_1, SD_TYPE_Q4_1)
DEFINE_TYPE(q5_0, SD_TYPE_Q5_0)
DEFINE_TYPE(q5_1, SD_TYPE_Q5_1)
DEFINE_TYPE(q8_0, SD_TYPE_Q8_0)

const char *sd_kernels_avx2_init(sd_type_traits *traits, sd_from_float_fn act[SD_TYPE_COUNT],
                                 sd_act_pack_fn pack[SD_TYPE_COUNT]) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c"))
        return NULL;
#define SET(name, T, RT)                      \
    traits[T].vec_dot = dot_##name;           \
    traits[T].gemm = gemm_##name;             \
    pack[T] = pack_##name;                    \
    traits[RT].gemm = gemm_rp_##name;         \
    traits[RT].repack = repack_##name;        \
    traits[RT].supported = 1;                 \
    pack[RT] = pack_##name;
    SET(q4_0, SD_TYPE_Q4_0, SD_TYPE_Q4_0_R)
    SET(q4_1, SD_TYPE_Q4_1, SD_TYPE_Q4_1_R)
    SET(q5_0, SD_TYPE_Q5_0, SD_TYPE_Q5_0_R)
    SET(q5_1, SD_TYPE_Q5_1, SD_TYPE_Q5_1_R)
    SET(q8_0, SD_TYPE_Q8_0, SD_TYPE_Q8_0_R)
#undef SET
    act[SD_TYPE_Q8_0] = q8_0_quantize;
    act[SD_TYPE_Q8_1] = q8_1_quantize;
    return "avx2";
}

#else

const char *sd_kernels_avx2_init(sd_type_traits *traits, sd_from_float_fn act[SD_TYPE_COUNT],
                                 sd_act_pack_fn pack[SD_TYPE_COUNT]) {
    (void)traits;
    (void)act;
    (void)pack;
    return NULL;
}

#endif
