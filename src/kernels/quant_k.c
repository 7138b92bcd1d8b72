// quant_k.c - the K-quant weight types Q4_K, Q5_K, Q6_K and the Q8_K
// activation format: scalar reference kernels (dequantize, quantize, dot)
// and the optimized dot / tile kernels chosen by sd_quant_k_init().
//
// Layouts (ggml / GGUF, super-block of SD_QK_K = 256 elements):
//   Q4_K: value = d * sc[j] * q - dmin * m[j], j = sub-block of 32 (8 per
//         super-block), sc/m 6-bit packed in scales[12], q 4-bit. Byte
//         qs[32c + l] holds element 64c + l (low nibble) and 64c + 32 + l
//         (high nibble), c = 0..3.
//   Q5_K: Q4_K plus a fifth bit: bit 2c of qh[l] is bit 4 of element
//         64c + l, bit 2c+1 is bit 4 of element 64c + 32 + l.
//   Q6_K: value = d * scales[g] * (q - 32), g = group of 16 (16 groups,
//         int8 scales), q 6-bit: for half h (128 elements) and l < 32,
//         ql[64h + l] low/high nibble = elements 128h + l / 128h + 64 + l,
//         ql[64h + 32 + l] low/high nibble = elements 128h + 32 + l /
//         128h + 96 + l; qh[32h + l] bit pairs 0-1, 2-3, 4-5, 6-7 are the
//         high two bits of elements 128h + l, +32 + l, +64 + l, +96 + l.
//   Q8_K: value = d * qs[i] (float d), bsums[g] = sum of qs in group g of 16.
// The 6-bit scale packing of Q4_K/Q5_K (scales[12]): for j < 4, bytes j and
// j + 4 hold sc[j] and m[j] in their low 6 bits; byte j + 8 holds the low
// nibbles of sc[j + 4] (bits 0-3) and m[j + 4] (bits 4-7); the top 2 bits of
// sc[j + 4] / m[j + 4] sit in bits 6-7 of byte j / byte j + 4.
//
// These layouts were checked against the python `gguf` package (see
// tests/test_quant_k.c for how).
#include "kernels/quant.h"

#include <math.h>
#include <string.h>

#include "common.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define K_HAVE_AVX512 1
#endif

// Exported kernels (referenced by the traits table in quant.c; declared
// there, repeated here so the definitions are checked against them).
// to_float: dequantize n elements (n a multiple of 256) into dst.
void sd_q4_K_to_float(const void *src, float *dst, int64_t n);
void sd_q5_K_to_float(const void *src, float *dst, int64_t n);
void sd_q6_K_to_float(const void *src, float *dst, int64_t n);
void sd_q8_K_to_float(const void *src, float *dst, int64_t n);
// from_float: quantize n elements (n a multiple of 256) into n / 256 blocks.
// The weight quantizers fit per sub-block scales by least squares (good, not
// ggml's exact search); the Q8_K one fills bsums and is the activation path.
void sd_q4_K_from_float(const float *src, void *dst, int64_t n);
void sd_q5_K_from_float(const float *src, void *dst, int64_t n);
void sd_q6_K_from_float(const float *src, void *dst, int64_t n);
void sd_q8_K_from_float(const float *src, void *dst, int64_t n);
// dot_ref: plain C dot of a weight row (n elements) with a Q8_K row.
float sd_q4_K_dot_ref(int64_t n, const void *w, const void *x);
float sd_q5_K_dot_ref(int64_t n, const void *w, const void *x);
float sd_q6_K_dot_ref(int64_t n, const void *w, const void *x);
// Sets traits[T].vec_dot and traits[T].gemm for T = Q4_K, Q5_K, Q6_K
// (traits: array of SD_TYPE_COUNT entries) to the best kernels compiled in
// (AVX-512: vec_dot + tile kernel; AVX2: vec_dot only; else the reference),
// or to the reference dot and no tile kernel when force_ref; with AVX-512
// (and not force_ref) also gemm, repack and supported = 1 of the repacked
// types Q4_K_R, Q5_K_R, Q6_K_R (left as sd_quant_init reset them otherwise).
// Touches no other entry; no state of its own, so it may be called any
// number of times.
void sd_quant_k_init(sd_type_traits *traits, int force_ref);
// quant_k_x86.c: sets the tile kernels (gemm) of Q4_K, Q5_K, Q6_K and
// gemm / repack / supported of Q4_K_R, Q5_K_R, Q6_K_R when built with
// AVX-512; returns 0 and touches nothing otherwise.
int sd_quant_k_x86_init(sd_type_traits *traits);

_Static_assert(sizeof(sd_block_q4_K) == 144, "Q4_K block size");
_Static_assert(sizeof(sd_block_q5_K) == 176, "Q5_K block size");
_Static_assert(sizeof(sd_block_q6_K) == 210, "Q6_K block size");
_Static_assert(sizeof(sd_block_q8_K) == 292, "Q8_K block size");

// ---------------------------------------------------------------------------
// helpers

static inline float k_h2f(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return sd_fp16_to_fp32(h);
#endif
}

// Round to nearest (ties to even), valid for |f| < 2^22: adding 1.5 * 2^23
// leaves the rounded integer in the low mantissa bits.
static inline int k_round(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static inline int k_clamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// Decodes the 12 packed bytes of Q4_K/Q5_K into sc[8] and m[8] (6-bit each).
static inline void k_scales_decode(const uint8_t *s, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 0xF) | ((s[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
}

static inline void k_scales_encode(const uint8_t sc[8], const uint8_t m[8], uint8_t *s) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

// The 256 quants of a Q6_K block in element order, offset removed (-32..31).
static void k_q6_unpack_ref(const sd_block_q6_K *b, int8_t q[SD_QK_K]) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t lo0 = b->ql[64 * h + l], lo1 = b->ql[64 * h + 32 + l], hb = b->qh[32 * h + l];
            q[128 * h + l] = (int8_t)(((lo0 & 0xF) | ((hb & 3) << 4)) - 32);
            q[128 * h + 32 + l] = (int8_t)(((lo1 & 0xF) | (((hb >> 2) & 3) << 4)) - 32);
            q[128 * h + 64 + l] = (int8_t)(((lo0 >> 4) | (((hb >> 4) & 3) << 4)) - 32);
            q[128 * h + 96 + l] = (int8_t)(((lo1 >> 4) | (((hb >> 6) & 3) << 4)) - 32);
        }
}

// ---------------------------------------------------------------------------
// reference dequantization

#if defined(K_HAVE_AVX512)
static void k_q4_K_to_float_avx512(const void *src, float *dst, int64_t n); // the same values, vectorized
#endif

void sd_q4_K_to_float(const void *src, float *dst, int64_t n) {
#if defined(K_HAVE_AVX512)
    k_q4_K_to_float_avx512(src, dst, n);
    return;
#endif
    const sd_block_q4_K *b = src;
    for (int64_t i = 0; i < n / SD_QK_K; i++, b++) {
        const float d = k_h2f(b->d), dmin = k_h2f(b->dmin);
        uint8_t sc[8], m[8];
        k_scales_decode(b->scales, sc, m);
        for (int c = 0; c < 4; c++) {
            const float d0 = d * sc[2 * c], m0 = dmin * m[2 * c];
            const float d1 = d * sc[2 * c + 1], m1 = dmin * m[2 * c + 1];
            for (int l = 0; l < 32; l++) {
                dst[64 * c + l] = d0 * (b->qs[32 * c + l] & 0xF) - m0;
                dst[64 * c + 32 + l] = d1 * (b->qs[32 * c + l] >> 4) - m1;
            }
        }
        dst += SD_QK_K;
    }
}

void sd_q5_K_to_float(const void *src, float *dst, int64_t n) {
    const sd_block_q5_K *b = src;
    for (int64_t i = 0; i < n / SD_QK_K; i++, b++) {
        const float d = k_h2f(b->d), dmin = k_h2f(b->dmin);
        uint8_t sc[8], m[8];
        k_scales_decode(b->scales, sc, m);
        for (int c = 0; c < 4; c++) {
            const float d0 = d * sc[2 * c], m0 = dmin * m[2 * c];
            const float d1 = d * sc[2 * c + 1], m1 = dmin * m[2 * c + 1];
            for (int l = 0; l < 32; l++) {
                int q0 = (b->qs[32 * c + l] & 0xF) | (((b->qh[l] >> (2 * c)) & 1) << 4);
                int q1 = (b->qs[32 * c + l] >> 4) | (((b->qh[l] >> (2 * c + 1)) & 1) << 4);
                dst[64 * c + l] = d0 * q0 - m0;
                dst[64 * c + 32 + l] = d1 * q1 - m1;
            }
        }
        dst += SD_QK_K;
    }
}

// (d * scale) * q, with d * scale formed once per group of 16: the same
// value as d * scales[e / 16] * q[e] element by element (C evaluates that
// left to right), in loops the compiler vectorizes. This dequantizer is on
// the hot path of float-activation matmuls.
#if defined(K_HAVE_AVX512)
static void k_q6_K_to_float_avx512(const void *src, float *dst, int64_t n); // the same values, vectorized
#endif

void sd_q6_K_to_float(const void *src, float *dst, int64_t n) {
#if defined(K_HAVE_AVX512)
    k_q6_K_to_float_avx512(src, dst, n);
    return;
#endif
    const sd_block_q6_K *b = src;
    for (int64_t i = 0; i < n / SD_QK_K; i++, b++) {
        const float d = k_h2f(b->d);
        int8_t q[SD_QK_K];
        k_q6_unpack_ref(b, q);
        for (int g = 0; g < 16; g++) {
            const float ds = d * b->scales[g];
            for (int k = 0; k < 16; k++) dst[16 * g + k] = ds * q[16 * g + k];
        }
        dst += SD_QK_K;
    }
}

void sd_q8_K_to_float(const void *src, float *dst, int64_t n) {
    const sd_block_q8_K *b = src;
    for (int64_t i = 0; i < n / SD_QK_K; i++, b++) {
        for (int e = 0; e < SD_QK_K; e++) dst[e] = b->d * b->qs[e];
        dst += SD_QK_K;
    }
}

// ---------------------------------------------------------------------------
// reference quantization

// Fits x[i] ~ s * q[i] - m with q in [0, nmax], s >= 0, m >= 0 (the offset
// is a subtracted non-negative minimum, as the format requires). Starts from
// the min/max range and refines (s, m) by least squares on the rounded q a
// few times, keeping the best squared error.
static void k_fit_scale_min(const float *x, int n, int nmax, float *s_out, float *m_out) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    if (lo > 0) lo = 0;
    if (hi <= lo) {
        *s_out = 0;
        *m_out = -lo;
        return;
    }
    float s = (hi - lo) / nmax, m = -lo;
    float best_s = s, best_m = m, best_err = INFINITY;
    for (int it = 0; it < 4; it++) {
        double a = 0, b = 0, sxq = 0, sx = 0, err = 0;
        for (int i = 0; i < n; i++) {
            int q = s > 0 ? k_clamp(k_round((x[i] + m) / s), 0, nmax) : 0;
            float e = s * q - m - x[i];
            err += e * e;
            a += (double)q * q;
            b += q;
            sxq += (double)x[i] * q;
            sx += x[i];
        }
        if (err < best_err) {
            best_err = (float)err;
            best_s = s;
            best_m = m;
        }
        // least squares for x ~ s*q + o (o = -m), constrained o <= 0
        double det = a * n - b * b;
        if (det <= 0) break;
        double ns = (n * sxq - b * sx) / det, no = (a * sx - b * sxq) / det;
        if (no > 0) {
            no = 0;
            ns = a > 0 ? sxq / a : 0;
        }
        if (ns <= 0) break;
        s = (float)ns;
        m = (float)-no;
    }
    *s_out = best_s;
    *m_out = best_m;
}

// Quantizes one super-block for Q4_K (nmax 15) or Q5_K (nmax 31): fills
// d/dmin (fp16), packed scales and q[256] (0..nmax).
static void k_quant_q45(const float *x, int nmax, uint16_t *d_out, uint16_t *dmin_out,
                        uint8_t scales[12], uint8_t q[SD_QK_K]) {
    float s[8], m[8], smax = 0, mmax = 0;
    for (int j = 0; j < 8; j++) {
        k_fit_scale_min(x + 32 * j, 32, nmax, &s[j], &m[j]);
        smax = s[j] > smax ? s[j] : smax;
        mmax = m[j] > mmax ? m[j] : mmax;
    }
    uint16_t dh = sd_fp32_to_fp16(smax / 63), mh = sd_fp32_to_fp16(mmax / 63);
    float d = sd_fp16_to_fp32(dh), dmin = sd_fp16_to_fp32(mh);
    uint8_t sc[8], mi[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(d > 0 ? k_clamp(k_round(s[j] / d), 0, 63) : 0);
        mi[j] = (uint8_t)(dmin > 0 ? k_clamp(k_round(m[j] / dmin), 0, 63) : 0);
        const float ds = d * sc[j], dm = dmin * mi[j];
        for (int i = 0; i < 32; i++)
            q[32 * j + i] = (uint8_t)(ds > 0 ? k_clamp(k_round((x[32 * j + i] + dm) / ds), 0, nmax) : 0);
    }
    *d_out = dh;
    *dmin_out = mh;
    k_scales_encode(sc, mi, scales);
}

void sd_q4_K_from_float(const float *src, void *dst, int64_t n) {
    sd_block_q4_K *b = dst;
    for (int64_t i = 0; i < n / SD_QK_K; i++, b++, src += SD_QK_K) {
        uint8_t q[SD_QK_K];
        k_quant_q45(src, 15, &b->d, &b->dmin, b->scales, q);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b->qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
}

void sd_q5_K_from_float(const float *src, void *dst, int64_t n) {
    sd_block_q5_K *b = dst;
    for (int64_t i = 0; i < n / SD_QK_K; i++, b++, src += SD_QK_K) {
        uint8_t q[SD_QK_K];
        k_quant_q45(src, 31, &b->d, &b->dmin, b->scales, q);
        memset(b->qh, 0, sizeof b->qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const int q0 = q[64 * c + l], q1 = q[64 * c + 32 + l];
                b->qs[32 * c + l] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
                b->qh[l] |= (uint8_t)(((q0 >> 4) << (2 * c)) | ((q1 >> 4) << (2 * c + 1)));
            }
    }
}

// Best s for x ~ s * q, q in [-32, 31]: tries mapping the extreme value to
// -32 and to +31, refines each by least squares, keeps the lower error.
static float k_fit_scale_q6(const float *x, int n) {
    float v = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > fabsf(v)) v = x[i];
    if (fabsf(v) < 1e-30f) return 0;
    const float cand[2] = {-v / 32, v / 31};
    float best_s = cand[0], best_err = INFINITY;
    for (int c = 0; c < 2; c++) {
        float s = cand[c];
        for (int it = 0; it < 3; it++) {
            double err = 0, sxq = 0, sqq = 0;
            for (int i = 0; i < n; i++) {
                int q = k_clamp(k_round(x[i] / s), -32, 31);
                float e = s * q - x[i];
                err += e * e;
                sxq += (double)x[i] * q;
                sqq += (double)q * q;
            }
            if (err < best_err) {
                best_err = (float)err;
                best_s = s;
            }
            if (sqq <= 0 || sxq == 0) break;
            s = (float)(sxq / sqq);
        }
    }
    return best_s;
}

void sd_q6_K_from_float(const float *src, void *dst, int64_t n) {
    sd_block_q6_K *b = dst;
    for (int64_t i = 0; i < n / SD_QK_K; i++, b++, src += SD_QK_K) {
        float s[16], amax = 0;
        for (int g = 0; g < 16; g++) {
            s[g] = k_fit_scale_q6(src + 16 * g, 16);
            amax = fabsf(s[g]) > amax ? fabsf(s[g]) : amax;
        }
        const uint16_t dh = sd_fp32_to_fp16(amax / 127);
        const float d = sd_fp16_to_fp32(dh);
        uint8_t q[SD_QK_K];
        for (int g = 0; g < 16; g++) {
            const int sc = d > 0 ? k_clamp(k_round(s[g] / d), -127, 127) : 0;
            b->scales[g] = (int8_t)sc;
            const float ds = d * sc;
            for (int k = 0; k < 16; k++)
                q[16 * g + k] = (uint8_t)(32 + (ds != 0 ? k_clamp(k_round(src[16 * g + k] / ds), -32, 31) : 0));
        }
        b->d = dh;
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *p = q + 128 * h;
                b->ql[64 * h + l] = (uint8_t)((p[l] & 0xF) | ((p[64 + l] & 0xF) << 4));
                b->ql[64 * h + 32 + l] = (uint8_t)((p[32 + l] & 0xF) | ((p[96 + l] & 0xF) << 4));
                b->qh[32 * h + l] = (uint8_t)((p[l] >> 4) | ((p[32 + l] >> 4) << 2) |
                                              ((p[64 + l] >> 4) << 4) | ((p[96 + l] >> 4) << 6));
            }
    }
}

// Activations are converted once per token and matmul, so this quantizer is
// on the hot path; the AVX-512 branch computes the same bytes as the scalar
// one (same float operations, round-to-nearest-even) for finite input.
void sd_q8_K_from_float(const float *src, void *dst, int64_t n) {
    sd_block_q8_K *b = dst;
    for (int64_t i = 0; i < n / SD_QK_K; i++, b++, src += SD_QK_K) {
        float amax = 0;
#if defined(K_HAVE_AVX512)
        __m512 vmax = _mm512_setzero_ps();
        for (int v = 0; v < 16; v++) vmax = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(src + 16 * v)), vmax);
        amax = _mm512_reduce_max_ps(vmax);
#else
        for (int e = 0; e < SD_QK_K; e++) amax = fabsf(src[e]) > amax ? fabsf(src[e]) : amax;
#endif
        if (!(amax > 0)) { // all zero (or NaN input): a zero block
            memset(b, 0, sizeof *b);
            continue;
        }
        const float iscale = 127.f / amax;
        b->d = amax / 127.f;
#if defined(K_HAVE_AVX512)
        const __m512 is = _mm512_set1_ps(iscale);
        const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
        for (int v = 0; v < 16; v++) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(src + 16 * v), is));
            q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
            _mm_storeu_si128((__m128i *)(b->qs + 16 * v), _mm512_cvtepi32_epi8(q));
            b->bsums[v] = (int16_t)_mm512_reduce_add_epi32(q);
        }
#else
        for (int e = 0; e < SD_QK_K; e++) b->qs[e] = (int8_t)k_clamp(k_round(src[e] * iscale), -127, 127);
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int k = 0; k < 16; k++) sum += b->qs[16 * g + k];
            b->bsums[g] = (int16_t)sum;
        }
#endif
    }
}

// ---------------------------------------------------------------------------
// reference dot products against Q8_K (integer sums per sub-block, float
// accumulation per super-block)

float sd_q4_K_dot_ref(int64_t n, const void *w, const void *x) {
    const sd_block_q4_K *b = w;
    const sd_block_q8_K *y = x;
    float sum = 0;
    for (int64_t i = 0; i < n / SD_QK_K; i++) {
        uint8_t sc[8], m[8];
        k_scales_decode(b[i].scales, sc, m);
        int32_t sumi = 0, summ = 0;
        for (int c = 0; c < 4; c++) {
            int32_t s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (b[i].qs[32 * c + l] & 0xF) * y[i].qs[64 * c + l];
                s1 += (b[i].qs[32 * c + l] >> 4) * y[i].qs[64 * c + 32 + l];
            }
            sumi += sc[2 * c] * s0 + sc[2 * c + 1] * s1;
        }
        for (int j = 0; j < 8; j++) summ += m[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        sum += y[i].d * (k_h2f(b[i].d) * sumi - k_h2f(b[i].dmin) * summ);
    }
    return sum;
}

float sd_q5_K_dot_ref(int64_t n, const void *w, const void *x) {
    const sd_block_q5_K *b = w;
    const sd_block_q8_K *y = x;
    float sum = 0;
    for (int64_t i = 0; i < n / SD_QK_K; i++) {
        uint8_t sc[8], m[8];
        k_scales_decode(b[i].scales, sc, m);
        int32_t sumi = 0, summ = 0;
        for (int c = 0; c < 4; c++) {
            int32_t s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                int q0 = (b[i].qs[32 * c + l] & 0xF) | (((b[i].qh[l] >> (2 * c)) & 1) << 4);
                int q1 = (b[i].qs[32 * c + l] >> 4) | (((b[i].qh[l] >> (2 * c + 1)) & 1) << 4);
                s0 += q0 * y[i].qs[64 * c + l];
                s1 += q1 * y[i].qs[64 * c + 32 + l];
            }
            sumi += sc[2 * c] * s0 + sc[2 * c + 1] * s1;
        }
        for (int j = 0; j < 8; j++) summ += m[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        sum += y[i].d * (k_h2f(b[i].d) * sumi - k_h2f(b[i].dmin) * summ);
    }
    return sum;
}

float sd_q6_K_dot_ref(int64_t n, const void *w, const void *x) {
    const sd_block_q6_K *b = w;
    const sd_block_q8_K *y = x;
    float sum = 0;
    for (int64_t i = 0; i < n / SD_QK_K; i++) {
        int8_t q[SD_QK_K];
        k_q6_unpack_ref(&b[i], q);
        int32_t sumi = 0;
        for (int g = 0; g < 16; g++) {
            int32_t s = 0;
            for (int k = 0; k < 16; k++) s += q[16 * g + k] * y[i].qs[16 * g + k];
            sumi += b[i].scales[g] * s;
        }
        sum += y[i].d * k_h2f(b[i].d) * sumi;
    }
    return sum;
}

// ---------------------------------------------------------------------------
// optimized kernels (AVX-512 F/BW/VL, VNNI optional)
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
// quant_k_x86.c (load-time repacked layouts; the file layout is repacked on
// the fly a few rows at a time, giving the same bits).

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
static void k_q4_K_to_float_avx512(const void *src, float *dst, int64_t n) {
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
static void k_q6_K_to_float_avx512(const void *src, float *dst, int64_t n) {
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

static float k_q4_K_dot_avx512(int64_t n, const void *w, const void *x) {
    return k_vec_dot_avx512(SD_TYPE_Q4_K, sizeof(sd_block_q4_K), n, w, x);
}
static float k_q5_K_dot_avx512(int64_t n, const void *w, const void *x) {
    return k_vec_dot_avx512(SD_TYPE_Q5_K, sizeof(sd_block_q5_K), n, w, x);
}
static float k_q6_K_dot_avx512(int64_t n, const void *w, const void *x) {
    return k_vec_dot_avx512(SD_TYPE_Q6_K, sizeof(sd_block_q6_K), n, w, x);
}

#endif // K_HAVE_AVX512

// ---------------------------------------------------------------------------
// AVX2 vec_dot (CPUs without AVX-512; no tile kernel: sd_matmul then runs
// one vec_dot per (row, token)). Natural element order, 32 elements per
// vector: maddubs (u8 x s8 -> s16 pairs) then madd with the group scales.

#if !defined(K_HAVE_AVX512) && defined(__AVX2__) && defined(__FMA__)
#define K_HAVE_AVX2 1

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

static float k_q4_K_dot_avx2(int64_t n, const void *w, const void *x) {
    return k2_dot_q45(n, w, sizeof(sd_block_q4_K), 0, x);
}
static float k_q5_K_dot_avx2(int64_t n, const void *w, const void *x) {
    return k2_dot_q45(n, w, sizeof(sd_block_q5_K), 1, x);
}

static float k_q6_K_dot_avx2(int64_t n, const void *w, const void *xv) {
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

// ---------------------------------------------------------------------------
// kernel selection

void sd_quant_k_init(sd_type_traits *traits, int force_ref) {
    traits[SD_TYPE_Q4_K].vec_dot = sd_q4_K_dot_ref;
    traits[SD_TYPE_Q5_K].vec_dot = sd_q5_K_dot_ref;
    traits[SD_TYPE_Q6_K].vec_dot = sd_q6_K_dot_ref;
    traits[SD_TYPE_Q4_K].gemm = NULL;
    traits[SD_TYPE_Q5_K].gemm = NULL;
    traits[SD_TYPE_Q6_K].gemm = NULL;
    if (force_ref) return;
#if defined(K_HAVE_AVX512)
    traits[SD_TYPE_Q4_K].vec_dot = k_q4_K_dot_avx512;
    traits[SD_TYPE_Q5_K].vec_dot = k_q5_K_dot_avx512;
    traits[SD_TYPE_Q6_K].vec_dot = k_q6_K_dot_avx512;
#elif defined(K_HAVE_AVX2)
    traits[SD_TYPE_Q4_K].vec_dot = k_q4_K_dot_avx2;
    traits[SD_TYPE_Q5_K].vec_dot = k_q5_K_dot_avx2;
    traits[SD_TYPE_Q6_K].vec_dot = k_q6_K_dot_avx2;
#endif
    // tile kernels of Q4_K / Q5_K / Q6_K and their repacked forms (AVX-512
    // builds; a no-op otherwise)
    sd_quant_k_x86_init(traits);
}
