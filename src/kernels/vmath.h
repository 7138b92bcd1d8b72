// vmath.h - internal: one float vector type "vf" for the widest instruction
// set the build targets (AVX-512: 16 lanes, AVX2 + FMA: 8, otherwise a plain
// float, 1 lane), so that a kernel is written once and has a scalar fallback
// by construction. Every operation is lane-wise except vf_hsum and vf_hmax,
// whose reduction order is fixed for a given build.
#ifndef SD_VMATH_H
#define SD_VMATH_H

#include <math.h>
#include <stdint.h>

#include "common.h" // sd_fp16_to_fp32, sd_fp32_to_fp16

#if defined(__AVX512F__) && defined(__FMA__)
#include <immintrin.h>
#define SD_VW 16
typedef __m512 vf;
#define vf_zero() _mm512_setzero_ps()
#define vf_set1(x) _mm512_set1_ps(x)
#define vf_load(p) _mm512_loadu_ps(p)
#define vf_store(p, v) _mm512_storeu_ps(p, v)
#define vf_add(a, b) _mm512_add_ps(a, b)
#define vf_sub(a, b) _mm512_sub_ps(a, b)
#define vf_mul(a, b) _mm512_mul_ps(a, b)
#define vf_div(a, b) _mm512_div_ps(a, b)
#define vf_max(a, b) _mm512_max_ps(a, b)
#define vf_fma(a, b, c) _mm512_fmadd_ps(a, b, c) // a * b + c, fused
static inline float vf_hsum(vf v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
static inline float vf_hmax(vf v) { return _mm512_reduce_max_ps(v); }
// v holds pairs (a, b), cs pairs (c, s): returns the pairs (a c - b s, a s + b c).
static inline vf vf_rot_pairs(vf v, vf cs) {
    return _mm512_fmaddsub_ps(v, _mm512_moveldup_ps(cs), _mm512_mul_ps(_mm512_permute_ps(v, 0xB1), _mm512_movehdup_ps(cs)));
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SD_VW 8
typedef __m256 vf;
#define vf_zero() _mm256_setzero_ps()
#define vf_set1(x) _mm256_set1_ps(x)
#define vf_load(p) _mm256_loadu_ps(p)
#define vf_store(p, v) _mm256_storeu_ps(p, v)
#define vf_add(a, b) _mm256_add_ps(a, b)
#define vf_sub(a, b) _mm256_sub_ps(a, b)
#define vf_mul(a, b) _mm256_mul_ps(a, b)
#define vf_div(a, b) _mm256_div_ps(a, b)
#define vf_max(a, b) _mm256_max_ps(a, b)
#define vf_fma(a, b, c) _mm256_fmadd_ps(a, b, c)
static inline float vf_hsum(vf v) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
static inline float vf_hmax(vf v) {
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
static inline vf vf_rot_pairs(vf v, vf cs) {
    return _mm256_fmaddsub_ps(v, _mm256_moveldup_ps(cs), _mm256_mul_ps(_mm256_permute_ps(v, 0xB1), _mm256_movehdup_ps(cs)));
}
#else
#define SD_VW 1
typedef float vf;
#define vf_zero() 0.0f
#define vf_set1(x) (x)
#define vf_load(p) (*(p))
#define vf_store(p, v) (*(p) = (v))
#define vf_add(a, b) ((a) + (b))
#define vf_sub(a, b) ((a) - (b))
#define vf_mul(a, b) ((a) * (b))
#define vf_div(a, b) ((a) / (b))
#define vf_max(a, b) ((a) > (b) ? (a) : (b))
#define vf_fma(a, b, c) ((a) * (b) + (c)) // not contracted under -std=c11
#define vf_hsum(v) (v)
#define vf_hmax(v) (v)
#endif
// (vf_rot_pairs needs SD_VW >= 2: callers keep a scalar loop for SD_VW 1.)

// a . b over n floats: SD_VW lanes of fused multiply-adds, then the tail in order.
static inline float vf_dot(const float *a, const float *b, int n) {
    vf acc = vf_zero();
    int t = 0;
    for (; t + SD_VW <= n; t += SD_VW) acc = vf_fma(vf_load(a + t), vf_load(b + t), acc);
    float s = vf_hsum(acc);
    for (; t < n; t++) s += a[t] * b[t];
    return s;
}

// exp(x), lane-wise: range reduction to r in [-ln2/2, ln2/2], a degree-6
// polynomial, the scaling by 2^n through the exponent bits. Relative error
// about 2e-7; inputs below -87.3 (and -inf) give 0.
#if SD_VW > 1
#if SD_VW == 16
#define vx_round(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vx_pow2n(n) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define vx_zero_below(v, x, lo) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), v)
#else
#define vx_round(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vx_pow2n(n) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#define vx_zero_below(v, x, lo) _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), v)
#endif
static inline vf vf_exp(vf x) {
    const vf hi = vf_set1(88.3762626647949f), lo = vf_set1(-87.3365478515625f);
    vf xc = vf_max(x, lo);
#if SD_VW == 16
    xc = _mm512_min_ps(xc, hi);
#else
    xc = _mm256_min_ps(xc, hi);
#endif
    vf n = vx_round(vf_mul(xc, vf_set1(1.44269504088896341f)));
    vf r = vf_fma(n, vf_set1(-0.693359375f), xc);
    r = vf_fma(n, vf_set1(2.12194440e-4f), r);
    vf p = vf_set1(1.9875691500e-4f);
    p = vf_fma(p, r, vf_set1(1.3981999507e-3f));
    p = vf_fma(p, r, vf_set1(8.3334519073e-3f));
    p = vf_fma(p, r, vf_set1(4.1665795894e-2f));
    p = vf_fma(p, r, vf_set1(1.6666665459e-1f));
    p = vf_fma(p, r, vf_set1(5.0000001201e-1f));
    p = vf_fma(p, vf_mul(r, r), vf_add(r, vf_set1(1.0f)));
    return vx_zero_below(vf_mul(p, vx_pow2n(n)), x, lo);
}
#else
static inline vf vf_exp(vf x) { return expf(x); }
#endif


#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif
// fp16 storage (the KV cache). vf_load_h(p): SD_VW halves at p as floats
// (exact). sd_f16_row: n floats to halves, rounded to nearest even; the
// vector and the scalar conversions give the same bits.
#if SD_VW == 16
#define vf_load_h(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#elif SD_VW == 8 && defined(__F16C__)
#define vf_load_h(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#elif SD_VW == 8
static inline vf vf_load_h(const uint16_t *p) {
    float t[8];
    for (int i = 0; i < 8; i++) t[i] = sd_fp16_to_fp32(p[i]);
    return _mm256_loadu_ps(t);
}
#else
#define vf_load_h(p) sd_fp16_to_fp32(*(p))
#endif

static inline void sd_f16_row(uint16_t *dst, const float *src, int n) {
    int i = 0;
#if defined(__F16C__) && defined(__AVX__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++) dst[i] = sd_fp32_to_fp16(src[i]);
}

#endif
