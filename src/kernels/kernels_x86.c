// kernels_x86.c - AVX-512 (F, BW, VL, VNNI) kernels of the legacy quants and
// the float types, selected by sd_quant_init through sd_kernels_x86_init
// (compiled in when the build targets AVX-512 VNNI, e.g. -march=native on this
// EPYC; also checked at run time with __builtin_cpu_supports). Without them
// sd_quant_init falls back to the AVX2 family (kernels_avx2.c) or the scalar
// references of quant.c.
// The references are the specification; tests/kernels/test_quant_legacy.c compares every
// kernel here with them.
//
// Integer dots use VNNI vpdpbusd (unsigned byte x signed byte, 4 products
// summed per 32-bit lane). Weight bytes are made unsigned:
//   Q4_1, Q5_1: the quant values are already unsigned (0..15, 0..31); the
//               min term m * sum(x) comes from the Q8_1 field s = d*sum(qs).
//   Q4_0, Q5_0: q - 8 (q - 16): the accumulator starts at -8*sum(x) (-16*sum(x)).
//   Q8_0:       q + 128 (xor 0x80): the accumulator starts at -128*sum(x).
//
// Two paths:
//  - fused (vec_dot, and gemm on plain vec_dot_type rows): a zmm holds two
//    consecutive blocks in element order; weights are unpacked and activation
//    scales gathered on the fly; R = 4 rows x T <= 4 tokens per tile.
//  - panel (gemm on rows from sd_matmul, which converts activations with the
//    packers below; every batch size): 16 weight rows side by side, one
//    32-bit lane per row, a token's 4 activation bytes broadcast to all
//    lanes; per block one int->float conversion, scale product and FMA serve
//    16 rows, and a token's 16 results leave as one vector (no horizontal
//    sums). Up to 16 tokens per pass over a panel, so each unpacked weight
//    vector serves 16 dpbusd. See "panel path" below.
// Either way each weight byte is read from memory once per sd_matmul call.
//
// Batch invariance (required by speculative verification): a (row, token)
// dot must give the same bits whatever n_tok, the token's place in a pass,
// or the thread's row range. Integer dots are exact; the float work per
// (row, token) lane is the same sequence of per-block FMAs in every case.
// sd_matmul always takes the panel path for these types (1-token calls
// included); the fused path (vec_dot, gemm on plain rows, rows of more than
// PK_NB_MAX blocks) is invariant in itself but does not give the panel
// path's bits.
//
// Repacked weights (SD_TYPE_*_R): models are rewritten at load into panels,
// so the kernel reads them straight from memory; a file-layout matrix is
// rearranged panel by panel on the fly (same bits, slower).
//
// Measured (this 2-vCPU Zen 5 EPYC, 3.8 GHz): a core issues two 512-bit
// vpdpbusd per cycle (with 8 independent chains; latency 4 cycles), sharing
// the two pipes with the float FMAs. One panel against 16 tokens on hot data:
// Q4_1 70%, Q8_0 73% of that peak (the per-block float work caps Q4_1 at
// 73%). Q4_1, 1 thread, 576 x 1536 weights streamed from memory (software
// prefetch two panels ahead, block by block), 16 tokens: 0.043-0.045 ms,
// 64-66%. Whole default model, 2 threads: see the README.
// The prefetch goes into L2 only (_MM_HINT_T1; the L1 prefetcher takes the
// lines from there): on a Zen 4 EPYC (32 KiB L1d) prefetching into L1 made
// SmolLM2's forward 10-25% slower at 1-8 tokens (2026-11-30,
// docs/performance.md).
#include "kernels/quant.h"

#include <stdlib.h>
#include <string.h>

const char *sd_kernels_x86_init(sd_type_traits *traits, sd_from_float_fn act[SD_TYPE_COUNT],
                                sd_act_pack_fn pack[SD_TYPE_COUNT]);

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>

#include "common.h"
#include "kernels/legacy_layout.h"

#define AI static inline __attribute__((always_inline))


// ---- per-type constants ---------------------------------------------------

// (w_tsize, w_has_min, w_qoff, w_hoff and xblock: kernels/legacy_layout.h)
// Offset added to the signed weight value to make it unsigned (0: none).
AI int w_offset(int type) {
    return type == SD_TYPE_Q4_0 ? 8 : type == SD_TYPE_Q5_0 ? 16 : type == SD_TYPE_Q8_0 ? 128 : 0;
}
// Activation block size (Q8_1 for the types with a min, else Q8_0).
AI size_t x_tsize(int type) { return w_has_min(type) ? sizeof(sd_block_q8_1) : sizeof(sd_block_q8_0); }

// ---- weight side: two blocks -> unsigned bytes + scales ---------------------

typedef struct {
    __m512i w;  // 64 unsigned quant bytes: block 0 then block 1, element order
    __m512 dw;  // lanes 0-7: d of block 0, lanes 8-15: d of block 1
    __m512 mv;  // the same for m (types with a min)
} wprep;

// Unpacks 16 packed nibble bytes of two blocks into element order.
AI __m512i unpack_nibbles(const uint8_t *qs0, const uint8_t *qs1) {
    __m256i y = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)qs0)),
                                        _mm_loadu_si128((const __m128i *)qs1), 1);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i lo = _mm256_and_si256(y, m4);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(y, 4), m4);
    const __m512i idx = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
    return _mm512_permutex2var_epi64(_mm512_castsi256_si512(lo), idx, _mm512_castsi256_si512(hi));
}

// Bit 4 of every quant value of two Q5 blocks (qh of block 0 in mask bits 0-31).
AI __m512i q5_high_bits(const uint8_t *qh0, const uint8_t *qh1) {
    __mmask64 k = _cvtu64_mask64((uint64_t)sd_ld32(qh0) | (uint64_t)sd_ld32(qh1) << 32);
    return _mm512_maskz_mov_epi8(k, _mm512_set1_epi8(0x10));
}

// Scales from the first 4 header bytes of two blocks: (d, m) fp16 or (d, -).
AI void scales_dm(const uint8_t *h0, const uint8_t *h1, int with_m, __m512 *dw, __m512 *mv) {
    __m128i v = _mm_cvtsi32_si128((int)(with_m ? sd_ld32(h0) : sd_ld16(h0)));
    v = _mm_insert_epi32(v, (int)(with_m ? sd_ld32(h1) : sd_ld16(h1)), 1);
    __m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(v)); // d0 m0 d1 m1
    *dw = _mm512_permutexvar_ps(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), f);
    if (with_m) *mv = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), f);
}

AI void prep_w(int type, const uint8_t *b0, const uint8_t *b1, wprep *o) {
    switch (type) {
    case SD_TYPE_Q4_0:
        o->w = unpack_nibbles(b0 + 2, b1 + 2);
        scales_dm(b0, b1, 0, &o->dw, &o->mv);
        break;
    case SD_TYPE_Q4_1:
        o->w = unpack_nibbles(b0 + 4, b1 + 4);
        scales_dm(b0, b1, 1, &o->dw, &o->mv);
        break;
    case SD_TYPE_Q5_0:
        o->w = _mm512_or_si512(unpack_nibbles(b0 + 6, b1 + 6), q5_high_bits(b0 + 2, b1 + 2));
        scales_dm(b0, b1, 0, &o->dw, &o->mv);
        break;
    case SD_TYPE_Q5_1:
        o->w = _mm512_or_si512(unpack_nibbles(b0 + 8, b1 + 8), q5_high_bits(b0 + 4, b1 + 4));
        scales_dm(b0, b1, 1, &o->dw, &o->mv);
        break;
    default: { // Q8_0
        __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                                       _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
        o->w = _mm512_xor_si512(q, _mm512_set1_epi8((char)0x80));
        scales_dm(b0, b1, 0, &o->dw, &o->mv);
    }
    }
}

// ---- activation side: two Q8_0 / Q8_1 blocks --------------------------------

typedef struct {
    __m512i x;    // 64 signed bytes, block 0 then block 1 (zero for a missing block 1)
    __m512i acc0; // initial accumulator: -offset * (sum of each lane's 4 bytes)
    __m512 dx;    // lanes 0-7: d of block 0, 8-15: d of block 1
    __m512 sv;    // lane 0: s of block 0, lane 8: s of block 1, else 0 (Q8_1)
} xprep;

AI void prep_x(int type, const uint8_t *x0, const uint8_t *x1, int tail, xprep *o) {
    int q81 = w_has_min(type);
    size_t qoff = q81 ? 8 : 2;
    __m256i lo = _mm256_loadu_si256((const __m256i *)(x0 + qoff));
    o->x = tail ? _mm512_zextsi256_si512(lo)
                : _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_loadu_si256((const __m256i *)(x1 + qoff)), 1);
    if (q81) {
        __m512 f = _mm512_castps128_ps512(_mm_castsi128_ps(_mm_set_epi64x((long long)sd_ld64(x1), (long long)sd_ld64(x0))));
        o->dx = _mm512_permutexvar_ps(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), f);
        o->sv = _mm512_maskz_permutexvar_ps(tail ? 0x0001 : 0x0101,
                                            _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1), f);
    } else {
        __m128i v = _mm_insert_epi32(_mm_cvtsi32_si128(sd_ld16(x0)), sd_ld16(x1), 1);
        __m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(v));
        o->dx = _mm512_permutexvar_ps(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), f);
    }
    int off = w_offset(type);
    if (off) {
        __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)off), o->x);
        o->acc0 = _mm512_sub_epi32(_mm512_setzero_si512(), c);
    } else {
        o->acc0 = _mm512_setzero_si512();
    }
}

// ---- the R x T tile ---------------------------------------------------------

// y[t * ldy + r] = dot(row r, token t) for r < R, t < T; w points at row 0,
// x at token 0; nb blocks per row.
AI void tile(int type, int R, int T, int64_t nb, const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb,
             float *y, int64_t ldy) {
    const size_t wts = w_tsize(type), xts = x_tsize(type);
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        int tail = b + 1 == nb;
        size_t b1 = tail ? (size_t)b : (size_t)b + 1;
        wprep wp[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) prep_w(type, w + r * wrb + b * wts, w + r * wrb + b1 * wts, &wp[r]);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            xprep xp;
            prep_x(type, x + t * xrb + b * xts, x + t * xrb + b1 * xts, tail, &xp);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512i isum = _mm512_dpbusd_epi32(xp.acc0, wp[r].w, xp.x);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(wp[r].dw, xp.dx), acc[r][t]);
                if (w_has_min(type)) acc[r][t] = _mm512_fmadd_ps(wp[r].mv, xp.sv, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

// All tokens for R rows starting at w.
AI void rows_all_tokens(int type, int R, int64_t nb, const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb,
                        int64_t n_tok, float *y, int64_t ldy) {
    int64_t t = 0;
    for (; t + 4 <= n_tok; t += 4) tile(type, R, 4, nb, w, wrb, x + t * xrb, xrb, y + t * ldy, ldy);
    switch (n_tok - t) {
    case 3: tile(type, R, 3, nb, w, wrb, x + t * xrb, xrb, y + t * ldy, ldy); break;
    case 2: tile(type, R, 2, nb, w, wrb, x + t * xrb, xrb, y + t * ldy, ldy); break;
    case 1: tile(type, R, 1, nb, w, wrb, x + t * xrb, xrb, y + t * ldy, ldy); break;
    default: break;
    }
}

AI void gemm_generic(int type, int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1, const void *xq,
                     size_t xrb, int64_t n_tok, float *y, int64_t ldy) {
    const int64_t nb = n_in / SD_QK;
    const uint8_t *w = W;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) rows_all_tokens(type, 4, nb, w + r * wrb, wrb, xq, xrb, n_tok, y + r, ldy);
    for (; r < r1; r++) rows_all_tokens(type, 1, nb, w + r * wrb, wrb, xq, xrb, n_tok, y + r, ldy);
}

// ---- activation quantizers (same bytes as the references in quant.c) --------

// One block of 32 floats: returns the scale d, writes the 32 rounded values
// to qs and, when sum is not NULL, their sum.
AI float quant_block(const float *x, int8_t *qs, int *sum) {
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    __m512 vid = _mm512_set1_ps(id);
    __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)); // round to nearest even
    __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
    _mm_storeu_si128((__m128i *)qs, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtepi32_epi8(q1));
    if (sum) *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    return d;
}

static void q8_0_quantize(const float *src, void *dst, int64_t n) {
    sd_block_q8_0 *y = dst;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        y[b].d = sd_fp32_to_fp16(quant_block(src + b * SD_QK, y[b].qs, NULL));
    }
}

static void q8_1_quantize(const float *src, void *dst, int64_t n) {
    sd_block_q8_1 *y = dst;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        int sum;
        float d = quant_block(src + b * SD_QK, y[b].qs, &sum);
        y[b].d = d;
        y[b].s = d * (float)sum;
    }
}

// ---- panel path (sd_matmul, every batch size) ---------------------------------
//
// The weights are taken 16 rows at a time (a panel), one 32-bit lane per row:
// for block b of the panel, vector c (c < 8) holds elements 4c..4c+3 of block
// b of each of the 16 rows, and a token's 4 activation bytes of the same
// elements are broadcast to all lanes. Eight dpbusd (two chains of four) give
// each lane the integer dot of its row's block; then, per block, one int->float
// conversion, one scale product and one FMA (plus one FMA for the min of
// Q4_1 / Q5_1) serve 16 rows. The 16 results of a token come out as one
// vector, already in row order: no horizontal sums, no partial groups.
//
// Every (row, token) lane gets, block after block, isum (exact integers),
// acc = fma(float(isum), dw * dx, acc), then for types with a min
// acc = fma(m, s, acc). That is the same whatever the number of tokens, the
// token's place in the batch, the thread's rows or the weight layout (file
// rows are rearranged into a panel on the stack first), so every path gives
// the same bits: batch invariance.
//
// sd_matmul converts the activations with pack_act_* (below): per block of
// 32, 40 bytes: float d (for the Q8_0-activation types rounded through fp16,
// as the reference quantizer does), then float s = d * sum(qs) (types with a
// min) or int32 a0 = -offset * sum(qs) (offset types), then the 32 signed
// quant bytes. gemm_* recognize such a batch by x_row_bytes ==
// pack_bytes(type, n_in) and otherwise take the fused path on plain rows.
//
// Activation layout: the batch is cut into tiles of PN_T = 16 tokens (the
// last one shorter); tile g starts at byte 16g * x_row_bytes and holds, block
// after block, that block of each of its T tokens: block b of its token t at
// xblock index b * T + t. A pass over a panel takes one whole tile, and with
// T a compile-time constant every activation load is one pointer plus a fixed
// offset: 16 accumulators, 8 weight vectors and no spills. (Rows of more than
// PK_NB_MAX blocks are plain Q8_0 / Q8_1 rows instead, token after token.)
//
// Repacked matrices (SD_TYPE_*_R, rewritten once at load) hold their rows in
// panels: panel p = rows 16p..16p+15, in the same 16 * row bytes, block
// after block, each block in 16 x the block size:
//   quants  QB bytes. Q4/Q5: 4 vectors, lane i of vector p = bytes 4p..4p+3
//           of the qs of row i, so vector c = p (low nibbles) and c = p + 4
//           (high nibbles); Q5 then 8 x 64-bit masks of bit 4 (vector c,
//           byte 4i + k <- qh bit 4c + k of row i); Q8_0: the 8 vectors,
//           offset to unsigned
//   d       16 fp16, row order
//   m       16 fp16, row order (Q4_1, Q5_1)
// QB + 32 (+ 32) = 16 x the block size for every type. Rows past the last
// full panel (n_rows % 16) stay in the file's layout after the panels.

#define PK_NB_MAX 512 // panel path for n_in <= 16384; longer rows use the fused path
#define PN_ROWS 16    // rows per panel
#define PN_T 16       // tokens per pass over a panel (a tile of the activation layout)
#define PN_PF 2       // panels of software prefetch ahead

AI size_t pack_bytes(int type, int64_t n_in) {
    const int64_t nb = n_in / SD_QK;
    if (nb > PK_NB_MAX) return (size_t)nb * x_tsize(type);
    return ((size_t)nb * sizeof(xblock) + 63) & ~(size_t)63;
}

// The scale fields of an xblock from its quantization (scale d, sum of the
// quants): d and d * sum for types with a min, else d rounded through fp16
// (the weights' scale precision) and the offset correction -offset * sum.
AI void xblock_scales(int type, xblock *o, float d, int sum) {
    if (w_has_min(type)) {
        o->d = d;
        o->u.s = d * (float)sum;
    } else {
        o->d = sd_fp16_to_fp32(sd_fp32_to_fp16(d));
        o->u.a0 = -w_offset(type) * sum;
    }
}

// Reduces 16 vectors to one: lane j = the reduction (max, or 32-bit integer
// add, by OP) over all 16 lanes of v[j]. A tree of lane shuffles (15 steps
// for 16 vectors, where one vector at a time takes 4), then the lanes put in
// block order.
#define RED16_MAX 0
#define RED16_ADD 1
AI __m512 red16_op(int op, __m512 a, __m512 b) {
    return op == RED16_MAX ? _mm512_max_ps(a, b)
                           : _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}
AI __m512 red16(int op, const __m512 *v) {
    __m512 r[8], s[4], t[2];
    for (int i = 0; i < 8; i++) // quarters: v[2i] in the low half, v[2i+1] in the high half
        r[i] = red16_op(op, _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                        _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; i++) // one quarter per vector
        s[i] = red16_op(op, _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                        _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; i++) // two lanes per vector
        t[i] = red16_op(op, _mm512_unpacklo_ps(s[2 * i], s[2 * i + 1]), _mm512_unpackhi_ps(s[2 * i], s[2 * i + 1]));
    const __m512 u = red16_op(op, _mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 2, 3, 2)));
    // lane k of u holds vector (k % 4) * 4 + k / 4: a 4 x 4 transpose, its own inverse
    const __m512i idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(idx, u);
}

// nb <= 16 consecutive blocks of one token (32 nb floats at x) into xblocks
// o[0], o[T], ..., o[(nb - 1) T]: the same bytes as quant_block per block
// (max, the divisions and the rounding are the same operations lane by lane,
// and the sums are exact), with the horizontal max and sum of 16 blocks done
// at once.
AI void pack16(int type, const float *x, xblock *o, int64_t T, int nb) {
    __m512 v[16];
    for (int j = 0; j < 16; j++)
        v[j] = j < nb ? _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * j)),
                                      _mm512_abs_ps(_mm512_loadu_ps(x + 32 * j + 16)))
                      : _mm512_setzero_ps();
    const __m512 d = _mm512_div_ps(red16(RED16_MAX, v), _mm512_set1_ps(127.0f));
    const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ), _mm512_set1_ps(1.0f), d);
    float dv[16], idv[16];
    _mm512_storeu_ps(dv, d);
    _mm512_storeu_ps(idv, id);
    for (int j = 0; j < nb; j++) {
        const __m512 vid = _mm512_set1_ps(idv[j]);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * j), vid));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * j + 16), vid));
        int8_t *qs = o[j * T].qs;
        _mm_storeu_si128((__m128i *)qs, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtepi32_epi8(q1));
        v[j] = _mm512_castsi512_ps(_mm512_add_epi32(q0, q1));
    }
    int32_t sv[16];
    _mm512_storeu_si512(sv, _mm512_castps_si512(red16(RED16_ADD, v)));
    for (int j = 0; j < nb; j++) xblock_scales(type, o + j * T, dv[j], sv[j]);
}

// Quantizes blocks [b0, b1) of token t of an n_tok-token batch (x: the
// token's whole row) into xblocks at their place in the batch buffer dst (see
// "activation layout" above). A block's bytes do not depend on b0, b1.
AI size_t pack_act(int type, const float *x, void *dst, int64_t n, int64_t t, int64_t n_tok, int64_t b0, int64_t b1) {
    const int64_t nb = n / SD_QK;
    const size_t xrb = pack_bytes(type, n);
    if (!dst) return xrb;
    if (nb > PK_NB_MAX) {
        uint8_t *o = (uint8_t *)dst + (size_t)t * xrb + (size_t)b0 * x_tsize(type);
        if (w_has_min(type)) q8_1_quantize(x + b0 * SD_QK, o, (b1 - b0) * SD_QK);
        else q8_0_quantize(x + b0 * SD_QK, o, (b1 - b0) * SD_QK);
        return xrb;
    }
    const int64_t t0 = t / PN_T * PN_T, T = SD_MIN((int64_t)PN_T, n_tok - t0);
    xblock *o = (xblock *)((uint8_t *)dst + (size_t)t0 * xrb) + (t - t0) + b0 * T;
    int64_t b = b0;
    for (; b + 16 <= b1; b += 16, o += 16 * T) pack16(type, x + b * SD_QK, o, T, 16);
    if (b1 - b >= 2) { // a partial group: the same, with empty lanes
        pack16(type, x + b * SD_QK, o, T, (int)(b1 - b));
        o += (b1 - b) * T;
        b = b1;
    }
    for (; b < b1; b++, o += T) {
        int sum;
        const float d = quant_block(x + b * SD_QK, o->qs, &sum);
        xblock_scales(type, o, d, sum);
    }
    return xrb;
}

AI size_t rp_qb(int type) {
    return type == SD_TYPE_Q8_0 ? 512 : (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1) ? 320 : 256;
}

// Block b of a panel (16 x block size bytes at o) from block b of 16 file rows.
static void pn_build_block(int type, const uint8_t *const rows[PN_ROWS], int64_t b, uint8_t *o) {
    const size_t qo = w_qoff(type), wts = w_tsize(type), qb = rp_qb(type);
    for (int i = 0; i < PN_ROWS; i++) {
        const uint8_t *blk = rows[i] + (size_t)b * wts;
        memcpy(o + qb + 2 * i, blk, 2);
        if (w_has_min(type)) memcpy(o + qb + 32 + 2 * i, blk + 2, 2);
        if (type == SD_TYPE_Q8_0) {
            for (int c = 0; c < 8; c++)
                for (int k = 0; k < 4; k++) o[64 * c + 4 * i + k] = blk[qo + 4 * c + k] ^ 0x80;
        } else {
            for (int p = 0; p < 4; p++) memcpy(o + 64 * p + 4 * i, blk + qo + 4 * p, 4);
        }
    }
    if (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1)
        for (int c = 0; c < 8; c++) {
            uint64_t k = 0;
            for (int i = 0; i < PN_ROWS; i++)
                k |= (uint64_t)((sd_ld32(rows[i] + (size_t)b * wts + w_hoff(type)) >> (4 * c)) & 15) << (4 * i);
            memcpy(o + 256 + 8 * c, &k, 8);
        }
}

// v, kept in a register (the compiler would otherwise fold its load into
// every dpbusd that uses it).
AI __m512i in_reg(__m512i v) {
    __asm__("" : "+v"(v));
    return v;
}

// The 8 unsigned vectors of a panel block.
AI void pn_unpack(int type, const uint8_t *q, __m512i out[8]) {
    if (type == SD_TYPE_Q8_0) {
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) out[c] = in_reg(_mm512_loadu_si512(q + 64 * c));
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        __m512i a = _mm512_loadu_si512(q + 64 * p);
        out[p] = _mm512_and_si512(a, m4);
        out[p + 4] = _mm512_and_si512(_mm512_srli_epi16(a, 4), m4);
    }
    if (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1) {
        const __m512i h = _mm512_set1_epi8(0x10);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
            out[c] = _mm512_mask_add_epi8(out[c], _cvtu64_mask64(sd_ld64(q + 256 + 8 * c)), out[c], h);
    }
}

AI __m512 ld_ph16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
AI __m512i bcast32(const int8_t *p) { return _mm512_set1_epi32((int)sd_ld32((const uint8_t *)p)); }

// Software prefetch of n bytes from p into L2.
AI void prefetch_bytes(const uint8_t *p, size_t n) {
    for (size_t o = 0; o < n; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T1);
}

// One panel (nb blocks at P, 16 x block size each) against the T <= PN_T
// tokens of one activation tile (xi: block b of token t at xi[b * T + t]):
// y[t * ldy + i] for rows i < nrows (16 unless the last, partial panel).
// pf: a later panel to prefetch into L2 block by block along the way, or NULL.
AI void pn_tile(int type, int T, int64_t nb, const uint8_t *P, const xblock *xi, float *y, int64_t ldy, int nrows,
                const uint8_t *pf) {
    const size_t bb = PN_ROWS * w_tsize(type), qb = rp_qb(type);
    __m512 acc[PN_T];
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, xi += T) {
        const uint8_t *q = P + (size_t)b * bb;
        if (pf) prefetch_bytes(pf + (size_t)b * bb, bb);
        __m512i wv[8];
        pn_unpack(type, q, wv);
        const __m512 dw = ld_ph16(q + qb);
        const __m512 mv = w_has_min(type) ? ld_ph16(q + qb + 32) : dw;
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            const xblock *xb = xi + t;
            // two chains per token (integer sums: the same bits), half the latency
            __m512i c0 = w_offset(type) ? _mm512_set1_epi32(xb->u.a0) : _mm512_setzero_si512();
            __m512i c1 = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int c = 0; c < 8; c += 2) {
                c0 = _mm512_dpbusd_epi32(c0, wv[c], bcast32(xb->qs + 4 * c));
                c1 = _mm512_dpbusd_epi32(c1, wv[c + 1], bcast32(xb->qs + 4 * c + 4));
            }
            c0 = _mm512_add_epi32(c0, c1);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0), _mm512_mul_ps(dw, _mm512_set1_ps(xb->d)), acc[t]);
            if (w_has_min(type)) acc[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xb->u.s), acc[t]);
        }
    }
    const __mmask16 k = (__mmask16)((1u << nrows) - 1);
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + t * ldy, k, acc[t]);
}

// A panel against all tokens, one activation tile at a time (the first tile
// prefetches pf).
AI void pn_all_tokens(int type, int64_t nb, const uint8_t *P, const uint8_t *x, size_t xrb, int64_t n_tok, float *y,
                      int64_t ldy, int nrows, const uint8_t *pf) {
    for (int64_t t = 0; t < n_tok; t += PN_T, pf = NULL) {
        const xblock *xi = (const xblock *)(x + t * xrb);
        float *yt = y + t * ldy;
        switch (SD_MIN((int64_t)PN_T, n_tok - t)) { // a constant T per case: fixed offsets, all in registers
#define PN_CASE(T) case T: pn_tile(type, T, nb, P, xi, yt, ldy, nrows, pf); break;
        PN_CASE(16) PN_CASE(15) PN_CASE(14) PN_CASE(13) PN_CASE(12) PN_CASE(11) PN_CASE(10) PN_CASE(9)
        PN_CASE(8) PN_CASE(7) PN_CASE(6) PN_CASE(5) PN_CASE(4) PN_CASE(3) PN_CASE(2) PN_CASE(1)
#undef PN_CASE
        default: break;
        }
    }
}

// Rows [r0, r1) of file-layout rows (16 at a time rearranged into a panel on
// the stack; a partial panel repeats its last row and stores only its own).
AI void gemm_file_rows(int type, int64_t nb, const uint8_t *w, size_t wrb, int64_t r0, int64_t r1, const void *xq,
                       size_t xrb, int64_t n_tok, float *y, int64_t ldy) {
    // (not on the hot path: models are repacked at load; heap, as a panel of
    // long rows would not fit a thread's stack comfortably)
    uint8_t *P = malloc((size_t)nb * PN_ROWS * w_tsize(type) + 64);
    SD_ASSERT(P != NULL);
    for (int64_t r = r0; r < r1; r += PN_ROWS) {
        const int nrows = (int)SD_MIN((int64_t)PN_ROWS, r1 - r);
        const uint8_t *rows[PN_ROWS];
        for (int i = 0; i < PN_ROWS; i++) rows[i] = w + (size_t)(r + SD_MIN(i, nrows - 1)) * wrb;
        for (int64_t b = 0; b < nb; b++) pn_build_block(type, rows, b, P + (size_t)b * PN_ROWS * w_tsize(type));
        pn_all_tokens(type, nb, P, xq, xrb, n_tok, y + r, ldy, nrows, NULL);
    }
    free(P);
}

#define DEFINE_TYPE(name, TYPE)                                                                              \
    static void gemm_##name(int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1, const void *xq, \
                            size_t xrb, int64_t n_tok, float *y, int64_t ldy) {                              \
        if (xrb == pack_bytes(TYPE, n_in) && n_in / SD_QK <= PK_NB_MAX && ((uintptr_t)xq & 63) == 0)        \
            gemm_file_rows(TYPE, n_in / SD_QK, W, wrb, r0, r1, xq, xrb, n_tok, y, ldy);                       \
        else                                                                                                 \
            gemm_generic(TYPE, n_in, W, wrb, r0, r1, xq, xrb, n_tok, y, ldy);                                \
    }                                                                                                        \
    static float dot_##name(int64_t n, const void *w, const void *x) {                                       \
        float y;                                                                                             \
        tile(TYPE, 1, 1, n / SD_QK, w, 0, x, 0, &y, 1);                                                      \
        return y;                                                                                            \
    }                                                                                                        \
    static size_t pack_##name(const float *x, void *dst, int64_t n, int64_t t, int64_t n_tok, int64_t b0,   \
                              int64_t b1) {                                                                  \
        return pack_act(TYPE, x, dst, n, t, n_tok, b0, b1);                                                  \
    }
DEFINE_TYPE(q4_0, SD_TYPE_Q4_0)
DEFINE_TYPE(q4_1, SD_TYPE_Q4_1)
DEFINE_TYPE(q5_0, SD_TYPE_Q5_0)
DEFINE_TYPE(q5_1, SD_TYPE_Q5_1)
DEFINE_TYPE(q8_0, SD_TYPE_Q8_0)

// ---- repacked weights (SD_TYPE_*_R) --------------------------------------------

static int repack_legacy(int type, const void *src, void *dst, int64_t n_in, int64_t n_rows) {
    const int64_t nb = n_in / SD_QK, np = n_rows / PN_ROWS;
    if (n_in % SD_QK || nb > PK_NB_MAX) return -1;
    const size_t wrb = (size_t)nb * w_tsize(type), bb = PN_ROWS * w_tsize(type);
    for (int64_t p = 0; p < np; p++) {
        const uint8_t *rows[PN_ROWS];
        for (int i = 0; i < PN_ROWS; i++) rows[i] = (const uint8_t *)src + (size_t)(p * PN_ROWS + i) * wrb;
        uint8_t *o = (uint8_t *)dst + (size_t)p * PN_ROWS * wrb;
        for (int64_t b = 0; b < nb; b++) pn_build_block(type, rows, b, o + (size_t)b * bb);
    }
    memcpy((uint8_t *)dst + (size_t)np * PN_ROWS * wrb, (const uint8_t *)src + (size_t)np * PN_ROWS * wrb,
           (size_t)(n_rows - np * PN_ROWS) * wrb);
    return 0;
}

// Rows [r0, r1) of a repacked matrix: r0 is a multiple of 16 (sd_matmul hands
// out rows in chunks of 16), so whole panels up to the last multiple of 16
// and the file-layout rows after the panels (the matrix's last n_rows % 16).
AI void gemm_repacked(int type, int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1, const void *xq,
                      size_t xrb, int64_t n_tok, float *y, int64_t ldy) {
    const int64_t nb = n_in / SD_QK;
    const uint8_t *w = W;
    // the activations are always packed for a repacked type (sd_matmul uses its packer)
    SD_ASSERT(xrb == pack_bytes(type, n_in) && nb <= PK_NB_MAX && ((uintptr_t)xq & 63) == 0 && r0 % PN_ROWS == 0);
    const int64_t rp_end = r0 + (r1 - r0) / PN_ROWS * PN_ROWS;
    for (int64_t r = r0; r < rp_end; r += PN_ROWS) {
        const uint8_t *pf = r + PN_ROWS * PN_PF < rp_end ? w + (r + PN_ROWS * PN_PF) * wrb : NULL;
        pn_all_tokens(type, nb, w + r * wrb, xq, xrb, n_tok, y + r, ldy, PN_ROWS, pf);
    }
    if (rp_end < r1) gemm_file_rows(type, nb, w, wrb, rp_end, r1, xq, xrb, n_tok, y, ldy);
}

#define DEFINE_RP(name, TYPE)                                                                                 \
    static void gemm_rp_##name(int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1, const void *xq, \
                               size_t xrb, int64_t n_tok, float *y, int64_t ldy) {                              \
        gemm_repacked(TYPE, n_in, W, wrb, r0, r1, xq, xrb, n_tok, y, ldy);                                      \
    }                                                                                                           \
    static int repack_##name(const void *src, void *dst, int64_t n_in, int64_t n_rows) {                       \
        return repack_legacy(TYPE, src, dst, n_in, n_rows);                                                     \
    }
DEFINE_RP(q4_0, SD_TYPE_Q4_0)
DEFINE_RP(q4_1, SD_TYPE_Q4_1)
DEFINE_RP(q5_0, SD_TYPE_Q5_0)
DEFINE_RP(q5_1, SD_TYPE_Q5_1)
DEFINE_RP(q8_0, SD_TYPE_Q8_0)


// ---- float weights against float activations ---------------------------------

static float dot_f32(int64_t n, const void *wv, const void *xv) {
    const float *w = wv, *x = xv;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    for (; i < n; i++) s += w[i] * x[i];
    return s;
}

static float dot_f16(int64_t n, const void *wv, const void *xv) {
    const uint16_t *w = wv;
    const float *x = xv;
    __m512 a = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        a = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i))), _mm512_loadu_ps(x + i), a);
    float s = _mm512_reduce_add_ps(a);
    for (; i < n; i++) s += sd_fp16_to_fp32(w[i]) * x[i];
    return s;
}

static float dot_bf16(int64_t n, const void *wv, const void *xv) {
    const uint16_t *w = wv;
    const float *x = xv;
    __m512 a = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w + i)));
        a = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(h, 16)), _mm512_loadu_ps(x + i), a);
    }
    float s = _mm512_reduce_add_ps(a);
    for (; i < n; i++) s += sd_bf16_to_fp32(w[i]) * x[i];
    return s;
}

const char *sd_kernels_x86_init(sd_type_traits *traits, sd_from_float_fn act[SD_TYPE_COUNT],
                                sd_act_pack_fn pack[SD_TYPE_COUNT]) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512vnni"))
        return NULL;
#if SD_Q5_BITALG
    if (!__builtin_cpu_supports("avx512bitalg")) return NULL;
#endif
    traits[SD_TYPE_Q4_0].vec_dot = dot_q4_0;
    traits[SD_TYPE_Q4_0].gemm = gemm_q4_0;
    traits[SD_TYPE_Q4_1].vec_dot = dot_q4_1;
    traits[SD_TYPE_Q4_1].gemm = gemm_q4_1;
    traits[SD_TYPE_Q5_0].vec_dot = dot_q5_0;
    traits[SD_TYPE_Q5_0].gemm = gemm_q5_0;
    traits[SD_TYPE_Q5_1].vec_dot = dot_q5_1;
    traits[SD_TYPE_Q5_1].gemm = gemm_q5_1;
    traits[SD_TYPE_Q8_0].vec_dot = dot_q8_0;
    traits[SD_TYPE_Q8_0].gemm = gemm_q8_0;
    traits[SD_TYPE_F32].vec_dot = dot_f32;
    traits[SD_TYPE_F16].vec_dot = dot_f16;
    traits[SD_TYPE_BF16].vec_dot = dot_bf16;
    pack[SD_TYPE_Q4_0] = pack_q4_0;
    pack[SD_TYPE_Q4_1] = pack_q4_1;
    pack[SD_TYPE_Q5_0] = pack_q5_0;
    pack[SD_TYPE_Q5_1] = pack_q5_1;
    pack[SD_TYPE_Q8_0] = pack_q8_0;
    act[SD_TYPE_Q8_0] = q8_0_quantize;
    act[SD_TYPE_Q8_1] = q8_1_quantize;
#define SET_RP(name, RT)                 \
    traits[RT].gemm = gemm_rp_##name;    \
    traits[RT].repack = repack_##name;   \
    traits[RT].supported = 1;            \
    pack[RT] = pack_##name;
    SET_RP(q4_0, SD_TYPE_Q4_0_R)
    SET_RP(q4_1, SD_TYPE_Q4_1_R)
    SET_RP(q5_0, SD_TYPE_Q5_0_R)
    SET_RP(q5_1, SD_TYPE_Q5_1_R)
    SET_RP(q8_0, SD_TYPE_Q8_0_R)
#undef SET_RP
    return "avx512-vnni";
}

#else // no AVX-512 VNNI at build time: the scalar references stay in place

const char *sd_kernels_x86_init(sd_type_traits *traits, sd_from_float_fn act[SD_TYPE_COUNT],
                                sd_act_pack_fn pack[SD_TYPE_COUNT]) {
    (void)traits;
    (void)act;
    (void)pack;
    return NULL;
}

#endif
