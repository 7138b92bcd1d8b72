// kernels_x86.c - AVX-512 (F, BW, VL, VNNI) kernels of the legacy quants and
// the float types, selected by sd_quant_init through sd_kernels_x86_init
// (compiled in when the build targets AVX-512 VNNI, e.g. -march=native on this
// EPYC; also checked at run time with __builtin_cpu_supports). Without them
// the scalar references of quant.c stay in place (there is no AVX2 path yet).
// The references are the specification; tests/test_quant.c compares every
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
//  - packed (gemm on rows from sd_matmul, which converts activations with the
//    packers below; used for every batch size because it is the faster one
//    on weights streamed from memory): groups of 8 blocks in 4 zmm, 2 lanes
//    per block, so one int->float conversion, scale product and FMA serve 8
//    blocks; the weights of 2 rows are unpacked once into an L1-resident
//    buffer and reused for all tokens (tiles of 2 rows x 4 tokens).
// Either way each weight byte is read from memory once per sd_matmul call.
//
// Batch invariance (required by speculative verification): a (row, token)
// dot must give the same bits whatever n_tok, the token's place in a tile
// (T = 1..4), the tile height R or the thread's row range. Integer dots are
// exact; the float work per (row, token) is the same sequence in every tile
// shape: the accumulator gets the same FMAs in the same block-group order,
// and the final horizontal sum is always the reduce4 tree (a partial tile
// pads with zero vectors), never _mm512_reduce_add_ps for some T and
// reduce4 for others. sd_matmul always takes the packed path for these
// types (1-token calls included); the fused path (vec_dot, gemm on plain
// rows, rows of more than PK_NB_MAX blocks) is invariant in itself but does
// not give the packed path's bits.
//
// Repacked weights (SD_TYPE_*_R, see "repacked weights" below): models are
// rewritten at load so that a group's unpacking is two loads and four ops;
// one and two tokens then go straight from memory to registers, larger
// batches through the packed path above.
//
// Measured (this 2-vCPU Zen 5 EPYC): a single core's vpdpbusd peak is about
// one 512-bit instruction per cycle (2.3-2.6 G/s); on L2-resident 1536 x 576
// Q4_1 weights, 1 thread: 1 token 19 us, 2: 26 us, 4: 36 us, 8: 54 us (about
// 80% of that peak), 16: 88 us. Whole default model, 2 threads: 1 token
// 2.4-2.6 ms (1.25x its memory-bandwidth floor), 8 tokens 5.7 ms.
#include "quant.h"

#include <string.h>

// Activation packer of a weight type: writes the row for the tile kernel and
// returns its size in bytes (dst NULL: only the size). See "packed path".
typedef size_t (*sd_act_pack_fn)(const float *x, void *dst, int64_t n_in);
const char *sd_kernels_x86_init(sd_type_traits *traits, sd_from_float_fn act[SD_TYPE_COUNT],
                                sd_act_pack_fn pack[SD_TYPE_COUNT]);

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>

#include "common.h"

#define AI static inline __attribute__((always_inline))


// ---- per-type constants ---------------------------------------------------

AI size_t w_tsize(int type) {
    switch (type) {
    case SD_TYPE_Q4_0: return sizeof(sd_block_q4_0);
    case SD_TYPE_Q4_1: return sizeof(sd_block_q4_1);
    case SD_TYPE_Q5_0: return sizeof(sd_block_q5_0);
    case SD_TYPE_Q5_1: return sizeof(sd_block_q5_1);
    default: return sizeof(sd_block_q8_0);
    }
}
AI int w_has_min(int type) { return type == SD_TYPE_Q4_1 || type == SD_TYPE_Q5_1; }
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

// One block of 32 floats: scale d and the 32 rounded values as int32.
AI float quant_block(const float *x, __m512i *q0, __m512i *q1) {
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    __m512 vid = _mm512_set1_ps(id);
    *q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)); // round to nearest even
    *q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
    return d;
}

static void q8_0_quantize(const float *src, void *dst, int64_t n) {
    sd_block_q8_0 *y = dst;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        __m512i q0, q1;
        float d = quant_block(src + b * SD_QK, &q0, &q1);
        y[b].d = sd_fp32_to_fp16(d);
        _mm_storeu_si128((__m128i *)y[b].qs, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(y[b].qs + 16), _mm512_cvtepi32_epi8(q1));
    }
}

static void q8_1_quantize(const float *src, void *dst, int64_t n) {
    sd_block_q8_1 *y = dst;
    for (int64_t b = 0; b < n / SD_QK; b++) {
        __m512i q0, q1;
        float d = quant_block(src + b * SD_QK, &q0, &q1);
        int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        y[b].d = d;
        y[b].s = d * (float)sum;
        _mm_storeu_si128((__m128i *)y[b].qs, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(y[b].qs + 16), _mm512_cvtepi32_epi8(q1));
    }
}

// ---- packed path (sd_matmul, every batch size) ------------------------------
//
// Both operands are rearranged so that a group of 16 blocks fills 8 zmm with
// one 32-bit lane per block: vector z holds elements 4z..4z+3 of every block.
// Eight chained dpbusd then give each lane the integer dot of a whole block,
// and one int->float conversion, one scale product and one FMA per (row,
// token) pair cover 16 blocks (plus one FMA for the min of Q4_1 / Q5_1).
//
// The last group of a row may be partial (nt = nb % 16 blocks); it is laid
// out for G = 2, 4, 8 or 16 blocks (the smallest that holds nt) in G / 2
// vectors, L = 16 / G lanes per block: lane l of vector z holds elements
// (z L + l % L) * 4 .. + 3 of block l / L. G = 16 is the full layout above;
// G = 2 puts block 0 then block 1 in element order in one vector, G = 4 puts
// elements 16z..16z+15 of blocks 0..3 in vector z. Missing blocks are zero
// on the activation side.
//
// sd_matmul converts the activations with pack_act_* (below): each row is the
// standard Q8_0 / Q8_1 row, padded to 64 bytes, followed by a trailer
// (ng = ceil(nb / 16) groups):
//   qs  (ng, 8, 64) int8   the quant bytes in group layout (G / 2 vectors used)
//   dx  (ng, 16) float     d of the block of each lane
//   a0  (ng, 16) int32     offset types: -offset * (sum of the lane's bytes)
//   s   (ng, 16) float     Q8_1 types: s of block 16 g + i in lane i (0 past nb)
// gemm_* recognize such rows by x_row_bytes == pack_bytes(type, n_in) and
// otherwise take the fused path on plain rows. The weight side of a 2-row
// tile is unpacked once into the same layout on the stack (wpack) and reused
// for all tokens.
//
// Every (row, token) accumulator gets, group after group, acc = fma(float(isum),
// dw * dx, acc), then for types with a min acc = fma(m, s, acc) (m and s by
// block, lane i = block i of the group), and at the end the reduce4 tree.
// The one- and two-token kernels on repacked rows (rp_direct) do exactly the
// same, so every path gives the same bits.

#define PK_NB_MAX 512 // packed path for n_in <= 16384; larger rows use the fused path
#ifndef PK_PF
#define PK_PF 4 // batches: software prefetch of the weights of the row pair this far ahead
#endif
#define PK_R 2 // rows per packed tile; the pack lives on the stack (~45 KB per call)
#define PK_G 16 // blocks per full group

// Blocks G of the layout of group g of a row of nb blocks (see above).
AI int grp_blocks(int64_t nb, int64_t g) {
    int64_t nt = nb - g * PK_G;
    return nt >= PK_G ? PK_G : nt <= 2 ? 2 : nt <= 4 ? 4 : nt <= 8 ? 8 : PK_G;
}

AI size_t pk_align(size_t n) { return (n + 63) & ~(size_t)63; }
AI size_t pk_head(int type, int64_t nb) { return pk_align((size_t)nb * x_tsize(type)); }
AI size_t pack_bytes(int type, int64_t n_in) {
    int64_t nb = n_in / SD_QK, ng = (nb + PK_G - 1) / PK_G;
    size_t sz = pk_head(type, nb) + (size_t)ng * (512 + 64);
    if (w_offset(type)) sz += (size_t)ng * 64;
    if (w_has_min(type)) sz += (size_t)ng * 64;
    return sz;
}

// Quantizes one activation row into the standard blocks plus the trailer.
AI size_t pack_act(int type, const float *x, void *dst, int64_t n) {
    const int64_t nb = n / SD_QK, ng = (nb + PK_G - 1) / PK_G;
    if (!dst) return pack_bytes(type, n);
    uint8_t *head = dst;
    uint8_t *qs = head + pk_head(type, nb);
    float *dx = (float *)(qs + ng * 512);
    int32_t *a0 = (int32_t *)(dx + ng * 16);
    float *sd = w_offset(type) ? (float *)(a0 + ng * 16) : (float *)a0;
    _Alignas(64) int32_t q4[PK_G * 8]; // one group's quants, block-major (8 dwords per block)
    _Alignas(64) float dg[PK_G], sg[PK_G];
    for (int64_t g = 0; g < ng; g++) {
        const int64_t b0 = g * PK_G;
        const int nt = (int)SD_MIN(nb - b0, (int64_t)PK_G), G = grp_blocks(nb, g), L = PK_G / G;
        memset(q4, 0, sizeof q4);
        memset(dg, 0, sizeof dg);
        memset(sg, 0, sizeof sg);
        for (int i = 0; i < nt; i++) {
            const int64_t b = b0 + i;
            __m512i v0, v1;
            float d = quant_block(x + b * SD_QK, &v0, &v1);
            __m256i q = _mm256_set_m128i(_mm512_cvtepi32_epi8(v1), _mm512_cvtepi32_epi8(v0));
            _mm256_store_si256((__m256i *)(q4 + 8 * i), q);
            if (w_has_min(type)) {
                sd_block_q8_1 *y = (sd_block_q8_1 *)head + b;
                int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(v0, v1));
                y->d = d;
                y->s = d * (float)sum;
                _mm256_storeu_si256((__m256i *)y->qs, q);
                sg[i] = y->s;
                dg[i] = d;
            } else {
                sd_block_q8_0 *y = (sd_block_q8_0 *)head + b;
                y->d = sd_fp32_to_fp16(d);
                _mm256_storeu_si256((__m256i *)y->qs, q);
                dg[i] = sd_fp16_to_fp32(y->d);
            }
        }
        // lane l of vector z <- dword z L + l % L of block l / L
        const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        const __m512i blk = _mm512_srli_epi32(lane, __builtin_ctz((unsigned)L)); // l / L
        const __m512i sub = _mm512_and_si512(lane, _mm512_set1_epi32(L - 1));    // l % L
        const __m512i base = _mm512_add_epi32(_mm512_slli_epi32(blk, 3), sub);   // block * 8 + l % L
        __m512i c = _mm512_setzero_si512();
        const __m512i off = _mm512_set1_epi8((char)w_offset(type));
        for (int z = 0; z < 8; z++) {
            __m512i v = z < G / 2 ? _mm512_i32gather_epi32(_mm512_add_epi32(base, _mm512_set1_epi32(z * L)), q4, 4)
                                  : _mm512_setzero_si512();
            _mm512_store_si512(qs + g * 512 + z * 64, v);
            if (w_offset(type)) c = _mm512_dpbusd_epi32(c, off, v);
        }
        _mm512_store_ps(dx + g * 16, _mm512_permutexvar_ps(blk, _mm512_load_ps(dg)));
        if (w_offset(type)) _mm512_store_si512(a0 + g * 16, _mm512_sub_epi32(_mm512_setzero_si512(), c));
        if (w_has_min(type)) _mm512_store_ps(sd + g * 16, _mm512_load_ps(sg));
    }
    return pack_bytes(type, n);
}

// ---- weights in group layout --------------------------------------------------
//
// Repacked rows (SD_TYPE_*_R, rewritten once at load) keep each full group
// of 16 blocks in the form the kernels unpack with a few ops, in the same
// bytes as the file's row (nfull = nb / 16):
//   quants  (nfull, QB) bytes. Q4/Q5: 4 vectors, lane i of vector p = bytes
//           4p..4p+3 of block i's qs, so group vector p = low nibbles and
//           vector p + 4 = high nibbles (elements 4p.. and 16 + 4p..); Q5
//           then 8 x 64-bit masks of bit 4 (vector z, byte 4i + k <- qh bit
//           4z + k of block i); Q8_0: the 8 vectors, offset to unsigned
//   d       (nfull, 16) fp16, block order
//   m       (nfull, 16) fp16, block order (Q4_1, Q5_1)
//   tail    the nb % 16 last blocks, unchanged, at the same offset as in the file
// QB + 32 (+ 32) = 16 x block size for every type, so the sections fit exactly.

AI size_t rp_qb(int type) {
    return type == SD_TYPE_Q8_0 ? 512 : (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1) ? 320 : 256;
}
AI size_t w_qoff(int type) { // quant bytes inside a file block
    return type == SD_TYPE_Q4_0 ? 2 : type == SD_TYPE_Q4_1 ? 4 : type == SD_TYPE_Q5_0 ? 6 : type == SD_TYPE_Q5_1 ? 8 : 2;
}
AI size_t w_hoff(int type) { return type == SD_TYPE_Q5_0 ? 2 : 4; } // qh inside a Q5 block

// The repacked form of 16 file blocks (block i at base + i * stride): quants
// to q (rp_qb bytes), d (fp16, 32 bytes) to dh, m to mh (types with a min).
static void rp_build(int type, const uint8_t *base, size_t stride, uint8_t *q, uint8_t *dh, uint8_t *mh) {
    const size_t qo = w_qoff(type);
    for (int i = 0; i < PK_G; i++) {
        const uint8_t *blk = base + i * stride;
        memcpy(dh + 2 * i, blk, 2);
        if (w_has_min(type)) memcpy(mh + 2 * i, blk + 2, 2);
        if (type == SD_TYPE_Q8_0) {
            for (int z = 0; z < 8; z++)
                for (int k = 0; k < 4; k++) q[64 * z + 4 * i + k] = blk[qo + 4 * z + k] ^ 0x80;
        } else {
            for (int p = 0; p < 4; p++) memcpy(q + 64 * p + 4 * i, blk + qo + 4 * p, 4);
        }
    }
    if (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1)
        for (int z = 0; z < 8; z++) {
            uint64_t k = 0;
            for (int i = 0; i < PK_G; i++) k |= (uint64_t)((sd_ld32(base + i * stride + w_hoff(type)) >> (4 * z)) & 15) << (4 * i);
            memcpy(q + 256 + 8 * z, &k, 8);
        }
}

// The 8 unsigned group vectors from repacked quants q.
AI void rp_unpack(int type, const uint8_t *q, __m512i out[8]) {
    if (type == SD_TYPE_Q8_0) {
#pragma GCC unroll 8
        for (int z = 0; z < 8; z++) out[z] = _mm512_loadu_si512(q + 64 * z);
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
        for (int z = 0; z < 8; z++)
            out[z] = _mm512_mask_add_epi8(out[z], _cvtu64_mask64(sd_ld64(q + 256 + 8 * z)), out[z], h);
    }
}

AI __m512 ld_ph16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

// A partial group of 4 blocks (G = 4, L = 4): vector z = elements 16z..16z+15 of blocks 0..3.
AI void pack_group4(int type, const uint8_t *const blk[4], __m512i out[2], __m512 *dw) {
    __m128i hv = _mm_set_epi16(0, 0, 0, 0, (short)sd_ld16(blk[3]), (short)sd_ld16(blk[2]), (short)sd_ld16(blk[1]),
                               (short)sd_ld16(blk[0]));
    *dw = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                _mm512_castps128_ps512(_mm_cvtph_ps(hv)));
    size_t qo = type == SD_TYPE_Q4_0 ? 2 : type == SD_TYPE_Q4_1 ? 4 : type == SD_TYPE_Q5_0 ? 6 : type == SD_TYPE_Q5_1 ? 8 : 2;
#define LD128(p) _mm_loadu_si128((const __m128i *)(p))
#define GATHER4(o)                                                                                            \
    _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(LD128(blk[0] + (o))),    \
                                                             LD128(blk[1] + (o)), 1),                         \
                                          LD128(blk[2] + (o)), 2),                                            \
                       LD128(blk[3] + (o)), 3)
    if (type == SD_TYPE_Q8_0) {
        const __m512i bias = _mm512_set1_epi8((char)0x80);
        out[0] = _mm512_xor_si512(GATHER4(qo), bias);
        out[1] = _mm512_xor_si512(GATHER4(qo + 16), bias);
        return;
    }
    __m512i y = GATHER4(qo);
#undef GATHER4
#undef LD128
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    out[0] = _mm512_and_si512(y, m4);
    out[1] = _mm512_and_si512(_mm512_srli_epi16(y, 4), m4);
    if (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1) {
        size_t ho = type == SD_TYPE_Q5_0 ? 2 : 4;
        const __m512i h = _mm512_set1_epi8(0x10);
#if SD_Q5_BITALG
        // qwords 2i and 2i+1 hold qh of block i (zero-extended); mask bits
        // 16i..16i+15 of out[0] = qh bits 0-15, of out[1] = qh bits 16-31.
        __m512i q = _mm512_set_epi64((long long)sd_ld32(blk[3] + ho), (long long)sd_ld32(blk[3] + ho),
                                     (long long)sd_ld32(blk[2] + ho), (long long)sd_ld32(blk[2] + ho),
                                     (long long)sd_ld32(blk[1] + ho), (long long)sd_ld32(blk[1] + ho),
                                     (long long)sd_ld32(blk[0] + ho), (long long)sd_ld32(blk[0] + ho));
        const __m512i i0 = _mm512_set_epi64(0x0f0e0d0c0b0a0908LL, 0x0706050403020100LL, 0x0f0e0d0c0b0a0908LL,
                                            0x0706050403020100LL, 0x0f0e0d0c0b0a0908LL, 0x0706050403020100LL,
                                            0x0f0e0d0c0b0a0908LL, 0x0706050403020100LL);
        const __m512i i1 = _mm512_add_epi8(i0, _mm512_set1_epi8(16));
        out[0] = _mm512_mask_add_epi8(out[0], _mm512_bitshuffle_epi64_mask(q, i0), out[0], h);
        out[1] = _mm512_mask_add_epi8(out[1], _mm512_bitshuffle_epi64_mask(q, i1), out[1], h);
#else
        uint64_t k0 = 0, k1 = 0;
        for (int i = 0; i < 4; i++) {
            uint32_t qh = sd_ld32(blk[i] + ho);
            k0 |= (uint64_t)(qh & 0xffff) << (16 * i);
            k1 |= (uint64_t)(qh >> 16) << (16 * i);
        }
        out[0] = _mm512_or_si512(out[0], _mm512_maskz_mov_epi8(_cvtu64_mask64(k0), h));
        out[1] = _mm512_or_si512(out[1], _mm512_maskz_mov_epi8(_cvtu64_mask64(k1), h));
#endif
    }
}

// A partial group of 8 blocks (G = 8, L = 2): vector z = elements 8z..8z+7
// of blocks 0..7.
AI void pack_group8(int type, const uint8_t *const blk[8], __m512i out[4], __m512 *dw) {
    __m128i hv = _mm_set_epi16((short)sd_ld16(blk[7]), (short)sd_ld16(blk[6]), (short)sd_ld16(blk[5]),
                               (short)sd_ld16(blk[4]), (short)sd_ld16(blk[3]), (short)sd_ld16(blk[2]),
                               (short)sd_ld16(blk[1]), (short)sd_ld16(blk[0]));
    *dw = _mm512_permutexvar_ps(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0),
                                _mm512_castps256_ps512(_mm256_cvtph_ps(hv)));
    const size_t qo = w_qoff(type);
#define LD8(o) _mm512_set_epi64((long long)sd_ld64(blk[7] + (o)), (long long)sd_ld64(blk[6] + (o)),            \
                                (long long)sd_ld64(blk[5] + (o)), (long long)sd_ld64(blk[4] + (o)),            \
                                (long long)sd_ld64(blk[3] + (o)), (long long)sd_ld64(blk[2] + (o)),            \
                                (long long)sd_ld64(blk[1] + (o)), (long long)sd_ld64(blk[0] + (o)))
    if (type == SD_TYPE_Q8_0) {
        const __m512i bias = _mm512_set1_epi8((char)0x80);
        for (int z = 0; z < 4; z++) out[z] = _mm512_xor_si512(LD8(qo + 8 * z), bias);
        return;
    }
    __m512i a = LD8(qo), b = LD8(qo + 8);
#undef LD8
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    out[0] = _mm512_and_si512(a, m4);
    out[1] = _mm512_and_si512(b, m4);
    out[2] = _mm512_and_si512(_mm512_srli_epi16(a, 4), m4);
    out[3] = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
    if (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1) {
        const __m512i h = _mm512_set1_epi8(0x10);
        for (int z = 0; z < 4; z++) {
            uint64_t k = 0;
            for (int i = 0; i < 8; i++) k |= (uint64_t)((sd_ld32(blk[i] + w_hoff(type)) >> (8 * z)) & 0xff) << (8 * i);
            out[z] = _mm512_mask_add_epi8(out[z], _cvtu64_mask64(k), out[z], h);
        }
    }
}

// The last, partial group of a row of nb blocks (nb % 16 != 0), from its
// blocks in the file's layout at row + nfull * 16 * wts (repacked rows keep
// their tail there too): the G / 2 vectors, the lane scales, and m in block
// lanes (zero past nb). Missing blocks repeat the last one (their activations
// are zero).
AI void tail_group(int type, const uint8_t *row, int64_t nb, __m512i out[8], __m512 *dw, __m512 *mv) {
    const size_t wts = w_tsize(type);
    const int64_t b0 = nb / PK_G * PK_G;
    const int nt = (int)(nb - b0), G = grp_blocks(nb, nb / PK_G);
    const uint8_t *blk[PK_G];
    for (int i = 0; i < PK_G; i++) blk[i] = row + (size_t)(b0 + (i < nt ? i : nt - 1)) * wts;
    if (w_has_min(type)) {
        _Alignas(32) uint16_t mh[16] = {0};
        for (int i = 0; i < nt; i++) mh[i] = sd_ld16(blk[i] + 2);
        *mv = ld_ph16((const uint8_t *)mh);
    }
    if (G == 2) {
        wprep wp;
        prep_w(type, blk[0], blk[1], &wp);
        out[0] = wp.w;
        *dw = wp.dw;
    } else if (G == 4) {
        pack_group4(type, blk, out, dw);
    } else if (G == 8) {
        pack_group8(type, blk, out, dw);
    } else { // 9..15 blocks: the full layout, from a copy with the missing blocks repeated (rare)
        uint8_t tmp[PK_G * sizeof(sd_block_q8_0)], q[512], dh[32], mh[32];
        for (int i = 0; i < PK_G; i++) memcpy(tmp + i * wts, blk[i], wts);
        rp_build(type, tmp, wts, q, dh, mh);
        rp_unpack(type, q, out);
        *dw = ld_ph16(dh);
    }
}

// Repacked rows also keep a last group of exactly 2, 4 or 8 blocks (nt = G)
// in group form, in the tail's nt * block-size bytes (rp_tail_ok):
//   quants  Q4/Q5: 16 G bytes of nibbles; for NV = G / 2 >= 2, byte j of
//           packed vector p < NV / 2 = group vector p (low) and p + NV / 2
//           (high); for NV = 1, byte j = vector bytes j (low) and j + 32
//           (high). Q5 then NV x 64-bit masks of bit 4. Q8_0: the NV vectors.
//   d       G fp16, block order
//   m       G fp16, block order (Q4_1, Q5_1)
AI int rp_tail_ok(int64_t nb) {
    int nt = (int)(nb % PK_G);
    return nt == 2 || nt == 4 || nt == 8;
}
AI size_t rp_tail_qb(int type, int G) {
    return type == SD_TYPE_Q8_0 ? 32 * (size_t)G : (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1) ? 20 * (size_t)G : 16 * (size_t)G;
}

// The last group of a repacked row (rp_tail_ok(nb)), NV = G / 2 vectors.
AI void rp_tail_unpack(int type, int NV, const uint8_t *t, __m512i out[8], __m512 *dw, __m512 *mv) {
    const int G = 2 * NV, L = PK_G / G;
    const size_t qb = rp_tail_qb(type, G);
    if (type == SD_TYPE_Q8_0) {
        for (int z = 0; z < NV; z++) out[z] = _mm512_loadu_si512(t + 64 * z);
    } else {
        const __m512i m4 = _mm512_set1_epi8(0x0f);
        if (NV == 1) {
            __m256i y = _mm256_loadu_si256((const __m256i *)t);
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(y), _mm256_srli_epi16(y, 4), 1);
            out[0] = _mm512_and_si512(v, m4);
        } else {
            for (int p = 0; p < NV / 2; p++) {
                __m512i a = _mm512_loadu_si512(t + 64 * p);
                out[p] = _mm512_and_si512(a, m4);
                out[p + NV / 2] = _mm512_and_si512(_mm512_srli_epi16(a, 4), m4);
            }
        }
        if (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1) {
            const __m512i h = _mm512_set1_epi8(0x10);
            for (int z = 0; z < NV; z++)
                out[z] = _mm512_mask_add_epi8(out[z], _cvtu64_mask64(sd_ld64(t + 16 * G + 8 * z)), out[z], h);
        }
    }
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m128i dh = _mm_loadu_si128((const __m128i *)(t + qb)); // G <= 8 fp16
    *dw = _mm512_permutexvar_ps(_mm512_srli_epi32(lane, __builtin_ctz((unsigned)L)),
                                _mm512_castps256_ps512(_mm256_cvtph_ps(dh)));
    if (w_has_min(type)) {
        __m128i mh = _mm_loadu_si128((const __m128i *)(t + qb + 2 * G));
        *mv = _mm512_maskz_mov_ps((__mmask16)((1u << G) - 1), _mm512_castps256_ps512(_mm256_cvtph_ps(mh)));
    }
}

// Writes the repacked form of the last group of a file row (rp_tail_ok(nb)) to o.
static void rp_tail_build(int type, const uint8_t *row, int64_t nb, uint8_t *o) {
    const size_t wts = w_tsize(type);
    const int G = (int)(nb % PK_G), NV = G / 2;
    const uint8_t *tb = row + (size_t)(nb - G) * wts;
    __m512i v[8];
    __m512 dw, mv;
    tail_group(type, row, nb, v, &dw, &mv);
    _Alignas(64) uint8_t u[8][64] = {{0}};
    for (int z = 0; z < NV; z++) _mm512_store_si512(u[z], v[z]);
    if (type == SD_TYPE_Q8_0) {
        memcpy(o, u, (size_t)NV * 64);
    } else {
        if (NV == 1)
            for (int j = 0; j < 32; j++) o[j] = (uint8_t)((u[0][j] & 15) | (u[0][j + 32] & 15) << 4);
        else
            for (int p = 0; p < NV / 2; p++)
                for (int j = 0; j < 64; j++) o[64 * p + j] = (uint8_t)((u[p][j] & 15) | (u[p + NV / 2][j] & 15) << 4);
        if (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1)
            for (int z = 0; z < NV; z++) {
                uint64_t k = 0;
                for (int j = 0; j < 64; j++) k |= (uint64_t)((u[z][j] >> 4) & 1) << j;
                memcpy(o + 16 * G + 8 * z, &k, 8);
            }
    }
    const size_t qb = rp_tail_qb(type, G);
    for (int i = 0; i < G; i++) {
        memcpy(o + qb + 2 * i, tb + i * wts, 2);
        if (w_has_min(type)) memcpy(o + qb + 2 * G + 2 * i, tb + i * wts + 2, 2);
    }
}

// The last group of a row: repacked form (rp and rp_tail_ok), else from the file's blocks.
AI void row_tail(int type, int rp, int NV, const uint8_t *row, int64_t nb, __m512i out[8], __m512 *dw, __m512 *mv) {
    if (rp && rp_tail_ok(nb)) rp_tail_unpack(type, NV, row + (size_t)(nb / PK_G * PK_G) * w_tsize(type), out, dw, mv);
    else tail_group(type, row, nb, out, dw, mv);
}

// (+1: rows not a multiple of 4 KB apart, which would alias in the store buffer)
typedef struct {
    __m512i w[PK_R][PK_NB_MAX / PK_G + 1][8]; // unsigned weight bytes, group layout
    __m512 d[PK_R][PK_NB_MAX / PK_G + 1];     // d of the block of each lane
    __m512 m[PK_R][PK_NB_MAX / PK_G + 1];     // m by block (types with a min)
} wpack;

// R rows into the pack; rp: the rows are repacked (SD_TYPE_*_R), else the file's layout.
AI void pack_rows(int type, int rp, int R, int64_t nb, const uint8_t *w, size_t wrb, wpack *pk) {
    const int64_t nfull = nb / PK_G;
    const size_t qb = rp_qb(type), wts = w_tsize(type);
    for (int r = 0; r < R; r++) {
        const uint8_t *row = w + r * wrb;
        for (int64_t g = 0; g < nfull; g++) {
            if (rp) {
                rp_unpack(type, row + g * qb, pk->w[r][g]);
                pk->d[r][g] = ld_ph16(row + nfull * qb + g * 32);
                if (w_has_min(type)) pk->m[r][g] = ld_ph16(row + nfull * (qb + 32) + g * 32);
            } else {
                uint8_t q[512], dh[32], mh[32];
                rp_build(type, row + g * PK_G * wts, wts, q, dh, mh);
                rp_unpack(type, q, pk->w[r][g]);
                pk->d[r][g] = ld_ph16(dh);
                if (w_has_min(type)) pk->m[r][g] = ld_ph16(mh);
            }
        }
        if (nb % PK_G) {
            const int nv = grp_blocks(nb, nfull) / 2;
            if (rp && rp_tail_ok(nb)) { // NV a constant for each call
                if (nv == 1) row_tail(type, 1, 1, row, nb, pk->w[r][nfull], &pk->d[r][nfull], &pk->m[r][nfull]);
                else if (nv == 2) row_tail(type, 1, 2, row, nb, pk->w[r][nfull], &pk->d[r][nfull], &pk->m[r][nfull]);
                else row_tail(type, 1, 4, row, nb, pk->w[r][nfull], &pk->d[r][nfull], &pk->m[r][nfull]);
            } else {
                tail_group(type, row, nb, pk->w[r][nfull], &pk->d[r][nfull], &pk->m[r][nfull]);
            }
        }
    }
}

// Sums of the lanes of a[0..3]: result lane i = sum of a[i].
AI __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    __m512 b0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1)); // a0 a1 a0 a1 per 128
    __m512 b1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3)); // a2 a3 a2 a3
    __m512 c = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(b0), _mm512_castps_pd(b1))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(b0), _mm512_castps_pd(b1))));
    __m256 d = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    return _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
}

// v, kept in a register: the compiler would otherwise fold the load into
// every dpbusd that uses it.
AI __m512i in_reg(__m512i v) {
    __asm__("" : "+v"(v));
    return v;
}

// Offsets of the trailer sections in a packed activation row.
typedef struct {
    size_t q, d, a, s;
} xoffs;
AI xoffs x_offsets(int type, int64_t nb) {
    const int64_t ng = (nb + PK_G - 1) / PK_G;
    xoffs o;
    o.q = pk_head(type, nb);
    o.d = o.q + (size_t)ng * 512;
    o.a = o.d + (size_t)ng * 64;
    o.s = w_offset(type) ? o.a + (size_t)ng * 64 : o.a;
    return o;
}

// The float step of one group for one (row, token) accumulator: the same in every kernel.
AI __m512 grp_acc(int type, __m512 acc, __m512i isum, __m512 dw, __m512 dx, __m512 m, __m512 s) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), acc);
    if (w_has_min(type)) acc = _mm512_fmadd_ps(m, s, acc);
    return acc;
}

// One group (NV vectors) of the R x T tile from the pack.
AI void tile_group(int type, int R, int T, int NV, const wpack *pk, int64_t g, const uint8_t *x, size_t xrb,
                   xoffs o, __m512 acc[PK_R][4]) {
    __m512i is[PK_R][4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        __m512i a0 = w_offset(type) ? _mm512_load_si512(x + t * xrb + o.a + g * 64) : _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) is[r][t] = a0;
    }
#pragma GCC unroll 8
    for (int z = 0; z < NV; z++) {
        __m512i wv[PK_R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = pk->w[r][g][z];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512i xv = in_reg(_mm512_load_si512(x + t * xrb + o.q + g * 512 + 64 * z));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) is[r][t] = _mm512_dpbusd_epi32(is[r][t], wv[r], xv);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        __m512 dx = _mm512_load_ps(x + t * xrb + o.d + g * 64);
        __m512 s = w_has_min(type) ? _mm512_load_ps(x + t * xrb + o.s + g * 64) : dx;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r][t] = grp_acc(type, acc[r][t], is[r][t], pk->d[r][g], dx, pk->m[r][g], s);
    }
}

// Batch invariance: every token's accumulator is reduced by the same reduce4
// tree (lane t of its result depends on acc[.][t] only, with the same order
// of additions for every t), whatever T is; missing tokens are zero vectors
// whose sums are discarded.
AI void store_tile(int R, int T, __m512 acc[][4], float *y, int64_t ldy) {
    const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float v[4];
        _mm_storeu_ps(v, reduce4(acc[r][0], T > 1 ? acc[r][1] : z, T > 2 ? acc[r][2] : z, T > 3 ? acc[r][3] : z));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) y[t * ldy + r] = v[t];
    }
}

AI void tile_packed(int type, int R, int T, int64_t nb, const wpack *pk, const uint8_t *x, size_t xrb, float *y,
                    int64_t ldy) {
    const int64_t nfull = nb / PK_G;
    const xoffs o = x_offsets(type, nb);
    __m512 acc[PK_R][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < nfull; g++) tile_group(type, R, T, 8, pk, g, x, xrb, o, acc);
    if (nb % PK_G) switch (grp_blocks(nb, nfull)) {
        case 2: tile_group(type, R, T, 1, pk, nfull, x, xrb, o, acc); break;
        case 4: tile_group(type, R, T, 2, pk, nfull, x, xrb, o, acc); break;
        case 8: tile_group(type, R, T, 4, pk, nfull, x, xrb, o, acc); break;
        default: tile_group(type, R, T, 8, pk, nfull, x, xrb, o, acc); break;
        }
    store_tile(R, T, acc, y, ldy);
}

AI void packed_all_tokens(int type, int R, int64_t nb, const wpack *pk, const uint8_t *x, size_t xrb,
                          int64_t n_tok, float *y, int64_t ldy) {
    int64_t t = 0;
    for (; t + 4 <= n_tok; t += 4) tile_packed(type, R, 4, nb, pk, x + t * xrb, xrb, y + t * ldy, ldy);
    switch (n_tok - t) {
    case 3: tile_packed(type, R, 3, nb, pk, x + t * xrb, xrb, y + t * ldy, ldy); break;
    case 2: tile_packed(type, R, 2, nb, pk, x + t * xrb, xrb, y + t * ldy, ldy); break;
    case 1: tile_packed(type, R, 1, nb, pk, x + t * xrb, xrb, y + t * ldy, ldy); break;
    default: break;
    }
}

// Software prefetch of n bytes from p into L1.
AI void prefetch_bytes(const uint8_t *p, size_t n) {
    for (size_t o = 0; o < n; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
}

// Rows [r0, r1), all tokens, through the L1 pack of each row pair; rp: the
// rows are in the repacked layout (SD_TYPE_*_R) rather than the file's.
AI void gemm_packed(int type, int rp, int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1,
                    const void *xq, size_t xrb, int64_t n_tok, float *y, int64_t ldy) {
    const int64_t nb = n_in / SD_QK;
    const uint8_t *w = W;
    _Alignas(64) wpack pk;
    int64_t r = r0;
    for (; r + PK_R <= r1; r += PK_R) {
        if (n_tok > 1 && r + PK_R * (PK_PF + 1) <= r1) // the rows PK_PF pairs ahead
            prefetch_bytes(w + (r + PK_R * PK_PF) * wrb, PK_R * wrb);
        pack_rows(type, rp, PK_R, nb, w + r * wrb, wrb, &pk);
        packed_all_tokens(type, PK_R, nb, &pk, xq, xrb, n_tok, y + r, ldy);
    }
    for (; r < r1; r++) {
        pack_rows(type, rp, 1, nb, w + r * wrb, wrb, &pk);
        packed_all_tokens(type, 1, nb, &pk, xq, xrb, n_tok, y + r, ldy);
    }
}

#define DEFINE_TYPE(name, TYPE)                                                                              \
    static void gemm_##name(int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1, const void *xq, \
                            size_t xrb, int64_t n_tok, float *y, int64_t ldy) {                              \
        if (xrb == pack_bytes(TYPE, n_in) && n_in / SD_QK <= PK_NB_MAX && ((uintptr_t)xq & 63) == 0 &&      \
            xrb % 64 == 0)                                                                                   \
            gemm_packed(TYPE, 0, n_in, W, wrb, r0, r1, xq, xrb, n_tok, y, ldy);                                 \
        else                                                                                                 \
            gemm_generic(TYPE, n_in, W, wrb, r0, r1, xq, xrb, n_tok, y, ldy);                                \
    }                                                                                                        \
    static float dot_##name(int64_t n, const void *w, const void *x) {                                       \
        float y;                                                                                             \
        tile(TYPE, 1, 1, n / SD_QK, w, 0, x, 0, &y, 1);                                                      \
        return y;                                                                                            \
    }                                                                                                        \
    static size_t pack_##name(const float *x, void *dst, int64_t n) { return pack_act(TYPE, x, dst, n); }
DEFINE_TYPE(q4_0, SD_TYPE_Q4_0)
DEFINE_TYPE(q4_1, SD_TYPE_Q4_1)
DEFINE_TYPE(q5_0, SD_TYPE_Q5_0)
DEFINE_TYPE(q5_1, SD_TYPE_Q5_1)
DEFINE_TYPE(q8_0, SD_TYPE_Q8_0)

// ---- repacked weights (SD_TYPE_*_R) --------------------------------------------

static int repack_legacy(int type, const void *src, void *dst, int64_t n_in, int64_t n_rows) {
    const int64_t nb = n_in / SD_QK, nfull = nb / PK_G;
    if (n_in % SD_QK || nb > PK_NB_MAX) return -1;
    const size_t wts = w_tsize(type), rb = (size_t)nb * wts, qb = rp_qb(type);
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *row = (const uint8_t *)src + r * rb;
        uint8_t *o = (uint8_t *)dst + r * rb;
        for (int64_t g = 0; g < nfull; g++)
            rp_build(type, row + (size_t)g * PK_G * wts, wts, o + g * qb, o + nfull * qb + g * 32,
                     o + nfull * (qb + 32) + g * 32);
        if (rp_tail_ok(nb)) rp_tail_build(type, row, nb, o + nfull * PK_G * wts);
        else memcpy(o + nfull * PK_G * wts, row + nfull * PK_G * wts, (size_t)(nb - nfull * PK_G) * wts);
    }
    return 0;
}

// One or two tokens (T), R <= RP_R rows: the weights go straight from memory
// into registers (no pack buffer); each accumulator gets the operations of
// tile_packed. The eight dpbusd of a group run as two chains added at the
// end (integer sums: any order gives the same bits).
#define RP_R 4
#define RP_PF 16 // rows of software prefetch ahead

// Group g (NV vectors; full: repacked, else the tail in the file's layout).
AI void rp_direct_group(int type, int R, int T, int NV, int full, int64_t nb, const uint8_t *w, size_t wrb,
                        const uint8_t *x, size_t xrb, xoffs o, int64_t g, __m512 acc[][4]) {
    const int64_t nfull = nb / PK_G;
    const size_t qb = rp_qb(type);
    __m512i xv[8], a0[2];
    __m512 dx[2], s[2];
#pragma GCC unroll 2
    for (int t = 0; t < T; t++) {
        const uint8_t *xt = x + t * xrb;
        a0[t] = w_offset(type) ? _mm512_load_si512(xt + o.a + g * 64) : _mm512_setzero_si512();
        dx[t] = _mm512_load_ps(xt + o.d + g * 64);
        s[t] = w_has_min(type) ? _mm512_load_ps(xt + o.s + g * 64) : dx[t];
    }
    if (T == 1) // one token: its 8 vectors stay in registers for all rows
#pragma GCC unroll 8
        for (int z = 0; z < NV; z++) xv[z] = in_reg(_mm512_load_si512(x + o.q + g * 512 + 64 * z));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const uint8_t *row = w + r * wrb;
        __m512i wv[8];
        __m512 dw, mv = _mm512_setzero_ps();
        if (full) {
            rp_unpack(type, row + g * qb, wv);
            dw = ld_ph16(row + nfull * qb + g * 32);
            if (w_has_min(type)) mv = ld_ph16(row + nfull * (qb + 32) + g * 32);
        } else {
            row_tail(type, 1, NV, row, nb, wv, &dw, &mv);
        }
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) {
            const uint8_t *xq = x + t * xrb + o.q + g * 512;
            __m512i c0 = a0[t], c1 = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int z = 0; z < NV; z++) {
                __m512i xz = T == 1 ? xv[z] : _mm512_load_si512(xq + 64 * z);
                if (z % 2 == 0) c0 = _mm512_dpbusd_epi32(c0, wv[z], xz);
                else c1 = _mm512_dpbusd_epi32(c1, wv[z], xz);
            }
            acc[r][t] = grp_acc(type, acc[r][t], _mm512_add_epi32(c0, c1), dw, dx[t], mv, s[t]);
        }
    }
}

AI void rp_direct(int type, int R, int T, int64_t nb, const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb,
                  float *y, int64_t ldy) {
    const int64_t nfull = nb / PK_G;
    const xoffs o = x_offsets(type, nb);
    __m512 acc[RP_R][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < nfull; g++) rp_direct_group(type, R, T, 8, 1, nb, w, wrb, x, xrb, o, g, acc);
    if (nb % PK_G) switch (grp_blocks(nb, nfull)) {
        case 2: rp_direct_group(type, R, T, 1, 0, nb, w, wrb, x, xrb, o, nfull, acc); break;
        case 4: rp_direct_group(type, R, T, 2, 0, nb, w, wrb, x, xrb, o, nfull, acc); break;
        case 8: rp_direct_group(type, R, T, 4, 0, nb, w, wrb, x, xrb, o, nfull, acc); break;
        default: rp_direct_group(type, R, T, 8, 0, nb, w, wrb, x, xrb, o, nfull, acc); break;
        }
    store_tile(R, T, acc, y, ldy);
}

AI void gemm_repacked(int type, int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1, const void *xq,
                      size_t xrb, int64_t n_tok, float *y, int64_t ldy) {
    const int64_t nb = n_in / SD_QK;
    const uint8_t *w = W;
    // the activations are always packed for a repacked type (sd_matmul uses its packer)
    SD_ASSERT(xrb == pack_bytes(type, n_in) && nb <= PK_NB_MAX && ((uintptr_t)xq & 63) == 0 && xrb % 64 == 0);
    if (n_tok > 2) {
        gemm_packed(type, 1, n_in, W, wrb, r0, r1, xq, xrb, n_tok, y, ldy);
        return;
    }
    // One or two tokens: 4 rows per tile and a software prefetch 16 rows
    // ahead (the hardware prefetcher lags on weights streamed from memory).
    int64_t r = r0;
    for (; r + RP_R <= r1; r += RP_R) {
        if (r + RP_R + RP_PF <= r1) prefetch_bytes(w + (r + RP_PF) * wrb, RP_R * wrb);
        if (n_tok == 1) rp_direct(type, RP_R, 1, nb, w + r * wrb, wrb, xq, xrb, y + r, ldy);
        else rp_direct(type, RP_R, 2, nb, w + r * wrb, wrb, xq, xrb, y + r, ldy);
    }
    for (; r < r1; r++) {
        if (n_tok == 1) rp_direct(type, 1, 1, nb, w + r * wrb, wrb, xq, xrb, y + r, ldy);
        else rp_direct(type, 1, 2, nb, w + r * wrb, wrb, xq, xrb, y + r, ldy);
    }
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
