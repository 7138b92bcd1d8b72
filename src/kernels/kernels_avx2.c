// kernels_avx2.c - AVX2 + FMA dot products of the legacy quants (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0) for CPUs without AVX-512 VNNI (most desktop x86 CPUs).
//
// Compiled into every x86-64 build (the functions carry target attributes,
// so the rest of the library needs no -mavx2) and installed by sd_quant_init
// at run time when the CPU has AVX2, FMA and F16C but the AVX-512 VNNI
// kernels of kernels_x86.c are not available. Also selectable on purpose
// (sd_quant_init_backend("avx2")) so that tests/test_quant.c checks them
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
// gemm unpacks each block of a weight row once for up to 4 tokens and gives
// every token the operations of vec_dot in the same order, so a token's
// result does not depend on the batch (batch invariance), and equals vec_dot.
#include "kernels/quant.h"

#include <string.h>

const char *sd_kernels_avx2_init(sd_type_traits *traits);

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

// vec_dot: one weight row, one activation row.
#define DOT(name, TYPE)                                                    \
    static TGT float dot_##name(int64_t n, const void *w, const void *x) { \
        float y;                                                           \
        tile_row(TYPE, 1, n, w, (const char *)x, 0, &y, 1);                \
        return y;                                                          \
    }
DOT(q4_0, SD_TYPE_Q4_0)
DOT(q4_1, SD_TYPE_Q4_1)
DOT(q5_0, SD_TYPE_Q5_0)
DOT(q5_1, SD_TYPE_Q5_1)
DOT(q8_0, SD_TYPE_Q8_0)

#define GEMM(name, TYPE)                                                                                        \
    static TGT void gemm_##name(int64_t n_in, const void *W, size_t wrb, int64_t r0, int64_t r1, const void *xq, \
                                size_t xrb, int64_t n_tok, float *y, int64_t ldy) {                            \
        for (int64_t r = r0; r < r1; r++) {                                                                    \
            const char *w = (const char *)W + (size_t)r * wrb;                                                 \
            int64_t t = 0;                                                                                     \
            for (; t + 4 <= n_tok; t += 4) tile_row(TYPE, 4, n_in, w, (const char *)xq + t * xrb, xrb, y + t * ldy + r, ldy); \
            switch (n_tok - t) {                                                                               \
            case 3: tile_row(TYPE, 3, n_in, w, (const char *)xq + t * xrb, xrb, y + t * ldy + r, ldy); break;   \
            case 2: tile_row(TYPE, 2, n_in, w, (const char *)xq + t * xrb, xrb, y + t * ldy + r, ldy); break;   \
            case 1: tile_row(TYPE, 1, n_in, w, (const char *)xq + t * xrb, xrb, y + t * ldy + r, ldy); break;   \
            default: break;                                                                                    \
            }                                                                                                  \
        }                                                                                                      \
    }
GEMM(q4_0, SD_TYPE_Q4_0)
GEMM(q4_1, SD_TYPE_Q4_1)
GEMM(q5_0, SD_TYPE_Q5_0)
GEMM(q5_1, SD_TYPE_Q5_1)
GEMM(q8_0, SD_TYPE_Q8_0)

const char *sd_kernels_avx2_init(sd_type_traits *traits) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c"))
        return NULL;
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
    return "avx2";
}

#else

const char *sd_kernels_avx2_init(sd_type_traits *traits) {
    (void)traits;
    return NULL;
}

#endif
