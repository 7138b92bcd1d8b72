// quant_k.c - the K-quant weight types Q4_K, Q5_K, Q6_K and the Q8_K
// activation format: scalar reference kernels (dequantize, quantize, dot)
// and the choice of the optimized kernels (quant_k_vec_x86.c, quant_k_x86.c,
// quant_k_avx2.c) by sd_quant_k_init().
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
// tests/kernels/test_quant_k.c for how).
#include "kernels/quant_k_impl.h"

#include <math.h>
#include <string.h>

_Static_assert(sizeof(sd_block_q4_K) == 144, "Q4_K block size");
_Static_assert(sizeof(sd_block_q5_K) == 176, "Q5_K block size");
_Static_assert(sizeof(sd_block_q6_K) == 210, "Q6_K block size");
_Static_assert(sizeof(sd_block_q8_K) == 292, "Q8_K block size");

// ---------------------------------------------------------------------------
// helpers

// Round to nearest (ties to even), valid for |f| < 2^22: adding 1.5 * 2^23
// leaves the rounded integer in the low mantissa bits.
static inline int k_round(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static inline int k_clamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

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

void sd_q4_K_to_float(const void *src, float *dst, int64_t n) {
#if defined(K_HAVE_AVX512)
    sd_q4_K_to_float_avx512(src, dst, n);
#else
    sd_q4_K_to_float_ref(src, dst, n);
#endif
}

void sd_q4_K_to_float_ref(const void *src, float *dst, int64_t n) {
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
void sd_q6_K_to_float(const void *src, float *dst, int64_t n) {
#if defined(K_HAVE_AVX512)
    sd_q6_K_to_float_avx512(src, dst, n);
#else
    sd_q6_K_to_float_ref(src, dst, n);
#endif
}

void sd_q6_K_to_float_ref(const void *src, float *dst, int64_t n) {
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
// on the hot path; the AVX-512 version computes the same bytes as the plain
// C one (same float operations, round-to-nearest-even) for finite input.
void sd_q8_K_from_float_ref(const float *src, void *dst, int64_t n) {
    sd_block_q8_K *b = dst;
    for (int64_t i = 0; i < n / SD_QK_K; i++, b++, src += SD_QK_K) {
        float amax = 0;
        for (int e = 0; e < SD_QK_K; e++) amax = fabsf(src[e]) > amax ? fabsf(src[e]) : amax;
        if (!(amax > 0)) { // all zero (or NaN input): a zero block
            memset(b, 0, sizeof *b);
            continue;
        }
        const float iscale = 127.f / amax;
        b->d = amax / 127.f;
        for (int e = 0; e < SD_QK_K; e++) b->qs[e] = (int8_t)k_clamp(k_round(src[e] * iscale), -127, 127);
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int k = 0; k < 16; k++) sum += b->qs[16 * g + k];
            b->bsums[g] = (int16_t)sum;
        }
    }
}

void sd_q8_K_from_float(const float *src, void *dst, int64_t n) {
#if defined(K_HAVE_AVX512)
    sd_block_q8_K *b = dst;
    for (int64_t i = 0; i < n / SD_QK_K; i++, b++, src += SD_QK_K) {
        __m512 vmax = _mm512_setzero_ps();
        for (int v = 0; v < 16; v++) vmax = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(src + 16 * v)), vmax);
        const float amax = _mm512_reduce_max_ps(vmax);
        if (!(amax > 0)) { // all zero (or NaN input): a zero block
            memset(b, 0, sizeof *b);
            continue;
        }
        const float iscale = 127.f / amax;
        b->d = amax / 127.f;
        const __m512 is = _mm512_set1_ps(iscale);
        const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
        for (int v = 0; v < 16; v++) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(src + 16 * v), is));
            q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
            _mm_storeu_si128((__m128i *)(b->qs + 16 * v), _mm512_cvtepi32_epi8(q));
            b->bsums[v] = (int16_t)_mm512_reduce_add_epi32(q);
        }
    }
#else
    sd_q8_K_from_float_ref(src, dst, n);
#endif
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
// kernel selection

void sd_quant_k_init(sd_type_traits *traits, int mode) {
    traits[SD_TYPE_Q4_K].vec_dot = sd_q4_K_dot_ref;
    traits[SD_TYPE_Q5_K].vec_dot = sd_q5_K_dot_ref;
    traits[SD_TYPE_Q6_K].vec_dot = sd_q6_K_dot_ref;
    traits[SD_TYPE_Q4_K].gemm = NULL;
    traits[SD_TYPE_Q5_K].gemm = NULL;
    traits[SD_TYPE_Q6_K].gemm = NULL;
    // the plain C conversions, unless the family below has faster ones
    traits[SD_TYPE_Q4_K].to_float = sd_q4_K_to_float_ref;
    traits[SD_TYPE_Q5_K].to_float = sd_q5_K_to_float;
    traits[SD_TYPE_Q6_K].to_float = sd_q6_K_to_float_ref;
    traits[SD_TYPE_Q8_K].from_float = sd_q8_K_from_float_ref;
    if (mode == SD_QK_REF) return;
#if defined(K_HAVE_AVX512)
    if (mode == SD_QK_BEST) {
        traits[SD_TYPE_Q4_K].vec_dot = sd_q4_K_dot_avx512;
        traits[SD_TYPE_Q5_K].vec_dot = sd_q5_K_dot_avx512;
        traits[SD_TYPE_Q6_K].vec_dot = sd_q6_K_dot_avx512;
        traits[SD_TYPE_Q4_K].to_float = sd_q4_K_to_float;
        traits[SD_TYPE_Q6_K].to_float = sd_q6_K_to_float;
        traits[SD_TYPE_Q8_K].from_float = sd_q8_K_from_float;
        sd_quant_k_x86_init(traits); // the tile kernels and the repacked types
        return;
    }
#endif
#if defined(K_HAVE_AVX2)
    traits[SD_TYPE_Q4_K].vec_dot = sd_q4_K_dot_avx2;
    traits[SD_TYPE_Q5_K].vec_dot = sd_q5_K_dot_avx2;
    traits[SD_TYPE_Q6_K].vec_dot = sd_q6_K_dot_avx2;
    sd_quant_k_avx2_init(traits); // (a no-op in builds without F16C)
#endif
}
