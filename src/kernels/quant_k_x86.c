// quant_k_x86.c - the AVX-512 tile kernel (gemm) of Q4_K, Q5_K, Q6_K and
// their repacked forms (layouts and the activations' preparation in
// quant_k_repack.c).
//
// Float work per (row, token) -- the same sequence in every tile shape, for
// the file layout (which the gemm repacks on the fly, a few rows at a time)
// and the repacked one, so y has the same bits whatever n_tok, the token's
// place in the batch or the row range (batch invariance), and repacked and
// file-layout gemm agree bit for bit:
//   facc = 0 (16 float lanes)
//   per pair (Q4/Q5): acc = integer dots of the 16 sub-blocks;
//       facc = fma(acc * dsc, dx, facc); facc = facc - dcm * bxs (fused)
//     dsc = d * sc (exact), dcm = dmin * m (exact), dx = the Q8_K scale of
//     the lane's block, bxs = dx * (sum of the sub-block's activations).
//   per block (Q6): acc = integer dots of the 16 groups minus 32 * bsums;
//       facc = fma(acc * dsc, dx, facc)
//   y = facc[0..15] summed as ((l + l8) + (l + l4)) ... (kx_hsum)
// sd_quant_k_r_dot_ref computes exactly this in scalar C (tests compare the
// kernel with it bit for bit, and with the plain references of quant_k.c
// within rounding).
//
// Kernel paths (kx_gemm; they differ in speed only):
//  - on the fly (n_tok <= KX_TF): each row's unit is unpacked in registers
//    and meets up to 8 tokens' prepared activations (memory operands); one
//    row at a time while those activations fit in L1, else 2-4 rows that
//    share them. Software prefetch (kx_pf) about 8 KiB ahead in the row
//    stream: without it a one-token call waited on memory three times longer.
//    The prefetch (both paths) goes into L2 only (_MM_HINT_T1; the L1
//    prefetcher takes it from there): on Zen 4 (32 KiB L1d) prefetches into
//    L1 evicted the tokens' prepared activations (11.5-13.4 KiB per token for
//    Qwen2.5-1.5B's ffn_down rows of 8960), and one- and two-token calls took
//    1.5-2.3x as long; rows of 1536 and the buffered path (16-64 tokens,
//    6-18%) were faster too (2026-11-30, docs/performance.md).
//  - buffered (larger batches): per row tile of 8 rows and chunk of units,
//    the rows are unpacked once into an L1 buffer, then 4-row x 2-token
//    outer-product tiles (6 vector loads per 8 vpdpbusd) run over the chunk;
//    the float accumulators live in a small (rows, tokens) array between
//    chunks, and the outputs of a token are reduced 8 rows at a time
//    (kx_hsum8, the same tree) and stored together.
// Rows repacked at load are contiguous, so the prefetch runs ahead across
// row boundaries; rows in the file layout are repacked into a stack buffer a
// few at a time (tests, and rows the model did not repack).
//
// Measured (this 2-vCPU Zen 5 EPYC, shared and noisy; one thread, medians of
// 40 calls, matrices streamed from memory; old = the previous file-layout
// kernel of quant_k.c), ms for n_tok = 1 / 2 / 4 / 8 / 16:
//   Q4_K 8960 x 1536 (7.7 MB):  old 0.58 0.66 0.83 1.19 1.85
//                               new 0.23 0.29 0.39 0.63 1.20
//   Q6_K 1536 x 8960 (11.3 MB): old 0.80 0.87 1.02 1.33 1.94
//                               new 0.35 0.42 0.53 0.95 1.46
// Qwen2.5-Coder-1.5B Q4_K_M, bench-forward -t 2: n = 1: 23 ms (at the
// memory floor), 2: 24, 4: 28, 8: 44, 16: 81 (old: 42, 47, 55, 75, 110).
// Batches are bound by the vpdpbusd + float FMA work (11 ops on the FMA
// pipes per row, token and pair of super-blocks) plus the unpacking.
#include "kernels/quant_k_impl.h"

#include <string.h>

// ---------------------------------------------------------------------------
// AVX-512 kernels

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__)
#include <immintrin.h>

#if defined(__AVX512VNNI__)
#define KX_DPBUSD(acc, u, s) _mm512_dpbusd_epi32((acc), (u), (s))
#else
// Same integer result: u8 x s8 pairs never saturate int16 here (|2 * 63 * 128| < 2^15).
#define KX_DPBUSD(acc, u, s) \
    _mm512_add_epi32((acc), _mm512_madd_epi16(_mm512_maddubs_epi16((u), (s)), _mm512_set1_epi16(1)))
#endif

#define KX_INLINE static inline __attribute__((always_inline))

#ifndef KX_XBUF
#define KX_XBUF (224 * 1024) // bytes of prepared activations on the stack
#endif
#ifndef KX_RBUF
#define KX_RBUF (32 * 1024) // bytes of rows repacked on the fly (file-layout gemm)
#endif
#define KX_RMAX 8 // most rows of a tile
#ifndef KX_PFD
#define KX_PFD 8192 // software prefetch: bytes in flight ahead of the tile (see kx_pf)
#endif
#ifndef KX_PFDB
#define KX_PFDB 16384 // the same for the buffered path
#endif
#ifndef KX_PFHINT
#define KX_PFHINT _MM_HINT_T1 // into L2 only (see the path notes above)
#endif
#define KX_TMAX 8 // most tokens of a tile

// The kernel's horizontal sum (kx_hsum_ref's tree).
KX_INLINE float kx_hsum(__m512 v) {
    const __m256 a = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
    const __m128 b = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

// kx_hsum of v[0..7] (the same tree, lane i = kx_hsum(v[i])), for
// storing the 8 outputs of a token with one store.
KX_INLINE __m256 kx_hsum8(const __m512 v[8]) {
    __m512 s[4], t[2];
    for (int i = 0; i < 4; i++) // lanes (l, l + 8): 256-bit halves of v[2i], v[2i+1]
        s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 2; i++) // lanes (l, l + 4): 128-bit chunks 0/1 and 2/3 of each half
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0xDD));
    // t[0] chunks: v0 v1 v2 v3, t[1]: v4 v5 v6 v7 (4 partial lanes each)
    const __m512 a = _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], 0x44), _mm512_shuffle_ps(t[0], t[1], 0xEE)); // (l, l + 2)
    const __m512 b = _mm512_add_ps(a, _mm512_shuffle_ps(a, a, 0xB1));                                        // (l, l + 1)
    // chunk c: lane 0 = v[c], lane 2 = v[c + 4]
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 14, 10, 6, 2, 12, 8, 4, 0), b));
}

// Keeps v in a register: GCC otherwise folds a load used by several
// vpdpbusd into each of them as a memory operand (the tiles were load bound).
#define KX_REG(v) __asm__("" : "+v"(v))

// Software prefetch of the weights: the tile's row slot r reads rows r, r + R,
// r + 2R, ... (R rows per tile, each wrb bytes); at byte off of its current
// row it asks for the byte d further along that stream: off + d in the same
// row while that is inside it (wrap_at = wrb), else in the row one tile down
// (+ wrap_add = R * wrb - wrb). Rows shorter than d: d is whole tiles and
// wrap_at infinite. d = 0: no prefetch (rows repacked on the fly).
typedef struct {
    size_t d;        // bytes ahead (0: none)
    size_t wrap_at;  // offsets from here on land in the next tile's row
    size_t wrap_add; // bytes added then
} kx_pf;

KX_INLINE void kx_pf_unit(const uint8_t *row, size_t off, size_t len, const kx_pf *pf) {
    if (!pf->d) return;
    const size_t o = off + pf->d;
    const char *p = (const char *)row + o + (o >= pf->wrap_at ? pf->wrap_add : 0);
    for (size_t i = 0; i < len; i += 64) _mm_prefetch(p + i, KX_PFHINT);
}

static kx_pf kx_pf_make(int repacked, size_t wrb, int rows_per_tile, size_t dist) {
    kx_pf pf = {0, SIZE_MAX, 0};
    if (!repacked) return pf;
    const size_t tile = (size_t)rows_per_tile * wrb, per_row = dist / (size_t)rows_per_tile;
    if (wrb > per_row) { // about dist bytes in flight over the tile's row streams
        pf.d = per_row;
        pf.wrap_at = wrb;
        pf.wrap_add = tile - wrb;
    } else {
        pf.d = tile * ((dist + tile - 1) / tile);
    }
    return pf;
}

// dsc, dcm of a pair from its 32-byte header.
KX_INLINE void kx_dec45(const uint8_t *h, __m512 *dsc, __m512 *dcm) {
    const __m512i X = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)h));
    const __m512i sc = _mm512_and_si512(X, _mm512_set1_epi32(63));
    const __m512i mlo = _mm512_and_si512(
        _mm512_srlv_epi64(_mm512_set1_epi64((long long)sd_ld64(h + 16)), _mm512_set_epi64(28, 24, 20, 16, 12, 8, 4, 0)),
        _mm512_set1_epi32(15));
    // (X >> 2) & 0x30 | mlo
    const __m512i m = _mm512_ternarylogic_epi32(_mm512_srli_epi32(X, 2), mlo, _mm512_set1_epi32(0x30), 0xEC);
    const __m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(h + 24))));
    const __m512 dv = _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), f);
    const __m512 dm = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2), f);
    *dsc = _mm512_mul_ps(_mm512_cvtepi32_ps(sc), dv);
    *dcm = _mm512_mul_ps(_mm512_cvtepi32_ps(m), dm);
}

// dsc, dcm of unit p of a Q4_K_R / Q5_K_R row at u.
KX_INLINE void kx_dec45_unit(const uint8_t *u, int has_qh, int half, __m512 *dsc, __m512 *dcm) {
    if (half) {
        _Alignas(16) uint8_t hdr[32];
        kx_pair_header(u, has_qh, 1, hdr);
        kx_dec45(hdr, dsc, dcm);
    } else {
        kx_dec45(u + kx_hdr_off(has_qh, 0), dsc, dcm);
    }
}

// Bit 4 of w[k] from a Q5 H vector, at bit 4 of each byte (other bits garbage).
KX_INLINE __m512i kx_q5_bit(__m512i H, int k) {
    return k < 4 ? _mm512_slli_epi16(H, 4 - k) : k > 4 ? _mm512_srli_epi16(H, k - 4) : H;
}

// w[2i], w[2i+1] of a unit (half: lanes 8-15 zero); H: the unit's Q5 bits.
KX_INLINE void kx_w45(const uint8_t *u, int has_qh, int half, int i, __m512i H, __m512i *lo, __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    const __m512i q = half ? _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(u + 32 * i)))
                           : _mm512_loadu_si512((const void *)(u + 64 * i));
    *lo = _mm512_and_si512(q, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    if (has_qh) {
        *lo = _mm512_ternarylogic_epi32(*lo, kx_q5_bit(H, 2 * i), b4, 0xF8); // lo | (bit & 0x10)
        *hi = _mm512_ternarylogic_epi32(*hi, kx_q5_bit(H, 2 * i + 1), b4, 0xF8);
    }
}

KX_INLINE __m512i kx_h45(const uint8_t *u, int has_qh, int half) {
    if (!has_qh) return _mm512_setzero_si512();
    return half ? _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(u + 128)))
                : _mm512_loadu_si512((const void *)(u + 256));
}

// w[k] of a Q6_K_R block.
KX_INLINE void kx_unpack6(const uint8_t *u, __m512i w[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i L0 = _mm512_loadu_si512((const void *)u), L1 = _mm512_loadu_si512((const void *)(u + 64));
    const __m512i H = _mm512_loadu_si512((const void *)(u + 128));
#if defined(__GFNI__)
    // gf2p8affine with matrix byte 3 = 1 << 2k, byte 2 = 1 << (2k + 1): bits
    // 2k, 2k+1 of each byte to bits 4, 5, all else 0; then (L & 0x0F) | that.
    const __m512i L0h = _mm512_srli_epi16(L0, 4), L1h = _mm512_srli_epi16(L1, 4);
    w[0] = _mm512_ternarylogic_epi32(L0, _mm512_gf2p8affine_epi64_epi8(H, _mm512_set1_epi64(0x01020000LL), 0), m4, 0xEC);
    w[1] = _mm512_ternarylogic_epi32(L0h, _mm512_gf2p8affine_epi64_epi8(H, _mm512_set1_epi64(0x04080000LL), 0), m4, 0xEC);
    w[2] = _mm512_ternarylogic_epi32(L1, _mm512_gf2p8affine_epi64_epi8(H, _mm512_set1_epi64(0x10200000LL), 0), m4, 0xEC);
    w[3] = _mm512_ternarylogic_epi32(L1h, _mm512_gf2p8affine_epi64_epi8(H, _mm512_set1_epi64(0x40800000LL), 0), m4, 0xEC);
#else
    const __m512i m30 = _mm512_set1_epi8(0x30);
    w[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(L0, m4), _mm512_slli_epi16(H, 4), m30, 0xF8);
    w[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(L0, 4), m4), _mm512_slli_epi16(H, 2), m30, 0xF8);
    w[2] = _mm512_ternarylogic_epi32(_mm512_and_si512(L1, m4), H, m30, 0xF8);
    w[3] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(L1, 4), m4), _mm512_srli_epi16(H, 2), m30, 0xF8);
#endif
}

KX_INLINE __m512 kx_dsc6(const uint8_t *u) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(u + 192)))),
                         _mm512_set1_ps(_cvtsh_ss(sd_ld16(u + 208))));
}

// The float step of a pair (Q4/Q5) / a block (Q6) for one (row, token).
KX_INLINE __m512 kx_fstep45(__m512 facc, __m512i acc, __m512 dsc, __m512 dcm, const kx_xp45 *xp) {
    const __m512 tt = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), dsc);
    facc = _mm512_fmadd_ps(tt, _mm512_load_ps(xp->dx), facc);
    return _mm512_fnmadd_ps(dcm, _mm512_load_ps(xp->bxs), facc);
}
KX_INLINE __m512 kx_fstep6(__m512 facc, __m512i acc, __m512 dsc, const kx_xp6 *xp) {
    const __m512 tt = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), dsc);
    return _mm512_fmadd_ps(tt, _mm512_load_ps(xp->dx), facc);
}

// ---- on-the-fly tiles (one-token calls and small batches): each row's
// unit is unpacked in registers and meets the T tokens' activations (memory
// operands). rows[r]: repacked rows; pf: the weights prefetch.

KX_INLINE void kx_fly45(const int R, const int T, const int has_qh, const uint8_t *const *rows, int64_t nb,
                        const kx_xp45 *const *xp, float out[KX_RMAX][KX_TMAX], const kx_pf *pf) {
    const int64_t np = nb / 2, nu = (nb + 1) / 2;
    const size_t ps = kx_pair_bytes(has_qh);
    __m512 facc[KX_RMAX][KX_TMAX];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) facc[r][t] = _mm512_setzero_ps();
    for (int64_t p = 0; p < nu; p++) {
        const int half = p == np;
        for (int r = 0; r < R; r++) {
            const uint8_t *u = rows[r] + (size_t)p * ps;
            kx_pf_unit(rows[r], (size_t)p * ps, ps, pf);
            __m512i acc[KX_TMAX];
            for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_si512();
            const __m512i H = kx_h45(u, has_qh, half);
            for (int i = 0; i < 4; i++) {
                __m512i lo, hi;
                kx_w45(u, has_qh, half, i, H, &lo, &hi);
                for (int t = 0; t < T; t++) {
                    acc[t] = KX_DPBUSD(acc[t], lo, _mm512_load_si512((const void *)xp[t][p].x[2 * i]));
                    acc[t] = KX_DPBUSD(acc[t], hi, _mm512_load_si512((const void *)xp[t][p].x[2 * i + 1]));
                }
            }
            __m512 dsc, dcm;
            kx_dec45_unit(u, has_qh, half, &dsc, &dcm);
            for (int t = 0; t < T; t++) facc[r][t] = kx_fstep45(facc[r][t], acc[t], dsc, dcm, &xp[t][p]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) out[r][t] = kx_hsum(facc[r][t]);
}

KX_INLINE void kx_fly6(const int R, const int T, const uint8_t *const *rows, int64_t nb, const kx_xp6 *const *xp,
                       float out[KX_RMAX][KX_TMAX], const kx_pf *pf) {
    __m512 facc[KX_RMAX][KX_TMAX];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) facc[r][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < R; r++) {
            const uint8_t *u = rows[r] + (size_t)b * 210;
            kx_pf_unit(rows[r], (size_t)b * 210, 210, pf);
            __m512i w[4];
            kx_unpack6(u, w);
            __m512i acc[KX_TMAX];
            for (int t = 0; t < T; t++) {
                acc[t] = _mm512_load_si512((const void *)xp[t][b].acc0);
                for (int k = 0; k < 4; k++)
                    acc[t] = KX_DPBUSD(acc[t], w[k], _mm512_load_si512((const void *)xp[t][b].x[k]));
            }
            const __m512 dsc = kx_dsc6(u);
            for (int t = 0; t < T; t++) facc[r][t] = kx_fstep6(facc[r][t], acc[t], dsc, &xp[t][b]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) out[r][t] = kx_hsum(facc[r][t]);
}

// ---- buffered tiles (larger batches): the rows of a row tile are unpacked
// once into an L1 buffer, then tiles of R rows x T tokens run as outer
// products (R + T vector loads per R * T vpdpbusd).

typedef struct {
    uint8_t w[8][64]; // (8, 64) unsigned quants w[k]
    float dsc[16];    // (16) d * sc per lane
    float dcm[16];    // (16) dmin * m per lane
} kx_wb45;            // 640 bytes: one unit of one row
typedef struct {
    uint8_t w[4][64]; // (4, 64) unsigned quants w[k]
    float dsc[16];    // (16) d * sc per lane
} kx_wb6;             // 320 bytes: one block of one row

// Unpacks units [p0, p1) of repacked row `row` (nb blocks) into wb[0 ..).
KX_INLINE void kx_fill45(const uint8_t *row, const int has_qh, int64_t nb, int64_t p0, int64_t p1, kx_wb45 *wb,
                         const kx_pf *pf) {
    const int64_t np = nb / 2;
    const size_t ps = kx_pair_bytes(has_qh);
    for (int64_t p = p0; p < p1; p++, wb++) {
        const uint8_t *u = row + (size_t)p * ps;
        kx_pf_unit(row, (size_t)p * ps, ps, pf);
        const int half = p == np;
        const __m512i H = kx_h45(u, has_qh, half);
        for (int i = 0; i < 4; i++) {
            __m512i lo, hi;
            kx_w45(u, has_qh, half, i, H, &lo, &hi);
            _mm512_store_si512((void *)wb->w[2 * i], lo);
            _mm512_store_si512((void *)wb->w[2 * i + 1], hi);
        }
        __m512 dsc, dcm;
        kx_dec45_unit(u, has_qh, half, &dsc, &dcm);
        _mm512_store_ps(wb->dsc, dsc);
        _mm512_store_ps(wb->dcm, dcm);
    }
}
static void kx_fill4(const uint8_t *row, int64_t nb, int64_t p0, int64_t p1, kx_wb45 *wb, const kx_pf *pf) {
    kx_fill45(row, 0, nb, p0, p1, wb, pf);
}
static void kx_fill5(const uint8_t *row, int64_t nb, int64_t p0, int64_t p1, kx_wb45 *wb, const kx_pf *pf) {
    kx_fill45(row, 1, nb, p0, p1, wb, pf);
}

static void kx_fill6(const uint8_t *row, int64_t b0, int64_t b1, kx_wb6 *wb, const kx_pf *pf) {
    for (int64_t b = b0; b < b1; b++, wb++) {
        const uint8_t *u = row + (size_t)b * 210;
        kx_pf_unit(row, (size_t)b * 210, 210, pf);
        __m512i w[4];
        kx_unpack6(u, w);
        for (int k = 0; k < 4; k++) _mm512_store_si512((void *)wb->w[k], w[k]);
        _mm512_store_ps(wb->dsc, kx_dsc6(u));
    }
}

// wb[r]: row r's units of the chunk, xp[t]: token t's units of the chunk
// (kc of them); fst[r][t]: the (row, token) float accumulator, carried from
// chunk to chunk in memory (the same values as in a register).
KX_INLINE void kx_buf45(const int R, const int T, const kx_wb45 *const *wb, int64_t kc, const kx_xp45 *const *xp,
                        __m512 *const *fst) {
    __m512 facc[KX_RMAX][KX_TMAX];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) facc[r][t] = _mm512_load_ps((const float *)&fst[r][t]);
    for (int64_t p = 0; p < kc; p++) {
        __m512i acc[KX_RMAX][KX_TMAX];
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_si512();
        for (int k = 0; k < 8; k++) {
            __m512i w[KX_RMAX], x[KX_TMAX];
            for (int r = 0; r < R; r++) {
                w[r] = _mm512_load_si512((const void *)wb[r][p].w[k]);
                KX_REG(w[r]);
            }
            for (int t = 0; t < T; t++) {
                x[t] = _mm512_load_si512((const void *)xp[t][p].x[k]);
                KX_REG(x[t]);
            }
            for (int r = 0; r < R; r++)
                for (int t = 0; t < T; t++) acc[r][t] = KX_DPBUSD(acc[r][t], w[r], x[t]);
        }
        for (int r = 0; r < R; r++) {
            const __m512 dsc = _mm512_load_ps(wb[r][p].dsc), dcm = _mm512_load_ps(wb[r][p].dcm);
            for (int t = 0; t < T; t++) facc[r][t] = kx_fstep45(facc[r][t], acc[r][t], dsc, dcm, &xp[t][p]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) _mm512_store_ps((float *)&fst[r][t], facc[r][t]);
}

KX_INLINE void kx_buf6(const int R, const int T, const kx_wb6 *const *wb, int64_t kc, const kx_xp6 *const *xp,
                       __m512 *const *fst) {
    __m512 facc[KX_RMAX][KX_TMAX];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) facc[r][t] = _mm512_load_ps((const float *)&fst[r][t]);
    for (int64_t b = 0; b < kc; b++) {
        __m512i acc[KX_RMAX][KX_TMAX];
        for (int t = 0; t < T; t++) {
            __m512i a0 = _mm512_load_si512((const void *)xp[t][b].acc0);
            KX_REG(a0);
            for (int r = 0; r < R; r++) acc[r][t] = a0;
        }
        for (int k = 0; k < 4; k++) {
            __m512i w[KX_RMAX], x[KX_TMAX];
            for (int r = 0; r < R; r++) {
                w[r] = _mm512_load_si512((const void *)wb[r][b].w[k]);
                KX_REG(w[r]);
            }
            for (int t = 0; t < T; t++) {
                x[t] = _mm512_load_si512((const void *)xp[t][b].x[k]);
                KX_REG(x[t]);
            }
            for (int r = 0; r < R; r++)
                for (int t = 0; t < T; t++) acc[r][t] = KX_DPBUSD(acc[r][t], w[r], x[t]);
        }
        for (int r = 0; r < R; r++) {
            const __m512 dsc = _mm512_load_ps(wb[r][b].dsc);
            for (int t = 0; t < T; t++) facc[r][t] = kx_fstep6(facc[r][t], acc[r][t], dsc, &xp[t][b]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) _mm512_store_ps((float *)&fst[r][t], facc[r][t]);
}

// Tile shapes (speed only, never bits; the values were picked by measuring
// Qwen2.5-Coder's shapes, 1536- and 8960-element rows):
// batches of up to KX_TF tokens go on the fly, in tiles of up to KX_TFT
// tokens x KX_R1 rows while the tile's prepared activations fit KX_XL1,
// else x KX_RF4 rows (tiles of <= 4 tokens) or KX_RF rows; larger batches are
// buffered: KX_RBB rows unpacked per chunk of KX_KC45 / KX_KC6 units, then
// KX_RB x KX_TB outer-product tiles.
#ifndef KX_R1
#define KX_R1 1
#endif
#ifndef KX_XL1
#define KX_XL1 (32 * 1024)
#endif
#ifndef KX_TFT
#define KX_TFT 8
#endif
#ifndef KX_RF4
#define KX_RF4 4
#endif
#ifndef KX_RF
#define KX_RF 2
#endif
#ifndef KX_TF
#define KX_TF 8
#endif
#ifndef KX_RB
#define KX_RB 4
#endif
#ifndef KX_TB
#define KX_TB 2
#endif
#ifndef KX_RBB
#define KX_RBB 8 // a multiple of KX_RB
#endif
#ifndef KX_KC45
#define KX_KC45 4
#endif
#ifndef KX_KC6
#define KX_KC6 8
#endif
#define KX_TGB 32 // most tokens per pass of the buffered path
_Static_assert(KX_R1 <= KX_RMAX && KX_RF <= 2 && KX_RF4 <= 4 && KX_RB <= KX_RMAX && KX_RBB <= 8, "tile rows");
_Static_assert(KX_TB <= KX_TMAX && KX_TFT <= KX_TMAX, "tile tokens");

// One out-of-line function per tile shape (register allocation stays local).
#define KX_FLY_OK(R, T) \
    (((T) == 1 && (R) <= KX_R1) || ((R) <= KX_RF && (T) <= SD_MIN(KX_TFT, KX_TF)) || ((R) <= KX_RF4 && (T) <= 4))
#define KX_BUF_OK(R, T) ((R) <= KX_RB && (T) <= KX_TB)
#define KX_SHAPES(X)                                                                                     \
    X(1, 1) X(2, 1) X(3, 1) X(4, 1) X(5, 1) X(6, 1) X(7, 1) X(8, 1) X(1, 2) X(2, 2) X(3, 2) X(4, 2) \
    X(1, 3) X(2, 3) X(3, 3) X(4, 3) X(1, 4) X(2, 4) X(3, 4) X(4, 4) X(1, 5) X(2, 5) X(1, 6) X(2, 6) \
    X(1, 7) X(2, 7) X(1, 8) X(2, 8)

#define KX_DEF(R, T)                                                                                                 \
    static __attribute__((noinline)) void kx_fly45_##R##_##T(int qh, const uint8_t *const *rows, int64_t nb,        \
                                                             const kx_xp45 *const *xp, float out[KX_RMAX][KX_TMAX], \
                                                             const kx_pf *pf) {                                      \
        if (!KX_FLY_OK(R, T)) SD_ASSERT(0);                                                                          \
        else if (qh) kx_fly45(KX_FLY_OK(R, T) ? (R) : 1, (T), 1, rows, nb, xp, out, pf);                            \
        else kx_fly45(KX_FLY_OK(R, T) ? (R) : 1, (T), 0, rows, nb, xp, out, pf);                                    \
    }                                                                                                                \
    static __attribute__((noinline)) void kx_fly6_##R##_##T(const uint8_t *const *rows, int64_t nb,                 \
                                                            const kx_xp6 *const *xp, float out[KX_RMAX][KX_TMAX],  \
                                                            const kx_pf *pf) {                                       \
        if (!KX_FLY_OK(R, T)) SD_ASSERT(0);                                                                          \
        else kx_fly6(KX_FLY_OK(R, T) ? (R) : 1, (T), rows, nb, xp, out, pf);                                        \
    }                                                                                                                \
    static __attribute__((noinline)) void kx_buf45_##R##_##T(const kx_wb45 *const *wb, int64_t kc,                  \
                                                             const kx_xp45 *const *xp, __m512 *const *fst) {          \
        if (!KX_BUF_OK(R, T)) SD_ASSERT(0);                                                                          \
        else kx_buf45(KX_BUF_OK(R, T) ? (R) : 1, (T), wb, kc, xp, fst);                                             \
    }                                                                                                                \
    static __attribute__((noinline)) void kx_buf6_##R##_##T(const kx_wb6 *const *wb, int64_t kc,                    \
                                                            const kx_xp6 *const *xp, __m512 *const *fst) {           \
        if (!KX_BUF_OK(R, T)) SD_ASSERT(0);                                                                          \
        else kx_buf6(KX_BUF_OK(R, T) ? (R) : 1, (T), wb, kc, xp, fst);                                              \
    }
KX_SHAPES(KX_DEF)
#undef KX_DEF

static void kx_fly45_any(int nr, int nt, int qh, const uint8_t *const *rows, int64_t nb, const kx_xp45 *const *xp,
                         float out[KX_RMAX][KX_TMAX], const kx_pf *pf) {
#define KX_C(R, T) \
    case (R) * 16 + (T): kx_fly45_##R##_##T(qh, rows, nb, xp, out, pf); return;
    switch (nr * 16 + nt) {
        KX_SHAPES(KX_C)
    default: SD_ASSERT(0);
    }
#undef KX_C
}
static void kx_fly6_any(int nr, int nt, const uint8_t *const *rows, int64_t nb, const kx_xp6 *const *xp,
                        float out[KX_RMAX][KX_TMAX], const kx_pf *pf) {
#define KX_C(R, T) \
    case (R) * 16 + (T): kx_fly6_##R##_##T(rows, nb, xp, out, pf); return;
    switch (nr * 16 + nt) {
        KX_SHAPES(KX_C)
    default: SD_ASSERT(0);
    }
#undef KX_C
}
static void kx_buf45_any(int nr, int nt, const kx_wb45 *const *wb, int64_t kc, const kx_xp45 *const *xp,
                         __m512 *const *fst) {
#define KX_C(R, T) \
    case (R) * 16 + (T): kx_buf45_##R##_##T(wb, kc, xp, fst); return;
    switch (nr * 16 + nt) {
        KX_SHAPES(KX_C)
    default: SD_ASSERT(0);
    }
#undef KX_C
}
static void kx_buf6_any(int nr, int nt, const kx_wb6 *const *wb, int64_t kc, const kx_xp6 *const *xp,
                        __m512 *const *fst) {
#define KX_C(R, T) \
    case (R) * 16 + (T): kx_buf6_##R##_##T(wb, kc, xp, fst); return;
    switch (nr * 16 + nt) {
        KX_SHAPES(KX_C)
    default: SD_ASSERT(0);
    }
#undef KX_C
}

// Prepared activation bytes per token for rows of nb super-blocks.
static size_t kx_xp_bytes(int type, int64_t nb) {
    return type == SD_TYPE_Q6_K ? (size_t)nb * sizeof(kx_xp6) : (size_t)((nb + 1) / 2) * sizeof(kx_xp45);
}

// The tile kernel of base type `type`, rows repacked (repacked = 1) or in
// the file layout (repacked on the fly, KX_RBUF bytes of rows at a time).
//
// Loops: the activations of up to tg tokens are prepared once (xbuf); then
// per row tile either (few tokens) on-the-fly tiles over the whole rows, or
// (buffered) per chunk of units the tile's rows are unpacked into wbuf and
// R x T tiles run over the chunk, the float accumulators (fst) carried from
// chunk to chunk. Either way each (row, token) sees the float steps of its
// units in order, then kx_hsum. Batches of more than tg tokens (the prepared
// activations that fit KX_XBUF, at most KX_TGB in the buffered path) take
// several passes over the rows. Stack: about 290 KiB of buffers (xbuf, rbuf,
// wbuf, fst); the pool's threads and the main thread have megabytes.
static void kx_gemm(int type, int repacked, int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1,
                    const void *xq, size_t xrb, int64_t n_tok, float *y, int64_t ldy) {
    const int q6 = type == SD_TYPE_Q6_K;
    const int64_t nb = n_in / SD_QK_K, nu = q6 ? nb : (nb + 1) / 2;
    if (r0 >= r1 || n_tok <= 0) return;
    const size_t xps = kx_xp_bytes(type, nb), xpu = q6 ? sizeof(kx_xp6) : sizeof(kx_xp45);
    const size_t wbu = q6 ? sizeof(kx_wb6) : sizeof(kx_wb45);
    const int64_t kcu = q6 ? KX_KC6 : KX_KC45; // units per chunk (buffered)
    const int buffered = n_tok > KX_TF;
    const int tmax = buffered ? KX_TB : (int)SD_MIN(n_tok, (int64_t)SD_MIN(KX_TF, KX_TFT));
    // on the fly: one row at a time streams best while the tokens' prepared
    // activations stay in L1; else rows in pairs halve their L2 traffic
    int rmax = buffered ? KX_RBB : (size_t)tmax * xps <= KX_XL1 ? KX_R1 : tmax <= 4 ? KX_RF4 : KX_RF;
    if (!repacked) rmax = (int)SD_MIN((size_t)rmax, KX_RBUF / wrb);
    if (xps > KX_XBUF || rmax < 1) {
        // rows too long for the stack buffers: the reference, per (row, token)
        sd_vec_dot_fn dot = type == SD_TYPE_Q4_K ? sd_q4_K_dot_ref : type == SD_TYPE_Q5_K ? sd_q5_K_dot_ref
                                                                                        : sd_q6_K_dot_ref;
        SD_ASSERT(!repacked);
        for (int64_t r = r0; r < r1; r++)
            for (int64_t t = 0; t < n_tok; t++)
                y[t * ldy + r] = dot(n_in, (const uint8_t *)W + (size_t)r * wrb, (const uint8_t *)xq + (size_t)t * xrb);
        return;
    }
    _Alignas(64) uint8_t xbuf[KX_XBUF];
    _Alignas(64) uint8_t rbuf[KX_RBUF];                                                    // rows repacked here
    _Alignas(64) uint8_t wbuf[KX_RBB * SD_MAX(KX_KC45 * sizeof(kx_wb45), KX_KC6 * sizeof(kx_wb6))]; // unpacked chunk
    _Alignas(64) __m512 fst[KX_RBB][KX_TGB]; // (rows, tokens) float accumulators of the buffered path
    const int64_t tg = SD_MIN((int64_t)(KX_XBUF / xps), buffered ? (int64_t)KX_TGB : n_tok);
    // software prefetch of the weights (see kx_pf)
    const kx_pf pf = kx_pf_make(repacked, wrb, rmax, buffered ? KX_PFDB : KX_PFD), no_pf = {0, SIZE_MAX, 0};
    for (int64_t t0 = 0; t0 < n_tok; t0 += tg) {
        const int64_t ntg = SD_MIN(tg, n_tok - t0);
        for (int64_t j = 0; j < ntg; j++) {
            const sd_block_q8_K *x = (const sd_block_q8_K *)((const uint8_t *)xq + (size_t)(t0 + j) * xrb);
            uint8_t *dst = xbuf + (size_t)j * xps;
            if (q6)
                for (int64_t b = 0; b < nb; b++) kx_prep6_block(&x[b], (kx_xp6 *)dst + b);
            else
                for (int64_t p = 0; p < nu; p++) kx_prep45_pair(x, nb, p, (kx_xp45 *)dst + p);
        }
        for (int64_t r = r0; r < r1; r += rmax) {
            const int nr = (int)SD_MIN((int64_t)rmax, r1 - r);
            const uint8_t *rows[KX_RMAX];
            for (int i = 0; i < nr; i++) {
                const uint8_t *src = (const uint8_t *)W + (size_t)(r + i) * wrb;
                if (repacked) {
                    rows[i] = src;
                } else {
                    sd_quant_k_repack(type, src, rbuf + (size_t)i * wrb, n_in, 1);
                    rows[i] = rbuf + (size_t)i * wrb;
                }
            }
            if (!buffered) {
                float out[KX_RMAX][KX_TMAX];
                const void *xp[KX_TMAX];
                for (int64_t t = 0; t < ntg; t += tmax) {
                    const int nt = (int)SD_MIN((int64_t)tmax, ntg - t);
                    for (int j = 0; j < nt; j++) xp[j] = xbuf + (size_t)(t + j) * xps;
                    const kx_pf *tpf = t == 0 ? &pf : &no_pf;
                    if (q6) kx_fly6_any(nr, nt, rows, nb, (const kx_xp6 *const *)xp, out, tpf);
                    else kx_fly45_any(nr, nt, type == SD_TYPE_Q5_K, rows, nb, (const kx_xp45 *const *)xp, out, tpf);
                    for (int i = 0; i < nr; i++)
                        for (int j = 0; j < nt; j++) y[(t0 + t + j) * ldy + r + i] = out[i][j];
                }
                continue;
            }
            for (int i = 0; i < nr; i++)
                for (int64_t j = 0; j < ntg; j++) fst[i][j] = _mm512_setzero_ps();
            for (int64_t c0 = 0; c0 < nu; c0 += kcu) {
                const int64_t kc = SD_MIN(kcu, nu - c0);
                const void *wb[KX_RMAX];
                for (int i = 0; i < nr; i++) {
                    wb[i] = wbuf + (size_t)i * (size_t)kc * wbu;
                    if (q6) kx_fill6(rows[i], c0, c0 + kc, (kx_wb6 *)wb[i], &pf);
                    else if (type == SD_TYPE_Q5_K) kx_fill5(rows[i], nb, c0, c0 + kc, (kx_wb45 *)wb[i], &pf);
                    else kx_fill4(rows[i], nb, c0, c0 + kc, (kx_wb45 *)wb[i], &pf);
                }
                for (int64_t t = 0; t < ntg; t += tmax) {
                    const int nt = (int)SD_MIN((int64_t)tmax, ntg - t);
                    const void *xp[KX_TMAX];
                    for (int j = 0; j < nt; j++) xp[j] = xbuf + (size_t)(t + j) * xps + (size_t)c0 * xpu;
                    for (int i = 0; i < nr; i += KX_RB) {
                        const int ni = SD_MIN(KX_RB, nr - i);
                        __m512 *fp[KX_RMAX];
                        for (int ii = 0; ii < ni; ii++) fp[ii] = &fst[i + ii][t];
                        if (q6) kx_buf6_any(ni, nt, (const kx_wb6 *const *)&wb[i], kc, (const kx_xp6 *const *)xp, fp);
                        else kx_buf45_any(ni, nt, (const kx_wb45 *const *)&wb[i], kc, (const kx_xp45 *const *)xp, fp);
                    }
                }
            }
            for (int64_t j = 0; j < ntg; j++) {
                __m512 v[8];
                for (int i = 0; i < 8; i++) v[i] = i < nr ? fst[i][j] : _mm512_setzero_ps();
                _mm256_mask_storeu_ps(y + (t0 + j) * ldy + r, (__mmask8)((1u << nr) - 1), kx_hsum8(v));
            }
        }
    }
}

#define KX_GEMM(name, type, rp)                                                                                  \
    static void name(int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1, const void *xq, size_t xrb, \
                     int64_t n_tok, float *y, int64_t ldy) {                                                     \
        kx_gemm(type, rp, n_in, W, wrb, r0, r1, xq, xrb, n_tok, y, ldy);                                         \
    }
KX_GEMM(kx_gemm_q4_K, SD_TYPE_Q4_K, 0)
KX_GEMM(kx_gemm_q5_K, SD_TYPE_Q5_K, 0)
KX_GEMM(kx_gemm_q6_K, SD_TYPE_Q6_K, 0)
KX_GEMM(kx_gemm_q4_K_r, SD_TYPE_Q4_K, 1)
KX_GEMM(kx_gemm_q5_K_r, SD_TYPE_Q5_K, 1)
KX_GEMM(kx_gemm_q6_K_r, SD_TYPE_Q6_K, 1)
#undef KX_GEMM

// traits repack: the layout rewrite, refused for rows the kernel cannot take.
#define KX_REPACK(name, type)                                                                  \
    static int name(const void *src, void *dst, int64_t n_in, int64_t n_rows) {                \
        if (n_in <= 0 || n_in % SD_QK_K || kx_xp_bytes(type, n_in / SD_QK_K) > KX_XBUF) return -1; \
        return sd_quant_k_repack(type, src, dst, n_in, n_rows);                                 \
    }
KX_REPACK(kx_repack_q4_K, SD_TYPE_Q4_K)
KX_REPACK(kx_repack_q5_K, SD_TYPE_Q5_K)
KX_REPACK(kx_repack_q6_K, SD_TYPE_Q6_K)
#undef KX_REPACK

int sd_quant_k_x86_init(sd_type_traits *traits) {
    traits[SD_TYPE_Q4_K].gemm = kx_gemm_q4_K;
    traits[SD_TYPE_Q5_K].gemm = kx_gemm_q5_K;
    traits[SD_TYPE_Q6_K].gemm = kx_gemm_q6_K;
    static const struct {
        int rt;
        sd_gemm_fn gemm;
        sd_repack_fn repack;
    } rp[3] = {{SD_TYPE_Q4_K_R, kx_gemm_q4_K_r, kx_repack_q4_K},
               {SD_TYPE_Q5_K_R, kx_gemm_q5_K_r, kx_repack_q5_K},
               {SD_TYPE_Q6_K_R, kx_gemm_q6_K_r, kx_repack_q6_K}};
    for (int i = 0; i < 3; i++) {
        traits[rp[i].rt].gemm = rp[i].gemm;
        traits[rp[i].rt].repack = rp[i].repack;
        traits[rp[i].rt].supported = 1;
    }
    return 1;
}

#else // no AVX-512: the file-layout kernels of quant_k.c stay in place

int sd_quant_k_x86_init(sd_type_traits *traits) {
    (void)traits;
    return 0;
}

#endif
