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
// Both operands are rearranged so that a group of 8 blocks fills 4 zmm with
// 2 lanes (8 bytes) per block: vector z holds elements 8z..8z+7 of each block,
// the blocks in slot order SIGMA = 0,4,1,5,2,6,3,7 (what unpacking two
// 4-block loads of nibbles gives for free). Four chained dpbusd then sum a
// whole group per lane pair, and one int->float conversion, one scale product
// and one FMA per (row, token) pair cover 8 blocks.
//
// sd_matmul converts the activations with pack_act_* (below): each row is the
// standard Q8_0 / Q8_1 row, padded to 64 bytes, followed by a trailer
// (ng = ceil(nb / 8) groups, nb16 = ceil(nb / 16)):
//   qs  (ng, 4, 64) int8   the quant bytes in group layout
//   dx  (ng, 16) float     d of the block of each lane
//   a0  (ng, 16) int32     offset types: -offset * (sum of the lane's 16 bytes)
//   s   (nb16, 16) float   Q8_1 types: s of every block, natural order
// The last, partial group of nt = nb % 8 blocks uses fewer vectors when it
// can (tail_nv): nt <= 2: one vector holding the blocks in element order,
// lanes 0-7 / 8-15 (like the fused path); nt <= 4: two vectors, vector z
// holding elements 16z..16z+15 of blocks 0..3 (4 lanes per block); else the
// full layout. Blocks past nb are zero everywhere. gemm_* recognize such rows by
// x_row_bytes == pack_bytes(type, n_in) and otherwise take the fused path on
// plain rows. The weight side of a 2-row tile is unpacked once into the same
// layout on the stack and reused for all tokens.

#define PK_NB_MAX 512 // packed path for n_in <= 16384; larger rows use the fused path
#ifndef PK_PF
#define PK_PF 4 // batches: software prefetch of the weights of the row pair this far ahead
#endif
#define PK_R 2        // rows per packed tile (3 and 4 measured no better); the pack lives on
                      // the stack (~45 KB per call: fine for default 8 MB thread stacks)

static const int SIGMA[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// Vectors used by the last group of a row of nb blocks (4 if it is full).
AI int tail_nv(int64_t nb) {
    int nt = (int)(nb % 8);
    return nt == 0 ? 4 : nt <= 2 ? 1 : nt <= 4 ? 2 : 4;
}

AI size_t pk_align(size_t n) { return (n + 63) & ~(size_t)63; }
AI size_t pk_head(int type, int64_t nb) { return pk_align((size_t)nb * x_tsize(type)); }
AI size_t pack_bytes(int type, int64_t n_in) {
    int64_t nb = n_in / SD_QK, ng = (nb + 7) / 8, nb16 = (nb + 15) / 16;
    size_t sz = pk_head(type, nb) + (size_t)ng * (256 + 64);
    if (w_offset(type)) sz += (size_t)ng * 64;
    if (w_has_min(type)) sz += (size_t)nb16 * 64;
    return sz;
}

// Quantizes one activation row into the standard blocks plus the trailer.
AI size_t pack_act(int type, const float *x, void *dst, int64_t n) {
    const int64_t nb = n / SD_QK, ng = (nb + 7) / 8, nb16 = (nb + 15) / 16;
    if (!dst) return pack_bytes(type, n);
    uint8_t *head = dst;
    uint8_t *qs = head + pk_head(type, nb);
    float *dx = (float *)(qs + ng * 256);
    int32_t *a0 = (int32_t *)(dx + ng * 16);
    float *sd = w_offset(type) ? (float *)(a0 + ng * 16) : (float *)a0;
    memset(qs, 0, (size_t)ng * 256);
    memset(dx, 0, (size_t)ng * 64);
    for (int64_t b = 0; b < nb; b++) {
        __m512i q0, q1;
        float d = quant_block(x + b * SD_QK, &q0, &q1);
        uint8_t q[32];
        _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(q1));
        float dval;
        if (w_has_min(type)) {
            sd_block_q8_1 *y = (sd_block_q8_1 *)head + b;
            int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            y->d = d;
            y->s = d * (float)sum;
            memcpy(y->qs, q, 32);
            sd[b] = y->s;
            dval = d;
        } else {
            sd_block_q8_0 *y = (sd_block_q8_0 *)head + b;
            y->d = sd_fp32_to_fp16(d);
            memcpy(y->qs, q, 32);
            dval = sd_fp16_to_fp32(y->d);
        }
        int64_t g = b / 8;
        int i = (int)(b % 8), nv = g < nb / 8 ? 4 : tail_nv(nb);
        uint8_t *qg = qs + g * 256;
        float *dg = dx + g * 16;
        if (nv == 1) {
            memcpy(qg + i * 32, q, 32);
            for (int l = 0; l < 8; l++) dg[i * 8 + l] = dval;
        } else if (nv == 2) {
            memcpy(qg + i * 16, q, 16);
            memcpy(qg + 64 + i * 16, q + 16, 16);
            for (int l = 0; l < 4; l++) dg[i * 4 + l] = dval;
        } else {
            int slot = 0;
            while (SIGMA[slot] != i) slot++;
            for (int z = 0; z < 4; z++) memcpy(qg + z * 64 + slot * 8, q + z * 8, 8);
            dg[2 * slot] = dg[2 * slot + 1] = dval;
        }
    }
    if (w_offset(type))
        for (int64_t g = 0; g < ng; g++) {
            const __m512i off = _mm512_set1_epi8((char)w_offset(type));
            __m512i c = _mm512_setzero_si512();
            for (int z = 0; z < 4; z++) c = _mm512_dpbusd_epi32(c, off, _mm512_loadu_si512(qs + g * 256 + z * 64));
            _mm512_storeu_si512(a0 + g * 16, _mm512_sub_epi32(_mm512_setzero_si512(), c));
        }
    if (w_has_min(type))
        for (int64_t b = nb; b < nb16 * 16; b++) sd[b] = 0;
    return pack_bytes(type, n);
}

// (+1: rows not a multiple of 4 KB apart, which would alias in the store buffer)
typedef struct {
    __m512i w[PK_R][PK_NB_MAX / 8 + 1][4]; // unsigned weight bytes, group layout
    __m512 d[PK_R][PK_NB_MAX / 8 + 1];     // d of the block of each lane
    __m512 m[PK_R][PK_NB_MAX / 16 + 1];    // dense m, natural order (types with a min)
} wpack;

// Q5 high bits with AVX512-BITALG (vpshufbitqmb builds a 64-bit byte mask
// from the qh of 8 blocks in one instruction); otherwise the mask is built
// with scalar shifts (q5_group_high).
#ifdef __AVX512BITALG__
#define SD_Q5_BITALG 1
#else
#define SD_Q5_BITALG 0
#endif

// Q5 bit 4 of group vector z: slot s gets bits 8z..8z+7 of its block's qh.
#if !SD_Q5_BITALG
AI __m512i q5_group_high(const uint32_t qh[8], int z) {
    uint64_t k = 0;
    for (int s = 0; s < 8; s++) k |= (uint64_t)((qh[SIGMA[s]] >> (8 * z)) & 0xff) << (8 * s);
    return _mm512_maskz_mov_epi8(_cvtu64_mask64(k), _mm512_set1_epi8(0x10));
}
#endif

// One group of 8 blocks (pointers blk[i] to block i; repeated blocks past the
// end of the row are harmless: their activations are zero).
// Also writes the m of the 8 blocks (natural order) to mout for types with a min.
// Block i is at base + i * stride (stride 0 repeats one block).
AI void pack_group(int type, const uint8_t *base, size_t stride, __m512i out[4], __m512 *dw, float *mout) {
    const uint8_t *blk[8];
    for (int i = 0; i < 8; i++) blk[i] = base + i * stride;
    // The first 4 bytes of every block (d and m, or d and 2 bytes of data), slot order.
#if SD_Q5_BITALG
    // Q5: the first 8 bytes of every block (qh inside), slot order; hv from them.
    __m512i h8 = _mm512_setzero_si512();
    if (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1)
        h8 = _mm512_set_epi64((long long)sd_ld64(blk[7]), (long long)sd_ld64(blk[3]), (long long)sd_ld64(blk[6]),
                              (long long)sd_ld64(blk[2]), (long long)sd_ld64(blk[5]), (long long)sd_ld64(blk[1]),
                              (long long)sd_ld64(blk[4]), (long long)sd_ld64(blk[0]));
    __m256i hv = type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1
                     ? _mm512_cvtepi64_epi32(h8)
                     : _mm256_set_epi32((int)sd_ld32(blk[7]), (int)sd_ld32(blk[3]), (int)sd_ld32(blk[6]), (int)sd_ld32(blk[2]),
                                        (int)sd_ld32(blk[5]), (int)sd_ld32(blk[1]), (int)sd_ld32(blk[4]), (int)sd_ld32(blk[0]));
#else
    __m256i hv = _mm256_set_epi32((int)sd_ld32(blk[7]), (int)sd_ld32(blk[3]), (int)sd_ld32(blk[6]), (int)sd_ld32(blk[2]),
                                  (int)sd_ld32(blk[5]), (int)sd_ld32(blk[1]), (int)sd_ld32(blk[4]), (int)sd_ld32(blk[0]));
#endif
    __m512 dm = _mm512_cvtph_ps(hv); // d, m of slot 0, d, m of slot 1, ...
    *dw = _mm512_permutexvar_ps(_mm512_set_epi32(14, 14, 12, 12, 10, 10, 8, 8, 6, 6, 4, 4, 2, 2, 0, 0), dm);
    if (w_has_min(type)) // block b sits in slot SIGMA^-1(b) = 0,2,4,6,1,3,5,7; its m at 2 * slot + 1
        _mm256_storeu_ps(mout, _mm512_castps512_ps256(_mm512_permutexvar_ps(
                                   _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 15, 11, 7, 3, 13, 9, 5, 1), dm)));
    if (type == SD_TYPE_Q8_0) {
        __m512i v[4]; // v[i] = blocks (i, i + 4), 32 bytes each
        for (int i = 0; i < 4; i++)
            v[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk[i] + 2))),
                                      _mm256_loadu_si256((const __m256i *)(blk[i + 4] + 2)), 1);
        const __m512i i01 = _mm512_set_epi64(13, 9, 5, 1, 12, 8, 4, 0);
        const __m512i i23 = _mm512_set_epi64(15, 11, 7, 3, 14, 10, 6, 2);
        __m512i ab01 = _mm512_permutex2var_epi64(v[0], i01, v[1]), cd01 = _mm512_permutex2var_epi64(v[2], i01, v[3]);
        __m512i ab23 = _mm512_permutex2var_epi64(v[0], i23, v[1]), cd23 = _mm512_permutex2var_epi64(v[2], i23, v[3]);
        const __m512i bias = _mm512_set1_epi8((char)0x80);
        out[0] = _mm512_xor_si512(_mm512_shuffle_i64x2(ab01, cd01, 0x44), bias);
        out[1] = _mm512_xor_si512(_mm512_shuffle_i64x2(ab01, cd01, 0xee), bias);
        out[2] = _mm512_xor_si512(_mm512_shuffle_i64x2(ab23, cd23, 0x44), bias);
        out[3] = _mm512_xor_si512(_mm512_shuffle_i64x2(ab23, cd23, 0xee), bias);
        return;
    }
    size_t qo = type == SD_TYPE_Q4_0 ? 2 : type == SD_TYPE_Q4_1 ? 4 : type == SD_TYPE_Q5_0 ? 6 : 8;
#define LD128(i) _mm_loadu_si128((const __m128i *)(blk[i] + qo))
    __m512i y0 = _mm512_castsi128_si512(LD128(0)), y1 = _mm512_castsi128_si512(LD128(4));
    y0 = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(y0, LD128(1), 1), LD128(2), 2), LD128(3), 3);
    y1 = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(y1, LD128(5), 1), LD128(6), 2), LD128(7), 3);
#undef LD128
    __m512i a = _mm512_unpacklo_epi64(y0, y1), b = _mm512_unpackhi_epi64(y0, y1); // qs 0-7, qs 8-15
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    out[0] = _mm512_and_si512(a, m4);
    out[1] = _mm512_and_si512(b, m4);
    out[2] = _mm512_and_si512(_mm512_srli_epi16(a, 4), m4);
    out[3] = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
    if (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1) {
        size_t ho = type == SD_TYPE_Q5_0 ? 2 : 4;
#if SD_Q5_BITALG
        // qword s of h8 holds slot s's block bytes 0-7, qh at bit 8*ho; mask
        // bit 8s+j of vector z = qh bit 8z+j (vpshufbitqmb), then a masked
        // add of 0x10 (= OR: the nibbles are < 16).
        const __m512i h = _mm512_set1_epi8(0x10);
        for (int z = 0; z < 4; z++) {
            const __m512i idx = _mm512_add_epi8(_mm512_set1_epi64(0x0706050403020100LL),
                                                _mm512_set1_epi8((char)(8 * ho + 8 * z)));
            out[z] = _mm512_mask_add_epi8(out[z], _mm512_bitshuffle_epi64_mask(h8, idx), out[z], h);
        }
#else
        uint32_t qh[8];
        for (int i = 0; i < 8; i++) qh[i] = sd_ld32(blk[i] + ho);
        for (int z = 0; z < 4; z++) out[z] = _mm512_or_si512(out[z], q5_group_high(qh, z));
#endif
    }
}

// A partial group in the 2-vector layout (blocks blk[0..3]).
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

// The partial last group (nb % 8 blocks) of a row, from the blocks in the
// file's layout at row + (nb / 8 * 8) * wts (repacked rows keep their tail
// blocks there too); missing blocks repeat the last one.
AI void pack_tail(int type, const uint8_t *row, int64_t nb, __m512i out[4], __m512 *dw) {
    const size_t wts = w_tsize(type);
    const int64_t g = nb / 8;
    const uint8_t *blk[8];
    for (int i = 0; i < 8; i++) {
        int64_t b = g * 8 + i;
        blk[i] = row + (size_t)(b < nb ? b : nb - 1) * wts;
    }
    int nv = tail_nv(nb);
    if (nv == 4) {
        // 5..7 blocks: full layout, scalar-built from a copy with the
        // missing blocks repeated (rare; never on the hot path of
        // the default model).
        uint8_t tmp[8 * sizeof(sd_block_q8_0)]; // the largest legacy block
        for (int i = 0; i < 8; i++) memcpy(tmp + i * wts, blk[i], wts);
        float mtmp[8];
        pack_group(type, tmp, wts, out, dw, mtmp);
    } else if (nv == 2) {
        pack_group4(type, blk, out, dw);
    } else {
        wprep wp;
        prep_w(type, blk[0], blk[1], &wp);
        out[0] = wp.w;
        *dw = wp.dw;
    }
}

// m of the tail blocks (natural order) and the zero padding up to 16 blocks.
AI void pack_tail_m(int type, const uint8_t *row, int64_t nb, float *m) {
    const size_t wts = w_tsize(type);
    for (int64_t b = nb / 8 * 8; b < nb; b++) m[b] = _cvtsh_ss(sd_ld16(row + b * wts + 2));
    for (int64_t b = nb; b < (nb + 15) / 16 * 16; b++) m[b] = 0;
}

AI void pack_rows(int type, int R, int64_t nb, const uint8_t *w, size_t wrb, wpack *pk) {
    const size_t wts = w_tsize(type);
    for (int r = 0; r < R; r++) {
        const uint8_t *row = w + r * wrb;
        const int64_t nfull = nb / 8;
        for (int64_t g = 0; g < nfull; g++)
            pack_group(type, row + (size_t)g * 8 * wts, wts, pk->w[r][g], &pk->d[r][g], (float *)pk->m[r] + g * 8);
        if (nb % 8) pack_tail(type, row, nb, pk->w[r][nfull], &pk->d[r][nfull]);
        if (w_has_min(type)) pack_tail_m(type, row, nb, (float *)pk->m[r]); // full groups wrote theirs
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
// every dpbusd that uses it (R loads of the same activation vector per
// group; the tile is then bound by L1 loads rather than by dpbusd).
AI __m512i in_reg(__m512i v) {
    __asm__("" : "+v"(v));
    return v;
}

AI __m512 in_reg_ps(__m512 v) {
    __asm__("" : "+v"(v));
    return v;
}

// a0 + the dpbusd of nv vector pairs, as two chains added at the end
// (integer sums: any order gives the same bits, and the chains halve the latency).
AI __m512i dot4(__m512i a0, const __m512i w[4], const __m512i x[4], int nv) {
    if (nv == 1) return _mm512_dpbusd_epi32(a0, w[0], x[0]);
    __m512i s0 = _mm512_dpbusd_epi32(a0, w[0], x[0]);
    __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], x[1]);
    if (nv == 4) {
        s0 = _mm512_dpbusd_epi32(s0, w[2], x[2]);
        s1 = _mm512_dpbusd_epi32(s1, w[3], x[3]);
    }
    return _mm512_add_epi32(s0, s1);
}

// One group (NV vectors) of the R x T tile.
AI void tile_group(int type, int R, int T, int NV, const wpack *pk, int64_t g, const uint8_t *x, size_t xrb,
                   size_t oq, size_t od, size_t oa, __m512 acc[PK_R][4]) {
    __m512i wv[PK_R][4];
    __m512 dw[PK_R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
        for (int z = 0; z < NV; z++) wv[r][z] = pk->w[r][g][z];
        dw[r] = pk->d[r][g];
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const uint8_t *xg = x + t * xrb + oq + g * 256;
        __m512i xv[4];
#pragma GCC unroll 4
        for (int z = 0; z < NV; z++) xv[z] = in_reg(_mm512_load_si512(xg + 64 * z));
        __m512 dx = in_reg_ps(_mm512_load_ps(x + t * xrb + od + g * 64));
        __m512i a0 = w_offset(type) ? _mm512_load_si512(x + t * xrb + oa + g * 64) : _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512i isum = dot4(a0, wv[r], xv, NV);
            acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw[r], dx), acc[r][t]);
        }
    }
}

AI void tile_packed(int type, int R, int T, int64_t nb, const wpack *pk, const uint8_t *x, size_t xrb, float *y,
                    int64_t ldy) {
    const int64_t ng = (nb + 7) / 8, nb16 = (nb + 15) / 16, nfull = nb / 8;
    const size_t oq = pk_head(type, nb), od = oq + (size_t)ng * 256, oa = od + (size_t)ng * 64;
    const size_t os = w_offset(type) ? oa + (size_t)ng * 64 : oa;
    __m512 acc[PK_R][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < nfull; g++) tile_group(type, R, T, 4, pk, g, x, xrb, oq, od, oa, acc);
    if (ng > nfull) switch (tail_nv(nb)) {
        case 1: tile_group(type, R, T, 1, pk, nfull, x, xrb, oq, od, oa, acc); break;
        case 2: tile_group(type, R, T, 2, pk, nfull, x, xrb, oq, od, oa, acc); break;
        default: tile_group(type, R, T, 4, pk, nfull, x, xrb, oq, od, oa, acc); break;
        }
    if (w_has_min(type))
        for (int64_t k = 0; k < nb16; k++) {
            __m512 mv[PK_R];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) mv[r] = in_reg_ps(pk->m[r][k]);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                __m512 sv = in_reg_ps(_mm512_load_ps(x + t * xrb + os + k * 64));
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(mv[r], sv, acc[r][t]);
            }
        }
    // Batch invariance: every token's accumulator is reduced by the same
    // reduce4 tree (lane t of its result depends on acc[.][t] only, with the
    // same order of additions for every t), whatever T is; missing tokens are
    // zero vectors whose sums are discarded.
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m512 z = _mm512_setzero_ps();
        float v[4];
        _mm_storeu_ps(v, reduce4(acc[r][0], T > 1 ? acc[r][1] : z, T > 2 ? acc[r][2] : z, T > 3 ? acc[r][3] : z));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) y[t * ldy + r] = v[t];
    }
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

AI void pack_rows_rp(int type, int R, int64_t nb, const uint8_t *w, size_t wrb, wpack *pk); // repacked rows, below

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
        if (rp) pack_rows_rp(type, PK_R, nb, w + r * wrb, wrb, &pk);
        else pack_rows(type, PK_R, nb, w + r * wrb, wrb, &pk);
        packed_all_tokens(type, PK_R, nb, &pk, xq, xrb, n_tok, y + r, ldy);
    }
    for (; r < r1; r++) {
        if (rp) pack_rows_rp(type, 1, nb, w + r * wrb, wrb, &pk);
        else pack_rows(type, 1, nb, w + r * wrb, wrb, &pk);
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

// ---- repacked weights (SD_TYPE_*_R: rewritten once at load) -----------------
//
// The packed path above spends most of a 1-token matmul gathering 8 blocks
// of 18-34 bytes into group vectors. A repacked row holds its full groups
// already in group layout, so unpacking a group is two loads and four
// and/shift ops (Q4, Q5), or four loads (Q8_0). Row r of nb blocks (nfull =
// nb / 8 full groups) is, in nb * block-size bytes like the file's row:
//   quants  (nfull, QB) bytes: Q4/Q5: A | B, 64 bytes each, with group vector
//           0 = A & 15, 1 = B & 15, 2 = A >> 4, 3 = B >> 4; Q5 then 4 x 64-bit
//           masks of bit 4 (vector z, byte j <- mask z bit j); Q8_0: the 4
//           vectors, already offset to unsigned
//   d       (nfull, 8) fp16, slot order (SIGMA)
//   m       (nfull, 8) fp16, natural order (Q4_1, Q5_1)
//   tail    the nb % 8 last blocks, unchanged, at the same offset as in the file
// QB + 16 (+ 16) = 8 x block size for every type, so the sections fit exactly.
// The unpacked vectors and scales are the same values the packed path builds,
// and every (row, token) accumulator gets the same operations in the same
// order, so a repacked matrix gives exactly the bits of the file's one.

AI size_t rp_qb(int type) {
    return type == SD_TYPE_Q8_0 ? 256 : (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1) ? 160 : 128;
}

// Group g of a repacked row with nfull full groups.
AI void rp_group(int type, const uint8_t *row, int64_t nfull, int64_t g, __m512i out[4], __m512 *dw) {
    const uint8_t *q = row + (size_t)g * rp_qb(type);
    if (type == SD_TYPE_Q8_0) {
        for (int z = 0; z < 4; z++) out[z] = _mm512_loadu_si512(q + 64 * z);
    } else {
        const __m512i m4 = _mm512_set1_epi8(0x0f);
        __m512i a = _mm512_loadu_si512(q), b = _mm512_loadu_si512(q + 64);
        out[0] = _mm512_and_si512(a, m4);
        out[1] = _mm512_and_si512(b, m4);
        out[2] = _mm512_and_si512(_mm512_srli_epi16(a, 4), m4);
        out[3] = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
        if (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1) {
            const __m512i h = _mm512_set1_epi8(0x10);
            for (int z = 0; z < 4; z++)
                out[z] = _mm512_mask_add_epi8(out[z], _cvtu64_mask64(sd_ld64(q + 128 + 8 * z)), out[z], h);
        }
    }
    const __m128i dh = _mm_loadu_si128((const __m128i *)(row + (size_t)nfull * rp_qb(type) + (size_t)g * 16));
    *dw = _mm512_permutexvar_ps(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0),
                                _mm512_castps256_ps512(_mm256_cvtph_ps(dh)));
}

// m of a repacked row, natural order, zero-padded to a multiple of 16 blocks.
AI void rp_row_m(int type, const uint8_t *row, int64_t nb, float *m) {
    const int64_t nfull = nb / 8;
    const uint16_t *mh = (const uint16_t *)(row + (size_t)nfull * (rp_qb(type) + 16));
    int64_t b = 0;
    for (; b + 8 <= nfull * 8; b += 8)
        _mm256_storeu_ps(m + b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mh + b))));
    pack_tail_m(type, row, nb, m);
}

static int repack_legacy(int type, const void *src, void *dst, int64_t n_in, int64_t n_rows) {
    const int64_t nb = n_in / SD_QK, nfull = nb / 8;
    if (n_in % SD_QK || nb > PK_NB_MAX) return -1;
    const size_t wts = w_tsize(type), rb = (size_t)nb * wts, qb = rp_qb(type);
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *row = (const uint8_t *)src + r * rb;
        uint8_t *o = (uint8_t *)dst + r * rb;
        for (int64_t g = 0; g < nfull; g++) {
            const uint8_t *g0 = row + (size_t)g * 8 * wts;
            __m512i v[4];
            __m512 dw;
            float mtmp[8];
            pack_group(type, g0, wts, v, &dw, mtmp);
            uint8_t *q = o + g * qb;
            if (type == SD_TYPE_Q8_0) {
                for (int z = 0; z < 4; z++) _mm512_storeu_si512(q + 64 * z, v[z]);
            } else {
                const __m512i m4 = _mm512_set1_epi8(0x0f);
                for (int z = 0; z < 2; z++)
                    _mm512_storeu_si512(q + 64 * z, _mm512_or_si512(_mm512_and_si512(v[z], m4),
                                                                    _mm512_slli_epi16(_mm512_and_si512(v[z + 2], m4), 4)));
                if (type == SD_TYPE_Q5_0 || type == SD_TYPE_Q5_1)
                    for (int z = 0; z < 4; z++) {
                        uint64_t k = _cvtmask64_u64(_mm512_test_epi8_mask(v[z], _mm512_set1_epi8(0x10)));
                        memcpy(q + 128 + 8 * z, &k, 8);
                    }
            }
            for (int sl = 0; sl < 8; sl++) // d: the first 2 bytes of every legacy block
                memcpy(o + nfull * qb + g * 16 + 2 * sl, g0 + SIGMA[sl] * wts, 2);
            if (w_has_min(type))
                for (int i = 0; i < 8; i++) memcpy(o + nfull * (qb + 16) + g * 16 + 2 * i, g0 + i * wts + 2, 2);
        }
        memcpy(o + nfull * 8 * wts, row + nfull * 8 * wts, (size_t)(nb - nfull * 8) * wts);
    }
    return 0;
}

AI void pack_rows_rp(int type, int R, int64_t nb, const uint8_t *w, size_t wrb, wpack *pk) {
    const int64_t nfull = nb / 8;
    for (int r = 0; r < R; r++) {
        const uint8_t *row = w + r * wrb;
        for (int64_t g = 0; g < nfull; g++) rp_group(type, row, nfull, g, pk->w[r][g], &pk->d[r][g]);
        if (nb % 8) pack_tail(type, row, nb, pk->w[r][nfull], &pk->d[r][nfull]);
        if (w_has_min(type)) rp_row_m(type, row, nb, (float *)pk->m[r]);
    }
}

// One token, R <= RP1_R rows: the weights go straight from memory into
// registers (no pack buffer); the float operations on each accumulator are
// those of tile_packed with T = 1. The four dpbusd of a group run as two
// chains added at the end (integer sums: any order gives the same bits).
#define RP1_R 4
#define RP1_PF 16 // rows of software prefetch ahead
AI void rp_tile1(int type, int R, int64_t nb, const uint8_t *w, size_t wrb, const uint8_t *x, float *y) {
    const int64_t ng = (nb + 7) / 8, nb16 = (nb + 15) / 16, nfull = nb / 8;
    const size_t oq = pk_head(type, nb), od = oq + (size_t)ng * 256, oa = od + (size_t)ng * 64;
    const size_t os = w_offset(type) ? oa + (size_t)ng * 64 : oa;
    __m512 acc[RP1_R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < nfull; g++) {
        __m512i xv[4];
#pragma GCC unroll 4
        for (int z = 0; z < 4; z++) xv[z] = in_reg(_mm512_load_si512(x + oq + g * 256 + 64 * z));
        __m512 dx = in_reg_ps(_mm512_load_ps(x + od + g * 64));
        __m512i a0 = w_offset(type) ? in_reg(_mm512_load_si512(x + oa + g * 64)) : _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512i wv[4];
            __m512 dw;
            rp_group(type, w + r * wrb, nfull, g, wv, &dw);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot4(a0, wv, xv, 4)), _mm512_mul_ps(dw, dx), acc[r]);
        }
    }
    if (ng > nfull) {
        const int nv = tail_nv(nb);
        __m512i a0 = w_offset(type) ? _mm512_load_si512(x + oa + nfull * 64) : _mm512_setzero_si512();
        __m512 dx = _mm512_load_ps(x + od + nfull * 64);
        __m512i xv[4];
        for (int z = 0; z < nv; z++) xv[z] = _mm512_load_si512(x + oq + nfull * 256 + 64 * z);
        for (int r = 0; r < R; r++) {
            __m512i wv[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                             _mm512_setzero_si512()}; // pack_tail fills the first nv
            __m512 dw;
            pack_tail(type, w + r * wrb, nb, wv, &dw);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot4(a0, wv, xv, nv)), _mm512_mul_ps(dw, dx), acc[r]);
        }
    }
    if (w_has_min(type)) {
        _Alignas(64) float m[RP1_R][PK_NB_MAX + 16];
        for (int r = 0; r < R; r++) rp_row_m(type, w + r * wrb, nb, m[r]);
        for (int64_t k = 0; k < nb16; k++) {
            __m512 sv = _mm512_load_ps(x + os + k * 64);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(_mm512_load_ps(m[r] + k * 16), sv, acc[r]);
        }
    }
    const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) y[r] = _mm_cvtss_f32(reduce4(acc[r], z, z, z));
}

// Two tokens, R <= RP1_R rows, like rp_tile1 (each accumulator gets the
// operations of tile_packed with T = 2; reduce4 lane t depends on token t only).
AI void rp_tile2(int type, int R, int64_t nb, const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y,
                 int64_t ldy) {
    const int64_t ng = (nb + 7) / 8, nb16 = (nb + 15) / 16, nfull = nb / 8;
    const size_t oq = pk_head(type, nb), od = oq + (size_t)ng * 256, oa = od + (size_t)ng * 64;
    const size_t os = w_offset(type) ? oa + (size_t)ng * 64 : oa;
    const uint8_t *x1 = x + xrb;
    __m512 acc0[RP1_R], acc1[RP1_R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < nfull; g++) {
        __m512i xa[4], xb[4];
#pragma GCC unroll 4
        for (int z = 0; z < 4; z++) {
            xa[z] = in_reg(_mm512_load_si512(x + oq + g * 256 + 64 * z));
            xb[z] = in_reg(_mm512_load_si512(x1 + oq + g * 256 + 64 * z));
        }
        __m512 da = in_reg_ps(_mm512_load_ps(x + od + g * 64)), db = in_reg_ps(_mm512_load_ps(x1 + od + g * 64));
        __m512i aa = w_offset(type) ? in_reg(_mm512_load_si512(x + oa + g * 64)) : _mm512_setzero_si512();
        __m512i ab = w_offset(type) ? in_reg(_mm512_load_si512(x1 + oa + g * 64)) : _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512i wv[4];
            __m512 dw;
            rp_group(type, w + r * wrb, nfull, g, wv, &dw);
            acc0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot4(aa, wv, xa, 4)), _mm512_mul_ps(dw, da), acc0[r]);
            acc1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot4(ab, wv, xb, 4)), _mm512_mul_ps(dw, db), acc1[r]);
        }
    }
    if (ng > nfull) {
        const int nv = tail_nv(nb);
        __m512i aa = w_offset(type) ? _mm512_load_si512(x + oa + nfull * 64) : _mm512_setzero_si512();
        __m512i ab = w_offset(type) ? _mm512_load_si512(x1 + oa + nfull * 64) : _mm512_setzero_si512();
        __m512 da = _mm512_load_ps(x + od + nfull * 64), db = _mm512_load_ps(x1 + od + nfull * 64);
        __m512i xa[4], xb[4];
        for (int z = 0; z < nv; z++) {
            xa[z] = _mm512_load_si512(x + oq + nfull * 256 + 64 * z);
            xb[z] = _mm512_load_si512(x1 + oq + nfull * 256 + 64 * z);
        }
        for (int r = 0; r < R; r++) {
            __m512i wv[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                             _mm512_setzero_si512()}; // pack_tail fills the first nv
            __m512 dw;
            pack_tail(type, w + r * wrb, nb, wv, &dw);
            acc0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot4(aa, wv, xa, nv)), _mm512_mul_ps(dw, da), acc0[r]);
            acc1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot4(ab, wv, xb, nv)), _mm512_mul_ps(dw, db), acc1[r]);
        }
    }
    if (w_has_min(type)) {
        _Alignas(64) float m[RP1_R][PK_NB_MAX + 16];
        for (int r = 0; r < R; r++) rp_row_m(type, w + r * wrb, nb, m[r]);
        for (int64_t k = 0; k < nb16; k++) {
            __m512 sa = _mm512_load_ps(x + os + k * 64), sb = _mm512_load_ps(x1 + os + k * 64);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512 mv = _mm512_load_ps(m[r] + k * 16);
                acc0[r] = _mm512_fmadd_ps(mv, sa, acc0[r]);
                acc1[r] = _mm512_fmadd_ps(mv, sb, acc1[r]);
            }
        }
    }
    const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float v[4];
        _mm_storeu_ps(v, reduce4(acc0[r], acc1[r], z, z));
        y[r] = v[0];
        y[ldy + r] = v[1];
    }
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
    // One or two tokens, measured on the default model (2 threads): 4 rows
    // per tile and a software prefetch 16 rows ahead, 2.3-2.4 ms per token;
    // 2 rows 2.4-2.6, no prefetch 2.9-4.1 (the hardware prefetcher lags).
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        if (r + 4 + RP1_PF <= r1) prefetch_bytes(w + (r + RP1_PF) * wrb, 4 * wrb);
        if (n_tok == 1) rp_tile1(type, 4, nb, w + r * wrb, wrb, xq, y + r);
        else rp_tile2(type, 4, nb, w + r * wrb, wrb, xq, xrb, y + r, ldy);
    }
    for (; r < r1; r++) {
        if (n_tok == 1) rp_tile1(type, 1, nb, w + r * wrb, wrb, xq, y + r);
        else rp_tile2(type, 1, nb, w + r * wrb, wrb, xq, xrb, y + r, ldy);
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
