// quant_k_vec_x86.c - the optimized K-quant kernels chosen by
// sd_quant_k_init (quant_k.c): vec_dot of Q4_K, Q5_K, Q6_K with AVX-512
// (F/BW/VL, VNNI optional) or AVX2, and the AVX-512 dequantization of Q4_K
// and Q6_K. Each matches its scalar reference in quant_k.c (dequantization
// bit for bit, dots within rounding).
//
// All three weight types are first brought into one common form per
// super-block ("unpacked"): unsigned quants u[256] in element order, int16
// multipliers sc[g] per group g of 16 elements, and floats d, dsc[g] =
// d * sc[g], dcm[g], such that for a Q8_K block (dx, qs, bsums)
//     dot = dx * (sum_g dsc[g] * sum_{i in g} u[i] * qs[i] - sum_g dcm[g] * bsums[g])
// with dcm[g] = dmin * m[g/2] (Q4_K, Q5_K) or d * 32 * sc[g] (Q6_K, whose
// quants carry an offset of 32).
//
// vec_dot (one row, one token) keeps the natural element order: maddubs
// (u8 x s8 -> s16 pairs, no saturation: |pair| <= 2 * 63 * 128) and a
// multiply-add with the group multipliers (dpwssd with VNNI). sd_matmul does
// not use it when a tile kernel exists.
//
// The tile kernel (gemm) of these types and of their repacked forms lives in
// quant_k_x86.c (AVX-512) and quant_k_avx2.c (AVX2): load-time repacked
// layouts; the file layout gives the same bits.

#include "kernels/quant_k_impl.h"

#include <string.h>

#if defined(__AVX2__)
static inline float k_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#if defined(K_HAVE_AVX512)

#if defined(__AVX512VNNI__)
#define K_DPWSSD(acc, p, s) _mm512_dpwssd_epi32((acc), (p), (s))
#else
#define K_DPWSSD(acc, p, s) _mm512_add_epi32((acc), _mm512_madd_epi16((p), (s)))
#endif

#define K_INLINE static inline __attribute__((always_inline))

// A super-block in the common form, natural order. w[v] holds elements
// 64v..64v+63; s[v] the int16 multiplier of each maddubs lane of w[v]
// (lanes 8k..8k+7 belong to group 4v + k).
typedef struct {
    __m512i w[4];  // (4 x 64) u8 quants
    __m512i s[4];  // (4 x 32) int16 group multipliers
    __m512 dsc;    // (16) float d * sc[g]
    __m512 dcm;    // (16) float correction per group
    __m256i mc16;  // (16) int16 correction per group, in units of dcmul
    float dcmul;   // dcm[g] = dcmul * mc16[g] (dmin, or 32 * d for Q6_K)
    float d;       // super-block scale of the products
} k_reg;

// int16 lane i of the result = v16[base + i / div]
K_INLINE __m512i k_spread16(__m512i v16, int base, int div) {
    const __m512i iota = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14,
                                          13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const unsigned sh = div == 16 ? 4 : div == 8 ? 3 : 1;
    return _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_set1_epi16((short)base), _mm512_srli_epi16(iota, sh)),
                                    v16);
}

// k_scales_decode16 with vector operations: 16 bytes sc[0..7], m[0..7].
// Reads 16 bytes at s (the 12 scale bytes and 4 bytes of what follows).
K_INLINE __m128i k_scales_decode_v(const uint8_t *s) {
    const __m128i v = _mm_loadu_si128((const __m128i *)s);                  // words w0 w1 w2 -
    const __m128i a = _mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4));
    const __m128i b = _mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)), 2); // w0 w0 w1 w1
    return _mm_or_si128(_mm_and_si128(a, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f)),
                        _mm_and_si128(b, _mm_setr_epi32(0, 0x30303030, 0, 0x30303030)));
}

// Q4_K and Q5_K (qh != NULL adds the fifth bit).
K_INLINE void k_unpack_q45(const uint8_t *qs, const uint8_t *qh, const uint8_t *scales, uint16_t dh,
                           uint16_t dminh, k_reg *u) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int h = 0; h < 2; h++) {
        const __m512i q = _mm512_loadu_si512((const void *)(qs + 64 * h));
        const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        u->w[2 * h] = _mm512_shuffle_i64x2(lo, hi, 0x44);
        u->w[2 * h + 1] = _mm512_shuffle_i64x2(lo, hi, 0xEE);
    }
    if (qh) {
        const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
        const __m512i sixteen = _mm512_set1_epi8(16);
        for (int v = 0; v < 4; v++) {
            const __m512i sel = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * v))),
                                                   _mm256_set1_epi8((char)(1 << (2 * v + 1))), 1);
            const __mmask64 k = _mm512_test_epi8_mask(H, sel);
            u->w[v] = _mm512_mask_add_epi8(u->w[v], k, u->w[v], sixteen);
        }
    }
    const __m512i s16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(k_scales_decode_v(scales)));
    for (int v = 0; v < 4; v++) u->s[v] = k_spread16(s16, 2 * v, 16);
    const __m512i sc16 = k_spread16(s16, 0, 2); // lanes 0..15: sc[g / 2]
    const __m512i m16 = k_spread16(s16, 8, 2);  // lanes 0..15: m[g / 2]
    u->d = k_h2f(dh);
    u->dsc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(sc16))),
                           _mm512_set1_ps(u->d));
    u->dcmul = k_h2f(dminh);
    u->mc16 = _mm512_castsi512_si256(m16);
    u->dcm = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(u->mc16)), _mm512_set1_ps(u->dcmul));
}

K_INLINE void k_unpack_q6(const sd_block_q6_K *b, k_reg *u) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i c01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i c23 = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    for (int h = 0; h < 2; h++) {
        const __m512i ql = _mm512_loadu_si512((const void *)(b->ql + 64 * h));
        const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * h)));
        u->w[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(H, c01), m30));
        u->w[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                          _mm512_and_si512(_mm512_srlv_epi16(H, c23), m30));
    }
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)b->scales);
    const __m512i s16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
    for (int v = 0; v < 4; v++) u->s[v] = k_spread16(s16, 4 * v, 8);
    u->d = k_h2f(b->d);
    const __m512 scf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc8));
    u->dsc = _mm512_mul_ps(scf, _mm512_set1_ps(u->d));
    u->dcmul = 32.f * u->d;
    u->mc16 = _mm512_castsi512_si256(s16);
    u->dcm = _mm512_mul_ps(scf, _mm512_set1_ps(u->dcmul));
}

// sd_q4_K_to_float: d0 * q - m0 per element with d0 = d * sc, m0 = dmin * m
// (both exact, and so is d0 * q: fused or not, one rounding of the same
// difference, as in the scalar code).
void sd_q4_K_to_float_avx512(const void *src, float *dst, int64_t n) {
    const sd_block_q4_K *b = src;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < n / SD_QK_K; i++, b++, dst += SD_QK_K) {
        const float d = k_h2f(b->d), dmin = k_h2f(b->dmin);
        uint8_t sc[8], m[8];
        k_scales_decode(b->scales, sc, m);
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
            const __m256i nib[2] = {_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)};
            for (int h = 0; h < 2; h++) {
                const __m512 d0 = _mm512_set1_ps(d * sc[2 * c + h]), m0 = _mm512_set1_ps(dmin * m[2 * c + h]);
                const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(nib[h])));
                const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(nib[h], 1)));
                _mm512_storeu_ps(dst + 64 * c + 32 * h, _mm512_fmsub_ps(d0, lo, m0));
                _mm512_storeu_ps(dst + 64 * c + 32 * h + 16, _mm512_fmsub_ps(d0, hi, m0));
            }
        }
    }
}

// sd_q6_K_to_float: k_unpack_q6's quants (q + 32, element order), then
// (d * scale) * (q + 32 - 32) per group of 16 -- the scalar code's values.
void sd_q6_K_to_float_avx512(const void *src, float *dst, int64_t n) {
    const sd_block_q6_K *b = src;
    const __m512i off = _mm512_set1_epi32(32);
    for (int64_t i = 0; i < n / SD_QK_K; i++, b++, dst += SD_QK_K) {
        k_reg u;
        k_unpack_q6(b, &u);
        const float d = k_h2f(b->d);
        for (int v = 0; v < 4; v++)
            for (int j = 0; j < 4; j++) {
                const float ds = d * b->scales[4 * v + j];
                const __m128i q8 = j == 0   ? _mm512_extracti32x4_epi32(u.w[v], 0)
                                   : j == 1 ? _mm512_extracti32x4_epi32(u.w[v], 1)
                                   : j == 2 ? _mm512_extracti32x4_epi32(u.w[v], 2)
                                            : _mm512_extracti32x4_epi32(u.w[v], 3);
                const __m512 qf = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(q8), off));
                _mm512_storeu_ps(dst + 64 * v + 16 * j, _mm512_mul_ps(qf, _mm512_set1_ps(ds)));
            }
    }
}

K_INLINE void k_unpack_type(int type, const void *blk, k_reg *u) {
    if (type == SD_TYPE_Q4_K) {
        const sd_block_q4_K *b = blk;
        k_unpack_q45(b->qs, NULL, b->scales, b->d, b->dmin, u);
    } else if (type == SD_TYPE_Q5_K) {
        const sd_block_q5_K *b = blk;
        k_unpack_q45(b->qs, b->qh, b->scales, b->d, b->dmin, u);
    } else {
        k_unpack_q6(blk, u);
    }
}

K_INLINE float k_vec_dot_avx512(int type, size_t bsize, int64_t n, const void *w, const void *xv) {
    const sd_block_q8_K *x = xv;
    const uint8_t *wb = w;
    __m512 facc = _mm512_setzero_ps();
    __m256 fmin = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / SD_QK_K; i++) {
        k_reg u;
        k_unpack_type(type, wb + (size_t)i * bsize, &u);
        __m512i acc = _mm512_setzero_si512();
        for (int v = 0; v < 4; v++) {
            const __m512i p = _mm512_maddubs_epi16(u.w[v], _mm512_loadu_si512((const void *)(x[i].qs + 64 * v)));
            acc = K_DPWSSD(acc, p, u.s[v]);
        }
        // correction: sum_g mc16[g] * bsums[g] in int32 pairs (|.| < 2^20)
        const __m256i m = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x[i].bsums), u.mc16);
        facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(u.d * x[i].d), facc);
        fmin = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(u.dcmul * x[i].d), fmin);
    }
    return _mm512_reduce_add_ps(facc) - k_hsum256(fmin);
}

float sd_q4_K_dot_avx512(int64_t n, const void *w, const void *x) {
    return k_vec_dot_avx512(SD_TYPE_Q4_K, sizeof(sd_block_q4_K), n, w, x);
}
float sd_q5_K_dot_avx512(int64_t n, const void *w, const void *x) {
    return k_vec_dot_avx512(SD_TYPE_Q5_K, sizeof(sd_block_q5_K), n, w, x);
}
float sd_q6_K_dot_avx512(int64_t n, const void *w, const void *x) {
    return k_vec_dot_avx512(SD_TYPE_Q6_K, sizeof(sd_block_q6_K), n, w, x);
}

#endif // K_HAVE_AVX512

// ---------------------------------------------------------------------------
// AVX2 vec_dot (CPUs without AVX-512; sd_matmul uses the tile kernel of
// quant_k_avx2.c instead, this is the one-dot API). Natural element order, 32
// elements per vector: maddubs (u8 x s8 -> s16 pairs) then madd with the
// group scales.

#if defined(K_HAVE_AVX2)

// Same result as k_scales_decode, as 16 bytes (sc[0..7], m[0..7]) computed
// with 32-bit word operations (the hot-path version).
static inline void k_scales_decode16(const uint8_t *s, uint8_t out[16]) {
    uint32_t w0, w1, w2, o[4];
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    o[0] = w0 & 0x3f3f3f3fu;
    o[1] = (w2 & 0x0f0f0f0fu) | (((w0 >> 6) & 0x03030303u) << 4);
    o[2] = w1 & 0x3f3f3f3fu;
    o[3] = ((w2 >> 4) & 0x0f0f0f0fu) | (((w1 >> 6) & 0x03030303u) << 4);
    memcpy(out, o, 16);
}

// int16 lanes 0..7 = a, 8..15 = b
static inline __m256i k2_scale_pair(int a, int b) {
    return _mm256_set_m128i(_mm_set1_epi16((short)b), _mm_set1_epi16((short)a));
}

// Q4_K (qh == NULL) or Q5_K.
static inline float k2_dot_q45(int64_t n, const void *w, size_t bsize, int has_qh, const sd_block_q8_K *x) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
    __m256 facc = _mm256_setzero_ps();
    float mins = 0;
    for (int64_t i = 0; i < n / SD_QK_K; i++) {
        const uint8_t *blk = (const uint8_t *)w + (size_t)i * bsize;
        uint16_t dh, mh;
        memcpy(&dh, blk, 2);
        memcpy(&mh, blk + 2, 2);
        const uint8_t *scales = blk + 4, *qh = blk + 16, *qs = blk + (has_qh ? 48 : 16);
        uint8_t scm[16];
        k_scales_decode16(scales, scm);
        const __m256i H = has_qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (has_qh) {
                const __m256i b0 = _mm256_set1_epi8((char)(1 << (2 * c))), b1 = _mm256_set1_epi8((char)(2 << (2 * c)));
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(H, b0), b0), sixteen));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(H, b1), b1), sixteen));
            }
            const __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * c)));
            const __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * c + 32)));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p0, _mm256_set1_epi16(scm[2 * c])));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p1, _mm256_set1_epi16(scm[2 * c + 1])));
        }
        int32_t summ = 0;
        for (int j = 0; j < 8; j++) summ += scm[8 + j] * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        facc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(k_h2f(dh) * x[i].d), facc);
        mins += k_h2f(mh) * x[i].d * (float)summ;
    }
    return k_hsum256(facc) - mins;
}

float sd_q4_K_dot_avx2(int64_t n, const void *w, const void *x) {
    return k2_dot_q45(n, w, sizeof(sd_block_q4_K), 0, x);
}
float sd_q5_K_dot_avx2(int64_t n, const void *w, const void *x) {
    return k2_dot_q45(n, w, sizeof(sd_block_q5_K), 1, x);
}

float sd_q6_K_dot_avx2(int64_t n, const void *w, const void *xv) {
    const sd_block_q6_K *b = w;
    const sd_block_q8_K *x = xv;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256 facc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / SD_QK_K; i++) {
        __m256i acc = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i qa = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h));
            const __m256i qb = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h + 32));
            const __m256i H = _mm256_loadu_si256((const __m256i *)(b[i].qh + 32 * h));
            __m256i v[4];
            v[0] = _mm256_or_si256(_mm256_and_si256(qa, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
            v[1] = _mm256_or_si256(_mm256_and_si256(qb, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
            v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4), _mm256_and_si256(H, m30));
            v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
            for (int k = 0; k < 4; k++) {
                const int g = 8 * h + 2 * k; // groups g, g + 1
                const __m256i p = _mm256_maddubs_epi16(v[k], _mm256_loadu_si256((const __m256i *)(x[i].qs + 16 * g)));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, k2_scale_pair(b[i].scales[g], b[i].scales[g + 1])));
            }
        }
        int32_t off = 0; // the quants' offset of 32
        for (int g = 0; g < 16; g++) off += b[i].scales[g] * x[i].bsums[g];
        acc = _mm256_sub_epi32(acc, _mm256_setr_epi32(32 * off, 0, 0, 0, 0, 0, 0, 0));
        facc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(k_h2f(b[i].d) * x[i].d), facc);
    }
    return k_hsum256(facc);
}
#endif // K_HAVE_AVX2
